//! A miner in this process: its core run by virga-net's tokio driver, with the chain store
//! as its device. Requests that arrive before the driver starts wait in its mailbox.

use crate::messages::{BlockId, HeadReply};
use crate::protocol::{Rainblock, Request, Response};
use alloy_consensus::Header;
use alloy_primitives::B256;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use virga_ledger::store::ChainStore;
use virga_net::driver::{Mailbox, Running};
use virga_net::{BoxFuture, Handler, Transport};

use super::{execution_pool, ChainDisk, MinerConfig, MinerCore, MinerError, MinerStats};

pub struct Miner {
    id: String,
    core: Arc<Mutex<MinerCore>>,
    /// The committed head, published after every step: head requests are answered from it
    /// at once rather than queued behind a block being built (as the core would answer them).
    head: Arc<Mutex<(u64, B256, B256)>>,
    handler: Arc<dyn Handler<Rainblock>>,
    /// The mailbox and device until the driver starts.
    unstarted: Mutex<Option<(Mailbox<MinerCore>, ChainDisk)>>,
    running: Mutex<Option<Running<MinerCore>>>,
    stop: watch::Sender<bool>,
}

impl Miner {
    /// A miner whose committed chain is in `store` (head `header`).
    pub fn new(config: MinerConfig, header: Header, store: Option<ChainStore>) -> Result<Arc<Miner>, MinerError> {
        let id = config.id.clone();
        let core = MinerCore::new(config, header)?;
        let pool = execution_pool(0)?;
        let head = Arc::new(Mutex::new(core.head()));
        let published = Arc::clone(&head);
        let mailbox = Mailbox::new().with_observer(move |core: &MinerCore| *published.lock() = core.head());
        let handler = mailbox.handler();
        Ok(Arc::new(Miner {
            id,
            core: Arc::new(Mutex::new(core)),
            head,
            handler,
            unstarted: Mutex::new(Some((mailbox, ChainDisk { store, pool }))),
            running: Mutex::new(None),
            stop: watch::channel(false).0,
        }))
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    #[cfg(feature = "fault-injection")]
    pub fn set_fault(&self, fault: super::MinerFault) {
        self.core.lock().set_fault(fault);
    }

    pub fn stats(&self) -> MinerStats {
        self.core.lock().stats()
    }

    /// The committed head: number, hash and state root.
    pub fn head(&self) -> (u64, B256, B256) {
        *self.head.lock()
    }

    /// Starts the driver on `transport` (once).
    fn start(&self, transport: Arc<dyn Transport<Rainblock>>) {
        if let Some((mailbox, disk)) = self.unstarted.lock().take() {
            let running =
                mailbox.run_shared(self.id.clone(), Arc::clone(&self.core), transport, disk, self.stop.subscribe());
            *self.running.lock() = Some(running);
        }
    }

    /// Starts the miner and waits until its top layer is warm; fails with the reason of a
    /// failed warm-up round (the miner keeps trying: calling this again waits for the next).
    pub async fn warm_up(&self, transport: Arc<dyn Transport<Rainblock>>) -> Result<(), MinerError> {
        let failed_before = self.core.lock().warm_up_state().1.map(|(round, _)| round);
        self.start(transport);
        loop {
            {
                let core = self.core.lock();
                match core.warm_up_state() {
                    (true, _) => return Ok(()),
                    (false, Some((round, reason))) if Some(round) != failed_before => {
                        return Err(MinerError::WarmUp(reason.clone()))
                    }
                    _ => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Mines until `shutdown` fires; pending submissions are then refused.
    pub async fn run(self: Arc<Self>, transport: Arc<dyn Transport<Rainblock>>, mut shutdown: watch::Receiver<bool>) {
        self.start(transport);
        let _ = shutdown.wait_for(|stop| *stop).await;
        let _ = self.stop.send(true);
        let running = self.running.lock().take();
        if let Some(running) = running {
            running.join().await;
        }
    }
}

impl Handler<Rainblock> for Miner {
    fn handle(&self, from: String, request: Request) -> BoxFuture<Response> {
        if let Request::Head = request {
            let (number, hash, state_root) = self.head();
            let head = HeadReply { head: BlockId::new(number, hash), state_root };
            return Box::pin(std::future::ready(Response::Head(head)));
        }
        self.handler.handle(from, request)
    }
}
