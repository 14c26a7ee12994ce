//! Captured output: the first bytes up to a cap, a count of the rest.

/// A stream captured up to a cap. Bytes past the cap are counted and dropped,
/// so a flood costs the supervisor no memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Captured {
    pub bytes: Vec<u8>,
    /// Bytes the stream carried in all, kept or not.
    pub total: u64,
}

impl Captured {
    /// Whether bytes were dropped.
    pub fn truncated(&self) -> bool {
        self.total > self.bytes.len() as u64
    }

    /// The text as UTF-8, and the exact bytes as base64 when they are not
    /// valid UTF-8 (the text is then a lossy decoding). A multi-byte
    /// character cut by the cap at the very end counts as valid.
    pub fn text(&self) -> (String, Option<String>) {
        match std::str::from_utf8(&self.bytes) {
            Ok(text) => (text.to_owned(), None),
            Err(e) if self.truncated() && e.error_len().is_none() => {
                (String::from_utf8_lossy(&self.bytes[..e.valid_up_to()]).into_owned(), None)
            }
            Err(_) => {
                use base64::Engine;
                (
                    String::from_utf8_lossy(&self.bytes).into_owned(),
                    Some(base64::engine::general_purpose::STANDARD.encode(&self.bytes)),
                )
            }
        }
    }
}

/// Accumulates a stream up to `cap` bytes.
#[derive(Debug)]
pub struct CappedBuffer {
    cap: u64,
    captured: Captured,
}

impl CappedBuffer {
    pub fn new(cap: u64) -> CappedBuffer {
        CappedBuffer { cap, captured: Captured::default() }
    }

    /// Adds `chunk`; returns true when this chunk took the stream past the cap.
    pub fn push(&mut self, chunk: &[u8]) -> bool {
        let was_over = self.captured.truncated();
        let room = self.cap.saturating_sub(self.captured.bytes.len() as u64);
        let keep = chunk.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        self.captured.bytes.extend_from_slice(&chunk[..keep]);
        self.captured.total = self.captured.total.saturating_add(chunk.len() as u64);
        !was_over && self.captured.truncated()
    }

    /// Counts `bytes` the stream carried past the cap without keeping them
    /// (they were discarded unread).
    pub fn skip(&mut self, bytes: u64) {
        self.captured.total = self.captured.total.saturating_add(bytes);
    }

    /// Bytes the stream carried so far, kept or not.
    pub fn total(&self) -> u64 {
        self.captured.total
    }

    pub fn is_over(&self) -> bool {
        self.captured.truncated()
    }

    pub fn finish(self) -> Captured {
        self.captured
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_bytes_and_counts_the_rest() {
        let mut b = CappedBuffer::new(5);
        assert!(!b.push(b"abc"));
        assert!(b.push(b"defgh"));
        assert!(!b.push(b"ij"));
        let c = b.finish();
        assert_eq!(c.bytes, b"abcde");
        assert_eq!(c.total, 10);
        assert!(c.truncated());
    }

    #[test]
    fn non_utf8_is_kept_exactly() {
        let c = Captured { bytes: vec![b'a', 0xff, b'b'], total: 3 };
        let (text, b64) = c.text();
        assert_eq!(text, "a\u{fffd}b");
        assert_eq!(b64.as_deref(), Some("Yf9i"));
    }

    #[test]
    fn a_character_cut_by_the_cap_is_not_an_encoding_error() {
        let full = "é".as_bytes();
        let c = Captured { bytes: vec![b'a', full[0]], total: 3 };
        assert_eq!(c.text(), ("a".to_owned(), None));
    }
}
