//! Keys and signing for the integration tests.

use alloy_consensus::{SignableTransaction, TxEip1559, TxEnvelope, TxLegacy};
use alloy_primitives::{Address, Bytes, Signature, TxKind, U256};
use secp256k1::{Message, SecretKey, SECP256K1};
use virga_evm::EthTransaction;

/// The test key numbered `seed` (1 and up).
pub fn secret(seed: u32) -> SecretKey {
    let mut bytes = [0x11u8; 32];
    bytes[28..].copy_from_slice(&seed.to_be_bytes());
    SecretKey::from_byte_array(bytes).expect("a valid scalar")
}

pub fn sender(seed: u32) -> Address {
    let public = secret(seed).public_key(SECP256K1).serialize_uncompressed();
    Address::from_raw_public_key(&public[1..])
}

/// What a test transaction does; fees are fixed.
pub struct Call {
    pub nonce: u64,
    pub to: TxKind,
    pub value: U256,
    pub input: Bytes,
    pub gas_limit: u64,
    /// A legacy (EIP-155) transaction rather than an EIP-1559 one.
    pub legacy: bool,
}

pub fn sign(seed: u32, call: Call) -> EthTransaction {
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
