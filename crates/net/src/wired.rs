//! A role whose every incoming message crosses its protocol's codec, as it does between two
//! processes: the simulator runs a cluster of `Wired` roles to hold the codecs to the cores'
//! messages under every fault, while the cores themselves never see a byte.

use std::collections::BTreeMap;

use crate::role::{CallId, Command, Event, IoExecutor, Nanos, Role};
use crate::{NetError, WireProtocol};

/// `R` with each request it is sent and each response it receives encoded and decoded
/// again. A request that does not survive is refused with the decoder's reason (the core is
/// not stepped for it); a response that does not survive reaches the core as
/// [`NetError::Malformed`].
pub struct Wired<R: Role> {
    role: R,
    /// The peer each call in flight went to, for the error of a malformed answer.
    callees: BTreeMap<CallId, String>,
}

impl<R: Role> Wired<R>
where
    R::Protocol: WireProtocol,
{
    pub fn new(role: R) -> Self {
        Wired { role, callees: BTreeMap::new() }
    }

    pub fn role(&self) -> &R {
        &self.role
    }

    pub fn role_mut(&mut self) -> &mut R {
        &mut self.role
    }
}

impl<R: Role> Role for Wired<R>
where
    R::Protocol: WireProtocol,
{
    type Protocol = R::Protocol;
    type Io = R::Io;
    type IoDone = R::IoDone;
    type Input = R::Input;

    fn is_long_step(&self, event: &Event<Self::Protocol, Self::IoDone, Self::Input>) -> bool {
        self.role.is_long_step(event)
    }

    fn step(
        &mut self,
        now: Nanos,
        event: Event<Self::Protocol, Self::IoDone, Self::Input>,
        out: &mut Vec<Command<Self::Protocol, Self::Io>>,
    ) {
        type P<R> = <R as Role>::Protocol;
        let event = match event {
            Event::Request { from, call, request } => match P::<R>::decode_request(&P::<R>::encode_request(request)) {
                Ok(request) => Event::Request { from, call, request },
                Err(error) => {
                    let reason = format!("a malformed {} request: {error}", P::<R>::NAME);
                    out.push(Command::Reply { to: from, call, response: P::<R>::refusal(reason) });
                    return;
                }
            },
            Event::Response { call, result } => {
                let peer = self.callees.remove(&call).unwrap_or_default();
                let result = result.and_then(|response| {
                    P::<R>::decode_response(&P::<R>::encode_response(response))
                        .map_err(|error| NetError::Malformed { peer: peer.clone(), reason: error.to_string() })
                });
                Event::Response { call, result }
            }
            other => other,
        };
        let first = out.len();
        self.role.step(now, event, out);
        for command in &out[first..] {
            if let Command::Call { to, call, .. } = command {
                self.callees.insert(*call, to.clone());
            }
        }
    }
}

/// A wired role's device is its role's.
pub struct WiredIo<X>(pub X);

impl<R: Role, X: IoExecutor<R>> IoExecutor<Wired<R>> for WiredIo<X>
where
    R::Protocol: WireProtocol,
{
    fn execute(&mut self, op: R::Io) -> R::IoDone {
        self.0.execute(op)
    }

    fn detach(&mut self, op: R::Io) -> Result<crate::role::Detached<R::IoDone>, R::Io> {
        self.0.detach(op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::echo::{Answer, Ask, Echo, Lossy};
    use crate::role::TimerId;
    use std::time::Duration;

    /// Answers every request with its caller's name, calls `peer` on its first timer, and
    /// keeps what it is told.
    struct Replier<P> {
        requests: Vec<Ask>,
        responses: Vec<Result<Answer, NetError>>,
        protocol: std::marker::PhantomData<fn() -> P>,
    }

    impl<P> Default for Replier<P> {
        fn default() -> Self {
            Replier { requests: Vec::new(), responses: Vec::new(), protocol: std::marker::PhantomData }
        }
    }

    impl<P: WireProtocol<Request = Ask, Response = Answer>> Role for Replier<P> {
        type Protocol = P;
        type Io = std::convert::Infallible;
        type IoDone = std::convert::Infallible;
        type Input = ();

        fn step(&mut self, _: Nanos, event: Event<P, Self::IoDone, ()>, out: &mut Vec<Command<P, Self::Io>>) {
            match event {
                Event::Request { from, call, request } => {
                    self.requests.push(request);
                    out.push(Command::Reply { to: from.clone(), call, response: Answer::Head(from.into_bytes()) });
                }
                Event::Timer(_) => out.push(Command::Call {
                    to: "peer".into(),
                    call: CallId(4),
                    request: Ask::Head,
                    deadline: Duration::ZERO,
                }),
                Event::Response { result, .. } => self.responses.push(result),
                _ => {}
            }
        }
    }

    fn request<P: WireProtocol<Request = Ask>>(from: &str, request: Ask) -> Event<P, std::convert::Infallible, ()> {
        Event::Request { from: from.into(), call: CallId(1), request }
    }

    #[test]
    fn messages_that_survive_the_codec_reach_the_core_unchanged() {
        let mut wired = Wired::new(Replier::<Echo>::default());
        let mut out = Vec::new();
        wired.step(0, request("client-0", Ask::Top), &mut out);
        wired.step(0, Event::Timer(TimerId(0)), &mut out);
        let answer = Ok(Answer::Head(b"a long answer".to_vec()));
        wired.step(0, Event::Response { call: CallId(4), result: answer.clone() }, &mut out);
        assert_eq!(wired.role().requests, [Ask::Top]);
        assert_eq!(wired.role().responses, [answer]);
        assert!(wired.callees.is_empty(), "the answered call is forgotten");
    }

    #[test]
    fn a_broken_codec_is_caught_a_request_refused_and_a_response_malformed() {
        let mut wired = Wired::new(Replier::<Lossy>::default());
        let mut out = Vec::new();
        wired.step(0, request("client-0", Ask::Top), &mut out);
        assert!(wired.role().requests.is_empty(), "a request that does not decode never reaches the core");
        let [Command::Reply { to, response: Answer::Refused(reason), .. }] = out.as_slice() else { panic!("{out:?}") };
        assert_eq!(to, "client-0");
        assert_eq!(reason, "a malformed echo request: unknown message tag 7");
        wired.step(0, Event::Timer(TimerId(0)), &mut out);
        let answer = Ok(Answer::Head(b"a long answer".to_vec()));
        wired.step(0, Event::Response { call: CallId(4), result: answer }, &mut out);
        assert_eq!(
            wired.role().responses,
            [Err(NetError::Malformed { peer: "peer".into(), reason: "unknown message tag 9".into() })]
        );
    }
}
