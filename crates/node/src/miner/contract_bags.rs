//! The contract part of a bag: slot witnesses per account (whole proofs from its storage
//! root) and code. It joins the top layer only where it matches what the layer holds (a
//! storage bag's nodes attach where they hash to hash nodes of the account's storage trie;
//! code is held by its own hash), so it cannot change what the miner believes.

use crate::messages::StorageBag;
use alloy_primitives::{keccak256, B256};
use std::collections::BTreeMap;
use virga_evm::{PartialState, WitnessJoinError};
use virga_trie::proof::NodeBag;

use crate::codec::{check_keys, WireError};

/// Why a submission's contract witnesses were refused.
#[derive(Debug, thiserror::Error)]
pub enum ContractBagError {
    #[error("storage bag: {0}")]
    Wire(#[from] WireError),
    #[error("storage bag: {0}")]
    Join(#[from] WitnessJoinError),
}

/// Slot bags by account and code, as submissions and announcements carry them.
#[derive(Clone, Debug, Default)]
pub(crate) struct ContractBags {
    pub(crate) storage: BTreeMap<B256, NodeBag>,
    pub(crate) codes: BTreeMap<B256, Vec<u8>>,
}

impl ContractBags {
    /// Checks the bags' slot keys: 32 bytes.
    pub(crate) fn from_messages(storage: Vec<StorageBag>, codes: Vec<Vec<u8>>) -> Result<ContractBags, WireError> {
        let mut bags = ContractBags::default();
        for StorageBag { account, bag } in storage {
            check_keys(&bag.keys)?;
            bags.add_storage(account, bag);
        }
        for code in codes {
            bags.codes.insert(keccak256(&code), code);
        }
        Ok(bags)
    }

    pub(crate) fn to_messages(&self) -> (Vec<StorageBag>, Vec<Vec<u8>>) {
        let storage =
            self.storage.iter().map(|(account, bag)| StorageBag { account: *account, bag: bag.clone() }).collect();
        (storage, self.codes.values().cloned().collect())
    }

    fn add_storage(&mut self, account: B256, bag: NodeBag) {
        match self.storage.remove(&account) {
            Some(held) => self.storage.insert(account, NodeBag::merge([held, bag])),
            None => self.storage.insert(account, bag),
        };
    }

    /// Everything `other` carries too (a block's bag is its submissions' bags merged).
    pub(crate) fn extend(&mut self, other: ContractBags) {
        for (account, bag) in other.storage {
            self.add_storage(account, bag);
        }
        self.codes.extend(other.codes);
    }

    /// Attaches the slot bags of accounts `top` holds, and the code; returns the bytes the
    /// layer grew by. A bag of an account the layer cannot read is skipped: a transaction
    /// that needs it is left out at execution (`missing_witness`). A bag node that matches
    /// a needed hash but is no valid node refuses the whole submission, as for accounts.
    pub(crate) fn attach(&self, top: &mut PartialState) -> Result<usize, ContractBagError> {
        let mut grown = 0;
        for (account, bag) in &self.storage {
            match top.attach_storage(*account, bag) {
                Ok(applied) => grown += applied.grown_bytes,
                Err(WitnessJoinError::Account { .. }) => {}
                Err(error) => return Err(error.into()),
            }
        }
        for (hash, code) in &self.codes {
            top.insert_code(*hash, code)?;
            grown += code.len();
        }
        Ok(grown)
    }
}
