//! Bodies of the fuzz targets (`fuzz/fuzz_targets/eth_transaction.rs`, `state_test.rs`), kept
//! here so that they build and run with the crate's own tests.

use crate::statetest::run_json;
use crate::transaction::EthTransaction;

/// Any bytes: decoding either fails with a named error or yields a transaction whose
/// encoding decodes back to the same transaction and sender.
pub fn eth_transaction(data: &[u8]) {
    let Ok(tx) = EthTransaction::decode(data) else { return };
    let again = EthTransaction::decode(&tx.encoded());
    assert_eq!(again.as_ref(), Ok(&tx), "a decoded transaction re-encodes to bytes that decode differently");
    let _ = tx.tx_env();
}

/// Any text as a GeneralStateTests file: refused as malformed, or every case run to a
/// verdict (accounts, code and transactions from the input executed over the DSM-Tree).
pub fn state_test(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = run_json(text, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bodies_accept_inputs_of_every_shape() {
        for input in [&b""[..], b"\x02", b"\xc0", b"\x02\xc0", b"{}", b"{\"t\":{}}", b"\xff\xfe"] {
            eth_transaction(input);
            state_test(input);
        }
    }

    /// The tracked seeds of `fuzz/seeds/` (valid transactions and state tests, each found
    /// worth keeping) go through the bodies in every test run.
    #[test]
    fn the_tracked_seeds_pass() {
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds");
        for (target, body) in [("eth_transaction", eth_transaction as fn(&[u8])), ("state_test", state_test)] {
            let mut count = 0;
            for entry in std::fs::read_dir(seeds.join(target)).unwrap() {
                body(&std::fs::read(entry.unwrap().path()).unwrap());
                count += 1;
            }
            assert!(count >= 6, "{target} has {count} seeds");
        }
    }
}
