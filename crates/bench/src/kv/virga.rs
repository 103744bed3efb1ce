//! Virga's transactional engine as a [`KvBackend`].

use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;
use virga_txn::{Engine, Session, Txn};

use super::{Ack, KvBackend, KvSession, KvTx, TxAbort};

/// An [`Engine`] under test.
pub struct VirgaBackend {
    engine: Arc<Engine>,
}

impl VirgaBackend {
    /// Wraps an open engine.
    pub fn new(engine: Arc<Engine>) -> VirgaBackend {
        VirgaBackend { engine }
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }
}

impl KvBackend for VirgaBackend {
    type Session = VirgaSession;

    fn name(&self) -> String {
        let config = self.engine.config();
        format!("virga-{}-{}", config.cc, config.timestamps)
    }

    fn load(&self, pairs: &mut dyn Iterator<Item = (Vec<u8>, Vec<u8>)>) -> anyhow::Result<()> {
        self.engine.load(pairs)?;
        Ok(())
    }

    fn session(&self, _client: usize) -> VirgaSession {
        // Sessions are limited to `MAX_SESSIONS`; the runner opens one per thread.
        let session = self.engine.session().unwrap_or_else(|e| panic!("opening a benchmark session: {e}"));
        VirgaSession { session }
    }
}

/// One worker's [`Session`].
pub struct VirgaSession {
    session: Session,
}

impl VirgaSession {
    /// The underlying session (for its abort counts).
    pub fn session(&self) -> &Session {
        &self.session
    }
}

struct TxAdapter<'a, 's>(&'a mut Txn<'s>);

fn abort(e: virga_txn::Abort) -> TxAbort {
    TxAbort { reason: e.reason.name() }
}

impl KvTx for TxAdapter<'_, '_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>, TxAbort> {
        self.0.get(key).map_err(abort)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), TxAbort> {
        self.0.put(key, Bytes::copy_from_slice(value)).map_err(abort)
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), TxAbort> {
        self.0.delete(key).map_err(abort)
    }

    fn scan(&mut self, start: &[u8], limit: usize) -> Result<Vec<(Bytes, Bytes)>, TxAbort> {
        self.0.scan(Bound::Included(start), Bound::Unbounded, limit).map_err(abort)
    }
}

impl KvSession for VirgaSession {
    fn run(
        &mut self,
        read_only: bool,
        body: &mut dyn FnMut(&mut dyn KvTx) -> Result<(), TxAbort>,
    ) -> Result<Ack, TxAbort> {
        let mut txn = if read_only { self.session.begin_read_only() } else { self.session.begin() };
        body(&mut TxAdapter(&mut txn))?;
        let info = txn.commit().map_err(abort)?;
        Ok(match info.lsn {
            Some(lsn) if lsn > self.session.engine().durable_lsn() => Ack::After(lsn),
            _ => Ack::Now,
        })
    }

    fn durable_ticket(&self) -> u64 {
        self.session.engine().durable_lsn()
    }
}
