//! What a secp256k1 signature and its check cost on this machine, measured in the
//! benchmark's own run, so that the pipeline's signature counts give cryptography's share
//! of the machine's time (its cores read no clock).

use std::time::Instant;

use alloy_primitives::B256;
use serde::Serialize;
use virga_ledger::tx::{recover_address, SigningKey};
use virga_ledger::wlc::SignatureCounts;

const BATCHES: usize = 9;
const PER_BATCH: usize = 100;

#[derive(Debug, Clone, Copy, Serialize)]
pub struct SignatureCosts {
    /// Microseconds to sign a digest, and to check a signature (recover its signer's
    /// address): the cheapest of nine batches of 100, measured before the servers start
    /// (what the work costs without a neighbour on the core; the machine is shared and
    /// noisy, and a median still swung by half between runs).
    pub sign_us: f64,
    pub check_us: f64,
    /// The cores the whole consortium shares (the databases' servers included).
    pub cores: usize,
}

impl SignatureCosts {
    pub fn measure() -> SignatureCosts {
        let key = SigningKey::from_seed(0x5167);
        let digests: Vec<B256> =
            (0..PER_BATCH as u64).map(|at| alloy_primitives::keccak256(at.to_be_bytes())).collect();
        let mut sign_batches = Vec::new();
        let mut check_batches = Vec::new();
        for _ in 0..BATCHES {
            let started = Instant::now();
            let signatures: Vec<_> = digests.iter().map(|digest| key.sign_hash(*digest)).collect();
            sign_batches.push(started.elapsed().as_secs_f64());
            let started = Instant::now();
            let recovered = digests.iter().zip(&signatures).filter(|(digest, signature)| {
                recover_address(**digest, signature).is_ok_and(|address| address == key.address())
            });
            let all = recovered.count() == PER_BATCH;
            check_batches.push(if all { started.elapsed().as_secs_f64() } else { f64::INFINITY });
        }
        // A check that failed makes the cost meaningless: NaN says so.
        let cheapest_us = |batches: Vec<f64>| match batches.iter().any(|seconds| seconds.is_infinite()) {
            true => f64::NAN,
            false => batches.into_iter().fold(f64::INFINITY, f64::min) * 1e6 / PER_BATCH as f64,
        };
        SignatureCosts {
            sign_us: cheapest_us(sign_batches),
            check_us: cheapest_us(check_batches),
            cores: std::thread::available_parallelism().map_or(1, usize::from),
        }
    }

    /// The share of the machine's time that `counts`, made over `seconds`, took.
    pub fn share(&self, counts: SignatureCounts, seconds: f64) -> f64 {
        let busy_us = counts.signed as f64 * self.sign_us + counts.checked as f64 * self.check_us;
        busy_us / 1e6 / (self.cores as f64 * seconds).max(1e-9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_are_measured_and_shares_scale_with_counts() {
        let costs = SignatureCosts::measure();
        assert!(costs.sign_us > 0.0 && costs.check_us > 0.0, "{costs:?}");
        let one = costs.share(SignatureCounts { signed: 10, checked: 20 }, 1.0);
        let two = costs.share(SignatureCounts { signed: 20, checked: 40 }, 1.0);
        assert!((two - 2.0 * one).abs() < 1e-12 && one > 0.0);
    }
}
