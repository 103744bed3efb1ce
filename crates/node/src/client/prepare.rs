//! Pre-execution of a batch on its witnessed accounts, and the bag sent with it.

use alloy_primitives::B256;
use std::collections::{HashMap, HashSet};
use virga_ledger::exec::ExecConfig;
use virga_trie::account::Account;
use virga_trie::proof::{NodeBag, ProofError};

use super::precheck::{check_transfer, touched_keys};
use super::witness::Witnesses;
use super::{UserTransfer, UNREADABLE_ACCOUNT};

/// A batch after pre-execution.
#[derive(Debug, Default)]
pub(super) struct PreExecuted {
    /// To submit.
    pub(super) kept: Vec<UserTransfer>,
    /// Dropped because they would certainly fail, with the reason.
    pub(super) filtered: Vec<(UserTransfer, &'static str)>,
    /// Submitted before to a miner that failed before answering, and found committed now.
    pub(super) confirmed_late: Vec<UserTransfer>,
    /// Bytes of the kept transfers' own full witnesses.
    pub(super) full_bytes: u64,
}

/// Pre-executes `batch` on the witnessed accounts, each transfer seeing the batch's earlier
/// ones. A transfer in `uncertain` whose sender's nonce has moved past it committed (only
/// it has that sender and nonce); it leaves `uncertain`.
pub(super) fn pre_execute(
    exec: &ExecConfig,
    batch: Vec<UserTransfer>,
    values: &HashMap<B256, (Option<Vec<u8>>, usize)>,
    uncertain: &mut HashSet<B256>,
) -> PreExecuted {
    let mut accounts: HashMap<B256, Account> = HashMap::new();
    let mut done = PreExecuted { kept: Vec::with_capacity(batch.len()), ..PreExecuted::default() };
    for transfer in batch {
        let [sender_key, recipient_key] = touched_keys(&transfer.tx, transfer.sender);
        let load = |key: &B256| -> Option<Account> {
            if let Some(account) = accounts.get(key) {
                return Some(*account);
            }
            match values.get(key)? {
                (Some(bytes), _) => Account::decode_rlp(bytes).ok(),
                (None, _) => Some(Account::default()),
            }
        };
        let (Some(sender), Some(recipient)) = (load(&sender_key), load(&recipient_key)) else {
            done.filtered.push((transfer, UNREADABLE_ACCOUNT));
            continue;
        };
        if sender.nonce > transfer.tx.nonce() && uncertain.remove(&transfer.tx.hash()) {
            done.confirmed_late.push(transfer);
            continue;
        }
        match check_transfer(exec, &transfer.tx, transfer.sender, &sender, &recipient) {
            Ok(effect) => {
                accounts.insert(effect.sender.0, effect.sender.1);
                if let Some((key, account)) = effect.recipient {
                    accounts.insert(key, account);
                }
                done.full_bytes += [sender_key, recipient_key]
                    .iter()
                    .map(|key| values.get(key).map_or(0, |(_, size)| *size as u64))
                    .sum::<u64>();
                done.kept.push(transfer);
            }
            Err(reason) => done.filtered.push((transfer, reason)),
        }
    }
    done
}

/// The contract part of a submission: every verified slot bag, merged per account and
/// compacted at `compaction` against the storage root it verified against (the miner holds
/// the storage tries' top levels as it holds the account trie's), and the code the kept
/// calls run.
pub(super) fn contract_bags(
    contracts: &super::ContractWitness,
    code_used: &std::collections::BTreeSet<B256>,
    codes: &HashMap<B256, Vec<u8>>,
    compaction: usize,
) -> (Vec<crate::messages::StorageBag>, Vec<Vec<u8>>) {
    let mut by_account: std::collections::BTreeMap<(B256, B256), Vec<NodeBag>> = std::collections::BTreeMap::new();
    for (account, root, bag) in &contracts.bags {
        by_account.entry((*account, *root)).or_default().push(bag.clone());
    }
    let storage = by_account
        .into_iter()
        .map(|((account, root), bags)| {
            let merged = NodeBag::merge(bags);
            // A verified bag always compacts; should it not, the whole one still attaches.
            let bag = merged.compact(root, compaction).unwrap_or(merged);
            crate::messages::StorageBag { account, bag }
        })
        .collect();
    (storage, code_used.iter().filter_map(|hash| codes.get(hash).cloned()).collect())
}

/// One bag for the kept transfers, each node once, nodes above `compaction` left out. When
/// some of the batch was dropped, the verified bags are narrowed to the kept transfers'
/// accounts and compacted again.
pub(super) fn bag_of(
    kept: &[UserTransfer],
    some_dropped: bool,
    witnesses: Witnesses,
    root: B256,
    compaction: usize,
) -> Result<NodeBag, ProofError> {
    if !some_dropped {
        return Ok(NodeBag::merge(witnesses.compact));
    }
    let full = NodeBag::merge(witnesses.full);
    let kept_keys: HashSet<B256> = kept.iter().flat_map(|t| touched_keys(&t.tx, t.sender)).collect();
    let narrowed = NodeBag {
        keys: full
            .keys
            .into_iter()
            .filter(|key| B256::try_from(key.as_slice()).is_ok_and(|key| kept_keys.contains(&key)))
            .collect(),
        nodes: full.nodes,
    };
    narrowed.compact(root, compaction)
}
