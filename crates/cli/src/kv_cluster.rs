//! `virga kv cluster up`: the distributed store's whole cluster in this process
//! (`virga_dkv::deploy::LocalCluster`), serving the client API (`virga.kv.v1`, the service of
//! crates/dkv/proto/kv.proto) on a gRPC address until SIGTERM or Ctrl-C.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use tokio::net::TcpListener;
use tokio::sync::watch;
use virga_dkv::deploy::{ClusterOptions, ClusterShape, LocalCluster};

/// Mutual TLS on every gRPC endpoint: this process's certificate and key, and the CA that
/// signs every role's and client's certificate (all three, or none).
#[derive(Args, Default)]
pub(crate) struct TlsArgs {
    /// This process's certificate (PEM).
    #[arg(long, global = true, requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PEM, PKCS#8 or PKCS#1 or SEC1).
    #[arg(long, global = true, requires_all = ["tls_cert", "tls_ca"])]
    pub tls_key: Option<PathBuf>,
    /// The CA certificate peers and clients must present certificates of (PEM).
    #[arg(long, global = true, requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
}

impl TlsArgs {
    /// The TLS setting, read and checked, when the options name one.
    pub(crate) fn load(&self) -> anyhow::Result<Option<virga_net::Tls>> {
        match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => Ok(Some(virga_net::Tls::load(cert, key, ca)?)),
            (None, None, None) => Ok(None),
            _ => anyhow::bail!("--tls-cert, --tls-key and --tls-ca go together"),
        }
    }
}

#[derive(Subcommand)]
pub(crate) enum ClusterCommand {
    /// Runs a whole cluster (configuration service, data nodes, a client core) in this
    /// process from a directory, serving the client API until stopped; the same command
    /// restarts it from the directory.
    Up(ClusterUpArgs),
    /// Writes a cluster whose roles run as processes of their own over gRPC on loopback
    /// ports from --base-port, and prints the command of each role.
    Init(ClusterInitArgs),
    /// Runs one role of a `cluster init` cluster (config-1..3, data-N or api) until SIGTERM;
    /// the same command restarts it from the directory.
    Node(ClusterNodeArgs),
}

#[derive(Args)]
pub(crate) struct ClusterInitArgs {
    /// The cluster's directory (must hold no cluster).
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count_u64_between(1, 1024))]
    pub shards: u64,
    /// Replicas per shard: an odd count 2f+1.
    #[arg(long, default_value_t = 3, value_parser = crate::limits::count_u64_between(1, 9))]
    pub replicas: u64,
    /// Data nodes, at least the replicas (default twice the replicas).
    #[arg(long, value_parser = crate::limits::count_u64_between(1, 64))]
    pub data_nodes: Option<u64>,
    /// KAIROS's sharded validators, each a role of its own (`validator-N`): transactions
    /// validate there before they prepare at the primaries. 0: validation at the primaries.
    #[arg(long, default_value_t = 0, value_parser = crate::limits::count_between(0, 16))]
    pub validators: usize,
    /// The configuration replicas listen from this port, then the data nodes, the validators,
    /// then the API.
    #[arg(long, default_value_t = 7401, value_parser = crate::limits::count_u64_between(1024, 65000))]
    pub base_port: u64,
}

#[derive(Args)]
pub(crate) struct ClusterNodeArgs {
    #[arg(long)]
    pub dir: PathBuf,
    /// The role: config-1, config-2, config-3, data-N, validator-N or api.
    #[arg(long)]
    pub id: String,
    /// Fsync each group of records before acknowledging it (group) or never (none).
    #[arg(long, default_value = "group", value_parser = ["group", "none"])]
    pub sync: String,
    /// Serve the role's Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Seconds behind the newest commit for which versions stay readable: an older snapshot
    /// is refused as snapshot-too-old (0 to 86400).
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = crate::limits::snapshot_window)]
    pub snapshot_window: std::time::Duration,
}

#[derive(Args)]
pub(crate) struct ClusterUpArgs {
    /// The cluster's directory (created with a new cluster when empty).
    #[arg(long)]
    pub dir: PathBuf,
    /// Shards of a new cluster (default 3; an existing cluster keeps its own).
    #[arg(long, value_parser = crate::limits::count_u64_between(1, 1024))]
    pub shards: Option<u64>,
    /// Replicas per shard of a new cluster: an odd count 2f+1 (default 3).
    #[arg(long, value_parser = crate::limits::count_u64_between(1, 9))]
    pub replicas: Option<u64>,
    /// Data nodes of a new cluster, at least the replicas (default twice the replicas).
    #[arg(long, value_parser = crate::limits::count_u64_between(1, 64))]
    pub data_nodes: Option<u64>,
    /// KAIROS's sharded validators of a new cluster (default 0: validation at the primaries).
    #[arg(long, value_parser = crate::limits::count_between(0, 16))]
    pub validators: Option<usize>,
    /// Where to serve the client API.
    #[arg(long, default_value = "127.0.0.1:7400")]
    pub listen: String,
    /// Serve every role's Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Fsync each group of records before acknowledging it (group) or never (none).
    #[arg(long, default_value = "group", value_parser = ["group", "none"])]
    pub sync: String,
    /// Seconds behind the newest commit for which versions stay readable: an older snapshot
    /// is refused as snapshot-too-old (0 to 86400).
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = crate::limits::snapshot_window)]
    pub snapshot_window: std::time::Duration,
}

pub(crate) fn run(command: &ClusterCommand, tls: &TlsArgs) -> anyhow::Result<ExitCode> {
    let tls = tls.load()?;
    // The roles log what they do (failovers, takeovers, terminations, elections) to stderr.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_max_level(tracing::Level::INFO)
        .try_init();
    match command {
        ClusterCommand::Up(args) => up(args, tls),
        ClusterCommand::Init(args) => init(args),
        ClusterCommand::Node(args) => node(args, tls),
    }
}

/// The shape the options ask for, if any: unnamed fields take the default's.
fn asked_shape(args: &ClusterUpArgs) -> Option<ClusterShape> {
    if args.shards.is_none() && args.replicas.is_none() && args.data_nodes.is_none() && args.validators.is_none() {
        return None;
    }
    let default = ClusterShape::default();
    let replicas = args.replicas.map_or(default.replicas, |replicas| replicas as usize);
    Some(ClusterShape {
        shards: args.shards.map_or(default.shards, |shards| shards as u32),
        replicas,
        data_nodes: args.data_nodes.map_or(2 * replicas, |nodes| nodes as usize),
        validators: args.validators.unwrap_or(default.validators),
    })
}

fn up(args: &ClusterUpArgs, tls: Option<virga_net::Tls>) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    runtime.block_on(async {
        let options = ClusterOptions {
            sync: args.sync == "group",
            snapshot_window: args.snapshot_window,
            ..ClusterOptions::default()
        };
        let listener = TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("listening on {} (--listen)", args.listen))?;
        eprintln!("opening the cluster in {}", args.dir.display());
        let cluster = LocalCluster::open(&args.dir, asked_shape(args), &options)
            .await
            .with_context(|| format!("opening the cluster in {}", args.dir.display()))?;
        let shape = cluster.shape();
        eprintln!(
            "cluster up (start {}): {} shards × {} replicas on {} data nodes, 3 configuration replicas, sync {}",
            cluster.incarnation(),
            shape.shards,
            shape.replicas,
            shape.data_nodes,
            args.sync
        );
        let (stop, mut stopped) = watch::channel(false);
        tokio::spawn(crate::node::stop_on_signal(stop));
        if let Some(address) = args.metrics {
            let listener = TcpListener::bind(address).await.with_context(|| format!("--metrics {address}"))?;
            let mut stopped = stopped.clone();
            let shutdown = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            let (address, server) = virga_dkv::deploy::serve_metrics(listener, cluster.metrics(), shutdown)?;
            tokio::spawn(server);
            println!("metrics on http://{address}/metrics");
        }
        let shutdown = async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        let (address, server) = virga_dkv::api::grpc::serve(listener, cluster.kv(), tls.as_ref(), shutdown)?;
        // Tests and scripts wait for this line.
        let scheme = if tls.is_some() { "https" } else { "http" };
        println!("serving virga.kv.v1 on {scheme}://{address}");
        server.await.context("serving the client API")?;
        eprintln!("stopping");
        cluster.stop().await;
        eprintln!("stopped");
        Ok(ExitCode::SUCCESS)
    })
}

fn init(args: &ClusterInitArgs) -> anyhow::Result<ExitCode> {
    let replicas = args.replicas as usize;
    let shape = ClusterShape {
        shards: args.shards as u32,
        replicas,
        data_nodes: args.data_nodes.map_or(2 * replicas, |nodes| nodes as usize),
        validators: args.validators,
    };
    let plan = virga_dkv::deploy::init_processes(&args.dir, shape, args.base_port as u16)
        .with_context(|| format!("writing a cluster into {}", args.dir.display()))?;
    println!(
        "a cluster of {} shards × {} replicas in {}; start each role:",
        shape.shards,
        shape.replicas,
        args.dir.display()
    );
    for (role, address) in &plan.roles {
        println!("  virga kv cluster node --dir {} --id {role} &    # {address}", args.dir.display());
    }
    if let Some(address) = plan.address(virga_dkv::deploy::API_ROLE) {
        println!("then: virga kv --addr {address} put k v");
    }
    Ok(ExitCode::SUCCESS)
}

fn node(args: &ClusterNodeArgs, tls: Option<virga_net::Tls>) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    runtime.block_on(async {
        let options = ClusterOptions {
            sync: args.sync == "group",
            tls,
            metrics: args.metrics,
            snapshot_window: args.snapshot_window,
            ..ClusterOptions::default()
        };
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(crate::node::stop_on_signal(stop));
        let role = args.id.clone();
        virga_dkv::deploy::run_role(&args.dir, &args.id, &options, stopped, move |address| {
            // Tests and scripts wait for this line.
            println!("{role} serving on http://{address}");
        })
        .await
        .with_context(|| format!("running {} of {}", args.id, args.dir.display()))?;
        eprintln!("{} stopped", args.id);
        Ok(ExitCode::SUCCESS)
    })
}

/// `virga kv audit --dir D` on a stopped cluster: every replica of every shard, as JSON;
/// exit 1 if the replicas of a shard hold different states, or the total is not the
/// expected one.
pub(crate) fn audit(args: &crate::kv::KvAuditArgs) -> anyhow::Result<ExitCode> {
    let audit = virga_dkv::deploy::audit_cluster(&args.dir, args.prefix.as_bytes())
        .with_context(|| format!("auditing the cluster in {}", args.dir.display()))?;
    let disagreeing = audit.disagreeing_shards();
    let total = audit.total();
    let replicas: Vec<serde_json::Value> = audit
        .replicas
        .iter()
        .map(|replica| {
            serde_json::json!({
                "node": replica.node,
                "shard": replica.shard,
                "member": replica.member,
                "keys": replica.keys,
                "committed": replica.committed,
                "prepared": replica.prepared,
                "digest": replica.digest,
                "total": replica.total.to_string(),
            })
        })
        .collect();
    let report = serde_json::json!({
        "map_version": audit.map_version,
        "replicas": replicas,
        "disagreeing_shards": disagreeing,
        "prefix": args.prefix,
        "total": total.to_string(),
        "expected_total": args.expect_total,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    let wrong_total = args.expect_total.is_some_and(|expected| u128::from(expected) != total);
    if !disagreeing.is_empty() {
        eprintln!("error: the replicas of shard(s) {disagreeing:?} hold different states");
    }
    if wrong_total {
        eprintln!("error: the total under {:?} is {total}, not {:?}", args.prefix, args.expect_total);
    }
    Ok(if disagreeing.is_empty() && !wrong_total { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
