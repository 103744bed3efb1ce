use super::*;

const A1: &str = "0x00000000000000000000000000000000000000a1";

fn addr(s: &str) -> Address {
    s.parse().expect("test address")
}

fn word(n: u64) -> B256 {
    B256::from(U256::from(n))
}

/// Parses a document holding one account `A1` with the given JSON body.
fn account(body: &str) -> Result<GenesisAccount, GenesisError> {
    let g = Genesis::from_json_str(&format!(r#"{{"alloc": {{"{A1}": {body}}}}}"#))?;
    Ok(g.alloc[&addr(A1)].clone())
}

/// The message of the error from parsing `text`.
fn error(text: &str) -> String {
    match Genesis::from_json_str(text) {
        Ok(g) => panic!("expected an error, parsed {g:?}"),
        Err(e) => e.to_string(),
    }
}

fn account_error(body: &str) -> String {
    error(&format!(r#"{{"alloc": {{"{A1}": {body}}}}}"#))
}

#[test]
fn balances_decimal_hex_and_json_numbers_agree() {
    for body in [
        r#"{"balance": "1000"}"#,
        r#"{"balance": "0x3e8"}"#,
        r#"{"balance": "0X3E8"}"#,
        r#"{"balance": "0x00003e8"}"#,
        r#"{"balance": "0001000"}"#,
        r#"{"balance": 1000}"#,
    ] {
        assert_eq!(account(body).unwrap().balance, U256::from(1000), "{body}");
    }
    assert_eq!(account(r#"{"balance": ""}"#).unwrap().balance, U256::ZERO);
}

#[test]
fn large_balances_are_exact() {
    let e24 = U256::from(10u64).pow(U256::from(24));
    assert_eq!(account(r#"{"balance": "1000000000000000000000000"}"#).unwrap().balance, e24);
    assert_eq!(account(r#"{"balance": "0xD3C21BCECCEDA1000000"}"#).unwrap().balance, e24);
    let max_dec = U256::MAX.to_string();
    assert_eq!(account(&format!(r#"{{"balance": "{max_dec}"}}"#)).unwrap().balance, U256::MAX);
    let max_hex = format!("0x{}", "f".repeat(64));
    assert_eq!(account(&format!(r#"{{"balance": "{max_hex}"}}"#)).unwrap().balance, U256::MAX);
    // Leading zeros do not count against the 256 bits.
    let padded = format!("0x{}1", "0".repeat(100));
    assert_eq!(account(&format!(r#"{{"balance": "{padded}"}}"#)).unwrap().balance, U256::from(1));
    // A JSON number past 64 bits would reach the parser as a float: refused, never rounded.
    let msg = account_error(r#"{"balance": 1000000000000000000000000}"#);
    assert!(msg.starts_with(&format!("account {A1}: invalid type: floating point")), "{msg}");
}

#[test]
fn nonces() {
    assert_eq!(account(r#"{"balance": "0", "nonce": "0x10"}"#).unwrap().nonce, Some(16));
    assert_eq!(account(r#"{"balance": "0", "nonce": "16"}"#).unwrap().nonce, Some(16));
    assert_eq!(account(r#"{"balance": "0", "nonce": 16}"#).unwrap().nonce, Some(16));
    assert_eq!(account(r#"{"balance": "0", "nonce": "18446744073709551615"}"#).unwrap().nonce, Some(u64::MAX));
    assert_eq!(account(r#"{"balance": "0", "nonce": "0xffffffffffffffff"}"#).unwrap().nonce, Some(u64::MAX));
    assert_eq!(account(r#"{"balance": "0"}"#).unwrap().nonce, None);
}

#[test]
fn addresses_with_and_without_prefix() {
    let text = r#"{"alloc": {
        "00000000000000000000000000000000000000b1": {"balance": "1"},
        "0x00000000000000000000000000000000000000B2": {"balance": "2"},
        "0xa94f5374Fce5edBC8E2a8697C15331677e6EbF0B": {"balance": "4"}
    }}"#;
    let g = Genesis::from_json_str(text).unwrap();
    assert_eq!(g.alloc.len(), 3);
    assert_eq!(g.alloc[&addr("0x00000000000000000000000000000000000000b1")].balance, U256::from(1));
    assert_eq!(g.alloc[&addr("0x00000000000000000000000000000000000000b2")].balance, U256::from(2));
    assert_eq!(g.alloc[&addr("0xa94f5374fce5edbc8e2a8697c15331677e6ebf0b")].balance, U256::from(4));
}

#[test]
fn later_duplicates_win() {
    let text = r#"{"alloc": {
        "0x00000000000000000000000000000000000000b1": {"balance": "1", "storage": {"0x01": "0x05"}},
        "00000000000000000000000000000000000000B1": {"balance": "2", "storage": {"0x0001": "0x07", "01": "0x08"}}
    }}"#;
    let g = Genesis::from_json_str(text).unwrap();
    let a = &g.alloc[&addr("0x00000000000000000000000000000000000000b1")];
    assert_eq!(a.balance, U256::from(2));
    let storage = a.storage.as_ref().unwrap();
    assert_eq!(storage.len(), 1);
    assert_eq!(storage[&word(1)], word(8));
    assert_eq!(account(r#"{"balance": "1", "balance": "2"}"#).unwrap().balance, U256::from(2));
}

#[test]
fn short_storage_keys_and_values_are_left_padded() {
    let a = account(
        r#"{"balance": "0", "storage": {
            "0x01": "0x01",
            "02": "0xff00",
            "0x": "0x02",
            "0x0000000000000000000000000000000000000000000000000000000000000003": "",
            "0x04": "0x000000000000000000000000000000000000000000000000000000000000000a",
            "0x1000000000000000000000000000000000000000000000000000000000000006": "0xabcdef"
        }}"#,
    )
    .unwrap();
    let storage = a.storage.unwrap();
    assert_eq!(storage.len(), 6);
    assert_eq!(storage[&word(1)], word(1));
    assert_eq!(storage[&word(2)], word(0xff00));
    assert_eq!(storage[&word(0)], word(2));
    assert_eq!(storage[&word(3)], B256::ZERO);
    assert_eq!(storage[&word(4)], word(10));
    let high: B256 = "0x1000000000000000000000000000000000000000000000000000000000000006".parse().unwrap();
    assert_eq!(storage[&high], word(0xabcdef));
}

#[test]
fn code() {
    let code = |body: &str| account(body).unwrap().code.unwrap_or_default().to_vec();
    assert_eq!(code(r#"{"balance": "0", "code": "0x6001600155"}"#), vec![0x60, 1, 0x60, 1, 0x55]);
    assert_eq!(code(r#"{"balance": "0", "code": "0XAbCd"}"#), vec![0xab, 0xcd]);
    assert!(code(r#"{"balance": "0", "code": "0x"}"#).is_empty());
    assert!(code(r#"{"balance": "0", "code": ""}"#).is_empty());
}

#[test]
fn optional_fields_default() {
    let nulls = r#"{"balance": "0", "nonce": null, "code": null, "storage": null, "secretKey": null}"#;
    assert_eq!(account(nulls).unwrap(), GenesisAccount::default());
    let g = Genesis::from_json_str(r#"{"alloc": {}}"#).unwrap();
    assert_eq!(g, Genesis::default());
    let g = Genesis::from_json_str(r#"{"alloc": {}, "config": null, "baseFeePerGas": null}"#).unwrap();
    assert_eq!(g, Genesis::default());
}

#[test]
fn header_fields() {
    let config = r#"{"chainId": 1, "terminalTotalDifficulty": 58750000000000000000000, "x": [1.5, -2e3, "a\"b"]}"#;
    let text = format!(
        r#"{{
        "config": {config},
        "nonce": "0x42", "timestamp": "1695902100", "extraData": "0x1234", "gasLimit": 5000,
        "difficulty": "0x400000000", "mixhash": "0x0000000000000000000000000000000000000000000000000000000000000001",
        "coinbase": "0x0000000000000000000000000000000000000002", "number": "0x0", "gasUsed": "0",
        "parentHash": "0x0000000000000000000000000000000000000000000000000000000000000003",
        "baseFeePerGas": "1000000000", "excessBlobGas": "0x0", "blobGasUsed": 0,
        "stateRoot": "ignored", "alloc": {{"0x00000000000000000000000000000000000000a1": {{"balance": 77}}}}
    }}"#
    );
    let g = Genesis::from_json_str(&text).unwrap();
    assert_eq!(g.config.as_deref(), Some(config), "config is kept as written, numbers digit for digit");
    assert_eq!(g.nonce, 0x42);
    assert_eq!(g.timestamp, 1695902100);
    assert_eq!(g.extra_data, vec![0x12, 0x34]);
    assert_eq!(g.gas_limit, 5000);
    assert_eq!(g.difficulty, U256::from(0x400000000u64));
    assert_eq!(g.mix_hash, word(1));
    assert_eq!(g.coinbase, addr("0x0000000000000000000000000000000000000002"));
    assert_eq!(g.parent_hash, word(3));
    assert_eq!(g.base_fee_per_gas, Some(U256::from(1_000_000_000u64)));
    assert_eq!(g.excess_blob_gas, Some(0));
    assert_eq!(g.blob_gas_used, Some(0));
    assert_eq!(g.alloc[&addr(A1)].balance, U256::from(77));
}

/// The Ethereum test suite writes zero header fields as empty hex; the state root does not
/// read them, so they must not stop it, while a malformed `alloc` still does.
#[test]
fn alloc_alone_ignores_the_header() {
    let text = r#"{"timestamp": "0x", "gasLimit": "lots", "coinbase": 7, "config": [],
        "alloc": {"0x00000000000000000000000000000000000000a1": {"balance": "0x0a"}}}"#;
    let alloc = Genesis::alloc_from_json_str(text).unwrap();
    assert_eq!(alloc[&addr(A1)].balance, U256::from(10));
    let msg = error(text);
    assert!(msg.starts_with("genesis header: "), "{msg}");
    let broken = text.replace(r#""0x0a""#, r#""0x0g""#);
    let msg = Genesis::alloc_from_json_str(&broken).unwrap_err().to_string();
    assert_eq!(msg, format!(r#"account {A1}: balance "0x0g" is not a decimal or 0x-hex number"#));
}

#[test]
fn malformed_numbers() {
    let a = format!("account {A1}");
    let cases = [
        (r#"{"balance": "12x"}"#, format!(r#"{a}: balance "12x" is not a decimal or 0x-hex number"#)),
        (r#"{"balance": "0x"}"#, format!(r#"{a}: balance "0x" is not a decimal or 0x-hex number"#)),
        (r#"{"balance": "0xfg"}"#, format!(r#"{a}: balance "0xfg" is not a decimal or 0x-hex number"#)),
        (r#"{"balance": " 1"}"#, format!(r#"{a}: balance " 1" is not a decimal or 0x-hex number"#)),
        (r#"{"balance": "1_000"}"#, format!(r#"{a}: balance "1_000" is not a decimal or 0x-hex number"#)),
        (r#"{"balance": "0b101"}"#, format!(r#"{a}: balance "0b101" is not a decimal or 0x-hex number"#)),
        (r#"{"balance": "+1000"}"#, format!(r#"{a}: balance "+1000" is not a decimal or 0x-hex number"#)),
        (r#"{"balance": "-0x5"}"#, format!(r#"{a}: balance "-0x5" is not a decimal or 0x-hex number"#)),
        (r#"{"balance": "0", "nonce": "0x1_0"}"#, format!(r#"{a}: nonce "0x1_0" is not a decimal or 0x-hex number"#)),
    ];
    for (body, want) in cases {
        assert_eq!(account_error(body), want, "{body}");
    }
    // Refused by alloy itself; the message names the account and the offending value.
    for (body, shown) in [
        (r#"{"balance": 1.5}"#, "1.5"),
        (r#"{"balance": 1e18}"#, "floating point"),
        (r#"{"balance": -5}"#, "-5"),
        (r#"{"balance": true}"#, "true"),
        (r#"{"balance": ["1"]}"#, "sequence"),
        (r#"{"balance": null}"#, "null"),
        (r#"{}"#, "missing field `balance`"),
        (r#"{"balance": "0", "nonce": "18446744073709551616"}"#, "18446744073709551616"),
        (r#"{"balance": "0", "nonce": "0x10000000000000000"}"#, "0x10000000000000000"),
    ] {
        let msg = account_error(body);
        assert!(msg.starts_with(&format!("{a}: ")) && msg.contains(shown), "{body}: {msg}");
    }
    let too_big = format!("0x1{}", "0".repeat(64));
    let msg = account_error(&format!(r#"{{"balance": "{too_big}"}}"#));
    assert!(msg.starts_with(&format!("{a}: ")) && msg.contains(&too_big), "{msg}");
}

#[test]
fn malformed_accounts_code_and_storage() {
    let a = format!("account {A1}");
    assert_eq!(
        account_error(r#"{"balance": "0", "code": "6001"}"#),
        format!(r#"{a}: code "6001" is missing the 0x prefix"#)
    );
    let long_key = format!("0x{}", "1".repeat(66));
    for (body, shown) in [
        (r#"{"balance": "0", "code": "0x600"}"#.to_owned(), "0x600"),
        (r#"{"balance": "0", "code": "0x60zz"}"#.to_owned(), "0x60zz"),
        (r#"{"balance": "0", "code": 96}"#.to_owned(), "96"),
        (r#"{"balance": "0", "storage": []}"#.to_owned(), "sequence"),
        (r#"{"balance": "0", "storage": {"0x1": "0x01"}}"#.to_owned(), "0x1"),
        (format!(r#"{{"balance": "0", "storage": {{"{long_key}": "0x01"}}}}"#), "too long"),
        (r#"{"balance": "0", "storage": {"0x01": "0xzz"}}"#.to_owned(), "0xzz"),
        (r#"{"balance": "0", "storage": {"0x01": "0x123"}}"#.to_owned(), "0x123"),
        (r#"{"balance": "0", "storage": {"0x01": 1}}"#.to_owned(), "integer"),
        (r#"{"balance": "0", "Balance": "1"}"#.to_owned(), "unknown field `Balance`"),
        (r#"{"balance": "0", "storag": {}}"#.to_owned(), "unknown field `storag`"),
    ] {
        let msg = account_error(&body);
        assert!(msg.starts_with(&format!("{a}: ")) && msg.contains(shown), "{body}: {msg}");
    }
}

#[test]
fn malformed_documents() {
    let no_alloc = r#"no "alloc" object at the top level: not a geth-style genesis file"#;
    assert_eq!(error("{}"), no_alloc);
    assert_eq!(error(r#"{"alloc": null}"#), no_alloc);
    assert_eq!(error("[]"), no_alloc);
    for (text, shown) in [
        ("3", "invalid JSON: invalid type: integer `3`"),
        (r#"{"alloc": []}"#, "invalid JSON: invalid type: sequence"),
        (r#"{"alloc": {"0x1234": {}}}"#, "invalid JSON: invalid string length"),
        (r#"{"alloc": {"": {}}}"#, "invalid JSON: "),
        (r#"{"alloc": {"0x00000000000000000000000000000000000000g1": {}}}"#, "invalid JSON: invalid character 'g'"),
        (
            r#"{"alloc": {"0x00000000000000000000000000000000000000a1": "1000"}}"#,
            "account 0x00000000000000000000000000000000000000a1: invalid type: string",
        ),
        (
            r#"{"alloc": {"0x00000000000000000000000000000000000000a1": null}}"#,
            "account 0x00000000000000000000000000000000000000a1: invalid type: null",
        ),
        (r#"{"alloc": {}, "gasLimit": "lots"}"#, "genesis header: invalid value: string \"lots\""),
        (r#"{"alloc": {}, "difficulty": -1}"#, "genesis header: invalid type: integer `-1`"),
        (r#"{"alloc": {}, "extraData": "hello"}"#, "genesis header: invalid value: string \"hello\""),
        (r#"{"alloc": {}, "mixHash": "0x01"}"#, "genesis header: "),
        (r#"{"alloc": {}, "coinbase": 0}"#, "genesis header: invalid type: integer `0`"),
        (r#"{"alloc": {}, "config": []}"#, "genesis header: config must be a JSON object, found \"[]\""),
    ] {
        let msg = error(text);
        assert!(msg.starts_with(shown), "{text}: {msg}");
    }
}

#[test]
fn invalid_json_says_where() {
    let msg = error("{\"alloc\": {\n  \"0x00000000000000000000000000000000000000a1\": {\"balance\": \"1\",}\n}}");
    assert!(msg.starts_with("invalid JSON: ") && msg.contains("line 2 column"), "{msg}");
    for text in ["", "{", r#"{"alloc": {}} x"#, r#"{"alloc": {}, "nonce": 01}"#, r#"{"alloc": NaN}"#] {
        assert!(error(text).starts_with("invalid JSON: "), "{text}");
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let msg = account_error(&format!(r#"{{"balance": "1", "x": {nested}}}"#));
    assert!(msg.starts_with("invalid JSON: recursion limit exceeded"), "{msg}");
    // `config` is kept as written, unread: whoever reads it meets serde_json's limit there.
    let g = Genesis::from_json_str(&format!(r#"{{"alloc": {{}}, "config": {{"x": {nested}}}}}"#)).unwrap();
    let config = g.config.unwrap();
    assert!(serde_json::from_str::<serde_json::Value>(&config).is_err());
}

#[test]
fn long_values_are_cut_short_in_messages() {
    let long = format!("0x{}", "z".repeat(5000));
    let msg = account_error(&format!(r#"{{"balance": "{long}"}}"#));
    assert!(msg.len() < 300 && msg.contains("(5002 bytes)"), "{msg}");
    let msg = account_error(&format!(r#"{{"balance": "0", "code": "{long}"}}"#));
    assert!(msg.len() < 400 && msg.contains("bytes)"), "{msg}");
}

/// Every file listed in testdata/genesis/roots.json parses, with the expected shape.
#[test]
fn vector_files_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/genesis");
    let roots = std::fs::read_to_string(dir.join("roots.json")).unwrap();
    let roots: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&roots).unwrap();
    // file: (accounts, accounts with code, storage slots)
    let shapes: [(&str, usize, usize, usize); 10] = [
        ("mainnet.json", 8893, 0, 0),
        ("sepolia.json", 15, 0, 0),
        ("goerli.json", 260, 0, 0),
        ("holesky.json", 317, 1, 31),
        ("hoodi.json", 335, 5, 33),
        ("devnet4.json", 263, 1, 31),
        ("bc_initcollision_pre.json", 4, 1, 2),
        ("bc_initcollision_post.json", 5, 1, 2),
        ("single_max_balance_9fe4.json", 1, 0, 0),
        ("single_max_balance_c2ba.json", 1, 0, 0),
    ];
    let mut listed: Vec<&str> = roots.keys().map(String::as_str).collect();
    listed.sort_unstable();
    let mut known: Vec<&str> = shapes.iter().map(|s| s.0).collect();
    known.sort_unstable();
    assert_eq!(listed, known, "roots.json and this test list different files");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".json") && n != "roots.json")
        .collect();
    on_disk.sort_unstable();
    assert_eq!(on_disk, known, "every vector file must be listed in roots.json");

    for (name, accounts, with_code, slots) in shapes {
        let root = roots[name].as_str().unwrap();
        assert!(
            root.len() == 66 && root.starts_with("0x") && root[2..].bytes().all(|b| b.is_ascii_hexdigit()),
            "{name}: {root}"
        );
        let alloc = Genesis::alloc_from_file(&dir.join(name)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(alloc.len(), accounts, "{name}: accounts");
        let has_code = |a: &&GenesisAccount| a.code.as_ref().is_some_and(|c| !c.is_empty());
        assert_eq!(alloc.values().filter(has_code).count(), with_code, "{name}: accounts with code");
        let slot_count: usize = alloc.values().map(|a| a.storage.as_ref().map_or(0, BTreeMap::len)).sum();
        assert_eq!(slot_count, slots, "{name}: storage slots");
    }

    // Spot checks of values written in different forms.
    let g = Genesis::from_file(&dir.join("devnet4.json")).unwrap();
    let e25 = U256::from(10u64).pow(U256::from(25));
    assert_eq!(g.alloc[&addr("0xf97e180c050e5ab072211ad2c213eb5aee4df134")].balance, e25);
    assert_eq!(g.alloc[&addr("0x00000000000000000000000000000000000000ff")].balance, U256::from(1));
    assert_eq!(g.gas_limit, 0x400000);
    let g = Genesis::from_file(&dir.join("bc_initcollision_post.json")).unwrap();
    let a = &g.alloc[&addr("0x6295ee1b4f6dd65047762f924ecd367c17eabf8f")];
    assert_eq!((a.nonce, a.storage.as_ref().unwrap()[&word(1)]), (Some(1), word(1)));
    let g = Genesis::from_file(&dir.join("hoodi.json")).unwrap();
    assert_eq!(g.alloc[&addr("0x000f3df6d732807ef1319fb7b8bb8522d0beac02")].nonce, Some(1));
    for name in ["single_max_balance_9fe4.json", "single_max_balance_c2ba.json"] {
        let g = Genesis::from_file(&dir.join(name)).unwrap();
        assert_eq!(g.alloc.values().next().unwrap().balance, U256::MAX, "{name}");
    }
    let g = Genesis::from_file(&dir.join("mainnet.json")).unwrap();
    assert_eq!((g.nonce, g.gas_limit, g.base_fee_per_gas), (0x42, 5000, None));
    assert!(g.config.as_deref().unwrap().contains(r#""chainId": 1,"#));
}

#[test]
fn from_file_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("genesis.json");
    std::fs::write(&path, r#"{"alloc": {"0x00000000000000000000000000000000000000a1": {"balance": "12x"}}}"#).unwrap();
    let msg = Genesis::from_file(&path).unwrap_err().to_string();
    assert_eq!(
        msg,
        format!(
            r#"genesis file {}: account 0x00000000000000000000000000000000000000a1: balance "12x" is not a decimal or 0x-hex number"#,
            path.display()
        )
    );

    std::fs::write(&path, b"{\"alloc\": {\xff}}").unwrap();
    let msg = Genesis::alloc_from_file(&path).unwrap_err().to_string();
    assert_eq!(msg, format!("genesis file {}: not UTF-8 text (bad byte at offset 11)", path.display()));

    let missing = dir.path().join("missing.json");
    let msg = Genesis::from_file(&missing).unwrap_err().to_string();
    assert!(msg.starts_with(&format!("cannot read genesis file {}: ", missing.display())), "{msg}");

    std::fs::write(
        &path,
        r#"{"alloc": {"a1000000000000000000000000000000000000a1": {"balance": "0", "nonce": "0x1"}}}"#,
    )
    .unwrap();
    let g = Genesis::from_file(&path).unwrap();
    assert_eq!(g.alloc[&addr("0xa1000000000000000000000000000000000000a1")].nonce, Some(1));
}
