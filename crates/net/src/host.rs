//! The handlers one peer serves, one per protocol.

use std::any::{Any, TypeId};
use std::sync::Arc;

use crate::envelope::{reply, Envelope, NotHosted, Reply};
use crate::{BoxFuture, Handler, WireProtocol};

/// Answers the bytes of a request of the entry's protocol from a caller with the bytes of
/// its response.
type Encoded = Box<dyn Fn(String, &[u8]) -> BoxFuture<Vec<u8>> + Send + Sync>;

struct Hosted {
    protocol: TypeId,
    name: &'static str,
    /// The handler as an `Arc<dyn Handler<P>>`, which in-process calls use as it is.
    typed: Box<dyn Any + Send + Sync>,
    encoded: Encoded,
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
    /// claiming one name on the wire is a programming error).
    pub fn insert<P: WireProtocol>(&mut self, handler: Arc<dyn Handler<P>>) {
        let protocol = TypeId::of::<P>();
        self.hosted.retain(|hosted| hosted.protocol != protocol);
        assert!(
            self.hosted.iter().all(|hosted| hosted.name != P::NAME),
            "two protocols are named {}: each needs a name of its own",
            P::NAME
        );
        let serving = Arc::clone(&handler);
        let encoded: Encoded = Box::new(move |from, bytes| match P::decode_request(bytes) {
            Ok(request) => {
                let answer = serving.handle(from, request);
                Box::pin(async move { P::encode_response(answer.await) })
            }
            Err(error) => {
                let refusal = P::refusal(format!("a malformed {} request: {error}", P::NAME));
                Box::pin(std::future::ready(P::encode_response(refusal)))
            }
        });
        self.hosted.push(Hosted { protocol, name: P::NAME, typed: Box::new(handler), encoded });
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

    /// Answers `envelope` as the gRPC server does: by the handler of the protocol it names,
    /// or with `not_hosted` (also for a protocol newer than this build).
    pub fn answer(&self, envelope: Envelope) -> BoxFuture<Reply> {
        match self.hosted.iter().find(|hosted| hosted.name == envelope.protocol) {
            Some(hosted) => {
                let answer = (hosted.encoded)(envelope.from, &envelope.body);
                Box::pin(async move { Reply { outcome: Some(reply::Outcome::Body(answer.await)) } })
            }
            None => {
                let not_hosted = NotHosted { hosted: self.protocols() };
                Box::pin(std::future::ready(Reply { outcome: Some(reply::Outcome::NotHosted(not_hosted)) }))
            }
        }
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
    use crate::echo::{Answer, Ask, Echo, EchoWireError};
    use crate::health::{self, Health};

    struct Refuses(&'static str);

    impl Handler<Echo> for Refuses {
        fn handle(&self, _: String, _: Ask) -> BoxFuture<Answer> {
            Box::pin(std::future::ready(Answer::Refused(self.0.to_string())))
        }
    }

    fn ping() -> Envelope {
        let request = health::Request { body: Some(health::RequestBody::Ping(health::Ping {})) };
        Envelope { from: "client-0".into(), protocol: "health".into(), body: Health::encode_request(request) }
    }

    fn block_on<T>(future: BoxFuture<T>) -> T {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(future)
    }

    fn body(reply: Reply) -> Vec<u8> {
        match reply.outcome {
            Some(reply::Outcome::Body(bytes)) => bytes,
            other => panic!("no body: {other:?}"),
        }
    }

    #[test]
    fn an_envelope_goes_to_its_protocols_handler_wherever_it_was_added() {
        let host = Host::new()
            .with::<Echo>(Arc::new(Refuses("busy")))
            .with::<Health>(Arc::new(health::Responder::new("miner-2")));
        assert_eq!(host.protocols(), ["echo", "health"]);
        let response = Health::decode_response(&body(block_on(host.answer(ping())))).unwrap();
        let Some(health::ResponseBody::Pong(pong)) = response.body else { panic!("{response:?}") };
        assert_eq!((pong.node.as_str(), pong.role.as_str()), ("miner-2", "miner"));
    }

    #[test]
    fn an_unhosted_or_unknown_protocol_is_answered_not_hosted() {
        let host = Host::from(Arc::new(Refuses("busy")) as Arc<dyn Handler<Echo>>);
        let not_hosted = Some(reply::Outcome::NotHosted(NotHosted { hosted: vec!["echo".into()] }));
        assert_eq!(block_on(host.answer(ping())).outcome, not_hosted);
        let newer = Envelope { from: "client-0".into(), protocol: "lattice".into(), body: vec![1] };
        assert_eq!(block_on(host.answer(newer)).outcome, not_hosted);
    }

    #[test]
    fn bytes_that_do_not_decode_are_refused_with_the_decoders_reason_and_the_handler_is_not_called() {
        struct Panics;
        impl Handler<Echo> for Panics {
            fn handle(&self, _: String, request: Ask) -> BoxFuture<Answer> {
                panic!("a malformed request reached the handler as {request:?}")
            }
        }
        let host = Host::from(Arc::new(Panics) as Arc<dyn Handler<Echo>>);
        for (bytes, error) in [
            (vec![], EchoWireError::Empty),
            (vec![7], EchoWireError::UnknownTag(7)),
            (vec![1, 0, 0], EchoWireError::Trailing(2)),
        ] {
            let envelope = Envelope { from: "client-0".into(), protocol: "echo".into(), body: bytes };
            let answer = Echo::decode_response(&body(block_on(host.answer(envelope)))).unwrap();
            assert_eq!(answer, Answer::Refused(format!("a malformed echo request: {error}")));
        }
    }

    #[test]
    fn adding_a_protocol_again_replaces_its_handler() {
        let mut host = Host::new().with::<Echo>(Arc::new(Refuses("first")));
        host.insert::<Echo>(Arc::new(Refuses("second")));
        assert_eq!(host.protocols(), ["echo"]);
        let answer = host.handler::<Echo>().unwrap().handle("client-0".into(), Ask::Head);
        assert_eq!(block_on(answer), Answer::Refused("second".into()));
        assert!(host.handler::<Health>().is_none());
    }

    impl Handler<crate::echo::Lossy> for Refuses {
        fn handle(&self, _: String, _: Ask) -> BoxFuture<Answer> {
            Box::pin(std::future::ready(Answer::Refused(self.0.to_string())))
        }
    }

    #[test]
    #[should_panic(expected = "two protocols are named echo")]
    fn two_protocols_claiming_one_name_is_caught() {
        // Lossy's codec is not Echo's, but it claims Echo's name.
        let _ = Host::new().with::<Echo>(Arc::new(Refuses("a"))).with::<crate::echo::Lossy>(Arc::new(Refuses("b")));
    }
}
