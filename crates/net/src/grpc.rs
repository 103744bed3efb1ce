//! The gRPC transport (tonic): one `Peer.Call` method per peer, the envelope in
//! `proto/virga.proto` with an arm per protocol, each protocol's messages in its own package.

use parking_lot::RwLock;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};

use crate::envelope::peer_client::PeerClient;
use crate::envelope::peer_server::{Peer, PeerServer};
use crate::envelope::{reply, Envelope, Reply};
use crate::{BoxFuture, Host, MessageKind, NetError, NetStats, Transport, WireProtocol, MAX_MESSAGE_BYTES};

/// Peers at gRPC addresses (`http://127.0.0.1:7001`), carrying every [`WireProtocol`] over
/// one connection per peer. Connections are made on first use and re-established after a
/// peer restarts.
#[derive(Default)]
pub struct Grpc {
    addresses: RwLock<HashMap<String, String>>,
    clients: RwLock<HashMap<String, PeerClient<Channel>>>,
    stats: Arc<NetStats>,
}

impl Grpc {
    pub fn new(addresses: HashMap<String, String>) -> Arc<Self> {
        Arc::new(Self { addresses: RwLock::new(addresses), ..Self::default() })
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

    fn client(&self, peer: &str) -> Result<PeerClient<Channel>, NetError> {
        if let Some(client) = self.clients.read().get(peer) {
            return Ok(client.clone());
        }
        let address =
            self.addresses.read().get(peer).cloned().ok_or_else(|| NetError::UnknownPeer(peer.to_string()))?;
        let endpoint = Endpoint::from_shared(address.clone())
            .map_err(|error| NetError::Unreachable { peer: peer.to_string(), reason: format!("{address}: {error}") })?
            .tcp_nodelay(true);
        let client = PeerClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        self.clients.write().insert(peer.to_string(), client.clone());
        Ok(client)
    }
}

impl<P: WireProtocol> Transport<P> for Grpc {
    fn call(&self, from: &str, to: &str, request: P::Request) -> BoxFuture<Result<P::Response, NetError>> {
        let client = self.client(to);
        let stats = Arc::clone(&self.stats);
        let (from, to) = (from.to_string(), to.to_string());
        Box::pin(async move {
            let mut client = client?;
            let request_bytes = P::request_bytes(&request);
            let kind = MessageKind::of::<P>(&request);
            let envelope = Envelope { from: from.clone(), protocol: Some(P::into_envelope(request)) };
            let reply = client
                .call(envelope)
                .await
                .map_err(|status| NetError::Unreachable { peer: to.clone(), reason: status.message().to_string() })?
                .into_inner();
            let response = match reply.protocol.map(P::from_reply) {
                Some(Ok(response)) => response,
                Some(Err(reply::Protocol::NotHosted(not_hosted))) => {
                    return Err(NetError::NotHosted { peer: to, protocol: P::NAME, hosted: not_hosted.hosted });
                }
                Some(Err(_)) | None => return Err(NetError::BadResponse { peer: to }),
            };
            stats.record(&from, &to, kind, request_bytes, P::response_bytes(&response));
            P::check(&to, response)
        })
    }

    fn stats(&self) -> &NetStats {
        &self.stats
    }
}

struct Adapter(Host);

#[tonic::async_trait]
impl Peer for Adapter {
    async fn call(&self, request: tonic::Request<Envelope>) -> Result<tonic::Response<Reply>, tonic::Status> {
        Ok(tonic::Response::new(self.0.answer(request.into_inner()).await))
    }
}

/// Serves `host`'s protocols on `listener` until `shutdown` completes: each envelope goes to
/// the handler of its arm's protocol; one of a protocol `host` does not serve is answered
/// `not_hosted` (the caller's [`NetError::NotHosted`]). Returns the bound address and the
/// server's future (spawn it).
pub fn serve(
    listener: TcpListener,
    host: Host,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl Future<Output = Result<(), tonic::transport::Error>> + Send)> {
    let address = listener.local_addr()?;
    let service = PeerServer::new(Adapter(host))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let server =
        tonic::transport::Server::builder().add_service(service).serve_with_incoming_shutdown(incoming, shutdown);
    Ok((address, server))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::{self, Health};
    use crate::proto::{HeadReply, HeadRequest};
    use crate::{request, response, Handler, InProc, Rainblock, Request, RequestBody, Response, ResponseBody};

    struct Echo;

    impl Handler<Rainblock> for Echo {
        fn handle(&self, from: String, request: Request) -> BoxFuture<Response> {
            Box::pin(async move {
                match request.body {
                    Some(RequestBody::Head(_)) => {
                        response(ResponseBody::Head(HeadReply { head: None, state_root: from.into_bytes() }))
                    }
                    _ => crate::refusal("only head requests here"),
                }
            })
        }
    }

    /// `storage-0` serves RainBlock and health; `storage-1` RainBlock only.
    fn storage_0() -> Host {
        Host::new().with::<Rainblock>(Arc::new(Echo)).with::<Health>(Arc::new(health::Responder::new("storage-0")))
    }

    fn storage_1() -> Host {
        Host::new().with::<Rainblock>(Arc::new(Echo))
    }

    fn head() -> Request {
        request(RequestBody::Head(HeadRequest {}))
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
            if let Some(handler) = host.handler::<Rainblock>() {
                inproc.register(peer, Arc::clone(handler));
            }
            if let Some(handler) = host.handler::<Health>() {
                inproc.register(peer, Arc::clone(handler));
            }
        }
        inproc
    }

    async fn exercise<T: Transport<Rainblock> + Transport<Health>>(transport: &T) {
        let rainblock: &dyn Transport<Rainblock> = transport;
        let reply = rainblock.call("client-0", "storage-0", head()).await.unwrap();
        let Some(ResponseBody::Head(head_reply)) = reply.body else { panic!("wrong body {reply:?}") };
        assert_eq!(head_reply.state_root, b"client-0");
        let refused =
            rainblock.call("client-0", "storage-0", request(RequestBody::Top(Default::default()))).await.unwrap_err();
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
            NetError::NotHosted { peer: "storage-1".into(), protocol: "health", hosted: vec!["rainblock".into()] }
        );
        // RainBlock is still served where health is not.
        assert!(rainblock.call("client-0", "storage-1", head()).await.is_ok());

        let stats = rainblock.stats();
        let roles = stats.snapshot();
        assert_eq!(roles["client"].round_trips, 4, "{roles:?}");
        assert_eq!(roles["storage"].messages_sent, 4);
        let kinds = stats.kinds();
        assert_eq!(
            kinds.keys().copied().collect::<Vec<_>>(),
            [kind("health", "ping"), kind("rainblock", "head"), kind("rainblock", "top")]
        );
        assert_eq!(kinds[&kind("rainblock", "head")].calls, 2);
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
        let rainblock: &dyn Transport<Rainblock> = &*grpc;
        for _ in 0..3 {
            let (pong, head) = tokio::join!(
                health::ping(&*grpc, "client-0", "storage-0"),
                rainblock.call("client-0", "storage-0", head())
            );
            assert_eq!(pong.unwrap().node, "storage-0");
            assert!(matches!(head.unwrap().body, Some(ResponseBody::Head(_))));
        }
        assert_eq!(grpc.clients.read().len(), 1);
        let kinds = grpc.stats().kinds();
        assert_eq!(kinds[&kind("health", "ping")].calls, 3);
        assert_eq!(kinds[&kind("rainblock", "head")].calls, 3);
    }

    #[tokio::test]
    async fn an_unhosted_protocol_is_refused_with_a_typed_error_and_not_counted() {
        let grpc = grpc_peers(vec![("storage-1", storage_1()), ("storage-2", Host::new())]).await;
        let refused = health::ping(&*grpc, "client-0", "storage-1").await.unwrap_err();
        assert!(matches!(&refused, NetError::NotHosted { protocol: "health", hosted, .. } if hosted == &["rainblock"]));
        assert!(refused.to_string().contains("does not serve protocol health (it serves: rainblock)"), "{refused}");
        let rainblock: &dyn Transport<Rainblock> = &*grpc;
        let refused = rainblock.call("client-0", "storage-2", head()).await.unwrap_err();
        assert_eq!(refused, NetError::NotHosted { peer: "storage-2".into(), protocol: "rainblock", hosted: vec![] });
        assert_eq!(grpc.stats().total_messages(), 0);
    }
}
