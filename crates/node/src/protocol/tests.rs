//! The codec against its definition: typed → wire → typed is the identity, the byte count
//! is the encoding's length, and every malformed wire message is refused with its field named.

use super::*;
use crate::messages::*;
use crate::proto;
use alloy_consensus::Header;
use alloy_primitives::B256;
use proptest::prelude::*;
use virga_ledger::block::Block;
use virga_trie::proof::NodeBag;

fn hash() -> impl Strategy<Value = B256> {
    any::<[u8; 32]>().prop_map(B256::from)
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..24)
}

fn block_id() -> impl Strategy<Value = BlockId> {
    (any::<u64>(), hash()).prop_map(|(number, hash)| BlockId { number, hash })
}

fn bag() -> impl Strategy<Value = NodeBag> {
    (prop::collection::vec(bytes(), 0..4), prop::collection::vec(bytes(), 0..4))
        .prop_map(|(keys, nodes)| NodeBag { keys, nodes })
}

fn storage() -> impl Strategy<Value = Vec<StorageBag>> {
    prop::collection::vec((hash(), bag()).prop_map(|(account, bag)| StorageBag { account, bag }), 0..3)
}

fn header() -> impl Strategy<Value = Header> {
    (any::<u64>(), hash(), hash(), any::<u64>()).prop_map(|(number, parent_hash, state_root, gas_used)| Header {
        number,
        parent_hash,
        state_root,
        gas_used,
        ..Header::default()
    })
}

fn witness_request() -> impl Strategy<Value = Request> {
    let slots = prop::collection::vec(
        (hash(), prop::collection::vec(hash(), 0..3)).prop_map(|(account, slots)| SlotKeys { account, slots }),
        0..3,
    );
    (
        prop::collection::vec(hash(), 0..4),
        any::<u32>(),
        prop::option::of(block_id()),
        slots,
        prop::collection::vec(hash(), 0..2),
    )
        .prop_map(|(keys, compaction, at, slots, code_hashes)| {
            Request::Witness(WitnessRequest { keys, compaction, at, slots, code_hashes })
        })
}

fn block_updates() -> impl Strategy<Value = Request> {
    let updates = prop::collection::vec((hash(), bytes()).prop_map(|(key, value)| KeyUpdate { key, value }), 0..4);
    let slots = prop::collection::vec(
        (hash(), hash(), bytes()).prop_map(|(account, slot, value)| SlotUpdate { account, slot, value }),
        0..3,
    );
    (
        header(),
        prop::collection::vec(hash(), 0..4),
        updates,
        slots,
        prop::collection::vec(hash(), 0..2),
        prop::collection::vec(bytes(), 0..2),
    )
        .prop_map(|(header, shard_hashes, updates, slots, cleared, codes)| {
            Request::ApplyBlock(Box::new(BlockUpdates { header, shard_hashes, updates, slots, cleared, codes }))
        })
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        witness_request(),
        (any::<u32>(), prop::option::of(block_id())).prop_map(|(levels, at)| Request::Top(TopRequest { levels, at })),
        block_updates(),
        Just(Request::Head),
        (
            prop::collection::vec(bytes(), 0..3),
            bag(),
            block_id(),
            hash(),
            storage(),
            prop::collection::vec(bytes(), 0..2)
        )
            .prop_map(|(transactions, bag, witness_at, witness_root, storage, codes)| {
                Request::Submit(Submission { transactions, bag, witness_at, witness_root, storage, codes })
            }),
        (header(), bag(), storage(), prop::collection::vec(bytes(), 0..2)).prop_map(|(header, bag, storage, codes)| {
            let block = Block { header, transactions: Vec::new() };
            Request::Announce(Box::new(BlockAnnouncement { block, bag, storage, codes }))
        }),
    ]
}

fn response() -> impl Strategy<Value = Response> {
    let outcome = (hash(), any::<bool>(), any::<bool>(), "[a-z_]{0,12}")
        .prop_map(|(tx_hash, included, succeeded, reason)| TxOutcome { tx_hash, included, succeeded, reason });
    prop_oneof![
        (block_id(), hash(), bag(), storage(), prop::collection::vec(bytes(), 0..2)).prop_map(
            |(at, state_root, bag, storage, codes)| Response::Witness(WitnessReply {
                at,
                state_root,
                bag,
                storage,
                codes
            })
        ),
        (block_id(), hash(), prop::collection::vec(bytes(), 0..3), storage())
            .prop_map(|(at, state_root, nodes, storage)| Response::Top(TopReply { at, state_root, nodes, storage })),
        block_id().prop_map(Response::BlockAck),
        (block_id(), hash()).prop_map(|(head, state_root)| Response::Head(HeadReply { head, state_root })),
        (prop::option::of(block_id()), prop::collection::vec(outcome, 0..3))
            .prop_map(|(block, outcomes)| Response::Submitted(SubmissionReply { block, outcomes })),
        Just(Response::Verdict(Verdict::Accepted)),
        "[a-z ]{0,16}".prop_map(|reason| Response::Verdict(Verdict::Rejected(reason))),
        "[a-z ]{0,16}".prop_map(Response::Refused),
    ]
}

proptest! {
    /// What the gRPC transport sends is what the callee's core receives, and the byte
    /// count the cost model uses is the encoding's length.
    #[test]
    fn a_request_crosses_the_codec_unchanged(request in request()) {
        let bytes = Rainblock::encode_request(request.clone());
        prop_assert_eq!(bytes.len(), Rainblock::request_bytes(&request));
        prop_assert_eq!(Rainblock::decode_request(&bytes), Ok(request));
    }

    #[test]
    fn a_response_crosses_the_codec_unchanged(response in response()) {
        let bytes = Rainblock::encode_response(response.clone());
        prop_assert_eq!(bytes.len(), Rainblock::response_bytes(&response));
        prop_assert_eq!(Rainblock::decode_response(&bytes), Ok(response));
    }

    #[test]
    fn any_bytes_decode_to_a_message_or_a_named_refusal(bytes in prop::collection::vec(any::<u8>(), 0..96)) {
        for error in [Rainblock::decode_request(&bytes).err(), Rainblock::decode_response(&bytes).err()].into_iter().flatten() {
            prop_assert!(!error.to_string().is_empty());
        }
    }

    /// A hash of the wrong length anywhere in a witness request is refused, its field named.
    #[test]
    fn a_short_hash_is_refused_by_name(len in 0usize..64, which in 0usize..4) {
        prop_assume!(len != 32);
        let short = vec![1; len];
        let mut wire = proto::WitnessRequest {
            keys: vec![vec![0; 32]],
            compaction: 0,
            at: Some(proto::BlockId { number: 1, hash: vec![0; 32] }),
            slots: vec![proto::SlotKeys { account: vec![0; 32], slots: vec![vec![0; 32]] }],
            code_hashes: vec![vec![0; 32]],
        };
        let field = match which {
            0 => { wire.keys[0] = short; "witness.keys[0]" }
            1 => { wire.at = Some(proto::BlockId { number: 1, hash: short }); "witness.at" }
            2 => { wire.slots[0].slots[0] = short; "witness.slots[0].slots[0]" }
            _ => { wire.code_hashes[0] = short; "witness.code_hashes[0]" }
        };
        let bytes = prost::Message::encode_to_vec(&proto::Request { body: Some(proto::request::Body::Witness(wire)) });
        let expected = RainblockWireError::Field(WireError::HashLength { field: field.to_string(), len });
        prop_assert_eq!(Rainblock::decode_request(&bytes), Err(expected));
    }
}

fn encoded_response(body: proto::response::Body) -> Vec<u8> {
    prost::Message::encode_to_vec(&proto::Response { body: Some(body) })
}

#[test]
fn an_empty_message_is_a_message_of_no_known_kind_and_refused() {
    let empty = prost::Message::encode_to_vec(&proto::Request { body: None });
    assert_eq!(
        Rainblock::decode_request(&empty),
        Err(RainblockWireError::Protobuf(ProtobufError::Empty { message: "rainblock request" }))
    );
    assert_eq!(
        Rainblock::decode_response(&[]),
        Err(RainblockWireError::Protobuf(ProtobufError::Empty { message: "rainblock response" }))
    );
    let refused = Rainblock::decode_response(&Rainblock::encode_response(refusal("busy"))).unwrap();
    assert_eq!(Rainblock::refusal_reason(&refused), Some("busy"));
}

/// What the wire may leave out but a core relies on is refused when absent: an
/// acknowledgement names its block, a head reply its head.
#[test]
fn a_required_field_left_out_is_refused_by_name() {
    let ack = encoded_response(proto::response::Body::BlockAck(proto::BlockAck { block: None }));
    assert_eq!(Rainblock::decode_response(&ack), Err(RainblockWireError::Field(WireError::Missing("block_ack.block"))));
    let head = encoded_response(proto::response::Body::Head(proto::HeadReply { head: None, state_root: vec![0; 32] }));
    assert_eq!(Rainblock::decode_response(&head), Err(RainblockWireError::Field(WireError::Missing("head.head"))));
    let block = prost::Message::encode_to_vec(&proto::Request {
        body: Some(proto::request::Body::ApplyBlock(proto::BlockUpdates { header: vec![0xc0], ..Default::default() })),
    });
    assert!(matches!(Rainblock::decode_request(&block), Err(RainblockWireError::Field(WireError::Header(_)))));
}
