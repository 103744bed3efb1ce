//! The Ethereum-like workload of RainBlock's evaluation: N accounts with deterministic
//! secp256k1 keys, transactions of which 90% involve the hottest 10% of accounts: value
//! transfers and, for a share of them (the seed's workload has 10-15%), calls of an ERC-20
//! token deployed in the genesis at [`TOKEN_AT`], moving tokens between the same accounts.

use alloy_consensus::TxLegacy;
use alloy_primitives::TxKind;
use alloy_primitives::{address, Address, B256, U256};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use virga_ledger::tx::{SignedTx, SigningKey};

use crate::client::UserTransfer;

/// Offers `transfers` to `clients` clients at `rate` per second (all at once when `None`),
/// handing client `i` its due transfers with `deliver(i, transfers)`. Each sender's
/// transfers all go to one client, which keeps their nonce order. Ends when every transfer
/// is offered or a client stops taking them (`deliver` returns false); returns how many
/// were handed over.
pub async fn offer(
    transfers: Vec<UserTransfer>,
    rate: Option<f64>,
    clients: usize,
    mut deliver: impl FnMut(usize, Vec<UserTransfer>) -> bool,
) -> usize {
    let clients = clients.max(1);
    let begun = std::time::Instant::now();
    let total = transfers.len();
    let mut transfers = transfers.into_iter();
    let mut handed = 0;
    loop {
        // Transfer i is due i / rate seconds after the start.
        let due = match rate {
            Some(rate) if rate > 0.0 => total.min((begun.elapsed().as_secs_f64() * rate) as usize + 1),
            _ => total,
        };
        let mut shares: Vec<Vec<UserTransfer>> = vec![Vec::new(); clients];
        for transfer in transfers.by_ref().take(due.saturating_sub(handed)) {
            shares[client_of(&transfer, clients)].push(transfer);
        }
        for (client, share) in shares.into_iter().enumerate().filter(|(_, share)| !share.is_empty()) {
            let count = share.len();
            if !deliver(client, share) {
                return handed;
            }
            handed += count;
        }
        let Some(rate) = rate.filter(|_| handed < total) else { return handed };
        let next_due = std::time::Duration::from_secs_f64(handed as f64 / rate);
        if let Some(wait) = next_due.checked_sub(begun.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
}

/// The client of `clients` that submits `transfer`: one per sender.
pub fn client_of(transfer: &UserTransfer, clients: usize) -> usize {
    usize::from(transfer.sender.0[19]) % clients.max(1)
}

/// Gas price of every generated transfer: one gwei, far above the chain's base fee (which
/// starts at one wei and rises only in blocks above the EIP-1559 target), as users price
/// transactions to be included. The sender pays the base fee (burnt) and the rest goes to
/// the miner.
pub const GAS_PRICE: u128 = 1_000_000_000;
/// Each account's genesis balance: enough for any run's transfers and fees.
pub const GENESIS_BALANCE: u128 = 1_000_000_000_000_000_000_000;

/// Where the workload's ERC-20 token lives (`virga_evm::contracts::TOKEN`).
pub const TOKEN_AT: Address = address!("00000000000000000000000000000000000e2c20");
/// Gas limit of a token transfer: it uses at most about 52,000 (a new balance slot).
pub const TOKEN_CALL_GAS: u64 = 80_000;
/// Tokens each sender of a token transfer holds at genesis: more than any run moves.
pub const GENESIS_TOKENS: u128 = 1_000_000_000_000;

/// The workload's shape.
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    /// Fraction of accounts that are hot.
    pub hot_accounts: f64,
    /// Fraction of transfers whose sender (and, independently, recipient) is hot.
    pub hot_share: f64,
    /// Fraction of transactions that are token transfers (contract calls) rather than
    /// value transfers.
    pub contracts: f64,
}

impl Default for Mix {
    fn default() -> Self {
        Mix { hot_accounts: 0.1, hot_share: 0.9, contracts: 0.0 }
    }
}

impl Mix {
    pub fn with_contracts(contracts: f64) -> Mix {
        Mix { contracts, ..Mix::default() }
    }
}

/// The genesis storage of the token: [`GENESIS_TOKENS`] for every sender of a token call
/// among `transfers`.
pub fn token_holdings(transfers: &[UserTransfer]) -> Vec<(B256, U256)> {
    let mut holders: Vec<Address> = transfers
        .iter()
        .filter(|transfer| transfer.tx.to() == Some(TOKEN_AT))
        .map(|transfer| transfer.sender)
        .collect();
    holders.sort_unstable();
    holders.dedup();
    holders
        .into_iter()
        .map(|holder| (B256::from(virga_evm::contracts::token::balance_slot(holder)), U256::from(GENESIS_TOKENS)))
        .collect()
}

/// The accounts of a workload: key `i` is `SigningKey::from_seed(i)`.
pub struct Accounts {
    pub keys: Vec<SigningKey>,
    pub addresses: Vec<Address>,
}

impl Accounts {
    /// Derives `count` keys and addresses on rayon's pool, reporting progress in thousands.
    pub fn generate(count: usize, progress: &(dyn Fn(u64) + Sync)) -> Accounts {
        let pairs: Vec<(SigningKey, Address)> = (0..count as u64)
            .into_par_iter()
            .map(|seed| {
                let key = SigningKey::from_seed(seed);
                let address = key.address();
                if seed % 1000 == 999 {
                    progress(1000);
                }
                (key, address)
            })
            .collect();
        let (keys, addresses) = pairs.into_iter().unzip();
        Accounts { keys, addresses }
    }
}

/// `count` signed transfers, in the order users would submit them: each account's nonces
/// in sequence. Deterministic in `seed`.
pub fn sign_transfers(
    accounts: &Accounts,
    count: usize,
    chain_id: u64,
    mix: Mix,
    seed: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Vec<UserTransfer> {
    let n = accounts.addresses.len();
    let hot = ((n as f64 * mix.hot_accounts).ceil() as usize).clamp(1, n.max(1));
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let pick = |rng: &mut rand::rngs::StdRng| {
        if n <= hot || rng.random_bool(mix.hot_share) {
            rng.random_range(0..hot)
        } else {
            rng.random_range(hot..n)
        }
    };
    let mut nonces = vec![0u64; n];
    let plan: Vec<(usize, usize, u64, u64, bool)> = (0..count)
        .map(|_| {
            let sender = pick(&mut rng);
            let mut to = pick(&mut rng);
            if to == sender && n > 1 {
                to = (to + 1) % n;
            }
            let nonce = nonces[sender];
            nonces[sender] += 1;
            let call = mix.contracts > 0.0 && rng.random_bool(mix.contracts.min(1.0));
            (sender, to, nonce, rng.random_range(1..1_000u64), call)
        })
        .collect();
    plan.into_par_iter()
        .enumerate()
        .map(|(index, (sender, to, nonce, value, call))| {
            let key = &accounts.keys[sender];
            let tx = if call {
                let input = virga_evm::contracts::token::transfer(accounts.addresses[to], U256::from(value));
                let tx = TxLegacy {
                    chain_id: Some(chain_id),
                    nonce,
                    gas_price: GAS_PRICE,
                    gas_limit: TOKEN_CALL_GAS,
                    to: TxKind::Call(TOKEN_AT),
                    value: U256::ZERO,
                    input,
                };
                SignedTx::sign_legacy(key, tx)
            } else {
                let to = accounts.addresses[to];
                let gas = virga_ledger::exec::TRANSFER_GAS;
                SignedTx::sign(key, nonce, to, U256::from(value), GAS_PRICE, gas, Some(chain_id))
            };
            if index % 1000 == 999 {
                progress(1000);
            }
            UserTransfer { tx, sender: accounts.addresses[sender] }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered(accounts: &Accounts, count: usize) -> Vec<UserTransfer> {
        sign_transfers(accounts, count, 7, Mix::default(), 3, &|_| {})
    }

    #[tokio::test]
    async fn offer_hands_each_client_its_senders_transfers_in_order_and_stops_when_refused() {
        let accounts = Accounts::generate(40, &|_| {});
        let transfers = offered(&accounts, 300);
        let mut shares: Vec<Vec<UserTransfer>> = vec![Vec::new(); 3];
        let mut deliveries = 0;
        let handed = offer(transfers.clone(), None, 3, |client, share| {
            deliveries += 1;
            shares[client].extend(share);
            true
        })
        .await;
        assert_eq!(handed, 300);
        assert_eq!(deliveries, 3, "unlimited: everything at once, one share per client");
        for (client, share) in shares.iter().enumerate() {
            assert!(share.iter().all(|transfer| client_of(transfer, 3) == client));
            let expected: Vec<_> =
                transfers.iter().filter(|t| client_of(t, 3) == client).map(|t| t.tx.hash()).collect();
            assert_eq!(share.iter().map(|t| t.tx.hash()).collect::<Vec<_>>(), expected, "arrival order kept");
        }

        let mut calls = 0;
        let handed = offer(transfers, None, 3, |_, _| {
            calls += 1;
            calls < 2
        })
        .await;
        assert!(handed < 300 && calls == 2, "a refusing client ends the offer ({handed} handed)");
    }

    #[tokio::test]
    async fn offer_at_a_rate_spreads_the_transfers_over_time() {
        let accounts = Accounts::generate(10, &|_| {});
        let transfers = offered(&accounts, 40);
        let begun = std::time::Instant::now();
        let mut deliveries = 0;
        let handed = offer(transfers, Some(2_000.0), 1, |_, _| {
            deliveries += 1;
            true
        })
        .await;
        assert_eq!(handed, 40);
        // Transfer 39 is due 39 / 2000 s after the start.
        assert!(begun.elapsed() >= std::time::Duration::from_micros(19_500), "{:?}", begun.elapsed());
        assert!(deliveries > 1, "handed as they fall due, not at once");
    }

    #[test]
    fn transfers_are_skewed_deterministic_and_in_nonce_order() {
        let accounts = Accounts::generate(200, &|_| {});
        let first = sign_transfers(&accounts, 2000, 7, Mix::default(), 1, &|_| {});
        let again = sign_transfers(&accounts, 2000, 7, Mix::default(), 1, &|_| {});
        assert_eq!(
            first.iter().map(|t| t.tx.hash()).collect::<Vec<_>>(),
            again.iter().map(|t| t.tx.hash()).collect::<Vec<_>>()
        );
        let hot: std::collections::HashSet<_> = accounts.addresses[..20].iter().collect();
        let hot_senders = first.iter().filter(|t| hot.contains(&t.sender)).count();
        assert!((1700..=1900).contains(&hot_senders), "{hot_senders} of 2000 from the hot tenth");
        let mut next = std::collections::HashMap::new();
        for transfer in &first {
            assert_eq!(transfer.tx.recover_sender().unwrap(), transfer.sender);
            let nonce = next.entry(transfer.sender).or_insert(0u64);
            assert_eq!(transfer.tx.nonce(), *nonce);
            *nonce += 1;
        }
    }
}
