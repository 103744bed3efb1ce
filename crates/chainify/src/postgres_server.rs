//! A private PostgreSQL instance for one organization: its own data directory, listening
//! on a Unix socket in that directory only (no TCP port), started with `pg_ctl` and stopped
//! when dropped. PostgreSQL refuses to run as root, so under root the instance runs as the
//! `postgres` user that Debian's package creates.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What to install when PostgreSQL is missing.
pub const INSTALL_HINT: &str =
    "PostgreSQL's server programs (initdb, pg_ctl, postgres) were not found on PATH or in /usr/lib/postgresql/*/bin: \
     install them (Debian and Ubuntu: apt-get install postgresql)";

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{INSTALL_HINT}")]
    NotInstalled,
    #[error("PostgreSQL runs as root only through the postgres user, and there is none: {0}")]
    NoPostgresUser(String),
    #[error("{step} failed: {detail}")]
    Step { step: String, detail: String },
}

/// The directory holding `initdb`, `pg_ctl` and `postgres`.
pub fn find_binaries() -> Option<PathBuf> {
    let has_all = |dir: &Path| ["initdb", "pg_ctl", "postgres"].iter().all(|name| dir.join(name).is_file());
    let on_path =
        std::env::var_os("PATH").map(|path| std::env::split_paths(&path).collect::<Vec<_>>()).unwrap_or_default();
    let mut versioned: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| entries.flatten().map(|entry| entry.path().join("bin")).collect())
        .unwrap_or_default();
    // The newest version first.
    versioned.sort();
    versioned.reverse();
    on_path.into_iter().chain(versioned).find(|dir| has_all(dir))
}

/// A running private instance.
pub struct PostgresServer {
    binaries: PathBuf,
    data: PathBuf,
    /// `Some((uid, gid))` of the postgres user when this process runs as root.
    run_as: Option<(u32, u32)>,
    port: u16,
}

impl PostgresServer {
    /// Starts the cluster in `dir`, creating it first unless `dir` already holds one (and
    /// restarting it if a killed owner left it running).
    pub fn start(dir: &Path, port: u16) -> Result<PostgresServer, ServerError> {
        let binaries = find_binaries().ok_or(ServerError::NotInstalled)?;
        let run_as = if is_root() { Some(postgres_user()?) } else { None };
        std::fs::create_dir_all(dir).map_err(|error| step("creating the data directory", error))?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .map_err(|error| step("giving the postgres user its directory", error))?;
        }
        let server = PostgresServer { binaries, data: dir.to_path_buf(), run_as, port };
        let data = server.data.display().to_string();
        if !dir.join("PG_VERSION").exists() {
            server.initdb()?;
        }
        // A server left running by a process that was killed: stop it as a crash would
        // (immediate: no checkpoint), so this start recovers from its write-ahead log.
        if dir.join("postmaster.pid").exists() && server.run("pg_ctl", &["-D", &data, "status"]).is_ok() {
            server.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"])?;
        }
        let options = format!("-k {data} -p {port} -c listen_addresses=''");
        let log = format!("{data}/server.log");
        server.run("pg_ctl", &["-D", &data, "-o", &options, "-l", &log, "-w", "-t", "30", "start"])?;
        Ok(server)
    }

    fn initdb(&self) -> Result<(), ServerError> {
        let data = self.data.display().to_string();
        self.run("initdb", &["-D", &data, "-U", "virga", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])
    }

    /// The connection string of its `postgres` database over the socket.
    pub fn connection_string(&self) -> String {
        self.database("postgres")
    }

    /// The connection string of database `name`.
    pub fn database(&self, name: &str) -> String {
        format!("host={} port={} user=virga dbname={name}", self.data.display(), self.port)
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<(), ServerError> {
        let binary = self.binaries.join(program);
        let output = match self.run_as {
            Some(_) => Command::new("runuser").args(["-u", "postgres", "--"]).arg(&binary).args(args).output(),
            None => Command::new(&binary).args(args).output(),
        }
        .map_err(|error| step(program, error))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(ServerError::Step {
                step: format!("{program} {}", args.join(" ")),
                detail: format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
            })
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let data = self.data.display().to_string();
        let _ = self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]);
    }
}

fn step(what: &str, error: std::io::Error) -> ServerError {
    ServerError::Step { step: what.to_string(), detail: error.to_string() }
}

fn is_root() -> bool {
    // The effective uid, from the kernel's view of this process (no libc call needed).
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix("Uid:").and_then(|ids| ids.split_whitespace().nth(1).map(str::to_string))
            })
        })
        .is_some_and(|uid| uid == "0")
}

/// The postgres user's uid and gid, from /etc/passwd.
fn postgres_user() -> Result<(u32, u32), ServerError> {
    let passwd =
        std::fs::read_to_string("/etc/passwd").map_err(|error| ServerError::NoPostgresUser(error.to_string()))?;
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.first() == Some(&"postgres") && fields.len() > 3)
                .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
                .flatten()
        })
        .ok_or_else(|| ServerError::NoPostgresUser("no postgres entry in /etc/passwd".to_string()))
}
