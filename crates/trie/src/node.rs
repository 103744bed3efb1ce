//! Pointer-linked trie nodes with lazily computed, cached hashes.
//!
//! A node is a `triomphe::Arc` (a reference count without weak references, 8 bytes
//! smaller than `std`'s), so a version of the trie is just a root pointer: taking a
//! snapshot clones one `Arc` (O(1)) and an update copies only the nodes on its path
//! when they are shared with another version (`Arc::make_mut`). A node's hash is
//! computed the first time a root or proof needs it and cached in the node; any
//! mutation clears the cache of exactly the nodes on the updated path.

use std::sync::OnceLock;

use smallvec::SmallVec;
use triomphe::Arc;

use alloy_primitives::{keccak256, B256};

use crate::path::{self, nibble_count, packed_len};
use crate::{rlp, value};

/// A shared pointer to one trie node.
#[derive(Clone)]
pub(crate) struct Node(pub(crate) Arc<NodeInner>);

#[derive(Clone)]
pub(crate) struct NodeInner {
    /// Counts live nodes in tests through its `Clone` and `Drop` (zero-sized otherwise).
    _live: live::Token,
    /// keccak-256 of the node's RLP, once computed. Always set for `Kind::Hash`.
    /// Never set for nodes whose RLP is shorter than 32 bytes (they are inlined in
    /// their parent instead of referenced by hash).
    pub(crate) hash: OnceLock<B256>,
    pub(crate) kind: Kind,
}

#[derive(Clone)]
pub(crate) enum Kind {
    /// Packed remaining path followed by the stored value (see `value`), in one allocation.
    Leaf(path::LeafBytes),
    /// Packed shared path, and the branch it leads to.
    Extension(Box<[u8]>, Node),
    Branch(Branch),
    /// A subtree known only by its hash (the partial top layer); the hash is in `hash`.
    Hash,
}

/// A branch keeps only its present children, in nibble order, with a bitmask saying
/// which nibbles they are. Most branches deep in a large trie have two children, which
/// are kept inline so reaching them costs no further allocation or cache miss.
#[derive(Clone)]
pub(crate) struct Branch {
    pub(crate) mask: u16,
    pub(crate) children: SmallVec<[Node; 2]>,
    /// Only plain tries with keys that prefix other keys use branch values; boxed
    /// twice so the common case costs one pointer.
    pub(crate) value: Option<Box<Box<[u8]>>>,
}

impl Branch {
    pub(crate) fn empty() -> Self {
        Self { mask: 0, children: SmallVec::new(), value: None }
    }

    #[inline(always)]
    fn index(&self, nibble: u8) -> usize {
        (self.mask & ((1u16 << nibble) - 1)).count_ones() as usize
    }

    #[inline(always)]
    pub(crate) fn child(&self, nibble: u8) -> Option<&Node> {
        if self.mask & (1 << nibble) == 0 {
            None
        } else {
            Some(&self.children[self.index(nibble)])
        }
    }

    #[inline(always)]
    pub(crate) fn child_mut(&mut self, nibble: u8) -> Option<&mut Node> {
        if self.mask & (1 << nibble) == 0 {
            None
        } else {
            let index = self.index(nibble);
            Some(&mut self.children[index])
        }
    }

    /// Sets or replaces the child at `nibble`.
    pub(crate) fn set_child(&mut self, nibble: u8, node: Node) {
        let index = self.index(nibble);
        if self.mask & (1 << nibble) != 0 {
            self.children[index] = node;
        } else {
            self.children.insert(index, node);
            self.mask |= 1 << nibble;
        }
    }

    pub(crate) fn remove_child(&mut self, nibble: u8) {
        if self.mask & (1 << nibble) != 0 {
            let index = self.index(nibble);
            self.children.remove(index);
            self.mask &= !(1 << nibble);
        }
    }

    /// Present children with their nibbles, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u8, &Node)> {
        (0u8..16).filter(|n| self.mask & (1 << n) != 0).zip(self.children.iter())
    }

    pub(crate) fn value(&self) -> Option<&[u8]> {
        self.value.as_deref().map(|v| &v[..])
    }

    /// Children plus the value slot if used: a valid branch has at least two.
    pub(crate) fn entry_count(&self) -> usize {
        self.children.len() + usize::from(self.value.is_some())
    }
}

impl Node {
    fn new(kind: Kind) -> Self {
        Node(Arc::new(NodeInner { _live: live::Token::new(), hash: OnceLock::new(), kind }))
    }

    pub(crate) fn leaf(nibbles: impl ExactSizeIterator<Item = u8>, value: &[u8]) -> Self {
        Self::new(Kind::Leaf(path::pack_leaf(nibbles, value.len(), |out| value::store(value, out))))
    }

    /// A leaf whose value is given in its stored form (moving a leaf to another path).
    pub(crate) fn leaf_stored(nibbles: impl ExactSizeIterator<Item = u8>, stored: &[u8]) -> Self {
        Self::new(Kind::Leaf(path::pack_leaf(nibbles, stored.len(), |out| out.extend_from_slice(stored))))
    }

    pub(crate) fn extension(nibbles: impl ExactSizeIterator<Item = u8>, child: Node) -> Self {
        debug_assert!(matches!(child.kind(), Kind::Branch(_) | Kind::Hash));
        Self::new(Kind::Extension(path::pack(nibbles, &[]), child))
    }

    pub(crate) fn branch(branch: Branch) -> Self {
        Self::new(Kind::Branch(branch))
    }

    pub(crate) fn hash_node(hash: B256) -> Self {
        let node = Self::new(Kind::Hash);
        let _ = node.0.hash.set(hash);
        node
    }

    #[inline(always)]
    pub(crate) fn kind(&self) -> &Kind {
        &self.0.kind
    }

    /// Mutable access for an update: copies the node if another version shares it,
    /// and forgets its cached hash.
    pub(crate) fn make_mut(&mut self) -> &mut Kind {
        let inner = Arc::make_mut(&mut self.0);
        inner.hash = OnceLock::new();
        &mut inner.kind
    }

    /// Mutable access for a change that keeps the subtree's hash (resolving or pruning
    /// a hash node below this one): copies the node if shared, keeps its cached hash.
    pub(crate) fn make_mut_keep_hash(&mut self) -> &mut Kind {
        &mut Arc::make_mut(&mut self.0).kind
    }

    /// Records a hash already known to be this node's (it was checked on arrival).
    pub(crate) fn set_known_hash(&self, hash: B256) {
        let _ = self.0.hash.set(hash);
    }

    /// Where the node lives, for prefetching.
    #[inline(always)]
    pub(crate) fn as_ptr(&self) -> *const u8 {
        Arc::as_ptr(&self.0).cast()
    }

    /// Pointer identity, for counting distinct nodes across versions.
    pub(crate) fn addr(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    pub(crate) fn cached_hash(&self) -> Option<B256> {
        self.0.hash.get().copied()
    }

    /// Appends this node's full RLP encoding to `out`, computing child hashes as needed.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let start = rlp::begin_list(out);
        match self.kind() {
            Kind::Leaf(data) => {
                encode_path(data, true, out);
                value::append_rlp_string(&data[packed_len(data)..], out);
            }
            Kind::Extension(path, child) => {
                encode_path(path, false, out);
                child.append_ref(out);
            }
            Kind::Branch(branch) => {
                for nibble in 0..16 {
                    match branch.child(nibble) {
                        Some(child) => child.append_ref(out),
                        None => out.push(rlp::EMPTY_STRING),
                    }
                }
                rlp::append_string(branch.value().unwrap_or(&[]), out);
            }
            Kind::Hash => {
                // A hash node has no encoding of its own; callers ask for its reference.
                out.truncate(start);
                rlp::append_string(self.cached_hash().unwrap_or_default().as_slice(), out);
                return;
            }
        }
        rlp::end_list(out, start);
    }

    /// Appends the reference a parent holds to this node: the 32-byte hash as an RLP
    /// string, or the node's own RLP when that is shorter than 32 bytes.
    pub(crate) fn append_ref(&self, out: &mut Vec<u8>) {
        if let Some(hash) = self.0.hash.get() {
            out.push(rlp::HASH_HEADER);
            out.extend_from_slice(hash.as_slice());
            return;
        }
        let start = out.len();
        self.encode(out);
        if out.len() - start >= 32 {
            let hash = keccak256(&out[start..]);
            let _ = self.0.hash.set(hash);
            out.truncate(start);
            out.push(rlp::HASH_HEADER);
            out.extend_from_slice(hash.as_slice());
        }
    }

    /// Computes and caches the hashes of the subtrees below this node on rayon's current
    /// pool, splitting at the first branch. Hash caches are set once and are thread-safe, so
    /// a later [`Self::root_hash`] only encodes the nodes above.
    pub(crate) fn prehash_parallel(&self) {
        use rayon::prelude::*;
        match self.kind() {
            Kind::Extension(_, child) => child.prehash_parallel(),
            Kind::Branch(branch) => {
                let children: Vec<&Node> =
                    branch.iter().map(|(_, child)| child).filter(|child| child.cached_hash().is_none()).collect();
                children.par_iter().for_each(|child| child.append_ref(&mut Vec::with_capacity(1024)));
            }
            Kind::Leaf(_) | Kind::Hash => {}
        }
    }

    /// keccak-256 of this node's RLP, as used for a root (always hashed, even when short).
    pub(crate) fn root_hash(&self, scratch: &mut Vec<u8>) -> B256 {
        if let Some(hash) = self.0.hash.get() {
            return *hash;
        }
        scratch.clear();
        self.encode(scratch);
        let hash = keccak256(&scratch[..]);
        if scratch.len() >= 32 {
            let _ = self.0.hash.set(hash);
        }
        hash
    }
}

/// Writes a packed path as an RLP string holding its hex-prefix encoding, without
/// unpacking it: an even path is already packed the way hex-prefix wants it.
fn encode_path(data: &[u8], is_leaf: bool, out: &mut Vec<u8>) {
    let count = nibble_count(data);
    let flag: u8 = if is_leaf { 2 } else { 0 };
    let encoded_len = count / 2 + 1;
    let first = if count % 2 == 1 { (flag + 1) << 4 | path::nibble(data, 0) } else { flag << 4 };
    if encoded_len == 1 {
        rlp::append_string(&[first], out);
        return;
    }
    rlp::append_string_header(encoded_len, out);
    out.push(first);
    if count.is_multiple_of(2) {
        out.extend_from_slice(&data[path::HEADER_LEN..path::HEADER_LEN + count / 2]);
    } else {
        for i in (1..count).step_by(2) {
            out.push(path::nibble(data, i) << 4 | path::nibble(data, i + 1));
        }
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind() {
            Kind::Leaf(data) => {
                let stored = &data[packed_len(data)..];
                write!(f, "Leaf({:?}, {})", path::unpack(data), virga_core::hex::encode_prefixed(value::load(stored)))
            }
            Kind::Extension(p, child) => write!(f, "Ext({:?}, {:?})", path::unpack(p), child),
            Kind::Branch(b) => {
                write!(f, "Branch[")?;
                for (n, c) in b.iter() {
                    write!(f, "{n:x}: {c:?}, ")?;
                }
                write!(f, "]")
            }
            Kind::Hash => write!(f, "Hash({:?})", self.cached_hash()),
        }
    }
}

/// Live-node accounting for tests: proves that dropping a version frees exactly the
/// nodes no other version reaches. Per thread, so parallel tests do not disturb it.
#[cfg(test)]
pub(crate) mod live {
    use std::cell::Cell;

    thread_local! {
        static LIVE: Cell<isize> = const { Cell::new(0) };
    }

    pub(crate) struct Token;

    impl Token {
        pub(crate) fn new() -> Self {
            LIVE.with(|live| live.set(live.get() + 1));
            Token
        }
    }

    impl Clone for Token {
        fn clone(&self) -> Self {
            Token::new()
        }
    }

    impl Drop for Token {
        fn drop(&mut self) {
            LIVE.with(|live| live.set(live.get() - 1));
        }
    }

    /// Nodes currently alive that this thread created.
    pub(crate) fn count() -> isize {
        LIVE.with(Cell::get)
    }
}

#[cfg(not(test))]
pub(crate) mod live {
    #[derive(Clone)]
    pub(crate) struct Token;

    impl Token {
        #[inline(always)]
        pub(crate) fn new() -> Self {
            Token
        }
    }
}
