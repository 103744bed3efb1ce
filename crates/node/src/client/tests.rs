//! The client core driven by hand: events in, and the commands it emits checked. Witnesses
//! come from real storage nodes on a small genesis state, so every check is the real one.

use crate::messages::{BlockId, HeadReply, Request, Response, Submission, SubmissionReply, TxOutcome, WitnessRequest};
use alloy_consensus::Header;
use alloy_primitives::{keccak256, B256, U256};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use virga_ledger::chain::{read_genesis, ChainGenesis};
use virga_net::role::{CallId, Command, Event, Role, TimerId};
use virga_net::NetError;

use super::*;
use crate::cluster::{replicated_layout, write_genesis};
use crate::storage::{shard_state, ShardedState, StorageNode};
use crate::workload::{Accounts, GAS_PRICE};

const SHARDS: usize = 16;
const ACCOUNTS: usize = 24;
const MINER: &str = "miner-0";

/// A call the core made, decoded.
#[derive(Debug)]
enum Sent {
    Head(CallId),
    Witness { call: CallId, peer: String, request: WitnessRequest },
    Submit(CallId, Submission),
    Timer(TimerId, Duration),
}

/// A client core beside real storage nodes at genesis (each shard on two of four nodes).
struct World {
    core: ClientCore,
    nodes: BTreeMap<String, Arc<StorageNode>>,
    layout: Vec<(String, Vec<usize>)>,
    head: (u64, B256, B256),
    accounts: Accounts,
    chain_id: u64,
    genesis: ChainGenesis,
    _dir: tempfile::TempDir,
}

fn world(batch: usize, in_flight: usize, compaction: usize) -> World {
    let dir = tempfile::tempdir().unwrap();
    let accounts = Accounts::generate(ACCOUNTS, &|_| {});
    write_genesis(dir.path(), &accounts.addresses, 100).unwrap();
    let genesis = read_genesis(dir.path()).unwrap();
    let layout = replicated_layout(4, SHARDS, 2);
    let nodes = open_nodes(&layout, &genesis, &genesis.header, genesis.state.accounts().as_trie());
    let head = (0, genesis.header.hash_slow(), genesis.header.state_root);
    let config = ClientConfig {
        id: "client-0".into(),
        miner: MINER.into(),
        storage_nodes: layout.clone(),
        shard_count: SHARDS,
        compaction,
        batch,
        in_flight,
        exec: genesis.config.exec,
        deadline: Duration::from_secs(3),
        back_off: DEFAULT_BACK_OFF,
    };
    let chain_id = genesis.config.exec.chain_id;
    World { core: ClientCore::new(config), nodes, layout, head, accounts, chain_id, genesis, _dir: dir }
}

/// Storage nodes of `layout` whose state is `state` at block `header`.
fn open_nodes(
    layout: &[(String, Vec<usize>)],
    genesis: &ChainGenesis,
    header: &Header,
    state: &virga_trie::Trie,
) -> BTreeMap<String, Arc<StorageNode>> {
    let sharded = ShardedState::of_accounts(shard_state(state, SHARDS).unwrap());
    layout
        .iter()
        .map(|(id, served)| {
            let (node, _) =
                StorageNode::open(id.clone(), served.clone(), SHARDS, genesis.config, header.clone(), &sharded, None)
                    .unwrap();
            (id.clone(), node)
        })
        .collect()
}

impl World {
    /// Moves the head to a block 1 whose state has account `index` one nonce further, as if
    /// a transfer of it had committed: new storage nodes serve it.
    fn commit_behind_the_clients_back(&mut self, index: usize) {
        let mut state = self.genesis.state.clone();
        let address = self.accounts.addresses[index];
        let mut account = state.account(&address).unwrap().unwrap();
        account.nonce += 1;
        state.set_account(address, account);
        let header = Header { number: 1, state_root: state.root(), ..self.genesis.header.clone() };
        self.nodes = open_nodes(&self.layout, &self.genesis, &header, state.accounts().as_trie());
        self.head = (1, header.hash_slow(), header.state_root);
    }

    /// Account `from`'s transfer number `nonce` to account `to`.
    fn transfer(&self, from: usize, to: usize, nonce: u64) -> UserTransfer {
        let tx = SignedTx::sign(
            &self.accounts.keys[from],
            nonce,
            self.accounts.addresses[to],
            U256::from(7u64),
            GAS_PRICE,
            virga_ledger::exec::TRANSFER_GAS,
            Some(self.chain_id),
        );
        UserTransfer { tx, sender: self.accounts.addresses[from] }
    }

    fn step(&mut self, event: Event<Rainblock, std::convert::Infallible, Vec<UserTransfer>>) -> Vec<Sent> {
        let mut out = Vec::new();
        self.core.step(0, event, &mut out);
        out.into_iter()
            .map(|command| match command {
                Command::Call { to, call, request, deadline } => {
                    assert_eq!(deadline, self.core.config().deadline, "every call carries the deadline");
                    match request {
                        Request::Head => {
                            assert_eq!(to, MINER);
                            Sent::Head(call)
                        }
                        Request::Witness(request) => Sent::Witness { call, peer: to, request },
                        Request::Submit(submission) => {
                            assert_eq!(to, MINER);
                            Sent::Submit(call, submission)
                        }
                        other => panic!("unexpected call {other:?}"),
                    }
                }
                Command::SetTimer { timer, after } => Sent::Timer(timer, after),
                other => panic!("unexpected command {other:?}"),
            })
            .collect()
    }

    fn input(&mut self, transfers: Vec<UserTransfer>) -> Vec<Sent> {
        self.step(Event::Input(transfers))
    }

    fn respond(&mut self, call: CallId, result: Result<Response, NetError>) -> Vec<Sent> {
        self.step(Event::Response { call, result })
    }

    fn head_reply(&self) -> Response {
        let (number, hash, root) = self.head;
        Response::Head(HeadReply { head: BlockId::new(number, hash), state_root: root })
    }

    fn witness_reply(&self, peer: &str, request: &WitnessRequest) -> Response {
        Response::Witness(self.nodes[peer].witness(request).unwrap())
    }

    /// Answers the head call and every witness call with honest answers, until the batch's
    /// submission; returns it (and anything else sent on the way).
    fn drive_to_submission(&mut self, head: CallId) -> (CallId, Submission, Vec<Sent>) {
        let mut pending = self.respond(head, Ok(self.head_reply()));
        let mut others = Vec::new();
        while let Some(sent) = pending.pop() {
            match sent {
                Sent::Witness { call, peer, request } => {
                    let reply = self.witness_reply(&peer, &request);
                    pending.extend(self.respond(call, Ok(reply)));
                }
                Sent::Submit(call, submission) => {
                    others.extend(pending);
                    return (call, submission, others);
                }
                other => others.push(other),
            }
        }
        panic!("no submission followed; also sent {others:?}")
    }
}

fn heads(sent: &[Sent]) -> Vec<CallId> {
    sent.iter().filter_map(|sent| if let Sent::Head(call) = sent { Some(*call) } else { None }).collect()
}

fn submitted(outcomes: Vec<(bool, &str)>) -> Response {
    let outcomes = outcomes
        .into_iter()
        .map(|(included, reason)| TxOutcome {
            tx_hash: B256::ZERO,
            included,
            succeeded: included,
            reason: reason.to_string(),
        })
        .collect();
    Response::Submitted(SubmissionReply { block: None, outcomes })
}

fn deadline_exceeded(peer: &str) -> NetError {
    NetError::DeadlineExceeded { peer: peer.to_string(), after: Duration::from_secs(3) }
}

fn decoded(submission: &Submission) -> Vec<B256> {
    submission.transactions.iter().map(|bytes| SignedTx::decode(bytes).unwrap().hash()).collect()
}

#[test]
fn a_batch_asks_the_miner_for_its_head() {
    let mut world = world(10, 2, 3);
    let transfers = vec![world.transfer(0, 1, 0), world.transfer(2, 3, 0)];
    let sent = world.input(transfers);
    assert!(matches!(sent.as_slice(), [Sent::Head(_)]), "{sent:?}");
    assert!(!world.core.is_idle());
    assert_eq!(world.core.accepted(), 2);
}

#[test]
fn a_head_reply_asks_each_storage_node_once_for_its_shards_keys_at_that_block() {
    let mut world = world(10, 1, 3);
    let transfers: Vec<UserTransfer> = (0..6).map(|i| world.transfer(i, i + 10, 0)).collect();
    let mut wanted: Vec<B256> =
        transfers.iter().flat_map(|t| crate::client::precheck::touched_keys(&t.tx, t.sender)).collect();
    wanted.sort_unstable();
    wanted.dedup();
    let head = heads(&world.input(transfers))[0];
    let sent = world.respond(head, Ok(world.head_reply()));
    let mut asked = Vec::new();
    let mut peers = HashSet::new();
    for sent in &sent {
        let Sent::Witness { peer, request, .. } = sent else { panic!("{sent:?}") };
        assert!(peers.insert(peer.clone()), "{peer} asked twice");
        assert_eq!(request.at, Some(BlockId::new(world.head.0, world.head.1)));
        assert_eq!(request.compaction, 0, "full witnesses, to check them");
        let served = &world.layout.iter().find(|(id, _)| id == peer).unwrap().1;
        for key in &request.keys {
            assert!(served.contains(&usize::from(key[0] >> 4)), "{peer} does not serve key {key:?}");
            asked.push(*key);
        }
    }
    asked.sort_unstable();
    assert_eq!(asked, wanted, "every key asked once");
}

#[test]
fn a_refused_or_bad_witness_is_asked_of_the_shards_next_replica() {
    let mut world = world(10, 1, 3);
    let transfers: Vec<UserTransfer> = (0..4).map(|i| world.transfer(i, i + 12, 0)).collect();
    let head = heads(&world.input(transfers))[0];
    let sent = world.respond(head, Ok(world.head_reply()));
    let mut witnesses: Vec<(CallId, String, WitnessRequest)> = sent
        .into_iter()
        .map(|sent| match sent {
            Sent::Witness { call, peer, request } => (call, peer, request),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(witnesses.len() >= 2, "{witnesses:?}");

    // A refusal: the same keys go to another node serving their shards; nothing recorded.
    let (call, refused_by, request) = witnesses.remove(0);
    let refusal = NetError::Refused { peer: refused_by.clone(), reason: "busy".into() };
    let again = world.respond(call, Err(refusal));
    let [Sent::Witness { call, peer, request: retried }] = again.as_slice() else { panic!("{again:?}") };
    assert_ne!(peer, &refused_by);
    assert_eq!(retried.keys, request.keys);
    assert!(world.core.stats().bad_witnesses.is_empty());
    witnesses.push((*call, peer.clone(), retried.clone()));

    // A witness with a node flipped: recorded as not verifying, asked of the next replica.
    let (call, liar, request) = witnesses.remove(0);
    let mut lie = world.nodes[&liar].witness(&request).unwrap();
    let bag = &mut lie.bag;
    let last = bag.nodes[0].len() - 1;
    bag.nodes[0][last] ^= 1;
    let again = world.respond(call, Ok(Response::Witness(lie)));
    let [Sent::Witness { peer, request: retried, .. }] = again.as_slice() else { panic!("{again:?}") };
    assert_ne!(peer, &liar);
    assert_eq!(retried.keys, request.keys);
    let bad = world.core.stats().bad_witnesses;
    assert!(matches!(bad.as_slice(), [(node, WitnessError::DoesNotVerify { .. })] if node == &liar), "{bad:?}");
}

#[test]
fn a_shard_with_no_replica_left_backs_the_batch_off_as_bad_witness() {
    let mut world = world(10, 1, 3);
    let transfer = world.transfer(0, 1, 0);
    let head = heads(&world.input(vec![transfer]))[0];
    let mut pending = world.respond(head, Ok(world.head_reply()));
    let mut timer = None;
    // Every node that is asked does not answer in time.
    while let Some(sent) = pending.pop() {
        match sent {
            Sent::Witness { call, peer, .. } => pending.extend(world.respond(call, Err(deadline_exceeded(&peer)))),
            Sent::Timer(id, after) => {
                assert_eq!(after, DEFAULT_BACK_OFF);
                timer = Some(id);
            }
            other => panic!("{other:?}"),
        }
    }
    let timer = timer.expect("the batch backs off");
    let sent = world.step(Event::Timer(timer));
    assert_eq!(heads(&sent).len(), 1, "the batch is retried: {sent:?}");
    assert_eq!(world.core.stats().retried.get(BAD_WITNESS), Some(&1));
}

#[test]
fn verified_witnesses_lead_to_a_submission_with_the_transactions_and_a_bag() {
    let mut world = world(10, 1, 0);
    let transfers: Vec<UserTransfer> = (0..5).map(|i| world.transfer(i, (i + 7) % ACCOUNTS, 0)).collect();
    let hashes: Vec<B256> = transfers.iter().map(|t| t.tx.hash()).collect();
    let keys: HashSet<Vec<u8>> = transfers
        .iter()
        .flat_map(|t| crate::client::precheck::touched_keys(&t.tx, t.sender).map(|key| key.to_vec()))
        .collect();
    let head = heads(&world.input(transfers))[0];
    let (call, submission, others) = world.drive_to_submission(head);
    assert!(others.is_empty(), "{others:?}");
    assert_eq!(decoded(&submission), hashes);
    assert_eq!(submission.witness_at, BlockId::new(world.head.0, world.head.1));
    assert_eq!(submission.witness_root, world.head.2);
    // Compaction 0 keeps every node: the bag alone proves every account against the root.
    let bag = submission.bag.clone();
    assert_eq!(bag.keys.iter().cloned().collect::<HashSet<_>>(), keys);
    let values = bag.verify(world.head.2).unwrap();
    assert!(values.iter().all(Option::is_some), "every account exists at genesis");
    let stats = world.core.stats();
    assert_eq!((stats.submitted, stats.submissions), (5, 1));
    assert_eq!(stats.witness_bytes_compact, bag.node_bytes() as u64);

    world.respond(call, Ok(submitted(vec![(true, ""); 5])));
    let stats = world.core.stats();
    assert_eq!((stats.committed, stats.committed_ok), (5, 5));
    assert!(world.core.is_idle());
}

#[test]
fn a_compacted_bag_leaves_out_the_upper_levels() {
    let mut world = world(10, 1, 2);
    let transfers: Vec<UserTransfer> = (0..5).map(|i| world.transfer(i, i + 9, 0)).collect();
    let head = heads(&world.input(transfers))[0];
    let (_, submission, _) = world.drive_to_submission(head);
    let bag = submission.bag;
    let stats = world.core.stats();
    assert_eq!(stats.witness_bytes_compact, bag.node_bytes() as u64);
    assert!(stats.witness_bytes_compact < stats.witness_bytes_full, "{stats:?}");
    assert!(bag.verify(world.head.2).is_err(), "the root is not in a bag compacted at 2");
}

#[test]
fn transfers_that_would_fail_are_filtered_with_their_reason_and_the_bag_narrowed() {
    let mut world = world(10, 1, 0);
    let good = world.transfer(0, 1, 0);
    let wrong_nonce = world.transfer(2, 3, 5);
    let head = heads(&world.input(vec![good.clone(), wrong_nonce]))[0];
    let (_, submission, _) = world.drive_to_submission(head);
    assert_eq!(decoded(&submission), vec![good.tx.hash()]);
    let bag = submission.bag;
    let keys: HashSet<Vec<u8>> = bag.keys.iter().cloned().collect();
    let [sender_key, recipient_key] = crate::client::precheck::touched_keys(&good.tx, good.sender);
    assert_eq!(keys, HashSet::from([sender_key.to_vec(), recipient_key.to_vec()]));
    bag.verify(world.head.2).unwrap();
    assert_eq!(world.core.stats().filtered, HashMap::from([("nonce_mismatch".to_string(), 1)]));
}

#[test]
fn a_block_refused_transfer_is_resubmitted_before_its_senders_later_transfer() {
    let mut world = world(10, 1, 3);
    let first = world.transfer(0, 1, 0);
    let later = world.transfer(0, 2, 1);
    let other = world.transfer(3, 4, 0);
    let head = heads(&world.input(vec![first.clone(), later.clone(), other.clone()]))[0];
    let (call, submission, _) = world.drive_to_submission(head);
    assert_eq!(decoded(&submission), vec![first.tx.hash(), other.tx.hash()], "one transfer per sender");
    assert_eq!(world.core.waiting(), 1);

    let sent = world.respond(call, Ok(submitted(vec![(false, "block_refused"), (true, "")])));
    assert_eq!(world.core.stats().retried.get("block_refused"), Some(&1));
    let head = heads(&sent)[0];
    let (call, submission, _) = world.drive_to_submission(head);
    assert_eq!(decoded(&submission), vec![first.tx.hash()], "the refused transfer goes again, alone");
    assert_eq!(world.core.waiting(), 1, "its sender's later transfer still waits");

    let sent = world.respond(call, Ok(submitted(vec![(true, "")])));
    assert_eq!(heads(&sent).len(), 1, "now the later transfer goes");
    assert_eq!(world.core.waiting(), 0);
    assert_eq!(world.core.committed(), 2);
}

#[test]
fn a_deadline_on_the_head_call_backs_off_and_the_batch_is_retried_after_the_timer() {
    let mut world = world(10, 1, 3);
    let transfers = vec![world.transfer(0, 1, 0), world.transfer(2, 3, 0)];
    let head = heads(&world.input(transfers))[0];
    let sent = world.respond(head, Err(deadline_exceeded(MINER)));
    let [Sent::Timer(timer, after)] = sent.as_slice() else { panic!("{sent:?}") };
    assert_eq!(*after, DEFAULT_BACK_OFF);
    assert!(!world.core.is_idle());
    assert!(world.core.stats().retried.is_empty(), "retried when the back-off ends");
    // Input meanwhile waits: the one batch allowed is backing off.
    assert!(world.input(vec![world.transfer(5, 6, 0)]).is_empty());

    let sent = world.step(Event::Timer(*timer));
    let head = heads(&sent)[0];
    assert_eq!(world.core.stats().retried.get(MINER_UNREACHABLE), Some(&2));
    let (_, submission, _) = world.drive_to_submission(head);
    assert_eq!(submission.transactions.len(), 3, "the retried transfers first, then the newer one");
}

#[test]
fn a_failed_submission_is_found_committed_once_its_senders_nonce_moved_past() {
    let mut world = world(10, 1, 3);
    let lost = world.transfer(0, 1, 0);
    let fresh = world.transfer(0, 2, 0);
    let head = heads(&world.input(vec![lost]))[0];
    let (call, _, _) = world.drive_to_submission(head);
    let sent = world.respond(call, Err(deadline_exceeded(MINER)));
    let [Sent::Timer(timer, _)] = sent.as_slice() else { panic!("{sent:?}") };
    let head = heads(&world.step(Event::Timer(*timer)))[0];
    assert_eq!(world.core.stats().retried.get(SUBMISSION_FAILED), Some(&1));

    // The miner had included it after all: at the new head the sender's nonce is past it.
    world.commit_behind_the_clients_back(0);
    let sent = world.respond(head, Ok(world.head_reply()));
    let mut pending = sent;
    while let Some(sent) = pending.pop() {
        let Sent::Witness { call, peer, request } = sent else { panic!("nothing is submitted: {sent:?}") };
        let reply = world.witness_reply(&peer, &request);
        pending.extend(world.respond(call, Ok(reply)));
    }
    let stats = world.core.stats();
    assert_eq!((stats.committed, stats.confirmed_late, stats.committed_ok), (1, 1, 0), "{stats:?}");
    assert!(world.core.is_idle());

    // Another transfer with the same nonce was never submitted: it is filtered, not confirmed.
    let head = heads(&world.input(vec![fresh]))[0];
    let mut pending = world.respond(head, Ok(world.head_reply()));
    while let Some(sent) = pending.pop() {
        let Sent::Witness { call, peer, request } = sent else { panic!("{sent:?}") };
        let reply = world.witness_reply(&peer, &request);
        pending.extend(world.respond(call, Ok(reply)));
    }
    let stats = world.core.stats();
    assert_eq!(stats.confirmed_late, 1);
    assert_eq!(stats.filtered.get("nonce_mismatch"), Some(&1), "{stats:?}");
}

#[test]
fn no_more_than_in_flight_batches_are_under_way() {
    let mut world = world(1, 2, 3);
    let transfers: Vec<UserTransfer> = (0..5).map(|i| world.transfer(i, i + 10, 0)).collect();
    let started = heads(&world.input(transfers));
    assert_eq!(started.len(), 2);
    assert_eq!(world.core.batches_in_flight(), 2);
    let (call, _, _) = world.drive_to_submission(started[0]);
    assert_eq!(world.core.batches_in_flight(), 2, "a batch awaiting its answer still counts");
    let sent = world.respond(call, Ok(submitted(vec![(true, "")])));
    assert_eq!(heads(&sent).len(), 1, "a freed slot starts the next batch");
    assert_eq!(world.core.batches_in_flight(), 2);
}

#[test]
fn a_request_to_a_client_is_refused() {
    let mut world = world(1, 1, 3);
    let mut out = Vec::new();
    let request = Request::Head;
    world.core.step(0, Event::Request { from: "x".into(), call: CallId(9), request }, &mut out);
    assert!(matches!(out.as_slice(), [Command::Reply { call: CallId(9), .. }]), "{out:?}");
}

#[test]
fn check_witness_refuses_another_block_other_keys_and_a_tampered_node() {
    let world = world(1, 1, 3);
    let (number, hash, root) = world.head;
    let (peer, shards) = &world.layout[0];
    let served: Vec<B256> = (0..ACCOUNTS)
        .map(|i| keccak256(world.accounts.addresses[i]))
        .filter(|key| shards.contains(&usize::from(key[0] >> 4)))
        .take(2)
        .collect();
    assert_eq!(served.len(), 2, "storage-0 serves some of the accounts");
    let request = WitnessRequest {
        keys: served.clone(),
        compaction: 0,
        at: Some(BlockId::new(number, hash)),
        ..Default::default()
    };
    let honest = world.nodes[peer].witness(&request).unwrap();
    let (full, compact, values) = check_witness(honest.clone(), &served, (number, hash), root, 3).unwrap();
    assert_eq!(values.len(), 2);
    assert!(compact.node_bytes() < full.node_bytes());

    let elsewhere = (number + 1, hash);
    let error = check_witness(honest.clone(), &served, elsewhere, root, 3).unwrap_err();
    assert!(matches!(error, WitnessError::WrongBlock { .. }), "{error}");

    let error = check_witness(honest.clone(), &served[..1], (number, hash), root, 3).unwrap_err();
    assert_eq!(error, WitnessError::WrongKeys { proved: 2, asked: 1 });

    let mut tampered = honest.clone();
    tampered.bag.nodes.push(vec![0xc0]);
    let error = check_witness(tampered, &served, (number, hash), root, 3).unwrap_err();
    assert!(matches!(error, WitnessError::DoesNotVerify { .. }), "{error}");

    let error = check_witness(honest, &served, (number, hash), B256::repeat_byte(7), 3).unwrap_err();
    assert!(matches!(error, WitnessError::DoesNotVerify { .. }), "{error}");
    assert!(error.is_bad_witness());
}

/// How the test's peers answer one outstanding call or fire one timer.
#[derive(Clone, Copy, Debug)]
enum Turn {
    Honest,
    /// No answer within the deadline.
    Late,
    /// A refusal, or for a witness a tampered bag, or for a submission every transfer left
    /// out with `block_refused`.
    Refuse,
}

fn turn() -> impl Strategy<Value = (usize, Turn)> {
    (any::<usize>(), prop_oneof![3 => Just(Turn::Honest), 1 => Just(Turn::Late), 1 => Just(Turn::Refuse)])
}

/// The test's miner and storage nodes: answers one of the core's outstanding calls (or
/// fires a timer) as `turn` says, checking what the core sends.
struct Peers {
    outstanding: Vec<Sent>,
    /// Transfers the miner has included: never submitted again.
    included: HashSet<B256>,
    /// First transfers of the senders that have a second one.
    followed: HashSet<B256>,
}

impl Peers {
    fn play(&mut self, world: &mut World, pick: usize, turn: Turn) -> Result<(), TestCaseError> {
        let sent = self.outstanding.remove(pick % self.outstanding.len());
        let more = match sent {
            Sent::Timer(timer, _) => world.step(Event::Timer(timer)),
            Sent::Head(call) => match turn {
                Turn::Honest => world.respond(call, Ok(world.head_reply())),
                Turn::Late => world.respond(call, Err(deadline_exceeded(MINER))),
                Turn::Refuse => {
                    world.respond(call, Err(NetError::Unreachable { peer: MINER.into(), reason: "".into() }))
                }
            },
            Sent::Witness { call, peer, request } => match turn {
                Turn::Honest => {
                    let reply = world.witness_reply(&peer, &request);
                    world.respond(call, Ok(reply))
                }
                Turn::Late => world.respond(call, Err(deadline_exceeded(&peer))),
                Turn::Refuse => {
                    let mut lie = world.nodes[&peer].witness(&request).unwrap();
                    lie.bag.nodes.push(vec![0xc0]);
                    world.respond(call, Ok(Response::Witness(lie)))
                }
            },
            Sent::Submit(call, submission) => {
                let hashes = decoded(&submission);
                match turn {
                    Turn::Honest => {
                        for hash in &hashes {
                            prop_assert!(self.included.insert(*hash), "{hash} submitted after its inclusion");
                        }
                        world.respond(call, Ok(submitted(vec![(true, ""); hashes.len()])))
                    }
                    Turn::Late => world.respond(call, Err(deadline_exceeded(MINER))),
                    Turn::Refuse => world.respond(call, Ok(submitted(vec![(false, "block_refused"); hashes.len()]))),
                }
            }
        };
        self.outstanding.extend(more);
        self.check(world)
    }

    fn check(&self, world: &World) -> Result<(), TestCaseError> {
        let core = &world.core;
        prop_assert!(core.batches_in_flight() <= core.config().in_flight);
        let heads_and_timers = self.outstanding.iter().filter(|sent| matches!(sent, Sent::Head(_) | Sent::Timer(..)));
        let submissions: Vec<&Submission> = self
            .outstanding
            .iter()
            .filter_map(|sent| if let Sent::Submit(_, submission) = sent { Some(submission) } else { None })
            .collect();
        prop_assert!(heads_and_timers.count() + submissions.len() <= core.config().in_flight);
        let mut senders = HashSet::new();
        for submission in submissions {
            for bytes in &submission.transactions {
                let tx = SignedTx::decode(bytes).unwrap();
                prop_assert!(senders.insert(tx.recover_sender().unwrap()), "a sender has two transfers in flight");
                prop_assert_eq!(tx.nonce(), 0, "a second transfer was submitted");
            }
        }
        // A second transfer is filtered only once its sender's first has committed.
        let filtered: u64 = core.stats().filtered.values().sum();
        let ready = self.followed.intersection(&self.included).count() as u64;
        prop_assert!(filtered <= ready, "a second transfer went before its sender's first committed");
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever the peers do for a while (late, refusing, lying, leaving transfers out),
    /// the client keeps its bounds, and once they are honest every first transfer commits
    /// exactly once and every second one, which can only fail at the genesis state the
    /// witnesses show, is filtered after its sender's first committed.
    #[test]
    fn the_client_keeps_its_bounds_and_commits_everything_whatever_the_peers_do(
        turns in prop::collection::vec(turn(), 0..150),
        batch in 1usize..5,
        in_flight in 1usize..4,
        senders in 1usize..10,
        seconds in 0usize..4,
    ) {
        let mut world = world(batch, in_flight, 2);
        let mut transfers: Vec<UserTransfer> = (0..senders).map(|i| world.transfer(i, (i + 5) % ACCOUNTS, 0)).collect();
        let followed = transfers[..seconds.min(senders)].iter().map(|t| t.tx.hash()).collect();
        transfers.extend((0..seconds.min(senders)).map(|i| world.transfer(i, (i + 6) % ACCOUNTS, 1)));
        let mut peers = Peers { outstanding: world.input(transfers), included: HashSet::new(), followed };
        for (pick, turn) in turns {
            if peers.outstanding.is_empty() {
                break;
            }
            peers.play(&mut world, pick, turn)?;
        }
        let mut steps = 0;
        while !peers.outstanding.is_empty() {
            peers.play(&mut world, 0, Turn::Honest)?;
            steps += 1;
            prop_assert!(steps < 10_000, "the client does not settle");
        }
        prop_assert!(world.core.is_idle());
        let stats = world.core.stats();
        prop_assert_eq!(peers.included.len(), senders);
        prop_assert_eq!(stats.committed as usize, senders);
        let filtered = stats.filtered.get("nonce_mismatch").copied().unwrap_or(0);
        prop_assert_eq!(filtered as usize, seconds.min(senders), "{:?}", stats);
    }
}
