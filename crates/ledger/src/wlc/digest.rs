//! Digest rows and the digest hash of a block.
//!
//! A trigger on each shared table writes one row per changed tuple: the table, the primary
//! key, a serial that rises with every new version of that key within the block, the row's
//! image (after the change; before it for a delete) and the kind of change. The image is a
//! text both PostgreSQL and SQLite build byte for byte (see `virga-chainify`'s dialects), and
//! the execution server, not the database, hashes it: SQLite has no SHA-256, and pgcrypto is
//! an extension.

use sha2::{Digest, Sha256};

use super::{update_field, Hash};

/// What changed a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DigestOp {
    Insert,
    Update,
    Delete,
}

impl DigestOp {
    /// The letter the triggers write (`I`, `U`, `D`).
    pub fn letter(self) -> &'static str {
        match self {
            DigestOp::Insert => "I",
            DigestOp::Update => "U",
            DigestOp::Delete => "D",
        }
    }

    /// The kind a trigger's letter names.
    pub fn from_letter(letter: &str) -> Option<DigestOp> {
        match letter {
            "I" => Some(DigestOp::Insert),
            "U" => Some(DigestOp::Update),
            "D" => Some(DigestOp::Delete),
            _ => None,
        }
    }
}

/// One changed tuple, as a digest trigger recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestRow {
    pub table: String,
    /// The primary key in the canonical text of the image (an integer in decimal).
    pub pk: String,
    pub serial: u64,
    /// The row's canonical image.
    pub image: String,
    pub op: DigestOp,
}

impl DigestRow {
    /// The row's hash: SHA-256 over its fields, each after its length.
    pub fn hash(&self) -> Hash {
        let mut hasher = Sha256::new();
        update_field(&mut hasher, self.table.as_bytes());
        update_field(&mut hasher, self.pk.as_bytes());
        hasher.update(self.serial.to_be_bytes());
        update_field(&mut hasher, self.op.letter().as_bytes());
        update_field(&mut hasher, self.image.as_bytes());
        hasher.finalize().into()
    }
}

/// The digest hash of a block's effects: SHA-256 over the rows' hashes in `[table, PK,
/// serial]` order, so the order in which an organization's database ran the transactions
/// (or returned the rows) does not matter, only what it changed.
pub fn digest_hash(rows: &[DigestRow]) -> Hash {
    let mut ordered: Vec<&DigestRow> = rows.iter().collect();
    ordered.sort_by(|a, b| (&a.table, &a.pk, a.serial).cmp(&(&b.table, &b.pk, b.serial)));
    let mut hasher = Sha256::new();
    hasher.update((ordered.len() as u64).to_be_bytes());
    for row in ordered {
        hasher.update(row.hash());
    }
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(table: &str, pk: &str, serial: u64, image: &str, op: DigestOp) -> DigestRow {
        DigestRow { table: table.into(), pk: pk.into(), serial, image: image.into(), op }
    }

    #[test]
    fn the_digest_hash_ignores_the_order_rows_arrive_in() {
        let rows = vec![
            row("checking", "7", 0, "1:7|3:100", DigestOp::Update),
            row("checking", "7", 1, "1:7|2:90", DigestOp::Update),
            row("savings", "3", 0, "1:3|1:5", DigestOp::Insert),
        ];
        let mut reversed = rows.clone();
        reversed.reverse();
        assert_eq!(digest_hash(&rows), digest_hash(&reversed));
    }

    #[test]
    fn any_changed_field_changes_the_digest_hash() {
        let base = vec![row("checking", "7", 0, "1:7|3:100", DigestOp::Update)];
        let variants = [
            row("savings", "7", 0, "1:7|3:100", DigestOp::Update),
            row("checking", "8", 0, "1:7|3:100", DigestOp::Update),
            row("checking", "7", 1, "1:7|3:100", DigestOp::Update),
            row("checking", "7", 0, "1:7|3:101", DigestOp::Update),
            row("checking", "7", 0, "1:7|3:100", DigestOp::Insert),
        ];
        for variant in variants {
            assert_ne!(digest_hash(&base), digest_hash(std::slice::from_ref(&variant)), "{variant:?}");
        }
        assert_ne!(digest_hash(&base), digest_hash(&[]), "a block with no effects differs from one with some");
    }

    #[test]
    fn fields_cannot_trade_bytes() {
        // Without the lengths, table "ab" + pk "c" and table "a" + pk "bc" would hash alike.
        let one = row("ab", "c", 0, "x", DigestOp::Insert);
        let other = row("a", "bc", 0, "x", DigestOp::Insert);
        assert_ne!(one.hash(), other.hash());
    }

    #[test]
    fn letters_round_trip() {
        for op in [DigestOp::Insert, DigestOp::Update, DigestOp::Delete] {
            assert_eq!(DigestOp::from_letter(op.letter()), Some(op));
        }
        assert_eq!(DigestOp::from_letter("X"), None);
    }
}
