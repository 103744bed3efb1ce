//! An organization's copy of the agreed ledger: the LedgerBlocks it committed, in memory
//! and, when given a directory, in a `virga-log` record log (block `n` at LSN `n + 1`,
//! synced before the block counts as committed there).

use std::path::{Path, PathBuf};

use virga_ledger::wlc::{verify_chain, ChainProblem, DecodeError, LedgerBlock};
use virga_log::{LogError, LogOptions, OpenMode, RecordLog};

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("the ledger in {dir}: {error}")]
    Log { dir: PathBuf, error: LogError },
    #[error("the ledger in {dir}: record {lsn}: {error}")]
    Decode { dir: PathBuf, lsn: u64, error: DecodeError },
    #[error("the ledger in {dir}: {problem}")]
    Chain { dir: PathBuf, problem: ChainProblem },
}

pub struct Ledger {
    blocks: Vec<LedgerBlock>,
    log: Option<(PathBuf, RecordLog)>,
}

impl Ledger {
    /// A ledger kept in memory only.
    pub fn in_memory() -> Ledger {
        Ledger { blocks: Vec::new(), log: None }
    }

    /// The ledger in `dir`, created if absent; its blocks are read back and checked.
    pub fn open(dir: &Path) -> Result<Ledger, LedgerError> {
        let failed = |error| LedgerError::Log { dir: dir.to_path_buf(), error };
        std::fs::create_dir_all(dir)
            .map_err(|error| failed(LogError::Io { op: "create", path: dir.to_path_buf(), source: error }))?;
        let mut payloads = Vec::new();
        let (log, _) = RecordLog::open_with(dir, LogOptions::default(), OpenMode::Repair, |lsn, payload| {
            payloads.push((lsn, payload.to_vec()))
        })
        .map_err(failed)?;
        let blocks = decode_all(dir, payloads)?;
        Ok(Ledger { blocks, log: Some((dir.to_path_buf(), log)) })
    }

    /// Reads the ledger in `dir` without changing anything, and checks its chain.
    pub fn read(dir: &Path) -> Result<Vec<LedgerBlock>, LedgerError> {
        let records = virga_log::read_all(dir, LogOptions::default())
            .map_err(|error| LedgerError::Log { dir: dir.to_path_buf(), error })?;
        decode_all(dir, records.into_iter().map(|record| (record.lsn, record.payload)).collect())
    }

    pub fn blocks(&self) -> &[LedgerBlock] {
        &self.blocks
    }

    /// Appends `block` (the next in the chain), durably when the ledger is on disk.
    pub fn append(&mut self, block: LedgerBlock) -> Result<(), LedgerError> {
        if let Some((dir, log)) = &mut self.log {
            let failed = |error| LedgerError::Log { dir: dir.clone(), error };
            log.append(&block.encode()).map_err(failed)?;
            log.sync().map_err(failed)?;
        }
        self.blocks.push(block);
        Ok(())
    }
}

fn decode_all(dir: &Path, payloads: Vec<(u64, Vec<u8>)>) -> Result<Vec<LedgerBlock>, LedgerError> {
    let blocks = payloads
        .into_iter()
        .map(|(lsn, payload)| {
            LedgerBlock::decode(&payload).map_err(|error| LedgerError::Decode { dir: dir.to_path_buf(), lsn, error })
        })
        .collect::<Result<Vec<_>, _>>()?;
    verify_chain(&blocks).map_err(|problem| LedgerError::Chain { dir: dir.to_path_buf(), problem })?;
    Ok(blocks)
}
