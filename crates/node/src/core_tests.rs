//! The storage node's and the miner's cores, driven event by event; the tests assert on the
//! commands they emit.

use crate::messages::{BlockId, Request, Response, Submission, TxOutcome, Verdict, WitnessRequest};
use crate::protocol::Rainblock;
use alloy_primitives::{keccak256, B256, U256};
use std::sync::Arc;
use std::time::Duration;
use virga_core::device::MemStorage;
use virga_ledger::tx::SignedTx;
use virga_net::role::{CallId, Command, Event, IoExecutor, IoId, Protocol, Role};
use virga_net::NetError;
use virga_trie::proof::NodeBag;

use crate::miner::MinerConfig;
use crate::miner::{execution_pool, MinerCore, MinerIo, MinerIoDone, VerifyJob, BLOCK_REFUSED};

/// The pool the miner's jobs run on, as its device would.
fn pool() -> &'static rayon::ThreadPool {
    static POOL: std::sync::OnceLock<std::sync::Arc<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| execution_pool(1).unwrap())
}
use crate::storage::{
    log_options, open_core, BlockRefusal, NodeStorage, StorageCore, StorageDisk, StorageIo, StorageIoDone,
    CHECKPOINT_LAG,
};
use crate::testkit::Fixture;
use crate::topology::Topology;
use crate::workload::GAS_PRICE;

type MinerCommand = Command<Rainblock, MinerIo>;
type StorageCommand = Command<Rainblock, StorageIo>;

fn fixture() -> Fixture {
    let topology =
        Topology { accounts: 200, storage_nodes: 2, max_block_transfers: 64, retention: 2, ..Topology::small() };
    Fixture::new(topology).unwrap()
}

fn storage_core(fixture: &Fixture, id: &str) -> StorageCore {
    open_core(id, fixture.served(id).unwrap(), fixture.header.clone(), &fixture.sharded, NodeStorage::None)
        .unwrap()
        .core
}

fn miner(fixture: &Fixture, top_budget_bytes: usize) -> MinerCore {
    let config = MinerConfig { top_budget_bytes, ..fixture.miner_config(0) };
    MinerCore::new(config, fixture.header.clone()).unwrap()
}

/// The calls among `commands`: callee, call id and request.
pub(crate) fn calls(commands: &[MinerCommand]) -> Vec<(String, CallId, Request)> {
    commands
        .iter()
        .filter_map(|command| match command {
            Command::Call { to, call, request, .. } => Some((to.clone(), *call, request.clone())),
            _ => None,
        })
        .collect()
}

pub(crate) fn replies(commands: &[MinerCommand]) -> Vec<(CallId, Response)> {
    commands
        .iter()
        .filter_map(|command| match command {
            Command::Reply { call, response, .. } => Some((*call, response.clone())),
            _ => None,
        })
        .collect()
}

/// Serves a call from the storage node it names (they keep no log, so each answers at once).
fn serve(nodes: &mut [(String, StorageCore)], to: &str, request: Request) -> Response {
    let (_, node) = nodes.iter_mut().find(|(id, _)| id == to).unwrap();
    let mut out: Vec<StorageCommand> = Vec::new();
    node.step(0, Event::Request { from: "miner-0".into(), call: CallId(0), request }, &mut out);
    match out.pop() {
        Some(Command::Reply { response, .. }) => response,
        other => panic!("the storage node answered with {other:?}"),
    }
}

/// Steps the miner with the answer to each of its calls, as long as it makes calls.
pub(crate) fn answer_calls(
    miner: &mut MinerCore,
    nodes: &mut [(String, StorageCore)],
    mut commands: Vec<MinerCommand>,
) -> Vec<MinerCommand> {
    let mut rest = Vec::new();
    while !commands.is_empty() {
        let mut next = Vec::new();
        for command in commands {
            match command {
                Command::Call { to, call, request, .. } => {
                    let result = Rainblock::check(&to, serve(nodes, &to, request));
                    miner.step(1_000_000_000, Event::Response { call, result }, &mut next);
                }
                other => rest.push(other),
            }
        }
        commands = next;
    }
    rest
}

pub(crate) struct Net {
    pub(crate) fixture: Fixture,
    pub(crate) nodes: Vec<(String, StorageCore)>,
    pub(crate) miner: MinerCore,
}

/// A warm miner and its storage nodes at genesis.
fn warm_net(top_budget_bytes: usize) -> Net {
    warm_net_on(fixture(), top_budget_bytes)
}

/// A warm miner and its storage nodes at `fixture`'s genesis.
pub(crate) fn warm_net_on(fixture: Fixture, top_budget_bytes: usize) -> Net {
    let mut nodes: Vec<(String, StorageCore)> =
        fixture.layout.iter().map(|(id, _)| (id.clone(), storage_core(&fixture, id))).collect();
    let mut miner = miner(&fixture, top_budget_bytes);
    let mut out = Vec::new();
    miner.step(1_000_000_000, Event::Start, &mut out);
    let asked = calls(&out);
    let tops = asked.iter().filter(|(_, _, r)| matches!(r, Request::Top(_))).count();
    assert_eq!(tops, 2, "a top request to each storage node: {asked:?}");
    assert!(asked.iter().any(|(_, _, r)| matches!(r, Request::Witness(_))));
    assert!(!miner.warm_up_state().0);
    answer_calls(&mut miner, &mut nodes, out);
    assert!(miner.warm_up_state().0, "warm once every top and the witness are in");
    Net { fixture, nodes, miner }
}

/// A submission of `count` transfers from account `sender` (nonces from `first_nonce`) to the
/// next account, with its witness from the storage nodes at the miner's head.
fn submission(net: &mut Net, sender: usize, first_nonce: u64, count: u64) -> Submission {
    let accounts = &net.fixture.accounts;
    let to = (sender + 1) % accounts.addresses.len();
    let transactions = (first_nonce..first_nonce + count)
        .map(|nonce| {
            let chain_id = net.fixture.config.exec.chain_id;
            let tx = SignedTx::sign(
                &accounts.keys[sender],
                nonce,
                accounts.addresses[to],
                U256::from(1u64),
                GAS_PRICE,
                virga_ledger::exec::TRANSFER_GAS,
                Some(chain_id),
            );
            tx.encode()
        })
        .collect();
    let (number, hash, root) = net.miner.head();
    let keys = [keccak256(accounts.addresses[sender]), keccak256(accounts.addresses[to])];
    let mut bags = Vec::new();
    for (id, node) in &mut net.nodes {
        let _ = id;
        let keys: Vec<B256> =
            keys.iter().filter(|key| node.served().contains(&(key[0] as usize >> 4))).copied().collect();
        if keys.is_empty() {
            continue;
        }
        let witness =
            WitnessRequest { keys, compaction: 0, at: Some(BlockId::new(number, hash)), ..Default::default() };
        bags.push(node.witness(&witness).unwrap().bag);
    }
    Submission {
        transactions,
        bag: NodeBag::merge(bags),
        witness_at: BlockId::new(number, hash),
        witness_root: root,
        storage: Vec::new(),
        codes: Vec::new(),
    }
}

/// Hands the miner a submission; the block it hands out is built at once.
pub(crate) fn submit(miner: &mut MinerCore, call: u64, submission: Submission) -> Vec<MinerCommand> {
    let out = submit_unbuilt(miner, call, submission);
    build_now(miner, out)
}

fn submit_unbuilt(miner: &mut MinerCore, call: u64, submission: Submission) -> Vec<MinerCommand> {
    let mut out = Vec::new();
    let request = Request::Submit(submission);
    miner.step(2_000_000_000, Event::Request { from: "client-0".into(), call: CallId(call), request }, &mut out);
    out
}

/// Builds each block handed out among `commands` and hands the miner its completion;
/// returns the other commands, with those of the completions.
fn build_now(miner: &mut MinerCore, commands: Vec<MinerCommand>) -> Vec<MinerCommand> {
    let mut out = Vec::new();
    for command in commands {
        match command {
            Command::Io { io, op: MinerIo::Build(job) } => {
                let mut next = Vec::new();
                miner.step(
                    2_000_000_000,
                    Event::IoDone { io, result: MinerIoDone::Built(Box::new(job.run(pool()))) },
                    &mut next,
                );
                out.extend(build_now(miner, next));
            }
            other => out.push(other),
        }
    }
    out
}

pub(crate) fn outcomes(response: &Response) -> Vec<TxOutcome> {
    match &response {
        Response::Submitted(submitted) => submitted.outcomes.clone(),
        other => panic!("not a submission reply: {other:?}"),
    }
}

#[test]
fn a_block_is_answered_only_after_every_storage_node_logged_it_and_it_is_stored() {
    let mut net = warm_net(1 << 20);
    let submission = submission(&mut net, 0, 0, 3);
    let out = submit(&mut net.miner, 7, submission);
    let sent = calls(&out);
    assert_eq!(sent.len(), 2, "the block goes to both storage nodes: {out:?}");
    assert!(sent.iter().all(|(_, _, r)| matches!(r, Request::ApplyBlock(_))));
    assert!(replies(&out).is_empty(), "no answer before the storage nodes log the block");
    let rest = answer_calls(&mut net.miner, &mut net.nodes, out);
    let Some(Command::Io { io, op: MinerIo::Store { number, .. } }) = rest.first() else {
        panic!("the acknowledged block is stored first: {rest:?}")
    };
    assert_eq!(*number, 1);
    assert!(replies(&rest).is_empty(), "no answer before the block is stored");
    assert_eq!(net.miner.head().0, 0);
    let mut out = Vec::new();
    net.miner.step(3_000_000_000, Event::IoDone { io: *io, result: MinerIoDone::Stored(Ok(())) }, &mut out);
    let answered = replies(&out);
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0].0, CallId(7));
    let outcomes = outcomes(&answered[0].1);
    assert_eq!(outcomes.len(), 3);
    assert!(outcomes.iter().all(|o| o.included && o.succeeded), "{outcomes:?}");
    assert_eq!(net.miner.head().0, 1);
    assert_eq!(net.nodes[0].1.head().2, net.miner.head().2, "the storage node is at the miner's root");
}

#[test]
fn a_refused_block_is_abandoned_with_the_block_built_on_it_and_the_tip_returns_in_a_new_epoch() {
    let mut net = warm_net(1 << 20);
    let first = submission(&mut net, 0, 0, 1);
    let second = submission(&mut net, 2, 0, 1);
    let out = submit(&mut net.miner, 1, first);
    let block_one = calls(&out);
    // The second block is built on the first while the first commits.
    let out_two = submit(&mut net.miner, 2, second);
    assert!(calls(&out_two).is_empty(), "block 2 waits for block 1 to commit: {out_two:?}");
    let mut out = Vec::new();
    let (_, call, _) = &block_one[0];
    net.miner.step(
        0,
        Event::Response {
            call: *call,
            result: Err(NetError::Refused { peer: "storage-0".into(), reason: "no".into() }),
        },
        &mut out,
    );
    let (_, call, request) = &block_one[1];
    let result = Rainblock::check("storage-1", serve(&mut net.nodes, "storage-1", request.clone()));
    net.miner.step(0, Event::Response { call: *call, result }, &mut out);
    let answered = replies(&out);
    assert_eq!(answered.len(), 2, "both blocks' submissions are answered: {out:?}");
    for (_, response) in &answered {
        let outcomes = outcomes(response);
        assert!(outcomes.iter().all(|o| !o.included && o.reason == BLOCK_REFUSED), "{outcomes:?}");
    }
    let stats = net.miner.stats();
    assert_eq!(stats.abandoned_blocks, 2);
    assert_eq!(stats.block_refusals, vec![("storage-0".to_string(), "no".to_string())]);
    assert_eq!(net.miner.head().0, 0);
    assert!(net.miner.is_idle());
    // The next block builds on the committed head again: block 1 once more.
    let again = submission(&mut net, 0, 0, 1);
    let out = submit(&mut net.miner, 3, again);
    let Some((_, _, Request::ApplyBlock(updates))) = calls(&out).into_iter().next() else { panic!("{out:?}") };
    let header = updates.header.clone();
    assert_eq!(header.number, 1);
    assert_eq!(header.parent_hash, net.fixture.header.hash_slow());
}

/// The build job among `commands`, if there is one, and the other commands.
fn take_build(
    commands: Vec<MinerCommand>,
) -> (Option<(virga_net::role::IoId, Box<crate::miner::BuildJob>)>, Vec<MinerCommand>) {
    let mut job = None;
    let mut rest = Vec::new();
    for command in commands {
        match command {
            Command::Io { io, op: MinerIo::Build(build) } => {
                assert!(job.is_none(), "one build at a time");
                job = Some((io, build));
            }
            other => rest.push(other),
        }
    }
    (job, rest)
}

#[test]
fn a_block_is_sent_only_once_built_and_the_core_commits_the_previous_one_while_the_next_builds() {
    let mut net = warm_net(1 << 20);
    let first = submission(&mut net, 0, 0, 2);
    let (job, rest) = take_build(submit_unbuilt(&mut net.miner, 1, first));
    let (io, job) = job.expect("the submission is handed out to be built");
    assert!(rest.is_empty(), "nothing is sent before the block is built: {rest:?}");
    assert_eq!(job.transfers(), 2);
    // A submission arriving during the build waits: one build at a time.
    let second = submission(&mut net, 2, 0, 1);
    let (none, rest) = take_build(submit_unbuilt(&mut net.miner, 2, second));
    assert!(none.is_none() && rest.is_empty(), "{rest:?}");
    assert!(!net.miner.is_idle());
    let mut out = Vec::new();
    net.miner.step(0, Event::IoDone { io, result: MinerIoDone::Built(Box::new(job.run(pool()))) }, &mut out);
    // Block 1 goes to the storage nodes and the second submission is handed out at once.
    let (job, block_one) = take_build(out);
    let (io, job) = job.expect("the waiting submission is built while block 1 commits");
    assert_eq!(job.transfers(), 1);
    assert_eq!(calls(&block_one).len(), 2, "{block_one:?}");
    // Block 1 commits and is answered while block 2 is still being built.
    let rest = answer_calls(&mut net.miner, &mut net.nodes, block_one);
    let Some(Command::Io { io: stored, op: MinerIo::Store { number: 1, .. } }) = rest.first() else {
        panic!("{rest:?}")
    };
    let mut out = Vec::new();
    net.miner.step(0, Event::IoDone { io: *stored, result: MinerIoDone::Stored(Ok(())) }, &mut out);
    assert_eq!(replies(&out).iter().map(|(call, _)| *call).collect::<Vec<_>>(), [CallId(1)]);
    assert_eq!(net.miner.head().0, 1);
    // Block 2 builds on block 1.
    let mut out = Vec::new();
    net.miner.step(0, Event::IoDone { io, result: MinerIoDone::Built(Box::new(job.run(pool()))) }, &mut out);
    let Some((_, _, Request::ApplyBlock(updates))) = calls(&out).into_iter().next() else { panic!("{out:?}") };
    let header = updates.header.clone();
    assert_eq!((header.number, header.parent_hash), (2, net.miner.head().1));
}

#[test]
fn a_block_built_while_its_parent_is_refused_is_abandoned_when_its_build_completes() {
    let mut net = warm_net(1 << 20);
    let first = submission(&mut net, 0, 0, 1);
    let block_one = calls(&submit(&mut net.miner, 1, first));
    let second = submission(&mut net, 2, 0, 1);
    let (job, rest) = take_build(submit_unbuilt(&mut net.miner, 2, second));
    let (io, job) = job.expect("block 2 is handed out while block 1 commits");
    assert!(rest.is_empty(), "{rest:?}");
    // Block 1 is refused while block 2 is being built.
    let mut out = Vec::new();
    for (peer, call, _) in &block_one {
        let result = Err(NetError::Refused { peer: peer.clone(), reason: "no".into() });
        net.miner.step(0, Event::Response { call: *call, result }, &mut out);
    }
    assert_eq!(replies(&out).len(), 1, "block 1's submission is answered: {out:?}");
    let mut out = Vec::new();
    net.miner.step(0, Event::IoDone { io, result: MinerIoDone::Built(Box::new(job.run(pool()))) }, &mut out);
    assert!(calls(&out).is_empty(), "block 2 descends from the refused block and is never sent: {out:?}");
    let answered = replies(&out);
    assert_eq!(answered.len(), 1, "{out:?}");
    assert_eq!(answered[0].0, CallId(2));
    assert!(outcomes(&answered[0].1).iter().all(|o| !o.included && o.reason == BLOCK_REFUSED));
    let stats = net.miner.stats();
    assert_eq!(stats.abandoned_blocks, 2);
    assert!(net.miner.is_idle());
    assert_eq!(net.miner.head().0, 0);
    // The tip stayed at the committed head: the next block is block 1 again, on genesis.
    let again = submission(&mut net, 0, 0, 1);
    let out = submit(&mut net.miner, 3, again);
    let Some((_, _, Request::ApplyBlock(updates))) = calls(&out).into_iter().next() else { panic!("{out:?}") };
    let header = updates.header.clone();
    assert_eq!((header.number, header.parent_hash), (1, net.fixture.header.hash_slow()));
}

#[test]
fn an_unreachable_storage_node_is_asked_again_with_a_doubling_back_off() {
    let mut net = warm_net(1 << 20);
    let submission = submission(&mut net, 0, 0, 1);
    let out = submit(&mut net.miner, 1, submission);
    let (peer, call, _) = calls(&out)[0].clone();
    let mut delays = Vec::new();
    let mut call = call;
    for _ in 0..3 {
        let mut out = Vec::new();
        let result = Err(NetError::DeadlineExceeded { peer: peer.clone(), after: Duration::from_secs(10) });
        net.miner.step(0, Event::Response { call, result }, &mut out);
        let Some(Command::SetTimer { timer, after }) = out.pop() else { panic!("a retry timer: {out:?}") };
        delays.push(after);
        let mut out = Vec::new();
        net.miner.step(0, Event::Timer(timer), &mut out);
        let again = calls(&out);
        assert_eq!(again.len(), 1, "{out:?}");
        assert_eq!(again[0].0, peer, "the same storage node is asked again");
        call = again[0].1;
    }
    assert_eq!(delays, [Duration::from_millis(20), Duration::from_millis(40), Duration::from_millis(80)]);
    assert_eq!(net.miner.head().0, 0, "nothing commits while a storage node has not logged the block");
}

#[test]
fn a_top_layer_over_budget_is_pruned_after_each_block() {
    let mut net = warm_net(0);
    for nonce in 0..3 {
        let submission = submission(&mut net, 0, nonce, 1);
        let out = submit(&mut net.miner, nonce, submission);
        let rest = answer_calls(&mut net.miner, &mut net.nodes, out);
        let Some(Command::Io { io, .. }) = rest.first() else { panic!("{rest:?}") };
        let mut out = Vec::new();
        net.miner.step(0, Event::IoDone { io: *io, result: MinerIoDone::Stored(Ok(())) }, &mut out);
    }
    let stats = net.miner.stats();
    assert_eq!(net.miner.head().0, 3);
    assert!(stats.prunes >= 3, "{stats:?}");
}

fn logged_storage_core(fixture: &Fixture, storage: Arc<MemStorage>) -> (StorageCore, StorageDisk) {
    let storage = NodeStorage::on(storage, log_options()).unwrap();
    let opened =
        open_core("storage-0", fixture.served("storage-0").unwrap(), fixture.header.clone(), &fixture.sharded, storage)
            .unwrap();
    (opened.core, opened.disk.unwrap())
}

/// Block 1's updates for storage-0, made by a miner.
fn block_one_updates() -> (Fixture, Request) {
    let mut net = warm_net(1 << 20);
    let submission = submission(&mut net, 0, 0, 2);
    let out = submit(&mut net.miner, 1, submission);
    let (_, _, request) = calls(&out).into_iter().find(|(to, _, _)| to == "storage-0").unwrap();
    (net.fixture, request)
}

#[test]
fn a_storage_node_acknowledges_a_block_only_once_its_log_record_is_durable() {
    let (fixture, block) = block_one_updates();
    let (mut core, mut disk) = logged_storage_core(&fixture, Arc::new(MemStorage::new()));
    let mut out = Vec::new();
    core.step(0, Event::Request { from: "miner-0".into(), call: CallId(1), request: block.clone() }, &mut out);
    // A duplicate while the record is being written waits for the same record.
    core.step(0, Event::Request { from: "miner-0".into(), call: CallId(2), request: block }, &mut out);
    assert_eq!(out.len(), 1, "one append and no acknowledgement yet: {out:?}");
    let Some(Command::Io { io, op: op @ StorageIo::Append { .. } }) = out.pop() else { panic!() };
    let result = disk.execute(op);
    assert!(matches!(result, StorageIoDone::Appended(Ok(1))), "{result:?}");
    core.step(0, Event::IoDone { io, result }, &mut out);
    let acked: Vec<CallId> = out
        .iter()
        .filter_map(|command| match command {
            Command::Reply { call, response: Response::BlockAck(_), .. } => Some(*call),
            _ => None,
        })
        .collect();
    assert_eq!(acked, [CallId(1), CallId(2)]);
    assert_eq!(core.stats().blocks_applied, 1);
}

#[test]
fn a_failed_append_refuses_the_block_and_forgets_its_version() {
    let (fixture, block) = block_one_updates();
    let (mut core, _disk) = logged_storage_core(&fixture, Arc::new(MemStorage::new()));
    let mut out = Vec::new();
    core.step(0, Event::Request { from: "miner-0".into(), call: CallId(1), request: block }, &mut out);
    let Some(Command::Io { io, .. }) = out.pop() else { panic!() };
    let full = virga_log::LogError::Io {
        op: "fsync",
        path: "mem:/updates".into(),
        source: std::io::Error::other("disk full"),
    };
    core.step(0, Event::IoDone { io, result: StorageIoDone::Appended(Err(full)) }, &mut out);
    match out.pop() {
        Some(Command::Reply { response: Response::Refused(reason), .. }) => {
            assert!(reason.starts_with("logging block 1 failed: failed to fsync mem:/updates"), "{reason}");
            assert!(reason.contains("disk full"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(core.head().0, 0, "the unlogged block is not the head");
    assert_eq!(core.version_count(), 1);
}

#[test]
fn a_block_on_an_unknown_parent_is_refused_as_such_and_its_sender_hears_why() {
    let (fixture, block) = block_one_updates();
    let (mut core, _disk) = logged_storage_core(&fixture, Arc::new(MemStorage::new()));
    let Request::ApplyBlock(mut updates) = block else { panic!("{block:?}") };
    let mut header = updates.header.clone();
    header.parent_hash = B256::repeat_byte(7);
    updates.header = header;
    let mut out = Vec::new();
    let refused = core.admit_block("miner-0".into(), CallId(1), updates.clone(), &mut out).unwrap_err();
    assert!(
        matches!(refused, BlockRefusal::UnknownParent { number: 1, parent } if parent == B256::repeat_byte(7)),
        "{refused:?}"
    );
    assert!(out.is_empty(), "nothing logged or answered: {out:?}");
    let request = Request::ApplyBlock(updates);
    core.step(0, Event::Request { from: "miner-0".into(), call: CallId(2), request }, &mut out);
    match out.pop() {
        Some(Command::Reply { call: CallId(2), response: Response::Refused(reason), .. }) => {
            assert_eq!(reason, refused.to_string())
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(core.stats().blocks_rejected, 2);
}

#[test]
fn a_checkpoint_is_asked_for_every_interval_and_the_log_is_cut_below_the_previous_one() {
    let fixture = fixture();
    let (mut core, _) = logged_storage_core(&fixture, Arc::new(MemStorage::new()));
    core.set_checkpoint_interval(1);
    // Logged blocks are fed to the core as its device would complete them.
    let mut net = warm_net(1 << 20);
    let mut asked = Vec::new();
    for nonce in 0..(CHECKPOINT_LAG + 4) {
        let submission = submission(&mut net, 0, nonce, 1);
        let out = submit(&mut net.miner, nonce, submission);
        let (_, _, request) = calls(&out).into_iter().find(|(to, _, _)| to == "storage-0").unwrap();
        let rest = answer_calls(&mut net.miner, &mut net.nodes, out);
        let Some(Command::Io { io, .. }) = rest.first() else { panic!("{rest:?}") };
        net.miner.step(0, Event::IoDone { io: *io, result: MinerIoDone::Stored(Ok(())) }, &mut Vec::new());
        let mut out = Vec::new();
        core.step(0, Event::Request { from: "miner-0".into(), call: CallId(nonce), request }, &mut out);
        let Some(Command::Io { io, .. }) = out.pop() else { panic!() };
        core.step(0, Event::IoDone { io, result: StorageIoDone::Appended(Ok(nonce + 1)) }, &mut out);
        for command in out {
            if let Command::Io { io, op: StorageIo::WriteCheckpoint { header, .. } } = command {
                asked.push(header.number);
                let mut cut = Vec::new();
                core.step(
                    0,
                    Event::IoDone { io, result: StorageIoDone::CheckpointWritten(Ok(header.number)) },
                    &mut cut,
                );
                if let Some(Command::Io { op: StorageIo::CutLog { below }, .. }) = cut.pop() {
                    assert!(below > 1, "the cut keeps the records above the previous checkpoint");
                }
            }
        }
    }
    assert!(!asked.is_empty(), "checkpoints were asked for");
    assert!(asked.windows(2).all(|pair| pair[0] < pair[1]), "{asked:?}");
    assert!(asked.iter().all(|&number| number + CHECKPOINT_LAG <= CHECKPOINT_LAG + 4), "{asked:?}");
}

/// Two warm miners at genesis on the same storage nodes: miner-0 gossips to miner-1.
fn two_miners() -> (Net, MinerCore) {
    let topology = Topology {
        accounts: 200,
        storage_nodes: 2,
        miners: 2,
        max_block_transfers: 64,
        retention: 2,
        ..Topology::small()
    };
    let mut net = warm_net_on(Fixture::new(topology).unwrap(), 1 << 20);
    let mut follower = MinerCore::new(net.fixture.miner_config(1), net.fixture.header.clone()).unwrap();
    let mut out = Vec::new();
    follower.step(1_000_000_000, Event::Start, &mut out);
    answer_calls(&mut follower, &mut net.nodes, out);
    assert!(follower.warm_up_state().0);
    (net, follower)
}

/// miner-0 commits a block of `submission`; returns its announcement to miner-1.
fn commit_and_announce(net: &mut Net, submission: Submission) -> Request {
    announce(net, submission).1
}

/// As [`commit_and_announce`], with the announcement's call.
fn announce(net: &mut Net, submission: Submission) -> (CallId, Request) {
    let out = submit(&mut net.miner, 1, submission);
    let rest = answer_calls(&mut net.miner, &mut net.nodes, out);
    let Some(Command::Io { io, op: MinerIo::Store { .. } }) = rest.first() else { panic!("stored: {rest:?}") };
    let mut out = Vec::new();
    net.miner.step(3_000_000_000, Event::IoDone { io: *io, result: MinerIoDone::Stored(Ok(())) }, &mut out);
    let announced =
        calls(&out).into_iter().find(|(to, _, request)| to == "miner-1" && matches!(request, Request::Announce(_)));
    let (_, call, request) = announced.expect("the committed block is announced to miner-1");
    (call, request)
}

/// The verify jobs among `commands`, and the rest.
fn verify_jobs(commands: Vec<MinerCommand>) -> (Vec<(IoId, Box<VerifyJob>)>, Vec<MinerCommand>) {
    let (mut jobs, mut rest) = (Vec::new(), Vec::new());
    for command in commands {
        match command {
            Command::Io { io, op: MinerIo::Verify(job) } => jobs.push((io, job)),
            other => rest.push(other),
        }
    }
    (jobs, rest)
}

/// Runs a verify job as the device would and hands the miner its completion.
fn verify_now(miner: &mut MinerCore, now: u64, io: IoId, job: Box<VerifyJob>) -> Vec<MinerCommand> {
    let mut out = Vec::new();
    miner.step(now, Event::IoDone { io, result: MinerIoDone::Verified(Box::new(job.run(pool()))) }, &mut out);
    out
}

fn verdicts(commands: &[MinerCommand]) -> Vec<(CallId, Verdict)> {
    replies(commands)
        .into_iter()
        .filter_map(|(call, response)| match response {
            Response::Verdict(verdict) => Some((call, verdict)),
            _ => None,
        })
        .collect()
}

#[test]
fn an_announced_block_is_verified_off_the_core_one_at_a_time_then_stored_and_adopted() {
    let (mut net, mut follower) = two_miners();
    let submission = submission(&mut net, 0, 0, 3);
    let announcement = commit_and_announce(&mut net, submission);
    let mut out = Vec::new();
    follower.step(
        4_000_000_000,
        Event::Request { from: "miner-0".into(), call: CallId(1), request: announcement.clone() },
        &mut out,
    );
    let (mut jobs, rest) = verify_jobs(out);
    assert_eq!(jobs.len(), 1, "the block is handed out to be verified: {rest:?}");
    assert!(rest.is_empty() && follower.head().0 == 0, "nothing adopted or answered before it is verified");
    let mut out = Vec::new();
    follower.step(
        4_000_000_000,
        Event::Request { from: "miner-0".into(), call: CallId(2), request: announcement },
        &mut out,
    );
    assert!(verify_jobs(out).0.is_empty(), "one verification at a time: the second waits");
    assert!(!follower.is_idle());

    let (io, job) = jobs.remove(0);
    let out = verify_now(&mut follower, 5_000_000_000, io, job);
    let (mut waiting, rest) = verify_jobs(out);
    let Some(Command::Io { io: stored, op: MinerIo::Store { number: 1, .. } }) = rest.first() else {
        panic!("the verified block is stored: {rest:?}")
    };
    assert!(verdicts(&rest).is_empty(), "the verdict waits for the store");
    assert_eq!(follower.head(), net.miner.head(), "adopted: the follower is at the producer's head");
    let mut out = Vec::new();
    follower.step(5_000_000_000, Event::IoDone { io: *stored, result: MinerIoDone::Stored(Ok(())) }, &mut out);
    assert_eq!(verdicts(&out), vec![(CallId(1), Verdict::Accepted)]);

    assert_eq!(waiting.len(), 1, "the second announcement is verified next");
    let (io, job) = waiting.remove(0);
    let out = verify_now(&mut follower, 6_000_000_000, io, job);
    let verdicts = verdicts(&out);
    assert!(
        matches!(verdicts.as_slice(), [(CallId(2), Verdict::Rejected(_))]),
        "block 1 again does not build on the follower's tip: {verdicts:?}"
    );
    assert!(follower.is_idle());
    assert_eq!(follower.stats().verified_blocks, 1);
    assert_eq!(follower.stats().refused_blocks, 1);
}

#[test]
fn a_block_verified_on_a_tip_that_moved_meanwhile_is_verified_again_on_the_tip_as_it_is() {
    let (mut net, mut follower) = two_miners();
    // The follower's own block, witnessed at genesis like the producer's.
    let own = submission(&mut net, 2, 0, 1);
    let theirs = submission(&mut net, 0, 0, 1);
    let announcement = commit_and_announce(&mut net, theirs);
    let mut out = Vec::new();
    follower.step(
        4_000_000_000,
        Event::Request { from: "miner-0".into(), call: CallId(1), request: announcement },
        &mut out,
    );
    let (mut jobs, _) = verify_jobs(out);
    let (io, job) = jobs.remove(0);
    // Meanwhile the follower builds its own block 1 on genesis and sends it out; the storage
    // nodes, at the producer's block 1 already, decide its fate.
    let out = submit(&mut follower, 9, own);
    let rest = answer_calls(&mut follower, &mut net.nodes, out);
    assert!(matches!(rest.first(), Some(Command::Io { op: MinerIo::Store { number: 1, .. }, .. })), "{rest:?}");
    let out = verify_now(&mut follower, 5_000_000_000, io, job);
    let (again, rest) = verify_jobs(out);
    assert_eq!(again.len(), 1, "the tip it was checked on is gone: verified again");
    assert!(rest.is_empty(), "neither adopted nor answered: {rest:?}");
    let (io, job) = again.into_iter().next().expect("one job");
    let out = verify_now(&mut follower, 6_000_000_000, io, job);
    let verdicts = verdicts(&out);
    assert!(
        matches!(verdicts.as_slice(), [(CallId(1), Verdict::Rejected(_))]),
        "the producer's block 1 does not build on the follower's own block 1: {verdicts:?}"
    );
    assert_ne!(follower.head().1, net.miner.head().1, "the follower did not adopt it");
}

#[test]
fn a_peer_that_did_not_answer_an_announcement_holds_no_later_block_up() {
    let (mut net, _) = two_miners();
    let first = submission(&mut net, 0, 0, 1);
    let (call, _) = announce(&mut net, first);
    assert!(!net.miner.is_idle(), "the next block waits for the follower's verdict");
    let silent = Err(NetError::DeadlineExceeded { peer: "miner-1".into(), after: Duration::from_secs(2) });
    net.miner.step(4_000_000_000, Event::Response { call, result: silent }, &mut Vec::new());
    assert!(net.miner.is_idle());

    let second = submission(&mut net, 2, 0, 1);
    let (call, _) = announce(&mut net, second);
    assert!(net.miner.is_idle(), "a silent follower is sent block 2 and not waited for");
    let accepted = Ok(Response::Verdict(Verdict::Accepted));
    net.miner.step(5_000_000_000, Event::Response { call, result: accepted }, &mut Vec::new());

    let third = submission(&mut net, 4, 0, 1);
    announce(&mut net, third);
    assert!(!net.miner.is_idle(), "the follower answered again: block 3's verdict is waited for");
    assert_eq!(net.miner.head().0, 3);
}
