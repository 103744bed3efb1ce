//! A chain on disk: blocks built from the pool verify, reopen with the same head and state,
//! serve the state of retained and older blocks, recover from a lagging or lost state store,
//! and refuse blocks and states that do not match.

use alloy_primitives::{Address, U256};
use virga_ledger::block::Block;
use virga_ledger::chain::{
    audit, genesis_json, read_genesis, stored_blocks, verify_blocks, Chain, ChainError, ChainOptions,
};
use virga_ledger::exec::load_account;
use virga_ledger::pool::TxPool;
use virga_ledger::tx::{SignedTx, SigningKey};
use virga_ledger::verify::{ExecMode, Problem};

const CHAIN_ID: u64 = 1337;

fn pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("two threads")
}

fn keys(count: u64) -> Vec<SigningKey> {
    (0..count).map(SigningKey::from_seed).collect()
}

fn new_chain(dir: &std::path::Path, keys: &[SigningKey], options: ChainOptions) -> Chain {
    let addresses: Vec<Address> = keys.iter().map(SigningKey::address).collect();
    let genesis =
        genesis_json(CHAIN_ID, U256::from(16u64), 30_000_000, &addresses, U256::from(10u64).pow(U256::from(20u64)));
    Chain::create(dir, &genesis, options, &pool()).expect("a fresh chain").0
}

fn transfer(key: &SigningKey, nonce: u64, to: Address, value: u64) -> SignedTx {
    SignedTx::sign(key, nonce, to, U256::from(value), 1_000_000_000, 21_000, Some(CHAIN_ID))
}

/// Builds `blocks` blocks of transfers among `keys`, each sender's nonces in order, through
/// the pool.
fn build(chain: &mut Chain, keys: &[SigningKey], blocks: u64, per_block: u64) {
    let threads = pool();
    for block in 0..blocks {
        let mut txs = TxPool::new(10_000);
        for index in 0..per_block {
            let sender = &keys[(index % keys.len() as u64) as usize];
            let nonce =
                load_account(chain.head_state(), &sender.address()).expect("decodes").nonce + index / keys.len() as u64;
            let to = keys[((index * 7 + block) % keys.len() as u64) as usize].address();
            txs.add(transfer(sender, nonce, to, 1 + index)).expect("admitted");
        }
        let transfers = txs.take(chain.head_state(), usize::MAX).expect("decodes");
        assert_eq!(transfers.len() as u64, per_block);
        chain.build_next(transfers, Address::repeat_byte(0xbe), 1_000 + block, &threads).expect("builds");
    }
}

#[test]
fn built_chains_reopen_with_their_state_and_serve_old_states() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys(12);
    let options = ChainOptions { retain: 3, checkpoint_every: 4, ..ChainOptions::default() };
    let mut chain = new_chain(dir.path(), &keys, options.clone());
    build(&mut chain, &keys, 9, 30);
    let head = chain.head().clone();
    let head_root = head.state_root;
    let state_at_2 = chain.state_at(2, &pool()).expect("replayed from genesis");
    let state_at_8 = chain.state_at(8, &pool()).expect("retained");
    chain.sync().unwrap();
    drop(chain);

    let (mut chain, report) = Chain::open(dir.path(), options, &pool()).expect("reopens");
    assert_eq!(report.blocks, 10);
    assert_eq!(report.replayed, 0, "the state store was at the head");
    assert_eq!(chain.head(), &head);
    assert_eq!(chain.head_state().clone().root(), head_root);
    assert_eq!(chain.state_at(2, &pool()).unwrap().root(), state_at_2.clone().root());
    assert_eq!(chain.state_at(8, &pool()).unwrap().root(), state_at_8.clone().root());
    assert_eq!(state_at_2.clone().root(), chain.block(2).unwrap().header.state_root);
    assert!(matches!(chain.state_at(10, &pool()), Err(ChainError::Missing(10))));

    // Appending continues from the reopened head, and the whole chain audits.
    build(&mut chain, &keys, 2, 12);
    chain.sync().unwrap();
    drop(chain);
    let summary = audit(dir.path(), ExecMode::Parallel, &pool(), &mut |_| {}).expect("sound");
    assert_eq!((summary.blocks, summary.transactions, summary.reverted_transactions), (12, 9 * 30 + 2 * 12, 0));
    assert_eq!(summary.state_store_block, 11);
    let serial = audit(dir.path(), ExecMode::Serial, &pool(), &mut |_| {}).expect("sound");
    assert_eq!(serial.state_root, summary.state_root);
}

#[test]
fn a_lost_state_store_is_rebuilt_from_the_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys(6);
    let mut chain = new_chain(dir.path(), &keys, ChainOptions::default());
    build(&mut chain, &keys, 5, 10);
    let root = chain.head().state_root;
    chain.sync().unwrap();
    drop(chain);
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    let (chain, report) = Chain::open(dir.path(), ChainOptions::default(), &pool()).expect("reopens");
    assert_eq!(report.replayed, 5);
    assert_eq!(chain.head_state().clone().root(), root);
}

#[test]
fn bad_blocks_are_refused_with_the_block_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys(4);
    let mut chain = new_chain(dir.path(), &keys, ChainOptions::default());
    build(&mut chain, &keys, 1, 4);
    let threads = pool();
    // The same chain built a second time elsewhere gives a valid block 2 to tamper with.
    let scratch = tempfile::tempdir().unwrap();
    let good = {
        let mut copy = new_chain(scratch.path(), &keys, ChainOptions::default());
        build(&mut copy, &keys, 1, 4);
        let transfers = vec![virga_ledger::tx::RecoveredTx {
            tx: transfer(&keys[0], 1, keys[1].address(), 5),
            sender: keys[0].address(),
        }];
        copy.build_next(transfers, Address::ZERO, 5_000, &threads).expect("builds").block
    };
    let refuse = |chain: &mut Chain, block: Block| match chain.append(block, &threads) {
        Err(ChainError::Verify(error)) => error,
        other => panic!("expected a verification error, got {:?}", other.map(|o| o.receipts().len())),
    };

    let mut wrong_root = good.clone();
    wrong_root.header.state_root = Default::default();
    // The work no longer matches the header: caught before re-execution.
    let error = refuse(&mut chain, wrong_root);
    assert_eq!(error.number, 2);
    assert!(matches!(error.problem, Problem::Work(_)), "{error}");

    let mut extra = good.clone();
    extra.transactions.push(transfer(&keys[2], 0, keys[3].address(), 1));
    let error = refuse(&mut chain, extra);
    assert!(matches!(error.problem, Problem::TransactionsRoot { .. }), "{error}");
    assert!(error.to_string().starts_with("block 2: transactions root"), "{error}");

    let mut wrong_fee = good.clone();
    wrong_fee.header.base_fee_per_gas = Some(7);
    let error = refuse(&mut chain, wrong_fee);
    assert_eq!(error.problem, Problem::BaseFee { expected: 1, found: Some(7) }, "{error}");

    let mut shanghai = good.clone();
    shanghai.header.withdrawals_root = Some(Default::default());
    let error = refuse(&mut chain, shanghai);
    assert_eq!(error.problem, Problem::UnexpectedField("withdrawals_root"), "{error}");

    let mut crowded = good.clone();
    let filler = crowded.transactions[0].clone();
    crowded.transactions.resize(30_000_000 / 21_000 + 1, filler);
    let error = refuse(&mut chain, crowded);
    assert!(matches!(error.problem, Problem::TooManyTransactions { max: 1428, .. }), "{error}");

    assert!(chain.append(good, &threads).is_ok(), "the untouched block is accepted");
    assert_eq!(chain.head().number, 2);
}

#[test]
fn the_audit_reports_a_torn_state_log_tail_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys(4);
    let mut chain = new_chain(dir.path(), &keys, ChainOptions::default());
    build(&mut chain, &keys, 3, 5);
    chain.sync().unwrap();
    drop(chain);
    let wal = dir.path().join("state/wal");
    let segment = std::fs::read_dir(&wal).unwrap().map(|e| e.unwrap().path()).max().unwrap();
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes.extend_from_slice(&[0xB5, 1, 0]);
    std::fs::write(&segment, &bytes).unwrap();
    let unfinished = dir.path().join("state/checkpoint-00000000000000000099.ckpt.tmp");
    std::fs::write(&unfinished, b"half").unwrap();
    let audited = audit(dir.path(), ExecMode::Serial, &pool(), &mut |_| {});
    assert!(matches!(audited, Err(ChainError::StateTail { bytes: 3, .. })), "{audited:?}");
    assert_eq!(std::fs::read(&segment).unwrap(), bytes, "the audit read the state store in place, cutting nothing");
    assert!(unfinished.exists());
    drop(Chain::open(dir.path(), ChainOptions::default(), &pool()).expect("reopens"));
    audit(dir.path(), ExecMode::Serial, &pool(), &mut |_| {}).expect("sound after the repair");
}

#[test]
fn a_damaged_state_store_is_rebuilt_on_open_and_reported_by_the_audit() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys(6);
    let mut chain = new_chain(dir.path(), &keys, ChainOptions::default());
    build(&mut chain, &keys, 4, 10);
    let root = chain.head().state_root;
    chain.sync().unwrap();
    drop(chain);
    let wal = dir.path().join("state/wal");
    let segment = std::fs::read_dir(&wal).unwrap().next().unwrap().unwrap().path();
    let mut bytes = std::fs::read(&segment).unwrap();
    let middle = bytes.len() / 3;
    bytes[middle] ^= 0x40;
    std::fs::write(&segment, bytes).unwrap();
    let audited = audit(dir.path(), ExecMode::Parallel, &pool(), &mut |_| {});
    assert!(audited.unwrap_err().to_string().starts_with("state store"), "the audit names the state store");
    let (chain, report) = Chain::open(dir.path(), ChainOptions::default(), &pool()).expect("reopens");
    assert!(report.state_rebuilt.is_some(), "{report:?}");
    assert_eq!(report.replayed, 4);
    assert_eq!(chain.head_state().clone().root(), root);
    drop(chain);
    audit(dir.path(), ExecMode::Serial, &pool(), &mut |_| {}).expect("sound again");
    // A block stream that does not start at the genesis is refused.
    let genesis = read_genesis(dir.path()).unwrap();
    let headless = stored_blocks(dir.path()).skip(1);
    let refused = verify_blocks(&genesis, headless, ExecMode::Serial, &pool(), &mut |_| {});
    assert!(matches!(refused, Err(ChainError::Missing(0))));
}

#[test]
fn invalid_transactions_are_left_out_with_their_reason_and_a_block_holding_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys(2);
    let mut chain = new_chain(dir.path(), &keys, ChainOptions::default());
    let threads = pool();
    let recovered = |tx: SignedTx| virga_ledger::tx::RecoveredTx::recover(tx).expect("signed");
    let repeated = transfer(&keys[0], 0, keys[1].address(), 7);
    let built = chain
        .build_next(
            vec![
                recovered(transfer(&keys[0], 0, keys[1].address(), 7)),
                recovered(repeated.clone()),
                recovered(SignedTx::sign(
                    &keys[1],
                    0,
                    keys[0].address(),
                    U256::from(10).pow(U256::from(30)),
                    1,
                    21_000,
                    Some(CHAIN_ID),
                )),
            ],
            Address::ZERO,
            1,
            &threads,
        )
        .expect("builds");
    assert_eq!(built.block.transactions.len(), 1);
    let reasons: Vec<(usize, String)> =
        built.refused.iter().map(|refused| (refused.index, refused.reason.to_string())).collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert_eq!(reasons[0].0, 1);
    assert!(reasons[0].1.contains("nonce"), "{reasons:?}");
    assert!(reasons[1].1.contains("funds"), "{reasons:?}");

    // The same block with the refused transaction put back (roots and work made right) is
    // not a valid block: the verifier names the transaction.
    let mut stuffed = built.block.clone();
    stuffed.header.number = 2;
    stuffed.header.parent_hash = built.block.hash();
    stuffed.header.timestamp = 2;
    stuffed.transactions = vec![repeated];
    stuffed.header.transactions_root = virga_ledger::block::transactions_root(&stuffed.transactions);
    virga_ledger::pow::mine(&mut stuffed.header, 0);
    let error = match chain.append(stuffed, &threads) {
        Err(ChainError::Verify(error)) => error,
        other => panic!("expected a verification error, got {:?}", other.map(|o| o.receipts().len())),
    };
    assert!(matches!(error.problem, Problem::InvalidTransaction { index: 0, .. }), "{error}");
    assert!(error.to_string().contains("must be left out"), "{error}");
    chain.sync().unwrap();
    drop(chain);
    let genesis = read_genesis(dir.path()).unwrap();
    let blocks = stored_blocks(dir.path());
    let verified = verify_blocks(&genesis, blocks, ExecMode::Serial, &threads, &mut |_| {}).expect("sound");
    assert_eq!(verified.summary.reverted_transactions, 0);
}

#[test]
fn a_chain_directory_of_the_older_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys(2);
    drop(new_chain(dir.path(), &keys, ChainOptions::default()));
    std::fs::remove_file(dir.path().join("FORMAT")).unwrap();
    let error = Chain::open(dir.path(), ChainOptions::default(), &pool()).err().expect("refused");
    assert!(matches!(error, ChainError::OlderFormat { found: 2, .. }), "{error}");
    assert!(error.to_string().contains("Re-create the chain"), "{error}");
    let audited = audit(dir.path(), ExecMode::Serial, &pool(), &mut |_| {});
    assert!(matches!(audited, Err(ChainError::OlderFormat { .. })), "{audited:?}");
    std::fs::write(dir.path().join("FORMAT"), "banana").unwrap();
    let error = Chain::open(dir.path(), ChainOptions::default(), &pool()).err().expect("refused");
    assert!(error.to_string().contains("not a chain format version"), "{error}");
}
