//! A state with its executor's [`ReadCache`]: what Virga's serial and parallel executors run
//! over across blocks.

use alloy_primitives::B256;
use virga_trie::account::StateTrie;

use crate::block::{execute_over, execute_with, ExecutedBlock};
use crate::db::{BlockHashes, StateDb, StateError};
use crate::executor::BlockContext;
use crate::flat::FlatBlock;
use crate::overlay::{BlockOverlay, BlockSeen, BlockWrites, ReadCache};
use crate::parallel::{execute_parallel, ParallelStats};
use crate::reference::{genesis_state, GenesisAccount};
use crate::transaction::EthTransaction;

/// A state with its executor's [`ReadCache`]: blocks execute over the trie with hot
/// accounts and slots served from memory. The state changes only through
/// [`CachedState::execute_block`], which keeps the cache equal to it.
///
/// Write-through (the default) puts each block's writes into the trie as the block ends.
/// Write-back ([`Self::with_write_back`]) keeps them in the cache until the state or its
/// root is asked for, or the cache (or, with a flat copy, the pending writes) outgrows the
/// capacity: the trie's updates then happen once for many blocks, where the root is needed,
/// as a full node computes roots apart from execution.
///
/// [`Self::from_genesis`] keeps a flat copy of the whole state instead of a cache of what
/// blocks read: every read is one hash probe, and the trie serves roots and proofs only.
/// Ethereum's clients execute that way (geth's snapshot, reth's plain state); it costs the
/// memory of a second copy of accounts and slots.
#[derive(Clone)]
pub struct CachedState {
    state: StateTrie,
    cache: ReadCache,
    capacity: usize,
    write_back: bool,
    pending: Vec<BlockWrites>,
    /// Accounts and slots the pending blocks wrote.
    pending_entries: usize,
    /// A block failed partway through over the flat copy, which kept the writes it had
    /// made: the state no longer answers.
    damaged: Option<StateError>,
}

impl CachedState {
    /// Entries (accounts plus slots) the cache holds by default.
    pub const DEFAULT_CAPACITY: usize = 1 << 21;

    pub fn new(state: StateTrie, capacity: usize) -> Self {
        Self::with_cache(state, ReadCache::new(), capacity)
    }

    fn with_cache(state: StateTrie, cache: ReadCache, capacity: usize) -> Self {
        Self { state, cache, capacity, write_back: false, pending: Vec::new(), pending_entries: 0, damaged: None }
    }

    /// The genesis in the DSM-Tree, with a flat copy of every account and slot beside it
    /// that reads are served from (see the type's documentation).
    pub fn from_genesis(accounts: &[GenesisAccount]) -> Self {
        Self::with_cache(genesis_state(accounts), ReadCache::flat_copy(accounts), Self::DEFAULT_CAPACITY)
    }

    pub fn with_write_back(mut self, write_back: bool) -> Self {
        self.flush();
        self.write_back = write_back;
        self
    }

    /// The state after every executed block.
    pub fn state(&mut self) -> &StateTrie {
        self.flush();
        &self.state
    }

    pub fn into_state(mut self) -> StateTrie {
        self.flush();
        self.state
    }

    /// The state root (storage roots of changed accounts recorded first).
    pub fn root(&mut self) -> B256 {
        self.flush();
        self.state.root()
    }

    /// Puts the pending blocks' writes into the trie, in order.
    pub fn flush(&mut self) {
        for writes in self.pending.drain(..) {
            writes.apply_to(&mut self.state);
        }
        self.pending_entries = 0;
        self.cache.written();
    }

    /// Executes a block as [`Self::execute_block`] does, with [`crate::parallel`]'s executor
    /// on rayon's pool (serially where it says the block needs to).
    pub fn execute_block_parallel(
        &mut self,
        hashes: &dyn BlockHashes,
        block: &BlockContext,
        txs: &[EthTransaction],
    ) -> Result<(ExecutedBlock, ParallelStats), StateError> {
        if let Some(error) = &self.damaged {
            return Err(error.clone());
        }
        let base = StateDb::new(&self.state, hashes);
        let (executed, writes, seen, stats) = match execute_parallel(base, Some(&self.cache), block, txs) {
            Ok(done) => done,
            Err((error, _)) => return Err(error),
        };
        if stats.serial.is_some() {
            return Ok((self.execute_block(hashes, block, txs)?, stats));
        }
        self.finish_block(writes, seen);
        Ok((executed, stats))
    }

    /// Executes a block as [`crate::execute_block`] does, reading through the cache.
    pub fn execute_block(
        &mut self,
        hashes: &dyn BlockHashes,
        block: &BlockContext,
        txs: &[EthTransaction],
    ) -> Result<ExecutedBlock, StateError> {
        if let Some(error) = &self.damaged {
            return Err(error.clone());
        }
        let base = StateDb::new(&self.state, hashes);
        if self.cache.is_complete() {
            let flat = FlatBlock::new(&mut self.cache, base, self.write_back);
            let (executed, flat) = execute_with(flat, block, txs).inspect_err(|error| {
                // The flat copy took the block's writes up to the failure; the trie did not.
                self.damaged = Some(error.clone());
            })?;
            let writes = flat.finish();
            self.keep_writes(writes);
            return Ok(executed);
        }
        let overlay = BlockOverlay::new(base, Some(&self.cache), 2 * txs.len());
        let (executed, writes, seen) = execute_over(overlay, block, txs)?;
        self.finish_block(writes, seen);
        Ok(executed)
    }

    /// `seen`: what the block read and wrote, where the cache keeps reads.
    fn finish_block(&mut self, writes: BlockWrites, seen: Option<BlockSeen>) {
        match seen {
            Some(seen) => self.cache.absorb(seen, self.write_back),
            None => self.cache.absorb_writes(&writes, self.write_back),
        }
        self.keep_writes(writes);
    }

    /// Puts a block's writes into the trie, or keeps them for later (write-back), once the
    /// cache has taken them.
    fn keep_writes(&mut self, writes: BlockWrites) {
        if self.write_back {
            self.pending_entries += writes.entries();
            self.pending.push(writes);
        } else {
            writes.apply_to(&mut self.state);
        }
        if self.cache.is_complete() {
            if self.pending_entries > self.capacity {
                self.flush();
            }
        } else if self.cache.len() > self.capacity {
            // Start over, once the trie holds everything the cache answered for.
            self.flush();
            self.cache = ReadCache::new();
        }
    }
}
