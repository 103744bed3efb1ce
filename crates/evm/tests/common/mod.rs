//! Keys and signing for the integration tests, and the contracts' genesis and blocks.

use alloy_consensus::{SignableTransaction, TxEip1559, TxEnvelope, TxLegacy};
use alloy_primitives::{Address, Bytes, Signature, TxKind, U256};
use secp256k1::{Message, SecretKey, SECP256K1};
use virga_evm::contracts::{token, KITTIES, LOTTERY, TOKEN};
use virga_evm::{BlockContext, EthTransaction, Fork};
use virga_trie::account::{Account, StateTrie};

pub(crate) const TOKEN_AT: Address = alloy_primitives::address!("00000000000000000000000000000000000e2c20");
pub(crate) const KITTIES_AT: Address = alloy_primitives::address!("000000000000000000000000000000000000c47e");
pub(crate) const LOTTERY_AT: Address = alloy_primitives::address!("0000000000000000000000000000000000001077");

/// Senders 1 to 3 with ether, the three contracts deployed, sender 1 holding 1,000 tokens.
pub(crate) fn contracts_genesis() -> StateTrie {
    let mut state = StateTrie::new();
    for seed in 1..=3 {
        state.set_account(sender(seed), Account::with_balance(0, U256::from(10u64).pow(U256::from(18))));
    }
    for (at, contract) in [(TOKEN_AT, TOKEN), (KITTIES_AT, KITTIES), (LOTTERY_AT, LOTTERY)] {
        let code_hash = state.insert_code(&contract.runtime_code());
        state.set_account(at, Account { code_hash, ..Account::default() });
    }
    state.set_storage(TOKEN_AT, alloy_primitives::B256::from(token::balance_slot(sender(1))), U256::from(1_000));
    state.root();
    state
}

/// Block `number` of the contracts' tests (Cancun, base fee 7).
pub(crate) fn contracts_block(number: u64) -> BlockContext {
    BlockContext {
        fork: Fork::Cancun,
        chain_id: 1,
        number,
        timestamp: 1_000 + number,
        coinbase: alloy_primitives::address!("00000000000000000000000000000000000c0de5"),
        gas_limit: 30_000_000,
        base_fee: 7,
        difficulty: U256::ZERO,
        prev_randao: alloy_primitives::B256::ZERO,
        excess_blob_gas: 0,
    }
}

/// The test key numbered `seed` (1 and up).
pub(crate) fn secret(seed: u32) -> SecretKey {
    let mut bytes = [0x11u8; 32];
    bytes[28..].copy_from_slice(&seed.to_be_bytes());
    SecretKey::from_byte_array(bytes).expect("a valid scalar")
}

pub(crate) fn sender(seed: u32) -> Address {
    let public = secret(seed).public_key(SECP256K1).serialize_uncompressed();
    Address::from_raw_public_key(&public[1..])
}

/// What a test transaction does; fees are fixed.
pub(crate) struct Call {
    pub nonce: u64,
    pub to: TxKind,
    pub value: U256,
    pub input: Bytes,
    pub gas_limit: u64,
    /// A legacy (EIP-155) transaction rather than an EIP-1559 one.
    pub legacy: bool,
}

pub(crate) fn sign(seed: u32, call: Call) -> EthTransaction {
    let signature = |digest: alloy_primitives::B256| {
        let (id, compact) =
            SECP256K1.sign_ecdsa_recoverable(Message::from_digest(digest.0), &secret(seed)).serialize_compact();
        Signature::new(U256::from_be_slice(&compact[..32]), U256::from_be_slice(&compact[32..]), i32::from(id) != 0)
    };
    let envelope: TxEnvelope = if call.legacy {
        let tx = TxLegacy {
            chain_id: Some(1),
            nonce: call.nonce,
            gas_price: 20,
            gas_limit: call.gas_limit,
            to: call.to,
            value: call.value,
            input: call.input,
        };
        let signed = signature(tx.signature_hash());
        tx.into_signed(signed).into()
    } else {
        let tx = TxEip1559 {
            chain_id: 1,
            nonce: call.nonce,
            gas_limit: call.gas_limit,
            max_fee_per_gas: 20,
            max_priority_fee_per_gas: 2,
            to: call.to,
            value: call.value,
            access_list: Default::default(),
            input: call.input,
        };
        let signed = signature(tx.signature_hash());
        tx.into_signed(signed).into()
    };
    EthTransaction::from_envelope(envelope).expect("recoverable")
}
