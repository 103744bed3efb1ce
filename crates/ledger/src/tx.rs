//! Signed Ethereum transactions: every EIP-2718 type a Cancun block carries (legacy with or
//! without EIP-155 replay protection, EIP-2930 and EIP-1559), value transfers, contract calls
//! and contract creations alike.
//!
//! The wire format is Ethereum's: a transaction's EIP-2718 bytes (legacy RLP, or a type
//! byte and the RLP payload) are what clients submit and what the transactions root commits
//! to; a block body wraps typed transactions in an RLP string, as Ethereum's do. Signing and
//! sender recovery use libsecp256k1 through the `secp256k1` crate and its global
//! (precomputed, shared) context.
//!
//! What is checked here is the format and the signature. Whether the chain id, nonce,
//! balance, fees or gas are acceptable is decided by execution (revm's validation); a
//! transaction that fails it is left out of the block.

use std::fmt;

use alloy_consensus::{
    crypto::SECP256K1N_HALF, SignableTransaction, Signed, Transaction as _, TxEip1559, TxEnvelope, TxLegacy,
};
use alloy_eips::eip2718::Encodable2718;
use alloy_eips::Typed2718;
use alloy_primitives::{keccak256, Address, Bytes, Signature, TxKind, B256, U256};
use alloy_rlp::{Decodable, Encodable};
use rayon::prelude::*;
use secp256k1::{
    ecdsa::{RecoverableSignature, RecoveryId},
    Message, PublicKey, SecretKey, SECP256K1,
};
use virga_evm::{EthTransaction, TransactionError};

/// Why a transaction could not be decoded or its sender recovered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TxError {
    /// The input held no bytes at all.
    #[error("empty input: expected an EIP-2718 transaction (a type byte or an RLP list)")]
    Empty,
    /// The RLP was malformed; the text is alloy's.
    #[error("malformed transaction RLP: {0}")]
    Rlp(alloy_rlp::Error),
    /// A whole transaction was decoded but bytes were left over.
    #[error("{0} trailing byte(s) after the transaction")]
    TrailingBytes(usize),
    /// A type byte no fork defines.
    #[error("transaction type 0x{0:02x} is unknown (known: 0 legacy, 1 EIP-2930, 2 EIP-1559, 3 EIP-4844, 4 EIP-7702)")]
    UnknownType(u8),
    /// A legacy transaction behind a type byte 0x00 (legacy transactions carry none).
    #[error("a legacy transaction behind type byte 0x00: legacy transactions carry no type byte (EIP-2718)")]
    TypedLegacy,
    /// A type Ethereum defines but Virga's chain does not carry.
    #[error("transaction type 0x{ty:02x} is not accepted: {why}")]
    UnsupportedType { ty: u8, why: &'static str },
    /// `s` is in the upper half of the curve order, which Ethereum rejects since Homestead
    /// (EIP-2) to rule out a second valid signature for the same transaction.
    #[error("signature s is greater than secp256k1n/2 (malleable; rejected since Homestead, EIP-2)")]
    HighS,
    /// `r` or `s` is zero or not below the curve order.
    #[error("invalid signature: {0}")]
    InvalidSignature(&'static str),
    /// The signature is well-formed but no public key recovers from it.
    #[error("unrecoverable signature: no public key matches it")]
    Unrecoverable,
    /// A secret key was not 32 bytes or not a valid secp256k1 scalar.
    #[error("invalid secret key: {0}")]
    InvalidKey(&'static str),
}

impl From<TransactionError> for TxError {
    fn from(error: TransactionError) -> Self {
        match error {
            TransactionError::Empty => TxError::Empty,
            TransactionError::Rlp(error) => TxError::Rlp(error),
            TransactionError::TrailingBytes(count) => TxError::TrailingBytes(count),
            TransactionError::UnknownType(ty) => TxError::UnknownType(ty),
            TransactionError::TypedLegacy => TxError::TypedLegacy,
            // The format decoder recovers no signer; kept total for the variant's sake.
            TransactionError::InvalidSignature => TxError::Unrecoverable,
        }
    }
}

impl From<alloy_rlp::Error> for TxError {
    fn from(err: alloy_rlp::Error) -> Self {
        TxError::Rlp(err)
    }
}

/// A secp256k1 secret key with its Ethereum address.
///
/// The address is derived once at construction, since workloads ask for it for every
/// transaction they build and deriving it costs a scalar multiplication.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKey {
    secret: SecretKey,
    address: Address,
}

impl SigningKey {
    /// The key whose 32 big-endian bytes are `bytes`; fails if the length is not 32 or the
    /// scalar is zero or not below the curve order.
    pub fn from_bytes(bytes: &[u8]) -> Result<SigningKey, TxError> {
        let array: [u8; 32] = bytes.try_into().map_err(|_| TxError::InvalidKey("a secret key is 32 bytes"))?;
        let secret = SecretKey::from_byte_array(array).map_err(|_| TxError::InvalidKey("not a scalar in 1..n-1"))?;
        Ok(SigningKey::from_secret(secret))
    }

    /// A key derived deterministically from `seed`, so workloads and tests can name accounts
    /// by number and get the same keys on every run and machine. Not for real funds.
    pub fn from_seed(seed: u64) -> SigningKey {
        let mut preimage = [0u8; 32];
        preimage[..16].copy_from_slice(b"virga/test-key/\0");
        preimage[16..24].copy_from_slice(&seed.to_be_bytes());
        // A hash is a valid scalar except with probability ~2^-128; re-hashing keeps the
        // derivation total without a panic path.
        let mut candidate = keccak256(preimage);
        loop {
            if let Ok(secret) = SecretKey::from_byte_array(candidate.0) {
                return SigningKey::from_secret(secret);
            }
            candidate = keccak256(candidate);
        }
    }

    fn from_secret(secret: SecretKey) -> SigningKey {
        let public = PublicKey::from_secret_key_global(&secret);
        SigningKey { secret, address: public_key_address(&public) }
    }

    /// The Ethereum address of this key: the last 20 bytes of keccak-256 of the
    /// uncompressed public key without its 0x04 tag.
    pub fn address(&self) -> Address {
        self.address
    }

    /// The 32 big-endian bytes of the secret scalar.
    pub fn to_bytes(&self) -> B256 {
        B256::from(self.secret.secret_bytes())
    }

    /// Signs a 32-byte digest with an RFC 6979 deterministic nonce. libsecp256k1 always
    /// returns the low-`s` form, so the result passes [`SignedTx::recover_sender`].
    /// The returned signature's `v()` is the y-parity (recovery id 0 or 1).
    pub fn sign_hash(&self, hash: B256) -> Signature {
        let signature = SECP256K1.sign_ecdsa_recoverable(Message::from_digest(hash.0), &self.secret);
        let (recovery_id, compact) = signature.serialize_compact();
        Signature::new(
            U256::from_be_slice(&compact[..32]),
            U256::from_be_slice(&compact[32..]),
            i32::from(recovery_id) != 0,
        )
    }
}

impl fmt::Debug for SigningKey {
    // The secret stays out of logs and panic messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey").field("address", &self.address).finish_non_exhaustive()
    }
}

/// The address whose key made `signature` over `hash`: `r` and `s` nonzero and below the
/// curve order, `s` in the lower half (EIP-2), and a public key recoverable from them.
pub fn recover_address(hash: B256, signature: &Signature) -> Result<Address, TxError> {
    let (r, s) = (signature.r(), signature.s());
    if r.is_zero() {
        return Err(TxError::InvalidSignature("r is zero"));
    }
    if s.is_zero() {
        return Err(TxError::InvalidSignature("s is zero"));
    }
    if s > SECP256K1N_HALF {
        return Err(TxError::HighS);
    }
    let mut compact = [0u8; 64];
    compact[..32].copy_from_slice(&r.to_be_bytes::<32>());
    compact[32..].copy_from_slice(&s.to_be_bytes::<32>());
    let recovery_id = if signature.v() { RecoveryId::One } else { RecoveryId::Zero };
    let recoverable = RecoverableSignature::from_compact(&compact, recovery_id)
        .map_err(|_| TxError::InvalidSignature("r is not below the curve order"))?;
    let public =
        SECP256K1.recover_ecdsa(Message::from_digest(hash.0), &recoverable).map_err(|_| TxError::Unrecoverable)?;
    Ok(public_key_address(&public))
}

fn public_key_address(public: &PublicKey) -> Address {
    let uncompressed = public.serialize_uncompressed();
    Address::from_slice(&keccak256(&uncompressed[1..])[12..])
}

/// A signed transaction of a type Virga's chain carries (legacy, EIP-2930, EIP-1559).
///
/// The transaction hash is computed once and cached (alloy's [`Signed`] keeps it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SignedTx {
    inner: TxEnvelope,
}

impl SignedTx {
    /// Builds and signs a legacy transfer of `value` wei to `to`. With `chain_id`
    /// `Some(id)` the signature follows EIP-155 (`v = 35 + 2·id + parity`); with `None` it
    /// is a pre-EIP-155 signature (`v = 27 + parity`).
    pub fn sign(
        key: &SigningKey,
        nonce: u64,
        to: Address,
        value: U256,
        gas_price: u128,
        gas_limit: u64,
        chain_id: Option<u64>,
    ) -> SignedTx {
        let tx = TxLegacy { chain_id, nonce, gas_price, gas_limit, to: TxKind::Call(to), value, input: Bytes::new() };
        SignedTx::sign_legacy(key, tx)
    }

    /// Signs a legacy transaction (a call or creation when it carries data).
    pub fn sign_legacy(key: &SigningKey, tx: TxLegacy) -> SignedTx {
        let signature = key.sign_hash(tx.signature_hash());
        SignedTx { inner: TxEnvelope::Legacy(Signed::new_unhashed(tx, signature)) }
    }

    /// Signs an EIP-1559 transaction.
    pub fn sign_eip1559(key: &SigningKey, tx: TxEip1559) -> SignedTx {
        let signature = key.sign_hash(tx.signature_hash());
        SignedTx { inner: TxEnvelope::Eip1559(Signed::new_unhashed(tx, signature)) }
    }

    /// Wraps an already signed transaction, checking that its type is one the chain
    /// carries. The signature is not checked here.
    pub fn from_envelope(envelope: TxEnvelope) -> Result<SignedTx, TxError> {
        match &envelope {
            TxEnvelope::Legacy(_) | TxEnvelope::Eip2930(_) | TxEnvelope::Eip1559(_) => Ok(SignedTx { inner: envelope }),
            TxEnvelope::Eip4844(_) => Err(TxError::UnsupportedType {
                ty: 3,
                why: "EIP-4844 blob transactions need blob sidecars, which Virga's chain does not carry",
            }),
            TxEnvelope::Eip7702(_) => {
                Err(TxError::UnsupportedType { ty: 4, why: "EIP-7702 is a Prague rule; Virga's chain runs Cancun's" })
            }
        }
    }

    /// The alloy envelope inside.
    pub fn envelope(&self) -> &TxEnvelope {
        &self.inner
    }

    /// The legacy transaction's fields, if it is one.
    pub fn legacy(&self) -> Option<&TxLegacy> {
        match &self.inner {
            TxEnvelope::Legacy(signed) => Some(signed.tx()),
            _ => None,
        }
    }

    /// The EIP-2718 type (0 for legacy).
    pub fn tx_type(&self) -> u8 {
        self.inner.ty()
    }

    /// The transaction hash: keccak-256 of the EIP-2718 encoding.
    pub fn hash(&self) -> B256 {
        *self.inner.tx_hash()
    }

    /// The digest that was signed.
    pub fn signing_hash(&self) -> B256 {
        self.inner.signature_hash()
    }

    /// The signature (`v()` is the y-parity).
    pub fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    /// The chain id the signature commits to; `None` only for a pre-EIP-155 legacy one.
    pub fn chain_id(&self) -> Option<u64> {
        self.inner.chain_id()
    }

    /// The sender's nonce.
    pub fn nonce(&self) -> u64 {
        self.inner.nonce()
    }

    /// The called address; `None` for a contract creation.
    pub fn to(&self) -> Option<Address> {
        self.inner.to()
    }

    /// The amount transferred, in wei.
    pub fn value(&self) -> U256 {
        self.inner.value()
    }

    /// The call data, or a creation's init code.
    pub fn input(&self) -> &Bytes {
        self.inner.input()
    }

    /// The most a unit of gas may cost: the legacy gas price, or the fee cap.
    pub fn max_fee_per_gas(&self) -> u128 {
        self.inner.max_fee_per_gas()
    }

    /// The most gas the transaction may use.
    pub fn gas_limit(&self) -> u64 {
        self.inner.gas_limit()
    }

    /// Recovers the address that signed the transaction.
    ///
    /// Rejects `s` above secp256k1n/2 as Ethereum has since Homestead. The chain id is not
    /// compared with anything here; execution does that.
    pub fn recover_sender(&self) -> Result<Address, TxError> {
        recover_address(self.signing_hash(), self.signature())
    }

    /// The length of [`SignedTx::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        self.inner.encode_2718_len()
    }

    /// The EIP-2718 encoding: what clients submit and the transactions root commits to.
    pub fn encode(&self) -> Vec<u8> {
        self.inner.encoded_2718()
    }

    /// The length of [`SignedTx::encode_body`]'s output.
    pub fn body_len(&self) -> usize {
        self.inner.length()
    }

    /// Appends the encoding a block body holds: legacy RLP, or the EIP-2718 bytes of a typed
    /// transaction wrapped in an RLP string.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        self.inner.encode(out);
    }

    /// Decodes a transaction's EIP-2718 encoding, which must span all of `bytes`. The
    /// signature is only parsed; [`SignedTx::recover_sender`] checks it.
    pub fn decode(bytes: &[u8]) -> Result<SignedTx, TxError> {
        SignedTx::from_envelope(virga_evm::transaction::decode_envelope(bytes)?)
    }

    /// Decodes one transaction in its block-body encoding from the front of `buf` and
    /// advances `buf` past it.
    pub fn decode_body(buf: &mut &[u8]) -> Result<SignedTx, TxError> {
        let Some(&first) = buf.first() else { return Err(TxError::Empty) };
        if first < 0x80 {
            // A bare type byte: a body wraps typed transactions in an RLP string.
            return Err(TxError::Rlp(alloy_rlp::Error::Custom(
                "a typed transaction in a block body must be wrapped in an RLP string",
            )));
        }
        let envelope = TxEnvelope::decode(buf)?;
        if first < 0xc0 && matches!(envelope, TxEnvelope::Legacy(_)) {
            // An RLP string holds a typed transaction; a legacy one inside is type 0x00.
            return Err(TxError::TypedLegacy);
        }
        SignedTx::from_envelope(envelope)
    }

    /// Unwraps the alloy envelope.
    pub fn into_inner(self) -> TxEnvelope {
        self.inner
    }
}

/// A transaction together with the sender recovered from its signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveredTx {
    /// The signed transaction.
    pub tx: SignedTx,
    /// The address that signed it.
    pub sender: Address,
}

impl RecoveredTx {
    /// Recovers the sender of `tx` (see [`SignedTx::recover_sender`]).
    pub fn recover(tx: SignedTx) -> Result<RecoveredTx, TxError> {
        let sender = tx.recover_sender()?;
        Ok(RecoveredTx { tx, sender })
    }

    /// The transaction as the EVM executes it.
    pub fn to_eth(&self) -> EthTransaction {
        EthTransaction::signed_by(self.tx.inner.clone(), self.sender)
    }
}

/// Recovers the sender of every transaction on rayon's thread pool, in input order.
///
/// Signature recovery dominates block verification, and each recovery is independent.
pub fn recover_all(txs: &[SignedTx]) -> Vec<Result<Address, TxError>> {
    // Pieces of at least 8 keep rayon's per-task overhead (about a microsecond) small next
    // to recovery (tens of microseconds each) while still splitting blocks of a few dozen.
    txs.par_iter().with_min_len(8).map(SignedTx::recover_sender).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn legacy(tx: &SignedTx) -> TxLegacy {
        match tx.envelope() {
            TxEnvelope::Legacy(signed) => signed.tx().clone(),
            other => panic!("a legacy transaction, not type {}", other.ty()),
        }
    }

    fn resigned(tx: TxLegacy, signature: Signature) -> SignedTx {
        SignedTx::from_envelope(TxEnvelope::Legacy(Signed::new_unhashed(tx, signature))).expect("a legacy transaction")
    }

    fn transfer(seed: u64, chain_id: Option<u64>) -> SignedTx {
        let key = SigningKey::from_seed(seed);
        let to = SigningKey::from_seed(seed + 1).address();
        SignedTx::sign(&key, 7, to, U256::from(1_000u64), 1_000_000_000, 21_000, chain_id)
    }

    #[test]
    fn sign_decode_recover_round_trip() {
        for chain_id in [None, Some(1), Some(1337), Some(u64::MAX / 2 - 18)] {
            let tx = transfer(3, chain_id);
            let bytes = tx.encode();
            assert_eq!(bytes.len(), tx.encoded_len());
            let decoded = SignedTx::decode(&bytes).expect("decodes");
            assert_eq!(decoded, tx);
            assert_eq!(decoded.hash(), keccak256(&bytes));
            assert_eq!(decoded.chain_id(), chain_id);
            assert_eq!(decoded.recover_sender(), Ok(SigningKey::from_seed(3).address()));
        }
    }

    #[test]
    fn seeded_keys_are_deterministic_and_distinct() {
        assert_eq!(SigningKey::from_seed(9).to_bytes(), SigningKey::from_seed(9).to_bytes());
        assert_ne!(SigningKey::from_seed(9).address(), SigningKey::from_seed(10).address());
        let key = SigningKey::from_seed(9);
        let again = SigningKey::from_bytes(key.to_bytes().as_slice()).expect("valid key");
        assert_eq!(again, key);
        assert!(!format!("{key:?}").contains(&format!("{:x}", key.to_bytes())));
    }

    #[test]
    fn bad_keys_are_rejected() {
        assert!(matches!(SigningKey::from_bytes(&[1; 31]), Err(TxError::InvalidKey(_))));
        assert!(matches!(SigningKey::from_bytes(&[0; 32]), Err(TxError::InvalidKey(_))));
        assert!(matches!(SigningKey::from_bytes(&[0xff; 32]), Err(TxError::InvalidKey(_))));
    }

    #[test]
    fn high_s_is_rejected_and_low_s_accepted() {
        let tx = transfer(5, Some(1));
        let signature = *tx.signature();
        let n = SECP256K1N_HALF * U256::from(2) + U256::from(1);
        // (r, n - s) with the opposite parity is the same signature's malleable twin.
        let twin = Signature::new(signature.r(), n - signature.s(), !signature.v());
        let flipped = resigned(legacy(&tx), twin);
        let err = flipped.recover_sender().expect_err("high s");
        assert_eq!(err, TxError::HighS);
        assert!(err.to_string().contains("secp256k1n/2"));
        assert!(tx.recover_sender().is_ok());
    }

    #[test]
    fn zero_and_oversized_signature_parts_are_rejected() {
        let tx = transfer(6, None);
        let with = |r: U256, s: U256| resigned(legacy(&tx), Signature::new(r, s, false)).recover_sender();
        assert_eq!(with(U256::ZERO, U256::from(1)), Err(TxError::InvalidSignature("r is zero")));
        assert_eq!(with(U256::from(1), U256::ZERO), Err(TxError::InvalidSignature("s is zero")));
        assert!(matches!(with(U256::MAX, U256::from(1)), Err(TxError::InvalidSignature(_))));
    }

    #[test]
    fn a_changed_field_recovers_another_sender() {
        let tx = transfer(8, Some(1337));
        let mut changed = legacy(&tx);
        changed.value += U256::from(1);
        let forged = resigned(changed, *tx.signature());
        assert_ne!(forged.recover_sender().ok(), Some(SigningKey::from_seed(8).address()));
    }

    #[test]
    fn recover_all_keeps_order() {
        let mut txs: Vec<_> = (0..200u64).map(|i| transfer(100 + i, Some(1))).collect();
        txs[150] = resigned(legacy(&txs[150]), Signature::new(U256::ZERO, U256::from(1), false));
        let senders = recover_all(&txs);
        assert_eq!(senders.len(), 200);
        for (i, sender) in senders.iter().enumerate() {
            if i == 150 {
                assert!(sender.is_err());
            } else {
                assert_eq!(sender, &Ok(SigningKey::from_seed(100 + i as u64).address()));
            }
        }
        let recovered = RecoveredTx::recover(txs[0].clone()).expect("valid");
        assert_eq!(recovered.sender, SigningKey::from_seed(100).address());
    }

    #[test]
    fn malformed_inputs_say_what_is_wrong() {
        let good = transfer(4, Some(1)).encode();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "empty input"),
            (good[..good.len() - 1].to_vec(), "input too short"),
            ([good.as_slice(), &[0x80]].concat(), "1 trailing byte"),
            ([&[0x02], &good[..]].concat(), "malformed transaction RLP"),
            (vec![0x07, 0xc0], "type 0x07 is unknown"),
            // Found by the tx_decode fuzz target: type 0x00 before a legacy list.
            ([&[0x00], &good[..]].concat(), "legacy transactions carry no type byte"),
            (vec![0x00, 0xc9, 0x49, 0x80, 0x41, 0x80, 0x4a, 0x4a, 0x23, 0x80, 0x08], "type byte"),
            (vec![0x83, 1, 2, 3], "malformed transaction RLP"),
            (vec![0xc0], "malformed transaction RLP"),
            (vec![0xc3, 0x01, 0x02, 0x03], "malformed transaction RLP"),
            // A list claiming 2^64-1 bytes of payload.
            (vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], "malformed transaction RLP"),
        ];
        for (input, expected) in cases {
            let err = SignedTx::decode(&input).expect_err("malformed");
            assert!(err.to_string().contains(expected), "{input:02x?}: {err} lacks {expected:?}");
        }
    }

    #[test]
    fn calls_creations_and_eip1559_transactions_round_trip() {
        let key = SigningKey::from_seed(1);
        let create = TxLegacy {
            chain_id: Some(1337),
            nonce: 0,
            gas_price: 7,
            gas_limit: 100_000,
            to: TxKind::Create,
            value: U256::ZERO,
            input: Bytes::from_static(&[0x60, 0x00]),
        };
        let call = TxEip1559 {
            chain_id: 1337,
            nonce: 1,
            gas_limit: 60_000,
            max_fee_per_gas: 10,
            max_priority_fee_per_gas: 2,
            to: TxKind::Call(Address::repeat_byte(7)),
            value: U256::from(5),
            access_list: Default::default(),
            input: Bytes::from_static(&[1, 2, 3, 4]),
        };
        for tx in [SignedTx::sign_legacy(&key, create), SignedTx::sign_eip1559(&key, call)] {
            let bytes = tx.encode();
            assert_eq!(bytes.len(), tx.encoded_len());
            let decoded = SignedTx::decode(&bytes).expect("decodes");
            assert_eq!(decoded, tx);
            assert_eq!(decoded.hash(), keccak256(&bytes));
            assert_eq!(decoded.recover_sender(), Ok(key.address()));
            let mut body = Vec::new();
            tx.encode_body(&mut body);
            assert_eq!(body.len(), tx.body_len());
            assert_eq!(SignedTx::decode_body(&mut body.as_slice()), Ok(tx.clone()));
        }
        let create = SignedTx::sign_legacy(&key, TxLegacy::default());
        assert_eq!(SignedTx::decode(&create.encode()).map(|tx| tx.to()), Ok(None), "a creation has no recipient");
    }

    #[test]
    fn blob_and_set_code_transactions_are_refused_with_the_reason() {
        let blob = TxEnvelope::Eip4844(Signed::new_unhashed(
            alloy_consensus::TxEip4844Variant::TxEip4844(Default::default()),
            Signature::test_signature(),
        ));
        let err = SignedTx::decode(&blob.encoded_2718()).expect_err("blobs");
        assert!(err.to_string().contains("blob sidecars"), "{err}");
        let set_code = TxEnvelope::Eip7702(Signed::new_unhashed(Default::default(), Signature::test_signature()));
        let err = SignedTx::decode(&set_code.encoded_2718()).expect_err("7702");
        assert!(err.to_string().contains("Prague"), "{err}");
    }

    #[test]
    fn bad_v_is_a_malformed_transaction() {
        let tx = transfer(2, None);
        let mut bytes = tx.encode();
        // v sits right before the two 33-byte r and s strings; 27 → 29 is no valid v.
        let v_at = bytes.len() - 67;
        assert_eq!(bytes[v_at], 27 + u8::from(tx.signature().v()));
        bytes[v_at] = 29;
        let err = SignedTx::decode(&bytes).expect_err("bad v");
        assert!(err.to_string().contains("invalid parity value"), "{err}");
    }
}
