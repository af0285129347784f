//! The wire: one synchronous RESP2 connection to a Redis (or Valkey) server, over TCP or over
//! TLS (rustls, the certificate verified by `tls.rs` like every other backend's).
//!
//! RESP2 is five reply types and one request shape (an array of bulk strings), so this is a
//! hundred lines rather than a dependency: the `redis` crate (1.x) would bring `url` with
//! its ICU tables (~30 crates) and a TLS set-up of its own (`rustls-native-certs`) beside
//! the one `tls.rs` already gives every backend. Byte-exact tests below pin the format.
//!
//! Every request is bounded: [`Conn::call`] sets the socket's read and write timeouts to
//! the time left before its deadline, so a server that stops answering is an error by then.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Nil,
    Int(i64),
    /// A bulk string.
    Bulk(Vec<u8>),
    /// A simple string (`+OK`).
    Simple(String),
    Array(Vec<Value>),
    /// An error reply (`-WRONGPASS ...`): the server's words, code first.
    Error(String),
}

impl Value {
    /// As text (a bulk or simple string); `None` for anything else.
    pub fn text(&self) -> Option<String> {
        match self {
            Value::Bulk(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::Simple(s) => Some(s.clone()),
            _ => None,
        }
    }

    pub fn int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bulk(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        }
    }

    pub fn items(&self) -> &[Value] {
        match self {
            Value::Array(v) => v,
            _ => &[],
        }
    }
}

/// A request as RESP writes it: an array of bulk strings.
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// The largest reply accepted (a lock's values are a few hundred bytes; `INFO` a few KiB).
const MAX_BULK: usize = 16 << 20;
const MAX_ITEMS: usize = 1 << 20;

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("bad RESP reply: {what}"))
}

/// Reads one reply.
pub fn read_value(r: &mut impl BufRead) -> io::Result<Value> {
    read_depth(r, 0)
}

fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    r.take(MAX_BULK as u64).read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        ));
    }
    if !line.ends_with(b"\r\n") {
        return Err(bad("a line without CRLF"));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| bad("not UTF-8"))
}

fn read_depth(r: &mut impl BufRead, depth: usize) -> io::Result<Value> {
    if depth > 8 {
        return Err(bad("nested too deep"));
    }
    let line = read_line(r)?;
    let (kind, rest) = line.split_at_checked(1).ok_or_else(|| bad("an empty line"))?;
    let num = || rest.parse::<i64>().map_err(|_| bad("not a number"));
    Ok(match kind {
        "+" => Value::Simple(rest.to_string()),
        "-" => Value::Error(rest.to_string()),
        ":" => Value::Int(num()?),
        "$" => {
            let n = num()?;
            if n < 0 {
                return Ok(Value::Nil);
            }
            let n = usize::try_from(n).map_err(|_| bad("length"))?;
            if n > MAX_BULK {
                return Err(bad("a bulk string too long"));
            }
            let mut b = vec![0; n + 2];
            r.read_exact(&mut b)?;
            if &b[n..] != b"\r\n" {
                return Err(bad("a bulk string without CRLF"));
            }
            b.truncate(n);
            Value::Bulk(b)
        }
        "*" => {
            let n = num()?;
            if n < 0 {
                return Ok(Value::Nil);
            }
            let n = usize::try_from(n).map_err(|_| bad("length"))?;
            if n > MAX_ITEMS {
                return Err(bad("an array too long"));
            }
            let mut v = Vec::with_capacity(n.min(64));
            for _ in 0..n {
                v.push(read_depth(r, depth + 1)?);
            }
            Value::Array(v)
        }
        other => return Err(bad(&format!("unknown type {other:?}"))),
    })
}

enum Stream {
    Tcp(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Tcp(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// One connection.
pub struct Conn {
    io: BufReader<Stream>,
}

impl Conn {
    /// Connects to `host:port` within `limit` (each address it resolves to in turn); with
    /// `tls`, a TLS session verified against the configuration given, for `host`'s name.
    pub fn connect(
        host: &str,
        port: u16,
        limit: Duration,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> io::Result<Conn> {
        let deadline = Instant::now() + limit;
        let addrs = (host, port).to_socket_addrs()?;
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the host has no address");
        let mut tcp = None;
        for a in addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                last = io::Error::new(io::ErrorKind::TimedOut, "connect timed out");
                break;
            }
            match TcpStream::connect_timeout(&a, left) {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let tcp = tcp.ok_or(last)?;
        let _ = tcp.set_nodelay(true);
        let stream = match tls {
            None => Stream::Tcp(tcp),
            Some(config) => {
                let name = rustls::pki_types::ServerName::try_from(host.to_string())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                let conn = rustls::ClientConnection::new(config, name)
                    .map_err(io::Error::other)?;
                let mut s = rustls::StreamOwned::new(conn, tcp);
                // The handshake now, so that a refused certificate is a connect error.
                let left = deadline.saturating_duration_since(Instant::now());
                set_timeouts(&s.sock, left)?;
                while s.conn.is_handshaking() {
                    s.conn.complete_io(&mut s.sock)?;
                }
                Stream::Tls(Box::new(s))
            }
        };
        Ok(Conn {
            io: BufReader::with_capacity(4096, stream),
        })
    }

    /// Sends one request and reads its reply, both by `deadline`. An error reply is a
    /// [`Value::Error`], not an `Err`.
    pub fn call(&mut self, args: &[&[u8]], deadline: Instant) -> io::Result<Value> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no time left"));
        }
        set_timeouts(self.io.get_ref().tcp(), left)?;
        let s = self.io.get_mut();
        s.write_all(&encode(args))?;
        s.flush()?;
        read_value(&mut self.io).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock => {
                io::Error::new(io::ErrorKind::TimedOut, "no answer in time")
            }
            _ => e,
        })
    }
}

impl Conn {
    /// A handle on the socket, to shut it down from another thread (which ends a blocked
    /// [`Conn::next`]).
    pub fn socket(&self) -> io::Result<TcpStream> {
        self.io.get_ref().tcp().try_clone()
    }

    /// Reads the next reply (a message on a subscribed connection) whenever it comes.
    pub fn next(&mut self) -> io::Result<Value> {
        self.io.get_ref().tcp().set_read_timeout(None)?;
        read_value(&mut self.io)
    }
}

fn set_timeouts(s: &TcpStream, left: Duration) -> io::Result<()> {
    let left = left.max(Duration::from_millis(1));
    s.set_read_timeout(Some(left))?;
    s.set_write_timeout(Some(left))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> io::Result<Value> {
        read_value(&mut BufReader::new(bytes))
    }

    #[test]
    fn requests_are_arrays_of_bulk_strings() {
        assert_eq!(
            encode(&[b"SET", b"k", b"v x", b"NX"]),
            b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv x\r\n$2\r\nNX\r\n"
        );
        assert_eq!(encode(&[b"PING"]), b"*1\r\n$4\r\nPING\r\n");
        assert_eq!(encode(&[b"GET", b""]), b"*2\r\n$3\r\nGET\r\n$0\r\n\r\n");
    }

    #[test]
    fn every_reply_type_parses() {
        assert_eq!(parse(b"+OK\r\n").unwrap(), Value::Simple("OK".into()));
        assert_eq!(
            parse(b"-WRONGPASS invalid\r\n").unwrap(),
            Value::Error("WRONGPASS invalid".into())
        );
        assert_eq!(parse(b":-3\r\n").unwrap(), Value::Int(-3));
        assert_eq!(parse(b"$-1\r\n").unwrap(), Value::Nil);
        assert_eq!(parse(b"*-1\r\n").unwrap(), Value::Nil);
        assert_eq!(
            parse(b"$5\r\na\r\nbc\r\n").unwrap(),
            Value::Bulk(b"a\r\nbc".to_vec())
        );
        assert_eq!(
            parse(b"*3\r\n:1\r\n$1\r\nx\r\n*0\r\n").unwrap(),
            Value::Array(vec![Value::Int(1), Value::Bulk(b"x".to_vec()), Value::Array(vec![])])
        );
    }

    #[test]
    fn broken_replies_are_errors_not_panics() {
        for b in [
            &b""[..],
            b"+OK",
            b"$3\r\nab\r\n",
            b"$3\r\nabcd\r\n",
            b"?x\r\n",
            b":x\r\n",
            b"*2\r\n:1\r\n",
            b"\r\n",
            b"$99999999999\r\n",
        ] {
            assert!(parse(b).is_err(), "{:?}", String::from_utf8_lossy(b));
        }
    }
}
