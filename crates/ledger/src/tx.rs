//! Signed value transfers: Ethereum legacy transactions, with or without EIP-155 replay
//! protection, that move ether from the signer to one recipient and carry no data.
//!
//! The wire format is exactly Ethereum's legacy RLP
//! `[nonce, gas_price, gas_limit, to, value, data, v, r, s]`, so any Ethereum tool can
//! produce or read Virga's transactions. Signing and sender recovery use libsecp256k1
//! through the `secp256k1` crate and its global (precomputed, shared) context.
//!
//! What is checked here is the format and the signature. Whether the chain id, nonce,
//! balance or gas are acceptable is decided by execution.

use std::fmt;

use alloy_consensus::{crypto::SECP256K1N_HALF, SignableTransaction, Signed, TxLegacy};
use alloy_primitives::{keccak256, Address, Bytes, Signature, TxKind, B256, U256};
use rayon::prelude::*;
use secp256k1::{
    ecdsa::{RecoverableSignature, RecoveryId},
    Message, PublicKey, SecretKey, SECP256K1,
};

/// Why a transaction could not be decoded or its sender recovered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TxError {
    /// The input held no bytes at all.
    #[error("empty input: expected an RLP-encoded legacy transaction")]
    Empty,
    /// The RLP was malformed; the text is alloy's.
    #[error("malformed transaction RLP: {0}")]
    Rlp(alloy_rlp::Error),
    /// A whole transaction was decoded but bytes were left over.
    #[error("{0} trailing byte(s) after the transaction")]
    TrailingBytes(usize),
    /// The input starts with an EIP-2718 type byte.
    #[error(
        "typed (EIP-2718) transaction of type 0x{0:02x} is not supported: only legacy value \
         transfers are"
    )]
    UnsupportedType(u8),
    /// The input is an RLP string where a legacy transaction (an RLP list) belongs.
    #[error("expected a legacy transaction (an RLP list), found an RLP string")]
    NotAList,
    /// The transaction has no recipient.
    #[error("contract creation (no recipient) is not supported: value transfers only")]
    ContractCreation,
    /// The transaction carries call data or init code.
    #[error("transaction carries {0} byte(s) of data: value transfers only")]
    NonEmptyData(usize),
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
    /// returns the low-`s` form, so the result passes [`SignedTransfer::recover_sender`].
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

/// A signed legacy (pre-EIP-155 or EIP-155) value transfer: a recipient is always present
/// and the data is always empty.
///
/// The transaction hash is computed once and cached (alloy's [`Signed`] keeps it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SignedTransfer {
    inner: Signed<TxLegacy>,
}

impl SignedTransfer {
    /// Builds and signs a transfer of `value` wei to `to`. With `chain_id` `Some(id)` the
    /// signature follows EIP-155 (`v = 35 + 2·id + parity`); with `None` it is a
    /// pre-EIP-155 signature (`v = 27 + parity`).
    pub fn sign(
        key: &SigningKey,
        nonce: u64,
        to: Address,
        value: U256,
        gas_price: u128,
        gas_limit: u64,
        chain_id: Option<u64>,
    ) -> SignedTransfer {
        let tx = TxLegacy { chain_id, nonce, gas_price, gas_limit, to: TxKind::Call(to), value, input: Bytes::new() };
        let signature = key.sign_hash(tx.signature_hash());
        SignedTransfer { inner: Signed::new_unhashed(tx, signature) }
    }

    /// Wraps an already signed legacy transaction, checking that it is a value transfer
    /// (has a recipient and no data). The signature is not checked here.
    pub fn from_signed(signed: Signed<TxLegacy>) -> Result<SignedTransfer, TxError> {
        let tx = signed.tx();
        if tx.to.is_create() {
            return Err(TxError::ContractCreation);
        }
        if !tx.input.is_empty() {
            return Err(TxError::NonEmptyData(tx.input.len()));
        }
        Ok(SignedTransfer { inner: signed })
    }

    /// The unsigned transaction fields (its `chain_id` is the one the signature commits to).
    pub fn tx(&self) -> &TxLegacy {
        self.inner.tx()
    }

    /// The alloy signed transaction inside.
    pub fn as_signed(&self) -> &Signed<TxLegacy> {
        &self.inner
    }

    /// The transaction hash: keccak-256 of the signed RLP encoding.
    pub fn hash(&self) -> B256 {
        *self.inner.hash()
    }

    /// The digest that was signed: keccak-256 of the RLP of the six fields, followed for
    /// EIP-155 by `chain_id, 0, 0`.
    pub fn signing_hash(&self) -> B256 {
        self.inner.signature_hash()
    }

    /// The signature (`v()` is the y-parity; the encoded `v` is derived from it and the
    /// chain id).
    pub fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    /// The EIP-155 chain id the signature commits to, or `None` for a pre-EIP-155
    /// transaction (`v` of 27 or 28).
    pub fn chain_id(&self) -> Option<u64> {
        self.tx().chain_id
    }

    /// The sender's nonce.
    pub fn nonce(&self) -> u64 {
        self.tx().nonce
    }

    /// The recipient.
    pub fn to(&self) -> Address {
        // Every constructor rejects contract creation, so the default is never taken.
        self.tx().to.to().copied().unwrap_or_default()
    }

    /// The amount transferred, in wei.
    pub fn value(&self) -> U256 {
        self.tx().value
    }

    /// The price per unit of gas, in wei.
    pub fn gas_price(&self) -> u128 {
        self.tx().gas_price
    }

    /// The most gas the transaction may use.
    pub fn gas_limit(&self) -> u64 {
        self.tx().gas_limit
    }

    /// Recovers the address that signed the transaction.
    ///
    /// Rejects `s` above secp256k1n/2 as Ethereum has since Homestead. The chain id is not
    /// compared with anything here; execution does that.
    pub fn recover_sender(&self) -> Result<Address, TxError> {
        recover_address(self.signing_hash(), self.signature())
    }

    /// The length of [`SignedTransfer::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        self.inner.rlp_encoded_length()
    }

    /// The signed RLP encoding `[nonce, gas_price, gas_limit, to, value, data, v, r, s]`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        out
    }

    /// Appends the signed RLP encoding to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        self.inner.rlp_encode(out);
    }

    /// Decodes a signed legacy value transfer that must span all of `bytes`.
    ///
    /// Typed (EIP-2718) transactions, contract creations and transactions with data are
    /// rejected. The signature is only parsed; [`SignedTransfer::recover_sender`] checks it.
    pub fn decode(bytes: &[u8]) -> Result<SignedTransfer, TxError> {
        let mut rest = bytes;
        let tx = SignedTransfer::decode_prefix(&mut rest)?;
        if !rest.is_empty() {
            return Err(TxError::TrailingBytes(rest.len()));
        }
        Ok(tx)
    }

    /// Decodes one transaction from the front of `buf` and advances `buf` past it; used
    /// where transactions sit inside a larger RLP structure such as a block body.
    pub fn decode_prefix(buf: &mut &[u8]) -> Result<SignedTransfer, TxError> {
        let start = *buf;
        match start.first() {
            None => return Err(TxError::Empty),
            // EIP-2718 puts a type byte in 0x00..=0x7f before the payload; a legacy
            // transaction is an RLP list, whose first byte is 0xc0 or above.
            Some(&first) if first < 0x80 => return Err(TxError::UnsupportedType(first)),
            Some(&first) if first < 0xc0 => return Err(TxError::NotAList),
            Some(_) => {}
        }
        let decoded = Signed::<TxLegacy>::rlp_decode(buf)?;
        let signature = *decoded.signature();
        let tx = decoded.strip_signature();
        let consumed = start.len() - buf.len();
        // Hashing the bytes as received saves re-encoding them; they are canonical
        // because alloy's RLP decoder rejects every non-canonical form.
        let hash = keccak256(&start[..consumed]);
        SignedTransfer::from_signed(Signed::new_unchecked(tx, signature, hash))
    }

    /// Unwraps the alloy signed transaction.
    pub fn into_inner(self) -> Signed<TxLegacy> {
        self.inner
    }
}

/// A transfer together with the sender recovered from its signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveredTransfer {
    /// The signed transfer.
    pub tx: SignedTransfer,
    /// The address that signed it.
    pub sender: Address,
}

impl RecoveredTransfer {
    /// Recovers the sender of `tx` (see [`SignedTransfer::recover_sender`]).
    pub fn recover(tx: SignedTransfer) -> Result<RecoveredTransfer, TxError> {
        let sender = tx.recover_sender()?;
        Ok(RecoveredTransfer { tx, sender })
    }
}

/// Recovers the sender of every transaction on rayon's thread pool, in input order.
///
/// Signature recovery dominates block verification, and each recovery is independent.
pub fn recover_all(txs: &[SignedTransfer]) -> Vec<Result<Address, TxError>> {
    // Pieces of at least 8 keep rayon's per-task overhead (about a microsecond) small next
    // to recovery (tens of microseconds each) while still splitting blocks of a few dozen.
    txs.par_iter().with_min_len(8).map(SignedTransfer::recover_sender).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer(seed: u64, chain_id: Option<u64>) -> SignedTransfer {
        let key = SigningKey::from_seed(seed);
        let to = SigningKey::from_seed(seed + 1).address();
        SignedTransfer::sign(&key, 7, to, U256::from(1_000u64), 1_000_000_000, 21_000, chain_id)
    }

    #[test]
    fn sign_decode_recover_round_trip() {
        for chain_id in [None, Some(1), Some(1337), Some(u64::MAX / 2 - 18)] {
            let tx = transfer(3, chain_id);
            let bytes = tx.encode();
            assert_eq!(bytes.len(), tx.encoded_len());
            let decoded = SignedTransfer::decode(&bytes).expect("decodes");
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
        let flipped =
            SignedTransfer::from_signed(Signed::new_unhashed(tx.tx().clone(), twin)).expect("still a transfer");
        let err = flipped.recover_sender().expect_err("high s");
        assert_eq!(err, TxError::HighS);
        assert!(err.to_string().contains("secp256k1n/2"));
        assert!(tx.recover_sender().is_ok());
    }

    #[test]
    fn zero_and_oversized_signature_parts_are_rejected() {
        let tx = transfer(6, None);
        let with = |r: U256, s: U256| {
            SignedTransfer::from_signed(Signed::new_unhashed(tx.tx().clone(), Signature::new(r, s, false)))
                .expect("still a transfer")
                .recover_sender()
        };
        assert_eq!(with(U256::ZERO, U256::from(1)), Err(TxError::InvalidSignature("r is zero")));
        assert_eq!(with(U256::from(1), U256::ZERO), Err(TxError::InvalidSignature("s is zero")));
        assert!(matches!(with(U256::MAX, U256::from(1)), Err(TxError::InvalidSignature(_))));
    }

    #[test]
    fn a_changed_field_recovers_another_sender() {
        let tx = transfer(8, Some(1337));
        let mut changed = tx.tx().clone();
        changed.value += U256::from(1);
        let forged =
            SignedTransfer::from_signed(Signed::new_unhashed(changed, *tx.signature())).expect("still a transfer");
        assert_ne!(forged.recover_sender().ok(), Some(SigningKey::from_seed(8).address()));
    }

    #[test]
    fn recover_all_keeps_order() {
        let mut txs: Vec<_> = (0..200u64).map(|i| transfer(100 + i, Some(1))).collect();
        let bad = txs[150].tx().clone();
        txs[150] =
            SignedTransfer::from_signed(Signed::new_unhashed(bad, Signature::new(U256::ZERO, U256::from(1), false)))
                .expect("still a transfer");
        let senders = recover_all(&txs);
        assert_eq!(senders.len(), 200);
        for (i, sender) in senders.iter().enumerate() {
            if i == 150 {
                assert!(sender.is_err());
            } else {
                assert_eq!(sender, &Ok(SigningKey::from_seed(100 + i as u64).address()));
            }
        }
        let recovered = RecoveredTransfer::recover(txs[0].clone()).expect("valid");
        assert_eq!(recovered.sender, SigningKey::from_seed(100).address());
    }

    #[test]
    fn malformed_inputs_say_what_is_wrong() {
        let good = transfer(4, Some(1)).encode();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "empty input"),
            (good[..good.len() - 1].to_vec(), "input too short"),
            ([good.as_slice(), &[0x80]].concat(), "1 trailing byte"),
            ([&[0x02], &good[..]].concat(), "typed (EIP-2718) transaction of type 0x02"),
            (vec![0x01, 0xc0], "type 0x01"),
            (vec![0x83, 1, 2, 3], "found an RLP string"),
            (vec![0xc0], "malformed transaction RLP"),
            (vec![0xc3, 0x01, 0x02, 0x03], "malformed transaction RLP"),
            // A list claiming 2^64-1 bytes of payload.
            (vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], "malformed transaction RLP"),
        ];
        for (input, expected) in cases {
            let err = SignedTransfer::decode(&input).expect_err("malformed");
            assert!(err.to_string().contains(expected), "{input:02x?}: {err} lacks {expected:?}");
        }
    }

    #[test]
    fn creation_and_data_are_rejected_as_not_transfers() {
        let key = SigningKey::from_seed(1);
        let mut tx = transfer(1, None).tx().clone();
        tx.to = TxKind::Create;
        let signature = key.sign_hash(tx.signature_hash());
        let mut signed = Vec::new();
        Signed::new_unhashed(tx, signature).rlp_encode(&mut signed);
        let err = SignedTransfer::decode(&signed).expect_err("creation");
        assert_eq!(err, TxError::ContractCreation);
        assert!(err.to_string().contains("value transfers only"));

        let mut tx = transfer(1, None).tx().clone();
        tx.input = Bytes::from_static(&[1, 2, 3]);
        let mut signed = Vec::new();
        Signed::new_unhashed(tx.clone(), key.sign_hash(tx.signature_hash())).rlp_encode(&mut signed);
        let err = SignedTransfer::decode(&signed).expect_err("data");
        assert_eq!(err, TxError::NonEmptyData(3));
        assert!(err.to_string().contains("value transfers only"));
    }

    #[test]
    fn bad_v_is_a_malformed_transaction() {
        let tx = transfer(2, None);
        let mut bytes = tx.encode();
        // v sits right before the two 33-byte r and s strings; 27 → 29 is no valid v.
        let v_at = bytes.len() - 67;
        assert_eq!(bytes[v_at], 27 + u8::from(tx.signature().v()));
        bytes[v_at] = 29;
        let err = SignedTransfer::decode(&bytes).expect_err("bad v");
        assert!(err.to_string().contains("invalid parity value"), "{err}");
    }
}
