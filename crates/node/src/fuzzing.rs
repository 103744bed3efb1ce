//! Bodies of virga-node's fuzz targets (`fuzz/fuzz_targets/storage_checkpoint.rs` and
//! `peer_request.rs`), kept in the library so the regular test suite runs
//! them too.
//!
//! Each panics only on a real bug: a decoder or verifier that panics, a checkpoint accepted
//! whose state does not hash to its header's root.

use alloy_consensus::Header;
use alloy_primitives::{keccak256, Address, U256};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use virga_ledger::verify::ChainConfig;
use virga_net::Handler;
use virga_trie::shard::ShardedTrie;

use crate::checkpoint;
use crate::miner::{execution_pool, ChainDisk, MinerConfig, MinerCore};
use crate::storage::StorageNode;
use parking_lot::Mutex;
use virga_net::role::{CallId, Command, Event, IoExecutor, Role};

const SHARDS: usize = 16;
/// The shards the fuzzed storage node serves (the others it knows by hash).
const SERVED: [usize; 3] = [0, 1, 9];

/// A small sharded state: 64 accounts.
fn sample_state() -> ShardedTrie {
    let mut state = ShardedTrie::new(SHARDS).unwrap_or_else(|error| unreachable!("16 shards: {error}"));
    for i in 0..64u8 {
        let value = virga_trie::account::Account::with_balance(
            0,
            alloy_primitives::U256::from(i) + alloy_primitives::U256::from(1),
        )
        .rlp();
        state.insert(keccak256([i]).as_slice(), &value).unwrap_or_else(|error| unreachable!("{error}"));
    }
    state
}

/// A checkpoint from the fuzzer's bytes, by the first byte's value modulo 3: (0) the rest as
/// a whole file; (1) the rest as the payload of a file with a right preamble (magic,
/// checksum, length), to get past the checksum to the protobuf and shard checks; (2) the
/// sample checkpoint's payload edited by the rest, taken as (offset: u16, xor: u8) triples,
/// re-framed, to explore near a valid checkpoint with no corpus. A checkpoint that loads
/// must hash to its header's root and header hash, with its served shards whole.
pub fn storage_checkpoint(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let bytes = match mode % 3 {
        0 => rest.to_vec(),
        1 => checkpoint::frame(rest),
        _ => {
            static SAMPLE: OnceLock<Vec<u8>> = OnceLock::new();
            let mut payload = SAMPLE.get_or_init(sample_checkpoint)[checkpoint::PREAMBLE..].to_vec();
            for edit in rest.chunks_exact(3) {
                let offset = usize::from(u16::from_le_bytes([edit[0], edit[1]])) % payload.len();
                payload[offset] ^= edit[2];
            }
            checkpoint::frame(&payload)
        }
    };
    let Ok(loaded) = checkpoint::decode(&bytes, &SERVED, SHARDS) else { return };
    assert_eq!(loaded.shards.root_hash(), loaded.header.state_root, "a checkpoint loaded to another root");
    assert_eq!(loaded.hash, loaded.header.hash_slow());
    for index in SERVED {
        let shard = loaded.shards.shard(index).unwrap_or_else(|| unreachable!("16 shards"));
        assert!(!shard.is_known_by_hash(), "served shard {index} loaded without its entries");
    }
}

/// A valid checkpoint of the sample state.
pub fn sample_checkpoint() -> Vec<u8> {
    let state = sample_state();
    let header = Header { state_root: state.root_hash(), number: 3, ..Header::default() };
    checkpoint::encode(&header, (&state, &crate::storage::Contracts::default()), &SERVED)
        .unwrap_or_else(|error| unreachable!("{error}"))
}

struct Peers {
    storage: Arc<StorageNode>,
    miner: Mutex<MinerCore>,
    /// The pool the miner's device runs its jobs on.
    pool: Arc<rayon::ThreadPool>,
}

/// A storage node and a miner on the sample state, with proof of work so easy (difficulty
/// 1) that the fuzzer can reach everything past the header checks.
fn peers() -> &'static Peers {
    static PEERS: OnceLock<Peers> = OnceLock::new();
    PEERS.get_or_init(|| {
        let state = sample_state();
        let chain = ChainConfig { difficulty: U256::from(1u64), ..ChainConfig::default() };
        let genesis = Header { state_root: state.root_hash(), difficulty: chain.difficulty, ..Header::default() };
        let state = crate::storage::ShardedState::of_accounts(state);
        let opened = StorageNode::open("storage-0", SERVED.to_vec(), SHARDS, chain, genesis.clone(), &state, None);
        let (storage, _) = opened.unwrap_or_else(|error| unreachable!("{error}"));
        let config = MinerConfig {
            id: "miner-0".to_string(),
            chain,
            shard_count: SHARDS,
            storage_nodes: vec![("storage-0".to_string(), SERVED.to_vec())],
            peers: Vec::new(),
            retention: 2,
            top_budget_bytes: 1 << 20,
            max_block_transfers: 64,
            beneficiary: Address::with_last_byte(7),
        };
        let pool = execution_pool(1).unwrap_or_else(|error| unreachable!("{error}"));
        let miner = MinerCore::new(config, genesis).unwrap_or_else(|error| unreachable!("{error}"));
        Peers { storage, miner: Mutex::new(miner), pool }
    })
}

/// Any bytes as a peer's request, to a storage node and to a miner: decoded, checked and
/// answered (or refused) without a panic. Submissions are taken through the miner's block
/// building, where their transfers and node bags are decoded and verified.
pub fn peer_request(data: &[u8]) {
    // Through the protocol's codec, as over gRPC: what it refuses never reaches a role.
    let Ok(request) = <crate::protocol::Rainblock as virga_net::WireProtocol>::decode_request(data) else { return };
    let peers = peers();
    answer(peers.storage.handle("fuzz".to_string(), request.clone()));
    // A submission is answered once its block is built: queue it, build, then collect.
    let mut miner = peers.miner.lock();
    let mut commands = Vec::new();
    let call = CallId(0);
    miner.step(0, Event::Request { from: "fuzz".to_string(), call, request }, &mut commands);
    if let Some(job) = miner.queued_job() {
        let outcome = job.run(&peers.pool);
        miner.drop_built(outcome, &mut commands);
    }
    let mut disk = ChainDisk { store: None, pool: Arc::clone(&peers.pool) };
    let mut answered = false;
    while let Some(command) = commands.pop() {
        match command {
            Command::Reply { call: replied, response, .. } if replied == call => {
                assert_reasoned(&response);
                answered = true;
            }
            Command::Io { io, op } => {
                let result = disk.execute(op);
                miner.step(0, Event::IoDone { io, result }, &mut commands);
            }
            _ => {}
        }
    }
    assert!(answered, "a request to the fuzzed miner was not answered");
}

/// Polls a reply that must be ready (no reply here waits on I/O).
fn answer(mut reply: virga_net::BoxFuture<crate::protocol::Response>) {
    let mut context = Context::from_waker(Waker::noop());
    match reply.as_mut().poll(&mut context) {
        Poll::Ready(response) => assert_reasoned(&response),
        Poll::Pending => panic!("a request to a fuzzed peer did not answer at once"),
    }
}

/// A refusal says why.
fn assert_reasoned(response: &crate::protocol::Response) {
    if let crate::protocol::Response::Refused(reason) = response {
        assert!(!reason.is_empty(), "a request refused without a reason");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    #[test]
    fn the_sample_checkpoint_loads_and_its_mutations_never_panic() {
        let sample = sample_checkpoint();
        assert!(checkpoint::decode(&sample, &SERVED, SHARDS).is_ok());
        let mut rng = StdRng::seed_from_u64(5);
        for _ in 0..300 {
            let mut bytes = sample.clone();
            for _ in 0..rng.random_range(1..4) {
                let at = rng.random_range(0..bytes.len());
                bytes[at] ^= 1 << rng.random_range(0..8);
            }
            storage_checkpoint(&[[0u8].as_slice(), &bytes].concat());
            // The payload, re-framed with a right checksum.
            storage_checkpoint(&[[1u8].as_slice(), &bytes[checkpoint::PREAMBLE..]].concat());
            let edits: Vec<u8> = (0..9).map(|_| rng.random()).collect();
            storage_checkpoint(&[[2u8].as_slice(), &edits].concat());
        }
    }

    #[test]
    fn random_peer_requests_are_answered_without_panics() {
        let mut rng = StdRng::seed_from_u64(6);
        for _ in 0..300 {
            let len = rng.random_range(0..200);
            let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            peer_request(&bytes);
        }
        // Well-formed requests of every kind, with nonsense inside.
        use crate::proto::{self, request::Body};
        let block = proto::BlockId { number: 0, hash: vec![0; 32] };
        for body in [
            Body::Witness(Default::default()),
            Body::Top(Default::default()),
            Body::ApplyBlock(Default::default()),
            Body::Head(Default::default()),
            Body::Submit(proto::Submission {
                transactions: vec![vec![0xf8, 0x01]],
                witness_at: Some(block),
                witness_root: vec![0; 32],
                ..Default::default()
            }),
            Body::Announce(Default::default()),
        ] {
            peer_request(&prost::Message::encode_to_vec(&proto::Request { body: Some(body) }));
        }
    }
}
