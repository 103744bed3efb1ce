//! The simulated network: latency, loss, duplication, partitions and per-link bandwidth.
//!
//! Every message (request or response) is routed on its own: it may be dropped, it may be
//! duplicated (the copy takes its own latency), and it arrives after a latency drawn
//! uniformly from `[latency_min, latency_max]`, so messages overtake each other. A link
//! named in [`NetConfig::links`] may fix the latency instead and add a bandwidth: each
//! direction then sends one message at a time, `bytes / bandwidth` each, and a message
//! waits for the link to be free (a WAN link for a cost model). A partition cuts both
//! directions between its two sides while its window is open: a message is lost if the
//! link is cut when it leaves or when it arrives.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

use crate::SimError;

/// How the network treats messages. [`NetConfig::validate`] says what is accepted.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConfig {
    /// Shortest one-way latency of a message.
    pub latency_min: Duration,
    /// Longest one-way latency; a message's latency is uniform in `[min, max]`.
    pub latency_max: Duration,
    /// Chance in `[0, 1]` that a message is lost.
    pub drop_probability: f64,
    /// Chance in `[0, 1]` that a message (not lost) arrives twice.
    pub duplicate_probability: f64,
    /// Windows in which pairs of nodes cannot reach each other.
    pub partitions: Vec<Partition>,
    /// Links with a fixed latency or a bandwidth; at most one per unordered pair of nodes.
    pub links: Vec<LinkConfig>,
}

impl Default for NetConfig {
    /// A LAN: 50–500 µs one way, nothing lost.
    fn default() -> Self {
        NetConfig {
            latency_min: Duration::from_micros(50),
            latency_max: Duration::from_micros(500),
            drop_probability: 0.0,
            duplicate_probability: 0.0,
            partitions: Vec::new(),
            links: Vec::new(),
        }
    }
}

/// Nodes of `side_a` and nodes of `side_b` cannot reach each other (either way) from
/// virtual time `start_ns` (included) to `end_ns` (excluded). Pairs within one side, and
/// nodes on neither side, are not affected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    pub start_ns: u64,
    pub end_ns: u64,
    pub side_a: Vec<String>,
    pub side_b: Vec<String>,
}

/// The link between nodes `a` and `b` (both directions, each with its own queue).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkConfig {
    pub a: String,
    pub b: String,
    /// A fixed one-way latency, replacing the network's random one.
    pub latency: Option<Duration>,
    /// Bytes per second each direction carries; messages queue behind each other.
    pub bandwidth: Option<u64>,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> SimError {
    SimError::InvalidConfig { field: field.into(), reason: reason.into() }
}

fn check_probability(field: &str, value: f64) -> Result<(), SimError> {
    if !(0.0..=1.0).contains(&value) {
        return Err(invalid(field, format!("{value} is not a probability in [0, 1]")));
    }
    Ok(())
}

impl NetConfig {
    /// Checks every field: latencies ordered and below an hour (so time sums cannot
    /// overflow), probabilities in `[0, 1]`, partition windows non-empty with two
    /// non-empty disjoint sides, links between two different nodes, at most one per pair,
    /// with a non-zero bandwidth.
    pub fn validate(&self) -> Result<(), SimError> {
        const HOUR: Duration = Duration::from_secs(3600);
        if self.latency_min > self.latency_max {
            return Err(invalid(
                "latency_min",
                format!("{:?} exceeds latency_max {:?}", self.latency_min, self.latency_max),
            ));
        }
        if self.latency_max > HOUR {
            return Err(invalid("latency_max", format!("{:?} is longer than an hour", self.latency_max)));
        }
        check_probability("drop_probability", self.drop_probability)?;
        check_probability("duplicate_probability", self.duplicate_probability)?;
        for (index, partition) in self.partitions.iter().enumerate() {
            let field = format!("partitions[{index}]");
            if partition.start_ns >= partition.end_ns {
                return Err(invalid(field, format!("window [{}, {}) is empty", partition.start_ns, partition.end_ns)));
            }
            if partition.side_a.is_empty() || partition.side_b.is_empty() {
                return Err(invalid(field, "a side names no node"));
            }
            if let Some(both) = partition.side_a.iter().find(|id| partition.side_b.contains(id)) {
                return Err(invalid(field, format!("node {both} is on both sides")));
            }
        }
        let mut pairs = Vec::with_capacity(self.links.len());
        for (index, link) in self.links.iter().enumerate() {
            let field = format!("links[{index}]");
            if link.a == link.b {
                return Err(invalid(field, format!("links node {} to itself", link.a)));
            }
            if link.bandwidth == Some(0) {
                return Err(invalid(field, "bandwidth is zero"));
            }
            if link.latency.is_some_and(|latency| latency > HOUR) {
                return Err(invalid(field, "latency is longer than an hour"));
            }
            let pair = if link.a < link.b { (&link.a, &link.b) } else { (&link.b, &link.a) };
            if pairs.contains(&pair) {
                return Err(invalid(field, format!("a second link between {} and {}", pair.0, pair.1)));
            }
            pairs.push(pair);
        }
        Ok(())
    }
}

/// What became of one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// Lost at random.
    Dropped,
    /// A partition cuts the link now.
    Cut,
    /// Arrives at `first`, and a copy at `copy` if duplicated.
    Arrives { first: u64, copy: Option<u64> },
}

/// One direction of a configured link.
struct Link {
    latency: Option<u64>,
    bandwidth: Option<u64>,
    /// When the link has finished sending its last message.
    free_at: u64,
}

/// A partition with its sides resolved to node indices: 0 neither, 1 side a, 2 side b.
struct Cut {
    start: u64,
    end: u64,
    side: Vec<u8>,
}

type LinkMap = HashMap<(u32, u32), Link, BuildHasherDefault<std::collections::hash_map::DefaultHasher>>;

pub(crate) struct Network {
    config: NetConfig,
    latency_min: u64,
    latency_max: u64,
    cuts: Vec<Cut>,
    links: LinkMap,
    rng: StdRng,
}

impl Network {
    /// `config` must have been validated.
    pub(crate) fn new(config: NetConfig, rng: StdRng) -> Self {
        let cuts = config
            .partitions
            .iter()
            .map(|partition| Cut { start: partition.start_ns, end: partition.end_ns, side: Vec::new() })
            .collect();
        Network {
            latency_min: config.latency_min.as_nanos() as u64,
            latency_max: config.latency_max.as_nanos() as u64,
            config,
            cuts,
            links: LinkMap::default(),
            rng,
        }
    }

    /// Resolves the partitions and links that name `id`, now node `index`; `named` finds
    /// the index of a node added earlier.
    pub(crate) fn add_node(&mut self, index: u32, id: &str, named: impl Fn(&str) -> Option<u32>) {
        for (cut, partition) in self.cuts.iter_mut().zip(&self.config.partitions) {
            let side = if partition.side_a.iter().any(|a| a == id) {
                1
            } else if partition.side_b.iter().any(|b| b == id) {
                2
            } else {
                0
            };
            cut.side.resize(index as usize + 1, 0);
            cut.side[index as usize] = side;
        }
        for link in &self.config.links {
            let other = if link.a == id {
                &link.b
            } else if link.b == id {
                &link.a
            } else {
                continue;
            };
            let Some(other) = named(other) else { continue };
            let latency = link.latency.map(|latency| latency.as_nanos() as u64);
            for pair in [(index, other), (other, index)] {
                self.links.insert(pair, Link { latency, bandwidth: link.bandwidth, free_at: 0 });
            }
        }
    }

    pub(crate) fn config(&self) -> &NetConfig {
        &self.config
    }

    pub(crate) fn set_probabilities(&mut self, drop_probability: f64, duplicate_probability: f64) {
        self.config.drop_probability = drop_probability;
        self.config.duplicate_probability = duplicate_probability;
    }

    /// Whether a partition separates `from` and `to` at virtual time `time`.
    pub(crate) fn is_cut(&self, from: u32, to: u32, time: u64) -> bool {
        self.cuts.iter().any(|cut| {
            let side = |node: u32| cut.side.get(node as usize).copied().unwrap_or(0);
            time >= cut.start && time < cut.end && side(from) != 0 && side(to) != 0 && side(from) != side(to)
        })
    }

    /// Routes one message of `bytes` bytes leaving `from` for `to` at `departure`.
    pub(crate) fn route(&mut self, from: u32, to: u32, departure: u64, bytes: usize) -> Route {
        if !self.cuts.is_empty() && self.is_cut(from, to, departure) {
            return Route::Cut;
        }
        if self.config.drop_probability > 0.0 && self.rng.random_bool(self.config.drop_probability) {
            return Route::Dropped;
        }
        let first = self.arrival(from, to, departure, bytes);
        let duplicated =
            self.config.duplicate_probability > 0.0 && self.rng.random_bool(self.config.duplicate_probability);
        let copy = duplicated.then(|| self.arrival(from, to, departure, bytes));
        Route::Arrives { first, copy }
    }

    fn arrival(&mut self, from: u32, to: u32, departure: u64, bytes: usize) -> u64 {
        let link = if self.links.is_empty() { None } else { self.links.get_mut(&(from, to)) };
        let (fixed, sent) = match link {
            None => (None, departure),
            Some(link) => {
                let sent = match link.bandwidth {
                    None => departure,
                    Some(bandwidth) => {
                        let transmit = (bytes as u128 * 1_000_000_000).div_ceil(u128::from(bandwidth));
                        let start = link.free_at.max(departure);
                        link.free_at = start.saturating_add(u64::try_from(transmit).unwrap_or(u64::MAX));
                        link.free_at
                    }
                };
                (link.latency, sent)
            }
        };
        let latency = match fixed {
            Some(latency) => latency,
            None if self.latency_min == self.latency_max => self.latency_min,
            None => self.rng.random_range(self.latency_min..=self.latency_max),
        };
        sent.saturating_add(latency)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn partition(a: &[&str], b: &[&str]) -> Partition {
        Partition {
            start_ns: 10,
            end_ns: 20,
            side_a: a.iter().map(|id| id.to_string()).collect(),
            side_b: b.iter().map(|id| id.to_string()).collect(),
        }
    }

    #[test]
    fn validation_names_the_bad_field() {
        let field_of = |config: NetConfig| match config.validate() {
            Err(SimError::InvalidConfig { field, .. }) => field,
            other => panic!("expected an invalid config, got {other:?}"),
        };
        let base = NetConfig::default();
        assert!(base.validate().is_ok());
        let reversed =
            NetConfig { latency_min: Duration::from_millis(2), latency_max: Duration::from_millis(1), ..base.clone() };
        assert_eq!(field_of(reversed), "latency_min");
        assert_eq!(field_of(NetConfig { drop_probability: 1.5, ..base.clone() }), "drop_probability");
        assert_eq!(field_of(NetConfig { duplicate_probability: f64::NAN, ..base.clone() }), "duplicate_probability");
        let both_sides = NetConfig { partitions: vec![partition(&["x", "y"], &["y"])], ..base.clone() };
        assert_eq!(field_of(both_sides), "partitions[0]");
        let mut empty_window = partition(&["x"], &["y"]);
        empty_window.end_ns = empty_window.start_ns;
        assert_eq!(field_of(NetConfig { partitions: vec![empty_window], ..base.clone() }), "partitions[0]");
        let link = |a: &str, b: &str, bandwidth| LinkConfig { a: a.into(), b: b.into(), latency: None, bandwidth };
        assert_eq!(field_of(NetConfig { links: vec![link("x", "x", None)], ..base.clone() }), "links[0]");
        assert_eq!(field_of(NetConfig { links: vec![link("x", "y", Some(0))], ..base.clone() }), "links[0]");
        let twice = NetConfig { links: vec![link("x", "y", None), link("y", "x", None)], ..base };
        assert_eq!(field_of(twice), "links[1]");
    }

    #[test]
    fn bandwidth_queues_messages_behind_each_other() {
        let config = NetConfig {
            links: vec![LinkConfig {
                a: "x".into(),
                b: "y".into(),
                latency: Some(Duration::from_nanos(100)),
                bandwidth: Some(1_000_000_000),
            }],
            ..NetConfig::default()
        };
        let mut network = Network::new(config, StdRng::seed_from_u64(1));
        network.add_node(0, "x", |_| None);
        network.add_node(1, "y", |id| (id == "x").then_some(0));
        // 1 GB/s: 1000 bytes take 1 µs; the second message waits for the first.
        assert_eq!(network.route(0, 1, 0, 1000), Route::Arrives { first: 1100, copy: None });
        assert_eq!(network.route(0, 1, 0, 1000), Route::Arrives { first: 2100, copy: None });
        // The other direction has its own queue.
        assert_eq!(network.route(1, 0, 0, 1000), Route::Arrives { first: 1100, copy: None });
    }

    #[test]
    fn a_partition_cuts_only_across_its_sides_inside_its_window() {
        let config = NetConfig { partitions: vec![partition(&["a"], &["b", "c"])], ..NetConfig::default() };
        let mut network = Network::new(config, StdRng::seed_from_u64(1));
        for (index, id) in ["a", "b", "c", "d"].into_iter().enumerate() {
            network.add_node(index as u32, id, |_| None);
        }
        assert!(network.is_cut(0, 1, 10) && network.is_cut(2, 0, 19));
        assert!(!network.is_cut(0, 1, 9) && !network.is_cut(0, 1, 20));
        assert!(!network.is_cut(1, 2, 15), "same side");
        assert!(!network.is_cut(0, 3, 15), "d is on neither side");
    }
}
