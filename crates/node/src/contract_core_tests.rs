//! A contract call through RainBlock's roles, driven by hand: the client's bag carries the
//! token's account, its slots (from the storage node serving the token's shard) and its
//! code; the miner executes against its top layer and the bag, and sends the slot changes to
//! that storage node, whose witnesses then show them. A call whose bag lacks the slots is
//! left out as `missing_witness`.

use alloy_consensus::TxEip1559;
use alloy_primitives::{keccak256, Address, TxKind, B256, U256};
use virga_evm::contracts::{token, TOKEN};
use virga_ledger::tx::SignedTx;
use virga_net::proto::{self, Submission};
use virga_net::role::{CallId, Command, Event, Role};
use virga_trie::proof::NodeBag;

use crate::client::{check_contract_witness, check_witness};
use crate::codec::{bag_from_wire, bag_to_wire, block_id};
use crate::core_tests::{answer_calls, calls, outcomes, replies, submit, Net};
use crate::miner::MinerIoDone;
use crate::testkit::Fixture;
use crate::topology::Topology;
use crate::workload::GAS_PRICE;

const TOKEN_AT: Address = Address::repeat_byte(0x7e);

fn token_net() -> Net {
    let topology =
        Topology { accounts: 200, storage_nodes: 2, max_block_transfers: 64, retention: 2, ..Topology::small() };
    let mut fixture = Fixture::new(topology).unwrap();
    let holder = fixture.accounts.addresses[0];
    fixture
        .deploy(TOKEN_AT, &TOKEN.runtime_code(), &[(B256::from(token::balance_slot(holder)), U256::from(1_000))])
        .unwrap();
    crate::core_tests::warm_net_on(fixture, 1 << 20)
}

fn transfer_call(net: &Net, amount: u64) -> SignedTx {
    let accounts = &net.fixture.accounts;
    let tx = TxEip1559 {
        chain_id: net.fixture.config.exec.chain_id,
        nonce: 0,
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
fn slot_keys(net: &Net) -> Vec<Vec<u8>> {
    let addresses = &net.fixture.accounts.addresses;
    [addresses[0], addresses[1]].iter().map(|a| keccak256(B256::from(token::balance_slot(*a))).to_vec()).collect()
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
        let keys: Vec<Vec<u8>> = accounts.iter().filter(|key| served(key)).map(|key| key.to_vec()).collect();
        let contract = with_slots && served(&token_key);
        let request = proto::WitnessRequest {
            keys,
            compaction: 0,
            at: Some(block_id(number, hash)),
            slots: if contract {
                vec![proto::SlotKeys { account: token_key.to_vec(), slots: slots.clone() }]
            } else {
                Vec::new()
            },
            code_hashes: if contract { vec![code_hash.to_vec()] } else { Vec::new() },
        };
        let reply = node.witness(&request).unwrap();
        bags.push(bag_from_wire(reply.bag));
        storage.extend(reply.storage);
        codes.extend(reply.codes);
    }
    Submission {
        transactions: vec![tx.encode()],
        bag: Some(bag_to_wire(&NodeBag::merge(bags))),
        witness_at: Some(block_id(number, hash)),
        witness_root: root.to_vec(),
        storage,
        codes,
    }
}

/// Commits the block a submission led to and returns its outcomes.
fn commit(net: &mut Net, submission: Submission) -> Vec<proto::TxOutcome> {
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
    let (number, hash, root) = net.miner.head();
    assert_eq!(number, 1);

    // The storage node serving the token holds its new storage, proved through the root.
    let token_key = keccak256(TOKEN_AT);
    let slots = slot_keys(&net);
    let (_, node) =
        net.nodes.iter_mut().find(|(_, node)| node.served().contains(&(token_key[0] as usize >> 4))).unwrap();
    assert_eq!(node.head().2, root, "the storage node took the block");
    let asked = [proto::SlotKeys { account: token_key.to_vec(), slots }];
    let request = proto::WitnessRequest {
        keys: vec![token_key.to_vec()],
        compaction: 0,
        at: Some(block_id(number, hash)),
        slots: asked.to_vec(),
        code_hashes: Vec::new(),
    };
    let reply = node.witness(&request).unwrap();
    let storage = reply.storage.clone();
    let (_, _, values) = check_witness(reply, &[token_key], (number, hash), root, 0).unwrap();
    let account = virga_trie::account::Account::decode_rlp(values[0].1 .0.as_ref().unwrap()).unwrap();
    let checked = check_contract_witness(storage, Vec::new(), &asked, &[], |_| Some(account.storage_root)).unwrap();
    let balances: Vec<U256> = checked.slots.iter().map(|(_, _, value)| *value).collect();
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
