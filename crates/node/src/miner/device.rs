//! The miner's device, run by its driver: the chain store, and the thread pool its jobs
//! (building a block, verifying an announced one) run on. The core hands both out as
//! device operations and never holds a pool; under the simulator the same executor runs
//! each job in its loop on a one-thread pool.

use alloy_consensus::Header;
use std::path::Path;
use std::sync::Arc;
use virga_ledger::block::Block;
use virga_ledger::store::{ChainStore, StoreOptions};
use virga_net::role::{Detached, IoExecutor};

use super::{ChainDiskError, MinerCore, MinerError, MinerIo, MinerIoDone};
use crate::codec::decode_block;

/// The execution pool could not be built.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct PoolError(#[from] rayon::ThreadPoolBuildError);

/// A thread pool for the miner's parallel execution (`threads` 0: one per core).
pub fn execution_pool(threads: usize) -> Result<Arc<rayon::ThreadPool>, MinerError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|index| format!("miner-exec-{index}"))
        .build()
        .map(Arc::new)
        .map_err(|error| MinerError::Pool(PoolError(error)))
}

/// The miner's device: its chain store (none in tests that keep no chain), and the pool
/// its blocks are built and verified on.
pub struct ChainDisk {
    pub store: Option<ChainStore>,
    pub pool: Arc<rayon::ThreadPool>,
}

impl IoExecutor<MinerCore> for ChainDisk {
    fn execute(&mut self, op: MinerIo) -> MinerIoDone {
        match op {
            MinerIo::Store { number, hash, block } => MinerIoDone::Stored(match self.store.as_mut() {
                Some(store) => store.append(number, hash, &block).map_err(ChainDiskError::from),
                None => Ok(()),
            }),
            MinerIo::Build(job) => MinerIoDone::Built(Box::new(job.run(&self.pool))),
            MinerIo::Verify(job) => MinerIoDone::Verified(Box::new(job.run(&self.pool))),
        }
    }

    /// A block is built, or an announced one verified, on a thread of its own.
    fn detach(&mut self, op: MinerIo) -> Result<Detached<MinerIoDone>, MinerIo> {
        let pool = Arc::clone(&self.pool);
        match op {
            MinerIo::Build(job) => Ok(Box::new(move || MinerIoDone::Built(Box::new(job.run(&pool))))),
            MinerIo::Verify(job) => Ok(Box::new(move || MinerIoDone::Verified(Box::new(job.run(&pool))))),
            store => Err(store),
        }
    }
}

/// Opens (creating) the miner's block store in `dir/blocks`, storing the genesis block first.
pub fn open_store(dir: &Path, genesis: &Header) -> Result<(ChainStore, Header), MinerError> {
    let path = dir.join("blocks");
    let storage = virga_core::device::FileStorage::create_dir_all(&path)
        .map_err(|source| MinerError::StoreDir { path: path.clone(), source })?;
    open_store_on(Arc::new(storage), StoreOptions::default(), genesis)
}

/// [`open_store`] on any storage (memory devices in the simulator).
pub fn open_store_on(
    storage: Arc<dyn virga_core::device::Storage>,
    options: StoreOptions,
    genesis: &Header,
) -> Result<(ChainStore, Header), MinerError> {
    let (mut store, _) = ChainStore::open(storage, options)?;
    let genesis_hash = genesis.hash_slow();
    match store.hash_of(0) {
        None => {
            let block = Block { header: genesis.clone(), transactions: Vec::new() };
            store.append(0, genesis_hash, &block.encode())?;
        }
        Some(stored) if stored != genesis_hash => {
            return Err(MinerError::OtherGenesis { stored, genesis: genesis_hash })
        }
        Some(_) => {}
    }
    let head = match store.head() {
        Some((number, _)) if number > 0 => {
            let bytes = store.get_by_number(number)?.ok_or(MinerError::Unreadable(number))?;
            decode_block(&bytes).map_err(|source| MinerError::StoredBlock { number, source })?.header
        }
        _ => genesis.clone(),
    };
    Ok((store, head))
}
