//! Media faults under the data nodes (`--faults disk`): every node's storage runs through
//! a fault plan of its own (`virga_sim::media`), and a seed with disk faults gives one data
//! node that crashes and restarts one media fault: a latent sector error in a log segment
//! while it is down, or, shortly before it crashes, writes that are acknowledged and lost or
//! that land before their offset. A node whose storage no longer opens stays down (as a
//! process that refuses to start does) and its group runs on without it; the checks of the
//! run must hold either way.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use virga_sim::media::{draw, Kinds, Planted};

use super::{ns, Cluster, Crashes};

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
    Some(draw(rng, node, crash_at, Kinds::All))
}
