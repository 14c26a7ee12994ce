//! The chain's hashing scheme. The crate documentation describes it byte by
//! byte for outside verifiers; change one only with the other, and only by
//! adding a new version.

use sha2::{Digest, Sha256};

/// The hashing scheme entries are written with.
pub const HASH_VERSION: i64 = 1;

/// The `prev_hash` of the first entry: 64 zeros.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Separates version 1 entry hashes from every other use of SHA-256.
const DOMAIN_V1: &[u8] = b"airlock-audit-entry/1\n";

/// The stored fields of one entry, exactly as they are in the database,
/// which its hash covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryFields<'a> {
    pub seq: u64,
    pub prev_hash: &'a str,
    pub run_id: &'a str,
    pub recorded_at: &'a str,
    pub started_at: &'a str,
    pub status: &'a str,
    pub principal: Option<&'a str>,
    /// The stored record: JSON text, hashed as the exact bytes stored, so a
    /// verifier needs no JSON library that formats numbers as serde does.
    pub record: &'a str,
}

impl EntryFields<'_> {
    /// The version 1 entry hash: lower-case hex SHA-256 of the domain tag,
    /// then `seq` as 8 bytes big-endian, then each text field as its UTF-8
    /// length (8 bytes big-endian) followed by its bytes, the optional
    /// principal preceded by one byte (0 absent, 1 present).
    pub fn hash(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(DOMAIN_V1);
        hasher.update(self.seq.to_be_bytes());
        for text in [self.prev_hash, self.run_id, self.recorded_at, self.started_at, self.status] {
            update_text(&mut hasher, text);
        }
        match self.principal {
            None => hasher.update([0u8]),
            Some(name) => {
                hasher.update([1u8]);
                update_text(&mut hasher, name);
            }
        }
        update_text(&mut hasher, self.record);
        hex::encode(hasher.finalize())
    }
}

/// Length-prefixing every field makes the encoding unambiguous: no choice
/// of field contents can make two different entries hash the same bytes.
fn update_text(hasher: &mut Sha256, text: &str) {
    hasher.update((text.len() as u64).to_be_bytes());
    hasher.update(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> EntryFields<'static> {
        EntryFields {
            seq: 1,
            prev_hash: GENESIS_HASH,
            run_id: "r1",
            recorded_at: "2026-01-01T00:00:00.000Z",
            started_at: "2026-01-01T00:00:00.000Z",
            status: "ok",
            principal: None,
            record: "{}",
        }
    }

    /// Pins the scheme: these values were computed independently, by
    /// `entry_hash` in verify_chain.py (Python's hashlib and struct).
    #[test]
    fn the_scheme_is_the_documented_one() {
        assert_eq!(fields().hash(), "def5b2eb2b9eecee00a841b04c5fffe11846413ff87d0f1b80791d9d79d7dca0");
        let hash = "ab".repeat(32);
        let with_principal = EntryFields {
            seq: 7,
            prev_hash: &hash,
            status: "failed",
            principal: Some("alice"),
            record: "{\"x\":\"é\"}",
            ..fields()
        };
        assert_eq!(with_principal.hash(), "173c9c106c63a06e4b96708053a690d63b7b948af1be948e2536bcbe7bdcfdac");
    }

    #[test]
    fn every_field_counts_and_fields_cannot_bleed_into_each_other() {
        let base = fields();
        let variants = [
            EntryFields { seq: 2, ..base },
            EntryFields { prev_hash: "1", ..base },
            EntryFields { run_id: "r2", ..base },
            EntryFields { recorded_at: "x", ..base },
            EntryFields { started_at: "x", ..base },
            EntryFields { status: "failed", ..base },
            EntryFields { principal: Some(""), ..base },
            EntryFields { record: "{ }", ..base },
            // Moving a character from one field to the next changes the hash.
            EntryFields { run_id: "r", recorded_at: "12026-01-01T00:00:00.000Z", ..base },
        ];
        let mut seen = std::collections::BTreeSet::from([base.hash()]);
        for variant in variants {
            assert!(seen.insert(variant.hash()), "{variant:?} hashes like another entry");
        }
    }
}
