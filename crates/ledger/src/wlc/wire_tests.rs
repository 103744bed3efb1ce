use super::*;
use crate::tx::SigningKey;

/// One of every request and response, with signed messages inside.
pub(crate) fn samples() -> (Vec<Request>, Vec<Response>) {
    let key = SigningKey::from_seed(1);
    let proposal = Proposal::sign(&key, "client-1", 3, vec!["UPDATE t SET v = 1 WHERE k = 2".to_string()]);
    let batch = ProposalBatch { origin: "org-1".to_string(), number: 2, proposals: vec![proposal.clone()] };
    let agreement = Agreement::sign(&key, "org-1", batch.hash());
    let chained = ChainedTx { batch: batch.clone(), agreements: vec![agreement.clone()] };
    let block = OrderedBlock::sign(&key, 4, [5; 32], vec![chained.clone()]);
    let vote = SignedVote::sign(&key, "org-1", 4, [6; 32]);
    let outcome = Outcome { client: "client-1".to_string(), seq: 3, block: 4, successful: true };
    let requests = vec![
        Request::Propose(proposal),
        Request::Agree(batch),
        Request::Order(chained),
        Request::Fetch { from: 9 },
        Request::Decide { block: 4, hash: Some([6; 32]) },
        Request::Decide { block: 4, hash: None },
        Request::Vote { block: 4, vote: Some(vote.clone()) },
        Request::Vote { block: 4, vote: None },
        Request::Committed(vec![outcome.clone(), Outcome { successful: false, ..outcome.clone() }]),
        Request::Raft(vec![0x0a, 0x02, 0x08, 0x01]),
    ];
    let responses = vec![
        Response::Done(outcome),
        Response::Agreed(agreement),
        Response::Ordered,
        Response::Blocks(vec![block.clone(), block]),
        Response::Decided(Decision::Commit),
        Response::Decided(Decision::Recover { consensus: [7; 32] }),
        Response::VoteAck(Some(vote)),
        Response::VoteAck(None),
        Response::Ack,
        Response::Refused("the batch replays proposal 3 of client-1".to_string()),
        Response::NotLeader("orderer-2".to_string()),
        Response::NotLeader(String::new()),
    ];
    (requests, responses)
}

#[test]
fn every_request_and_response_round_trips() {
    let (requests, responses) = samples();
    for request in requests {
        let bytes = encode_request(&request);
        let decoded = decode_request(&bytes).unwrap();
        assert_eq!(encode_request(&decoded), bytes, "{request:?}");
    }
    for response in responses {
        let bytes = encode_response(&response);
        let decoded = decode_response(&bytes).unwrap();
        assert_eq!(encode_response(&decoded), bytes, "{response:?}");
    }
}

#[test]
fn damaged_bytes_are_named() {
    assert_eq!(decode_request(&[]), Err(WireError::Empty));
    assert_eq!(decode_request(&[42]), Err(WireError::UnknownKind(42)));
    assert_eq!(decode_response(&[0]), Err(WireError::UnknownKind(0)));
    let (requests, responses) = samples();
    for request in &requests {
        let bytes = encode_request(request);
        for cut in 1..bytes.len() {
            assert!(decode_request(&bytes[..cut]).is_err(), "{request:?} cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(decode_request(&longer), Err(WireError::Trailing { trailing: 1, .. })));
    }
    for response in &responses {
        let bytes = encode_response(response);
        for cut in 1..bytes.len() {
            assert!(decode_response(&bytes[..cut]).is_err(), "{response:?} cut at {cut}");
        }
    }
    let decide = encode_request(&Request::Decide { block: 1, hash: None });
    let mut flag = decide.clone();
    flag[9] = 2;
    assert_eq!(decode_request(&flag), Err(WireError::BadFlag { kind: "decide", field: "hash flag", value: 2 }));
    let mut blocks = encode_response(&Response::Blocks(Vec::new()));
    blocks[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(decode_response(&blocks), Err(WireError::TooLong { field: "block count", .. })));
    let mut proposal = encode_request(&requests[0]);
    proposal[5] = 9;
    assert!(matches!(
        decode_request(&proposal),
        Err(WireError::Message { kind: "propose", error: MessageError::Format { .. } })
    ));
}
