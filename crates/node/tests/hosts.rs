//! What every node serves: RainBlock and, beside it, the health protocol.

use std::sync::Arc;
use virga_net::health;
use virga_net::{BoxFuture, Handler, InProc, NetError, Transport};
use virga_node::cluster::peer_host;
use virga_node::protocol::{refusal, Rainblock, Request, Response};

/// A RainBlock role that refuses everything.
struct Busy;

impl Handler<Rainblock> for Busy {
    fn handle(&self, _: String, _: Request) -> BoxFuture<Response> {
        Box::pin(std::future::ready(refusal("busy")))
    }
}

#[tokio::test]
async fn a_peer_serves_rainblock_and_answers_pings_with_its_id_role_and_version() {
    let host = peer_host("miner-3", Arc::new(Busy));
    assert_eq!(host.protocols(), ["rainblock", "health"]);
    let transport = InProc::new();
    transport.register_host("miner-3", host);

    let pong = health::ping(&*transport, "client-0", "miner-3").await.unwrap();
    assert_eq!((pong.node.as_str(), pong.role.as_str(), pong.version.as_str()), ("miner-3", "miner", health::VERSION));
    let rainblock: &dyn Transport<Rainblock> = &*transport;
    let refused = rainblock.call("client-0", "miner-3", Request::Head).await.unwrap_err();
    assert!(matches!(refused, NetError::Refused { ref reason, .. } if reason == "busy"), "{refused}");

    // A peer registered with RainBlock alone is up but does not serve health.
    transport.register::<Rainblock>("storage-0", Arc::new(Busy));
    let not_hosted = health::ping(&*transport, "client-0", "storage-0").await.unwrap_err();
    assert!(matches!(not_hosted, NetError::NotHosted { protocol: "health", .. }), "{not_hosted}");
    let kinds = transport.stats().kinds();
    assert_eq!(kinds.keys().map(ToString::to_string).collect::<Vec<_>>(), ["health.ping", "rainblock.head"]);
}
