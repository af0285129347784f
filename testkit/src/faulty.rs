//! A fault-injecting HTTP/1.1 proxy on loopback, in front of a real server (the s3 tests put
//! it before SeaweedFS): every request is passed on as it came, except the ONE that matches
//! an armed [`Fault`], which gets the fault instead. For answers no real server gives on
//! demand (409 `ConditionalRequestConflict` is a race inside AWS; 501 is a server without
//! conditional writes) and for a write that lands while its answer is lost.
//!
//! Plain HTTP only, one request at a time per connection, requests with a `Content-Length`
//! body (what the helper's client sends). Each request goes upstream on a fresh connection
//! with `Connection: close` (an unsigned header: a SigV4 signature still holds), and the whole
//! answer is relayed once the server closes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the matching request gets.
#[derive(Clone, Debug)]
pub enum Then {
    /// This answer, raw status and S3 error code, without the server seeing the request.
    Answer(u16, &'static str),
    /// Passed on (so it takes effect on the server), its answer dropped; the client's
    /// connection is then left silent until the client closes it (a timeout, for it).
    Swallow,
}

/// A one-shot fault: the first request whose method is `method` and whose path (bucket
/// included, no query) ends with `path` gets `then` — if `header`, only a request that
/// carries that header (lower case, e.g. `if-none-match`).
#[derive(Clone, Debug)]
pub struct Fault {
    pub method: &'static str,
    pub path: String,
    pub header: Option<&'static str>,
    pub then: Then,
}

#[derive(Default)]
struct State {
    armed: Vec<Fault>,
    /// The faults that fired, as `METHOD path`.
    fired: Vec<String>,
}

pub struct Proxy {
    port: u16,
    state: Arc<Mutex<State>>,
}

impl Proxy {
    /// A proxy to `upstream` on a free loopback port, serving until the test process ends.
    pub fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State::default()));
        let st = Arc::clone(&state);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let st = Arc::clone(&st);
                std::thread::spawn(move || serve(conn, upstream, &st));
            }
        });
        Proxy { port, state }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Arms `f` (after those armed before it).
    pub fn arm(&self, f: Fault) {
        self.state.lock().unwrap().armed.push(f);
    }

    /// The faults that fired so far, as `METHOD path`.
    pub fn fired(&self) -> Vec<String> {
        self.state.lock().unwrap().fired.clone()
    }
}

/// One request read from a client: its head's lines and its body.
struct Request {
    line: String,
    headers: Vec<String>,
    body: Vec<u8>,
}

fn read_request(r: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end().to_string();
        if h.is_empty() {
            break;
        }
        headers.push(h);
    }
    let len = headers
        .iter()
        .find_map(|h| {
            let (k, v) = h.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some(Request {
        line: line.trim_end().to_string(),
        headers,
        body,
    })
}

fn serve(client: TcpStream, upstream: SocketAddr, st: &Mutex<State>) {
    let mut out = client.try_clone().unwrap();
    let mut r = BufReader::new(client);
    while let Some(req) = read_request(&mut r) {
        let mut parts = req.line.split(' ');
        let method = parts.next().unwrap_or("").to_string();
        let path = parts
            .next()
            .unwrap_or("")
            .split('?')
            .next()
            .unwrap_or("")
            .to_string();
        let has = |name: &str| {
            req.headers.iter().any(|h| {
                h.split_once(':')
                    .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case(name))
            })
        };
        let fault = {
            let mut s = st.lock().unwrap();
            let i = s.armed.iter().position(|f| {
                f.method == method && path.ends_with(&f.path) && f.header.is_none_or(has)
            });
            let f = i.map(|i| s.armed.remove(i));
            if f.is_some() {
                s.fired.push(format!("{method} {path}"));
            }
            f
        };
        match fault.map(|f| f.then) {
            Some(Then::Answer(status, code)) => {
                let body = format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>injected by the test proxy</Message></Error>"
                );
                let head = format!(
                    "HTTP/1.1 {status} Injected\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                if out.write_all(head.as_bytes()).is_err()
                    || out.write_all(body.as_bytes()).is_err()
                {
                    return;
                }
            }
            Some(Then::Swallow) => {
                let _ = forward(&req, upstream);
                // Silent until the client gives up and closes.
                let mut sink = [0u8; 1024];
                while matches!(r.get_mut().read(&mut sink), Ok(n) if n > 0) {}
                return;
            }
            None => {
                let Ok(answer) = forward(&req, upstream) else {
                    return;
                };
                if out.write_all(&answer).is_err() {
                    return;
                }
            }
        }
    }
}

/// Sends `req` upstream on a connection of its own and returns the whole answer.
fn forward(req: &Request, upstream: SocketAddr) -> std::io::Result<Vec<u8>> {
    let mut up = TcpStream::connect_timeout(&upstream, Duration::from_secs(5))?;
    let mut head = format!("{}\r\n", req.line);
    for h in req.headers.iter().filter(|h| {
        !h.split_once(':')
            .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("connection"))
    }) {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("Connection: close\r\n\r\n");
    up.write_all(head.as_bytes())?;
    up.write_all(&req.body)?;
    let mut answer = Vec::new();
    up.read_to_end(&mut answer)?;
    Ok(answer)
}
