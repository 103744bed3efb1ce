//! Contract storage and code on a storage node. A contract's storage trie lives in the shard
//! of its account (seed 003), so the node serving a popular token's account serves all of
//! its slots, and its code. Pure: no I/O.
//!
//! A block's slot updates are accepted only if every account they (or a wipe, or an update
//! of the account itself) touch ends with a storage trie whose root is the storage root its
//! account now announces, and with its code held: what a node serves always proves through
//! the state root.

use crate::messages::{BlockUpdates, SlotKeys, SlotUpdate, StorageBag};
use alloy_primitives::{keccak256, B256, U256};
use alloy_rlp::Decodable;
use std::collections::HashMap;
use std::sync::Arc;
use virga_core::{EMPTY_ROOT, KECCAK_EMPTY};
use virga_trie::account::{Account, StateTrie};
use virga_trie::proof::NodeBag;
use virga_trie::shard::{shard_of, ShardedTrie};
use virga_trie::Trie;

use super::versions::ReadRefusal;

/// Why a block's contract updates were refused; part of [`BlockRefusal`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractRefusal {
    #[error("slot update {index} of account {account}: the value is not a non-zero RLP integer")]
    BadSlotValue { index: usize, account: B256 },
    #[error("contract storage of account {account}, in shard {shard}, not served here")]
    NotServed { account: B256, shard: usize },
    #[error("account {account} is stored malformed: {reason}")]
    BadAccount { account: B256, reason: String },
    #[error("account {account} has storage but no longer exists")]
    StorageOfAbsentAccount { account: B256 },
    #[error("account {account}: its storage gives root {computed}, the account says {announced}")]
    StorageRootMismatch { account: B256, computed: B256, announced: B256 },
    #[error("account {account} has code {code_hash}, which no block or genesis deployed")]
    MissingCode { account: B256, code_hash: B256 },
}

/// The storage tries and code of the contracts in a node's served shards, at one version.
/// Versions share it: a block copies the maps (handles only) and changes the tries it
/// touches, which share their other nodes with the parent's.
#[derive(Clone, Default)]
pub struct Contracts {
    /// Non-empty storage tries (keys: keccak of the slot) by the account's secure-trie key.
    storage: Arc<HashMap<B256, Trie>>,
    /// Code by hash.
    code: Arc<HashMap<B256, Arc<[u8]>>>,
}

impl std::fmt::Debug for Contracts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Contracts")
            .field("storage_tries", &self.storage.len())
            .field("codes", &self.code.len())
            .finish()
    }
}

impl Contracts {
    /// The contracts of a whole state whose accounts fall in `served` shards (`prefix`
    /// nibbles of shard index).
    pub fn of_state(state: &StateTrie, served: &[usize], prefix: usize) -> Contracts {
        let mut storage = HashMap::new();
        let mut code = HashMap::new();
        for (address, trie) in state.storage_tries() {
            let key = keccak256(address);
            if !served_key(&key, served, prefix) || trie.as_trie().is_empty() {
                continue;
            }
            storage.insert(key, trie.as_trie().clone());
        }
        // Code is keyed by hash and small beside storage: every node holds all of it.
        for (hash, bytes) in state.code_entries() {
            code.insert(*hash, Arc::from(bytes));
        }
        Contracts { storage: Arc::new(storage), code: Arc::new(code) }
    }

    /// What a checkpoint reads back: slots (account, slot, value) and code.
    pub fn from_entries(
        slots: impl IntoIterator<Item = (B256, B256, Vec<u8>)>,
        codes: impl IntoIterator<Item = Vec<u8>>,
    ) -> Contracts {
        let mut storage: HashMap<B256, Trie> = HashMap::new();
        for (account, slot, value) in slots {
            storage.entry(account).or_default().insert(slot.as_slice(), &value);
        }
        let code = codes.into_iter().map(|bytes| (keccak256(&bytes), Arc::from(bytes))).collect();
        Contracts { storage: Arc::new(storage), code: Arc::new(code) }
    }

    /// Only the contracts of accounts in `served` shards.
    pub fn keep_served(&self, served: &[usize], prefix: usize) -> Contracts {
        let storage =
            self.storage.iter().filter(|(key, _)| served_key(key, served, prefix)).map(|(k, t)| (*k, t.clone()));
        Contracts { storage: Arc::new(storage.collect()), code: self.code.clone() }
    }

    /// The root of an account's storage trie (the empty root if it has none).
    pub fn storage_root(&self, account: &B256) -> B256 {
        self.storage.get(account).map_or(EMPTY_ROOT, Trie::root_hash)
    }

    pub fn code(&self, hash: &B256) -> Option<&[u8]> {
        self.code.get(hash).map(|code| &code[..])
    }

    /// Every slot (account, slot, value) and every piece of code, for a checkpoint.
    pub fn entries(&self) -> (Vec<SlotUpdate>, Vec<Vec<u8>>) {
        let mut slots = Vec::new();
        for (account, trie) in self.storage.iter() {
            for (slot, value) in trie.entries() {
                // Slot keys are keccak hashes: the trie holds no other.
                slots.push(SlotUpdate { account: *account, slot: B256::from_slice(&slot), value });
            }
        }
        (slots, self.code.values().map(|code| code.to_vec()).collect())
    }

    /// Applies a block's contract updates (wipes, then slots, then code), after its account
    /// updates went into `shards` (keys checked there), and checks every account updated or
    /// whose storage changed against its new value.
    pub fn apply(
        &mut self,
        updates: &BlockUpdates,
        shards: &ShardedTrie,
        served: &[usize],
    ) -> Result<(), ContractRefusal> {
        let prefix = prefix_of(shards);
        // Each updated account's new value (the last update of a key is the one in force).
        let mut updated: HashMap<B256, &[u8]> = HashMap::with_capacity(updates.updates.len());
        for update in &updates.updates {
            updated.insert(update.key, &update.value);
        }
        let mut concerned: Vec<B256> = Vec::new();
        if !updates.cleared.is_empty() || !updates.slots.is_empty() {
            // Only a block that changes storage copies the map (of trie handles).
            let storage = Arc::make_mut(&mut self.storage);
            for &account in &updates.cleared {
                check_served(&account, served, prefix)?;
                storage.remove(&account);
                concerned.push(account);
            }
            for (index, update) in updates.slots.iter().enumerate() {
                let (account, slot) = (update.account, update.slot);
                check_served(&account, served, prefix)?;
                let trie = storage.entry(account).or_default();
                if update.value.is_empty() {
                    trie.remove(slot.as_slice());
                } else if is_slot_value(&update.value) {
                    trie.insert(slot.as_slice(), &update.value);
                } else {
                    return Err(ContractRefusal::BadSlotValue { index, account });
                }
                concerned.push(account);
            }
            for account in &concerned {
                if storage.get(account).is_some_and(Trie::is_empty) {
                    storage.remove(account);
                }
            }
        }
        if !updates.codes.is_empty() {
            let code = Arc::make_mut(&mut self.code);
            for bytes in &updates.codes {
                code.insert(keccak256(bytes), Arc::from(bytes.as_slice()));
            }
        }
        for (account, value) in &updated {
            self.check_account_value(account, (!value.is_empty()).then_some(*value))?;
        }
        concerned.sort_unstable();
        concerned.dedup();
        for account in concerned.iter().filter(|account| !updated.contains_key(*account)) {
            self.check_account(account, shards)?;
        }
        Ok(())
    }

    /// An account's storage and code agree with what its (new) value announces.
    fn check_account(&self, account: &B256, shards: &ShardedTrie) -> Result<(), ContractRefusal> {
        let raw = shards
            .get(account.as_slice())
            .map_err(|error| ContractRefusal::BadAccount { account: *account, reason: error.to_string() })?;
        self.check_account_value(account, raw.as_deref())
    }

    /// An account's storage and code agree with its stored value `raw` (`None`: absent).
    pub fn check_account_value(&self, account: &B256, raw: Option<&[u8]>) -> Result<(), ContractRefusal> {
        let Some(raw) = raw else {
            return match self.storage.contains_key(account) {
                true => Err(ContractRefusal::StorageOfAbsentAccount { account: *account }),
                false => Ok(()),
            };
        };
        let value = Account::decode_rlp(raw)
            .map_err(|error| ContractRefusal::BadAccount { account: *account, reason: error.to_string() })?;
        let computed = self.storage_root(account);
        if computed != value.storage_root {
            return Err(ContractRefusal::StorageRootMismatch {
                account: *account,
                computed,
                announced: value.storage_root,
            });
        }
        if value.code_hash != KECCAK_EMPTY && !self.code.contains_key(&value.code_hash) {
            return Err(ContractRefusal::MissingCode { account: *account, code_hash: value.code_hash });
        }
        Ok(())
    }

    /// The accounts that have storage here.
    pub fn accounts_with_storage(&self) -> impl Iterator<Item = &B256> {
        self.storage.keys()
    }

    /// The top `levels` levels of every held storage trie, as keyless bags: a miner that
    /// holds them takes slot witnesses compacted below them.
    pub fn tops(&self, levels: usize) -> Vec<StorageBag> {
        let mut accounts: Vec<&B256> = self.storage.keys().collect();
        accounts.sort();
        accounts
            .into_iter()
            .map(|account| {
                let nodes = self.storage[account].top_nodes(levels);
                StorageBag { account: *account, bag: NodeBag { keys: Vec::new(), nodes } }
            })
            .collect()
    }

    /// Witnesses of the asked slots, each account's bag proved from its storage root, and
    /// the asked code.
    pub fn prove(
        &self,
        slots: &[SlotKeys],
        code_hashes: &[B256],
        shards: &ShardedTrie,
        served: &[usize],
    ) -> Result<(Vec<StorageBag>, Vec<Vec<u8>>), ReadRefusal> {
        let prefix = prefix_of(shards);
        let mut bags = Vec::with_capacity(slots.len());
        for asked in slots {
            let account = asked.account;
            if !served_key(&account, served, prefix) {
                return Err(ReadRefusal::ContractNotServed(account));
            }
            let bag = match self.storage.get(&account) {
                Some(trie) => trie.prove_many(&asked.slots, 0),
                None => NodeBag { keys: asked.slots.iter().map(|slot| slot.to_vec()).collect(), nodes: Vec::new() },
            };
            bags.push(StorageBag { account, bag });
        }
        let mut codes = Vec::with_capacity(code_hashes.len());
        for &hash in code_hashes {
            let code = self.code.get(&hash).ok_or(ReadRefusal::CodeNotHeld(hash))?;
            codes.push(code.to_vec());
        }
        Ok((bags, codes))
    }
}

fn prefix_of(shards: &ShardedTrie) -> usize {
    super::prefix_nibbles(shards.shard_count()).unwrap_or(0)
}

fn served_key(key: &B256, served: &[usize], prefix: usize) -> bool {
    shard_of(key.as_slice(), prefix).is_ok_and(|shard| served.contains(&shard))
}

fn check_served(account: &B256, served: &[usize], prefix: usize) -> Result<(), ContractRefusal> {
    let shard = shard_of(account.as_slice(), prefix).unwrap_or(usize::MAX);
    match served.contains(&shard) {
        true => Ok(()),
        false => Err(ContractRefusal::NotServed { account: *account, shard }),
    }
}

/// A storage trie's value: the RLP of a non-zero integer, minimally encoded (zero is a
/// deletion, never stored).
fn is_slot_value(bytes: &[u8]) -> bool {
    let mut rest = bytes;
    match U256::decode(&mut rest) {
        Ok(value) => rest.is_empty() && !value.is_zero(),
        Err(_) => false,
    }
}
