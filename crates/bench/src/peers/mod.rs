//! Peer tries measured next to Virga's DSM-Tree (only built with the `peers` feature).
//!
//! Every adapter is used as an Ethereum *secure* state trie: it hashes the 20-byte
//! address with keccak-256 itself (the same `alloy_primitives::keccak256` for all of
//! them, so key hashing costs the same everywhere) and stores the account RLP as is.
//!
//! | adapter | crate | state root | how a root is computed |
//! | --- | --- | --- | --- |
//! | [`EthTriePeer`] | `eth_trie` | Ethereum's | incremental: commit of the dirty paths |
//! | [`TrieDbPeer`] | `trie-db` | Ethereum's ([`EthereumLayout`]) | incremental: commit of the dirty paths |
//! | [`HashBuilderPeer`] | `alloy-trie` | Ethereum's | full rebuild over all sorted leaves |

use std::collections::BTreeMap;
use std::sync::Arc;

use alloy_primitives::{keccak256, B256};
use alloy_trie::proof::ProofRetainer;
use alloy_trie::{HashBuilder, Nibbles};
use eth_trie::{EthTrie, MemoryDB as EthMemoryDb, Trie as _};
use hash_db::{AsHashDB, HashDB, Hasher, Prefix};
use keccak_hasher::KeccakHasher;
use memory_db::{HashKey, MemoryDB};
use self_cell::{self_cell, MutBorrow};
use trie_db::recorder::Recorder;
use trie_db::{DBValue, Trie as _, TrieDBBuilder, TrieDBMut, TrieDBMutBuilder, TrieMut as _};

use crate::trie_impl::BenchTrie;

mod ethereum_layout;
pub use ethereum_layout::{EthereumLayout, EthereumNodeCodec, NodeDecodeError};

// ---------------------------------------------------------------------------------------
// eth_trie
// ---------------------------------------------------------------------------------------

/// `eth_trie` 0.6 (`EthTrie` over its in-memory `MemoryDB`): an Ethereum Merkle-Patricia
/// trie whose root equals Ethereum's state root for the same accounts.
///
/// Memory model, as the crate implements it:
/// * between commits, the nodes touched by inserts live decoded in memory (branch and
///   extension nodes behind `Arc<RwLock<..>>`, leaves owning their value);
/// * [`BenchTrie::root`] calls `root_hash`, which commits: the dirty nodes are RLP-encoded
///   into a staging map, copied into the `MemoryDB` (a `HashMap<Vec<u8>, Vec<u8>>` of
///   hash → node RLP; the default `insert_batch` clones each node, so a commit briefly
///   holds its batch twice), and the decoded tree is dropped except the root node, whose children
///   become hash references. So after a commit the trie is held once, as RLP, in the db;
///   it does not keep a decoded node cache next to it;
/// * reads below the root therefore copy each node's RLP out of the db and decode it on
///   every lookup, and `get` returns an owned copy of the value.
///
/// The db is created in "light" mode: at each commit the nodes that inserts replaced are
/// deleted, so memory holds the current trie only (as `TrieDbPeer` does here), not every
/// historical version.
pub struct EthTriePeer {
    trie: EthTrie<EthMemoryDb>,
}

impl EthTriePeer {
    pub fn new() -> Self {
        let db = Arc::new(EthMemoryDb::new(true));
        Self { trie: EthTrie::new(db) }
    }
}

impl Default for EthTriePeer {
    fn default() -> Self {
        Self::new()
    }
}

impl BenchTrie for EthTriePeer {
    fn name(&self) -> &'static str {
        "eth_trie"
    }

    fn insert(&mut self, address: &[u8; 20], account_rlp: &[u8]) {
        let key = keccak256(address);
        self.trie.insert(key.as_slice(), account_rlp).expect("eth_trie insert");
    }

    fn get(&mut self, address: &[u8; 20]) -> usize {
        let key = keccak256(address);
        self.trie.get(key.as_slice()).expect("eth_trie get").map_or(0, |value| value.len())
    }

    fn root(&mut self) -> [u8; 32] {
        self.trie.root_hash().expect("eth_trie commit").0
    }

    /// `get_proof` walks the committed trie; called with inserts pending since the last
    /// [`BenchTrie::root`], it would encode (and stage) those pending nodes instead, so the
    /// harness proves only right after a root.
    fn prove(&mut self, address: &[u8; 20]) -> Vec<Vec<u8>> {
        let key = keccak256(address);
        self.trie.get_proof(key.as_slice()).expect("eth_trie proof")
    }
}

// ---------------------------------------------------------------------------------------
// trie-db
// ---------------------------------------------------------------------------------------

/// trie-db's layout for this peer: Ethereum's node encoding and keccak-256.
type Layout = EthereumLayout;
type NodeHash = <KeccakHasher as Hasher>::Out;

/// memory-db's map of node hash → (encoded node, reference count).
type NodeMap = MemoryDB<KeccakHasher, HashKey<KeccakHasher>, DBValue>;

/// A [`NodeMap`] that drops a node as soon as its reference count reaches zero.
///
/// `memory-db` on its own only decrements the count on `remove` and keeps the dead entry
/// until someone calls `purge()` (a scan of the whole map). `TrieDBMut` removes every node
/// it replaces at commit time, so routing `remove` to `remove_and_purge` frees replaced
/// nodes incrementally, at commit, like `eth_trie`'s light mode.
struct PruningNodeDb(NodeMap);

impl Default for PruningNodeDb {
    /// memory-db's own default takes `0x00`, parity's codec's empty node, for the empty trie;
    /// Ethereum's is `0x80`, whose hash is the empty root a fresh `TrieDBMut` starts from.
    fn default() -> Self {
        Self(NodeMap::new(<EthereumNodeCodec as trie_db::NodeCodec>::empty_node()))
    }
}

impl HashDB<KeccakHasher, DBValue> for PruningNodeDb {
    fn get(&self, key: &NodeHash, prefix: Prefix) -> Option<DBValue> {
        HashDB::get(&self.0, key, prefix)
    }

    fn contains(&self, key: &NodeHash, prefix: Prefix) -> bool {
        HashDB::contains(&self.0, key, prefix)
    }

    fn insert(&mut self, prefix: Prefix, value: &[u8]) -> NodeHash {
        HashDB::insert(&mut self.0, prefix, value)
    }

    fn emplace(&mut self, key: NodeHash, prefix: Prefix, value: DBValue) {
        HashDB::emplace(&mut self.0, key, prefix, value);
    }

    fn remove(&mut self, key: &NodeHash, prefix: Prefix) {
        self.0.remove_and_purge(key, prefix);
    }
}

impl AsHashDB<KeccakHasher, DBValue> for PruningNodeDb {
    fn as_hash_db(&self) -> &dyn HashDB<KeccakHasher, DBValue> {
        self
    }

    fn as_hash_db_mut<'a>(&'a mut self) -> &'a mut (dyn HashDB<KeccakHasher, DBValue> + 'a) {
        self
    }
}

/// What a `TrieDBMut` borrows mutably for its whole life: the node db and the root slot
/// it writes at each commit.
struct TrieDbStore {
    db: PruningNodeDb,
    root: NodeHash,
}

type OpenTrie<'a> = TrieDBMut<'a, Layout>;

self_cell!(
    /// The store together with the `TrieDBMut` that borrows it.
    struct OpenTrieCell {
        owner: MutBorrow<TrieDbStore>,

        #[not_covariant]
        dependent: OpenTrie,
    }
);

/// Parity's `trie-db` 0.32 (`TrieDBMut` over `memory-db` 0.34) with Ethereum's node codec
/// ([`EthereumLayout`]): its roots are Ethereum's state roots and its proofs EIP-1186 proofs,
/// so it hashes and encodes exactly what the other tries do.
///
/// One `TrieDBMut` stays open for the adapter's whole life, so inserts accumulate in its
/// in-memory node storage and [`BenchTrie::root`] commits them, as a client would use it.
/// `TrieDBMut<'a, _>` holds `&'a mut` borrows of its db and of its root slot, which plain
/// safe Rust cannot keep in the same struct as the things they borrow; the `self_cell`
/// crate (`MutBorrow` owner, `TrieDBMut` dependent) provides exactly that pairing, so no
/// commit-and-reopen is needed between calls.
///
/// Memory model: between commits, every node an insert touched lives decoded in the
/// `TrieDBMut`'s node storage. A commit encodes them into the memory-db and empties that
/// storage (its slots are kept for reuse, so the `Vec` keeps its high-water capacity) and
/// the root becomes a hash handle; the trie then lives once, encoded, in the memory-db,
/// with replaced nodes freed at commit (see `PruningNodeDb`). Reads of committed nodes
/// copy each node's encoding out of the db and decode it, and `get` returns an owned copy
/// of the value.
pub struct TrieDbPeer {
    cell: OpenTrieCell,
    /// Root written by the last [`BenchTrie::root`]; proofs are taken against it.
    last_root: NodeHash,
}

impl TrieDbPeer {
    pub fn new() -> Self {
        let store = TrieDbStore { db: PruningNodeDb::default(), root: NodeHash::default() };
        let cell = OpenTrieCell::new(MutBorrow::new(store), |owner| {
            let TrieDbStore { db, root } = owner.borrow_mut();
            TrieDBMutBuilder::<Layout>::new(db, root).build()
        });
        let mut peer = Self { cell, last_root: NodeHash::default() };
        // The empty trie's root (keccak-256 of RLP's empty string); commits nothing.
        peer.root();
        peer
    }
}

impl Default for TrieDbPeer {
    fn default() -> Self {
        Self::new()
    }
}

impl BenchTrie for TrieDbPeer {
    fn name(&self) -> &'static str {
        "trie_db"
    }

    fn insert(&mut self, address: &[u8; 20], account_rlp: &[u8]) {
        let key = keccak256(address);
        self.cell.with_dependent_mut(|_, trie| {
            trie.insert(key.as_slice(), account_rlp).expect("trie-db insert");
        });
    }

    fn get(&mut self, address: &[u8; 20]) -> usize {
        let key = keccak256(address);
        self.cell
            .with_dependent(|_, trie| trie.get(key.as_slice()).expect("trie-db get").map_or(0, |value| value.len()))
    }

    fn root(&mut self) -> [u8; 32] {
        let root = self.cell.with_dependent_mut(|_, trie| *trie.root());
        self.last_root = root;
        root
    }

    /// Reads the key through a read-only `TrieDB` at the last root, over the same db, with
    /// a `Recorder`; the recorded nodes come in access order, root → leaf.
    fn prove(&mut self, address: &[u8; 20]) -> Vec<Vec<u8>> {
        let key = keccak256(address);
        let root = self.last_root;
        self.cell.with_dependent(|_, trie| {
            let db = trie.db();
            let mut recorder = Recorder::<Layout>::new();
            {
                let reader = TrieDBBuilder::<Layout>::new(&db, &root).with_recorder(&mut recorder).build();
                reader.get(key.as_slice()).expect("trie-db proof lookup");
            }
            recorder.drain().into_iter().map(|record| record.data).collect()
        })
    }
}

// ---------------------------------------------------------------------------------------
// alloy-trie HashBuilder
// ---------------------------------------------------------------------------------------

/// alloy-trie's `HashBuilder` (the root computation reth uses), over a sorted map of
/// hashed key → account RLP.
///
/// The `HashBuilder` is a one-pass streaming hasher, not a trie: it keeps no nodes between
/// runs. So this peer has no incremental structure. Inserts and gets go to the
/// `BTreeMap`, and **every [`BenchTrie::root`] is a full `HashBuilder` pass over all leaves
/// in key order**, and every [`BenchTrie::prove`] is another full pass with a
/// `ProofRetainer` targeting that one key. (reth makes this incremental by storing branch
/// nodes in its database and feeding unchanged subtrees back as hashes; that machinery is
/// not part of alloy-trie.) Its root equals Ethereum's state root.
///
/// `prove` proves the leaves as they are now, which is the last computed root as long as
/// nothing was inserted since (the harness proves right after a root).
#[derive(Default)]
pub struct HashBuilderPeer {
    leaves: BTreeMap<B256, Vec<u8>>,
}

impl HashBuilderPeer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds every leaf, in key order, to `builder` and returns the root.
    fn run<K>(&self, builder: &mut HashBuilder<K>) -> B256
    where
        K: AsRef<alloy_trie::proof::AddedRemovedKeys>,
    {
        for (key, value) in &self.leaves {
            builder.add_leaf(Nibbles::unpack(key), value);
        }
        builder.root()
    }
}

impl BenchTrie for HashBuilderPeer {
    fn name(&self) -> &'static str {
        "alloy_hash_builder"
    }

    fn insert(&mut self, address: &[u8; 20], account_rlp: &[u8]) {
        self.leaves.insert(keccak256(address), account_rlp.to_vec());
    }

    fn get(&mut self, address: &[u8; 20]) -> usize {
        self.leaves.get(&keccak256(address)).map_or(0, Vec::len)
    }

    fn root(&mut self) -> [u8; 32] {
        self.run(&mut HashBuilder::default()).0
    }

    fn prove(&mut self, address: &[u8; 20]) -> Vec<Vec<u8>> {
        let target = Nibbles::unpack(keccak256(address));
        let retainer = ProofRetainer::new(vec![target]);
        let mut builder = HashBuilder::default().with_proof_retainer(retainer);
        self.run(&mut builder);
        // Only nodes on the target's path are retained; sorting by path puts the root
        // (empty path) first and the leaf last.
        builder.take_proof_nodes().into_nodes_sorted().into_iter().map(|(_, node)| node.to_vec()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::Bytes;
    use alloy_rlp::Encodable;
    use alloy_trie::proof::verify_proof;
    use alloy_trie::{EMPTY_ROOT_HASH, KECCAK_EMPTY};

    const ACCOUNTS: usize = 500;

    /// SplitMix64: deterministic, seedable, no dependency on `rand`'s stream stability.
    struct Mix(u64);

    impl Mix {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn address(&mut self) -> [u8; 20] {
            let mut address = [0; 20];
            for chunk in address.chunks_mut(8) {
                chunk.copy_from_slice(&self.next().to_le_bytes()[..chunk.len()]);
            }
            address
        }
    }

    /// `count` distinct accounts: (address, account RLP as Ethereum encodes it).
    fn accounts(seed: u64, count: usize) -> Vec<([u8; 20], Vec<u8>)> {
        let mut mix = Mix(seed);
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            let address = mix.address();
            if !seen.insert(address) {
                continue;
            }
            // [nonce, balance, storage_root, code_hash], as an Ethereum account.
            let mut payload = Vec::new();
            (mix.next() % 1_000).encode(&mut payload);
            (u128::from(mix.next()) * 1_000_000_007).encode(&mut payload);
            EMPTY_ROOT_HASH.encode(&mut payload);
            KECCAK_EMPTY.encode(&mut payload);
            let mut rlp = Vec::new();
            alloy_rlp::Header { list: true, payload_length: payload.len() }.encode(&mut rlp);
            rlp.extend_from_slice(&payload);
            assert!(rlp.len() >= 40);
            out.push((address, rlp));
        }
        out
    }

    fn build<T: BenchTrie>(mut trie: T, data: &[([u8; 20], Vec<u8>)]) -> T {
        for (address, rlp) in data {
            trie.insert(address, rlp);
        }
        trie
    }

    fn absent_address() -> [u8; 20] {
        // Seeds differ from the data's, and `accounts` never yields this exact pattern.
        [0xab; 20]
    }

    #[test]
    fn ethereum_compatible_roots_agree() {
        let data = accounts(7, 3_000);
        let mut eth = build(EthTriePeer::new(), &data);
        let mut db = build(TrieDbPeer::new(), &data);
        let mut hb = build(HashBuilderPeer::new(), &data);
        let mut virga = build(crate::trie::VirgaTrie::default(), &data);
        let root = hb.root();
        assert_ne!(B256::from(root), EMPTY_ROOT_HASH);
        assert_eq!(eth.root(), root, "eth_trie");
        assert_eq!(db.root(), root, "trie_db");
        assert_eq!(virga.root(), root, "virga");
    }

    #[test]
    fn empty_roots() {
        assert_eq!(B256::from(EthTriePeer::new().root()), EMPTY_ROOT_HASH);
        assert_eq!(B256::from(HashBuilderPeer::new().root()), EMPTY_ROOT_HASH);
        let mut db = TrieDbPeer::new();
        assert_eq!(B256::from(db.root()), EMPTY_ROOT_HASH);
        assert_eq!(db.get(&absent_address()), 0);
    }

    fn check_gets<T: BenchTrie>(trie: &mut T, data: &[([u8; 20], Vec<u8>)]) {
        for (address, rlp) in data {
            assert_eq!(trie.get(address), rlp.len(), "{} lost an account", trie.name());
        }
        assert_eq!(trie.get(&absent_address()), 0, "{} found an absent account", trie.name());
    }

    #[test]
    fn gets_find_every_account_before_and_after_commit() {
        let data = accounts(11, ACCOUNTS);
        let mut eth = build(EthTriePeer::new(), &data);
        let mut db = build(TrieDbPeer::new(), &data);
        let mut hb = build(HashBuilderPeer::new(), &data);
        // Uncommitted, then committed.
        check_gets(&mut eth, &data);
        check_gets(&mut db, &data);
        check_gets(&mut hb, &data);
        eth.root();
        db.root();
        hb.root();
        check_gets(&mut eth, &data);
        check_gets(&mut db, &data);
        check_gets(&mut hb, &data);
    }

    /// Ethereum proof checks: root node hashes to the root, alloy accepts the proof.
    fn check_ethereum_proofs<T: BenchTrie>(trie: &mut T, data: &[([u8; 20], Vec<u8>)]) {
        let root = B256::from(trie.root());
        for (address, rlp) in data {
            let proof = trie.prove(address);
            assert!(!proof.is_empty(), "{}: empty proof", trie.name());
            assert_eq!(keccak256(&proof[0]), root, "{}: first node is not the root", trie.name());
            let nodes: Vec<Bytes> = proof.into_iter().map(Bytes::from).collect();
            let key = Nibbles::unpack(keccak256(address));
            if let Err(error) = verify_proof(root, key, Some(rlp.clone()), &nodes) {
                panic!("{}: proof rejected: {error:?}", trie.name());
            }
        }
    }

    #[test]
    fn eth_trie_proofs_verify() {
        let data = accounts(13, ACCOUNTS);
        let mut eth = build(EthTriePeer::new(), &data);
        check_ethereum_proofs(&mut eth, &data);
    }

    #[test]
    fn hash_builder_proofs_verify() {
        let data = accounts(17, ACCOUNTS);
        let mut hb = build(HashBuilderPeer::new(), &data);
        check_ethereum_proofs(&mut hb, &data);
    }

    #[test]
    fn proofs_are_identical_between_ethereum_peers() {
        let data = accounts(19, 100);
        let mut eth = build(EthTriePeer::new(), &data);
        let mut hb = build(HashBuilderPeer::new(), &data);
        assert_eq!(eth.root(), hb.root());
        for (address, _) in &data {
            assert_eq!(eth.prove(address), hb.prove(address));
        }
    }

    #[test]
    fn trie_db_proofs_verify_as_eip_1186() {
        let data = accounts(23, 3_000);
        let mut db = build(TrieDbPeer::new(), &data);
        check_ethereum_proofs(&mut db, &data);
        // Virga's verifier accepts the same proofs.
        let root = B256::from(db.root());
        for (address, rlp) in data.iter().step_by(7) {
            let proof = db.prove(address);
            let proven = virga_trie::proof::verify_proof(root, keccak256(address).as_slice(), &proof).unwrap();
            assert_eq!(proven.as_ref(), Some(rlp));
        }
    }

    /// Same nodes as alloy-trie's, node for node: the codec is Ethereum's encoding, not one
    /// that merely hashes consistently.
    #[test]
    fn trie_db_and_hash_builder_prove_with_the_same_nodes() {
        let data = accounts(37, 300);
        let mut db = build(TrieDbPeer::new(), &data);
        let mut hb = build(HashBuilderPeer::new(), &data);
        assert_eq!(db.root(), hb.root());
        for (address, _) in data.iter().step_by(3) {
            assert_eq!(db.prove(address), hb.prove(address));
        }
    }

    /// Commit midway, then overwrite some accounts and add others: the root must be the
    /// one a fresh trie gives for the final data, and every account must still be found
    /// (for `eth_trie` and the pruning memory-db, this checks that pruning at commit frees
    /// only replaced nodes).
    fn check_incremental<T: BenchTrie>(make: impl Fn() -> T) {
        let first = accounts(29, ACCOUNTS);
        let mut updates = accounts(31, ACCOUNTS / 5);
        // Half the updates overwrite existing accounts with new values.
        for (i, update) in updates.iter_mut().enumerate().take(ACCOUNTS / 10) {
            update.0 = first[i * 3].0;
        }
        let mut trie = build(make(), &first);
        trie.root();
        for (address, rlp) in &updates {
            trie.insert(address, rlp);
        }
        let incremental_root = trie.root();

        let mut final_data: BTreeMap<[u8; 20], Vec<u8>> = first.into_iter().collect();
        final_data.extend(updates);
        let final_data: Vec<_> = final_data.into_iter().collect();
        let mut fresh = build(make(), &final_data);
        assert_eq!(incremental_root, fresh.root(), "{}: incremental root differs", trie.name());
        check_gets(&mut trie, &final_data);
        for (address, _) in final_data.iter().step_by(25) {
            assert!(!trie.prove(address).is_empty());
        }
    }

    #[test]
    fn incremental_roots_match_fresh_builds() {
        check_incremental(EthTriePeer::new);
        check_incremental(TrieDbPeer::new);
        check_incremental(HashBuilderPeer::new);
    }
}
