//! What every run of the configuration service must show, observed after every event.
//!
//! - Election safety: at most one replica becomes leader in a term.
//! - State-machine safety and durability: replicas that applied index i applied the same
//!   entries up to i (their hash chains at i agree), including a replica that restarted and
//!   applied its log again: a committed entry lost by a crash shows here.
//! - Acknowledged means applied: every outcome a client received is at an index every
//!   replica that caught up has applied, and the service ends with one map on all replicas.

use std::collections::BTreeMap;

use virga_sim::Sim;

use super::node::ServiceNode;

/// Everything observed so far.
#[derive(Debug, Default)]
pub struct Observer {
    /// Term → the replica that became leader in it.
    leaders: BTreeMap<u64, String>,
    /// Index → (chain, the replica first seen with it).
    chains: BTreeMap<u64, (u64, String)>,
    /// Per replica: how much of its current incarnation's history was read, and its
    /// incarnation (history restarts with each).
    read: BTreeMap<String, (usize, u64)>,
    pub violations: Vec<String>,
}

impl Observer {
    /// Reads what changed at every replica.
    pub fn observe(&mut self, sim: &Sim<ServiceNode>, replicas: &[String]) {
        for id in replicas {
            let Some(core) = sim.core(id).and_then(|node| node.role::<crate::service::ConfigCore>()) else { continue };
            for term in core.led_terms() {
                match self.leaders.get(term) {
                    Some(leader) if leader != id => {
                        self.violate(format!("election safety: {leader} and {id} both became leader in term {term}"))
                    }
                    Some(_) => {}
                    None => {
                        self.leaders.insert(*term, id.clone());
                    }
                }
            }
            // Each incarnation gets its own seed from the factory, and a history of its own.
            let incarnation = core.config().seed;
            let (seen, known) = self.read.get(id).copied().unwrap_or((0, incarnation));
            let from = if known == incarnation { seen } else { 0 };
            let history = core.history();
            for &(index, chain) in &history[from.min(history.len())..] {
                match self.chains.get(&index) {
                    Some((expected, first)) if *expected != chain => self.violate(format!(
                        "state-machine safety: {id} applied a different entry sequence up to index {index} than {first}"
                    )),
                    Some(_) => {}
                    None => {
                        self.chains.insert(index, (chain, id.clone()));
                    }
                }
            }
            self.read.insert(id.clone(), (history.len(), incarnation));
        }
    }

    fn violate(&mut self, violation: String) {
        if self.violations.len() < 20 && !self.violations.contains(&violation) {
            self.violations.push(violation);
        }
    }

    /// Terms in which some replica became leader.
    pub fn elections(&self) -> usize {
        self.leaders.len()
    }

    /// The end state: every replica applied the same index and holds the same map, and every
    /// acknowledged outcome lies within it.
    pub fn check_end(&mut self, sim: &Sim<ServiceNode>, replicas: &[String], client: &str) {
        let mut ends = Vec::new();
        for id in replicas {
            match sim.core(id).and_then(|node| node.role::<crate::service::ConfigCore>()) {
                Some(core) => {
                    if let Some(failure) = core.failed() {
                        self.violate(format!("{id} stopped: {failure}"));
                    }
                    ends.push((id.clone(), core.applied(), core.state().map().cloned()));
                }
                // Its storage refused to open (a media fault): it serves nothing, and a
                // majority must still agree.
                _ if sim
                    .core(id)
                    .is_some_and(|node| node.role::<virga_sim::media::Unopened<crate::Dkv>>().is_some()) => {}
                _ => self.violate(format!("replica {id} is down at the end")),
            }
        }
        if let Some((first, applied, map)) = ends.first().cloned() {
            for (id, other_applied, other_map) in &ends[1..] {
                if *other_applied != applied || *other_map != map {
                    self.violate(format!(
                        "convergence: {id} ends at applied index {} and {first} at {} (or their maps differ)",
                        other_applied.0, applied.0
                    ));
                }
            }
            if let Some(client_core) = sim.core(client).and_then(|node| node.role::<crate::service::ConfigClient>()) {
                for outcome in client_core.outcomes() {
                    if outcome.index > applied.0 || outcome.index == 0 {
                        self.violate(format!(
                            "durability: command {} was acknowledged at index {}, but the replicas end at {}",
                            outcome.seq, outcome.index, applied.0
                        ));
                    }
                }
            }
        }
    }
}
