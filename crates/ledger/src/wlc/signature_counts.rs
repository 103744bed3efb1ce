//! How many signatures Whatever-Ledger Consensus made and checked in this process. The
//! pipeline's cores read no clock, so they count instead of timing: a benchmark multiplies
//! the counts by each operation's cost measured beside them for cryptography's share.

use std::sync::atomic::{AtomicU64, Ordering};

use alloy_primitives::{Address, Signature, B256};

use crate::tx::{recover_address, SigningKey, TxError};

static SIGNED: AtomicU64 = AtomicU64::new(0);
static CHECKED: AtomicU64 = AtomicU64::new(0);

/// Signatures made and checked (a public-key recovery each) since the process started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SignatureCounts {
    pub signed: u64,
    pub checked: u64,
}

impl SignatureCounts {
    /// The counts so far.
    pub fn now() -> SignatureCounts {
        SignatureCounts { signed: SIGNED.load(Ordering::Relaxed), checked: CHECKED.load(Ordering::Relaxed) }
    }

    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: SignatureCounts) -> SignatureCounts {
        SignatureCounts {
            signed: self.signed.saturating_sub(earlier.signed),
            checked: self.checked.saturating_sub(earlier.checked),
        }
    }
}

pub(crate) fn sign(key: &SigningKey, digest: B256) -> Signature {
    SIGNED.fetch_add(1, Ordering::Relaxed);
    key.sign_hash(digest)
}

pub(crate) fn recover(digest: B256, signature: &Signature) -> Result<Address, TxError> {
    CHECKED.fetch_add(1, Ordering::Relaxed);
    recover_address(digest, signature)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wlc::{Agreement, SignedVote};
    use std::collections::BTreeMap;

    #[test]
    fn signing_and_checking_are_counted() {
        let key = SigningKey::from_seed(7);
        let members = BTreeMap::from([("org-1".to_string(), key.address())]);
        let before = SignatureCounts::now();
        let agreement = Agreement::sign(&key, "org-1", [3; 32]);
        let vote = SignedVote::sign(&key, "org-1", 4, [5; 32]);
        assert!(agreement.check(&members, &[3; 32]).is_ok());
        assert!(vote.check(&members, 4).is_ok());
        // Other tests run on other threads at once, so the counts may have grown more.
        let counted = SignatureCounts::now().since(before);
        assert!(counted.signed >= 2 && counted.checked >= 2, "{counted:?}");
    }
}
