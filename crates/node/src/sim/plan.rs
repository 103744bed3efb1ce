//! What one simulated run is: its seed, its length, which faults it injects and when, and
//! (for the tests that prove the checks work) which deliberately broken variant it runs.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;
use virga_sim::media::{self, Kinds, Planted};

/// Which kinds of fault a run injects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Faults {
    /// Lost, duplicated and slow messages, and partitions.
    pub network: bool,
    /// Crashes and restarts of any node (its memory device keeping what a crash keeps).
    pub crashes: bool,
    /// Storage replicas serving corrupt or stale witnesses.
    pub lying_storage: bool,
    /// The producing miner announcing blocks with a wrong state root for a while.
    pub lying_miner: bool,
    /// Skewed node clocks (NTP-like).
    pub clocks: bool,
    /// A media fault under the follower miner's chain store as it crashes (a latent sector
    /// error, or writes lost or misdirected): not part of `all`.
    pub disk: bool,
}

/// A fault name [`Faults::parse`] does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown fault `{0}`: use all, none, network, crashes, lying-storage, lying-miner, clocks or disk")]
pub struct UnknownFault(pub String);

impl Faults {
    pub const NONE: Faults =
        Faults { network: false, crashes: false, lying_storage: false, lying_miner: false, clocks: false, disk: false };
    /// Every fault but `disk`.
    pub const ALL: Faults =
        Faults { network: true, crashes: true, lying_storage: true, lying_miner: true, clocks: true, disk: false };

    /// Parses a comma-separated list (`all`, `none`, `network`, `crashes`, `lying-storage`,
    /// `lying-miner`, `clocks`, `disk`).
    pub fn parse(text: &str) -> Result<Faults, UnknownFault> {
        let mut faults = Faults::NONE;
        for name in text.split(',').map(str::trim).filter(|name| !name.is_empty()) {
            match name {
                "all" => faults = Faults { disk: faults.disk, ..Faults::ALL },
                "none" => faults = Faults::NONE,
                "network" => faults.network = true,
                "crashes" => faults.crashes = true,
                "lying-storage" => faults.lying_storage = true,
                "lying-miner" => faults.lying_miner = true,
                "clocks" => faults.clocks = true,
                "disk" => faults.disk = true,
                other => return Err(UnknownFault(other.to_string())),
            }
        }
        Ok(faults)
    }
}

/// How long a run is: the default test suite runs short seeds, the soak full ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Length {
    Short,
    Full,
}

impl Length {
    /// Transfers offered.
    pub fn transfers(self) -> usize {
        match self {
            Length::Short => 60,
            Length::Full => 400,
        }
    }

    /// A bound on the events of a run, so that a protocol that livelocks still ends soon.
    pub fn max_events(self) -> u64 {
        match self {
            Length::Short => 150_000,
            Length::Full => 3_000_000,
        }
    }

    /// Faults stop at this virtual time.
    pub fn faults_until(self) -> Duration {
        match self {
            Length::Short => Duration::from_secs(2),
            Length::Full => Duration::from_secs(6),
        }
    }
}

/// After the faults stop, the run must settle (every transfer committed or refused, every
/// role idle) within this much virtual time.
pub const QUIESCENCE_BOUND: Duration = Duration::from_secs(60);

/// A deliberately broken variant, which the checks must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Broken {
    /// A follower miner adopts announced blocks without re-executing them.
    MinerSkipsBlockCheck,
    /// Storage nodes acknowledge a block before its log record is durable.
    StorageAcksBeforeLog,
}

/// One crash: `node` goes down at `at` and comes back at `back`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Crash {
    pub node: String,
    pub at: Duration,
    pub back: Duration,
}

/// The faults of one seed, drawn from it.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub drop_probability: f64,
    pub duplicate_probability: f64,
    pub latency_max: Duration,
    /// Windows in which one node is cut from all others.
    pub partitions: Vec<(Duration, Duration, String)>,
    pub crashes: Vec<Crash>,
    /// Crashes of a storage node at the first moment after `at` when it has a log write in
    /// flight (down for `back - at`): the step a lost write would show at.
    pub write_crashes: Vec<Crash>,
    /// The storage replica that lies until the faults stop, and how.
    pub lying_storage: Option<(String, bool)>,
    /// The window in which the producing miner lies.
    pub lying_miner: Option<(Duration, Duration)>,
    /// With `disk`: the media fault planted under the follower miner's chain store.
    pub media: Option<Planted>,
}

impl Schedule {
    /// No faults at all: the start of a scenario that sets its own.
    pub fn calm() -> Schedule {
        Schedule {
            drop_probability: 0.0,
            duplicate_probability: 0.0,
            latency_max: Duration::from_micros(500),
            partitions: Vec::new(),
            crashes: Vec::new(),
            write_crashes: Vec::new(),
            lying_storage: None,
            lying_miner: None,
            media: None,
        }
    }

    /// Draws the faults of `seed` among `nodes`, all before `until`.
    pub fn draw(seed: u64, faults: Faults, nodes: &[String], storage: &[String], until: Duration) -> Schedule {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_fa17);
        let window = |rng: &mut StdRng, longest: Duration| {
            let start = rng.random_range(0..until.as_nanos() as u64);
            let length = rng.random_range(1..=longest.as_nanos() as u64);
            (Duration::from_nanos(start), Duration::from_nanos((start + length).min(until.as_nanos() as u64)))
        };
        let mut schedule = Schedule::calm();
        if faults.network {
            schedule.drop_probability = rng.random_range(0.0..0.05);
            schedule.duplicate_probability = rng.random_range(0.0..0.05);
            schedule.latency_max = Duration::from_micros(rng.random_range(500..5_000));
            for _ in 0..rng.random_range(0..3) {
                let (start, end) = window(&mut rng, Duration::from_millis(800));
                let node = nodes[rng.random_range(0..nodes.len())].clone();
                schedule.partitions.push((start, end, node));
            }
        }
        if faults.crashes {
            for _ in 0..rng.random_range(1..4) {
                let (at, back) = window(&mut rng, Duration::from_millis(600));
                let node = nodes[rng.random_range(0..nodes.len())].clone();
                let overlaps = schedule.crashes.iter().any(|c| c.node == node && c.at <= back && at <= c.back);
                if !overlaps {
                    schedule.crashes.push(Crash { node, at, back });
                }
            }
        }
        if faults.crashes && !storage.is_empty() {
            let mut at: Vec<Crash> = (0..rng.random_range(1..3))
                .map(|_| {
                    let (at, back) = window(&mut rng, Duration::from_millis(300));
                    Crash { node: storage[rng.random_range(0..storage.len())].clone(), at, back }
                })
                .collect();
            at.sort_by_key(|crash| crash.at);
            schedule.write_crashes = at;
        }
        if faults.lying_storage && !storage.is_empty() {
            let node = storage[rng.random_range(0..storage.len())].clone();
            schedule.lying_storage = Some((node, rng.random_bool(0.5)));
        }
        if faults.lying_miner {
            schedule.lying_miner = Some(window(&mut rng, Duration::from_millis(500)));
        }
        if faults.disk {
            // Drawn after the rest, so a seed runs as it does without disk faults but for it.
            let (at, back) = window(&mut rng, Duration::from_millis(600));
            schedule.media = Some(follower_media_fault(
                &mut rng,
                &mut schedule.crashes,
                Crash { node: FOLLOWER.to_string(), at, back },
            ));
        }
        schedule
    }
}

/// The follower miner, the one node media faults hit: it is a standby, so the cluster runs
/// on while it is down. (Every storage node logs every block before it commits, and the
/// producer is the only one building, so the cluster does not outlive either losing its
/// disk until a node can be rebuilt from its peers: issue 43's recovery work.)
pub const FOLLOWER: &str = "miner-1";

/// The media fault of a follower that crashes: at one of its crashes, or at `otherwise`
/// (added to `crashes`) when it has none.
fn follower_media_fault(rng: &mut StdRng, crashes: &mut Vec<Crash>, otherwise: Crash) -> Planted {
    let at = match crashes.iter().find(|crash| crash.node == FOLLOWER) {
        Some(crash) => crash.at,
        None => {
            let at = otherwise.at;
            crashes.push(otherwise);
            at
        }
    };
    media::draw(rng, FOLLOWER.to_string(), at.as_nanos() as u64, Kinds::All)
}

/// A situation set up on purpose, for a test that must meet it every time rather than on
/// the seeds that happen to draw it: a fixed fault schedule in place of the seed's draw,
/// and the cluster's top-layer settings.
#[derive(Clone, Debug, Default)]
pub struct Scenario {
    /// The faults to inject (`None`: those the seed draws from its `Faults`).
    pub schedule: Option<Schedule>,
    /// The miners' top layer and the witnesses' compaction (`None`: the simulator's own).
    pub top_layer: Option<TopLayer>,
}

/// How much of the trie's upper part the miners keep, and where witnesses are cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopLayer {
    pub retention: usize,
    pub compaction: usize,
    pub budget_bytes: usize,
}
