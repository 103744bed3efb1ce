//! The calibration's probes of the machine and the transports: prost and keccak per byte and
//! node, a call over the in-process and the gRPC transport, the CPU model, and the share of
//! the cores a busy process gets.

use crate::messages::{BlockId, HeadReply};
use crate::protocol::{Rainblock, Request, Response};
use alloy_primitives::{keccak256, B256};
use std::sync::Arc;
use std::time::Instant;
use virga_ledger::tx::{RecoveredTx, SignedTx};
use virga_net::role::Protocol;
use virga_net::WireProtocol;
use virga_net::{Handler, Transport};

use crate::testkit::Fixture;
use crate::topology::Topology;
use crate::workload::{sign_transfers, Mix};

use super::calibrate::{median, setup_error, step_error, CalibrationError};
use super::rig::micros;

/// The codec's encoding and decoding of `messages` (conversion and protobuf): nanoseconds
/// per byte (medians over messages).
pub(super) fn codec_ns_per_byte(messages: &[Request]) -> (f64, f64) {
    let (mut encode, mut decode) = (Vec::new(), Vec::new());
    for message in messages {
        let bytes = Rainblock::request_bytes(message).max(1) as f64;
        let rounds = 8;
        let started = Instant::now();
        let mut encoded = Vec::new();
        for _ in 0..rounds {
            encoded = Rainblock::encode_request(message.clone());
        }
        encode.push(started.elapsed().as_secs_f64() * 1e9 / rounds as f64 / bytes);
        let started = Instant::now();
        for _ in 0..rounds {
            let _ = std::hint::black_box(Rainblock::decode_request(encoded.as_slice()));
        }
        decode.push(started.elapsed().as_secs_f64() * 1e9 / rounds as f64 / bytes);
    }
    (median(&encode), median(&decode))
}

pub(super) fn keccak_ns_per_node(nodes: &[Vec<u8>]) -> f64 {
    if nodes.is_empty() {
        return 0.0;
    }
    let mut times = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        for node in nodes {
            std::hint::black_box(keccak256(node));
        }
        times.push(started.elapsed().as_secs_f64() * 1e9 / nodes.len() as f64);
    }
    median(&times)
}

/// Answers every request at once with a small fixed response.
struct Echo;

impl Handler<Rainblock> for Echo {
    fn handle(&self, _from: String, _request: Request) -> virga_net::BoxFuture<Response> {
        let head = HeadReply { head: BlockId::new(1, B256::ZERO), state_root: B256::ZERO };
        Box::pin(std::future::ready(Response::Head(head)))
    }
}

/// Median microseconds of one call over `transport` with `request`, one call at a time.
#[cfg(feature = "grpc")]
async fn time_calls(
    transport: &dyn Transport<Rainblock>,
    request: &Request,
    calls: usize,
) -> Result<f64, virga_net::NetError> {
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        transport.call("client-0", "echo-0", request.clone()).await?;
        times.push(micros(started));
    }
    Ok(median(&times))
}

/// A handler that hands each request to a driver task, as `virga_net::driver::Mailbox` does.
struct MailboxEcho {
    sender: tokio::sync::mpsc::UnboundedSender<tokio::sync::oneshot::Sender<Response>>,
}

impl Handler<Rainblock> for MailboxEcho {
    fn handle(&self, _from: String, _request: Request) -> virga_net::BoxFuture<Response> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let sent = self.sender.send(reply);
        Box::pin(async move {
            if sent.is_err() {
                return crate::protocol::refusal("the driver stopped");
            }
            answer.await.unwrap_or_else(|_| crate::protocol::refusal("the driver dropped the call"))
        })
    }
}

pub(super) fn inproc_call_us(small: &Request) -> Result<f64, CalibrationError> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().map_err(setup_error)?;
    runtime.block_on(async {
        let (sender, mut inbox) = tokio::sync::mpsc::unbounded_channel::<tokio::sync::oneshot::Sender<Response>>();
        tokio::spawn(async move {
            while let Some(reply) = inbox.recv().await {
                let _ = reply.send(Echo.handle(String::new(), Request::Head).await);
            }
        });
        let transport = virga_net::InProc::new();
        transport.register("echo-0", Arc::new(MailboxEcho { sender }));
        let transport: Arc<dyn Transport<Rainblock>> = transport;
        let mut times = Vec::new();
        for _ in 0..2_000 {
            let (transport, request) = (Arc::clone(&transport), small.clone());
            let started = Instant::now();
            let call = tokio::spawn(async move { transport.call("client-0", "echo-0", request).await });
            match call.await {
                Ok(Ok(_)) => times.push(micros(started)),
                Ok(Err(error)) => return Err(step_error("in-process calls")(error.to_string())),
                Err(error) => return Err(step_error("in-process calls")(error.to_string())),
            }
        }
        Ok(median(&times))
    })
}

/// gRPC on loopback: microseconds per call (small request) and nanoseconds per request byte
/// (the large request's extra time over its extra bytes).
#[cfg(feature = "grpc")]
pub(super) fn grpc_costs(small: &Request, large: &Request) -> Result<(Option<f64>, Option<f64>), CalibrationError> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(setup_error)?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|error| setup_error(format!("binding the gRPC echo server: {error}")))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (address, server) =
            virga_net::serve(listener, virga_net::Host::new().with::<Rainblock>(Arc::new(Echo)), async move {
                let _ = stopped.await;
            })
            .map_err(setup_error)?;
        tokio::spawn(server);
        let transport = virga_net::Grpc::new(std::collections::HashMap::from([(
            "echo-0".to_string(),
            format!("http://{address}"),
        )]));
        // The first call connects.
        time_calls(&*transport, small, 5).await.map_err(step_error("gRPC calls"))?;
        let small_us = time_calls(&*transport, small, 400).await.map_err(step_error("gRPC calls"))?;
        let large_us = time_calls(&*transport, large, 100).await.map_err(step_error("gRPC calls"))?;
        let _ = stop.send(());
        let extra_bytes = Rainblock::request_bytes(large).saturating_sub(Rainblock::request_bytes(small)).max(1) as f64;
        let per_byte = ((large_us - small_us) * 1e3 / extra_bytes).max(0.0);
        Ok((Some(small_us), Some(per_byte)))
    })
}

#[cfg(not(feature = "grpc"))]
pub(super) fn grpc_costs(_: &Request, _: &Request) -> Result<(Option<f64>, Option<f64>), CalibrationError> {
    Ok((None, None))
}

/// The CPU model (`model name` in /proc/cpuinfo) and the cores offered to this process.
pub fn machine_description() -> (String, usize) {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string());
    let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get());
    (model, cores)
}

/// Cores' worth of CPU this process gets with `threads` busy threads (signature recovery,
/// Virga's heaviest unit, in a loop) over about `seconds`: the process's CPU time over the
/// wall-clock time, from /proc/self/stat (ticks of 10 ms, so about 1% at a second).
/// `None` where /proc is not readable.
pub fn cpu_share(threads: usize, seconds: f64) -> Option<f64> {
    let fixture =
        Fixture::new(Topology { accounts: 8, storage_nodes: 4, max_block_transfers: 64, ..Topology::small() }).ok()?;
    let chain_id = fixture.config.exec.chain_id;
    let transfers: Vec<SignedTx> =
        sign_transfers(&fixture.accounts, 32, chain_id, Mix::default(), 3, &|_| {}).into_iter().map(|t| t.tx).collect();
    let threads = threads.max(1);
    let cpu_before = crate::cluster::process_cpu_seconds()?;
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while started.elapsed().as_secs_f64() < seconds {
                    for tx in &transfers {
                        let _ = std::hint::black_box(RecoveredTx::recover(tx.clone()));
                    }
                }
            });
        }
    });
    let wall = started.elapsed().as_secs_f64();
    let cpu = crate::cluster::process_cpu_seconds()? - cpu_before;
    Some((cpu / wall.max(1e-9)).clamp(0.01, threads as f64))
}
