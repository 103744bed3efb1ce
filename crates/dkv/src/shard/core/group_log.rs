//! Group commit of a data node's log: the records of one step, and of every step while an
//! append is in flight, go to the device as one append; what each record was waiting for
//! happens once that append is durable. One append is in flight at a time, so the log's
//! order is the order records were handed in.

use virga_net::role::{CallId, Ids, IoId};
use virga_storage::Timestamp;

use super::replication::PendingKey;
use crate::messages::Response;
use crate::shard::replica::ShardRecord;
use crate::shard::wire;

/// What to do once a record is durable.
#[derive(Debug, PartialEq)]
pub(super) enum AfterLog {
    /// A record this primary replicates is durable here (one condition of its safety).
    LocalDurable(PendingKey),
    /// A request whose answer waited for the record.
    Reply { to: String, call: CallId, response: Response },
    /// A checkpoint's last record: the log behind it is dropped.
    Checkpointed,
    /// Nothing (a checkpoint's other records).
    Nothing,
    /// A backup's lease ceiling on `shard` is durable (grants under it need no write), and
    /// the grant that logged it is answered.
    LeaseGranted { shard: u32, ceiling: Timestamp, to: String, call: CallId, response: Response },
}

#[derive(Debug, Default)]
pub(super) struct GroupLog {
    /// Encoded records not yet handed to the device, each with what waits for it.
    waiting: Vec<(Vec<u8>, AfterLog)>,
    /// The append in flight, and what waits for its records.
    writing: Option<(IoId, Vec<AfterLog>)>,
    /// Where in `waiting` a checkpoint begins, if one waits.
    checkpoint_from: Option<usize>,
    /// Whether a checkpoint waits or is being written.
    checkpointing: bool,
    /// Records handed in since the last checkpoint was handed in.
    since_checkpoint: u64,
}

impl GroupLog {
    /// Queues `record` of `shard` for the next append.
    pub(super) fn push(&mut self, shard: u32, record: &ShardRecord, after: AfterLog) {
        self.waiting.push((wire::encode_log_record(shard, record), after));
        self.since_checkpoint += 1;
    }

    /// Whether a checkpoint is due: `every` records were handed in since the last one, and
    /// none is waiting or being written.
    pub(super) fn checkpoint_due(&self, every: u64) -> bool {
        !self.checkpointing && self.since_checkpoint >= every
    }

    /// Queues a checkpoint: `records` (per shard, the records that rebuild it) go to the
    /// device together after everything handed in before, and the log drops what precedes
    /// them once they are durable.
    pub(super) fn push_checkpoint(&mut self, records: Vec<(u32, ShardRecord)>) {
        self.checkpoint_from = Some(self.waiting.len());
        self.checkpointing = true;
        self.since_checkpoint = 0;
        let count = records.len();
        for (index, (shard, record)) in records.into_iter().enumerate() {
            let after = if index + 1 == count { AfterLog::Checkpointed } else { AfterLog::Nothing };
            self.waiting.push((wire::encode_log_record(shard, &record), after));
        }
    }

    /// The next append (its id, records, and where a checkpoint among them begins), unless
    /// one is in flight or nothing waits.
    pub(super) fn start(&mut self, ids: &mut Ids) -> Option<(IoId, Vec<Vec<u8>>, Option<usize>)> {
        if self.writing.is_some() || self.waiting.is_empty() {
            return None;
        }
        let (records, afters): (Vec<Vec<u8>>, Vec<AfterLog>) = std::mem::take(&mut self.waiting).into_iter().unzip();
        let io = ids.io();
        self.writing = Some((io, afters));
        Some((io, records, self.checkpoint_from.take()))
    }

    /// The append `io` completed: what waited for it (None: `io` is not the append in flight).
    pub(super) fn completed(&mut self, io: IoId) -> Option<Vec<AfterLog>> {
        match self.writing.take() {
            Some((writing, afters)) if writing == io => {
                if afters.contains(&AfterLog::Checkpointed) {
                    self.checkpointing = false;
                }
                Some(afters)
            }
            other => {
                self.writing = other;
                None
            }
        }
    }

    /// Appends waiting or in flight (one in flight counts one).
    pub(super) fn len(&self) -> usize {
        self.waiting.len() + usize::from(self.writing.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(call: u64) -> AfterLog {
        AfterLog::Reply { to: "client".into(), call: CallId(call), response: Response::Ack }
    }

    fn decided(txn: u64) -> ShardRecord {
        ShardRecord::Decided { txn, commit: true }
    }

    #[test]
    fn records_handed_in_while_an_append_is_in_flight_go_out_together_next() {
        let (mut log, mut ids) = (GroupLog::default(), Ids::default());
        log.push(0, &decided(1), reply(1));
        let (first, records, checkpoint) = log.start(&mut ids).expect("a record waits");
        assert_eq!(checkpoint, None);
        assert_eq!(records, vec![wire::encode_log_record(0, &decided(1))]);
        log.push(0, &decided(2), reply(2));
        log.push(1, &decided(3), reply(3));
        assert!(log.start(&mut ids).is_none(), "one append at a time");
        assert_eq!(log.len(), 3);
        assert_eq!(log.completed(first), Some(vec![reply(1)]));
        let (second, records, _) = log.start(&mut ids).expect("two records wait");
        assert_ne!(first, second);
        assert_eq!(records.len(), 2);
        assert_eq!(log.completed(second), Some(vec![reply(2), reply(3)]));
        assert_eq!(log.len(), 0);
        assert!(log.start(&mut ids).is_none(), "nothing waits");
    }

    #[test]
    fn a_completion_of_another_append_leaves_the_one_in_flight() {
        let (mut log, mut ids) = (GroupLog::default(), Ids::default());
        log.push(0, &decided(1), reply(1));
        let (io, _, _) = log.start(&mut ids).expect("a record waits");
        assert_eq!(log.completed(IoId(io.0 + 7)), None);
        assert_eq!(log.len(), 1);
        assert_eq!(log.completed(io), Some(vec![reply(1)]));
    }

    #[test]
    fn a_checkpoint_follows_what_was_handed_in_before_it_and_is_one_at_a_time() {
        let (mut log, mut ids) = (GroupLog::default(), Ids::default());
        log.push(0, &decided(1), reply(1));
        log.push(0, &decided(2), reply(2));
        assert!(log.checkpoint_due(2) && !log.checkpoint_due(3));
        log.push_checkpoint(vec![(0, decided(1)), (0, decided(2))]);
        assert!(!log.checkpoint_due(0), "one checkpoint at a time");
        log.push(1, &decided(3), reply(3));
        let (io, records, checkpoint) = log.start(&mut ids).expect("records wait");
        assert_eq!((records.len(), checkpoint), (5, Some(2)), "the checkpoint starts after the first two");
        let afters = log.completed(io).expect("the append in flight");
        assert_eq!(afters.iter().filter(|after| **after == AfterLog::Checkpointed).count(), 1);
        assert!(log.checkpoint_due(1), "written: the next may come");
    }
}
