//! A simulated application that runs its work through a client's interactive sessions
//! instead of as programs: each transfer, audit or scan becomes Begin, its reads (all issued
//! before any answer, so one transaction has several gets in flight), its writes, and
//! Commit, one operation answered at a time through a [`Reply`].
//!
//! Replies land in an inbox the driver drains after every step of the client, answering
//! each with the next operations, stepped into the client at the same instant; a reply the
//! client gives inside that step (a begin, a buffered write, a read it already holds) is
//! drained by the same loop. Everything stays on the simulator's thread, so a seed replays
//! exactly.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::Dkv;
use bytes::Bytes;
use virga_net::role::{Command, Event, Nanos, Role, TimerId};
use virga_storage::TxnId;

use crate::client::{
    ClientInput, Program, ProgramOutcome, ProgramResult, Reply, SessionError, SessionOp, SessionReply, SessionRequest,
    SessionResult, TxnClient,
};

/// Session transactions the driver keeps open at once.
const SESSIONS_IN_FLIGHT: usize = 2;
/// Begins of one piece of work before its abort is final (as a program's attempts).
const MAX_ATTEMPTS: u32 = 20;
/// Pause before an aborted transaction begins again, times its attempts so far (up to 10).
const RERUN_AFTER: Duration = Duration::from_millis(2);
/// The driver's timers are numbered from here, far above any the client gives out.
const FIRST_TIMER: u64 = 1 << 62;

type Out = Vec<Command<Dkv, std::convert::Infallible>>;

/// Which operation of which attempt a reply answers.
#[derive(Debug, Clone)]
struct Tag {
    slot: usize,
    /// The attempt's serial: replies to an earlier attempt (a second get failed with the
    /// first, say) are ignored.
    serial: u64,
    op: Sent,
}

#[derive(Debug, Clone)]
enum Sent {
    Begin,
    Get(Bytes),
    Scan(usize),
    Write,
    Commit,
}

type Inbox = Arc<Mutex<VecDeque<(Tag, SessionResult)>>>;

#[derive(Debug, PartialEq, Eq)]
enum Stage {
    /// Aborted; begins again when the timer fires.
    Waiting,
    Beginning,
    Reading,
    Writing,
    Committing,
}

/// One piece of work in progress.
struct Job {
    program: Program,
    attempt: u32,
    serial: u64,
    stage: Stage,
    txn: Option<TxnId>,
    reads: BTreeMap<Bytes, Option<Bytes>>,
    scans: Vec<Option<Vec<(Bytes, Bytes)>>>,
    /// Operations of the current stage not answered yet.
    pending: usize,
}

/// How the driver's work ended, beyond the results of committed and abandoned work.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionCounts {
    pub committed: u64,
    /// Work whose every attempt aborted.
    pub gave_up: u64,
    pub unavailable: u64,
    pub stale_map: u64,
    /// Commits whose outcome the client could not learn (they may have committed).
    pub outcome_unknown: u64,
    /// Aborted attempts, each begun again or given up.
    pub aborted_attempts: u64,
}

/// The application side of a session client.
pub struct SessionDriver {
    work: VecDeque<Program>,
    slots: Vec<Option<Job>>,
    inbox: Inbox,
    next_serial: u64,
    next_timer: u64,
    timers: BTreeMap<TimerId, usize>,
    results: Vec<ProgramResult>,
    counts: SessionCounts,
    /// Answers no honest client gives to what the driver asked (wrong kind, refusals).
    errors: Vec<String>,
}

impl Default for SessionDriver {
    fn default() -> SessionDriver {
        SessionDriver {
            work: VecDeque::new(),
            slots: (0..SESSIONS_IN_FLIGHT).map(|_| None).collect(),
            inbox: Inbox::default(),
            next_serial: 0,
            next_timer: FIRST_TIMER,
            timers: BTreeMap::new(),
            results: Vec::new(),
            counts: SessionCounts::default(),
            errors: Vec::new(),
        }
    }
}

impl SessionDriver {
    /// Committed work (with what it read) and work that gave up, in the order it ended.
    pub fn results(&self) -> &[ProgramResult] {
        &self.results
    }

    pub fn counts(&self) -> &SessionCounts {
        &self.counts
    }

    pub fn errors(&self) -> &[String] {
        &self.errors
    }

    /// Work given and not finished (queued, running, or waiting to begin again).
    pub fn remaining(&self) -> usize {
        self.work.len() + self.slots.iter().flatten().count()
    }

    /// Work that ended, however.
    pub fn finished(&self) -> u64 {
        let counts = &self.counts;
        counts.committed + counts.gave_up + counts.unavailable + counts.stale_map + counts.outcome_unknown
    }

    /// Starts what can start and answers every reply with the next operations, until the
    /// client has nothing more to say.
    fn pump(&mut self, client: &mut TxnClient, now: Nanos, out: &mut Out) {
        loop {
            while let Some(slot) = self.slots.iter().position(Option::is_none) {
                let Some(program) = self.work.pop_front() else { break };
                let serial = self.serial();
                let job = Job {
                    program,
                    attempt: 1,
                    serial,
                    stage: Stage::Beginning,
                    txn: None,
                    reads: BTreeMap::new(),
                    scans: Vec::new(),
                    pending: 0,
                };
                let at = job.program.snapshot_at();
                self.slots[slot] = Some(job);
                self.send(client, now, out, (slot, serial, Sent::Begin), SessionOp::Begin { at });
            }
            let replies: Vec<(Tag, SessionResult)> =
                self.inbox.lock().unwrap_or_else(PoisonError::into_inner).drain(..).collect();
            if replies.is_empty() {
                return;
            }
            for (tag, result) in replies {
                self.on_reply(client, now, out, tag, result);
            }
        }
    }

    fn serial(&mut self) -> u64 {
        self.next_serial += 1;
        self.next_serial
    }

    fn send(&mut self, client: &mut TxnClient, now: Nanos, out: &mut Out, tag: (usize, u64, Sent), op: SessionOp) {
        let (slot, serial, op_sent) = tag;
        let tag = Tag { slot, serial, op: op_sent };
        let inbox = Arc::clone(&self.inbox);
        let reply = Reply::new(move |result| {
            inbox.lock().unwrap_or_else(PoisonError::into_inner).push_back((tag, result));
        });
        client.step(now, Event::Input(ClientInput::Session(SessionRequest { op, reply })), out);
    }

    fn on_reply(&mut self, client: &mut TxnClient, now: Nanos, out: &mut Out, tag: Tag, result: SessionResult) {
        let Some(job) = self.slots[tag.slot].as_mut().filter(|job| job.serial == tag.serial) else { return };
        match (tag.op, result) {
            (Sent::Begin, Ok(SessionReply::Began { txn, .. })) if job.stage == Stage::Beginning => {
                job.txn = Some(txn);
                job.stage = Stage::Reading;
                let keys = job.program.read_keys();
                let scans = job.program.scans();
                job.scans = vec![None; scans.len()];
                job.pending = keys.len() + scans.len();
                if job.pending == 0 {
                    return self.reads_done(client, now, out, tag.slot);
                }
                let serial = job.serial;
                for key in keys {
                    let op = SessionOp::Get { txn, key: key.clone() };
                    self.send(client, now, out, (tag.slot, serial, Sent::Get(key)), op);
                }
                for (index, (start, end, limit)) in scans.into_iter().enumerate() {
                    let op = SessionOp::Scan { txn, start, end, limit };
                    self.send(client, now, out, (tag.slot, serial, Sent::Scan(index)), op);
                }
            }
            (Sent::Get(key), Ok(SessionReply::Value(value))) if job.stage == Stage::Reading => {
                job.reads.insert(key, value);
                job.pending -= 1;
                if job.pending == 0 {
                    self.reads_done(client, now, out, tag.slot);
                }
            }
            (Sent::Scan(index), Ok(SessionReply::Rows(rows))) if job.stage == Stage::Reading => {
                job.scans[index] = Some(rows);
                job.pending -= 1;
                if job.pending == 0 {
                    self.reads_done(client, now, out, tag.slot);
                }
            }
            (Sent::Write, Ok(SessionReply::Done)) if job.stage == Stage::Writing => {
                job.pending -= 1;
                if job.pending == 0 {
                    self.commit(client, now, out, tag.slot);
                }
            }
            (Sent::Commit, Ok(SessionReply::Committed { commit_ts, read_only })) if job.stage == Stage::Committing => {
                let txn = job.txn.unwrap_or_default();
                let result = ProgramResult {
                    outcome: ProgramOutcome::Committed { txn, commit_ts, read_only },
                    reads: std::mem::take(&mut job.reads).into_iter().collect(),
                    scans: std::mem::take(&mut job.scans).into_iter().flatten().collect(),
                    attempts: job.attempt,
                };
                self.results.push(result);
                self.counts.committed += 1;
                self.slots[tag.slot] = None;
            }
            (_, Err(SessionError::Aborted { reason })) => self.aborted(out, tag.slot, reason),
            (_, Err(SessionError::Unavailable { .. })) => {
                self.counts.unavailable += 1;
                self.slots[tag.slot] = None;
            }
            (_, Err(SessionError::StaleMap { .. })) => {
                self.counts.stale_map += 1;
                self.slots[tag.slot] = None;
            }
            (_, Err(SessionError::OutcomeUnknown { .. })) => {
                self.counts.outcome_unknown += 1;
                self.slots[tag.slot] = None;
            }
            (op, answer) => {
                let txn = job.txn;
                self.errors.push(format!("{op:?} of transaction {txn:x?} at {:?} was answered {answer:?}", job.stage));
                self.slots[tag.slot] = None;
                // The work is dropped; its transaction, if still open, must not linger.
                if let Some(txn) = txn {
                    let serial = self.serial();
                    self.send(client, now, out, (tag.slot, serial, Sent::Write), SessionOp::Abort { txn });
                }
            }
        }
    }

    /// Every read is in: write what the program writes from them, or commit at once.
    fn reads_done(&mut self, client: &mut TxnClient, now: Nanos, out: &mut Out, slot: usize) {
        let Some(job) = self.slots[slot].as_mut() else { return };
        let Some(txn) = job.txn else { return };
        let writes = job.program.writes(&job.reads);
        if writes.is_empty() {
            return self.commit(client, now, out, slot);
        }
        job.stage = Stage::Writing;
        job.pending = writes.len();
        let serial = job.serial;
        for (key, value) in writes {
            let op = match value {
                Some(value) => SessionOp::Put { txn, key, value },
                None => SessionOp::Delete { txn, key },
            };
            self.send(client, now, out, (slot, serial, Sent::Write), op);
        }
    }

    fn commit(&mut self, client: &mut TxnClient, now: Nanos, out: &mut Out, slot: usize) {
        let Some(job) = self.slots[slot].as_mut() else { return };
        let Some(txn) = job.txn else { return };
        job.stage = Stage::Committing;
        let serial = job.serial;
        self.send(client, now, out, (slot, serial, Sent::Commit), SessionOp::Commit { txn });
    }

    /// The attempt aborted: begin again after a pause, or give up after the last attempt.
    fn aborted(&mut self, out: &mut Out, slot: usize, reason: String) {
        self.counts.aborted_attempts += 1;
        let Some(job) = self.slots[slot].as_mut() else { return };
        if job.attempt >= MAX_ATTEMPTS {
            self.results.push(ProgramResult {
                outcome: ProgramOutcome::Aborted { reason },
                reads: Vec::new(),
                scans: Vec::new(),
                attempts: job.attempt,
            });
            self.counts.gave_up += 1;
            self.slots[slot] = None;
            return;
        }
        // A new serial at once: the failed attempt's other operations answer too.
        self.next_serial += 1;
        job.serial = self.next_serial;
        job.stage = Stage::Waiting;
        let timer = TimerId(self.next_timer);
        self.next_timer += 1;
        self.timers.insert(timer, slot);
        out.push(Command::SetTimer { timer, after: RERUN_AFTER * job.attempt.min(10) });
    }

    fn on_timer(&mut self, client: &mut TxnClient, now: Nanos, out: &mut Out, timer: TimerId) {
        let Some(slot) = self.timers.remove(&timer) else { return };
        let Some(job) = self.slots[slot].as_mut().filter(|job| job.stage == Stage::Waiting) else { return };
        job.attempt += 1;
        job.stage = Stage::Beginning;
        job.txn = None;
        job.reads.clear();
        job.scans.clear();
        job.pending = 0;
        let (serial, at) = (job.serial, job.program.snapshot_at());
        self.send(client, now, out, (slot, serial, Sent::Begin), SessionOp::Begin { at });
    }
}

/// A transaction client whose work runs as interactive sessions.
pub struct SessionClient {
    pub client: TxnClient,
    pub driver: SessionDriver,
}

impl SessionClient {
    pub fn new(client: TxnClient) -> SessionClient {
        SessionClient { client, driver: SessionDriver::default() }
    }

    /// The driver's work left plus the client's open transactions and decisions.
    pub fn outstanding(&self) -> usize {
        self.driver.remaining() + self.client.outstanding()
    }
}

impl Role for SessionClient {
    type Protocol = Dkv;
    type Io = std::convert::Infallible;
    type IoDone = std::convert::Infallible;
    type Input = ClientInput;

    /// Steps the client (or the driver, for its own timers and for work, which arrives as
    /// programs to run as sessions), then lets the driver answer what came back.
    fn step(&mut self, now: Nanos, event: Event<Dkv, std::convert::Infallible, ClientInput>, out: &mut Out) {
        match event {
            Event::Timer(timer) if self.driver.timers.contains_key(&timer) => {
                self.driver.on_timer(&mut self.client, now, out, timer)
            }
            Event::Input(ClientInput::Programs(programs)) => self.driver.work.extend(programs),
            event => self.client.step(now, event, out),
        }
        self.driver.pump(&mut self.client, now, out);
    }
}
