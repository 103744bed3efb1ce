//! The operations every trie under benchmark offers, so one harness drives them all.

/// One trie implementation under test, used as a *secure* state trie:
/// the implementation hashes each 20-byte address with keccak-256 itself
/// (so hashing cost is paid equally), and values are account RLP.
pub trait BenchTrie {
    /// Short stable name used in reports and JSON (`virga`, `eth_trie`, `trie_db`, `alloy_hash_builder`).
    fn name(&self) -> &'static str;
    /// Inserts or overwrites one account; no root is computed.
    fn insert(&mut self, address: &[u8; 20], account_rlp: &[u8]);
    /// Looks an account up; returns the length of the value found (0 if absent),
    /// so that no implementation pays for a copy the others avoid.
    fn get(&mut self, address: &[u8; 20]) -> usize;
    /// Computes (and, where the implementation needs it, commits) the current state root.
    fn root(&mut self) -> [u8; 32];
    /// EIP-1186-style proof for one account at the last computed root: RLP nodes root → leaf.
    fn prove(&mut self, address: &[u8; 20]) -> Vec<Vec<u8>>;
}
