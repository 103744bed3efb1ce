//! Three organizations on SQLite as a consortium: agreement block after block, a tampered
//! organization recovering from its checkpoint, a corrupted checkpoint skipped for an
//! older one, and the ledgers and states equal at the end.

use rand::rngs::SmallRng;
use rand::SeedableRng;
use virga_ledger::wlc::{verify_chain, AgreementPolicy};

use crate::consortium::{Consortium, ConsortiumConfig, ConsortiumError, Member};
use crate::dialect::checkpoint_table;
use crate::ledger::Ledger;
use crate::smallbank;
use crate::{Organization, SqliteOrganization};

const CUSTOMERS: u64 = 120;

/// Three organizations on SQLite in memory, org-2 a [`Liar`] if `liar`.
fn members(liar: bool) -> Vec<Member> {
    (1..=3)
        .map(|index| {
            let mut org = SqliteOrganization::in_memory(&format!("org-{index}")).unwrap();
            org.install(&smallbank::tables()).unwrap();
            let organization: Box<dyn Organization> =
                if liar && index == 2 { Box::new(Liar(org)) } else { Box::new(org) };
            Member::new(organization, Ledger::in_memory())
        })
        .collect()
}

/// Three honest organizations, checkpointing every third block, with the customers loaded.
fn consortium(policy: AgreementPolicy) -> Consortium {
    let config = ConsortiumConfig { policy, checkpoint_every: 3, keep_checkpoints: 3 };
    let mut consortium = Consortium::new(members(false), config).unwrap();
    for block in smallbank::load_blocks(CUSTOMERS, 60) {
        let report = consortium.run_block(&block).unwrap();
        assert!(report.recovered.is_empty());
    }
    consortium
}

fn assert_all_equal(consortium: &mut Consortium) {
    let chain = consortium.chain().to_vec();
    assert_eq!(verify_chain(&chain), Ok(()));
    let mut states = Vec::new();
    for member in consortium.members_mut() {
        assert_eq!(member.ledger.blocks(), chain.as_slice(), "{}", member.organization.name());
        states.push(member.organization.state_hash().unwrap());
    }
    assert!(states.windows(2).all(|pair| pair[0] == pair[1]), "the organizations' states differ");
}

#[test]
fn honest_organizations_agree_on_every_block() {
    let mut consortium = consortium(AgreementPolicy::new(3, 3).unwrap());
    let mut rng = SmallRng::seed_from_u64(5);
    for _ in 0..8 {
        let report = consortium.run_block(&smallbank::random_block(&mut rng, CUSTOMERS, 25)).unwrap();
        assert!(report.recovered.is_empty());
        assert_eq!(report.transactions, 25);
    }
    assert_all_equal(&mut consortium);
}

#[test]
fn a_tampered_organization_recovers_from_its_newest_checkpoint() {
    let mut consortium = consortium(AgreementPolicy::new(2, 3).unwrap());
    let mut rng = SmallRng::seed_from_u64(6);
    for _ in 0..4 {
        consortium.run_block(&smallbank::random_block(&mut rng, CUSTOMERS, 20)).unwrap();
    }
    consortium.members_mut()[2]
        .organization
        .run_outside_chain("UPDATE checking SET bal = bal + 1000 WHERE custid = 4")
        .unwrap();
    let report = consortium.run_block(&smallbank::random_block(&mut rng, CUSTOMERS, 20)).unwrap();
    assert_eq!(report.recovered, vec![("org-3".to_string(), 1)]);
    for _ in 0..3 {
        assert!(consortium.run_block(&smallbank::random_block(&mut rng, CUSTOMERS, 20)).unwrap().recovered.is_empty());
    }
    assert_all_equal(&mut consortium);
}

#[test]
fn a_corrupted_checkpoint_is_skipped_for_an_older_one() {
    let mut consortium = consortium(AgreementPolicy::new(2, 3).unwrap());
    let mut rng = SmallRng::seed_from_u64(8);
    while consortium.chain().len() < 9 {
        consortium.run_block(&smallbank::random_block(&mut rng, CUSTOMERS, 20)).unwrap();
    }
    // Checkpoints after blocks 2, 5 and 8 (every third). The newest one of org-2 is
    // corrupted, in a row the next block may well not touch: its state hash gives it away.
    let member = &mut consortium.members_mut()[1];
    assert_eq!(member.organization.checkpoints().unwrap(), vec![2, 5, 8]);
    let corrupt = format!("UPDATE {} SET bal = bal + 12345 WHERE custid = 7", checkpoint_table(8, "savings"));
    member.organization.run_outside_chain(&corrupt).unwrap();
    member.organization.run_outside_chain("DELETE FROM savings WHERE custid = 7").unwrap();
    let report = consortium.run_block(&smallbank::random_block(&mut rng, CUSTOMERS, 20)).unwrap();
    assert_eq!(report.recovered, vec![("org-2".to_string(), 2)], "checkpoint 8, then checkpoint 5");
    assert_all_equal(&mut consortium);
}

#[test]
fn when_no_effects_reach_the_policy_every_organization_rebuilds_and_votes_again() {
    let mut consortium = consortium(AgreementPolicy::new(2, 3).unwrap());
    // Two organizations tampered, differently: no two hashes agree on the next block.
    consortium.members_mut()[0].organization.run_outside_chain("UPDATE checking SET bal = 1 WHERE custid = 1").unwrap();
    consortium.members_mut()[1].organization.run_outside_chain("UPDATE checking SET bal = 2 WHERE custid = 1").unwrap();
    let block = smallbank::random_block(&mut SmallRng::seed_from_u64(9), CUSTOMERS, 10);
    let report = consortium.run_block(&block).unwrap();
    assert!(report.recovered.is_empty() && report.failed.is_empty(), "all rebuilt before the second vote: {report:?}");
    assert!(report.recover > std::time::Duration::ZERO);
    assert_all_equal(&mut consortium);
}

/// An organization whose database reports effects it did not have (a broken or lying
/// DBMS): every digest image it returns is altered.
struct Liar(SqliteOrganization);

impl Organization for Liar {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn install(&mut self, tables: &[crate::SharedTable]) -> Result<(), crate::OrganizationError> {
        self.0.install(tables)
    }
    fn check_installed(&mut self) -> Result<(), crate::OrganizationError> {
        self.0.check_installed()
    }
    fn execute_block(
        &mut self,
        transactions: &[crate::Transaction],
    ) -> Result<crate::BlockEffects, crate::OrganizationError> {
        let mut effects = self.0.execute_block(transactions)?;
        for row in &mut effects.digests {
            row.image.push('!');
        }
        Ok(effects)
    }
    fn attach(&mut self, tables: &[crate::SharedTable]) -> Result<(), crate::OrganizationError> {
        self.0.attach(tables)
    }
    fn table_hashes(&mut self) -> Result<Vec<(String, virga_ledger::wlc::Hash)>, crate::OrganizationError> {
        self.0.table_hashes()
    }
    fn checkpoint(&mut self, block: u64) -> Result<(), crate::OrganizationError> {
        self.0.checkpoint(block)
    }
    fn checkpoints(&mut self) -> Result<Vec<u64>, crate::OrganizationError> {
        self.0.checkpoints()
    }
    fn drop_checkpoint(&mut self, block: u64) -> Result<(), crate::OrganizationError> {
        self.0.drop_checkpoint(block)
    }
    fn restore(&mut self, block: u64) -> Result<(), crate::OrganizationError> {
        self.0.restore(block)
    }
    fn reset(&mut self) -> Result<(), crate::OrganizationError> {
        self.0.reset()
    }
    fn run_outside_chain(&mut self, sql: &str) -> Result<(), crate::OrganizationError> {
        self.0.run_outside_chain(sql)
    }
}

#[test]
fn a_lying_organization_is_outvoted_every_block_and_named_unrecoverable() {
    let config =
        ConsortiumConfig { policy: AgreementPolicy::new(2, 3).unwrap(), checkpoint_every: 2, keep_checkpoints: 3 };
    let mut consortium = Consortium::new(members(true), config).unwrap();
    let mut rng = SmallRng::seed_from_u64(10);
    let blocks = smallbank::load_blocks(CUSTOMERS, 60)
        .into_iter()
        .chain((0..3).map(|_| smallbank::random_block(&mut rng, CUSTOMERS, 10)));
    for block in blocks {
        let report = consortium.run_block(&block).unwrap();
        assert_eq!(report.failed.len(), 1, "{report:?}");
        assert_eq!(report.failed[0].0, "org-2");
        assert!(report.failed[0].1.contains("cannot reach the agreed effects"), "{}", report.failed[0].1);
    }
    let chain = consortium.chain().to_vec();
    let held = consortium.members_mut();
    assert_eq!(held[0].ledger.blocks(), chain.as_slice());
    assert_eq!(held[2].ledger.blocks(), chain.as_slice());
    assert!(held[1].ledger.blocks().is_empty(), "the liar never committed a block");
    // Under All-3 the liar stops the chain instead: no block is agreed.
    let config =
        ConsortiumConfig { policy: AgreementPolicy::new(3, 3).unwrap(), checkpoint_every: 3, keep_checkpoints: 3 };
    let mut all = Consortium::new(members(true), config).unwrap();
    let error = all.run_block(&smallbank::load_blocks(CUSTOMERS, 200).remove(0)).unwrap_err();
    assert!(matches!(error, ConsortiumError::NoConsensus { block: 0, agree: 3 }), "{error}");
}
