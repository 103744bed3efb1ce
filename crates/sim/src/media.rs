//! Media faults under simulated nodes' storage: each node's memory device runs through a
//! [`FaultyStorage`] with a fault plan of its own, kept across the node's crashes as its
//! disk is, and a harness plants one fault of a [`MediaFault`] kind on a node that crashes
//! and restarts: a latent sector error while it is down, or, shortly before it crashes,
//! writes that are acknowledged and lost, or that land before their offset. A node whose
//! storage then refuses to open is an [`Unopened`] node: nothing answers until its next
//! restart tries again (as a process that refuses to start).

use std::cell::RefCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

use rand::Rng;
use virga_core::device::{FaultPlan, FaultyStorage, MemStorage, Storage};
use virga_net::role::{Command, Event, Nanos, Protocol, Role};

/// How large an unreadable sector is.
pub const SECTOR_BYTES: u64 = 512;

const MS: u64 = 1_000_000;

/// One node's media fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaFault {
    /// While the node is down, a sector of one of its objects (picked by `pick`) becomes
    /// unreadable.
    LatentSector { pick: u64 },
    /// Its next writes are acknowledged and lost.
    LostWrites(u64),
    /// Its next writes land `back` bytes before their offset.
    Misdirected { writes: u64, back: u64 },
}

/// A media fault due at `at` (virtual ns) on `node`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planted {
    pub node: String,
    pub at: u64,
    pub fault: MediaFault,
}

/// Which kinds of fault a harness plants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kinds {
    /// Latent sector errors, lost writes and misdirected writes.
    All,
    /// The faults a node's storage can find by itself (a checksum, an unreadable sector):
    /// latent sector errors and misdirected writes.
    Detectable,
}

/// Each node's fault plan, kept across its crashes as its disk is.
pub type Plans = Rc<RefCell<HashMap<String, Arc<FaultPlan>>>>;

/// Node `id`'s storage: its memory device through its fault plan.
pub fn storage_of(id: &str, disk: MemStorage, plans: &Plans) -> Arc<dyn Storage> {
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

/// The fault of `node`, which crashes at `crash_at`: a latent sector error just after the
/// crash, or lost or misdirected writes 1 to 100 ms before it.
pub fn draw(rng: &mut impl Rng, node: String, crash_at: u64, kinds: Kinds) -> Planted {
    let before = rng.random_range(MS..100 * MS);
    let kind = match kinds {
        Kinds::All => rng.random_range(0..3),
        Kinds::Detectable => [0, 2][rng.random_range(0..2)],
    };
    let (at, fault) = match kind {
        0 => (crash_at + 1, MediaFault::LatentSector { pick: rng.random() }),
        1 => (crash_at.saturating_sub(before), MediaFault::LostWrites(rng.random_range(1..=3))),
        _ => {
            let back = rng.random_range(1..4096);
            (crash_at.saturating_sub(before), MediaFault::Misdirected { writes: 1, back })
        }
    };
    Planted { node, at, fault }
}

/// Plants `planted` into its node's plan (once virtual time reaches it); returns whether it
/// did (a latent sector error needs an object with bytes to hit).
pub fn plant(planted: &Planted, disks: &RefCell<HashMap<String, MemStorage>>, plans: &Plans) -> bool {
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
pub fn fired(plans: &Plans) -> u64 {
    plans.borrow().values().map(|plan| plan.media_faults()).sum()
}

/// A node whose storage did not open: its process refused to start, so nothing answers
/// (its callers' deadlines pass) until its next restart tries again.
pub struct Unopened<P> {
    pub error: String,
    protocol: PhantomData<fn() -> P>,
}

impl<P> Unopened<P> {
    pub fn new(error: impl Into<String>) -> Unopened<P> {
        Unopened { error: error.into(), protocol: PhantomData }
    }
}

impl<P: Protocol> Role for Unopened<P> {
    type Protocol = P;
    type Io = std::convert::Infallible;
    type IoDone = std::convert::Infallible;
    type Input = ();

    fn step(&mut self, _: Nanos, _: Event<P, Self::IoDone, ()>, _: &mut Vec<Command<P, Self::Io>>) {}
}
