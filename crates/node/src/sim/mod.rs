//! RainBlock under the deterministic simulator (virga-sim): storage nodes, miners and
//! prefetching clients as their cores, with lost, duplicated and reordered messages,
//! partitions, crashes and restarts of any node (its memory device keeping what a crash
//! keeps), lying storage replicas and a lying miner, and skewed clocks. Faults stop at a
//! virtual time; the run must then settle within [`plan::QUIESCENCE_BOUND`], and
//! [`checks`] says what it must show. The same seed replays the same run exactly.

pub mod checks;
pub mod node;
pub mod plan;
pub mod predict;
pub mod run;

pub use plan::{Broken, Crash, Faults, Length, Scenario, Schedule, TopLayer, UnknownFault};
pub use run::{run_scenario, run_seed, Finished, RunOptions, RunOutcome};

/// The command that replays a seed.
pub fn replay_command(seed: u64, faults: &str, length: Length) -> String {
    let full = if length == Length::Full { "" } else { " --short" };
    format!("virga sim rainblock --seeds 1 --first-seed {seed} --faults {faults}{full}")
}
