//! The whole store embedded in one process: the configuration service, six data nodes
//! holding three shards of three replicas with their logs on files, and two clients moving
//! money and auditing it, every role under the tokio driver on the in-process transport.
//! Then a primary is stopped: a backup takes over through the configuration service and
//! the clients carry on.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::watch;
use virga_core::device::{FileStorage, Storage};
use virga_dkv::client::{balance, ClientInput, Program, ProgramOutcome, TxnClient, TxnClientConfig};
use virga_dkv::shard::{open_data_node, DataConfig, DataCore};
use virga_dkv::Dkv;
use virga_dkv::{ConfigCommand, Partitioning, ShardMap};
use virga_net::driver::{Mailbox, Running};
use virga_net::role::NoIo;
use virga_net::{Host, InProc};
use virga_storage::{Timestamp, VersionedStore};

use crate::deploy::{agreed_leader, peers, start_replica, wait_for, wait_for_within, Client, Replica};

const ACCOUNTS: usize = 8;
const INITIAL: u64 = 1000;

fn account(index: usize) -> Bytes {
    Bytes::from(format!("acct-{index:03}"))
}

struct Node {
    name: String,
    running: Running<DataCore>,
    stop: watch::Sender<bool>,
}

fn start_data_node(dir: &Path, name: &str, map: &ShardMap, inproc: &Arc<InProc>) -> Node {
    let mut config = DataConfig::new(name, map.clone());
    config.config_replicas = peers().into_iter().map(|(_, name)| name).collect();
    config.session = format!("{name}@0");
    let storage: Arc<dyn Storage> = Arc::new(FileStorage::create_dir_all(dir.join(name)).unwrap());
    let (mut core, disk) = open_data_node(config, storage).unwrap();
    for index in 0..ACCOUNTS {
        core.load(account(index), Bytes::from(INITIAL.to_string()));
    }
    let mailbox = Mailbox::<DataCore>::new();
    inproc.register_host(name, Host::new().with::<Dkv>(mailbox.handler()));
    let (stop, stopped) = watch::channel(false);
    let running = mailbox.run(name.to_string(), core, Arc::clone(inproc) as _, disk, stopped);
    Node { name: name.to_string(), running, stop }
}

fn start_client(id: u32, map: &ShardMap, inproc: &Arc<InProc>) -> (Running<TxnClient>, watch::Sender<bool>) {
    let mut config = TxnClientConfig::new(id, map.clone());
    config.keep_history = true;
    config.config_replicas = peers().into_iter().map(|(_, name)| name).collect();
    let name = format!("client-{id}");
    let mailbox = Mailbox::<TxnClient>::new();
    inproc.register_host(&name, Host::new().with::<Dkv>(mailbox.handler()));
    let (stop, stopped) = watch::channel(false);
    (mailbox.run(name, TxnClient::new(config), Arc::clone(inproc) as _, NoIo, stopped), stop)
}

/// Transfers in a ring, every fourth program an audit of every account.
fn programs(offset: usize, count: usize) -> Vec<Program> {
    let all: Vec<Bytes> = (0..ACCOUNTS).map(account).collect();
    (0..count)
        .map(|index| {
            if index % 4 == 3 {
                Program::Audit(all.clone())
            } else {
                let from = (index + offset) % ACCOUNTS;
                Program::Transfer { from: account(from), to: account((from + 3) % ACCOUNTS), amount: 7 }
            }
        })
        .collect()
}

/// The client has the outcome of `programs` programs and nothing outstanding.
fn finished(client: &Running<TxnClient>, programs: usize) -> bool {
    client.with_core(|client| client.results().len() >= programs && client.outstanding() == 0)
}

/// Every audit a client committed read the initial total; returns how many programs
/// committed.
fn check_client(client: &Running<TxnClient>) -> usize {
    client.with_core(|client| {
        for result in client.results() {
            if let ProgramOutcome::Committed { read_only: true, .. } = result.outcome {
                if result.reads.len() == ACCOUNTS {
                    let sum: u64 = result.reads.iter().map(|(_, value)| balance(value.as_ref())).sum();
                    assert_eq!(sum, INITIAL * ACCOUNTS as u64, "an audit read a wrong total: {result:?}");
                }
            }
        }
        client.results().iter().filter(|result| matches!(result.outcome, ProgramOutcome::Committed { .. })).count()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_commit_and_audits_balance_across_shards_and_through_a_failover() {
    let dir = tempfile::tempdir().unwrap();
    let inproc = InProc::new();
    let replicas: Vec<Replica> = peers()
        .into_iter()
        .map(|(id, _)| {
            start_replica(dir.path(), id, Arc::clone(&inproc) as _, |name, host| inproc.register_host(name, host))
        })
        .collect();
    let all: Vec<&Replica> = replicas.iter().collect();
    wait_for("a configuration leader", || agreed_leader(&all)).await;
    let nodes: Vec<String> = (0..6).map(|index| format!("data-{index}")).collect();
    let map = ShardMap::place(&nodes, Partitioning::Hash { shards: 3 }, 1).unwrap();
    let admin = Client::start("admin-0", Arc::clone(&inproc) as _);
    admin.propose(vec![ConfigCommand::Install(map.clone())]);
    admin.outcomes(1).await;
    let data: Vec<Node> = nodes.iter().map(|name| start_data_node(dir.path(), name, &map, &inproc)).collect();

    let (first, first_stop) = start_client(1, &map, &inproc);
    let (second, second_stop) = start_client(2, &map, &inproc);
    assert!(first.input(ClientInput::Programs(programs(0, 40))));
    assert!(second.input(ClientInput::Programs(programs(5, 40))));
    wait_for_within("both clients finish", std::time::Duration::from_secs(20), || {
        (finished(&first, 40) && finished(&second, 40)).then_some(())
    })
    .await;
    assert_eq!(check_client(&first) + check_client(&second), 80, "every program committed");

    // Stop shard 0's primary for good: a backup proposes the failover, takes over, and the
    // clients find it through the configuration service.
    let primary = map.groups()[0].primary.clone();
    let stopped = data.iter().position(|node| node.name == primary).unwrap();
    inproc.unregister(&primary);
    let _ = data[stopped].stop.send(true);
    assert!(first.input(ClientInput::Programs(programs(2, 24))));
    wait_for_within("the first client finishes after the failover", std::time::Duration::from_secs(30), || {
        finished(&first, 64).then_some(())
    })
    .await;
    let committed = check_client(&first);
    assert!(committed > 40, "programs committed after the failover: {}", committed - 40);
    let final_map = replicas[0].with_core(|core| core.state().map().cloned()).unwrap();
    assert_eq!(final_map.groups()[0].epoch, 2, "shard 0 failed over once");
    // The primaries at the end hold the initial total between them.
    let mut total = 0;
    for (shard, group) in final_map.groups().iter().enumerate() {
        let node = data.iter().find(|node| node.name == group.primary).unwrap();
        total += node.running.with_core(|core| {
            let replica = core.replica(shard as u32).unwrap();
            (0..ACCOUNTS)
                .map(account)
                .filter(|key| final_map.shard_of(key).0 == shard as u32)
                .map(|key| balance(replica.store().get_at(&key, Timestamp::MAX).as_ref()))
                .sum::<u64>()
        });
    }
    assert_eq!(total, INITIAL * ACCOUNTS as u64);

    let _ = (first_stop.send(true), second_stop.send(true));
    for node in &data {
        let _ = node.stop.send(true);
    }
    admin.stop().await;
}
