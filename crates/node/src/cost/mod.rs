//! A cost model of RainBlock's roles, calibrated on this machine with Virga's own code, and a
//! predictor of throughput and commit latency for cluster shapes this machine can and cannot
//! run (issue 15 item 5).
//!
//! - [`calibrate`]: measures the CPU time of each role's unit operations (signature recovery,
//!   admission, block building, a storage node's apply and log append, witness serving and
//!   verification, pre-execution, message encoding, a call over each transport) by driving
//!   the real cores, and keeps them in a [`Calibration`] (JSON).
//! - [`model`]: the cost of each event kind from a calibration, and [`model::predict`], a
//!   bottleneck model of the cluster as a closed loop (see its module docs for what is assumed).
//! - [`validate`]: runs the real embedded cluster for shapes this machine can hold and sets
//!   each prediction beside its measurement.

pub mod calibrate;
pub mod model;
pub mod probes;
mod rig;
pub mod validate;

pub use calibrate::{calibrate, Calibration, CalibrationError, CalibrationSetup};
pub use model::{cpu_us, predict, Links, Prediction, Shape, Work};
