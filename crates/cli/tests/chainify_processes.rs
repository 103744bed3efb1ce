//! ChainifyDB's servers as processes over gRPC on loopback (`virga chainify node`): three
//! SQLite organizations and three orderer replicas, one process each group; an
//! organization's process is killed with SIGKILL mid-run and restarted. The other two keep
//! committing (any two of three), the restarted one catches up and serves its clients
//! again, and the directory then passes `virga chainify verify`. Then the default mix, two
//! organizations on PostgreSQL servers of their own and one on SQLite, with a PostgreSQL
//! organization's process killed and restarted.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use virga_chainify::ledger::Ledger;

use crate::support::{free_ports, stop, text};

const VIRGA: &str = env!("CARGO_BIN_EXE_virga");

/// Runs servers `names` of the deployment in `dir` as one process, its stderr in `log`.
fn servers(dir: &Path, log: &str, names: &[String]) -> Child {
    let stderr = File::options().create(true).append(true).open(dir.join(log)).unwrap();
    let mut command = Command::new(VIRGA);
    command.args(["chainify", "node", "run", "--dir", dir.to_str().unwrap()]);
    for name in names {
        command.args(["--name", name]);
    }
    command.stdout(Stdio::null()).stderr(stderr).spawn().unwrap()
}

/// Waits until `log` says `times` servers are serving.
fn wait_serving(dir: &Path, log: &str, times: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(dir.join(log)).unwrap_or_default();
        if text.matches(": serving at ").count() >= times {
            return;
        }
        assert!(Instant::now() < deadline, "{log}: not serving in time:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An organization's ledger height, read as another process writes it (a torn last record
/// reads as the blocks before it; an unreadable ledger as none).
fn height(dir: &Path, org: &str) -> usize {
    Ledger::read(&dir.join(org).join("ledger")).map_or(0, |blocks| blocks.len())
}

fn wait_height(dir: &Path, org: &str, at_least: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while height(dir, org) < at_least {
        assert!(Instant::now() < deadline, "{org} holds {} of {at_least} blocks in time", height(dir, org));
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn organization(org: &str) -> Vec<String> {
    ["chainify", "exec", "commit"].iter().map(|role| format!("{org}/{role}")).collect()
}

#[test]
fn chainify_servers_as_processes_survive_sigkill_of_an_organization() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("deployment");
    let dir_arg = dir.to_str().unwrap();
    let base = free_ports(12).to_string();
    let init = Command::new(VIRGA)
        .args(["chainify", "node", "init", "--dir", dir_arg, "--sqlite-only", "--customers", "300", "--clients", "3"])
        .args(["--base-port", &base, "--block-size", "32", "--batch-size", "8", "--checkpoint-every", "3"])
        .output()
        .unwrap();
    assert!(init.status.success(), "{}", text(&init.stderr));

    let orderers: Vec<String> = (1..=3).map(|at| format!("orderer-{at}")).collect();
    let mut running = vec![servers(&dir, "orderers.stderr", &orderers)];
    for org in ["org-1", "org-2"] {
        running.push(servers(&dir, &format!("{org}.stderr"), &organization(org)));
    }
    let mut third = servers(&dir, "org-3.stderr", &organization("org-3"));
    for log in ["orderers.stderr", "org-1.stderr", "org-2.stderr", "org-3.stderr"] {
        wait_serving(&dir, log, 3);
    }

    // Clients of org-1 and org-2 run throughout; org-3 is killed once it holds a few blocks.
    let clients = Command::new(VIRGA)
        .args(["chainify", "node", "client", "--dir", dir_arg, "--name", "client-1", "--name", "client-2"])
        .args(["--transactions", "400", "--window", "4", "--limit", "240"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_height(&dir, "org-3", 4);
    third.kill().unwrap();
    third.wait().unwrap();
    let at_kill = height(&dir, "org-3");
    // Any two of three: org-1 and org-2 go on committing while org-3 is down.
    let (org1, org2) = (height(&dir, "org-1"), height(&dir, "org-2"));
    wait_height(&dir, "org-1", org1 + 3);
    wait_height(&dir, "org-2", org2 + 3);
    let third = servers(&dir, "org-3.stderr", &organization("org-3"));
    wait_serving(&dir, "org-3.stderr", 6);

    let answered = clients.wait_with_output().unwrap();
    assert!(answered.status.success(), "the clients of org-1 and org-2: {}", text(&answered.stdout));
    // org-3's own client is served by its restarted servers.
    let own = Command::new(VIRGA)
        .args(["chainify", "node", "client", "--dir", dir_arg, "--name", "client-3", "--transactions", "20"])
        .args(["--limit", "120"])
        .output()
        .unwrap();
    assert!(own.status.success(), "org-3's client after the restart: {}", text(&own.stdout));

    wait_height(&dir, "org-3", height(&dir, "org-1"));
    assert!(height(&dir, "org-3") > at_kill, "org-3 caught up past {at_kill} blocks");
    stop(third);
    for child in running {
        stop(child);
    }
    let verified = Command::new(VIRGA).args(["chainify", "verify", "--dir", dir_arg]).output().unwrap();
    assert!(verified.status.success(), "{}{}", text(&verified.stdout), text(&verified.stderr));
    assert!(text(&verified.stdout).starts_with("ok: 3 organizations"), "{}", text(&verified.stdout));
}

/// Runs `transactions` proposals of `client` and asserts every one was answered.
fn client_answered(dir: &Path, client: &str, transactions: &str) {
    let done = Command::new(VIRGA)
        .args(["chainify", "node", "client", "--dir", dir.to_str().unwrap(), "--name", client])
        .args(["--transactions", transactions, "--limit", "120"])
        .output()
        .unwrap();
    assert!(done.status.success(), "{client}: {}{}", text(&done.stdout), text(&done.stderr));
}

#[test]
fn postgresql_organizations_run_as_processes_and_restart_after_sigkill() {
    if virga_chainify::postgres_server::find_binaries().is_none() {
        assert!(
            std::env::var_os("VIRGA_REQUIRE_POSTGRES").is_none(),
            "{}",
            virga_chainify::postgres_server::INSTALL_HINT
        );
        eprintln!("skipped: {}", virga_chainify::postgres_server::INSTALL_HINT);
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    // Run as root, the PostgreSQL servers run as another user, who must reach their data.
    std::fs::set_permissions(scratch.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let dir = scratch.path().join("deployment");
    let dir_arg = dir.to_str().unwrap();
    let base = free_ports(12).to_string();
    let init = Command::new(VIRGA)
        .args(["chainify", "node", "init", "--dir", dir_arg, "--customers", "200", "--clients", "3"])
        .args(["--base-port", &base, "--block-size", "16", "--batch-size", "4"])
        .output()
        .unwrap();
    assert!(init.status.success(), "{}", text(&init.stderr));
    let orderers: Vec<String> = (1..=3).map(|at| format!("orderer-{at}")).collect();
    let mut running = vec![servers(&dir, "orderers.stderr", &orderers)];
    running.push(servers(&dir, "org-2.stderr", &organization("org-2")));
    running.push(servers(&dir, "org-3.stderr", &organization("org-3")));
    let first = servers(&dir, "org-1.stderr", &organization("org-1"));
    for log in ["orderers.stderr", "org-1.stderr", "org-2.stderr", "org-3.stderr"] {
        wait_serving(&dir, log, 3);
    }
    client_answered(&dir, "client-1", "30");

    // Killed, org-1's process leaves its PostgreSQL server running; the restart takes it
    // over as after a crash and brings the database to the ledger.
    let mut first = first;
    first.kill().unwrap();
    first.wait().unwrap();
    client_answered(&dir, "client-2", "20");
    let first = servers(&dir, "org-1.stderr", &organization("org-1"));
    wait_serving(&dir, "org-1.stderr", 6);
    client_answered(&dir, "client-1", "20");
    wait_height(&dir, "org-1", height(&dir, "org-2"));
    stop(first);
    for child in running {
        stop(child);
    }
    let verified = Command::new(VIRGA).args(["chainify", "verify", "--dir", dir_arg]).output().unwrap();
    assert!(verified.status.success(), "{}{}", text(&verified.stdout), text(&verified.stderr));
    assert!(text(&verified.stdout).starts_with("ok: 3 organizations"), "{}", text(&verified.stdout));
}

#[test]
fn chainify_node_refuses_unknown_servers_clients_and_directories() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("deployment");
    let dir_arg = dir.to_str().unwrap();
    let missing = Command::new(VIRGA)
        .args(["chainify", "node", "run", "--dir", dir_arg, "--name", "orderer-1"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(text(&missing.stderr).contains("deployment.json"), "{}", text(&missing.stderr));

    let init = |extra: &[&str]| {
        Command::new(VIRGA)
            .args(["chainify", "node", "init", "--dir", dir_arg, "--sqlite-only"])
            .args(extra)
            .output()
            .unwrap()
    };
    let zero = init(&["--orderers", "0"]);
    assert!(!zero.status.success() && text(&zero.stderr).contains("--orderers"), "{}", text(&zero.stderr));
    assert!(init(&["--base-port", "40000"]).status.success());
    let again = init(&[]);
    assert!(!again.status.success() && text(&again.stderr).contains("already holds a consortium"));

    let stranger = Command::new(VIRGA)
        .args(["chainify", "node", "run", "--dir", dir_arg, "--name", "org-9/exec"])
        .output()
        .unwrap();
    assert!(!stranger.status.success());
    assert!(
        text(&stranger.stderr).contains("org-9/exec is no server of this deployment"),
        "{}",
        text(&stranger.stderr)
    );
    let loader = Command::new(VIRGA)
        .args(["chainify", "node", "client", "--dir", dir_arg, "--name", "loader"])
        .output()
        .unwrap();
    assert!(!loader.status.success());
    assert!(text(&loader.stderr).contains("loader is no client of this deployment"), "{}", text(&loader.stderr));
}
