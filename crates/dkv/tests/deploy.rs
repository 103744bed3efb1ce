//! The configuration service deployed for real: replicas under the tokio driver with their
//! record logs on files, and a client, over any transport.
//!
//! Waits are bounded in real time. On a shared 2-core machine a step can stall for the
//! scheduler's reasons, so a bound says "this happens at all", with room to spare, never
//! "this happens fast": a run that needs 300 ms passes the same as one that needs 2 s, and
//! speed is measured by the benchmarks, not by tests.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use virga_core::device::{FileStorage, Storage};
use virga_dkv::service::{open_replica, ClientOutcome, ConfigClient, ConfigClientConfig, ConfigCore, ReplicaConfig};
use virga_dkv::Dkv;
use virga_dkv::{ConfigCommand, ConfigState, Partitioning, ShardId, ShardMap};
use virga_net::driver::{Mailbox, Running};
use virga_net::role::NoIo;
use virga_net::{Host, Transport};

/// The longest any one wait of these tests may take: elections need 10 to 20 ticks of 10 ms
/// (more after a split vote), and each command an fsync on a majority.
pub(crate) const WITHIN: Duration = Duration::from_millis(2_500);

pub(crate) fn replica_name(id: u64) -> String {
    format!("config-{id}")
}

/// The three replicas of the service: Raft ids 1 to 3.
pub(crate) fn peers() -> Vec<(u64, String)> {
    (1..=3).map(|id| (id, replica_name(id))).collect()
}

/// One replica under the driver.
pub(crate) struct Replica {
    pub id: u64,
    pub name: String,
    running: Running<ConfigCore>,
    stop: watch::Sender<bool>,
}

impl Replica {
    pub(crate) fn with_core<T>(&self, read: impl FnOnce(&ConfigCore) -> T) -> T {
        self.running.with_core(read)
    }

    /// Stops the driver and waits for its loop to end (its record log closes with it).
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        self.running.join().await;
    }
}

/// Opens replica `id` from its directory under `dir` (founding it when empty) and runs it as
/// peer `config-<id>` on `transport`. `publish` makes the replica's host reachable (registers
/// it in process, or serves it on a gRPC listener) before the core takes its first step.
pub(crate) fn start_replica(
    dir: &Path,
    id: u64,
    transport: Arc<dyn Transport<Dkv>>,
    publish: impl FnOnce(&str, Host),
) -> Replica {
    let name = replica_name(id);
    let mut config = ReplicaConfig::new(id, peers(), id);
    config.keep_history = true;
    let storage: Arc<dyn Storage> = Arc::new(FileStorage::create_dir_all(dir.join(&name)).unwrap());
    let (core, disk) = open_replica(config, storage).unwrap();
    let mailbox = Mailbox::<ConfigCore>::new();
    publish(&name, Host::new().with::<Dkv>(mailbox.handler()));
    let (stop, stopped) = watch::channel(false);
    let running = mailbox.run(name.clone(), core, transport, disk, stopped);
    Replica { id, name, running, stop }
}

/// A configuration client under the driver: its commands go in as the role's input.
pub(crate) struct Client {
    running: Running<ConfigClient>,
    stop: watch::Sender<bool>,
}

impl Client {
    /// Client `id` (a new id per client: a session's sequence numbers never go back).
    pub(crate) fn start(id: &str, transport: Arc<dyn Transport<Dkv>>) -> Client {
        let replicas = peers().into_iter().map(|(_, name)| name).collect();
        let (stop, stopped) = watch::channel(false);
        let client = ConfigClient::new(ConfigClientConfig::new(id, replicas));
        let running = Mailbox::<ConfigClient>::new().run(id, client, transport, NoIo, stopped);
        Client { running, stop }
    }

    pub(crate) fn propose(&self, commands: Vec<ConfigCommand>) {
        assert!(self.running.input(commands), "the client stopped");
    }

    /// Waits until all `count` commands given so far have their outcomes.
    pub(crate) async fn outcomes(&self, count: usize) -> Vec<ClientOutcome> {
        wait_for(&format!("{count} outcomes"), || {
            self.running.with_core(|client| (client.outcomes().len() >= count).then(|| client.outcomes().to_vec()))
        })
        .await
    }

    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        self.running.join().await;
    }
}

/// Polls `probe` until it gives a value, for at most [`WITHIN`].
pub(crate) async fn wait_for<T>(what: &str, probe: impl FnMut() -> Option<T>) -> T {
    wait_for_within(what, WITHIN, probe).await
}

/// Polls `probe` until it gives a value, for at most `within`.
pub(crate) async fn wait_for_within<T>(what: &str, within: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The leader every given replica knows, when one of them leads and all agree on it.
pub(crate) fn agreed_leader(replicas: &[&Replica]) -> Option<u64> {
    let leader = replicas.iter().find(|replica| replica.with_core(ConfigCore::is_leader))?.id;
    replicas.iter().all(|replica| replica.with_core(ConfigCore::leader) == leader).then_some(leader)
}

/// What every given replica has applied, when they all applied the same entries up to at
/// least `at_least`: the configuration state and its (index, hash chain) history.
pub(crate) fn converged(replicas: &[&Replica], at_least: u64) -> Option<(ConfigState, Vec<(u64, u64)>)> {
    let states: Vec<_> = replicas
        .iter()
        .map(|replica| replica.with_core(|core| (core.state().clone(), core.history().to_vec())))
        .collect();
    let (first, rest) = states.split_first()?;
    let same = rest.iter().all(|other| other == first);
    (same && first.0.applied_index() >= at_least).then(|| first.clone())
}

/// Data nodes of the layout the client installs.
fn data_nodes() -> Vec<String> {
    (0..6).map(|index| format!("data-{index}")).collect()
}

/// The commands the tests propose: a layout of 4 shards over 6 data nodes (f = 1), then
/// failovers and backup changes, each at the epoch its group has by then; and the state
/// they lead to (the oracle: `ConfigState` applied in order, here, without Raft).
pub(crate) fn layout_changes() -> (Vec<ConfigCommand>, ConfigState) {
    let map = ShardMap::place(&data_nodes(), Partitioning::Hash { shards: 4 }, 1).unwrap();
    let mut expected = ConfigState::new();
    let mut commands = Vec::new();
    let mut apply = |command: ConfigCommand, expected: &mut ConfigState| {
        let index = commands.len() as u64 + 1;
        expected.apply(index, &command).unwrap();
        commands.push(command);
    };
    apply(ConfigCommand::Install(map), &mut expected);
    for shard in [ShardId(0), ShardId(2)] {
        let group = expected.map().unwrap().group(shard).unwrap().clone();
        let new_primary = group.backups[0].clone();
        apply(ConfigCommand::Failover { shard, epoch: group.epoch, new_primary }, &mut expected);
        let node = outsider(&expected, shard);
        apply(ConfigCommand::AddBackup { shard, epoch: group.epoch + 1, node }, &mut expected);
    }
    let group = expected.map().unwrap().group(ShardId(1)).unwrap().clone();
    let node = group.backups[1].clone();
    apply(ConfigCommand::RemoveBackup { shard: ShardId(1), epoch: group.epoch, node }, &mut expected);
    (commands, expected)
}

/// A data node outside `shard`'s group.
pub(crate) fn outsider(state: &ConfigState, shard: ShardId) -> String {
    let group = state.map().unwrap().group(shard).unwrap();
    data_nodes().into_iter().find(|node| !group.contains(node)).unwrap()
}

/// The client was told of every command, in order, each applied (none refused), at
/// increasing log indexes and map versions.
pub(crate) fn assert_all_applied(outcomes: &[ClientOutcome], commands: &[ConfigCommand]) {
    let given: Vec<_> = outcomes.iter().map(|outcome| &outcome.command).collect();
    assert_eq!(given, commands.iter().collect::<Vec<_>>());
    for outcome in outcomes {
        assert_eq!(outcome.refusal, "", "{outcome:?}");
    }
    for pair in outcomes.windows(2) {
        assert!(pair[0].index < pair[1].index && pair[0].version < pair[1].version, "{pair:?}");
    }
}
