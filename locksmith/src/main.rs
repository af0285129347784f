//! `locksmith`: parse → load the profile → act → map to an exit code.
//!
//! The entry point is the C `main`, not std's: std's start-up shim reads `/proc/self/maps` at
//! every start (glibc's `pthread_getattr_np`, for the main thread's stack-overflow guard) and
//! sets up an alternate signal stack — ~0.1 ms of a 0.9 ms start here (issue 29). What the
//! shim did that locksmith relies on is done in [`locksmith_helper::sys::init_process`]: descriptors 0–2 opened
//! on `/dev/null` when closed, SIGPIPE ignored. `process::exit` flushes stdout as std's exit
//! path does. Lost: std's "stack overflow" message (an overflow is a plain SIGSEGV).
// The test harness brings its own `main` (cargo test builds this target too).
#![cfg_attr(not(test), no_main)]

include!("entry.rs");
