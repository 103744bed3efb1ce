//! Transactions and keys against Ethereum's own vectors (`tests/data`, from ethereum/tests
//! BasicTests) and the worked example of EIP-155.

use alloy_consensus::{crypto::secp256k1::recover_signer_unchecked, SignableTransaction, Signed, TxLegacy};
use alloy_primitives::{b256, hex, keccak256, Address, Bytes, Signature, TxKind, B256, U256};
use alloy_rlp::{Encodable, Header as RlpHeader};
use serde_json::Value;
use virga_ledger::tx::{SignedTx, SigningKey};

/// secp256k1's group order n.
const CURVE_ORDER: U256 = U256::from_be_bytes(hex!("fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141"));

fn load(name: &str) -> Vec<Value> {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{path}: {err}"));
    match serde_json::from_str(&text) {
        Ok(Value::Array(cases)) => cases,
        other => panic!("{path}: expected a JSON array, got {other:?}"),
    }
}

fn bytes(value: &Value) -> Vec<u8> {
    hex::decode(value.as_str().expect("a hex string")).expect("valid hex")
}

fn number(value: &Value) -> u64 {
    value.as_u64().expect("an integer")
}

fn decimal(value: &Value) -> U256 {
    U256::from_str_radix(value.as_str().expect("a decimal string"), 10).expect("a decimal")
}

/// Signatures made before EIP-2 may have a high `s`; libsecp256k1 returns the low twin
/// `(r, n - s)` with the other parity, which proves the same key signed the same digest.
fn assert_same_or_low_twin(ours: &Signature, theirs: &Signature, case: &str) {
    assert_eq!(ours.r(), theirs.r(), "{case}: r");
    if theirs.s() <= alloy_consensus::crypto::SECP256K1N_HALF {
        assert_eq!(ours.s(), theirs.s(), "{case}: s");
        assert_eq!(ours.v(), theirs.v(), "{case}: parity");
    } else {
        assert_eq!(ours.s(), CURVE_ORDER - theirs.s(), "{case}: s is not the low twin");
        assert_eq!(ours.v(), !theirs.v(), "{case}: parity of the low twin");
    }
}

#[test]
fn txtest_signing_encoding_and_recovery() {
    let cases = load("txtest.json");
    assert_eq!(cases.len(), 2);
    let mut transfers = 0;
    for (index, case) in cases.iter().enumerate() {
        let name = format!("txtest[{index}]");
        let key = SigningKey::from_bytes(&bytes(&case["key"])).expect("valid key");
        let to = bytes(&case["to"]);
        let tx = TxLegacy {
            chain_id: None,
            nonce: number(&case["nonce"]),
            gas_price: u128::from(number(&case["gasprice"])),
            gas_limit: number(&case["startgas"]),
            to: if to.is_empty() { TxKind::Create } else { TxKind::Call(Address::from_slice(&to)) },
            value: U256::from(number(&case["value"])),
            input: Bytes::from(bytes(&case["data"])),
        };

        // `unsigned` is the signing payload's six fields followed by empty v, r and s.
        let mut signing_payload = Vec::new();
        tx.encode_for_signing(&mut signing_payload);
        let mut fields = &signing_payload[..];
        let six = RlpHeader::decode(&mut fields).expect("a list");
        let mut expected_unsigned = Vec::new();
        RlpHeader { list: true, payload_length: six.payload_length + 3 }.encode(&mut expected_unsigned);
        expected_unsigned.extend_from_slice(fields);
        expected_unsigned.extend_from_slice(&[0x80, 0x80, 0x80]);
        assert_eq!(hex::encode(&expected_unsigned), hex::encode(bytes(&case["unsigned"])), "{name}");

        let signed = bytes(&case["signed"]);
        let theirs = Signed::<TxLegacy>::rlp_decode(&mut &signed[..]).expect("vector decodes");
        assert_eq!(theirs.tx(), &tx, "{name}: decoded fields");
        // The vector's own signature is over the pre-EIP-155 signing hash by this key.
        let signing_hash = tx.signature_hash();
        assert_eq!(signing_hash, keccak256(&signing_payload));
        assert_eq!(
            recover_signer_unchecked(theirs.signature(), signing_hash).ok(),
            Some(key.address()),
            "{name}: the vector's signature"
        );

        let ours = key.sign_hash(signing_hash);
        assert_same_or_low_twin(&ours, theirs.signature(), &name);
        if ours == *theirs.signature() {
            let mut encoded = Vec::new();
            Signed::new_unhashed(tx.clone(), ours).rlp_encode(&mut encoded);
            assert_eq!(hex::encode(&encoded), hex::encode(&signed), "{name}: signed bytes");
        }

        match tx.to {
            TxKind::Call(to) if tx.input.is_empty() => {
                transfers += 1;
                let transfer = SignedTx::sign(&key, tx.nonce, to, tx.value, tx.gas_price, tx.gas_limit, None);
                assert_eq!(hex::encode(transfer.encode()), hex::encode(&signed), "{name}: signed");
                assert_eq!(transfer.hash(), keccak256(&signed));
                let decoded = SignedTx::decode(&signed).expect("a transfer");
                assert_eq!(decoded.legacy(), Some(&tx), "{name}: decoded fields");
                assert_eq!(decoded.chain_id(), None);
                assert_eq!(decoded.recover_sender(), Ok(key.address()), "{name}: sender");
            }
            _ => {
                // A contract creation (or call with data) decodes like any transaction.
                // (The vector's own signature may be a high-s twin; ours is checked.)
                let decoded = SignedTx::decode(&signed).expect("a creation");
                assert_eq!(decoded.legacy(), Some(&tx), "{name}: decoded fields");
                assert_eq!(decoded.to(), tx.to.to().copied(), "{name}");
                let ours = SignedTx::decode(&SignedTx::sign_legacy(&key, tx.clone()).encode()).expect("decodes");
                assert_eq!(ours.recover_sender(), Ok(key.address()), "{name}: sender");
            }
        }
    }
    assert_eq!(transfers, 1, "txtest holds one plain transfer");
}

#[test]
fn keyaddrtest_addresses_and_signatures_of_the_empty_string() {
    let cases = load("keyaddrtest.json");
    assert_eq!(cases.len(), 2);
    let digest = keccak256(b"");
    for case in &cases {
        let name = case["seed"].as_str().expect("a seed").to_string();
        // The key is the "brain wallet" keccak-256 of the seed.
        assert_eq!(B256::from_slice(&bytes(&case["key"])), keccak256(name.as_bytes()), "{name}: key");
        let key = SigningKey::from_bytes(&bytes(&case["key"])).expect("valid key");
        assert_eq!(key.address(), Address::from_slice(&bytes(&case["addr"])), "{name}: address");

        let ours = key.sign_hash(digest);
        assert_eq!(recover_signer_unchecked(&ours, digest).ok(), Some(key.address()), "{name}");

        // The recorded signature is a well-formed curve point with v 27/28, but it does not
        // verify against this key for keccak-256("") (nor for the zero digest, SHA-256(""),
        // or the seed's hash): its digest is undocumented, and other clients skip it too.
        // Pinned here so that a corrected vector is noticed and compared exactly instead.
        let sig = &case["sig_of_emptystring"];
        let v = decimal(&sig["v"]);
        assert!(v == U256::from(27) || v == U256::from(28), "{name}: v");
        let theirs = Signature::new(decimal(&sig["r"]), decimal(&sig["s"]), v == U256::from(28));
        let recovered = recover_signer_unchecked(&theirs, digest);
        assert!(recovered.is_ok(), "{name}: the recorded signature recovers some key");
        assert_ne!(recovered.ok(), Some(key.address()), "{name}: the vector now verifies");
    }
}

#[test]
fn eip155_round_trips() {
    let key = SigningKey::from_seed(1337);
    let to = SigningKey::from_seed(1338).address();
    let tx = SignedTx::sign(&key, 3, to, U256::from(10u64).pow(U256::from(18)), 7, 21_000, Some(1337));
    assert_eq!(tx.chain_id(), Some(1337));
    let bytes = tx.encode();
    let decoded = SignedTx::decode(&bytes).expect("decodes");
    assert_eq!(decoded, tx);
    assert_eq!(decoded.recover_sender(), Ok(key.address()));
    assert_eq!(decoded.to(), Some(to));

    // v = 35 + 2·chain_id + parity, encoded as the two bytes 0x0a95 or 0x0a96.
    let v = 35 + 2 * 1337 + u64::from(tx.signature().v());
    let mut v_rlp = Vec::new();
    v.encode(&mut v_rlp);
    let mut rs = Vec::new();
    tx.signature().r().encode(&mut rs);
    tx.signature().s().encode(&mut rs);
    assert!(bytes.ends_with(&[v_rlp.as_slice(), rs.as_slice()].concat()));

    // The chain id is signed: the same signature under another chain id, or without one,
    // recovers someone else.
    for other in [Some(1338), Some(1), None] {
        let mut moved = tx.legacy().expect("legacy").clone();
        moved.chain_id = other;
        assert_ne!(moved.signature_hash(), tx.signing_hash());
        let replayed =
            SignedTx::from_envelope(alloy_consensus::TxEnvelope::Legacy(Signed::new_unhashed(moved, *tx.signature())))
                .expect("a legacy transaction");
        let reencoded = SignedTx::decode(&replayed.encode()).expect("decodes");
        assert_eq!(reencoded.chain_id(), other);
        assert_ne!(reencoded.recover_sender().ok(), Some(key.address()), "{other:?}");
    }
}

#[test]
fn eip155_worked_example() {
    let key = SigningKey::from_bytes(&[0x46; 32]).expect("valid key");
    let tx = SignedTx::sign(
        &key,
        9,
        Address::repeat_byte(0x35),
        U256::from(1_000_000_000_000_000_000u64),
        20_000_000_000,
        21_000,
        Some(1),
    );
    let mut payload = Vec::new();
    tx.legacy().expect("legacy").encode_for_signing(&mut payload);
    assert_eq!(
        hex::encode(&payload),
        "ec098504a817c800825208943535353535353535353535353535353535353535880de0b6b3a764000080018080"
    );
    assert_eq!(tx.signing_hash(), b256!("daf5a779ae972f972197303d7b574746c7ef83eadac0f2791ad23db92e4c8e53"));
    let signed = hex!(
        "f86c098504a817c800825208943535353535353535353535353535353535353535880de0b6b3a7640000"
        "8025a028ef61340bd939bc2195fe537567866003e1a15d3c71ff63e1590620aa636276a067cbe9d8997f"
        "761aecb703304b3800ccf555c9f3dc64214b297fb1966a3b6d83"
    );
    assert_eq!(hex::encode(tx.encode()), hex::encode(signed));
    assert_eq!(tx.hash(), keccak256(signed));
    let decoded = SignedTx::decode(&signed).expect("decodes");
    assert_eq!(decoded, tx);
    assert_eq!(decoded.chain_id(), Some(1));
    assert_eq!(decoded.recover_sender(), Ok(key.address()));
    assert_eq!(key.address(), Address::from(hex!("9d8a62f656a8d1615c1294fd71e9cfb3e4855a4f")));
    assert_eq!(
        tx.signature().r(),
        U256::from_str_radix("18515461264373351373200002665853028612451056578545711640558177340181847433846", 10)
            .expect("decimal")
    );
}
