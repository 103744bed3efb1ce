//! The in-process transport: every peer is a host of handlers in this process.

use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;

use crate::{BoxFuture, Handler, Host, MessageKind, NetError, NetStats, Transport, WireProtocol};

/// Peers as hosts in one process, carrying every [`WireProtocol`]. A call runs the callee's
/// handler of the call's protocol on the caller's task, with no encoding (its bytes are
/// counted by the protocol's encoded lengths, as over gRPC); a peer can be removed (as if
/// it crashed) and registered again.
#[derive(Default)]
pub struct InProc {
    peers: RwLock<HashMap<String, Host>>,
    stats: Arc<NetStats>,
}

impl InProc {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Makes `peer` serve protocol `P` with `handler` (beside the protocols it serves already).
    pub fn register<P: WireProtocol>(&self, peer: impl Into<String>, handler: Arc<dyn Handler<P>>) {
        self.peers.write().entry(peer.into()).or_default().insert(handler);
    }

    /// Makes `peer` serve `host`'s protocols (and only those).
    pub fn register_host(&self, peer: impl Into<String>, host: Host) {
        self.peers.write().insert(peer.into(), host);
    }

    /// Takes a peer off the transport, every protocol of it: calls to it fail as unreachable
    /// until it registers again.
    pub fn unregister(&self, peer: &str) {
        self.peers.write().remove(peer);
    }

    /// The traffic counted so far, of every protocol.
    pub fn stats(&self) -> &NetStats {
        &self.stats
    }
}

impl<P: WireProtocol> Transport<P> for InProc {
    fn call(&self, from: &str, to: &str, request: P::Request) -> BoxFuture<Result<P::Response, NetError>> {
        let handler = match self.peers.read().get(to) {
            None => Err(NetError::Unreachable { peer: to.to_string(), reason: "not running".to_string() }),
            Some(host) => host.handler::<P>().cloned().ok_or_else(|| NetError::NotHosted {
                peer: to.to_string(),
                protocol: P::NAME,
                hosted: host.protocols(),
            }),
        };
        let stats = Arc::clone(&self.stats);
        let (from, to) = (from.to_string(), to.to_string());
        Box::pin(async move {
            let handler = handler?;
            let request_bytes = P::request_bytes(&request);
            let kind = MessageKind::of::<P>(&request);
            let response = handler.handle(from.clone(), request).await;
            stats.record(&from, &to, kind, request_bytes, P::response_bytes(&response));
            P::check(&to, response)
        })
    }

    fn stats(&self) -> &NetStats {
        &self.stats
    }
}
