//! HTTP/1.1 framing for `kvproof-engine --http`: one request per connection, its head parsed by `httparse` and
//! every size bounded (head bytes, header count, body bytes), answered with `Connection: close`. Bodies are
//! taken with `Content-Length` only. Streams of server-sent events go out chunked, one event per chunk, each
//! flushed as it is written.

use std::io::{self, Read, Write};
use std::time::Duration;

/// Bounds on what a client may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of the request line and headers together.
    pub head_bytes: usize,
    /// Header fields.
    pub headers: usize,
    /// Bytes of the body.
    pub body_bytes: usize,
    /// How long a read or write on the connection may block.
    pub io_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { head_bytes: 16 * 1024, headers: 64, body_bytes: 8 * 1024 * 1024, io_timeout: Duration::from_secs(30) }
    }
}

/// One request as read off a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    pub method: String,
    /// The path of the request target, without the query.
    pub path: String,
    /// The query of the request target (after `?`), or empty.
    pub query: String,
    /// Header names in lower case, with their raw values.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice())
    }

    /// The value of query parameter `key`, when present (no percent-decoding: the API's values are plain words).
    pub fn query_param(&self, key: &str) -> Option<&str> {
        self.query.split('&').find_map(|kv| match kv.split_once('=') {
            Some((k, v)) if k == key => Some(v),
            None if kv == key => Some(""),
            _ => None,
        })
    }
}

/// Why no request could be read.
#[derive(Debug)]
pub enum ReadError {
    /// The client closed the connection before sending anything.
    Closed,
    /// The connection failed (or a read timed out).
    Io(io::Error),
    /// The request is malformed or too large: answer with this status and message, then close.
    Refused { status: u16, message: String },
}

fn refused(status: u16, message: impl Into<String>) -> ReadError {
    ReadError::Refused { status, message: message.into() }
}

/// Read one request. Answers `Expect: 100-continue` on `stream` before reading the body.
pub fn read_request<S: Read + Write>(stream: &mut S, limits: &Limits) -> Result<HttpRequest, ReadError> {
    let mut buf: Vec<u8> = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    let (head_len, mut request) = loop {
        let mut headers = vec![httparse::EMPTY_HEADER; limits.headers];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => {
                if n > limits.head_bytes {
                    return Err(head_too_large(limits));
                }
                break (n, owned(&parsed));
            }
            Ok(httparse::Status::Partial) if buf.len() > limits.head_bytes => return Err(head_too_large(limits)),
            Ok(httparse::Status::Partial) => {}
            Err(httparse::Error::TooManyHeaders) => {
                return Err(refused(431, format!("more than {} header fields", limits.headers)));
            }
            Err(e) => return Err(refused(400, format!("malformed request head: {e}"))),
        }
        let want = (limits.head_bytes + 1 - buf.len()).min(chunk.len());
        let n = read_some(stream, &mut chunk[..want])?;
        if n == 0 {
            return Err(if buf.is_empty() {
                ReadError::Closed
            } else {
                refused(400, "the connection closed inside the request head")
            });
        }
        buf.extend_from_slice(&chunk[..n]);
    };

    if request.header("transfer-encoding").is_some() {
        return Err(refused(
            411,
            "request bodies must be sent with Content-Length (Transfer-Encoding is not accepted)",
        ));
    }
    let length = content_length(&request)?;
    if length > limits.body_bytes {
        return Err(refused(413, format!("a body of {length} bytes exceeds the limit of {} bytes", limits.body_bytes)));
    }
    if length > 0 && request.header("expect").is_some_and(|v| v.eq_ignore_ascii_case(b"100-continue")) {
        stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").and_then(|()| stream.flush()).map_err(ReadError::Io)?;
    }
    let mut body = buf.split_off(head_len);
    body.truncate(length);
    while body.len() < length {
        let want = (length - body.len()).min(chunk.len());
        let n = read_some(stream, &mut chunk[..want])?;
        if n == 0 {
            return Err(refused(400, format!("the body ended after {} of {length} bytes", body.len())));
        }
        body.extend_from_slice(&chunk[..n]);
    }
    request.body = body;
    Ok(request)
}

fn head_too_large(limits: &Limits) -> ReadError {
    refused(431, format!("the request line and headers exceed {} bytes", limits.head_bytes))
}

fn read_some<S: Read>(stream: &mut S, buf: &mut [u8]) -> Result<usize, ReadError> {
    loop {
        match stream.read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
}

fn owned(parsed: &httparse::Request<'_, '_>) -> HttpRequest {
    let target = parsed.path.unwrap_or("/");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    HttpRequest {
        method: parsed.method.unwrap_or("").to_string(),
        path: path.to_string(),
        query: query.to_string(),
        headers: parsed.headers.iter().map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec())).collect(),
        body: Vec::new(),
    }
}

/// The body length: 0 without `Content-Length`; several headers must agree.
fn content_length(request: &HttpRequest) -> Result<usize, ReadError> {
    let mut length: Option<usize> = None;
    for (_, value) in request.headers.iter().filter(|(n, _)| n == "content-length") {
        let text = std::str::from_utf8(value).unwrap_or("").trim();
        let n = match text.parse::<usize>() {
            Ok(n) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(refused(400, format!("Content-Length {text:?} is not a byte count"))),
        };
        if length.is_some_and(|l| l != n) {
            return Err(refused(400, "conflicting Content-Length headers"));
        }
        length = Some(n);
    }
    Ok(length.unwrap_or(0))
}

/// The reason phrase of the statuses this server answers with.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        411 => "Length Required",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        _ => "Unknown",
    }
}

/// Write a whole response and flush it.
pub fn write_response<W: Write>(w: &mut W, status: u16, content_type: &str, body: &[u8]) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reason(status),
        body.len()
    );
    w.write_all(head.as_bytes())?;
    w.write_all(body)?;
    w.flush()
}

/// A stream of server-sent events: `data: <json>` events, each one HTTP chunk, flushed as it is written.
#[derive(Debug)]
pub struct EventStream<W: Write> {
    out: W,
}

impl<W: Write> EventStream<W> {
    /// Send the response head (200, `text/event-stream`, chunked).
    pub fn start(mut out: W) -> io::Result<Self> {
        out.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
              Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        )?;
        out.flush()?;
        Ok(EventStream { out })
    }

    /// One `data:` event.
    pub fn event(&mut self, data: &str) -> io::Result<()> {
        let event = format!("data: {data}\n\n");
        write!(self.out, "{:x}\r\n", event.len())?;
        self.out.write_all(event.as_bytes())?;
        self.out.write_all(b"\r\n")?;
        self.out.flush()
    }

    /// `data: [DONE]`, then the end of the body.
    pub fn finish(mut self) -> io::Result<W> {
        self.event("[DONE]")?;
        self.out.write_all(b"0\r\n\r\n")?;
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection: reads come from `input`, writes go to `output`.
    struct Conn {
        input: io::Cursor<Vec<u8>>,
        output: Vec<u8>,
    }

    impl Read for Conn {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.input.read(buf)
        }
    }
    impl Write for Conn {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.write(buf)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn read(raw: &[u8], limits: &Limits) -> (Result<HttpRequest, ReadError>, Vec<u8>) {
        let mut conn = Conn { input: io::Cursor::new(raw.to_vec()), output: Vec::new() };
        let r = read_request(&mut conn, limits);
        (r, conn.output)
    }

    fn status(r: Result<HttpRequest, ReadError>) -> u16 {
        match r {
            Err(ReadError::Refused { status, .. }) => status,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn reads_a_request_with_a_body() {
        let raw = b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello";
        let (r, out) = read(raw, &Limits::default());
        let r = r.expect("request");
        assert_eq!((r.method.as_str(), r.path.as_str(), r.query.as_str()), ("POST", "/v1/completions", "x=1"));
        assert_eq!(r.body, b"hello");
        assert_eq!(r.header("host"), Some(&b"a"[..]));
        assert_eq!(r.query_param("x"), Some("1"));
        assert!(out.is_empty());
    }

    #[test]
    fn answers_expect_continue_before_the_body() {
        let raw = b"POST / HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\nhi";
        let (r, out) = read(raw, &Limits::default());
        assert_eq!(r.expect("request").body, b"hi");
        assert_eq!(out, b"HTTP/1.1 100 Continue\r\n\r\n");
    }

    #[test]
    fn bounds_every_size() {
        let small = Limits { head_bytes: 64, headers: 4, body_bytes: 8, io_timeout: Duration::from_secs(1) };
        let long_header = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(100));
        assert_eq!(status(read(long_header.as_bytes(), &small).0), 431);
        let endless = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(10_000));
        assert_eq!(status(read(endless.as_bytes(), &small).0), 431);
        assert_eq!(status(read(b"GET / HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\n\r\n", &small).0), 431);
        assert_eq!(status(read(b"POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\n123456789", &small).0), 413);
        assert_eq!(status(read(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", &small).0), 411);
        assert_eq!(status(read(b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", &small).0), 400);
        assert_eq!(status(read(b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", &small).0), 400);
        assert_eq!(status(read(b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\nab", &small).0), 400);
        assert_eq!(status(read(b"\x01\x02 nonsense\r\n\r\n", &small).0), 400);
        assert!(matches!(read(b"", &small).0, Err(ReadError::Closed)));
        assert_eq!(status(read(b"GET / HT", &small).0), 400);
    }

    #[test]
    fn event_stream_is_chunked() {
        let mut s = EventStream::start(Vec::new()).expect("start");
        s.event("{\"a\":1}").expect("event");
        let out = String::from_utf8(s.finish().expect("finish")).expect("utf8");
        assert!(out.starts_with("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\nf\r\ndata: {\"a\":1}\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"), "{out:?}");
    }
}
