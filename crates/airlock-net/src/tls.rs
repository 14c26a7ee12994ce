//! Reading the server name (SNI) out of a TLS ClientHello, without TLS.
//!
//! Through a CONNECT tunnel to an allowed host, a client could ask the server
//! at that address for another site by naming it in the ClientHello (domain
//! fronting through a shared front end). The proxy reads the first bytes the
//! client sends and refuses a tunnel whose ClientHello names another host.

/// TLS record content type of handshake messages.
const HANDSHAKE_RECORD: u8 = 22;
/// Handshake message type of a ClientHello.
const CLIENT_HELLO: u8 = 1;
/// Extension type of server_name (RFC 6066).
const SERVER_NAME_EXTENSION: u16 = 0;
/// The largest record a TLS peer may send (2^14 plus expansion room).
const MAX_RECORD: usize = (1 << 14) + 2048;
/// The largest ClientHello the proxy reads; real ones are a few KiB even
/// with post-quantum key shares.
pub const MAX_CLIENT_HELLO: usize = 64 * 1024;

/// What the first bytes of a tunnel are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HelloScan {
    /// Not a TLS handshake at all (some other protocol through the tunnel).
    NotTls,
    /// A TLS handshake whose ClientHello has not fully arrived yet.
    Incomplete,
    /// A whole ClientHello, and the host name it asks for, if any (lower
    /// case, no trailing dot); `length` is how many of the bytes scanned
    /// are the records that carry it.
    Hello { server_name: Option<String>, length: usize },
    /// A TLS handshake the proxy cannot read; the tunnel is refused.
    Malformed(&'static str),
}

/// Scans the bytes a client sent first through a tunnel.
pub fn scan_client_hello(data: &[u8]) -> HelloScan {
    let Some(&first) = data.first() else {
        return HelloScan::Incomplete;
    };
    if first != HANDSHAKE_RECORD {
        return HelloScan::NotTls;
    }
    // The ClientHello may be split across several handshake records.
    let mut handshake = Vec::new();
    let mut rest = data;
    loop {
        if rest.len() < 5 {
            return HelloScan::Incomplete;
        }
        if rest[0] != HANDSHAKE_RECORD {
            return HelloScan::Malformed("the ClientHello was interrupted by another record");
        }
        if rest[1] != 3 {
            return HelloScan::Malformed("the record does not carry a TLS version");
        }
        let length = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if length == 0 || length > MAX_RECORD {
            return HelloScan::Malformed("a handshake record has an impossible length");
        }
        let Some(fragment) = rest.get(5..5 + length) else {
            return HelloScan::Incomplete;
        };
        handshake.extend_from_slice(fragment);
        rest = &rest[5 + length..];
        if handshake.len() < 4 {
            continue;
        }
        if handshake[0] != CLIENT_HELLO {
            return HelloScan::Malformed("the first handshake message is not a ClientHello");
        }
        let message_length =
            usize::from(handshake[1]) << 16 | usize::from(handshake[2]) << 8 | usize::from(handshake[3]);
        if message_length > MAX_CLIENT_HELLO {
            return HelloScan::Malformed("the ClientHello is larger than the proxy reads");
        }
        if let Some(body) = handshake.get(4..4 + message_length) {
            return match server_name(body) {
                Ok(server_name) => HelloScan::Hello { server_name, length: data.len() - rest.len() },
                Err(why) => HelloScan::Malformed(why),
            };
        }
    }
}

/// TLS record content type of alerts: a server may refuse a ClientHello with one.
const ALERT_RECORD: u8 = 21;

/// Whether `first`, the first bytes a server sent back after a ClientHello
/// (at least a record's five-byte header), begin a TLS record a server
/// answers a ClientHello with: a handshake (its ServerHello) or an alert.
/// A server of any other protocol answers otherwise, or not at all.
pub fn answers_tls(first: &[u8]) -> bool {
    match first {
        [kind, 3, _, high, low, ..] => {
            let length = usize::from(u16::from_be_bytes([*high, *low]));
            matches!(*kind, HANDSHAKE_RECORD | ALERT_RECORD) && (1..=MAX_RECORD).contains(&length)
        }
        _ => false,
    }
}

/// The host_name in a ClientHello body, if it has a server_name extension.
fn server_name(body: &[u8]) -> Result<Option<String>, &'static str> {
    const TRUNCATED: &str = "the ClientHello is truncated";
    let mut reader = Reader(body);
    reader.take(2 + 32).ok_or(TRUNCATED)?; // legacy version, random
    reader.vector(1).ok_or(TRUNCATED)?; // legacy session id
    reader.vector(2).ok_or(TRUNCATED)?; // cipher suites
    reader.vector(1).ok_or(TRUNCATED)?; // legacy compression methods
    if reader.0.is_empty() {
        return Ok(None);
    }
    let mut extensions = Reader(reader.vector(2).ok_or(TRUNCATED)?);
    let mut found = None;
    while !extensions.0.is_empty() {
        let kind = extensions.u16().ok_or(TRUNCATED)?;
        let data = extensions.vector(2).ok_or(TRUNCATED)?;
        if kind != SERVER_NAME_EXTENSION {
            continue;
        }
        if found.is_some() {
            return Err("the ClientHello has two server_name extensions");
        }
        found = Some(host_name(data)?);
    }
    Ok(found)
}

/// The one host_name entry of a server_name extension.
fn host_name(extension: &[u8]) -> Result<String, &'static str> {
    let mut list = Reader(extension);
    let mut names = Reader(list.vector(2).ok_or("the server_name extension is truncated")?);
    if !list.0.is_empty() {
        return Err("the server_name extension has trailing bytes");
    }
    let mut host = None;
    while !names.0.is_empty() {
        let kind = names.take(1).ok_or("the server_name list is truncated")?[0];
        let name = names.vector(2).ok_or("the server_name list is truncated")?;
        if kind != 0 {
            continue;
        }
        if host.is_some() {
            return Err("the server_name extension names two hosts");
        }
        let text = std::str::from_utf8(name).map_err(|_| "the server name is not text")?;
        host = Some(text.strip_suffix('.').unwrap_or(text).to_ascii_lowercase());
    }
    host.ok_or("the server_name extension names no host")
}

/// A cursor over big-endian TLS encodings.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = tail;
        Some(head)
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector whose length prefix is `prefix` (1 or 2) bytes.
    fn vector(&mut self, prefix: usize) -> Option<&'a [u8]> {
        let length = self.take(prefix)?.iter().fold(0usize, |acc, b| acc << 8 | usize::from(*b));
        self.take(length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello as a client writes it, with the given extensions.
    fn client_hello(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([7u8; 32]);
        body.push(0); // session id
        body.extend([0, 2, 0x13, 0x01]); // one cipher suite
        body.extend([1, 0]); // null compression
        let mut ext = Vec::new();
        for (kind, data) in extensions {
            ext.extend(kind.to_be_bytes());
            ext.extend((data.len() as u16).to_be_bytes());
            ext.extend(data);
        }
        body.extend((ext.len() as u16).to_be_bytes());
        body.extend(ext);
        let mut handshake = vec![CLIENT_HELLO, 0];
        handshake.extend((body.len() as u16).to_be_bytes());
        handshake.extend(body);
        handshake
    }

    fn records(handshake: &[u8], fragment: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in handshake.chunks(fragment) {
            out.extend([HANDSHAKE_RECORD, 3, 1]);
            out.extend((chunk.len() as u16).to_be_bytes());
            out.extend(chunk);
        }
        out
    }

    fn sni(names: &[(u8, &str)]) -> Vec<u8> {
        let mut list = Vec::new();
        for (kind, name) in names {
            list.push(*kind);
            list.extend((name.len() as u16).to_be_bytes());
            list.extend(name.as_bytes());
        }
        let mut data = (list.len() as u16).to_be_bytes().to_vec();
        data.extend(list);
        data
    }

    #[test]
    fn reads_the_server_name_whole_split_and_in_pieces() {
        let hello = client_hello(&[(10, vec![0, 2, 0, 29]), (0, sni(&[(0, "API.Example.com.")]))]);
        let whole = records(&hello, 1 << 14);
        let expected = |length| HelloScan::Hello { server_name: Some("api.example.com".into()), length };
        assert_eq!(scan_client_hello(&whole), expected(whole.len()));
        let split = records(&hello, 7);
        assert_eq!(scan_client_hello(&split), expected(split.len()));
        // What follows the hello's records is not counted as the hello.
        let followed = [&split[..], b"\r\nSET key value\r\n"].concat();
        assert_eq!(scan_client_hello(&followed), expected(split.len()));
        for cut in 0..split.len() {
            assert_eq!(scan_client_hello(&split[..cut]), HelloScan::Incomplete, "cut at {cut}");
        }
    }

    #[test]
    fn a_hello_without_a_name_has_none() {
        let hello = client_hello(&[(10, vec![0, 2, 0, 29])]);
        let whole = records(&hello, 1000);
        assert_eq!(scan_client_hello(&whole), HelloScan::Hello { server_name: None, length: whole.len() });
    }

    #[test]
    fn a_server_answers_tls_with_a_handshake_or_an_alert_record() {
        assert!(answers_tls(&[HANDSHAKE_RECORD, 3, 3, 0, 122]));
        assert!(answers_tls(&[ALERT_RECORD, 3, 3, 0, 2, 2, 40]));
        for other in
            [&b"-ERR unknown command\r\n"[..], b"HTTP/1.1 400 Bad Request\r\n", b"LINE: \x16\x03", &[23, 3, 3, 0, 5]]
        {
            assert!(!answers_tls(other), "{other:?}");
        }
        assert!(!answers_tls(&[HANDSHAKE_RECORD, 3, 3, 0]), "a header cut short");
        assert!(!answers_tls(&[HANDSHAKE_RECORD, 3, 3, 0, 0]), "an empty record");
        assert!(!answers_tls(&[HANDSHAKE_RECORD, 3, 3, 0xff, 0xff]), "a record longer than TLS allows");
    }

    #[test]
    fn other_protocols_are_not_tls() {
        assert_eq!(scan_client_hello(b"GET / HTTP/1.1\r\n"), HelloScan::NotTls);
        assert_eq!(scan_client_hello(b"SSH-2.0-OpenSSH"), HelloScan::NotTls);
        assert_eq!(scan_client_hello(b""), HelloScan::Incomplete);
    }

    #[test]
    fn ambiguous_hellos_are_malformed() {
        let two_names = client_hello(&[(0, sni(&[(0, "a.com"), (0, "b.com")]))]);
        assert!(matches!(scan_client_hello(&records(&two_names, 1000)), HelloScan::Malformed(_)));
        let two_extensions = client_hello(&[(0, sni(&[(0, "a.com")])), (0, sni(&[(0, "b.com")]))]);
        assert!(matches!(scan_client_hello(&records(&two_extensions, 1000)), HelloScan::Malformed(_)));
        let mut not_hello = client_hello(&[]);
        not_hello[0] = 2;
        assert!(matches!(scan_client_hello(&records(&not_hello, 1000)), HelloScan::Malformed(_)));
        let mut interrupted = records(&client_hello(&[(0, sni(&[(0, "a.com")]))]), 10);
        interrupted[15] = 23;
        assert!(matches!(scan_client_hello(&interrupted), HelloScan::Malformed(_)));
        let mut truncated = client_hello(&[(0, sni(&[(0, "a.com")]))]);
        truncated[3] = truncated[3].wrapping_sub(3);
        truncated.truncate(truncated.len() - 3);
        assert!(matches!(scan_client_hello(&records(&truncated, 1000)), HelloScan::Malformed(_)));
    }
}
