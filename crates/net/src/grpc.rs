//! The gRPC transport (tonic): one `Peer.Call` method per peer, the envelope in `proto/virga.proto`,
//! RainBlock's messages in `proto/rainblock.proto`.

use parking_lot::RwLock;
use prost::Message;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};

use crate::envelope::peer_client::PeerClient;
use crate::envelope::peer_server::{Peer, PeerServer};
use crate::envelope::{envelope, reply, Envelope, Reply};
use crate::{check_response, BoxFuture, Handler, NetError, NetStats, Request, Response, Transport, MAX_MESSAGE_BYTES};

/// Peers at gRPC addresses (`http://127.0.0.1:7001`). Connections are made on first use
/// and re-established after a peer restarts.
#[derive(Default)]
pub struct Grpc {
    addresses: RwLock<HashMap<String, String>>,
    clients: RwLock<HashMap<String, PeerClient<Channel>>>,
    stats: NetStats,
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

impl Transport for Arc<Grpc> {
    fn call(&self, from: &str, to: &str, request: Request) -> BoxFuture<Result<Response, NetError>> {
        let this = Arc::clone(self);
        let (from, to) = (from.to_string(), to.to_string());
        Box::pin(async move {
            let mut client = this.client(&to)?;
            let request_bytes = request.encoded_len();
            let kind = <crate::Rainblock as crate::role::Protocol>::request_kind(&request);
            let envelope = Envelope { from: from.clone(), protocol: Some(envelope::Protocol::Rainblock(request)) };
            let reply = client
                .call(envelope)
                .await
                .map_err(|status| NetError::Unreachable { peer: to.clone(), reason: status.message().to_string() })?
                .into_inner();
            let Some(reply::Protocol::Rainblock(response)) = reply.protocol else {
                return Err(NetError::BadResponse { peer: to });
            };
            this.stats.record(&from, &to, kind, request_bytes, response.encoded_len());
            check_response(&to, response)
        })
    }

    fn stats(&self) -> &NetStats {
        &self.stats
    }
}

struct Adapter(Arc<dyn Handler>);

#[tonic::async_trait]
impl Peer for Adapter {
    async fn call(&self, request: tonic::Request<Envelope>) -> Result<tonic::Response<Reply>, tonic::Status> {
        let envelope = request.into_inner();
        let Some(envelope::Protocol::Rainblock(inner)) = envelope.protocol else {
            return Err(tonic::Status::invalid_argument("an envelope without a RainBlock request"));
        };
        let response = self.0.handle(envelope.from, inner).await;
        Ok(tonic::Response::new(Reply { protocol: Some(reply::Protocol::Rainblock(response)) }))
    }
}

/// Serves `handler` on `listener` until `shutdown` completes. Returns the bound address and
/// the server's future (spawn it).
pub fn serve(
    listener: TcpListener,
    handler: Arc<dyn Handler>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl Future<Output = Result<(), tonic::transport::Error>> + Send)> {
    let address = listener.local_addr()?;
    let service = PeerServer::new(Adapter(handler))
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
    use crate::proto::{HeadReply, HeadRequest};
    use crate::{request, response, InProc, RequestBody, ResponseBody};

    struct Echo;

    impl Handler for Echo {
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

    async fn exercise(transport: &dyn Transport) {
        let reply = transport.call("client-0", "storage-0", request(RequestBody::Head(HeadRequest {}))).await.unwrap();
        let Some(ResponseBody::Head(head)) = reply.body else { panic!("wrong body {reply:?}") };
        assert_eq!(head.state_root, b"client-0");
        let refused =
            transport.call("client-0", "storage-0", request(RequestBody::Top(Default::default()))).await.unwrap_err();
        assert!(matches!(refused, NetError::Refused { ref reason, .. } if reason.contains("only head")), "{refused}");
        assert!(matches!(
            transport.call("client-0", "storage-9", request(RequestBody::Head(HeadRequest {}))).await,
            Err(NetError::UnknownPeer(_) | NetError::Unreachable { .. })
        ));
        let roles = transport.stats().snapshot();
        assert_eq!(roles["client"].round_trips, 2);
        assert_eq!(roles["storage"].messages_sent, 2);
    }

    #[tokio::test]
    async fn both_transports_carry_the_same_calls_and_count_the_same_bytes() {
        let inproc = InProc::new();
        inproc.register("storage-0", Arc::new(Echo));
        exercise(&inproc).await;

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (address, server) = serve(listener, Arc::new(Echo), std::future::pending()).unwrap();
        tokio::spawn(server);
        let grpc = Grpc::new(HashMap::from([("storage-0".to_string(), format!("http://{address}"))]));
        exercise(&grpc).await;
        assert_eq!(inproc.stats().snapshot(), grpc.stats().snapshot());
    }
}
