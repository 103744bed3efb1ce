//! Media faults under the data nodes (`--faults disk`): every node's storage runs through
//! a [`FaultyStorage`] with a plan of its own, and a seed with disk faults gives one data
//! node that crashes and restarts one media fault: a latent sector error in a log segment
//! while it is down, or, shortly before it crashes, writes that are acknowledged and lost or
//! that land before their offset. A node whose storage no longer opens stays down (as a
//! process that refuses to start does) and its group runs on without it; the checks of the
//! run must hold either way.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use virga_core::device::{FaultPlan, FaultyStorage, MemStorage, Storage};

use super::{ns, Cluster, Crashes};

/// How large an unreadable sector is.
const SECTOR_BYTES: u64 = 512;

/// One node's media fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MediaFault {
    /// While the node is down, a sector of one of its objects (picked by `pick`) becomes
    /// unreadable.
    LatentSector { pick: u64 },
    /// Its next writes are acknowledged and lost.
    LostWrites(u64),
    /// Its next writes land `back` bytes before their offset.
    Misdirected { writes: u64, back: u64 },
}

/// A media fault due at `at` (virtual ns) on `node`.
#[derive(Debug, Clone)]
pub(super) struct Planted {
    pub(super) node: String,
    pub(super) at: u64,
    pub(super) fault: MediaFault,
}

/// Each node's fault plan, kept across its crashes as its disk is.
pub(super) type Plans = Rc<RefCell<HashMap<String, Arc<FaultPlan>>>>;

/// Node `id`'s storage: its memory device through its fault plan.
pub(super) fn storage_of(id: &str, disk: MemStorage, plans: &Plans) -> Arc<dyn Storage> {
    // `FaultPlan::new`, not its `Default`: a default plan has no syncs or bytes left.
    let mut plans = plans.borrow_mut();
    let plan = match plans.get(id) {
        Some(plan) => Arc::clone(plan),
        None => {
            let plan = FaultPlan::new();
            plans.insert(id.to_string(), Arc::clone(&plan));
            plan
        }
    };
    Arc::new(FaultyStorage::new(Arc::new(disk), plan))
}

/// The seed's media fault, on a data node that crashes and comes back (one is added when
/// the schedule has none). Drawn after the rest of the schedule, so a seed without disk
/// faults runs as it always did.
pub(super) fn schedule(rng: &mut StdRng, cluster: &Cluster, crashes: &mut Crashes, window: u64) -> Option<Planted> {
    let restarted: Vec<(u64, String)> = crashes
        .iter()
        .filter(|(_, back, id)| back.is_some() && cluster.data.contains(id))
        .map(|(at, _, id)| (*at, id.clone()))
        .collect();
    let (crash_at, node) = if restarted.is_empty() {
        let node = cluster.data.get(rng.random_range(0..cluster.data.len().max(1)))?.clone();
        let at = rng.random_range(ns(Duration::from_millis(100))..window.max(ns(Duration::from_millis(101))));
        let back = at + rng.random_range(ns(Duration::from_millis(20))..ns(Duration::from_millis(300)));
        crashes.push((at, Some(back), node.clone()));
        (at, node)
    } else {
        restarted[rng.random_range(0..restarted.len())].clone()
    };
    let before = rng.random_range(ns(Duration::from_millis(1))..ns(Duration::from_millis(100)));
    let (at, fault) = match rng.random_range(0..3) {
        0 => (crash_at + 1, MediaFault::LatentSector { pick: rng.random() }),
        1 => (crash_at.saturating_sub(before), MediaFault::LostWrites(rng.random_range(1..=3))),
        _ => {
            let back = rng.random_range(1..4096);
            (crash_at.saturating_sub(before), MediaFault::Misdirected { writes: 1, back })
        }
    };
    Some(Planted { node, at, fault })
}

/// Plants `planted` into its node's plan once virtual time `now` reaches it; returns
/// whether it did (a latent sector error needs an object with bytes to hit).
pub(super) fn plant(planted: &Planted, disks: &RefCell<HashMap<String, MemStorage>>, plans: &Plans) -> bool {
    let plans = plans.borrow();
    let Some(plan) = plans.get(&planted.node) else { return false };
    match planted.fault {
        MediaFault::LostWrites(writes) => plan.lose_writes(writes),
        MediaFault::Misdirected { writes, back } => plan.misdirect_writes(writes, back),
        MediaFault::LatentSector { pick } => {
            let disks = disks.borrow();
            let Some(disk) = disks.get(&planted.node) else { return false };
            let objects: Vec<(String, u64)> = disk
                .list()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|name| Some((name.clone(), disk.open(&name).ok()?.len().ok()?)))
                .filter(|(_, len)| *len > 0)
                .collect();
            if objects.is_empty() {
                return false;
            }
            let (name, len) = &objects[(pick % objects.len() as u64) as usize];
            let offset = ((pick >> 16) % len) / SECTOR_BYTES * SECTOR_BYTES;
            plan.latent_sector_error(disk.path_of(name), offset, SECTOR_BYTES);
        }
    }
    true
}

/// Media faults that fired, over every node.
pub(super) fn fired(plans: &Plans) -> u64 {
    plans.borrow().values().map(|plan| plan.media_faults()).sum()
}
