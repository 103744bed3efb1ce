//! Contract storage on storage nodes: blocks change it in step with the accounts, witnesses
//! of slots and code prove through the state root, and every disagreement is refused by name.
//! The oracle is a whole `StateTrie` given the same changes.

use crate::messages::{BlockId, BlockUpdates, KeyUpdate, SlotKeys, SlotUpdate, WitnessReply, WitnessRequest};
use crate::proto;
use alloy_consensus::Header;
use alloy_primitives::{keccak256, Address, B256, U256};
use virga_core::EMPTY_ROOT;
use virga_ledger::exec::next_base_fee;
use virga_ledger::verify::ChainConfig;
use virga_trie::account::{storage_value_rlp, Account, StateTrie};
use virga_trie::shard::shard_of;

use super::contracts::ContractRefusal;
use super::versions::{BlockRefusal, ReadRefusal, Served, Versions};
use super::{keep_served, prefix_nibbles, shard_genesis, ShardedState};
use crate::checkpoint;
use crate::client::{check_contract_witness, check_witness, WitnessError};

const SHARDS: usize = 16;
const TOKEN: Address = Address::repeat_byte(0x70);
const HOLDER: Address = Address::repeat_byte(0x11);

fn config() -> ChainConfig {
    ChainConfig { difficulty: U256::from(16u64), gas_limit: 10_000_000, ..ChainConfig::default() }
}

fn slot(n: u64) -> B256 {
    B256::from(U256::from(n))
}

fn slot_key(n: u64) -> B256 {
    keccak256(slot(n))
}

fn shard_of_address(address: &Address) -> usize {
    shard_of(keccak256(address).as_slice(), 1).unwrap()
}

/// A chain of the oracle's states, and storage nodes' versions of it.
struct World {
    state: StateTrie,
    header: Header,
    /// The shard holding the token's account, and one that does not.
    token_shard: usize,
    other_shard: usize,
}

impl World {
    fn new() -> World {
        let mut state = StateTrie::new();
        state.set_account(HOLDER, Account::with_balance(0, U256::from(1_000_000u64)));
        // Enough accounts to fill every shard, as a cluster's state does.
        for n in 0..64u64 {
            state.set_account(Address::from_word(keccak256(n.to_be_bytes())), Account::with_balance(0, U256::from(n)));
        }
        let code_hash = state.insert_code(&[0x60, 0x00, 0x60, 0x00, 0xf3]);
        state.set_account(TOKEN, Account { nonce: 1, code_hash, ..Account::default() });
        for n in 0..50 {
            state.set_storage(TOKEN, slot(n), U256::from(n + 1));
        }
        let state_root = state.root();
        let header = Header {
            number: 0,
            difficulty: config().difficulty,
            gas_limit: config().gas_limit,
            state_root,
            base_fee_per_gas: Some(1),
            ..Header::default()
        };
        let token_shard = shard_of_address(&TOKEN);
        let other_shard = (token_shard + 1) % SHARDS;
        World { state, header, token_shard, other_shard }
    }

    fn sharded(&self) -> ShardedState {
        shard_genesis(&self.state, SHARDS).unwrap()
    }

    fn versions(&self, served: &[usize]) -> (Served, Versions) {
        let prefix = prefix_nibbles(SHARDS).unwrap();
        let sharded = self.sharded();
        let accounts = keep_served(&sharded.accounts, served, prefix).unwrap();
        let contracts = sharded.contracts.keep_served(served, prefix);
        let served = Served { shards: served.to_vec(), shard_count: SHARDS, config: config(), retained: 8 };
        (served, Versions::new(self.header.clone(), accounts, contracts))
    }

    /// The next block after the oracle took `change`, with updates of every account in
    /// `accounts` and the given contract updates (for every shard: the node filters none).
    fn block(
        &mut self,
        accounts: &[Address],
        slots: Vec<SlotUpdate>,
        cleared: Vec<B256>,
        codes: Vec<Vec<u8>>,
    ) -> BlockUpdates {
        let state_root = self.state.root();
        let mut header = Header {
            parent_hash: self.header.hash_slow(),
            number: self.header.number + 1,
            timestamp: self.header.timestamp + 1,
            base_fee_per_gas: Some(next_base_fee(&self.header)),
            state_root,
            ..self.header.clone()
        };
        virga_ledger::pow::mine(&mut header, 0);
        let sharded = self.sharded();
        let updates = accounts
            .iter()
            .map(|address| KeyUpdate {
                key: keccak256(address),
                value: self.state.account(address).unwrap().map(|a| a.rlp()).unwrap_or_default(),
            })
            .collect();
        self.header = header.clone();
        BlockUpdates {
            header,
            shard_hashes: sharded.accounts.shards().iter().map(|s| s.subtree_hash()).collect(),
            updates,
            slots,
            cleared,
            codes,
        }
    }

    /// Sets the token's slot `n` in the oracle and returns the update a miner would send.
    fn set_slot(&mut self, n: u64, value: u64) -> SlotUpdate {
        self.state.set_storage(TOKEN, slot(n), U256::from(value));
        let value = if value == 0 { Vec::new() } else { storage_value_rlp(U256::from(value)) };
        SlotUpdate { account: keccak256(TOKEN), slot: slot_key(n), value }
    }

    /// The token's account (unless `slots_only`), slots 3, 4, 100 and 999, and code.
    fn witness(&self, versions: &Versions, served: &[usize], slots_only: bool) -> Result<WitnessReply, ReadRefusal> {
        let request = WitnessRequest {
            keys: if slots_only { Vec::new() } else { vec![keccak256(TOKEN)] },
            compaction: 0,
            at: Some(BlockId::new(self.header.number, self.header.hash_slow())),
            slots: vec![SlotKeys {
                account: keccak256(TOKEN),
                slots: vec![slot_key(3), slot_key(4), slot_key(100), slot_key(999)],
            }],
            code_hashes: vec![self.token().code_hash],
        };
        versions.witness(&request, served, |_, version| version.shards.clone())
    }

    fn token(&self) -> Account {
        self.state.account(&TOKEN).unwrap().unwrap()
    }
}

/// Checks a witness as a client does: the account first, then its slots and code.
fn check(world: &World, reply: WitnessReply) -> Result<Vec<(u64, U256)>, WitnessError> {
    let at = (world.header.number, world.header.hash_slow());
    let keys = [keccak256(TOKEN)];
    let (storage, codes) = (reply.storage.clone(), reply.codes.clone());
    let (_, _, values) = check_witness(reply, &keys, at, world.header.state_root, 0)?;
    let account = values[0].1 .0.as_ref().map(|raw| Account::decode_rlp(raw).unwrap());
    let asked =
        [SlotKeys { account: keccak256(TOKEN), slots: vec![slot_key(3), slot_key(4), slot_key(100), slot_key(999)] }];
    let code_hash = world.token().code_hash;
    let checked = check_contract_witness(storage, codes, &asked, &[code_hash], |key| {
        (*key == keccak256(TOKEN)).then(|| account.map_or(EMPTY_ROOT, |a| a.storage_root))
    })?;
    assert_eq!(checked.codes[0].1, world.state.code(&code_hash).unwrap());
    Ok([3, 4, 100, 999].into_iter().zip(checked.slots.iter().map(|(_, _, value)| *value)).collect())
}

#[test]
fn contract_storage_follows_blocks_and_its_witnesses_prove_through_the_state_root() {
    let mut world = World::new();
    let (served, mut versions) = world.versions(&[world.token_shard]);
    let (other_served, mut other) = world.versions(&[world.other_shard]);
    let reply = world.witness(&versions, &served.shards, false).unwrap();
    assert_eq!(
        check(&world, reply).unwrap(),
        vec![(3, U256::from(4)), (4, U256::from(5)), (100, U256::ZERO), (999, U256::ZERO)]
    );

    let slots = vec![world.set_slot(3, 33), world.set_slot(4, 0), world.set_slot(100, 7)];
    let block = world.block(&[TOKEN], slots, Vec::new(), Vec::new());
    versions.accept(&served, &block).unwrap();
    let mut elsewhere = block.clone();
    elsewhere.slots.clear();
    elsewhere.updates.clear();
    other.accept(&other_served, &elsewhere).unwrap();

    let reply = world.witness(&versions, &served.shards, false).unwrap();
    assert_eq!(
        check(&world, reply).unwrap(),
        vec![(3, U256::from(33)), (4, U256::ZERO), (100, U256::from(7)), (999, U256::ZERO)]
    );
    // The other node proves the account through its hash alone, not the token's slots.
    assert!(matches!(world.witness(&other, &other_served.shards, true), Err(ReadRefusal::ContractNotServed(_))));
}

#[test]
fn a_witness_with_wrong_slots_values_or_code_is_refused_by_the_client() {
    let world = World::new();
    let (served, versions) = world.versions(&[world.token_shard]);
    let good = world.witness(&versions, &served.shards, false).unwrap();

    let mut wrong_code = good.clone();
    wrong_code.codes[0].push(0);
    assert!(matches!(check(&world, wrong_code), Err(WitnessError::WrongCode { .. })));

    let mut fewer_slots = good.clone();
    fewer_slots.storage[0].bag.keys.pop();
    assert!(matches!(check(&world, fewer_slots), Err(WitnessError::WrongSlots { .. })));

    let mut flipped = good.clone();
    let bag = &mut flipped.storage[0].bag;
    let last = bag.nodes.last_mut().unwrap();
    *last.last_mut().unwrap() ^= 1;
    let error = check(&world, flipped).unwrap_err();
    assert!(matches!(error, WitnessError::SlotsDoNotVerify { .. }), "{error}");
    assert!(error.is_bad_witness());

    let mut missing = good;
    missing.storage.clear();
    assert!(matches!(check(&world, missing), Err(WitnessError::SlotWitnessCount { served: 0, asked: 1 })));
}

/// Expects `block` to be refused with a contract refusal `matches` accepts, leaving the
/// versions as they were.
fn refused(served: &Served, versions: &mut Versions, block: &BlockUpdates, matches: fn(&ContractRefusal) -> bool) {
    let head = versions.head();
    match versions.accept(served, block) {
        Err(BlockRefusal::Contract { source, .. }) => assert!(matches(&source), "refused for {source}"),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("accepted a block whose contract storage disagrees"),
    }
    assert_eq!(versions.head(), head);
}

#[test]
fn a_block_whose_contract_storage_disagrees_with_its_accounts_is_refused_by_name() {
    let world = World::new();
    let (served, mut versions) = world.versions(&[world.token_shard]);

    // A slot changed without the account announcing the new storage root.
    let mut w = World::new();
    let slots = vec![w.set_slot(5, 55)];
    let block = w.block(&[], slots, Vec::new(), Vec::new());
    refused(&served, &mut versions, &block, |r| matches!(r, ContractRefusal::StorageRootMismatch { .. }));

    // The account announces a storage root the slots sent do not give.
    let mut w = World::new();
    let mut slots = vec![w.set_slot(5, 55), w.set_slot(6, 66)];
    slots.pop();
    let block = w.block(&[TOKEN], slots, Vec::new(), Vec::new());
    refused(&served, &mut versions, &block, |r| matches!(r, ContractRefusal::StorageRootMismatch { .. }));

    // A zero (or non-canonical) value instead of a deletion.
    let mut w = World::new();
    let mut slots = vec![w.set_slot(5, 0)];
    slots[0].value = vec![0x80];
    let block = w.block(&[TOKEN], slots, Vec::new(), Vec::new());
    refused(&served, &mut versions, &block, |r| matches!(r, ContractRefusal::BadSlotValue { .. }));

    // A contract deployed without its code.
    let mut w = World::new();
    let deployed = Address::repeat_byte(0x71);
    let code_hash = w.state.insert_code(&[0x00]);
    w.state.set_account(deployed, Account { nonce: 1, code_hash, ..Account::default() });
    let deployed_shard = shard_of_address(&deployed);
    let (deployed_served, mut deployed_versions) = world.versions(&[deployed_shard]);
    let block = w.block(&[deployed], Vec::new(), Vec::new(), Vec::new());
    refused(&deployed_served, &mut deployed_versions, &block, |r| matches!(r, ContractRefusal::MissingCode { .. }));
    let mut with_code = block;
    with_code.codes = vec![vec![0x00]];
    deployed_versions.accept(&deployed_served, &with_code).unwrap();

    // Storage of an account in a shard this node does not serve.
    let (other_served, mut other) = world.versions(&[world.other_shard]);
    let mut w = World::new();
    let slots = vec![w.set_slot(5, 55)];
    let block = w.block(&[], slots, Vec::new(), Vec::new());
    refused(&other_served, &mut other, &block, |r| matches!(r, ContractRefusal::NotServed { .. }));

    // Storage left behind by an account the block deletes.
    let mut w = World::new();
    w.state.remove_account(&TOKEN);
    let block = w.block(&[TOKEN], Vec::new(), Vec::new(), Vec::new());
    refused(&served, &mut versions, &block, |r| matches!(r, ContractRefusal::StorageOfAbsentAccount { .. }));
    let mut wiped = block;
    wiped.cleared = vec![keccak256(TOKEN)];
    versions.accept(&served, &wiped).unwrap();
    assert!(versions.by_hash[&versions.head().1].contracts.accounts_with_storage().next().is_none());
}

#[test]
fn a_checkpoint_carries_contract_storage_and_code_and_refuses_a_changed_slot() {
    let mut world = World::new();
    let (served, mut versions) = world.versions(&[world.token_shard]);
    let slots = vec![world.set_slot(7, 70), world.set_slot(8, 0)];
    let block = world.block(&[TOKEN], slots, Vec::new(), Vec::new());
    versions.accept(&served, &block).unwrap();
    let (header, shards, contracts) = versions.ancestor(0).unwrap();
    let bytes = checkpoint::encode(&header, (&shards, &contracts), &served.shards).unwrap();
    let loaded = checkpoint::decode(&bytes, &served.shards, SHARDS).unwrap();
    let token = keccak256(TOKEN);
    assert_eq!(loaded.contracts.storage_root(&token), world.token().storage_root);
    assert_eq!(loaded.contracts.code(&world.token().code_hash), world.state.code(&world.token().code_hash));

    // A changed slot value, behind a right checksum, is named.
    let payload = &bytes[checkpoint::frame(&[]).len()..];
    let mut decoded = <proto::StorageCheckpoint as prost::Message>::decode(payload).unwrap();
    decoded.slots[0].value = storage_value_rlp(U256::from(12345u64));
    let tampered = checkpoint::frame(&prost::Message::encode_to_vec(&decoded));
    let defect = checkpoint::decode(&tampered, &served.shards, SHARDS).unwrap_err();
    assert!(
        matches!(&defect, checkpoint::CheckpointDefect::Contract(r) if matches!(**r, ContractRefusal::StorageRootMismatch { .. })),
        "{defect}"
    );
    // And so is missing code.
    let mut decoded = <proto::StorageCheckpoint as prost::Message>::decode(payload).unwrap();
    decoded.codes.clear();
    let tampered = checkpoint::frame(&prost::Message::encode_to_vec(&decoded));
    let defect = checkpoint::decode(&tampered, &served.shards, SHARDS).unwrap_err();
    assert!(
        matches!(&defect, checkpoint::CheckpointDefect::Contract(r) if matches!(**r, ContractRefusal::MissingCode { .. })),
        "{defect}"
    );
}
