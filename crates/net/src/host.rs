//! The handlers one peer serves, one per protocol.

use std::any::{Any, TypeId};
use std::sync::Arc;

use crate::envelope::{envelope, reply, Envelope, NotHosted, Reply};
use crate::{BoxFuture, Handler, WireProtocol};

/// Answers an envelope arm of the entry's protocol (taking the caller's id), or hands the
/// arm back.
type Enveloped = Box<
    dyn Fn(&mut String, envelope::Protocol) -> Result<BoxFuture<reply::Protocol>, envelope::Protocol> + Send + Sync,
>;

struct Hosted {
    protocol: TypeId,
    name: &'static str,
    /// The handler as an `Arc<dyn Handler<P>>`, which in-process calls use as it is.
    typed: Box<dyn Any + Send + Sync>,
    enveloped: Enveloped,
}

/// A peer's handlers, at most one per protocol: what [`crate::InProc`] calls and
/// [`crate::serve`] serves. A request of a protocol the host has no handler for is answered
/// with [`crate::NetError::NotHosted`] (in process) or the reply's `not_hosted` arm (gRPC),
/// never dropped or panicked on.
#[derive(Default)]
pub struct Host {
    // A peer hosts a handful of protocols: a scan is quicker than hashing.
    hosted: Vec<Hosted>,
}

impl Host {
    pub fn new() -> Self {
        Self::default()
    }

    /// The host with `handler` serving protocol `P` (replacing a handler `P` had).
    pub fn with<P: WireProtocol>(mut self, handler: Arc<dyn Handler<P>>) -> Self {
        self.insert(handler);
        self
    }

    /// Serves protocol `P` with `handler` (replacing a handler `P` had).
    ///
    /// # Panics
    ///
    /// If another protocol of this host has the same [`WireProtocol::NAME`] (two protocols
    /// claiming one envelope arm is a programming error).
    #[allow(clippy::result_large_err)] // `P::from_envelope` hands a foreign arm back (moved).
    pub fn insert<P: WireProtocol>(&mut self, handler: Arc<dyn Handler<P>>) {
        let protocol = TypeId::of::<P>();
        self.hosted.retain(|hosted| hosted.protocol != protocol);
        assert!(
            self.hosted.iter().all(|hosted| hosted.name != P::NAME),
            "two protocols are named {}: each needs its own envelope arm",
            P::NAME
        );
        let serving = Arc::clone(&handler);
        let enveloped: Enveloped = Box::new(move |from, arm| {
            let request = P::from_envelope(arm)?;
            let answer = serving.handle(std::mem::take(from), request);
            Ok(Box::pin(async move { P::into_reply(answer.await) }))
        });
        self.hosted.push(Hosted { protocol, name: P::NAME, typed: Box::new(handler), enveloped });
    }

    /// The handler of protocol `P`, if the host serves it.
    pub fn handler<P: WireProtocol>(&self) -> Option<&Arc<dyn Handler<P>>> {
        self.hosted.iter().find_map(|hosted| hosted.typed.downcast_ref::<Arc<dyn Handler<P>>>())
    }

    /// The names of the protocols the host serves, in the order they were added.
    pub fn protocols(&self) -> Vec<String> {
        self.hosted.iter().map(|hosted| hosted.name.to_string()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.hosted.is_empty()
    }

    /// Answers `envelope` as the gRPC server does: by the handler of its arm's protocol, or
    /// with `not_hosted` (also for an envelope with no arm, which is what a protocol newer
    /// than this build decodes to).
    #[allow(clippy::result_large_err)] // each protocol's entry hands a foreign arm back (moved).
    pub fn answer(&self, envelope: Envelope) -> BoxFuture<Reply> {
        let (mut from, mut arm) = (envelope.from, envelope.protocol);
        for hosted in &self.hosted {
            match arm.map(|arm| (hosted.enveloped)(&mut from, arm)) {
                Some(Ok(answer)) => {
                    return Box::pin(async move { Reply { protocol: Some(answer.await) } });
                }
                Some(Err(other)) => arm = Some(other),
                None => break,
            }
        }
        let not_hosted = NotHosted { hosted: self.protocols() };
        Box::pin(std::future::ready(Reply { protocol: Some(reply::Protocol::NotHosted(not_hosted)) }))
    }
}

impl<P: WireProtocol> From<Arc<dyn Handler<P>>> for Host {
    fn from(handler: Arc<dyn Handler<P>>) -> Self {
        Host::new().with(handler)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::{self, Health};
    use crate::{refusal, Rainblock, Request, Response};

    struct Refuses(&'static str);

    impl Handler<Rainblock> for Refuses {
        fn handle(&self, _: String, _: Request) -> BoxFuture<Response> {
            Box::pin(std::future::ready(refusal(self.0)))
        }
    }

    fn ping() -> envelope::Protocol {
        envelope::Protocol::Health(health::Request { body: Some(health::RequestBody::Ping(health::Ping {})) })
    }

    fn block_on<T>(future: BoxFuture<T>) -> T {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(future)
    }

    #[test]
    fn an_envelope_goes_to_its_protocols_handler_wherever_it_was_added() {
        let host = Host::new()
            .with::<Rainblock>(Arc::new(Refuses("busy")))
            .with::<Health>(Arc::new(health::Responder::new("miner-2")));
        assert_eq!(host.protocols(), ["rainblock", "health"]);
        let reply = block_on(host.answer(Envelope { from: "client-0".into(), protocol: Some(ping()) }));
        let Some(reply::Protocol::Health(response)) = reply.protocol else { panic!("{reply:?}") };
        let Some(health::ResponseBody::Pong(pong)) = response.body else { panic!("{response:?}") };
        assert_eq!((pong.node.as_str(), pong.role.as_str()), ("miner-2", "miner"));
    }

    #[test]
    fn an_unhosted_or_unknown_protocol_is_answered_not_hosted() {
        let host = Host::from(Arc::new(Refuses("busy")) as Arc<dyn Handler<Rainblock>>);
        let not_hosted = Some(reply::Protocol::NotHosted(NotHosted { hosted: vec!["rainblock".into()] }));
        let health = block_on(host.answer(Envelope { from: "client-0".into(), protocol: Some(ping()) }));
        assert_eq!(health.protocol, not_hosted);
        // A protocol newer than this build decodes to an envelope with no arm.
        let unknown = block_on(host.answer(Envelope { from: "client-0".into(), protocol: None }));
        assert_eq!(unknown.protocol, not_hosted);
    }

    #[test]
    fn adding_a_protocol_again_replaces_its_handler() {
        let mut host = Host::new().with::<Rainblock>(Arc::new(Refuses("first")));
        host.insert::<Rainblock>(Arc::new(Refuses("second")));
        assert_eq!(host.protocols(), ["rainblock"]);
        let answer = host.handler::<Rainblock>().unwrap().handle("client-0".into(), Request::default());
        assert_eq!(block_on(answer), refusal("second"));
        assert!(host.handler::<Health>().is_none());
    }

    /// RainBlock's messages under a name that is already taken.
    struct Impostor;

    impl crate::role::Protocol for Impostor {
        type Request = Request;
        type Response = Response;

        fn request_kind(request: &Request) -> &'static str {
            Rainblock::request_kind(request)
        }

        fn response_kind(response: &Response) -> &'static str {
            Rainblock::response_kind(response)
        }

        fn request_bytes(request: &Request) -> usize {
            Rainblock::request_bytes(request)
        }

        fn response_bytes(response: &Response) -> usize {
            Rainblock::response_bytes(response)
        }

        fn check(peer: &str, response: Response) -> Result<Response, crate::NetError> {
            Rainblock::check(peer, response)
        }
    }

    impl WireProtocol for Impostor {
        const NAME: &'static str = "rainblock";

        fn refusal(reason: String) -> Response {
            Rainblock::refusal(reason)
        }

        fn into_envelope(request: Request) -> envelope::Protocol {
            Rainblock::into_envelope(request)
        }

        fn from_envelope(arm: envelope::Protocol) -> Result<Request, envelope::Protocol> {
            Rainblock::from_envelope(arm)
        }

        fn into_reply(response: Response) -> reply::Protocol {
            Rainblock::into_reply(response)
        }

        fn from_reply(arm: reply::Protocol) -> Result<Response, reply::Protocol> {
            Rainblock::from_reply(arm)
        }
    }

    impl Handler<Impostor> for Refuses {
        fn handle(&self, _: String, _: Request) -> BoxFuture<Response> {
            Box::pin(std::future::ready(refusal(self.0)))
        }
    }

    #[test]
    #[should_panic(expected = "two protocols are named rainblock")]
    fn two_protocols_claiming_one_envelope_arm_is_caught() {
        let _ = Host::new().with::<Rainblock>(Arc::new(Refuses("a"))).with::<Impostor>(Arc::new(Refuses("b")));
    }
}
