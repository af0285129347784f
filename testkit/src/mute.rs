//! A TCP relay on loopback in front of a real server whose answers can be muted: while muted,
//! what the client sends still reaches the server (a write lands) and what the server sends
//! back is dropped (the client times out). For any protocol over TCP — a Redis `EVAL`, a
//! PostgreSQL query, etcd's gRPC — where [`crate::faulty`] (HTTP/1.1 only) does not fit: a
//! write that lands while its answer is lost, and a server that does not answer for a while.
//!
//! Bytes dropped mid-answer leave the client's stream broken: its next request on that
//! connection fails, as a client that timed out reconnects anyway.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// One relayed connection: its client side, its server side, and whether it was abandoned.
type Conn = (TcpStream, TcpStream, Arc<AtomicBool>);

pub struct Relay {
    port: u16,
    muted: Arc<AtomicBool>,
    /// While set, a new connection is closed as soon as it is accepted.
    refusing: Arc<AtomicBool>,
    /// Armed by [`Relay::fail_from`]: the bytes whose sending starts the failure.
    trigger: Arc<Mutex<Option<Vec<u8>>>>,
    /// Every connection so far (its client side, its server side), to
    /// [`cut`](Relay::cut) or [`abandon`](Relay::abandon) them.
    conns: Arc<Mutex<Vec<Conn>>>,
    /// The server sides of abandoned connections, kept open.
    kept: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    /// A relay to `upstream` on a free loopback port, serving until the test process ends.
    pub fn start(upstream: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let port = listener.local_addr().unwrap().port();
        let muted = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (m, all) = (Arc::clone(&muted), Arc::clone(&conns));
        let refusing = Arc::new(AtomicBool::new(false));
        let trigger: Arc<Mutex<Option<Vec<u8>>>> = Arc::new(Mutex::new(None));
        let (rf, tr) = (Arc::clone(&refusing), Arc::clone(&trigger));
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if rf.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let ab = Arc::new(AtomicBool::new(false));
                all.lock().unwrap().push((
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    Arc::clone(&ab),
                ));
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (ab1, ab2) = (Arc::clone(&ab), Arc::clone(&ab));
                let fail = Failing {
                    trigger: Arc::clone(&tr),
                    muted: Arc::clone(&m),
                    refusing: Arc::clone(&rf),
                };
                std::thread::spawn(move || pump(client, server, None, &ab1, Some(&fail)));
                let m = Arc::clone(&m);
                std::thread::spawn(move || pump(s2, c2, Some(m), &ab2, None));
            }
        });
        Relay {
            port,
            muted,
            conns,
            refusing,
            trigger,
            kept: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Arms a failure: once a client sends `needle` (e.g. an FTP command), that request is
    /// passed on (it lands) and from then on every answer is muted and every new connection
    /// closed at once — a server that went away just after taking a write — until
    /// [`Relay::restore`].
    pub fn fail_from(&self, needle: &[u8]) {
        *self.trigger.lock().unwrap() = Some(needle.to_vec());
    }

    /// Answers and new connections pass again.
    pub fn restore(&self) {
        *self.trigger.lock().unwrap() = None;
        self.refusing.store(false, Ordering::SeqCst);
        self.muted.store(false, Ordering::SeqCst);
    }

    /// Breaks every connection made so far (both sides see it close, as after a reset
    /// between them); new ones are relayed as before.
    pub fn cut(&self) {
        for (c, _, _) in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Breaks the client side of every connection made so far and keeps the server side
    /// open and silent: the client sees its connection close, the server a session that
    /// simply goes quiet (a half-open connection, as after a network cut it has not noticed
    /// yet). Connections made afterwards are relayed as before.
    pub fn abandon(&self) {
        for (c, srv, ab) in self.conns.lock().unwrap().drain(..) {
            ab.store(true, Ordering::SeqCst);
            self.kept.lock().unwrap().push(srv);
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// The relay's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Mutes (`true`) or unmutes the server's answers, on every connection.
    pub fn mute(&self, on: bool) {
        self.muted.store(on, Ordering::SeqCst);
    }
}

/// What a client→server pump watches for ([`Relay::fail_from`]).
struct Failing {
    trigger: Arc<Mutex<Option<Vec<u8>>>>,
    muted: Arc<AtomicBool>,
    refusing: Arc<AtomicBool>,
}

impl Failing {
    /// Fires if `sent` holds the armed needle.
    fn saw(&self, sent: &[u8]) {
        let mut t = self.trigger.lock().unwrap();
        if let Some(needle) = t.as_ref()
            && sent.windows(needle.len()).any(|w| w == needle.as_slice())
        {
            self.muted.store(true, Ordering::SeqCst);
            self.refusing.store(true, Ordering::SeqCst);
            *t = None;
        }
    }
}

/// Copies `from` to `to` until either closes; while `muted`, what is read is dropped. When a
/// connection ends while `abandoned`, its server side is left alone. `fail`: what a
/// client→server pump watches for.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    muted: Option<Arc<AtomicBool>>,
    abandoned: &AtomicBool,
    fail: Option<&Failing>,
) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(f) = fail {
            f.saw(&buf[..n]);
        }
        if muted.as_ref().is_some_and(|m| m.load(Ordering::SeqCst)) {
            continue;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    if abandoned.load(Ordering::SeqCst) {
        // Our descriptors close; the kept clone holds the server side open.
        return;
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
