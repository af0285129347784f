//! `locksmith-net`: the companion of a `locksmith` built with the local backends only (the
//! Debian package's), which executes it in its own place for a lock of any other backend
//! (`locksmith_helper::companion`). Built with every backend (cargo feature `companion`);
//! otherwise the same program as `locksmith`.
#![cfg_attr(not(test), no_main)]

include!("../entry.rs");
