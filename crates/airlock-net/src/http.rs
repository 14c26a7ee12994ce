//! HTTP/1 as far as the proxy needs it: a bounded request head, and where a
//! request body ends.

use std::io::{self, Read};
use std::net::TcpStream;
use std::time::Instant;

/// The largest request head the proxy reads (request line and headers).
pub const MAX_HEAD_BYTES: usize = 32 * 1024;
/// The most header fields a request may carry.
pub const MAX_HEADERS: usize = 128;

/// A parsed request head. Header values are kept as bytes, as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub target: String,
    /// The minor version: 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version: u8,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl RequestHead {
    /// Every value of header `name` (case-insensitive).
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers.iter().filter(move |(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice())
    }
}

/// Why no request head could be read. Each maps to the status the client gets.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error("the client closed the connection before sending a whole request")]
    Closed,
    #[error("no whole request head arrived in time")]
    Timeout,
    #[error("the request head is larger than {MAX_HEAD_BYTES} bytes or has more than {MAX_HEADERS} fields")]
    TooLarge,
    #[error("the request head is not valid HTTP/1: {0}")]
    Malformed(httparse::Error),
    #[error("reading the request: {0}")]
    Io(io::Error),
}

impl HeadError {
    /// The HTTP status to answer with.
    pub fn status(&self) -> u16 {
        match self {
            HeadError::Timeout => 408,
            HeadError::TooLarge => 431,
            HeadError::Closed | HeadError::Malformed(_) | HeadError::Io(_) => 400,
        }
    }
}

/// Reads one request head from `stream` by `deadline`. Returns the head and
/// the bytes that arrived after it (the start of a body, or a TLS ClientHello
/// sent without waiting for the CONNECT reply).
pub fn read_head(stream: &TcpStream, deadline: Instant) -> Result<(RequestHead, Vec<u8>), HeadError> {
    let mut reader = stream;
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(parsed) = parse_head(&buffer)? {
            return Ok(parsed);
        }
        if buffer.len() >= MAX_HEAD_BYTES {
            return Err(HeadError::TooLarge);
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(HeadError::Timeout);
        }
        stream.set_read_timeout(Some(remaining)).map_err(HeadError::Io)?;
        let room = chunk.len().min(MAX_HEAD_BYTES - buffer.len());
        match reader.read(&mut chunk[..room]) {
            Ok(0) => return Err(HeadError::Closed),
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(HeadError::Timeout);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(HeadError::Io(e)),
        }
    }
}

/// The head in `buffer` with the bytes after it, or `None` if it is not all there yet.
fn parse_head(buffer: &[u8]) -> Result<Option<(RequestHead, Vec<u8>)>, HeadError> {
    Ok(split_head(buffer)?.map(|(head, length)| (head, buffer[length..].to_vec())))
}

/// The head at the start of `buffer` and its length in bytes, or `None` if
/// it is not all there yet.
pub fn split_head(buffer: &[u8]) -> Result<Option<(RequestHead, usize)>, HeadError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut fields);
    match request.parse(buffer) {
        Ok(httparse::Status::Partial) => Ok(None),
        Ok(httparse::Status::Complete(length)) => {
            let head = RequestHead {
                method: request.method.unwrap_or_default().to_owned(),
                target: request.path.unwrap_or_default().to_owned(),
                version: request.version.unwrap_or(1),
                headers: request.headers.iter().map(|h| (h.name.to_owned(), h.value.to_vec())).collect(),
            };
            Ok(Some((head, length)))
        }
        Err(httparse::Error::TooManyHeaders) => Err(HeadError::TooLarge),
        Err(e) => Err(HeadError::Malformed(e)),
    }
}

/// How a request body is delimited, tracked as its bytes pass through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body, or one fully passed.
    Done,
    /// This many bytes still to come.
    Length(u64),
    /// A chunked body, at this point of its grammar.
    Chunked(Chunked),
}

/// Why a request body cannot be delimited.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error(
        "both Content-Length and Transfer-Encoding are set, which lets two readers disagree on where the body ends"
    )]
    Ambiguous,
    #[error("Content-Length is not one decimal number")]
    BadLength,
    #[error("only Transfer-Encoding: chunked is supported")]
    UnsupportedEncoding,
    #[error("the chunked body is malformed: {0}")]
    BadChunk(&'static str),
}

impl BodyFraming {
    /// The framing a request head declares (RFC 9112 section 6).
    pub fn of(head: &RequestHead) -> Result<BodyFraming, FramingError> {
        let lengths: Vec<&[u8]> = head.values("content-length").collect();
        let encodings: Vec<&[u8]> = head.values("transfer-encoding").collect();
        match (lengths.as_slice(), encodings.as_slice()) {
            ([], []) => Ok(BodyFraming::Done),
            ([], [encoding]) if encoding.trim_ascii().eq_ignore_ascii_case(b"chunked") => {
                Ok(BodyFraming::Chunked(Chunked::default()))
            }
            ([], _) => Err(FramingError::UnsupportedEncoding),
            ([length], []) => {
                let text = std::str::from_utf8(length.trim_ascii()).map_err(|_| FramingError::BadLength)?;
                if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(FramingError::BadLength);
                }
                let n: u64 = text.parse().map_err(|_| FramingError::BadLength)?;
                Ok(if n == 0 { BodyFraming::Done } else { BodyFraming::Length(n) })
            }
            (_, []) => Err(FramingError::BadLength),
            _ => Err(FramingError::Ambiguous),
        }
    }

    pub fn is_done(&self) -> bool {
        *self == BodyFraming::Done
    }

    /// Passes `data` through the framing: returns how many of its bytes
    /// belong to the body. Fewer than `data.len()` means the body ended and
    /// the rest is not part of this request.
    pub fn advance(&mut self, data: &[u8]) -> Result<usize, FramingError> {
        match self {
            BodyFraming::Done => Ok(0),
            BodyFraming::Length(remaining) => {
                let taken = usize::try_from(*remaining).map_or(data.len(), |r| r.min(data.len()));
                *remaining -= taken as u64;
                if *remaining == 0 {
                    *self = BodyFraming::Done;
                }
                Ok(taken)
            }
            BodyFraming::Chunked(chunked) => {
                let taken = chunked.advance(data)?;
                if chunked.state == ChunkState::Done {
                    *self = BodyFraming::Done;
                }
                Ok(taken)
            }
        }
    }
}

/// The longest chunk-size line (with extensions) or trailer line accepted.
const MAX_CHUNK_LINE: usize = 4096;

/// Where a chunked body is in its grammar (RFC 9112 section 7.1).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chunked {
    state: ChunkState,
    /// Bytes of the current size line or trailer line so far.
    line: usize,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum ChunkState {
    /// Reading hex digits of a chunk size.
    #[default]
    SizeStart,
    Size(u64),
    /// After the size: extensions up to CR.
    Extension(u64),
    SizeLf(u64),
    Data(u64),
    DataCr,
    DataLf,
    TrailerStart,
    Trailer,
    TrailerLf,
    FinalLf,
    Done,
}

impl Chunked {
    fn advance(&mut self, data: &[u8]) -> Result<usize, FramingError> {
        let mut at = 0;
        while at < data.len() && self.state != ChunkState::Done {
            if let ChunkState::Data(remaining) = self.state {
                let taken = usize::try_from(remaining).map_or(data.len() - at, |r| r.min(data.len() - at));
                let left = remaining - taken as u64;
                self.state = if left == 0 { ChunkState::DataCr } else { ChunkState::Data(left) };
                at += taken;
                continue;
            }
            self.step(data[at])?;
            at += 1;
        }
        Ok(at)
    }

    fn step(&mut self, byte: u8) -> Result<(), FramingError> {
        use ChunkState::*;
        self.line += 1;
        if self.line > MAX_CHUNK_LINE {
            return Err(FramingError::BadChunk("a chunk-size or trailer line is too long"));
        }
        let hex = (byte as char).to_digit(16).map(u64::from);
        self.state = match (self.state, byte, hex) {
            (SizeStart, _, Some(d)) => Size(d),
            (SizeStart, _, None) => {
                return Err(FramingError::BadChunk("a chunk does not start with its size"));
            }
            (Size(n), _, Some(d)) => Size(
                n.checked_mul(16)
                    .and_then(|n| n.checked_add(d))
                    .ok_or(FramingError::BadChunk("a chunk size overflows"))?,
            ),
            (Size(n), b'\r', _) => SizeLf(n),
            (Size(n), b';' | b' ' | b'\t', _) => Extension(n),
            (Extension(n), b'\r', _) => SizeLf(n),
            (Extension(_), b'\n', _) => {
                return Err(FramingError::BadChunk("a bare LF ends a chunk-size line"));
            }
            (Extension(n), _, _) => Extension(n),
            (SizeLf(0), b'\n', _) => TrailerStart,
            (SizeLf(n), b'\n', _) => Data(n),
            (DataCr, b'\r', _) => DataLf,
            (DataLf, b'\n', _) => SizeStart,
            (TrailerStart, b'\r', _) => FinalLf,
            (TrailerStart | Trailer, b'\n', _) => {
                return Err(FramingError::BadChunk("a bare LF in the trailer"));
            }
            (Trailer, b'\r', _) => TrailerLf,
            (TrailerStart | Trailer, _, _) => Trailer,
            (TrailerLf, b'\n', _) => TrailerStart,
            (FinalLf, b'\n', _) => Done,
            _ => {
                return Err(FramingError::BadChunk("unexpected byte in the chunk framing"));
            }
        };
        if matches!(self.state, SizeStart | Data(_) | TrailerStart | Done) {
            self.line = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> RequestHead {
        match parse_head(text.as_bytes()) {
            Ok(Some((head, _))) => head,
            other => panic!("{text:?} did not parse: {other:?}"),
        }
    }

    #[test]
    fn a_head_parses_and_keeps_what_follows() {
        let (parsed, rest) =
            parse_head(b"GET http://a.com/ HTTP/1.1\r\nHost: a.com\r\nX: 1\r\n\r\nBODY").unwrap().unwrap();
        assert_eq!(parsed.method, "GET");
        assert_eq!(parsed.target, "http://a.com/");
        assert_eq!(parsed.version, 1);
        assert_eq!(parsed.values("HOST").collect::<Vec<_>>(), vec![b"a.com"]);
        assert_eq!(rest, b"BODY");
        assert!(parse_head(b"GET / HTTP/1.1\r\nHost: a").unwrap().is_none());
        assert!(matches!(parse_head(b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n"), Err(HeadError::Malformed(_))));
        let many = format!("GET / HTTP/1.1\r\n{}\r\n", "A: b\r\n".repeat(MAX_HEADERS + 1));
        assert!(matches!(parse_head(many.as_bytes()), Err(HeadError::TooLarge)));
    }

    #[test]
    fn framing_follows_the_headers() {
        assert_eq!(BodyFraming::of(&head("GET / HTTP/1.1\r\n\r\n")), Ok(BodyFraming::Done));
        assert_eq!(BodyFraming::of(&head("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n")), Ok(BodyFraming::Length(5)));
        assert_eq!(BodyFraming::of(&head("POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n")), Ok(BodyFraming::Done));
        assert!(matches!(
            BodyFraming::of(&head("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n")),
            Ok(BodyFraming::Chunked(_))
        ));
        for bad in [
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert!(BodyFraming::of(&head(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_length_body_ends_where_it_says() {
        let mut framing = BodyFraming::Length(5);
        assert_eq!(framing.advance(b"abc"), Ok(3));
        assert_eq!(framing.advance(b"deGET /next"), Ok(2));
        assert!(framing.is_done());
        assert_eq!(framing.advance(b"more"), Ok(0));
    }

    #[test]
    fn a_chunked_body_ends_after_its_trailer_byte_by_byte_or_whole() {
        let body = b"5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\n";
        let next = b"GET http://evil/ HTTP/1.1\r\n\r\n";
        let mut stream = body.to_vec();
        stream.extend_from_slice(next);

        let mut whole = BodyFraming::Chunked(Chunked::default());
        assert_eq!(whole.advance(&stream), Ok(body.len()));
        assert!(whole.is_done());

        let mut bytewise = BodyFraming::Chunked(Chunked::default());
        let taken: usize = stream.iter().map(|b| bytewise.advance(std::slice::from_ref(b)).unwrap()).sum();
        assert_eq!(taken, body.len());
    }

    #[test]
    fn malformed_chunks_are_refused() {
        for bad in [&b"x\r\n"[..], b"5\nhello", b"5\r\nhelloX", b"fffffffffffffffff\r\n", b"0\r\nTrailer\n"] {
            let mut framing = BodyFraming::Chunked(Chunked::default());
            assert!(framing.advance(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let mut long_extension = b"1;".to_vec();
        long_extension.resize(MAX_CHUNK_LINE + 1, b'a');
        let mut framing = BodyFraming::Chunked(Chunked::default());
        assert_eq!(
            framing.advance(&long_extension),
            Err(FramingError::BadChunk("a chunk-size or trailer line is too long"))
        );
    }
}
