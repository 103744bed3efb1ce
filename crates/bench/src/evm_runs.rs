//! `virga bench evm`'s executors, run side by side: every executor keeps its own state, and
//! each block is executed by all of them before the next (their order rotating), each
//! block timed on its own. A noisy machine's slow seconds then fall on every executor
//! alike, where whole runs one after another would give them to whichever ran then.

use std::time::Instant;

use alloy_primitives::B256;
use virga_evm::parallel::ParallelTotals;
use virga_evm::reference::{execute_reference, reference_root, ReferenceDb};
use virga_evm::{BlockContext, CachedState, DecimalHashes, EthTransaction};
use virga_trie::account::StateTrie;

use crate::evm::EvmWorkload;

/// The states every run starts from.
pub struct Genesis<'a> {
    pub workload: &'a EvmWorkload,
    /// The DSM-Tree with a flat copy of the state beside it.
    pub flat: CachedState,
    pub trie: StateTrie,
    pub db: ReferenceDb,
}

/// One executor's state through a run.
enum Runner {
    /// Virga's executor; `roots`: the state root is hashed after every block.
    Virga {
        state: Box<CachedState>,
        parallel: bool,
        roots: Option<Vec<B256>>,
    },
    Revm(ReferenceDb),
    #[cfg(feature = "peers")]
    RevmEthTrie {
        peer: Box<crate::evm_roots::RevmEthTrie>,
        roots: Vec<B256>,
    },
}

impl Runner {
    fn new(executor: &str, genesis: &Genesis<'_>) -> Runner {
        let virga = |state: CachedState, write_back: bool| Runner::Virga {
            state: Box::new(state.with_write_back(write_back)),
            parallel: executor == "virga-parallel",
            roots: (executor == "virga-root-per-block").then(Vec::new),
        };
        match executor {
            "revm" => Runner::Revm(genesis.db.clone()),
            #[cfg(feature = "peers")]
            "revm-eth_trie" => Runner::RevmEthTrie {
                peer: Box::new(crate::evm_roots::RevmEthTrie::new(&genesis.workload.genesis)),
                roots: Vec::new(),
            },
            "virga-trie-reads" => virga(CachedState::new(genesis.trie.clone(), CachedState::DEFAULT_CAPACITY), true),
            "virga-write-through" | "virga-root-per-block" => virga(genesis.flat.clone(), false),
            _ => virga(genesis.flat.clone(), true),
        }
    }

    /// Executes one block; the transactions it included.
    fn execute(&mut self, context: &BlockContext, txs: &[EthTransaction], totals: &mut ParallelTotals) -> usize {
        let executed = match self {
            Runner::Revm(db) => return execute_reference(db, context, txs).receipts.len(),
            #[cfg(feature = "peers")]
            Runner::RevmEthTrie { peer, roots } => {
                let (executed, root) = peer.execute_block(context, txs);
                roots.push(root);
                return executed.receipts.len();
            }
            Runner::Virga { state, parallel: true, .. } => {
                state.execute_block_parallel(&DecimalHashes, context, txs).map(|(executed, stats)| {
                    totals.add(&stats);
                    executed
                })
            }
            Runner::Virga { state, roots, .. } => {
                let executed = state.execute_block(&DecimalHashes, context, txs);
                if let Some(roots) = roots {
                    roots.push(state.root());
                }
                executed
            }
        };
        match executed {
            Ok(executed) => executed.receipts.len(),
            Err(error) => panic!("the benchmark's own state cannot be read: {error}"),
        }
    }

    /// The state root after the last block (not timed), and the roots after every block
    /// where they were hashed.
    fn finish(self) -> (B256, Option<Vec<B256>>) {
        match self {
            Runner::Revm(db) => (reference_root(&db), None),
            #[cfg(feature = "peers")]
            Runner::RevmEthTrie { roots, .. } => (roots.last().copied().unwrap_or_default(), Some(roots)),
            Runner::Virga { mut state, roots, .. } => (state.root(), roots),
        }
    }
}

/// What one run of every executor gave, each in the order given.
pub struct RunOutcome {
    /// Seconds spent executing blocks.
    pub seconds: Vec<f64>,
    /// Transactions included.
    pub included: Vec<usize>,
    /// The roots after the last block, where asked for.
    pub final_roots: Option<Vec<B256>>,
    pub block_roots: Vec<Option<Vec<B256>>>,
}

/// Runs `executors` from the genesis over every block, block by block, the order rotating
/// by `run` and the block's index; with `roots`, hashes each one's final state root.
pub fn run_side_by_side(
    executors: &[&str],
    genesis: &Genesis<'_>,
    run: usize,
    roots: bool,
    totals: &mut ParallelTotals,
) -> RunOutcome {
    let mut runners: Vec<Runner> = executors.iter().map(|executor| Runner::new(executor, genesis)).collect();
    let mut seconds = vec![0.0; runners.len()];
    let mut included = vec![0; runners.len()];
    for (index, (context, txs)) in genesis.workload.blocks.iter().enumerate() {
        for turn in 0..runners.len() {
            let which = (turn + run + index) % runners.len();
            let begun = Instant::now();
            included[which] += runners[which].execute(context, txs, totals);
            seconds[which] += begun.elapsed().as_secs_f64();
        }
    }
    if !roots {
        return RunOutcome { seconds, included, final_roots: None, block_roots: Vec::new() };
    }
    let (final_roots, block_roots) = runners.into_iter().map(Runner::finish).unzip();
    RunOutcome { seconds, included, final_roots: Some(final_roots), block_roots }
}
