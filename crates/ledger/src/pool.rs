//! The transaction pool: signed transfers waiting for a block.
//!
//! A transfer enters only with a signature that recovers a sender, so a builder never spends
//! block space on forgeries. Blocks take transfers in arrival order, except that a sender's
//! transfers leave in nonce order and only without gaps: a transfer whose predecessor has not
//! arrived waits.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use alloy_primitives::{Address, B256};

use crate::exec::{load_account, StateError};
use crate::tx::{RecoveredTx, SignedTx, TxError};
use virga_evm::StateSource;

/// Why the pool refused a transfer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PoolError {
    #[error("transaction {hash}: {source}")]
    BadSignature { hash: B256, source: TxError },
    #[error("transaction {hash}: sender {sender} already has transaction {existing} with nonce {nonce} waiting")]
    NonceTaken { hash: B256, sender: Address, nonce: u64, existing: B256 },
    #[error("transaction {hash}: the pool is full ({capacity} transactions)")]
    Full { hash: B256, capacity: usize },
}

struct Waiting {
    tx: SignedTx,
    arrival: u64,
}

/// Transfers by sender and nonce.
pub struct TxPool {
    by_sender: HashMap<Address, BTreeMap<u64, Waiting>>,
    next_arrival: u64,
    len: usize,
    capacity: usize,
}

impl TxPool {
    /// A pool holding at most `capacity` transfers.
    pub fn new(capacity: usize) -> Self {
        Self { by_sender: HashMap::new(), next_arrival: 0, len: 0, capacity }
    }

    /// Transfers waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no transfer waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Recovers the sender and admits the transfer.
    pub fn add(&mut self, tx: SignedTx) -> Result<B256, PoolError> {
        let hash = tx.hash();
        let sender = tx.recover_sender().map_err(|source| PoolError::BadSignature { hash, source })?;
        self.add_recovered(RecoveredTx { tx, sender })
    }

    /// Admits a transfer whose sender is already recovered.
    pub fn add_recovered(&mut self, recovered: RecoveredTx) -> Result<B256, PoolError> {
        let RecoveredTx { tx, sender } = recovered;
        let hash = tx.hash();
        if self.len >= self.capacity {
            return Err(PoolError::Full { hash, capacity: self.capacity });
        }
        let queue = self.by_sender.entry(sender).or_default();
        if let Some(existing) = queue.get(&tx.nonce()) {
            return Err(PoolError::NonceTaken { hash, sender, nonce: tx.nonce(), existing: existing.tx.hash() });
        }
        queue.insert(tx.nonce(), Waiting { tx, arrival: self.next_arrival });
        self.next_arrival += 1;
        self.len += 1;
        Ok(hash)
    }

    /// Removes and returns up to `max` transfers that can run in sequence on `state`: in
    /// arrival order, each sender's in consecutive nonces from its account's nonce. Transfers
    /// whose nonce the state has already passed are dropped; gapped ones stay.
    pub fn take(&mut self, state: &dyn StateSource, max: usize) -> Result<Vec<RecoveredTx>, StateError> {
        let mut next_nonce: HashMap<Address, u64> = HashMap::with_capacity(self.by_sender.len());
        let mut ready: BinaryHeap<Reverse<(u64, Address)>> = BinaryHeap::new();
        for (sender, queue) in self.by_sender.iter_mut() {
            let nonce = load_account(state, sender)?.nonce;
            let stale: Vec<u64> = queue.range(..nonce).map(|(&stale, _)| stale).collect();
            for stale in stale {
                queue.remove(&stale);
                self.len -= 1;
            }
            next_nonce.insert(*sender, nonce);
            if let Some(head) = queue.get(&nonce) {
                ready.push(Reverse((head.arrival, *sender)));
            }
        }
        let mut taken = Vec::with_capacity(max.min(self.len));
        while taken.len() < max {
            let Some(Reverse((_, sender))) = ready.pop() else { break };
            let Some(queue) = self.by_sender.get_mut(&sender) else { continue };
            let Some(nonce) = next_nonce.get_mut(&sender) else { continue };
            let Some(waiting) = queue.remove(nonce) else { continue };
            self.len -= 1;
            taken.push(RecoveredTx { tx: waiting.tx, sender });
            let Some(next_nonce) = nonce.checked_add(1) else { continue };
            *nonce = next_nonce;
            if let Some(next) = queue.get(nonce) {
                ready.push(Reverse((next.arrival, sender)));
            }
        }
        self.by_sender.retain(|_, queue| !queue.is_empty());
        Ok(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tx::SigningKey;
    use alloy_primitives::U256;
    use virga_trie::account::{Account, StateTrie};

    fn transfer(key: &SigningKey, nonce: u64) -> SignedTx {
        SignedTx::sign(key, nonce, Address::repeat_byte(0xee), U256::from(1), 1, 21_000, Some(1337))
    }

    #[test]
    fn takes_in_arrival_order_with_nonces_in_sequence() {
        let (alice, bob) = (SigningKey::from_seed(1), SigningKey::from_seed(2));
        let mut state = StateTrie::new();
        state.set_account(alice.address(), Account::with_balance(3, U256::from(10)));
        let mut pool = TxPool::new(100);
        // Bob's nonce 1 arrives before his nonce 0; Alice's nonce 2 is already spent; her nonce 5 is gapped.
        for tx in [transfer(&bob, 1), transfer(&alice, 3), transfer(&alice, 2), transfer(&bob, 0), transfer(&alice, 5)]
        {
            pool.add(tx).expect("admitted");
        }
        let taken = pool.take(&state, 10).expect("state decodes");
        let order: Vec<(Address, u64)> = taken.iter().map(|t| (t.sender, t.tx.nonce())).collect();
        assert_eq!(order, vec![(alice.address(), 3), (bob.address(), 0), (bob.address(), 1)]);
        assert_eq!(pool.len(), 1, "the gapped transfer waits, the spent one is gone");
    }

    #[test]
    fn refuses_duplicates_forgeries_and_overflow() {
        let key = SigningKey::from_seed(3);
        let mut pool = TxPool::new(2);
        pool.add(transfer(&key, 0)).expect("admitted");
        let again = SignedTx::sign(&key, 0, Address::ZERO, U256::from(2), 1, 21_000, Some(1337));
        assert!(matches!(pool.add(again), Err(PoolError::NonceTaken { nonce: 0, .. })));
        pool.add(transfer(&key, 1)).expect("admitted");
        assert!(matches!(pool.add(transfer(&key, 2)), Err(PoolError::Full { capacity: 2, .. })));
        let alloy_consensus::TxEnvelope::Legacy(signed) = transfer(&key, 9).into_inner() else {
            panic!("a legacy transfer")
        };
        let zero = alloy_primitives::Signature::new(U256::ZERO, U256::ZERO, false);
        let forged = SignedTx::from_envelope(alloy_consensus::TxEnvelope::Legacy(
            alloy_consensus::Signed::new_unhashed(signed.strip_signature(), zero),
        ))
        .expect("a legacy transaction");
        assert!(matches!(pool.add(forged), Err(PoolError::BadSignature { .. })));
    }
}
