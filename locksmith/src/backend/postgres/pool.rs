//! **Sessions reused within a process.** A fair waiter on PostgreSQL looks at the places
//! ahead of it one backend each, lists its line, reads who holds a place while its thread
//! waits on it, and takes the lock at the head: a session each, 11 new sessions per
//! `--fair run` with 8 contenders (each a server process forked, and authentication) where
//! a plain run opens one — 551 ms p50 against 94 (issue 26); 4.1 and 307 ms with this pool.
//! A backend that drops with an idle session holding nothing (it only looked, or gave its
//! lock back) leaves it here, and the next backend of this process with the same server,
//! role, database, TLS and timing takes it instead of connecting, after one request that drops
//! any advisory lock and token it showed. Sessions are kept only while a backend of this
//! process still looks or waits: the last one done (it holds its lock, or drops), the idle
//! ones are closed — a holder keeps no session but its lock's.

use postgres::Client;

/// The idle sessions of a process, and how many backends still look or wait; `K` says which
/// sessions are interchangeable (`Postgres::pool_key`). One static of it, in `postgres.rs`.
pub struct Pool<K> {
    looking: usize,
    idle: Vec<(K, Client, Option<i32>)>,
}

impl<K: PartialEq> Pool<K> {
    pub const fn new() -> Pool<K> {
        Pool {
            looking: 0,
            idle: Vec::new(),
        }
    }

    /// A backend starts looking.
    pub fn looking(&mut self) {
        self.looking += 1;
    }

    /// A backend stopped looking: the last one takes the idle sessions, to close them (outside
    /// the pool's lock).
    #[must_use]
    pub fn done_looking(&mut self) -> Vec<(K, Client, Option<i32>)> {
        self.looking = self.looking.saturating_sub(1);
        if self.looking == 0 {
            std::mem::take(&mut self.idle)
        } else {
            Vec::new()
        }
    }

    /// Keeps `client` if a backend still looks; else gives it back, to close.
    pub fn put(&mut self, key: K, client: Client, session: Option<i32>) -> Option<Client> {
        if self.looking == 0 {
            return Some(client);
        }
        self.idle.push((key, client, session));
        None
    }

    /// An idle session for `key`, the latest kept, with its server pid.
    pub fn take(&mut self, key: &K) -> Option<(Client, Option<i32>)> {
        let i = self.idle.iter().rposition(|(k, _, _)| k == key)?;
        let (_, c, s) = self.idle.swap_remove(i);
        Some((c, s))
    }
}
