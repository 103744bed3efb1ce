//! What the real driver, transports and disk cost on this machine, for [`super::StepCosts`]:
//! a call between two roles under the tokio driver (an echo role and a caller keeping many
//! calls in flight, on one worker thread, so the thread's time per call is its cost), in
//! process or over gRPC on loopback; and a group of log records appended and fsynced.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::messages::{Request, Response};
use crate::Dkv;
use tokio::sync::watch;
use virga_core::device::FileStorage;
use virga_log::{LogOptions, RecordLog, SyncPolicy};
use virga_net::driver::Mailbox;
use virga_net::role::{CallId, Command, Event, Nanos, NoIo, Role};
use virga_net::{Host, InProc, Transport};

/// Answers every request with an acknowledgement.
struct Echo;

impl Role for Echo {
    type Protocol = Dkv;
    type Io = std::convert::Infallible;
    type IoDone = std::convert::Infallible;
    type Input = ();

    fn step(&mut self, _: Nanos, event: Event<Dkv, Self::IoDone, ()>, out: &mut Vec<Command<Dkv, Self::Io>>) {
        if let Event::Request { from, call, .. } = event {
            let response = Response::Ack;
            out.push(Command::Reply { to: from, call, response });
        }
    }
}

/// Keeps `in_flight` calls to the echo role going, counting the answers.
struct Caller {
    in_flight: usize,
    next: u64,
    answered: u64,
}

impl Caller {
    fn call(&mut self, out: &mut Vec<Command<Dkv, std::convert::Infallible>>) {
        self.next += 1;
        let zero = virga_storage::Timestamp::ZERO;
        let request = Request::Watermark(crate::messages::Watermark { client: 1, ts: zero, freshness: zero });
        out.push(Command::Call {
            to: "echo".into(),
            call: CallId(self.next),
            request,
            deadline: Duration::from_secs(10),
        });
    }
}

impl Role for Caller {
    type Protocol = Dkv;
    type Io = std::convert::Infallible;
    type IoDone = std::convert::Infallible;
    type Input = ();

    fn step(&mut self, _: Nanos, event: Event<Dkv, Self::IoDone, ()>, out: &mut Vec<Command<Dkv, Self::Io>>) {
        match event {
            Event::Start => (0..self.in_flight).for_each(|_| self.call(out)),
            Event::Response { .. } => {
                self.answered += 1;
                self.call(out);
            }
            _ => {}
        }
    }
}

/// The nanoseconds one worker thread spends per call between two roles, over gRPC on
/// loopback or in process, measured for `duration`.
pub fn call_ns(grpc: bool, duration: Duration) -> std::io::Result<f64> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    runtime.block_on(async {
        let (stop, stopped) = watch::channel(false);
        let echo = Mailbox::<Echo>::new();
        let host = Host::new().with::<Dkv>(echo.handler());
        let transport: Arc<dyn Transport<Dkv>> = if grpc {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let mut server_stop = stopped.clone();
            let shutdown = async move {
                let _ = server_stop.wait_for(|stop| *stop).await;
            };
            let (address, server) = virga_net::serve(listener, host, shutdown)?;
            tokio::spawn(server);
            virga_net::Grpc::new([("echo".to_string(), format!("http://{address}"))].into())
        } else {
            let inproc = InProc::new();
            inproc.register_host("echo", host);
            inproc
        };
        let echo = echo.run("echo", Echo, Arc::clone(&transport), NoIo, stopped.clone());
        let caller = Caller { in_flight: 64, next: 0, answered: 0 };
        let caller = Mailbox::<Caller>::new().run("caller", caller, transport, NoIo, stopped);
        // A warm-up, then the measured stretch.
        tokio::time::sleep(duration / 4).await;
        let (before, started) = (caller.with_core(|caller| caller.answered), Instant::now());
        tokio::time::sleep(duration).await;
        let answered = caller.with_core(|caller| caller.answered) - before;
        let elapsed = started.elapsed();
        let _ = stop.send(true);
        caller.join().await;
        echo.join().await;
        Ok(elapsed.as_nanos() as f64 / answered.max(1) as f64)
    })
}

/// A group of `records` records of `bytes` bytes appended to a log on this machine's disk
/// and fsynced: (the wall time of one group, the CPU time of the thread that wrote it), the
/// medians of `groups` groups, in nanoseconds.
pub fn append_ns(dir: &std::path::Path, records: usize, bytes: usize, groups: usize) -> std::io::Result<(f64, f64)> {
    let storage = FileStorage::create_dir_all(dir)?;
    let options = LogOptions { sync: SyncPolicy::None, ..LogOptions::default() };
    let failed = |error: virga_log::LogError| std::io::Error::other(error.to_string());
    let storage: Arc<dyn virga_core::device::Storage> = Arc::new(storage);
    let (mut log, _) = RecordLog::open(storage, options).map_err(failed)?;
    let payload = vec![7u8; bytes];
    let (mut walls, mut cpus) = (Vec::new(), Vec::new());
    for _ in 0..groups {
        let (wall, cpu) = (Instant::now(), thread_cpu_ns());
        for _ in 0..records {
            log.append(&payload).map_err(failed)?;
        }
        log.sync().map_err(failed)?;
        walls.push(wall.elapsed().as_nanos() as f64);
        cpus.push(thread_cpu_ns().saturating_sub(cpu) as f64);
    }
    Ok((median(&mut walls), median(&mut cpus)))
}

fn thread_cpu_ns() -> u64 {
    let time = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}
