//! A contract call through RainBlock's roles, driven by hand: the client's bag carries the
//! token's account, its slots (from the storage node serving the token's shard) and its
//! code; the miner executes against its top layer and the bag, and sends the slot changes to
//! that storage node, whose witnesses then show them. A call whose bag lacks the slots is
//! left out as `missing_witness`.

use crate::messages::{
    BlockId, HeadReply, Request, Response, SlotKeys, Submission, SubmissionReply, TxOutcome, WitnessRequest,
};
use alloy_consensus::TxEip1559;
use alloy_primitives::{keccak256, Address, TxKind, B256, U256};
use virga_evm::contracts::{token, TOKEN};
use virga_ledger::tx::SignedTx;
use virga_net::role::{CallId, Command, Event, Role};
use virga_trie::proof::NodeBag;

use crate::client::{check_contract_witness, check_witness, ClientCore, UserTransfer};
use crate::core_tests::{answer_calls, calls, outcomes, replies, submit, Net};
use crate::miner::MinerIoDone;
use crate::testkit::Fixture;
use crate::topology::Topology;
use crate::workload::GAS_PRICE;

const TOKEN_AT: Address = Address::repeat_byte(0x7e);

fn token_net() -> Net {
    token_net_with_holders(0)
}

/// The token net with a miner that keeps levels 0..=`retention` and prunes to them after
/// every block (a memory budget of zero).
fn token_net_pruned_to(retention: usize) -> Net {
    crate::core_tests::warm_net_on(token_fixture(retention, 0), 0)
}

/// The token with account 0 holding 1,000, and `others` more holders (not accounts of the
/// fixture) with 1 each: their balances make the token's storage trie several levels deep.
fn token_net_with_holders(others: usize) -> Net {
    crate::core_tests::warm_net_on(token_fixture(2, others), 1 << 20)
}

/// 200 accounts on 2 storage nodes, the miner keeping levels 0..=`retention`, and the token
/// deployed with account 0 holding 1,000 and `others` more holders holding 1 each.
fn token_fixture(retention: usize, others: usize) -> Fixture {
    let topology =
        Topology { accounts: 200, storage_nodes: 2, max_block_transfers: 64, retention, ..Topology::small() };
    let mut fixture = Fixture::new(topology).unwrap();
    let holder = fixture.accounts.addresses[0];
    let mut slots = vec![(B256::from(token::balance_slot(holder)), U256::from(1_000))];
    for index in 0..others {
        let other = Address::from_slice(&keccak256(format!("holder {index}"))[12..]);
        slots.push((B256::from(token::balance_slot(other)), U256::from(1)));
    }
    fixture.deploy(TOKEN_AT, &TOKEN.runtime_code(), &slots).unwrap();
    fixture
}

fn transfer_call(net: &Net, amount: u64) -> SignedTx {
    transfer_call_at(net, 0, amount)
}

/// Account 0's transfer of `amount` tokens to account 1, with nonce `nonce`.
fn transfer_call_at(net: &Net, nonce: u64, amount: u64) -> SignedTx {
    let accounts = &net.fixture.accounts;
    let tx = TxEip1559 {
        chain_id: net.fixture.config.exec.chain_id,
        nonce,
        gas_limit: 100_000,
        max_fee_per_gas: GAS_PRICE,
        max_priority_fee_per_gas: 0,
        to: TxKind::Call(TOKEN_AT),
        value: U256::ZERO,
        access_list: Default::default(),
        input: token::transfer(accounts.addresses[1], U256::from(amount)),
    };
    SignedTx::sign_eip1559(&accounts.keys[0], tx)
}

/// The token's balance slots of accounts 0 and 1.
fn slot_keys(net: &Net) -> Vec<B256> {
    slot_keys_of(&net.fixture)
}

fn slot_keys_of(fixture: &Fixture) -> Vec<B256> {
    let addresses = &fixture.accounts.addresses;
    [addresses[0], addresses[1]].iter().map(|a| keccak256(B256::from(token::balance_slot(*a)))).collect()
}

/// The witnesses of the sender's, the recipient's and the token's accounts, and (if
/// `with_slots`) of the two balance slots and the token's code, each from the node serving it.
fn submission(net: &mut Net, tx: &SignedTx, with_slots: bool) -> Submission {
    let (number, hash, root) = net.miner.head();
    let addresses = &net.fixture.accounts.addresses;
    let accounts = [addresses[0], addresses[1], TOKEN_AT].map(keccak256);
    let token_key = keccak256(TOKEN_AT);
    let code_hash = keccak256(TOKEN.runtime_code());
    let slots = slot_keys(net);
    let (mut bags, mut storage, mut codes) = (Vec::new(), Vec::new(), Vec::new());
    for (_, node) in &mut net.nodes {
        let served = |key: &B256| node.served().contains(&(key[0] as usize >> 4));
        let keys: Vec<B256> = accounts.iter().filter(|key| served(key)).copied().collect();
        let contract = with_slots && served(&token_key);
        let request = WitnessRequest {
            keys,
            compaction: 0,
            at: Some(BlockId::new(number, hash)),
            slots: if contract { vec![SlotKeys { account: token_key, slots: slots.clone() }] } else { Vec::new() },
            code_hashes: if contract { vec![code_hash] } else { Vec::new() },
        };
        let reply = node.witness(&request).unwrap();
        bags.push(reply.bag);
        storage.extend(reply.storage);
        codes.extend(reply.codes);
    }
    Submission {
        transactions: vec![tx.encode()],
        bag: NodeBag::merge(bags),
        witness_at: BlockId::new(number, hash),
        witness_root: root,
        storage,
        codes,
    }
}

/// Accounts 0's and 1's token balances at the miner's head, from a witness of the storage
/// node serving the token, checked through the state root as a client checks it.
fn token_balances(net: &mut Net) -> Vec<U256> {
    let (number, hash, root) = net.miner.head();
    let token_key = keccak256(TOKEN_AT);
    let slots = slot_keys(net);
    let (_, node) =
        net.nodes.iter_mut().find(|(_, node)| node.served().contains(&(token_key[0] as usize >> 4))).unwrap();
    assert_eq!(node.head().2, root, "the storage node took the block");
    let asked = [SlotKeys { account: token_key, slots }];
    let request = WitnessRequest {
        keys: vec![token_key],
        compaction: 0,
        at: Some(BlockId::new(number, hash)),
        slots: asked.to_vec(),
        code_hashes: Vec::new(),
    };
    let reply = node.witness(&request).unwrap();
    let storage = reply.storage.clone();
    let (_, _, values) = check_witness(reply, &[token_key], (number, hash), root, 0).unwrap();
    let account = virga_trie::account::Account::decode_rlp(values[0].1 .0.as_ref().unwrap()).unwrap();
    let checked = check_contract_witness(storage, Vec::new(), &asked, &[], |_| Some(account.storage_root)).unwrap();
    checked.slots.iter().map(|(_, _, value)| *value).collect()
}

/// Commits the block a submission led to and returns its outcomes.
fn commit(net: &mut Net, submission: Submission) -> Vec<TxOutcome> {
    let out = submit(&mut net.miner, 9, submission);
    assert_eq!(calls(&out).len(), 2, "the block goes to both storage nodes: {out:?}");
    let rest = answer_calls(&mut net.miner, &mut net.nodes, out);
    let Some(Command::Io { io, .. }) = rest.first() else { panic!("the block is stored: {rest:?}") };
    let mut out = Vec::new();
    net.miner.step(3_000_000_000, Event::IoDone { io: *io, result: MinerIoDone::Stored(Ok(())) }, &mut out);
    let answered = replies(&out);
    assert_eq!(answered[0].0, CallId(9));
    outcomes(&answered[0].1)
}

#[test]
fn a_token_transfer_commits_through_the_miner_and_its_storage_node_serves_the_new_balances() {
    let mut net = token_net();
    let tx = transfer_call(&net, 300);
    let submission = submission(&mut net, &tx, true);
    assert!(!submission.storage.is_empty() && submission.codes.len() == 1);
    let outcomes = commit(&mut net, submission);
    assert!(outcomes[0].included && outcomes[0].succeeded, "{outcomes:?}");
    assert_eq!(net.miner.head().0, 1);

    // The storage node serving the token holds its new storage, proved through the root.
    let balances = token_balances(&mut net);
    assert_eq!(balances, vec![U256::from(700), U256::from(300)]);
}

#[test]
fn a_call_whose_bag_lacks_its_slots_is_left_out_as_missing_witness() {
    let mut net = token_net();
    let tx = transfer_call(&net, 300);
    let submission = submission(&mut net, &tx, false);
    let outcomes = commit(&mut net, submission);
    assert!(!outcomes[0].included);
    assert_eq!(outcomes[0].reason, "missing_witness");
}

/// The token's storage root at the miner's head, from its account's witness.
fn token_storage_root(net: &mut Net) -> B256 {
    let (number, hash, root) = net.miner.head();
    let token_key = keccak256(TOKEN_AT);
    let (_, node) =
        net.nodes.iter_mut().find(|(_, node)| node.served().contains(&(token_key[0] as usize >> 4))).unwrap();
    let request = WitnessRequest { keys: vec![token_key], at: Some(BlockId::new(number, hash)), ..Default::default() };
    let (_, _, values) = check_witness(node.witness(&request).unwrap(), &[token_key], (number, hash), root, 0).unwrap();
    virga_trie::account::Account::decode_rlp(values[0].1 .0.as_ref().unwrap()).unwrap().storage_root
}

/// The submission's slot bags compacted at `level` against the token's storage root; returns
/// their node bytes before and after.
fn compact_slot_bags(net: &mut Net, submission: &mut Submission, level: usize) -> (usize, usize) {
    let root = token_storage_root(net);
    let (mut full, mut compact) = (0, 0);
    for entry in &mut submission.storage {
        let bag = std::mem::take(&mut entry.bag);
        let compacted = bag.compact(root, level).unwrap();
        full += bag.node_bytes();
        compact += compacted.node_bytes();
        entry.bag = compacted;
    }
    (full, compact)
}

#[test]
fn slot_witnesses_compacted_down_to_the_level_below_the_miners_storage_top_commit() {
    let mut net = token_net_with_holders(3_000);
    let retention = net.fixture.topology.retention;
    let tx = transfer_call(&net, 300);
    let mut first = submission(&mut net, &tx, true);
    let (full, compact) = compact_slot_bags(&mut net, &mut first, retention + 1);
    assert!(compact * 2 < full, "compacting at r+1 leaves out most of a deep trie: {compact} of {full} bytes");
    let outcomes = commit(&mut net, first);
    assert!(outcomes[0].included && outcomes[0].succeeded, "{outcomes:?}");
    assert_eq!(token_balances(&mut net), vec![U256::from(700), U256::from(300)]);

    // After the block, the miner's storage top follows its own writes: the next call's bag,
    // compacted against the new storage root, attaches too.
    let tx = transfer_call_at(&net, 1, 200);
    let mut second = submission(&mut net, &tx, true);
    compact_slot_bags(&mut net, &mut second, retention + 1);
    let outcomes = commit(&mut net, second);
    assert!(outcomes[0].included && outcomes[0].succeeded, "{outcomes:?}");
    assert_eq!(token_balances(&mut net), vec![U256::from(500), U256::from(500)]);
}

#[test]
fn slot_witnesses_compacted_deeper_than_the_miner_holds_are_left_out_as_missing_witness() {
    let mut net = token_net_with_holders(3_000);
    let retention = net.fixture.topology.retention;
    let tx = transfer_call(&net, 300);
    let mut deep = submission(&mut net, &tx, true);
    // Level r+1 is the deepest the miner's held levels 0..=r reach; r+2 leaves out a level
    // it only knows by hash.
    compact_slot_bags(&mut net, &mut deep, retention + 2);
    let outcomes = commit(&mut net, deep);
    assert!(!outcomes[0].included);
    assert_eq!(outcomes[0].reason, "missing_witness");
}

#[test]
fn a_miner_pruning_after_every_block_keeps_the_contract_whose_storage_the_block_wrote() {
    use virga_evm::StateSource;
    let mut net = token_net_pruned_to(1);
    let tx = transfer_call(&net, 300);
    let first = submission(&mut net, &tx, true);
    let outcomes = commit(&mut net, first);
    assert!(outcomes[0].included && outcomes[0].succeeded, "{outcomes:?}");
    let (_, top) = net.miner.tip();
    // The sender's account, written by the block too, went below r with everything else...
    let sender = net.fixture.accounts.addresses[0];
    assert!(StateSource::account(top, &sender).is_err(), "the layer was pruned to r after the block");
    // ...but the token, whose storage root the block changed, stays: every client's witness
    // of it is a block behind from now on.
    assert!(matches!(StateSource::account(top, &TOKEN_AT), Ok(Some(_))), "the token's account is held");
}

/// Carries out a client core's calls against the net (the miner's head, the storage nodes'
/// witnesses, the miner committing each submission) until it makes no more.
fn drive_client(net: &mut Net, client: &mut ClientCore, transfers: Vec<UserTransfer>) {
    let now = 5_000_000_000;
    let mut commands = Vec::new();
    client.step(now, Event::Input(transfers), &mut commands);
    // A client retries what the miner left out: bound the exchanges so that a call that
    // can never commit fails the test instead of looping.
    let mut exchanges = 0;
    while !commands.is_empty() {
        exchanges += 1;
        assert!(exchanges < 100, "the client is still asking after 100 exchanges: {:?}", client.stats());
        let mut next = Vec::new();
        for command in commands {
            let Command::Call { to, call, request, .. } = command else { continue };
            let answer = match request {
                Request::Head => {
                    let (number, hash, root) = net.miner.head();
                    let head = HeadReply { head: BlockId::new(number, hash), state_root: root };
                    Response::Head(head)
                }
                Request::Witness(asked) => {
                    let (_, node) = net.nodes.iter_mut().find(|(id, _)| *id == to).unwrap();
                    Response::Witness(node.witness(&asked).unwrap())
                }
                Request::Submit(submission) => {
                    let outcomes = commit(net, submission);
                    let (number, hash, _) = net.miner.head();
                    let reply = SubmissionReply { block: Some(BlockId::new(number, hash)), outcomes };
                    Response::Submitted(reply)
                }
                other => panic!("a client asked {other:?}"),
            };
            client.step(now, Event::Response { call, result: Ok(answer) }, &mut next);
        }
        commands = next;
    }
}

fn user_transfer(net: &Net, nonce: u64, amount: u64) -> UserTransfer {
    UserTransfer { tx: transfer_call_at(net, nonce, amount), sender: net.fixture.accounts.addresses[0] }
}

#[test]
fn a_prefetching_client_pre_executes_token_transfers_fetches_their_slots_and_code_and_commits_them() {
    // A storage trie several levels deep: the client's slot bags are compacted at c.
    let mut net = token_net_with_holders(3_000);
    let mut client = ClientCore::new(net.fixture.client_config(0));
    let first = user_transfer(&net, 0, 300);
    drive_client(&mut net, &mut client, vec![first]);
    let stats = client.stats();
    assert_eq!((stats.calls_submitted, stats.calls_committed, stats.committed_ok), (1, 1, 1), "{stats:?}");
    // First contact with the token: its code, then the slots the run reached.
    assert_eq!(stats.extra_rounds, 2, "{stats:?}");

    // The code is known from now on: one round for the slots only.
    let second = user_transfer(&net, 1, 200);
    drive_client(&mut net, &mut client, vec![second]);
    let stats = client.stats();
    assert_eq!((stats.calls_submitted, stats.calls_committed, stats.committed_ok), (2, 2, 2), "{stats:?}");
    assert_eq!(stats.extra_rounds, 3, "{stats:?}");
    assert!(stats.filtered.is_empty() && stats.retried.is_empty(), "{stats:?}");

    assert_eq!(net.miner.head().0, 2);
    let balances = token_balances(&mut net);
    assert_eq!(balances, vec![U256::from(500), U256::from(500)]);
}
