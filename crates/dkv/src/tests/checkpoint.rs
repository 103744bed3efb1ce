//! Checkpoints of a data node's log: every `checkpoint_every` records the node writes every
//! shard's state as records, the log drops the segments before them, and a node reopened
//! from what is left (the checkpoint and the tail) holds what it held before.

use bytes::Bytes;
use virga_core::device::MemStorage;
use virga_net::role::{CallId, Command, Event, IoExecutor, Role, TimerId};
use virga_storage::{Timestamp, VersionedStore};

use super::resync::{map, roles, T0};
use crate::messages::{LeaseRequest, Replicate, Request};
use crate::shard::{open_data_node, DataConfig, DataCore, DataDisk, ShardRecord, TxnStatus, WriteOp};

fn config(node: &str) -> DataConfig {
    let mut config = DataConfig::new(node, map());
    config.checkpoint_every = 20;
    config.log_segment_bytes = 1 << 10;
    config
}

/// Steps `event` with the node's own disk; returns its check timer, if it armed one.
fn step(
    core: &mut DataCore,
    disk: &mut DataDisk,
    event: Event<crate::Dkv, crate::shard::DataIoDone, ()>,
) -> Option<TimerId> {
    let mut pending = vec![event];
    let mut check = None;
    while let Some(event) = pending.pop() {
        let mut out = Vec::new();
        core.step(T0, event, &mut out);
        for command in out {
            match command {
                Command::Io { io, op } => pending.push(Event::IoDone { io, result: disk.execute(op) }),
                Command::SetTimer { timer, .. } => check = Some(timer),
                _ => {}
            }
        }
    }
    check
}

fn txn(seq: u32) -> u64 {
    crate::shard::txn_id(1, seq)
}

fn key(seq: u32) -> Bytes {
    Bytes::from(format!("k{}", seq % 7))
}

fn replicate(core: &mut DataCore, disk: &mut DataDisk, primary: &str, record: ShardRecord) {
    let request = Request::Replicate(Replicate { shard: 0, epoch: 1, record });
    step(core, disk, Event::Request { from: primary.to_string(), call: CallId(3), request });
}

/// What a reopened node must still hold: each transaction's status and each key's newest
/// value.
fn state(core: &DataCore) -> (Vec<Option<TxnStatus>>, Vec<Option<Bytes>>) {
    let replica = core.replica(0).expect("shard 0");
    let statuses = (1..=60).map(|seq| replica.status(txn(seq))).collect();
    let store = replica.store();
    let values = (0..7)
        .map(|index| {
            let key = Bytes::from(format!("k{index}"));
            store.find(&key).and_then(|entry| store.read_at(&entry, Timestamp::MAX).visible).and_then(|v| v.value)
        })
        .collect();
    (statuses, values)
}

#[test]
fn a_node_reopened_from_its_checkpoint_and_tail_holds_what_it_held() {
    let (primary, backups) = roles();
    let storage = MemStorage::new();
    let (mut core, mut disk) = open_data_node(config(&backups[0]), &storage).unwrap();
    let mut check = step(&mut core, &mut disk, Event::Start).expect("the check is armed");
    for seq in 1..=60 {
        let commit_ts = Timestamp::new(T0 - 10_000 + u64::from(seq), 1);
        let write = WriteOp { key: key(seq), value: Some(Bytes::from(format!("v{seq}"))) };
        let prepared = ShardRecord::Prepared {
            txn: txn(seq),
            commit_ts,
            writes: vec![write],
            participants: vec![0],
            takeover_of: vec![],
        };
        replicate(&mut core, &mut disk, &primary, prepared);
        // The last ten stay prepared; of the others, every fifth aborts.
        if seq <= 50 {
            replicate(&mut core, &mut disk, &primary, ShardRecord::Decided { txn: txn(seq), commit: seq % 5 != 0 });
        }
        if seq == 30 {
            // The primary says the first thirty settled.
            let lease = LeaseRequest {
                shard: 0,
                epoch: 1,
                until: Timestamp::new(T0, 0),
                watermark: Timestamp::new(T0 - 10_000 + 31, 0),
                settled: Timestamp::new(T0 - 10_000 + 31, 0),
            };
            step(
                &mut core,
                &mut disk,
                Event::Request { from: primary.clone(), call: CallId(4), request: Request::Lease(lease) },
            );
        }
        if seq % 10 == 0 {
            check = step(&mut core, &mut disk, Event::Timer(check)).expect("armed again");
        }
    }
    let before = state(&core);
    assert!(core.stats().checkpoints >= 4, "{} checkpoints", core.stats().checkpoints);
    assert_eq!(core.replica(0).unwrap().settled_entries(), 30);
    let segments = disk.segments();
    assert!(segments <= 4, "{segments} segments left after truncation");
    drop((core, disk));

    let (reopened, _) = open_data_node(config(&backups[0]), &storage).unwrap();
    assert_eq!(state(&reopened), before, "the checkpoint and the tail rebuild the node");
    assert_eq!(reopened.replica(0).unwrap().prepared_count(), 10);
    assert_eq!(reopened.replica(0).unwrap().settled_entries(), 30, "settled ids come back as settled");
    // The logged lease ceiling, at or above the grant.
    assert!(reopened.replica(0).unwrap().lease_granted() >= Timestamp::new(T0, 0));
}
