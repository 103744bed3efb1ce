//! Organizations on SQLite executing the same blocks: the same effects give the same
//! digest hash, a tampered organization is outvoted, and the state equals an oracle's.

use std::collections::BTreeMap;

use rand::rngs::SmallRng;
use rand::SeedableRng;
use virga_ledger::wlc::{verify_chain, AgreementPolicy, DigestOp, LedgerBlock, VoteOutcome};

use crate::smallbank::{self, Kind};
use crate::sqlite::SqliteSync;
use crate::{DatabaseOrganization, Organization, OrganizationError, SqlSession, SqliteOrganization, Transaction};

pub(crate) const CUSTOMERS: u64 = 200;

pub(crate) fn organization(name: &str) -> SqliteOrganization {
    let mut org = SqliteOrganization::in_memory(name).unwrap();
    org.install(&smallbank::tables()).unwrap();
    for block in smallbank::load_blocks(CUSTOMERS, 64) {
        let effects = org.execute_block(&block).unwrap();
        assert!(effects.successful.iter().all(|ok| *ok));
    }
    org
}

fn ledger_block(number: u64, previous: [u8; 32], block: &[Transaction], effects: &crate::BlockEffects) -> LedgerBlock {
    LedgerBlock {
        number,
        transactions: block.iter().map(Transaction::sql).collect(),
        successful: effects.successful.clone(),
        digest: effects.digest_hash(),
        previous,
    }
}

#[test]
fn organizations_on_different_storage_reach_the_same_hashes_block_after_block() {
    let dir = tempfile::tempdir().unwrap();
    let mut on_file = SqliteOrganization::open("org-file", &dir.path().join("org.db"), SqliteSync::Full).unwrap();
    on_file.install(&smallbank::tables()).unwrap();
    for block in smallbank::load_blocks(CUSTOMERS, 64) {
        on_file.execute_block(&block).unwrap();
    }
    let mut in_memory = organization("org-memory");
    let mut rng = SmallRng::seed_from_u64(7);
    let mut chain: Vec<LedgerBlock> = Vec::new();
    let mut failures = 0;
    for number in 0..20 {
        let block = smallbank::random_block(&mut rng, CUSTOMERS, 50);
        let one = in_memory.execute_block(&block).unwrap();
        let other = on_file.execute_block(&block).unwrap();
        assert_eq!(one.successful, other.successful, "block {number}");
        assert_eq!(one.digest_hash(), other.digest_hash(), "block {number}");
        assert!(!one.digests.is_empty());
        failures += one.successful.iter().filter(|ok| !**ok).count();
        let previous = chain.last().map_or([0; 32], LedgerBlock::hash);
        chain.push(ledger_block(number, previous, &block, &one));
    }
    assert!(failures > 0, "some withdrawals past the savings balance fail");
    assert_eq!(verify_chain(&chain), Ok(()));
}

#[test]
fn the_row_image_is_canonical_and_serials_rise_per_key() {
    let mut org = organization("org");
    let block = vec![
        Transaction::new(vec!["UPDATE accounts SET name = 'a|b~' WHERE custid = 7".to_string()]),
        smallbank::statements(Kind::DepositChecking, 7, 0, 5),
        smallbank::statements(Kind::DepositChecking, 7, 0, 6),
        Transaction::new(vec!["DELETE FROM accounts WHERE custid = 9".to_string()]),
    ];
    let effects = org.execute_block(&block).unwrap();
    let mut rows: Vec<(String, String, u64, String, DigestOp)> =
        effects.digests.iter().map(|d| (d.table.clone(), d.pk.clone(), d.serial, d.image.clone(), d.op)).collect();
    rows.sort();
    let checking = 5_000 + 7; // the load gives customer n 5,000 + n % 50
    assert_eq!(
        rows,
        vec![
            ("accounts".into(), "7".into(), 0, "1:7|4:a|b~".into(), DigestOp::Update),
            ("accounts".into(), "9".into(), 0, "1:9|10:customer-9".into(), DigestOp::Delete),
            ("checking".into(), "7".into(), 0, format!("1:7|4:{}", checking + 5), DigestOp::Update),
            ("checking".into(), "7".into(), 1, format!("1:7|4:{}", checking + 11), DigestOp::Update),
        ]
    );
    // The digest tables are emptied for the next block.
    assert!(org.execute_block(&[]).unwrap().digests.is_empty());
}

#[test]
fn a_failed_transaction_leaves_no_effect_and_is_recorded() {
    let mut org = organization("org");
    let overdraw = smallbank::statements(Kind::TransactSavings, 3, 0, -1_000_000);
    let effects = org.execute_block(&[overdraw, smallbank::statements(Kind::DepositChecking, 4, 0, 1)]).unwrap();
    assert_eq!(effects.successful, vec![false, true]);
    assert!(effects.digests.iter().all(|row| row.pk == "4"), "{:?}", effects.digests);
}

#[test]
fn a_tampered_organization_is_outvoted_and_told_to_recover() {
    let mut orgs: Vec<SqliteOrganization> = ["org-1", "org-2", "org-3"].iter().map(|name| organization(name)).collect();
    // Outside the chain: org-3's administrator raises a balance. The trigger records it, so
    // the next block's effects differ there.
    orgs[2].session().execute("UPDATE checking SET bal = bal + 100 WHERE custid = 5", []).unwrap();
    let block = smallbank::random_block(&mut SmallRng::seed_from_u64(3), CUSTOMERS, 20);
    let hashes: Vec<(String, [u8; 32])> = orgs
        .iter_mut()
        .map(|org| {
            let effects = org.execute_block(&block).unwrap();
            (org.name().to_string(), ledger_block(0, [0; 32], &block, &effects).hash())
        })
        .collect();
    let policy = AgreementPolicy::new(2, 3).unwrap();
    let heard = || hashes.iter().map(|(name, hash)| (name.as_str(), *hash));
    assert!(matches!(policy.decide("org-1", hashes[0].1, heard()), VoteOutcome::Commit { votes: 2, .. }));
    assert_eq!(policy.decide("org-3", hashes[2].1, heard()), VoteOutcome::Recover { consensus: hashes[0].1, votes: 2 });
    // Under All-3 nobody commits.
    let all = AgreementPolicy::new(3, 3).unwrap();
    assert_eq!(all.decide("org-1", hashes[0].1, heard()), VoteOutcome::Undecided { heard: 3 });
}

#[test]
fn an_organization_without_its_triggers_refuses_to_execute() {
    let mut org = organization("org");
    org.session().execute_batch("DROP TRIGGER chainify_checking_update").unwrap();
    let error = org.execute_block(&[smallbank::statements(Kind::DepositChecking, 1, 0, 1)]).unwrap_err();
    assert!(
        matches!(&error, OrganizationError::MissingTrigger { table, trigger, .. } if table == "checking" && trigger == "chainify_checking_update"),
        "{error}"
    );
    // Reinstalling puts it back.
    org.install(&smallbank::tables()).unwrap();
    org.check_installed().unwrap();
}

/// SmallBank's effects as a serial replay computes them.
#[derive(Default)]
struct Oracle {
    savings: BTreeMap<u64, i64>,
    checking: BTreeMap<u64, i64>,
}

impl Oracle {
    fn loaded(customers: u64) -> Oracle {
        let mut oracle = Oracle::default();
        for id in 0..customers {
            oracle.savings.insert(id, 10_000 + (id % 100) as i64);
            oracle.checking.insert(id, 5_000 + (id % 50) as i64);
        }
        oracle
    }

    /// Applies one transaction; false if it fails (and changes nothing).
    fn apply(&mut self, kind: Kind, a: u64, b: u64, amount: i64) -> bool {
        let amount_abs = amount.abs();
        match kind {
            Kind::Balance => {}
            Kind::DepositChecking => *self.checking.get_mut(&a).unwrap() += amount_abs,
            Kind::TransactSavings => {
                let savings = self.savings.get_mut(&a).unwrap();
                if *savings + amount < 0 {
                    return false;
                }
                *savings += amount;
            }
            Kind::Amalgamate => {
                let total = self.savings[&a] + self.checking[&a];
                *self.checking.get_mut(&b).unwrap() += total;
                self.savings.insert(a, 0);
                self.checking.insert(a, 0);
            }
            Kind::WriteCheck => {
                let penalty = i64::from(self.checking[&a] + self.savings[&a] < amount_abs);
                *self.checking.get_mut(&a).unwrap() -= amount_abs + penalty;
            }
            Kind::SendPayment => {
                if self.checking[&a] >= amount_abs {
                    *self.checking.get_mut(&a).unwrap() -= amount_abs;
                    *self.checking.get_mut(&b).unwrap() += amount_abs;
                }
            }
        }
        true
    }
}

#[test]
fn the_database_equals_a_serial_replay_of_the_blocks() {
    let mut org = organization("org");
    let mut oracle = Oracle::loaded(CUSTOMERS);
    let mut rng = SmallRng::seed_from_u64(11);
    let kinds = [
        Kind::Balance,
        Kind::DepositChecking,
        Kind::TransactSavings,
        Kind::Amalgamate,
        Kind::WriteCheck,
        Kind::SendPayment,
    ];
    for _ in 0..30 {
        // Few customers so that transactions of a block touch the same rows.
        let block: Vec<(Kind, u64, u64, i64)> = (0..40)
            .map(|_| {
                let a = rand::Rng::random_range(&mut rng, 0..20);
                let b = (a + rand::Rng::random_range(&mut rng, 1..20)) % 20;
                let kind = kinds[rand::Rng::random_range(&mut rng, 0..kinds.len())];
                (kind, a, b, rand::Rng::random_range(&mut rng, -15_000..3_000))
            })
            .collect();
        let transactions: Vec<Transaction> =
            block.iter().map(|(kind, a, b, amount)| smallbank::statements(*kind, *a, *b, *amount)).collect();
        let effects = org.execute_block(&transactions).unwrap();
        let expected: Vec<bool> =
            block.iter().map(|(kind, a, b, amount)| oracle.apply(*kind, *a, *b, *amount)).collect();
        assert_eq!(effects.successful, expected);
    }
    for (table, expected) in [("savings", &oracle.savings), ("checking", &oracle.checking)] {
        let mut select = org.session().prepare(&format!("SELECT custid, bal FROM {table} ORDER BY custid")).unwrap();
        let actual: BTreeMap<u64, i64> = select
            .query_map([], |row| Ok((row.get::<_, i64>(0)? as u64, row.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(&actual, expected, "{table}");
    }
}

#[test]
fn a_restored_checkpoint_brings_back_the_state_its_constraints_and_its_triggers() {
    checkpoint_round_trip(organization("honest"), organization("restored"));
}

/// Two organizations loaded alike: one runs blocks honestly, the other is checkpointed,
/// tampered with and restored, and must then give the honest one's effects.
pub(crate) fn checkpoint_round_trip<S: SqlSession>(
    mut honest: DatabaseOrganization<S>,
    mut restored: DatabaseOrganization<S>,
) {
    let mut rng = SmallRng::seed_from_u64(23);
    let blocks: Vec<Vec<Transaction>> = (0..6).map(|_| smallbank::random_block(&mut rng, CUSTOMERS, 30)).collect();
    for block in &blocks[..3] {
        honest.execute_block(block).unwrap();
        restored.execute_block(block).unwrap();
    }
    restored.checkpoint(2).unwrap();
    let at_checkpoint = restored.state_hash().unwrap();
    assert_eq!(at_checkpoint, honest.state_hash().unwrap());
    // Later blocks, then tampering with the data and removing a trigger behind the chain's back.
    restored.execute_block(&blocks[3]).unwrap();
    restored.session().batch("UPDATE savings SET bal = 1 WHERE custid < 50").unwrap();
    let trigger = S::DIALECT.trigger_names(&smallbank::tables()[1]).remove(0);
    restored
        .session()
        .batch(&format!(
            "DROP TRIGGER {trigger}{}",
            match S::DIALECT {
                crate::Dialect::Sqlite => "",
                crate::Dialect::Postgres => " ON savings",
            }
        ))
        .unwrap();
    assert!(matches!(restored.check_installed(), Err(OrganizationError::MissingTrigger { .. })));
    assert_eq!(restored.checkpoints().unwrap(), vec![2]);
    restored.restore(2).unwrap();
    assert_eq!(restored.state_hash().unwrap(), at_checkpoint);
    restored.check_installed().unwrap();
    // Replaying from the checkpoint gives the honest organization's effects, block by block.
    for block in &blocks[3..] {
        let expected = honest.execute_block(block).unwrap();
        assert_eq!(restored.execute_block(block).unwrap(), expected);
    }
    // The check on savings came back with the table.
    let overdraw = smallbank::statements(Kind::TransactSavings, 1, 0, -10_000_000);
    assert_eq!(restored.execute_block(&[overdraw]).unwrap().successful, vec![false]);
    assert!(matches!(restored.restore(7), Err(OrganizationError::NoCheckpoint { block: 7, .. })));
    restored.reset().unwrap();
    assert!(restored.checkpoints().unwrap().is_empty());
    assert_eq!(restored.execute_block(&[]).unwrap().digests.len(), 0);
}

/// Runs `block` in stage order (each stage's transactions in reverse), as a staged executor
/// might interleave them, and returns the effects with success bits in block order.
fn run_in_stage_order(
    org: &mut SqliteOrganization,
    block: &[Transaction],
    stages: &[Vec<usize>],
) -> crate::BlockEffects {
    let order: Vec<usize> = stages.iter().flat_map(|stage| stage.iter().rev().copied()).collect();
    let permuted: Vec<Transaction> = order.iter().map(|at| block[*at].clone()).collect();
    let effects = org.execute_block(&permuted).unwrap();
    let mut successful = vec![false; block.len()];
    for (position, at) in order.iter().enumerate() {
        successful[*at] = effects.successful[position];
    }
    crate::BlockEffects { successful, digests: effects.digests }
}

/// Whether running contended SmallBank blocks in the order `staging` allows ever gives other
/// effects than block order (over `seeds` seeds of 10 blocks).
fn staging_diverges(seeds: u64, staging: &dyn Fn(&[crate::analysis::Footprint]) -> Vec<Vec<usize>>) -> bool {
    let tables = smallbank::tables();
    for seed in 0..seeds {
        let (mut serial, mut staged) = (organization("serial"), organization("staged"));
        let mut rng = SmallRng::seed_from_u64(seed);
        for _ in 0..10 {
            // 30 customers: transactions of a block share customers often.
            let block = smallbank::random_block(&mut rng, 30, 40);
            let footprints: Vec<_> = block.iter().map(|txn| crate::analysis::footprint(txn, &tables)).collect();
            let expected = serial.execute_block(&block).unwrap();
            let actual = run_in_stage_order(&mut staged, &block, &staging(&footprints));
            if actual.successful != expected.successful || actual.digest_hash() != expected.digest_hash() {
                return true;
            }
        }
        if serial.state_hash().unwrap() != staged.state_hash().unwrap() {
            return true;
        }
    }
    false
}

#[test]
fn any_order_the_stages_allow_gives_the_effects_of_block_order() {
    assert!(!staging_diverges(6, &crate::analysis::stages));
}

#[test]
fn an_analysis_that_ignores_reads_is_caught() {
    // The broken variant: only writes count, so a transaction reading a customer's balance
    // in a subquery may share a stage with one changing it.
    let writes_only = |footprints: &[crate::analysis::Footprint]| {
        let stripped: Vec<_> = footprints
            .iter()
            .map(|footprint| crate::analysis::Footprint {
                accesses: footprint.accesses.iter().filter(|access| access.write).cloned().collect(),
                barrier: footprint.barrier,
            })
            .collect();
        crate::analysis::stages(&stripped)
    };
    assert!(staging_diverges(6, &writes_only));
}

#[test]
fn a_sqlite_file_with_worker_connections_gives_the_effects_of_serial_execution() {
    let dir = tempfile::tempdir().unwrap();
    let mut staged =
        SqliteOrganization::open_with_workers("staged", &dir.path().join("db.sqlite"), SqliteSync::Normal, 2).unwrap();
    staged.install(&smallbank::tables()).unwrap();
    for block in smallbank::load_blocks(CUSTOMERS, 64) {
        staged.execute_block(&block).unwrap();
    }
    let mut serial = organization("serial");
    let mut rng = SmallRng::seed_from_u64(31);
    for number in 0..6 {
        let block = smallbank::random_block(&mut rng, 40, 50);
        let (one, other) = (serial.execute_block(&block).unwrap(), staged.execute_block(&block).unwrap());
        assert_eq!(one.successful, other.successful, "block {number}");
        assert_eq!(one.digest_hash(), other.digest_hash(), "block {number}");
    }
    assert_eq!(serial.state_hash().unwrap(), staged.state_hash().unwrap());
}

/// A short run of the pipeline bench over three SQLite organizations in `dir`.
fn short_bench(dir: &std::path::Path, policy: virga_ledger::wlc::AgreementPolicy) -> crate::bench::BenchConfig {
    crate::bench::BenchConfig {
        dir: dir.join("consortium"),
        sqlite_only: true,
        customers: 300,
        clients: vec![2],
        skews: vec![crate::smallbank::Skew::Zipf(1.1)],
        policy,
        runs: 1,
        warmup: std::time::Duration::from_millis(200),
        duration: std::time::Duration::from_millis(800),
        window: 4,
        block_size: 32,
        batch_size: 8,
        workers: 0,
        alone_transactions: 10,
        orderers: 3,
        tamper: true,
        seed: 1,
    }
}

/// The pipeline's servers under the tokio driver, every message on the wire encoding, over
/// three SQLite organizations: clients get answers, signatures are counted, and a tampered
/// organization recovers while the clients run.
#[test]
fn the_pipeline_bench_runs_its_servers_over_real_databases() {
    let dir = tempfile::tempdir().unwrap();
    let config = short_bench(dir.path(), virga_ledger::wlc::AgreementPolicy::new(2, 3).unwrap());
    let report = crate::bench::run(&config, &mut |_| {}).unwrap();
    assert_eq!(report.points.len(), 1);
    let point = &report.points[0];
    assert!(point.answered > 0 && point.tps > 0.0, "{point:?}");
    assert!(point.successful <= point.answered);
    assert!(point.postgres_alone_tps.is_none());
    assert!((point.execute_share + point.decide_share + point.apply_share - 1.0).abs() < 1e-6);
    // Every proposal is signed by its client and checked at least by its organization and
    // the agreeing one, besides the batches', blocks' and votes' signatures.
    assert!(point.checked_per_transaction >= 2.0 && point.signed_per_transaction >= 1.0, "{point:?}");
    assert!(point.crypto_share > 0.0 && point.crypto_share < 1.0, "{point:?}");
    let recovery = report.recovery.as_ref().expect("the tampering phase ran");
    assert_eq!(recovery.organization, "org-3");
    assert!(recovery.attempts >= 1 && recovery.recovered_seconds > 0.0, "{recovery:?}");
}

/// Under all three of three, the pipeline cannot decide a block a tampered organization
/// disagrees on (there is no second round of votes), so the bench says so instead of
/// waiting on it, and keeps its points.
#[test]
fn the_pipeline_bench_skips_tampering_where_the_others_cannot_decide_alone() {
    let dir = tempfile::tempdir().unwrap();
    let config = short_bench(dir.path(), virga_ledger::wlc::AgreementPolicy::new(3, 3).unwrap());
    let report = crate::bench::run(&config, &mut |_| {}).unwrap();
    assert!(report.points[0].answered > 0, "{:?}", report.points[0]);
    assert!(report.recovery.is_none() && report.recovery_failed.is_none());
    assert!(report.recovery_skipped.as_deref().is_some_and(|why| why.contains("any 3 of 3")), "{report:?}");
}
