//! The benchmark's last phase: an organization's database is changed outside the chain
//! while clients run, and the time until it agrees again is measured (the seed's Fig. 4.12,
//! timed). Its newest checkpoint is taken first, at the height the pipeline drained to, as
//! its device would at its interval: the points run without checkpoints, so that none of
//! them pays for copying the tables.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{drain, exec_of, BenchConfig, Clients, Running};
use crate::consortium::Member;
use crate::keys::Keys;
use crate::pipeline::PipelineConfig;
use crate::run::RunError;
use crate::smallbank::Skew;

/// The change an administrator makes behind the chain's back.
pub const TAMPER_SQL: &str = "UPDATE checking SET bal = bal + 1000 WHERE custid = 0";

/// How long a recovery may take before the benchmark gives up on it.
const RECOVERY_LIMIT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Serialize)]
pub struct RecoveryPoint {
    pub organization: String,
    pub clients: usize,
    /// Taking the checkpoint the recovery restores (every shared table copied and hashed).
    pub checkpoint_seconds: f64,
    /// From the tampering statement to the organization's recovery: the next block shows
    /// the changed row's digest, the organization is outvoted, restores its checkpoint,
    /// replays the blocks after it and re-executes the block it lost.
    pub recovered_seconds: f64,
    /// Rebuild attempts (1: the newest checkpoint was enough).
    pub attempts: u64,
    /// Blocks the organization had executed since its checkpoint when it was tampered
    /// with: the recovery replays them (a checkpoint every K blocks bounds them by K).
    pub blocks_since_checkpoint: u64,
    /// Transactions answered a second before the tampering, and from it to the recovery
    /// (the other organizations keep committing under the policy).
    pub tps_before: f64,
    pub tps_while_recovering: f64,
}

/// The victim's (recoveries, rebuild attempts, height).
fn victim_state(running: &Running, victim: usize) -> (u64, u64, u64) {
    running.execs[victim].with_core(|node| {
        exec_of(node).map_or((0, 0, 0), |exec| (exec.stats().recovered, exec.stats().recovery_attempts, exec.height()))
    })
}

/// Runs a blocking database call off the runtime's threads (the PostgreSQL client runs a
/// runtime of its own).
async fn on_member<T: Send + 'static>(
    member: &Arc<Mutex<Member>>,
    call: impl FnOnce(&mut Member) -> Result<T, RunError> + Send + 'static,
) -> Result<T, RunError> {
    let member = Arc::clone(member);
    let result = tokio::task::spawn_blocking(move || {
        let mut member = member.lock().map_err(|_| RunError::Io("an organization's lock is poisoned".to_string()))?;
        call(&mut member)
    })
    .await;
    match result {
        Ok(done) => done,
        Err(error) => Err(RunError::Io(format!("a database call failed: {error}"))),
    }
}

/// Tampers with the last organization while `clients` clients run, and times its recovery.
#[allow(clippy::too_many_arguments)]
pub(super) async fn tamper_and_recover(
    config: &BenchConfig,
    running: &Running,
    members: &[Arc<Mutex<Member>>],
    pipeline: &PipelineConfig,
    keys: &Keys,
    point: usize,
    clients: usize,
    skew: Skew,
) -> Result<RecoveryPoint, RunError> {
    let victim = members.len().checked_sub(1).ok_or(RunError::Io("no organizations".to_string()))?;
    drain(running, Duration::from_secs(600)).await?;
    let (_, _, height) = victim_state(running, victim);
    let keep = pipeline.keep_checkpoints;
    let started = Instant::now();
    let organization = on_member(&members[victim], move |member| {
        let last = height.checked_sub(1).ok_or_else(|| RunError::Io("nothing executed yet".to_string()))?;
        member.checkpoint(last, keep)?;
        Ok(member.organization.name().to_string())
    })
    .await?;
    let checkpoint_seconds = started.elapsed().as_secs_f64();

    let running_clients = Clients::start(config, running, pipeline, keys, point, skew, clients);
    tokio::time::sleep(config.warmup.max(Duration::from_secs(1))).await;
    let warm = running_clients.answered();
    let warm_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = running_clients.answered();
    let tps_before = (before.answered - warm.answered) as f64 / warm_at.elapsed().as_secs_f64();
    let (recovered_before, attempts_before, tampered_height) = victim_state(running, victim);
    let tampered_at = Instant::now();
    on_member(&members[victim], |member| Ok(member.organization.run_outside_chain(TAMPER_SQL)?)).await?;
    let (recovered_after, attempts_after) = loop {
        let (recovered, attempts, _) = victim_state(running, victim);
        if recovered > recovered_before {
            break (recovered, attempts);
        }
        if tampered_at.elapsed() > RECOVERY_LIMIT {
            running_clients.stop(running);
            return Err(RunError::Io(format!(
                "{organization} did not recover within {RECOVERY_LIMIT:?} of the tampering"
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let recovered_seconds = tampered_at.elapsed().as_secs_f64();
    let during = running_clients.answered();
    running_clients.stop(running);
    drain(running, Duration::from_secs(600)).await?;
    tracing::info!(%organization, recoveries = recovered_after - recovered_before, "recovered after tampering");
    Ok(RecoveryPoint {
        organization,
        clients,
        checkpoint_seconds,
        recovered_seconds,
        attempts: attempts_after - attempts_before,
        blocks_since_checkpoint: tampered_height.saturating_sub(height),
        tps_before,
        tps_while_recovering: (during.answered - before.answered) as f64 / recovered_seconds.max(1e-9),
    })
}
