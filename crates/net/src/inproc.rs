//! The in-process transport: every peer is a handler in this process.

use parking_lot::RwLock;
use prost::Message;
use std::collections::HashMap;
use std::sync::Arc;

use crate::{check_response, BoxFuture, Handler, NetError, NetStats, Request, Response, Transport};

/// Peers as handlers in one process. A call runs the callee's handler on the caller's task;
/// a peer can be removed (as if it crashed) and registered again.
#[derive(Default)]
pub struct InProc {
    peers: RwLock<HashMap<String, Arc<dyn Handler>>>,
    stats: NetStats,
}

impl InProc {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn register(&self, peer: impl Into<String>, handler: Arc<dyn Handler>) {
        self.peers.write().insert(peer.into(), handler);
    }

    /// Takes a peer off the transport: calls to it fail as unreachable until it registers again.
    pub fn unregister(&self, peer: &str) {
        self.peers.write().remove(peer);
    }
}

impl Transport for Arc<InProc> {
    fn call(&self, from: &str, to: &str, request: Request) -> BoxFuture<Result<Response, NetError>> {
        let handler = self.peers.read().get(to).cloned();
        let this = Arc::clone(self);
        let (from, to) = (from.to_string(), to.to_string());
        Box::pin(async move {
            let Some(handler) = handler else {
                return Err(NetError::Unreachable { peer: to, reason: "not running".to_string() });
            };
            let request_bytes = request.encoded_len();
            let kind = <crate::Rainblock as crate::role::Protocol>::request_kind(&request);
            let response = handler.handle(from.clone(), request).await;
            this.stats.record(&from, &to, kind, request_bytes, response.encoded_len());
            check_response(&to, response)
        })
    }

    fn stats(&self) -> &NetStats {
        &self.stats
    }
}
