//! Contracts on a chain on disk: deployed and called through blocks (their storage depending
//! on `BLOCKHASH`), kept across reopening and rebuilding, audited, and a tampered contract
//! store named by the audit and rebuilt by the next open.

use alloy_consensus::{TxEip1559, TxLegacy};
use alloy_primitives::{keccak256, Address, Bytes, TxKind, B256, U256};
use virga_evm::contracts::{kitties, token, KITTIES, TOKEN};
use virga_ledger::builder::build_block;
use virga_ledger::chain::{audit, genesis_json, Chain, ChainError, ChainOptions};
use virga_ledger::contract_store::ContractProblem;
use virga_ledger::exec::RecentHashes;
use virga_ledger::store::{ChainStore, StoreOptions};
use virga_ledger::tx::{RecoveredTx, SignedTx, SigningKey};
use virga_ledger::verify::ExecMode;
use virga_trie::durable::{DurableOptions, DurableTrie};

const CHAIN_ID: u64 = 1337;

fn pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("two threads")
}

fn keys() -> Vec<SigningKey> {
    (0..3).map(SigningKey::from_seed).collect()
}

fn new_chain(dir: &std::path::Path, keys: &[SigningKey]) -> Chain {
    let addresses: Vec<Address> = keys.iter().map(SigningKey::address).collect();
    let genesis =
        genesis_json(CHAIN_ID, U256::from(16u64), 30_000_000, &addresses, U256::from(10u64).pow(U256::from(20u64)));
    Chain::create(dir, &genesis, ChainOptions::default(), &pool()).expect("a fresh chain").0
}

fn deploy(key: &SigningKey, nonce: u64, init: Bytes) -> RecoveredTx {
    let tx = TxLegacy {
        chain_id: Some(CHAIN_ID),
        nonce,
        gas_price: 1_000_000_000,
        gas_limit: 3_000_000,
        to: TxKind::Create,
        value: U256::ZERO,
        input: init,
    };
    RecoveredTx { tx: SignedTx::sign_legacy(key, tx), sender: key.address() }
}

fn call(key: &SigningKey, nonce: u64, to: Address, input: Bytes) -> RecoveredTx {
    let tx = TxEip1559 {
        chain_id: CHAIN_ID,
        nonce,
        gas_limit: 200_000,
        max_fee_per_gas: 2_000_000_000,
        max_priority_fee_per_gas: 1,
        to: TxKind::Call(to),
        value: U256::ZERO,
        access_list: Default::default(),
        input,
    };
    RecoveredTx { tx: SignedTx::sign_eip1559(key, tx), sender: key.address() }
}

struct Deployed {
    kitties: Address,
    token: Address,
}

/// Block 1 deploys the two contracts; block 2 calls them: two births (storage written from
/// the parent's hash) and a token transfer from an empty balance, which reverts.
fn deploy_and_call(chain: &mut Chain, keys: &[SigningKey]) -> Deployed {
    let threads = pool();
    let owner = keys[0].address();
    let deployed = Deployed { kitties: owner.create(0), token: owner.create(1) };
    let candidates = vec![deploy(&keys[0], 0, KITTIES.init_code()), deploy(&keys[0], 1, TOKEN.init_code())];
    let built = chain.build_next(candidates, Address::repeat_byte(0xbe), 1, &threads).expect("builds");
    assert_eq!(built.block.transactions.len(), 2, "{:?}", built.refused);
    assert!(built.outcome.receipts().iter().all(|receipt| receipt.success));
    let state = chain.head_state();
    for (address, code) in [(deployed.kitties, KITTIES.runtime_code()), (deployed.token, TOKEN.runtime_code())] {
        let account = state.account(&address).expect("decodes").expect("deployed");
        assert_eq!(state.code(&account.code_hash), Some(code.as_ref()));
    }

    let candidates = vec![
        call(&keys[1], 0, deployed.kitties, kitties::give_birth(U256::from(1))),
        call(&keys[2], 0, deployed.kitties, kitties::give_birth(U256::from(2))),
        call(&keys[1], 1, deployed.token, token::transfer(keys[2].address(), U256::from(5))),
    ];
    let built = chain.build_next(candidates, Address::repeat_byte(0xbe), 2, &threads).expect("builds");
    let statuses: Vec<bool> = built.outcome.receipts().iter().map(|receipt| receipt.success).collect();
    assert_eq!(statuses, [true, true, false], "the transfer from an empty balance reverts, and is included");
    assert_eq!(built.outcome.receipts()[0].logs.len(), 1, "a Birth event");
    assert_ne!(built.block.header.logs_bloom, alloy_primitives::Bloom::ZERO);
    deployed
}

fn genes(chain: &Chain, deployed: &Deployed, kitty: u64) -> U256 {
    chain.head_state().storage(&deployed.kitties, &B256::from(kitties::genes_slot(U256::from(kitty))))
}

#[test]
fn contracts_run_through_blocks_and_survive_reopening_rebuilding_and_the_audit() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys();
    let mut chain = new_chain(dir.path(), &keys);
    let deployed = deploy_and_call(&mut chain, &keys);
    let (first, second) = (genes(&chain, &deployed, 1), genes(&chain, &deployed, 2));
    // Both births mix the same block number and parent hash into empty genes.
    assert!(!first.is_zero());
    assert_eq!(first, second);
    let root = chain.head().state_root;
    chain.sync().unwrap();
    drop(chain);

    let (chain, report) = Chain::open(dir.path(), ChainOptions::default(), &pool()).expect("reopens");
    assert_eq!((report.replayed, report.state_rebuilt.as_deref()), (0, None));
    assert_eq!((genes(&chain, &deployed, 1), genes(&chain, &deployed, 2)), (first, second));
    assert_eq!(chain.head_state().clone().root(), root);
    drop(chain);
    for mode in [ExecMode::Parallel, ExecMode::Serial] {
        let summary = audit(dir.path(), mode, &pool(), &mut |_| {}).expect("sound");
        assert_eq!((summary.blocks, summary.transactions, summary.reverted_transactions), (3, 5, 1));
    }

    // Without its contract store the chain rebuilds both stores from the blocks.
    std::fs::remove_dir_all(dir.path().join("contracts")).unwrap();
    let (chain, report) = Chain::open(dir.path(), ChainOptions::default(), &pool()).expect("reopens");
    assert!(report.state_rebuilt.is_some(), "{report:?}");
    assert_eq!(report.replayed, 2);
    assert_eq!(genes(&chain, &deployed, 2), second);
}

/// Appends an empty block (it changes no account, so the account store's root stays right)
/// to the chain in `dir` behind the chain's back, with `tampered` written into the contract
/// store as that block's update: the stores stay in step, and only the contract store lies.
fn append_with_tampered_contracts(dir: &std::path::Path, tampered: Vec<(Vec<u8>, Option<Vec<u8>>)>) {
    let threads = pool();
    let (chain, _) = Chain::open(dir, ChainOptions::default(), &threads).expect("opens");
    let (config, head) = (*chain.config(), chain.head().clone());
    let mut state = chain.head_state().clone();
    drop(chain);
    let hashes = RecentHashes::default();
    let timestamp = head.timestamp + 1;
    let built = build_block(&config, &head, &mut state, &hashes, Vec::new(), Address::ZERO, timestamp, &threads)
        .expect("an empty block builds");
    assert_eq!(built.block.header.state_root, head.state_root);
    let (mut store, _) = ChainStore::open(dir.join("blocks"), StoreOptions::default()).expect("opens");
    store.append(built.block.header.number, built.block.hash(), &built.block.encode()).expect("appends");
    store.sync().expect("syncs");
    let (mut contracts, _) = DurableTrie::open(dir.join("contracts"), DurableOptions::default()).expect("opens");
    contracts.commit(&tampered).expect("commits");
    contracts.sync().expect("syncs");
    let (mut accounts, _) = DurableTrie::open(dir.join("state"), DurableOptions::default()).expect("opens");
    accounts.commit(&[]).expect("commits");
    accounts.sync().expect("syncs");
}

#[test]
fn a_tampered_contract_store_is_named_by_the_audit_and_rebuilt_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys();
    let mut chain = new_chain(dir.path(), &keys);
    let deployed = deploy_and_call(&mut chain, &keys);
    let genes_before = genes(&chain, &deployed, 1);
    chain.sync().unwrap();
    drop(chain);
    audit(dir.path(), ExecMode::Serial, &pool(), &mut |_| {}).expect("sound before tampering");

    // A changed storage slot: the account's storage root no longer matches.
    let slot = keccak256(B256::from(kitties::genes_slot(U256::from(1))));
    let key = [deployed.kitties.as_slice(), slot.as_slice()].concat();
    append_with_tampered_contracts(dir.path(), vec![(key, Some(alloy_rlp::encode(U256::from(666))))]);
    let error = audit(dir.path(), ExecMode::Parallel, &pool(), &mut |_| {}).expect_err("tampered storage");
    assert!(
        matches!(&error, ChainError::Contracts { number: 3, problem: ContractProblem::StorageRoot { address, .. } } if *address == deployed.kitties),
        "{error}"
    );
    assert!(error.to_string().contains(&deployed.kitties.to_string()), "{error}");
    let (chain, report) = Chain::open(dir.path(), ChainOptions::default(), &pool()).expect("reopens");
    assert!(report.state_rebuilt.as_deref().is_some_and(|why| why.contains("contract store")), "{report:?}");
    assert_eq!(genes(&chain, &deployed, 1), genes_before, "rebuilt from the blocks");
    drop(chain);
    audit(dir.path(), ExecMode::Serial, &pool(), &mut |_| {}).expect("sound after the rebuild");

    // Changed code: its hash no longer matches.
    let code_hash = keccak256(TOKEN.runtime_code());
    append_with_tampered_contracts(dir.path(), vec![(code_hash.to_vec(), Some(vec![0x00]))]);
    let error = audit(dir.path(), ExecMode::Serial, &pool(), &mut |_| {}).expect_err("tampered code");
    assert!(
        matches!(&error, ChainError::Contracts { problem: ContractProblem::CodeHash { hash, .. }, .. } if *hash == code_hash),
        "{error}"
    );
    assert!(error.to_string().contains("the code was changed"), "{error}");

    drop(Chain::open(dir.path(), ChainOptions::default(), &pool()).expect("reopens"));
    audit(dir.path(), ExecMode::Serial, &pool(), &mut |_| {}).expect("sound after the rebuild");
}
