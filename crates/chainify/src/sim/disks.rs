//! The simulated servers' durable devices: each orderer replica's Raft log and each commit
//! server's vote log is a record log on a memory device, through a fault plan of its own
//! (`virga_sim::media`), kept across the server's crashes as a disk is, so a crash loses
//! what was not synced. With disk faults, one orderer replica that crashes and restarts
//! also meets a media fault the log can find (a latent sector error while it is down, or a
//! write that lands before its offset just before its crash); a replica whose log then
//! refuses to open stays down, and the ordering service runs on with the other two. (A
//! commit server's vote log is left whole: the one faulty organization Any-2 of 3 tolerates
//! is already drawn, and a second organization that cannot vote would stop every block.)

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::Rng;
use virga_core::device::{MemStorage, Storage};
use virga_sim::media::{self, Kinds, Plans, Planted};

use super::MS;

/// Every server's memory device and fault plan, and the ordering group's founding records.
pub(super) struct Disks {
    disks: RefCell<HashMap<String, MemStorage>>,
    plans: Plans,
    pub(super) founding: Vec<Vec<u8>>,
}

impl Disks {
    pub(super) fn new(founding: Vec<Vec<u8>>) -> Disks {
        Disks { disks: RefCell::default(), plans: Rc::default(), founding }
    }

    /// Server `node`'s storage (an empty device the first time).
    pub(super) fn storage(&self, node: &str) -> Arc<dyn Storage> {
        let disk = self.disks.borrow_mut().entry(node.to_string()).or_default().clone();
        media::storage_of(node, disk, &self.plans)
    }

    /// Server `node` crashed: its device keeps what was synced, and any part of the rest.
    pub(super) fn crash(&self, node: &str, rng: &mut StdRng) {
        if let Some(disk) = self.disks.borrow_mut().get_mut(node) {
            *disk = disk.crash_with(rng);
        }
    }

    /// Plants `planted` into its server's plan; whether it could.
    pub(super) fn plant(&self, planted: &Planted) -> bool {
        media::plant(planted, &self.disks, &self.plans)
    }

    /// Media faults that met a read or write.
    pub(super) fn fired(&self) -> u64 {
        media::fired(&self.plans)
    }
}

/// The seed's media fault, on an orderer replica that crashes and comes back (a crash is
/// added when the schedule has none). `crashes` are (node, down at, up at).
pub(super) fn media_fault(
    rng: &mut StdRng,
    orderers: &[String],
    crashes: &mut Vec<(String, u64, u64)>,
) -> Option<Planted> {
    let crashed: Vec<(String, u64)> = crashes
        .iter()
        .filter(|(node, _, _)| orderers.contains(node))
        .map(|(node, down, _)| (node.clone(), *down))
        .collect();
    let (node, down) = if crashed.is_empty() {
        let node = orderers.get(rng.random_range(0..orderers.len().max(1)))?.clone();
        let down = rng.random_range(10..300) * MS;
        crashes.push((node.clone(), down, down + rng.random_range(5..60) * MS));
        (node, down)
    } else {
        crashed[rng.random_range(0..crashed.len())].clone()
    };
    Some(media::draw(rng, node, down, Kinds::Detectable))
}
