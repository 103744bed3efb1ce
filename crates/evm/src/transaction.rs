//! Ethereum transactions of every type a block may carry (EIP-2718: legacy, EIP-2930,
//! EIP-1559, EIP-4844 without its sidecar, EIP-7702), decoded with alloy's consensus types,
//! their signers recovered, and handed to revm.
//!
//! Decoding checks the format and the signature only; whether the chain id, nonce, balance,
//! fees or type suit the block is revm's validation at execution.

use alloy_consensus::transaction::SignerRecoverable;
use alloy_consensus::{Transaction as _, TxEnvelope};
use alloy_eips::eip2718::{Decodable2718, Eip2718Error, Encodable2718};
use alloy_eips::Typed2718;
use alloy_primitives::{Address, B256};
use revm::context::either::Either;
use revm::context::TxEnv;

/// The highest transaction type Virga decodes (EIP-7702's).
const MAX_KNOWN_TYPE: u8 = 4;

/// Why bytes are not a transaction Virga can execute.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransactionError {
    #[error("empty input: expected an EIP-2718 transaction (a type byte or an RLP list)")]
    Empty,
    #[error("transaction type 0x{0:02x} is unknown (known: 0 legacy, 1 EIP-2930, 2 EIP-1559, 3 EIP-4844, 4 EIP-7702)")]
    UnknownType(u8),
    /// The RLP was malformed; the text is alloy's.
    #[error("malformed transaction RLP: {0}")]
    Rlp(alloy_rlp::Error),
    #[error("{0} trailing byte(s) after the transaction")]
    TrailingBytes(usize),
    #[error("a legacy transaction behind type byte 0x00: legacy transactions carry no type byte (EIP-2718)")]
    TypedLegacy,
    /// `s` in the upper half of the curve order (EIP-2), `r` or `s` out of range, or no key
    /// recovers from the signature.
    #[error("invalid signature: no sender recovers from it (or s is above secp256k1n/2, EIP-2)")]
    InvalidSignature,
}

/// Decodes exactly one EIP-2718 encoded transaction of any type, without recovering its
/// signer: the format only, every error named. The ledger's decoder shares it.
pub fn decode_envelope(bytes: &[u8]) -> Result<TxEnvelope, TransactionError> {
    let Some(&first) = bytes.first() else { return Err(TransactionError::Empty) };
    if first == 0x00 {
        return Err(TransactionError::TypedLegacy);
    }
    // 0x00–0x7f is a type byte (EIP-2718); legacy transactions start with an RLP list.
    if (MAX_KNOWN_TYPE + 1..=0x7f).contains(&first) {
        return Err(TransactionError::UnknownType(first));
    }
    let mut rest = bytes;
    let envelope = if first >= 0x80 {
        // Legacy: decoded as such, so a malformed one gets the RLP decoder's reason rather
        // than the envelope's "unexpected type 0".
        let signed = alloy_consensus::Signed::<alloy_consensus::TxLegacy>::rlp_decode(&mut rest)
            .map_err(TransactionError::Rlp)?;
        TxEnvelope::Legacy(signed)
    } else {
        TxEnvelope::decode_2718(&mut rest).map_err(|error| match error {
            Eip2718Error::RlpError(error) => TransactionError::Rlp(error),
            Eip2718Error::UnexpectedType(ty) => TransactionError::UnknownType(ty),
            // Eip2718Error is non-exhaustive; anything new is a format error too.
            other => TransactionError::Rlp(other.into()),
        })?
    };
    if !rest.is_empty() {
        return Err(TransactionError::TrailingBytes(rest.len()));
    }
    Ok(envelope)
}

/// A decoded transaction with its signer: what a block holds and execution needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EthTransaction {
    envelope: TxEnvelope,
    sender: Address,
}

impl EthTransaction {
    /// Decodes exactly one EIP-2718 encoded transaction and recovers its sender.
    pub fn decode(bytes: &[u8]) -> Result<Self, TransactionError> {
        Self::from_envelope(decode_envelope(bytes)?)
    }

    /// A transaction built in process (a workload, a test), its sender recovered as for one
    /// that came from outside.
    pub fn from_envelope(envelope: TxEnvelope) -> Result<Self, TransactionError> {
        let sender = envelope.recover_signer().map_err(|_| TransactionError::InvalidSignature)?;
        Ok(Self { envelope, sender })
    }

    /// A transaction this process signed itself, with the signer's address: its sender is
    /// not recovered again (a workload of many transactions would spend its setup on
    /// recovery). Anything from outside goes through [`Self::decode`] or
    /// [`Self::from_envelope`].
    pub fn signed_by(envelope: TxEnvelope, sender: Address) -> Self {
        Self { envelope, sender }
    }

    pub fn sender(&self) -> Address {
        self.sender
    }

    pub fn hash(&self) -> B256 {
        *self.envelope.tx_hash()
    }

    pub fn envelope(&self) -> &TxEnvelope {
        &self.envelope
    }

    /// The EIP-2718 bytes: what a block body and the transactions root hold.
    pub fn encoded(&self) -> Vec<u8> {
        self.envelope.encoded_2718()
    }

    /// The transaction as revm executes it.
    pub fn tx_env(&self) -> TxEnv {
        let tx = &self.envelope;
        // revm's `gas_price` is the legacy price or, for fee-market types, the fee cap.
        let gas_price = tx.gas_price().unwrap_or_else(|| tx.max_fee_per_gas());
        TxEnv {
            tx_type: tx.ty(),
            caller: self.sender,
            gas_limit: tx.gas_limit(),
            gas_price,
            kind: tx.kind(),
            value: tx.value(),
            data: tx.input().clone(),
            nonce: tx.nonce(),
            chain_id: tx.chain_id(),
            access_list: tx.access_list().cloned().unwrap_or_default(),
            gas_priority_fee: if tx.gas_price().is_some() { None } else { tx.max_priority_fee_per_gas() },
            blob_hashes: tx.blob_versioned_hashes().map(<[B256]>::to_vec).unwrap_or_default(),
            max_fee_per_blob_gas: tx.max_fee_per_blob_gas().unwrap_or_default(),
            authorization_list: tx
                .authorization_list()
                .map(|list| list.iter().cloned().map(Either::Left).collect())
                .unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{address, hex, U256};

    /// A type-2 transaction from Ethereum's state tests (stExample/eip1559, txbytes), sent by
    /// the tests' usual key.
    const EIP1559: &str = "02f8c101010a8207d0833d090094cccccccccccccccccccccccccccccccccccccccc8000f85bf85994ccccccccccccccccccccccccccccccccccccccccf842a00000000000000000000000000000000000000000000000000000000000000000a0000000000000000000000000000000000000000000000000000000000000000180a0d671815898b8dd34321adbba4cb6a57baa7017323c26946f3719b00e70c755c2a03528b9efe3be57ea65a933d1e6bbf3b7d0c78830138883c1201e0c641fee6464";
    const SENDER: Address = address!("a94f5374fce5edbc8e2a8697c15331677e6ebf0b");

    fn eip1559() -> Vec<u8> {
        hex::decode(EIP1559).expect("hex")
    }

    #[test]
    fn a_typed_transaction_decodes_to_its_sender_and_encodes_back_to_the_same_bytes() {
        let tx = EthTransaction::decode(&eip1559()).expect("valid");
        assert_eq!(tx.sender(), SENDER);
        assert_eq!(tx.encoded(), eip1559());
        let env = tx.tx_env();
        assert_eq!((env.tx_type, env.nonce, env.gas_price, env.gas_priority_fee), (2, 1, 2000, Some(10)));
        assert_eq!(env.access_list.len(), 1);
    }

    #[test]
    fn malformed_transactions_are_refused_with_the_reason() {
        assert_eq!(EthTransaction::decode(&[]), Err(TransactionError::Empty));
        assert_eq!(EthTransaction::decode(&[0x05, 0xc0]), Err(TransactionError::UnknownType(0x05)));
        // Type 0x00 before a legacy list would decode and re-encode without the byte.
        let legacy = hex::decode("00c9498041804a4a238008").expect("hex");
        assert_eq!(EthTransaction::decode(&legacy), Err(TransactionError::TypedLegacy));
        let mut trailing = eip1559();
        trailing.push(0);
        assert_eq!(EthTransaction::decode(&trailing), Err(TransactionError::TrailingBytes(1)));
        let truncated = &eip1559()[..40];
        assert!(matches!(EthTransaction::decode(truncated), Err(TransactionError::Rlp(_))));
    }

    #[test]
    fn a_high_s_signature_is_refused() {
        let tx = EthTransaction::decode(&eip1559()).expect("valid");
        let TxEnvelope::Eip1559(signed) = tx.envelope() else { panic!("a type-2 transaction") };
        let signature = signed.signature();
        let order = U256::from_be_bytes(hex!("fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141"));
        let high = alloy_primitives::Signature::new(signature.r(), order - signature.s(), !signature.v());
        let flipped = TxEnvelope::Eip1559(alloy_consensus::Signed::new_unhashed(signed.tx().clone(), high));
        assert_eq!(EthTransaction::decode(&flipped.encoded_2718()), Err(TransactionError::InvalidSignature));
    }
}
