//! Links the `locksmith` executable at a fixed address (`-no-pie`) on Linux with the GNU
//! toolchain (issue 29).
//!
//! A position-independent executable is relocated by the loader at every start: ~12,900
//! relative relocations here, which write into every page of `.data.rel.ro` (244 KB of
//! vtables, string tables and panic locations) and so copy each of them privately. For a
//! helper that lives as long as the lock it holds, that is most of its private memory
//! (0.39 → 0.15 MiB private dirty at OK, measured by `/proc/PID/smaps_rollup`) and a tenth of
//! its start-up. What is given up: the randomised address of the executable's own image
//! (libraries, stack, heap and mappings stay randomised); locksmith is not setuid and parses
//! what servers send in safe Rust. The code itself stays position-independent (only the final
//! link changes), so the dependencies are built as before.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
}
