//! A small protocol of typed messages with a hand-written codec, for the transports' own
//! tests: it shows what any protocol provides and lets the tests send bytes that do not
//! decode.

use crate::role::Protocol;
use crate::WireProtocol;

/// What a caller asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ask {
    /// Answered with the caller's name.
    Head,
    /// Refused by every test handler.
    Top,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    Head(Vec<u8>),
    Refused(String),
}

/// Why bytes are not an echo message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EchoWireError {
    #[error("the message is empty")]
    Empty,
    #[error("unknown message tag {0}")]
    UnknownTag(u8),
    #[error("a request carries {0} bytes after its tag")]
    Trailing(usize),
    #[error("the refusal's reason is not UTF-8")]
    NotUtf8,
}

#[derive(Debug)]
pub(crate) struct Echo;

impl Protocol for Echo {
    type Request = Ask;
    type Response = Answer;

    fn request_kind(request: &Ask) -> &'static str {
        match request {
            Ask::Head => "head",
            Ask::Top => "top",
        }
    }

    fn response_kind(response: &Answer) -> &'static str {
        match response {
            Answer::Head(_) => "head",
            Answer::Refused(_) => "refused",
        }
    }

    fn request_bytes(_: &Ask) -> usize {
        1
    }

    fn response_bytes(response: &Answer) -> usize {
        match response {
            Answer::Head(bytes) => 1 + bytes.len(),
            Answer::Refused(reason) => 1 + reason.len(),
        }
    }

    fn refusal_reason(response: &Answer) -> Option<&str> {
        match response {
            Answer::Refused(reason) => Some(reason),
            Answer::Head(_) => None,
        }
    }
}

impl WireProtocol for Echo {
    const NAME: &'static str = "echo";
    type DecodeError = EchoWireError;

    fn refusal(reason: String) -> Answer {
        Answer::Refused(reason)
    }

    fn encode_request(request: Ask) -> Vec<u8> {
        vec![match request {
            Ask::Head => 1,
            Ask::Top => 2,
        }]
    }

    fn decode_request(bytes: &[u8]) -> Result<Ask, EchoWireError> {
        let (&tag, rest) = bytes.split_first().ok_or(EchoWireError::Empty)?;
        if !rest.is_empty() {
            return Err(EchoWireError::Trailing(rest.len()));
        }
        match tag {
            1 => Ok(Ask::Head),
            2 => Ok(Ask::Top),
            other => Err(EchoWireError::UnknownTag(other)),
        }
    }

    fn encode_response(response: Answer) -> Vec<u8> {
        let (tag, mut body) = match response {
            Answer::Head(bytes) => (1, bytes),
            Answer::Refused(reason) => (2, reason.into_bytes()),
        };
        body.insert(0, tag);
        body
    }

    fn decode_response(bytes: &[u8]) -> Result<Answer, EchoWireError> {
        let (&tag, rest) = bytes.split_first().ok_or(EchoWireError::Empty)?;
        match tag {
            1 => Ok(Answer::Head(rest.to_vec())),
            2 => String::from_utf8(rest.to_vec()).map(Answer::Refused).map_err(|_| EchoWireError::NotUtf8),
            other => Err(EchoWireError::UnknownTag(other)),
        }
    }
}

/// Echo's messages, under echo's name, with a codec that loses `Top` requests and long head
/// answers, as a broken codec would: what does not survive it must be refused.
#[derive(Debug)]
pub(crate) struct Lossy;

impl Protocol for Lossy {
    type Request = Ask;
    type Response = Answer;

    fn request_kind(request: &Ask) -> &'static str {
        Echo::request_kind(request)
    }

    fn response_kind(response: &Answer) -> &'static str {
        Echo::response_kind(response)
    }

    fn request_bytes(request: &Ask) -> usize {
        Echo::request_bytes(request)
    }

    fn response_bytes(response: &Answer) -> usize {
        Echo::response_bytes(response)
    }

    fn refusal_reason(response: &Answer) -> Option<&str> {
        Echo::refusal_reason(response)
    }
}

impl WireProtocol for Lossy {
    const NAME: &'static str = "echo";
    type DecodeError = EchoWireError;

    fn refusal(reason: String) -> Answer {
        Answer::Refused(reason)
    }

    fn encode_request(request: Ask) -> Vec<u8> {
        match request {
            Ask::Top => vec![7],
            head => Echo::encode_request(head),
        }
    }

    fn decode_request(bytes: &[u8]) -> Result<Ask, EchoWireError> {
        Echo::decode_request(bytes)
    }

    fn encode_response(response: Answer) -> Vec<u8> {
        match response {
            Answer::Head(bytes) if bytes.len() > 3 => vec![9],
            other => Echo::encode_response(other),
        }
    }

    fn decode_response(bytes: &[u8]) -> Result<Answer, EchoWireError> {
        Echo::decode_response(bytes)
    }
}
