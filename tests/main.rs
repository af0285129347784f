//! One integration-test binary for the whole workspace, run against the real `locksmith`
//! binary with real files and real processes (ripgrep's layout: a commented `mod` list).

mod support;
// An embedded FTP server (libunftp) for the ftp backend's tests.
mod ftp_server;

// The pipe protocol: OK / ERROR lines byte for byte, and every release cause.
mod hold;
// Run mode: exit codes, environment, -E, CMD never outliving the lock.
mod run;
// Waiting: --wait 0, --wait D bounds, a waiter whose parent dies.
mod waiting;
// Several locks at once: all or none, one canonical order, one deadline, lost together.
mod several;
// Semaphores: --slots N (SPEC §3b).
mod slots;
// Fair queues: --fair (SPEC §3b).
mod fair;
// The seed's counter race and an exclusivity checker, with a negative control.
mod race;
// locksmith itself killed: proof of death on this host, stale_after for another host.
mod crash;
// Bad input: one ERROR line, the SPEC's exit code, nothing left behind.
mod bad_input;
// Shared locks: readers overlap, writers exclude and are not starved, seed 004's race.
mod shared;
// Fencing tokens and prev=crashed.
mod tokens;
// Fault injection: random kill -9 while many workers contend.
mod soak;
// The soak: every backend at once, kills of parents and locksmiths, FTP restarts and cuts.
mod faults;
// help, --version, the man pages and the shell completions (bash, fish, zsh).
mod docs;
// status, break, profiles.
mod inspect;
// The netlock client crate against the real helper.
mod client;
// profiles.example.toml stays valid.
mod example;
// Random malformed input never panics the helper or its parsers.
mod robustness;
// backend = "ftp" against the embedded server.
mod ftp;
// The same suite against real Debian servers: pure-ftpd and an unpacked vsftpd.
// Shared (reader) locks over FTP, against every server.
mod ftp_debian;
mod ftp_shared;
// backend = "postgres" against a throwaway PostgreSQL cluster.
mod postgres;
// backend = "etcd" against a throwaway etcd member.
mod etcd;
// backend = "s3" against a throwaway SeaweedFS server (and verify against s3s-fs).
mod s3;
// backend = "redis" against a throwaway redis-server.
mod redis;
// A build of the local backends only and its companion executable.
mod companion;
// mkdir, link, symlink and flock on a real network filesystem: sshfs mounted twice, contenders
// on both mounts and in another pid namespace (issue 12).
mod netfs;
// ftp, etcd, postgres and s3 under real network partitions (network and pid namespaces).
mod partition;
// Issue 15: hostile input — planted FIFOs and devices, endless files, a parent that does not
// read, a planted helper, values that would make root create a setuid file or spin.
mod hostile;
// Issue 15: a thousand waiters on one lock, and waiters where inotify cannot be had.
mod herd;
// The GlusterFS fixture itself: a private volume mounted twice, a file across the mounts.
mod fs2_smoke;
// `locksmith verify`: its report on a local directory, on sshfs and on GlusterFS (issue 12).
mod verify;
// Issue 14: lock addresses, flock(1)'s forms, `.netrc` / `.pgpass`, against every server.
mod addresses;
// Issue 25: locksmith under the name `flock` against util-linux's flock(1), form by form, and
// util-linux's own flock test script; flock(1)'s long options under locksmith's own name.
mod flock_compat;
// Issue 28: long paths, descriptor pressure, full and read-only disks, cleaners under a holder.
mod infra;
