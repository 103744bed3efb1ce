//! Calibration: the time of each role's unit operations on this machine, measured on Virga's
//! own code paths.
//!
//! A rig ([`super::rig`]) is a small RainBlock network of the real cores driven by hand, one
//! event at a time, on one thread, through whole blocks; each step is timed by the process's
//! CPU clock (`CLOCK_PROCESS_CPUTIME_ID`), so time other processes take is not in it. Blocks
//! of two sizes separate what an operation costs per block (or per call) from what it costs
//! per transfer (or per key, per update). Each figure is the median of several repetitions.
//! [`Machine::effective_cores`] measures how much of the cores a CPU-bound job of this
//! process actually gets ([`super::probes`] holds that and the transports' probes).

use crate::protocol::{Rainblock, Request};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

use super::probes::{codec_ns_per_byte, grpc_costs, inproc_call_us, keccak_ns_per_node};
pub use super::probes::{cpu_share, machine_description};
use super::rig::{BlockSample, LogProbe, Rig};

/// Format of the calibration file this build writes and reads.
pub const CALIBRATION_FORMAT: u32 = 1;

/// What a calibration could not do.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error("calibration setup: {0}")]
    Setup(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("calibration step {step}: {source}")]
    Step {
        step: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: not a calibration file: {source}")]
    Json { path: String, source: serde_json::Error },
    #[error("{path}: calibration format {found}, this build reads format {CALIBRATION_FORMAT}")]
    Format { path: String, found: u32 },
}

/// The rig could not be set up: the typed error of the code it ran (or what it found wrong).
pub(super) fn setup_error<E: Into<Box<dyn std::error::Error + Send + Sync>>>(error: E) -> CalibrationError {
    CalibrationError::Setup(error.into())
}

/// A step's failure, with the typed error of the code it timed (or what the rig found wrong).
pub(super) fn step_error<E: Into<Box<dyn std::error::Error + Send + Sync>>>(
    step: &'static str,
) -> impl Fn(E) -> CalibrationError {
    move |source| CalibrationError::Step { step, source: source.into() }
}

/// The machine a calibration was taken on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// `model name` of /proc/cpuinfo.
    pub cpu_model: String,
    /// Logical cores the OS offers this process.
    pub cores: usize,
    /// Cores' worth of CPU a CPU-bound job of this process gets with one busy thread per
    /// core: its CPU time over the wall-clock time (see [`cpu_share`]). Below `cores` when
    /// other processes share the machine or the host steals time.
    pub effective_cores: f64,
    /// The same, for a process pinned to a set of cores (`taskset -c` lists such as "0" or
    /// "0,1"), measured in child processes by the command line when it calibrates.
    #[serde(default)]
    pub cpu_share: BTreeMap<String, f64>,
    /// `optimized` or `debug` (the build's `debug_assertions`): a calibration holds only for
    /// binaries built like the one that took it.
    pub build: String,
}

/// The network the rig ran: figures depend on the state's size and the shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationSetup {
    pub accounts: usize,
    pub shards: usize,
    pub storage_nodes: usize,
    pub retention: usize,
    pub compaction: usize,
    /// The two block sizes timed (transfers; one submission per block).
    pub small_block: usize,
    pub large_block: usize,
    /// Blocks of each size timed (figures are medians over them).
    pub repetitions: usize,
}

impl CalibrationSetup {
    /// A quick calibration on a state like the validation runs'.
    pub fn standard() -> CalibrationSetup {
        CalibrationSetup {
            accounts: 20_000,
            shards: 16,
            storage_nodes: 16,
            retention: 4,
            compaction: 5,
            small_block: 100,
            large_block: 400,
            repetitions: 9,
        }
    }
}

/// The miner's work, in microseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MinerCosts {
    /// Per transfer: decoding and recovering its signature (`RecoveredTx::recover`);
    /// parallel on the miner's execution pool.
    pub recover_us: f64,
    /// Per transfer: attaching its share of the submission's bag to the top layer (`PartialTrie::apply_bag`).
    pub admit_us: f64,
    /// `build_block` on the warm top layer: per block and per transfer (execution, state
    /// root, transaction and receipt roots, work).
    pub build_block_us: f64,
    pub build_us: f64,
    /// The rest of a submission's step (logical updates, shard hashes, pruning bookkeeping,
    /// replies): per block and per transfer.
    pub other_block_us: f64,
    pub other_us: f64,
    /// Committing a block once built: the storage nodes' acknowledgements and the store's
    /// completion as events of the core, per block (the store's own write is not in it).
    pub commit_block_us: f64,
}

/// A storage node's work, in microseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StorageCosts {
    /// `ApplyBlock` without a log (checks, copy-on-write apply, shard hashes, root): per call
    /// and per update.
    pub apply_call_us: f64,
    pub apply_update_us: f64,
    /// Appending one block's record to the log with fsync (`StorageDisk` on a file in a
    /// temporary directory): its wall-clock time (mostly the device's latency) and the
    /// thread's own CPU time in it (user and kernel, `CLOCK_THREAD_CPUTIME_ID`).
    pub log_append_fsync_us: f64,
    pub log_append_cpu_us: f64,
    /// A witness request (`StorageCore::witness`): per call and per key.
    pub witness_call_us: f64,
    pub witness_key_us: f64,
}

/// A prefetching client's work, in microseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClientCosts {
    /// Per key: checking a storage node's bag against the root and compacting it (`NodeBag::verify_compact`).
    pub verify_key_us: f64,
    /// Per transfer: pre-execution (`apply_transfer` on the witnessed accounts).
    pub preexec_us: f64,
    /// Per transfer: merging the bags and encoding the transfers into the submission.
    pub bag_us: f64,
}

/// Messages and hashing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MessageCosts {
    /// prost encoding and decoding of RainBlock's messages (submissions, `ApplyBlock`, witness replies).
    pub encode_ns_per_byte: f64,
    pub decode_ns_per_byte: f64,
    /// keccak-256 of a trie node (the witness nodes' own sizes).
    pub keccak_ns_per_node: f64,
    /// A call over the in-process transport, whole, as the roles make them: the caller a
    /// task of its own, the callee a mailbox whose driver task answers through a oneshot
    /// channel, on a two-worker runtime (so a call wakes tasks across threads).
    pub inproc_call_us: f64,
    /// A call over gRPC on loopback (both sides, one call at a time): per call and per byte
    /// of request. `None` in a build without gRPC.
    pub grpc_call_us: Option<f64>,
    pub grpc_ns_per_byte: Option<f64>,
}

/// Sizes and counts of the messages the rig's blocks produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    /// Distinct accounts a transfer touches within a batch (sender and recipient, shared
    /// ones counted once).
    pub keys_per_transfer: f64,
    /// Logical updates a block carries per transfer (its accounts, the beneficiary's once).
    pub updates_per_transfer: f64,
    /// Witness requests per batch of `small_block` and of `large_block` transfers (one per storage node asked).
    pub witness_calls_small: f64,
    pub witness_calls_large: f64,
    /// Encoded bytes: a submission per transfer, a witness reply per key, an `ApplyBlock`
    /// per update and per call (its header and shard hashes), the submission's answer per transfer.
    pub submission_bytes_per_transfer: f64,
    pub witness_bytes_per_key: f64,
    pub apply_bytes_per_update: f64,
    pub apply_bytes_per_call: f64,
    pub answer_bytes_per_transfer: f64,
}

/// Everything measured, with the machine and the setup.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub format: u32,
    pub machine: Machine,
    /// Seconds since the Unix epoch when it was taken.
    pub taken_at: u64,
    pub setup: CalibrationSetup,
    pub miner: MinerCosts,
    pub storage: StorageCosts,
    pub client: ClientCosts,
    pub messages: MessageCosts,
    pub traffic: Traffic,
}

impl Calibration {
    pub fn save(&self, path: &Path) -> Result<(), CalibrationError> {
        let json = serde_json::to_string_pretty(self)
            .map_err(|source| CalibrationError::Json { path: path.display().to_string(), source })?;
        std::fs::write(path, json).map_err(|source| CalibrationError::Io { path: path.display().to_string(), source })
    }

    pub fn load(path: &Path) -> Result<Calibration, CalibrationError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| CalibrationError::Io { path: path.display().to_string(), source })?;
        let calibration: Calibration = serde_json::from_str(&text)
            .map_err(|source| CalibrationError::Json { path: path.display().to_string(), source })?;
        if calibration.format != CALIBRATION_FORMAT {
            return Err(CalibrationError::Format { path: path.display().to_string(), found: calibration.format });
        }
        Ok(calibration)
    }
}

/// Wall-clock microseconds of a storage node's log append with fsync now: the median of
/// `appends` appends of a small record to a fresh log in the temporary directory.
pub fn fsync_latency_us(appends: usize) -> Result<f64, CalibrationError> {
    let mut log = LogProbe::new()?;
    for index in 0..appends.max(1) {
        log.append(vec![index as u8; 256])?;
    }
    Ok(log.finish().0)
}

/// The median of `values` (0 when empty).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|value| value.is_finite()).collect();
    if sorted.is_empty() {
        return 0.0;
    }
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    }
}

/// The line through (x1, y1) and (x2, y2): intercept and slope, each at least 0 (a noisy
/// pair of medians may tilt the line below zero, which no cost is).
pub fn fit_line(x1: f64, y1: f64, x2: f64, y2: f64) -> (f64, f64) {
    if (x2 - x1).abs() < f64::EPSILON {
        return (0.0, if x1 > 0.0 { y1 / x1 } else { 0.0 });
    }
    let slope = ((y2 - y1) / (x2 - x1)).max(0.0);
    let intercept = (y1 - slope * x1).max(0.0);
    (intercept, slope)
}

/// The timed blocks of each size.
struct Samples {
    small: Vec<BlockSample>,
    large: Vec<BlockSample>,
    sizes: (f64, f64),
}

type Measure<'a> = &'a dyn Fn(&BlockSample) -> f64;
type Count<'a> = &'a dyn Fn(&BlockSample) -> usize;

impl Samples {
    fn all(&self) -> impl Iterator<Item = &BlockSample> {
        self.small.iter().chain(&self.large)
    }

    /// The median over every block of `value` per `count`.
    fn per(&self, value: Measure, count: Count) -> f64 {
        median(&self.all().map(|s| value(s) / count(s).max(1) as f64).collect::<Vec<_>>())
    }

    fn median_of(samples: &[BlockSample], value: Measure) -> f64 {
        median(&samples.iter().map(value).collect::<Vec<_>>())
    }

    /// `value` as a cost per block plus a cost per transfer (the line through the two
    /// sizes' medians).
    fn per_block_and_transfer(&self, value: Measure) -> (f64, f64) {
        let (n1, n2) = self.sizes;
        fit_line(n1, Self::median_of(&self.small, value), n2, Self::median_of(&self.large, value))
    }

    /// `value` as a cost per call plus a cost per unit (key, update): the two sizes' medians
    /// as two equations. Noise that makes either negative charges everything per unit.
    fn per_call_and_unit(&self, calls: Count, units: Count, value: Measure) -> (f64, f64) {
        let point = |samples: &[BlockSample]| {
            (
                Self::median_of(samples, &|s| calls(s) as f64),
                Self::median_of(samples, &|s| units(s) as f64),
                Self::median_of(samples, value),
            )
        };
        let ((c1, u1, t1), (c2, u2, t2)) = (point(&self.small), point(&self.large));
        let determinant = c1 * u2 - c2 * u1;
        if determinant.abs() < 1e-9 {
            return (0.0, t2 / u2.max(1.0));
        }
        let per_call = (t1 * u2 - t2 * u1) / determinant;
        let per_unit = (c1 * t2 - c2 * t1) / determinant;
        if per_call < 0.0 || per_unit < 0.0 {
            return (0.0, (t1 + t2) / (u1 + u2).max(1.0));
        }
        (per_call, per_unit)
    }
}

/// Runs the rig: one untimed block of each size (the top layer grows along the hot paths),
/// then `repetitions` timed ones of each, with a log append after each block (spread over
/// the run, so a short slow spell of the disk does not set the figure).
fn run_rig(setup: &CalibrationSetup) -> Result<(Samples, (f64, f64)), CalibrationError> {
    let mut rig = Rig::new(setup)?;
    rig.block(setup.small_block)?;
    rig.block(setup.large_block)?;
    let mut log = LogProbe::new()?;
    let (mut small, mut large) = (Vec::new(), Vec::new());
    for _ in 0..setup.repetitions {
        for sample in [rig.block(setup.small_block)?, rig.block(setup.large_block)?] {
            if let Some(record) = sample.messages.iter().find_map(|m| match m {
                Request::ApplyBlock(updates) => {
                    Some(prost::Message::encode_to_vec(&crate::codec::block_updates_to_wire((**updates).clone())))
                }
                _ => None,
            }) {
                log.append(record)?;
            }
            if sample.transfers == setup.small_block {
                small.push(sample);
            } else {
                large.push(sample);
            }
        }
    }
    let sizes = (setup.small_block as f64, setup.large_block as f64);
    Ok((Samples { small, large, sizes }, log.finish()))
}

fn miner_costs(samples: &Samples) -> MinerCosts {
    let transfers = |s: &BlockSample| s.transfers;
    let (build_block_us, build_us) = samples.per_block_and_transfer(&|s| s.build_us);
    let (other_block_us, other_us) =
        samples.per_block_and_transfer(&|s| (s.step_us - s.recover_us - s.admit_us - s.build_us).max(0.0));
    MinerCosts {
        recover_us: samples.per(&|s| s.recover_us, &transfers),
        admit_us: samples.per(&|s| s.admit_us, &transfers),
        build_block_us,
        build_us,
        other_block_us,
        other_us,
        commit_block_us: median(&samples.all().map(|s| s.commit_us).collect::<Vec<_>>()),
    }
}

fn storage_costs(samples: &Samples, (log_append_fsync_us, log_append_cpu_us): (f64, f64)) -> StorageCosts {
    let (apply_call_us, apply_update_us) =
        samples.per_call_and_unit(&|s| s.apply_calls, &|s| s.apply_updates, &|s| s.apply_us);
    let (witness_call_us, witness_key_us) =
        samples.per_call_and_unit(&|s| s.witness_calls, &|s| s.keys, &|s| s.witness_us);
    StorageCosts {
        apply_call_us,
        apply_update_us,
        log_append_fsync_us,
        log_append_cpu_us,
        witness_call_us,
        witness_key_us,
    }
}

fn message_costs(samples: &Samples) -> Result<MessageCosts, CalibrationError> {
    let messages: Vec<Request> = samples.all().flat_map(|s| s.messages.iter().cloned()).collect();
    let (encode_ns_per_byte, decode_ns_per_byte) = codec_ns_per_byte(&messages);
    let nodes: Vec<Vec<u8>> = samples.all().flat_map(|s| s.witness_nodes.iter().cloned()).collect();
    let small_request = Request::Head;
    let large_request = messages
        .iter()
        .filter(|m| matches!(m, Request::Submit(_)))
        .max_by_key(|m| <Rainblock as virga_net::role::Protocol>::request_bytes(m))
        .cloned()
        .unwrap_or_else(|| small_request.clone());
    let (grpc_call_us, grpc_ns_per_byte) = grpc_costs(&small_request, &large_request)?;
    Ok(MessageCosts {
        encode_ns_per_byte,
        decode_ns_per_byte,
        keccak_ns_per_node: keccak_ns_per_node(&nodes),
        inproc_call_us: inproc_call_us(&small_request)?,
        grpc_call_us,
        grpc_ns_per_byte,
    })
}

fn traffic(samples: &Samples) -> Traffic {
    let transfers = |s: &BlockSample| s.transfers;
    let keys = |s: &BlockSample| s.keys;
    let (apply_bytes_per_call, apply_bytes_per_update) =
        samples.per_call_and_unit(&|s| s.apply_calls, &|s| s.apply_updates, &|s| s.apply_bytes as f64);
    Traffic {
        keys_per_transfer: samples.per(&|s| s.keys as f64, &transfers),
        updates_per_transfer: samples.per(&|s| s.apply_updates as f64, &transfers),
        witness_calls_small: Samples::median_of(&samples.small, &|s| s.witness_calls as f64),
        witness_calls_large: Samples::median_of(&samples.large, &|s| s.witness_calls as f64),
        submission_bytes_per_transfer: samples.per(&|s| s.submission_bytes as f64, &transfers),
        witness_bytes_per_key: samples.per(&|s| s.witness_bytes as f64, &keys),
        apply_bytes_per_update,
        apply_bytes_per_call,
        answer_bytes_per_transfer: samples.per(&|s| s.answer_bytes as f64, &transfers),
    }
}

/// Measures everything, on a network shaped by `setup`.
pub fn calibrate(setup: &CalibrationSetup) -> Result<Calibration, CalibrationError> {
    if setup.small_block == 0 || setup.large_block <= setup.small_block || setup.repetitions == 0 {
        return Err(setup_error(format!(
            "blocks of {} and {} transfers, {} repetitions: the large block must be larger and both non-empty",
            setup.small_block, setup.large_block, setup.repetitions
        )));
    }
    let (cpu_model, cores) = machine_description();
    let (samples, log) = run_rig(setup)?;
    let transfers = |s: &BlockSample| s.transfers;
    let client = ClientCosts {
        verify_key_us: samples.per(&|s| s.verify_us, &|s| s.keys),
        preexec_us: samples.per(&|s| s.preexec_us, &transfers),
        bag_us: samples.per(&|s| s.bag_us, &transfers),
    };
    let machine = Machine {
        cpu_model,
        cores,
        effective_cores: cpu_share(cores, 1.0).unwrap_or(cores as f64),
        cpu_share: BTreeMap::new(),
        build: if cfg!(debug_assertions) { "debug" } else { "optimized" }.to_string(),
    };
    let taken_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    Ok(Calibration {
        format: CALIBRATION_FORMAT,
        machine,
        taken_at,
        setup: setup.clone(),
        miner: miner_costs(&samples),
        storage: storage_costs(&samples, log),
        client,
        messages: message_costs(&samples)?,
        traffic: traffic(&samples),
    })
}

/// A calibration with figures of the order this machine measured, for tests.
#[cfg(test)]
pub(crate) fn example() -> Calibration {
    Calibration {
        format: CALIBRATION_FORMAT,
        machine: Machine {
            cpu_model: "test CPU".to_string(),
            cores: 2,
            effective_cores: 1.9,
            cpu_share: BTreeMap::from([("0".to_string(), 0.9), ("0,1".to_string(), 1.9)]),
            build: "optimized".to_string(),
        },
        taken_at: 1,
        setup: CalibrationSetup::standard(),
        miner: MinerCosts {
            recover_us: 33.0,
            admit_us: 1.6,
            build_block_us: 400.0,
            build_us: 6.4,
            other_block_us: 0.0,
            other_us: 2.7,
            commit_block_us: 180.0,
        },
        storage: StorageCosts {
            apply_call_us: 33.0,
            apply_update_us: 2.2,
            log_append_fsync_us: 170.0,
            log_append_cpu_us: 76.0,
            witness_call_us: 4.8,
            witness_key_us: 2.3,
        },
        client: ClientCosts { verify_key_us: 3.6, preexec_us: 1.4, bag_us: 0.2 },
        messages: MessageCosts {
            encode_ns_per_byte: 0.16,
            decode_ns_per_byte: 0.64,
            keccak_ns_per_node: 470.0,
            inproc_call_us: 9.1,
            grpc_call_us: Some(50.0),
            grpc_ns_per_byte: Some(1.5),
        },
        traffic: Traffic {
            keys_per_transfer: 1.83,
            updates_per_transfer: 1.84,
            witness_calls_small: 16.0,
            witness_calls_large: 16.0,
            submission_bytes_per_transfer: 218.0,
            witness_bytes_per_key: 681.0,
            apply_bytes_per_update: 117.0,
            apply_bytes_per_call: 1057.0,
            answer_bytes_per_transfer: 40.0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calibration_round_trips_through_its_json_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("calibration.json");
        let calibration = example();
        calibration.save(&path).unwrap();
        assert_eq!(Calibration::load(&path).unwrap(), calibration);
    }

    #[test]
    fn a_file_of_another_format_or_not_a_calibration_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("calibration.json");
        let mut other = example();
        other.format = CALIBRATION_FORMAT + 1;
        other.save(&path).unwrap();
        let refused = Calibration::load(&path).unwrap_err();
        assert!(matches!(refused, CalibrationError::Format { found, .. } if found == CALIBRATION_FORMAT + 1));
        std::fs::write(&path, "{\"format\": 1}").unwrap();
        let refused = Calibration::load(&path).unwrap_err().to_string();
        assert!(refused.contains("calibration.json") && refused.contains("not a calibration"), "{refused}");
    }

    #[test]
    fn medians_and_lines_are_what_they_say() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(fit_line(100.0, 300.0, 400.0, 900.0), (100.0, 2.0));
        // A line tilted below zero by noise costs nothing per unit, never less.
        assert_eq!(fit_line(100.0, 300.0, 400.0, 200.0), (300.0, 0.0));
    }

    /// The rig drives every role's real core through whole blocks: a small calibration
    /// gives a finite, positive cost for every operation that has work to do.
    #[test]
    fn a_small_calibration_measures_every_operation() {
        let setup = CalibrationSetup {
            accounts: 400,
            shards: 16,
            storage_nodes: 4,
            retention: 2,
            compaction: 3,
            small_block: 8,
            large_block: 24,
            repetitions: 2,
        };
        let calibration = calibrate(&setup).unwrap();
        let miner = &calibration.miner;
        for (name, value) in [
            ("recover", miner.recover_us),
            ("admit", miner.admit_us),
            ("verify", calibration.client.verify_key_us),
            ("keccak", calibration.messages.keccak_ns_per_node),
            ("log append", calibration.storage.log_append_fsync_us),
        ] {
            assert!(value.is_finite() && value > 0.0, "{name}: {value}");
        }
        assert!(miner.build_us + miner.build_block_us > 0.0);
        assert!(calibration.traffic.keys_per_transfer > 1.0 && calibration.traffic.keys_per_transfer <= 2.0);
        assert!(calibration.traffic.submission_bytes_per_transfer > 100.0);
        assert_eq!(calibration.setup, setup);
    }
}
