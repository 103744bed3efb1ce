//! KAIROS's validator leases at a shard primary: how the primaries take over a failed
//! validator's part of read-write transactions without ever letting a write under a read the
//! validator vouched for alone.
//!
//! A validator votes commit only below the lease every shard primary granted it. A
//! read-write transaction that passes over a validator (it did not answer, or had no lease)
//! is validated here in its place only at a commit timestamp above the lease this primary
//! granted that validator: every read the validator raised lies below its lease, so the write
//! lands above all of them. A transaction under the lease aborts (with the floor its retry
//! must pass) and revokes the lease for a while (renewals are refused), so a validator that
//! is alive but cut off from its clients stops voting and the retry passes once the lease
//! has run out. When the validator renews, it learns
//! the highest commit timestamp that passed over it here (kept in the shard's records, so a
//! later primary knows it too) and raises its floor there before it votes again: it never
//! vouches for a version that such a write superseded.
//!
//! The grants are volatile. A primary that (re)starts or takes over a shard assumes every
//! validator holds a lease up to its clock plus twice the longest grant, which covers what a
//! predecessor granted as long as the servers' clocks agree within the longest grant.

use std::collections::HashMap;

use crate::messages::{RefusalKind, Response, ValidatorGrant, ValidatorLease};
use virga_net::role::Nanos;
use virga_storage::Timestamp;

use super::DataCore;
use crate::shard::wire;

/// The grants of one primary, by (shard, validator).
#[derive(Debug, Default)]
pub(super) struct ValidatorLeases {
    /// The end of the lease each validator may hold (granted here, or assumed).
    granted: HashMap<(u32, u32), Nanos>,
    /// Per shard, the lease every validator is assumed to hold since this node led it.
    assumed: HashMap<u32, Nanos>,
    /// Renewals are refused until then: a transaction passing over the validator was refused
    /// under its lease.
    revoked_until: HashMap<(u32, u32), Nanos>,
}

impl ValidatorLeases {
    fn lease_end(&self, shard: u32, validator: u32) -> Nanos {
        let granted = self.granted.get(&(shard, validator)).copied().unwrap_or(0);
        granted.max(self.assumed.get(&shard).copied().unwrap_or(0))
    }
}

impl DataCore {
    /// This node begins leading `shard`: it assumes the leases a predecessor may have granted.
    pub(super) fn assume_validator_leases(&mut self, shard: u32) {
        let assumed = self.now.saturating_add(2 * self.config.validator_lease.as_nanos() as u64);
        self.validator_leases.assumed.insert(shard, assumed);
        self.validator_leases.granted.retain(|(led, _), _| *led != shard);
    }

    /// A validator's lease request: granted up to what it asks, at most the longest grant
    /// past this clock, unless a transaction passed over it lately.
    pub(super) fn on_validator_lease(&mut self, request: ValidatorLease) -> Response {
        if request.validator >= wire::MAX_VALIDATORS {
            return Response::refused(
                RefusalKind::Invalid,
                format!(
                    "validator {} is out of range (at most {} validators)",
                    request.validator,
                    wire::MAX_VALIDATORS
                ),
            );
        }
        if let Err(refusal) = self.primary_of(request.shard, request.epoch) {
            return refusal;
        }
        let Some(replica) = self.replicas.get(&request.shard) else {
            return Response::refused(RefusalKind::NotServing, format!("no replica of shard {}", request.shard));
        };
        let takeover_high = replica.takeover_high(request.validator);
        let key = (request.shard, request.validator);
        let leases = &mut self.validator_leases;
        if leases.revoked_until.get(&key).is_some_and(|until| *until > self.now) {
            self.stats.validator_lease_refusals += 1;
            return Response::ValidatorGrant(ValidatorGrant { until_ns: 0, takeover_high });
        }
        let longest = self.now.saturating_add(self.config.validator_lease.as_nanos() as u64);
        let until = request.until_ns.min(longest);
        let granted = leases.granted.entry(key).or_default();
        *granted = (*granted).max(until);
        Response::ValidatorGrant(ValidatorGrant { until_ns: until, takeover_high })
    }

    /// A read-write transaction validated here in place of `validators`: allowed only above
    /// the lease each may hold (Err: the floor a retry's commit timestamp must pass). One
    /// under a lease also revokes it for a while, so that a validator alive but cut off from
    /// its clients stops renewing and the retry passes once the lease ran out. (Revoking on
    /// every takeover would keep a validator its clients pass over revoked for good.)
    pub(super) fn check_takeover(
        &mut self,
        shard: u32,
        validators: &[u32],
        commit_ts: Timestamp,
    ) -> Result<(), Timestamp> {
        let floor =
            validators.iter().map(|validator| self.validator_leases.lease_end(shard, *validator)).max().unwrap_or(0);
        if crate::shard::replica::weakened!(self.config.weakened, skip_validator_lease) || commit_ts.time > floor {
            self.stats.validator_takeovers += 1;
            return Ok(());
        }
        let revoke_until = self.now.saturating_add(self.config.validator_revoke_for.as_nanos() as u64);
        for validator in validators {
            self.validator_leases.revoked_until.insert((shard, *validator), revoke_until);
        }
        Err(Timestamp::new(floor, u32::MAX))
    }
}
