//! A backup collects what its primary collects: the lease requests carry the shard's
//! watermark, and the backup's next full pass drops the versions no read at or above it
//! sees.

use bytes::Bytes;
use virga_net::role::{CallId, Event};
use virga_storage::{Timestamp, VersionedStore};

use super::resync::{check_timer, map, roles, step, T0};
use crate::messages::{LeaseRequest, Request, Response};
use crate::shard::{DataConfig, DataCore, ShardRecord, WriteOp};

/// Transaction `seq` of client 1, committing `k` at `at`.
fn committed(seq: u32, at: u64) -> Vec<(u32, ShardRecord)> {
    let txn = crate::shard::replica::txn_id(1, seq);
    let value = Bytes::from(format!("v{seq}"));
    let prepared = ShardRecord::Prepared {
        txn,
        commit_ts: Timestamp::new(at, 1),
        writes: vec![WriteOp { key: Bytes::from_static(b"k"), value: Some(value) }],
        participants: vec![0],
        takeover_of: vec![],
    };
    vec![(0, prepared), (0, ShardRecord::Decided { txn, commit: true })]
}

fn versions_of_k(core: &DataCore) -> usize {
    let store = core.replica(0).expect("the backup holds shard 0").store();
    let entry = store.find(b"k").expect("k was written");
    let mut count = 0;
    let mut at = Some(Timestamp::MAX);
    while let Some(ts) = at {
        let Some(version) = store.read_at(&entry, ts).visible else { break };
        count += 1;
        at = version.ts.time.checked_sub(1).map(|time| Timestamp::new(time, u32::MAX));
    }
    count
}

#[test]
fn a_backup_collects_below_the_watermark_its_primary_sends() {
    let (primary, backups) = roles();
    let records = [committed(1, T0 - 3_000), committed(2, T0 - 2_000), committed(3, T0 - 1_000)].concat();
    let mut backup = DataCore::new(DataConfig::new(backups[0].clone(), map()), records);
    let started = step(&mut backup, Event::Start);
    assert_eq!(versions_of_k(&backup), 3, "nothing collected before the primary says so");
    let lease = LeaseRequest {
        shard: 0,
        epoch: 1,
        until: Timestamp::new(T0 + 1_000, 0),
        watermark: Timestamp::new(T0 - 1_500, 0),
        settled: Timestamp::ZERO,
    };
    let granted = step(&mut backup, Event::Request { from: primary, call: CallId(5), request: Request::Lease(lease) });
    let grant = granted.iter().find_map(|command| match command {
        virga_net::role::Command::Reply { response, .. } => Some(response.clone()),
        _ => None,
    });
    assert_eq!(grant, Some(Response::Grant(lease.until)));
    assert_eq!(backup.replica(0).map(|replica| replica.watermark()), Some(lease.watermark));
    step(&mut backup, Event::Timer(check_timer(&started).expect("the check is armed")));
    // Kept: the version read at the watermark (v2, at T0 - 2000) and the newer one.
    assert_eq!(versions_of_k(&backup), 2);
    assert!(backup.stats().versions_collected >= 1);
}
