//! The gRPC transport (tonic): one `Peer.Call` method per peer, the envelope in
//! `proto/virga.proto` naming the protocol, each protocol's message in its own encoding
//! ([`WireProtocol`]'s codec, run once each way).
//!
//! Calls to a peer are batched as R2 batches messages: at most [`Batching::max_in_flight`]
//! batch requests to a peer are being sent at once, and the calls that queue up meanwhile go
//! out together in the next one (`Peer.CallBatch`), their answers streamed back one by one
//! as they come. A lone call on an idle link goes out at once, as a batch of one.

use futures_util::stream::{FuturesUnordered, Stream};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};

use crate::envelope::peer_client::PeerClient;
use crate::envelope::peer_server::{Peer, PeerServer};
use crate::envelope::{reply, Batch, BatchReply, Envelope, Reply};
use crate::{BoxFuture, Host, MessageKind, NetError, NetStats, Transport, WireProtocol, MAX_MESSAGE_BYTES};

/// How calls to one peer are grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batching {
    /// Batch requests to one peer being sent at once (each held until its answers start
    /// coming: one round trip). More calls than this queue and go out together.
    pub max_in_flight: usize,
    /// Calls in one batch request.
    pub max_calls: usize,
}

impl Default for Batching {
    fn default() -> Self {
        Batching { max_in_flight: 1, max_calls: 256 }
    }
}

impl Batching {
    /// Every call its own request, as soon as it is made.
    pub const OFF: Batching = Batching { max_in_flight: usize::MAX, max_calls: 1 };
}

/// Largest batch a server accepts (a caller's [`Batching::max_calls`] above it is cut to it).
pub(crate) const MAX_BATCH_CALLS: usize = 4096;

/// How long a batch sender waits for a peer to start answering a batch.
const BATCH_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A call waiting for its batch.
struct Pending {
    envelope: Envelope,
    answer: oneshot::Sender<Result<Reply, NetError>>,
}

/// The calls queued for one peer, and the batch senders working on them.
#[derive(Default)]
struct Outbox {
    queued: Vec<Pending>,
    senders: usize,
}

type Outboxes = Arc<Mutex<HashMap<String, Outbox>>>;

/// Peers at gRPC addresses (`http://127.0.0.1:7001`), carrying every [`WireProtocol`] over
/// one connection per peer. Connections are made on first use and re-established after a
/// peer restarts.
#[derive(Default)]
pub struct Grpc {
    addresses: RwLock<HashMap<String, String>>,
    clients: RwLock<HashMap<String, PeerClient<Channel>>>,
    outboxes: Outboxes,
    batching: Batching,
    /// Mutual TLS to every peer (their addresses dialled as `https://`).
    tls: Option<crate::Tls>,
    sent: Arc<BatchCounters>,
    stats: Arc<NetStats>,
}

/// Batch requests sent and the calls they carried, over every peer.
#[derive(Debug, Default)]
pub struct BatchCounters {
    batches: std::sync::atomic::AtomicU64,
    calls: std::sync::atomic::AtomicU64,
}

impl BatchCounters {
    /// (batch requests, calls in them).
    pub fn get(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.batches.load(Relaxed), self.calls.load(Relaxed))
    }

    fn add(&self, calls: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.batches.fetch_add(1, Relaxed);
        self.calls.fetch_add(calls as u64, Relaxed);
    }
}

impl Grpc {
    pub fn new(addresses: HashMap<String, String>) -> Arc<Self> {
        Self::with_batching(addresses, Batching::default())
    }

    pub fn with_batching(addresses: HashMap<String, String>, batching: Batching) -> Arc<Self> {
        let batching = Batching {
            max_in_flight: batching.max_in_flight.max(1),
            max_calls: batching.max_calls.clamp(1, MAX_BATCH_CALLS),
        };
        Arc::new(Self { addresses: RwLock::new(addresses), batching, ..Self::default() })
    }

    /// Peers reached over mutual TLS with `tls` (each must serve with [`serve_tls`]).
    pub fn with_tls(addresses: HashMap<String, String>, tls: crate::Tls) -> Arc<Self> {
        let batching = Batching::default();
        Arc::new(Self { addresses: RwLock::new(addresses), batching, tls: Some(tls), ..Self::default() })
    }

    pub fn set_address(&self, peer: impl Into<String>, address: impl Into<String>) {
        let peer = peer.into();
        self.clients.write().remove(&peer);
        self.addresses.write().insert(peer, address.into());
    }

    /// The traffic counted so far, of every protocol.
    pub fn stats(&self) -> &NetStats {
        &self.stats
    }

    /// How the calls went out: batch requests and the calls they carried.
    pub fn batches(&self) -> &BatchCounters {
        &self.sent
    }

    fn client(&self, peer: &str) -> Result<PeerClient<Channel>, NetError> {
        if let Some(client) = self.clients.read().get(peer) {
            return Ok(client.clone());
        }
        let address =
            self.addresses.read().get(peer).cloned().ok_or_else(|| NetError::UnknownPeer(peer.to_string()))?;
        let unreachable = |error: &dyn std::fmt::Display| NetError::Unreachable {
            peer: peer.to_string(),
            reason: format!("{address}: {error}"),
        };
        let endpoint = match &self.tls {
            None => Endpoint::from_shared(address.clone()).map_err(|error| unreachable(&error))?,
            Some(tls) => Endpoint::from_shared(crate::tls::https(&address))
                .and_then(|endpoint| endpoint.tls_config(tls.client_config()))
                .map_err(|error| unreachable(&crate::tls::error_chain(&error)))?,
        }
        .tcp_nodelay(true);
        let client = PeerClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        self.clients.write().insert(peer.to_string(), client.clone());
        Ok(client)
    }

    /// Queues `envelope` for `peer` and starts a batch sender if the link has room for one.
    fn send(&self, peer: &str, envelope: Envelope) -> Result<oneshot::Receiver<Result<Reply, NetError>>, NetError> {
        let client = self.client(peer)?;
        let (answer, answered) = oneshot::channel();
        let start_sender = {
            let mut outboxes = self.outboxes.lock();
            let outbox = outboxes.entry(peer.to_string()).or_default();
            outbox.queued.push(Pending { envelope, answer });
            let start = outbox.senders < self.batching.max_in_flight;
            if start {
                outbox.senders += 1;
            }
            start
        };
        if start_sender {
            let sender = BatchSender {
                outboxes: Arc::clone(&self.outboxes),
                peer: peer.to_string(),
                client,
                max_calls: self.batching.max_calls,
                sent: Arc::clone(&self.sent),
            };
            tokio::spawn(sender.run());
        }
        Ok(answered)
    }
}

/// Sends a peer's queued calls, a batch at a time, until its queue is empty.
struct BatchSender {
    outboxes: Outboxes,
    peer: String,
    client: PeerClient<Channel>,
    max_calls: usize,
    sent: Arc<BatchCounters>,
}

impl BatchSender {
    async fn run(mut self) {
        loop {
            let batch: Vec<Pending> = {
                let mut outboxes = self.outboxes.lock();
                let Some(outbox) = outboxes.get_mut(&self.peer) else { return };
                if outbox.queued.is_empty() {
                    outbox.senders -= 1;
                    return;
                }
                // A call its caller gave up on (its deadline passed) is not sent.
                outbox.queued.retain(|pending| !pending.answer.is_closed());
                let take = outbox.queued.len().min(self.max_calls);
                outbox.queued.drain(..take).collect()
            };
            if batch.is_empty() {
                continue;
            }
            self.send(batch).await;
        }
    }

    /// Sends one batch; returns once its answers have started to come (they are handed out
    /// by a task of their own as they arrive).
    async fn send(&mut self, batch: Vec<Pending>) {
        let unreachable = |peer: &str, reason: String| NetError::Unreachable { peer: peer.to_string(), reason };
        if self.max_calls == 1 {
            // Unbatched: a plain call, with the sender held for all of it (it has no limit).
            for Pending { envelope, answer } in batch {
                let result = self.client.call(envelope).await;
                let _ = answer.send(
                    result
                        .map(tonic::Response::into_inner)
                        .map_err(|status| unreachable(&self.peer, status.message().to_string())),
                );
            }
            return;
        }
        self.sent.add(batch.len());
        let (envelopes, mut answers): (Vec<Envelope>, Vec<Option<oneshot::Sender<_>>>) =
            batch.into_iter().map(|pending| (pending.envelope, Some(pending.answer))).unzip();
        // A hung peer must not hold the link: its calls fail and the next batch goes out.
        let sent = tokio::time::timeout(BATCH_START_TIMEOUT, self.client.call_batch(Batch { calls: envelopes }));
        let mut stream = match sent.await {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) => {
                for answer in answers.into_iter().flatten() {
                    let _ = answer.send(Err(unreachable(&self.peer, status.message().to_string())));
                }
                return;
            }
            Err(_) => {
                let reason = format!("no answer to a batch within {BATCH_START_TIMEOUT:?}");
                for answer in answers.into_iter().flatten() {
                    let _ = answer.send(Err(unreachable(&self.peer, reason.clone())));
                }
                return;
            }
        };
        let peer = self.peer.clone();
        tokio::spawn(async move {
            let ended = loop {
                match stream.message().await {
                    Ok(Some(BatchReply { index, reply })) => {
                        // A peer's bad index or repeated answer is dropped: that call then
                        // fails as unanswered below, or already has its answer.
                        let answer = answers.get_mut(index as usize).and_then(Option::take);
                        if let Some(answer) = answer {
                            let _ = answer.send(Ok(reply.unwrap_or_default()));
                        }
                    }
                    Ok(None) => break "the peer ended the batch before answering this call".to_string(),
                    Err(status) => break status.message().to_string(),
                }
            };
            for answer in answers.into_iter().flatten() {
                let _ = answer.send(Err(unreachable(&peer, ended.clone())));
            }
        });
    }
}

impl<P: WireProtocol> Transport<P> for Grpc {
    fn call(&self, from: &str, to: &str, request: P::Request) -> BoxFuture<Result<P::Response, NetError>> {
        let kind = MessageKind::of::<P>(&request);
        let envelope =
            Envelope { from: from.to_string(), protocol: P::NAME.to_string(), body: P::encode_request(request) };
        // The bytes as sent and received: a protocol's own count may convert to measure.
        let request_bytes = envelope.body.len();
        let sent = self.send(to, envelope);
        let stats = Arc::clone(&self.stats);
        let (from, to) = (from.to_string(), to.to_string());
        Box::pin(async move {
            let reply = sent?.await.unwrap_or_else(|_| {
                Err(NetError::Unreachable { peer: to.clone(), reason: "the call was dropped unsent".to_string() })
            })?;
            let (response, response_bytes) = match reply.outcome {
                Some(reply::Outcome::Body(bytes)) => (
                    P::decode_response(&bytes)
                        .map_err(|error| NetError::Malformed { peer: to.clone(), reason: error.to_string() })?,
                    bytes.len(),
                ),
                Some(reply::Outcome::NotHosted(not_hosted)) => {
                    return Err(NetError::NotHosted { peer: to, protocol: P::NAME, hosted: not_hosted.hosted });
                }
                None => return Err(NetError::BadResponse { peer: to }),
            };
            stats.record(&from, &to, kind, request_bytes, response_bytes);
            P::check(&to, response)
        })
    }

    fn stats(&self) -> &NetStats {
        &self.stats
    }
}

struct Adapter(Host);

type BatchReplies = Pin<Box<dyn Stream<Item = Result<BatchReply, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl Peer for Adapter {
    async fn call(&self, request: tonic::Request<Envelope>) -> Result<tonic::Response<Reply>, tonic::Status> {
        Ok(tonic::Response::new(self.0.answer(request.into_inner()).await))
    }

    type CallBatchStream = BatchReplies;

    /// Answers every call of the batch at once, each on the stream as soon as it is ready.
    async fn call_batch(&self, request: tonic::Request<Batch>) -> Result<tonic::Response<BatchReplies>, tonic::Status> {
        let calls = request.into_inner().calls;
        if calls.len() > MAX_BATCH_CALLS {
            return Err(tonic::Status::invalid_argument(format!(
                "a batch of {} calls is over the limit of {MAX_BATCH_CALLS}",
                calls.len()
            )));
        }
        let answers: FuturesUnordered<_> = calls
            .into_iter()
            .enumerate()
            .map(|(index, envelope)| {
                let answer = self.0.answer(envelope);
                async move { Ok(BatchReply { index: index as u32, reply: Some(answer.await) }) }
            })
            .collect();
        Ok(tonic::Response::new(Box::pin(answers)))
    }
}

/// Serves `host`'s protocols on `listener` until `shutdown` completes: each envelope goes to
/// the handler of the protocol it names; one of a protocol `host` does not serve is answered
/// `not_hosted` (the caller's [`NetError::NotHosted`]). Returns the bound address and the
/// server's future (spawn it).
pub fn serve(
    listener: TcpListener,
    host: Host,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl Future<Output = Result<(), tonic::transport::Error>> + Send)> {
    serve_with_tls(listener, host, None, shutdown)
}

/// [`serve`], over mutual TLS when `tls` is given: callers must present a certificate of its CA.
pub fn serve_with_tls(
    listener: TcpListener,
    host: Host,
    tls: Option<&crate::Tls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl Future<Output = Result<(), tonic::transport::Error>> + Send)> {
    let address = listener.local_addr()?;
    let service = PeerServer::new(Adapter(host))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = crate::tls::server_builder(tls)?.add_service(service).serve_with_incoming_shutdown(incoming, shutdown);
    Ok((address, server))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::echo::{Answer, Ask, Echo};
    use crate::health::{self, Health};
    use crate::{Handler, InProc};

    /// Answers a head request with its caller's name, and refuses the rest.
    struct Names;

    impl Handler<Echo> for Names {
        fn handle(&self, from: String, request: Ask) -> BoxFuture<Answer> {
            Box::pin(async move {
                match request {
                    Ask::Head => Answer::Head(from.into_bytes()),
                    Ask::Top => Answer::Refused("only head requests here".to_string()),
                }
            })
        }
    }

    /// `storage-0` serves echo and health; `storage-1` echo only.
    fn storage_0() -> Host {
        Host::new().with::<Echo>(Arc::new(Names)).with::<Health>(Arc::new(health::Responder::new("storage-0")))
    }

    fn storage_1() -> Host {
        Host::new().with::<Echo>(Arc::new(Names))
    }

    fn head() -> Ask {
        Ask::Head
    }

    fn kind(protocol: &'static str, request: &'static str) -> MessageKind {
        MessageKind { protocol, request }
    }

    async fn grpc_peers(hosts: Vec<(&str, Host)>) -> Arc<Grpc> {
        let mut addresses = HashMap::new();
        for (peer, host) in hosts {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let (address, server) = serve(listener, host, std::future::pending()).unwrap();
            tokio::spawn(server);
            addresses.insert(peer.to_string(), format!("http://{address}"));
        }
        Grpc::new(addresses)
    }

    fn inproc_peers(hosts: Vec<(&str, Host)>) -> Arc<InProc> {
        let inproc = InProc::new();
        for (peer, host) in hosts {
            if let Some(handler) = host.handler::<Echo>() {
                inproc.register(peer, Arc::clone(handler));
            }
            if let Some(handler) = host.handler::<Health>() {
                inproc.register(peer, Arc::clone(handler));
            }
        }
        inproc
    }

    async fn exercise<T: Transport<Echo> + Transport<Health>>(transport: &T) {
        let rainblock: &dyn Transport<Echo> = transport;
        let reply = rainblock.call("client-0", "storage-0", head()).await.unwrap();
        assert_eq!(reply, Answer::Head(b"client-0".to_vec()));
        let refused = rainblock.call("client-0", "storage-0", Ask::Top).await.unwrap_err();
        assert!(matches!(refused, NetError::Refused { ref reason, .. } if reason.contains("only head")), "{refused}");
        assert!(matches!(
            rainblock.call("client-0", "storage-9", head()).await,
            Err(NetError::UnknownPeer(_) | NetError::Unreachable { .. })
        ));
        let pong = health::ping(transport, "client-0", "storage-0").await.unwrap();
        assert_eq!(
            pong,
            health::Pong { node: "storage-0".into(), role: "storage".into(), version: health::VERSION.into() }
        );
        let not_hosted = health::ping(transport, "client-0", "storage-1").await.unwrap_err();
        assert_eq!(
            not_hosted,
            NetError::NotHosted { peer: "storage-1".into(), protocol: "health", hosted: vec!["echo".into()] }
        );
        // Echo is still served where health is not.
        assert!(rainblock.call("client-0", "storage-1", head()).await.is_ok());

        let stats = rainblock.stats();
        let roles = stats.snapshot();
        assert_eq!(roles["client"].round_trips, 4, "{roles:?}");
        assert_eq!(roles["storage"].messages_sent, 4);
        let kinds = stats.kinds();
        assert_eq!(
            kinds.keys().copied().collect::<Vec<_>>(),
            [kind("echo", "head"), kind("echo", "top"), kind("health", "ping")]
        );
        assert_eq!(kinds[&kind("echo", "head")].calls, 2);
        assert_eq!(kinds[&kind("health", "ping")].calls, 1);
        assert!(kinds[&kind("health", "ping")].response_bytes > "storage-0storage".len() as u64);
    }

    #[tokio::test]
    async fn both_transports_carry_the_same_calls_of_both_protocols_and_count_the_same_bytes() {
        let inproc = inproc_peers(vec![("storage-0", storage_0()), ("storage-1", storage_1())]);
        exercise(&*inproc).await;
        let grpc = grpc_peers(vec![("storage-0", storage_0()), ("storage-1", storage_1())]).await;
        exercise(&*grpc).await;
        assert_eq!(inproc.stats().peers(), grpc.stats().peers());
        assert_eq!(inproc.stats().kinds(), grpc.stats().kinds());
    }

    #[tokio::test]
    async fn one_server_answers_both_protocols_over_one_connection() {
        let grpc = grpc_peers(vec![("storage-0", storage_0())]).await;
        let rainblock: &dyn Transport<Echo> = &*grpc;
        for _ in 0..3 {
            let (pong, head) = tokio::join!(
                health::ping(&*grpc, "client-0", "storage-0"),
                rainblock.call("client-0", "storage-0", head())
            );
            assert_eq!(pong.unwrap().node, "storage-0");
            assert!(matches!(head.unwrap(), Answer::Head(_)));
        }
        assert_eq!(grpc.clients.read().len(), 1);
        let kinds = grpc.stats().kinds();
        assert_eq!(kinds[&kind("health", "ping")].calls, 3);
        assert_eq!(kinds[&kind("echo", "head")].calls, 3);
    }

    /// Answers a head request with its caller's name, after `from`'s digits in milliseconds.
    struct Sleepy;

    impl Sleepy {
        fn answer(from: String) -> BoxFuture<Answer> {
            Box::pin(async move {
                let millis: u64 = from.trim_start_matches(|c: char| !c.is_ascii_digit()).parse().unwrap_or(0);
                tokio::time::sleep(std::time::Duration::from_millis(millis)).await;
                Answer::Head(from.into_bytes())
            })
        }
    }

    impl Handler<Echo> for Sleepy {
        fn handle(&self, from: String, _: Ask) -> BoxFuture<Answer> {
            Sleepy::answer(from)
        }
    }

    impl Handler<crate::echo::Lossy> for Sleepy {
        fn handle(&self, from: String, _: Ask) -> BoxFuture<Answer> {
            Sleepy::answer(from)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_calls_share_batches_and_each_gets_its_own_answer() {
        let grpc = grpc_peers(vec![("storage-0", Host::new().with::<Echo>(Arc::new(Sleepy)))]).await;
        let calls =
            (0..200).map(|index| {
                let grpc = Arc::clone(&grpc);
                // Callers c-0, c-1 and c-2 are answered after 0, 1 and 2 ms: answers come back out of order.
                async move {
                    (index, Transport::<Echo>::call(&*grpc, &format!("c-{}", index % 3), "storage-0", head()).await)
                }
            });
        let answers = futures_util::future::join_all(calls).await;
        for (index, answer) in answers {
            assert_eq!(answer.unwrap(), Answer::Head(format!("c-{}", index % 3).into_bytes()), "call {index}");
        }
        let (batches, calls) = grpc.batches().get();
        assert_eq!(calls, 200);
        assert!(batches < 200, "200 calls at once went out in {batches} batches");
        assert_eq!(grpc.stats().kinds()[&kind("echo", "head")].calls, 200);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_call_does_not_hold_back_the_calls_batched_with_it() {
        let grpc = grpc_peers(vec![("storage-0", Host::new().with::<Echo>(Arc::new(Sleepy)))]).await;
        // Occupy the link so that the next calls queue into one batch.
        let first = Transport::<Echo>::call(&*grpc, "first-0", "storage-0", head());
        let slow = Transport::<Echo>::call(&*grpc, "slow-2000", "storage-0", head());
        let quick = Transport::<Echo>::call(&*grpc, "quick-0", "storage-0", head());
        let started = std::time::Instant::now();
        let (first, quick) = tokio::join!(first, quick);
        assert!(first.is_ok() && quick.is_ok());
        assert!(started.elapsed() < std::time::Duration::from_millis(1500), "{:?}", started.elapsed());
        assert!(slow.await.is_ok());
        assert!(started.elapsed() >= std::time::Duration::from_millis(2000));
    }

    #[tokio::test]
    async fn a_batch_over_the_limit_is_refused_and_unbatched_calls_still_work() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (address, server) = serve(listener, storage_0(), std::future::pending()).unwrap();
        tokio::spawn(server);
        let mut client = PeerClient::connect(format!("http://{address}")).await.unwrap();
        let envelope =
            Envelope { from: "client-0".into(), protocol: "echo".into(), body: Echo::encode_request(head()) };
        let refused = client.call_batch(Batch { calls: vec![envelope; MAX_BATCH_CALLS + 1] }).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(refused.message().contains("4097 calls"), "{}", refused.message());
        let unbatched =
            Grpc::with_batching(HashMap::from([("storage-0".into(), format!("http://{address}"))]), Batching::OFF);
        assert!(Transport::<Echo>::call(&*unbatched, "client-0", "storage-0", head()).await.is_ok());
        assert_eq!(unbatched.batches().get(), (0, 0));
    }

    #[tokio::test]
    async fn an_answer_that_does_not_decode_is_a_malformed_answer_and_not_counted() {
        let liar = Host::new().with::<crate::echo::Lossy>(Arc::new(Sleepy));
        let grpc = grpc_peers(vec![("storage-0", liar)]).await;
        let answer = Transport::<Echo>::call(&*grpc, "client-0", "storage-0", head()).await;
        assert_eq!(
            answer,
            Err(NetError::Malformed { peer: "storage-0".into(), reason: "unknown message tag 9".into() })
        );
        assert_eq!(grpc.stats().total_messages(), 0);
    }

    #[tokio::test]
    async fn an_unhosted_protocol_is_refused_with_a_typed_error_and_not_counted() {
        let grpc = grpc_peers(vec![("storage-1", storage_1()), ("storage-2", Host::new())]).await;
        let refused = health::ping(&*grpc, "client-0", "storage-1").await.unwrap_err();
        assert!(matches!(&refused, NetError::NotHosted { protocol: "health", hosted, .. } if hosted == &["echo"]));
        assert!(refused.to_string().contains("does not serve protocol health (it serves: echo)"), "{refused}");
        let rainblock: &dyn Transport<Echo> = &*grpc;
        let refused = rainblock.call("client-0", "storage-2", head()).await.unwrap_err();
        assert_eq!(refused, NetError::NotHosted { peer: "storage-2".into(), protocol: "echo", hosted: vec![] });
        assert_eq!(grpc.stats().total_messages(), 0);
    }
}

#[cfg(test)]
mod tls_tests {
    use super::*;
    use crate::echo::{Ask, Echo};
    use crate::Tls;
    use std::path::{Path, PathBuf};

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tls").join(name)
    }

    fn tls(cert: &str) -> Tls {
        Tls::load(&testdata(&format!("{cert}.pem")), &testdata(&format!("{cert}-key.pem")), &testdata("ca.pem"))
            .unwrap()
    }

    fn head() -> Ask {
        Ask::Head
    }

    #[tokio::test]
    async fn over_mutual_tls_only_a_caller_with_a_certificate_of_the_ca_is_served() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = Host::new().with::<crate::health::Health>(Arc::new(crate::health::Responder::new("storage-0")));
        let (address, server) = serve_with_tls(listener, host, Some(&tls("node")), std::future::pending()).unwrap();
        tokio::spawn(server);
        let peers = || HashMap::from([("storage-0".to_string(), format!("http://{address}"))]);
        let member = Grpc::with_tls(peers(), tls("node"));
        let pong = crate::health::ping(&*member, "client-0", "storage-0").await.unwrap();
        assert_eq!(pong.node, "storage-0");
        // A certificate of another CA, with the same names: its handshake is refused.
        let stranger = Grpc::with_tls(peers(), tls("stranger"));
        let refused = crate::health::ping(&*stranger, "client-0", "storage-0").await.unwrap_err();
        assert!(matches!(refused, NetError::Unreachable { .. } | NetError::Refused { .. }), "{refused}");
        // No TLS at all: the server speaks nothing else.
        let plain = Grpc::new(peers());
        assert!(crate::health::ping(&*plain, "client-0", "storage-0").await.is_err());
        let rainblock = Transport::<Echo>::call(&*plain, "client-0", "storage-0", head()).await;
        assert!(rainblock.is_err());
        // The member still is.
        assert!(crate::health::ping(&*member, "client-0", "storage-0").await.is_ok());
    }
}
