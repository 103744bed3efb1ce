//! The operations every trie under benchmark offers, so one harness drives them all.

/// One trie implementation under test, used as a *secure* state trie:
/// the implementation hashes each 20-byte address with keccak-256 itself
/// (so hashing cost is paid equally), and values are account RLP.
pub trait BenchTrie {
    /// Short stable name used in reports and JSON (`virga`, `eth_trie`, `trie_db`, `alloy_hash_builder`).
    fn name(&self) -> &'static str;
    /// Inserts or overwrites one account; no root is computed.
    fn insert(&mut self, address: &[u8; 20], account_rlp: &[u8]);
    /// Loads many accounts at once (the bulk-insert measurement). Implementations
    /// without a bulk path insert one at a time, which is this default.
    fn insert_batch(&mut self, accounts: &AccountBatch) {
        for (address, account_rlp) in accounts.iter() {
            self.insert(address, account_rlp);
        }
    }
    /// Looks an account up; returns the length of the value found (0 if absent),
    /// so that no implementation pays for a copy the others avoid.
    fn get(&mut self, address: &[u8; 20]) -> usize;
    /// Looks up a batch of accounts (a storage node answering a witness request);
    /// returns the total length found. Implementations without a batch path loop.
    fn get_batch(&mut self, addresses: &[[u8; 20]]) -> usize {
        addresses.iter().map(|address| self.get(address)).sum()
    }
    /// Computes (and, where the implementation needs it, commits) the current state root.
    fn root(&mut self) -> [u8; 32];
    /// EIP-1186-style proof for one account at the last computed root: RLP nodes root → leaf.
    fn prove(&mut self, address: &[u8; 20]) -> Vec<Vec<u8>>;
}

/// Accounts to load, held in three contiguous buffers: building it frees nothing
/// small, so the memory measured after loading belongs to the trie alone.
pub struct AccountBatch {
    addresses: Vec<[u8; 20]>,
    rlp: Vec<u8>,
    ends: Vec<usize>,
}

impl AccountBatch {
    pub fn new(addresses: &[[u8; 20]], accounts: &[virga_trie::account::Account]) -> Self {
        let mut rlp = Vec::with_capacity(accounts.len() * 80);
        let mut ends = Vec::with_capacity(accounts.len());
        for account in accounts {
            alloy_rlp::Encodable::encode(account, &mut rlp);
            ends.push(rlp.len());
        }
        Self { addresses: addresses.to_vec(), rlp, ends }
    }

    pub fn len(&self) -> usize {
        self.addresses.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty()
    }

    /// (address, account RLP) pairs in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8; 20], &[u8])> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        self.addresses
            .iter()
            .zip(starts.zip(self.ends.iter().copied()))
            .map(|(address, (start, end))| (address, &self.rlp[start..end]))
    }
}
