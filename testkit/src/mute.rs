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
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct Relay {
    port: u16,
    muted: Arc<AtomicBool>,
}

impl Relay {
    /// A relay to `upstream` on a free loopback port, serving until the test process ends.
    pub fn start(upstream: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let port = listener.local_addr().unwrap().port();
        let muted = Arc::new(AtomicBool::new(false));
        let m = Arc::clone(&muted);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pump(client, server, None));
                let m = Arc::clone(&m);
                std::thread::spawn(move || pump(s2, c2, Some(m)));
            }
        });
        Relay { port, muted }
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

/// Copies `from` to `to` until either closes; while `muted`, what is read is dropped.
fn pump(mut from: TcpStream, mut to: TcpStream, muted: Option<Arc<AtomicBool>>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if muted.as_ref().is_some_and(|m| m.load(Ordering::SeqCst)) {
            continue;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
