//! The checks of a simulated run, against an oracle: a fresh database that executes the
//! ordered blocks serially.
//!
//! - every orderer replica's blocks are a prefix of the longest replica's (Raft keeps what
//!   it committed: a crashed leader loses no block);
//! - the ordered blocks are a signed, chained sequence, and no proposal is in them twice;
//! - every organization's ledger is a prefix of the oracle's LedgerBlocks (agreement and
//!   validity: what was committed is what serial execution gives);
//! - every organization holds every block at the end (liveness after the faults end);
//! - every organization's database equals the oracle's, except that the tampered one may
//!   still hold its change if no block touched the changed row since;
//! - every answer a client got is the oracle's outcome for its proposal.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use virga_ledger::wlc::{Hash, LedgerBlock, OrderedBlock};
use virga_sim::Sim;

use super::SimSetupError;
use super::{fresh_member, org_names, Cluster, Faults, SimOptions, SimReport};
use crate::organization::Transaction;
use crate::pipeline::node::{ChainifyNode, PipelineNode};
use crate::pipeline::node_name;

/// A check that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Something committed or answered that should not have been.
    Safety(String),
    /// Something that should have happened did not, after the faults ended.
    Liveness(String),
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Safety(what) => write!(f, "safety: {what}"),
            Violation::Liveness(what) => write!(f, "liveness: {what}"),
        }
    }
}

/// The oracle's LedgerBlocks and each proposal's (block, success).
struct Replay {
    chain: Vec<LedgerBlock>,
    outcomes: BTreeMap<(String, u64), (u64, bool)>,
}

fn replay(
    cluster: &Cluster,
    blocks: &[OrderedBlock],
    oracle: &mut crate::Member,
    violations: &mut Vec<Violation>,
) -> Result<Replay, SimSetupError> {
    let config = &cluster.config;
    let mut chain: Vec<LedgerBlock> = Vec::new();
    let mut outcomes = BTreeMap::new();
    let mut seen = BTreeSet::new();
    let mut previous_ordered = [0; 32];
    for (at, block) in blocks.iter().enumerate() {
        if block.number != at as u64 || block.previous != previous_ordered || block.check(config.orderer).is_err() {
            violations.push(Violation::Safety(format!("the ordered blocks break at block {at}")));
            break;
        }
        previous_ordered = block.hash();
        let mut transactions = Vec::new();
        let mut names = Vec::new();
        for chained in
            block.batches.iter().filter(|chained| chained.check(&config.organizations, config.agreements).is_ok())
        {
            for proposal in &chained.batch.proposals {
                if !seen.insert((proposal.client.clone(), proposal.seq)) {
                    violations.push(Violation::Safety(format!(
                        "proposal {} of {} is ordered twice (again in block {at})",
                        proposal.seq, proposal.client
                    )));
                }
                transactions.push(Transaction::new(proposal.statements.clone()));
                names.push((proposal.client.clone(), proposal.seq));
            }
        }
        let previous = chain.last().map_or([0; 32], LedgerBlock::hash);
        let ledger_block = oracle.execute(at as u64, previous, &transactions)?;
        for (name, ok) in names.into_iter().zip(&ledger_block.successful) {
            outcomes.insert(name, (at as u64, *ok));
        }
        chain.push(ledger_block);
    }
    Ok(Replay { chain, outcomes })
}

/// The longest chain of blocks an orderer replica has applied.
pub(super) fn ordered_blocks<R: PipelineNode>(cluster: &Cluster, sim: &Sim<R>) -> Vec<OrderedBlock> {
    cluster
        .config
        .orderers
        .iter()
        .filter_map(|name| match sim.core(name).map(R::node) {
            Some(ChainifyNode::Orderer(core)) => Some(core.blocks()),
            _ => None,
        })
        .max_by_key(|blocks| blocks.len())
        .map(<[OrderedBlock]>::to_vec)
        .unwrap_or_default()
}

/// The servers whose storage refused to open at the end, each with why.
fn unopened<R: PipelineNode>(cluster: &Cluster, sim: &Sim<R>) -> Vec<String> {
    let commits = org_names().into_iter().map(|org| node_name(&org, "commit"));
    cluster
        .config
        .orderers
        .iter()
        .cloned()
        .chain(commits)
        .filter_map(|name| match sim.core(&name).map(R::node) {
            Some(ChainifyNode::Unopened(error)) => Some(format!("{name}: {error}")),
            _ => None,
        })
        .collect()
}

pub(super) fn check<R: PipelineNode>(
    options: &SimOptions,
    cluster: &Cluster,
    sim: &Sim<R>,
    faults: Faults,
) -> Result<SimReport, SimSetupError> {
    let mut violations = Vec::new();
    let blocks = ordered_blocks(cluster, sim);
    for name in &cluster.config.orderers {
        let Some(ChainifyNode::Orderer(core)) = sim.core(name).map(R::node) else { continue };
        if let Some(at) = core.blocks().iter().zip(&blocks).position(|(held, longest)| held != longest) {
            violations.push(Violation::Safety(format!("{name}'s block {at} differs from another replica's")));
        }
    }
    let mut oracle = fresh_member("oracle")?;
    let replay = replay(cluster, &blocks, &mut oracle, &mut violations)?;
    let oracle_state: Hash = oracle.organization.state_hash()?;
    let tampered_state = match &faults.tamper {
        Some((_, statement)) => {
            oracle.organization.run_outside_chain(statement)?;
            Some(oracle.organization.state_hash()?)
        }
        None => None,
    };
    let mut heights = BTreeMap::new();
    let mut undetected_tamper = false;
    for org in org_names() {
        let member = cluster.members.get(&org).ok_or_else(|| SimSetupError::MissingOrganization(org.clone()))?;
        let mut member = member.lock().map_err(|_| SimSetupError::Poisoned)?;
        let ledger = member.ledger.blocks().to_vec();
        heights.insert(org.clone(), ledger.len() as u64);
        if let Some(at) = ledger.iter().zip(&replay.chain).position(|(held, agreed)| held != agreed) {
            violations.push(Violation::Safety(format!(
                "{org}'s LedgerBlock {at} differs from the serial replay of the ordered blocks"
            )));
            continue;
        }
        if ledger.len() > replay.chain.len() {
            violations.push(Violation::Safety(format!("{org} holds blocks the ordering service never ordered")));
            continue;
        }
        if ledger.len() < replay.chain.len() {
            violations.push(Violation::Liveness(format!(
                "{org} holds {} of the {} ordered blocks",
                ledger.len(),
                replay.chain.len()
            )));
            continue;
        }
        let state = member.organization.state_hash()?;
        let tampered = faults.tamper.is_some() && faults.faulty.as_deref() == Some(org.as_str());
        if tampered && Some(state) == tampered_state && state != oracle_state {
            undetected_tamper = true;
        } else if state != oracle_state {
            violations
                .push(Violation::Safety(format!("{org}'s database differs from the serial replay of its ledger")));
        }
    }
    let mut report = SimReport {
        options: options.clone(),
        faults,
        ordered_blocks: blocks.len() as u64,
        heights,
        answered: 0,
        refused: 0,
        timed_out: 0,
        recoveries: 0,
        recovery_attempts: 0,
        undetected_tamper,
        media_faults_fired: cluster.disks.fired(),
        unopened: unopened(cluster, sim),
        virtual_ms: sim.now() / 1_000_000,
        violations: Vec::new(),
        trace_digest: sim.trace_digest(),
    };
    for client in &cluster.clients {
        let Some(ChainifyNode::Client(core)) = sim.core(&client.name).map(R::node) else {
            continue;
        };
        let stats = core.stats();
        report.answered += stats.outcomes.len() as u64;
        report.refused += stats.refused.len() as u64;
        report.timed_out += stats.timed_out;
        for outcome in &stats.outcomes {
            let expected = replay.outcomes.get(&(outcome.client.clone(), outcome.seq));
            if expected != Some(&(outcome.block, outcome.successful)) {
                violations.push(Violation::Safety(format!(
                    "{} was told proposal {} came to (block {}, success {}); the replay says {expected:?}",
                    outcome.client, outcome.seq, outcome.block, outcome.successful
                )));
            }
        }
    }
    for org in org_names() {
        if let Some(ChainifyNode::Execution(core)) = sim.core(&node_name(&org, "exec")).map(R::node) {
            report.recoveries += core.stats().recovered;
            report.recovery_attempts += core.stats().recovery_attempts;
        }
    }
    if report.answered == 0 && options.transactions > 0 && options.clients > 0 {
        violations.push(Violation::Liveness("no client got an answer".to_string()));
    }
    report.violations = violations;
    Ok(report)
}
