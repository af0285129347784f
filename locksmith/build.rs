//! Links the `locksmith` executable at a fixed address (`-no-pie`) and with a static unwinder
//! on Linux with the GNU toolchain (issue 29).
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
//!
//! It also links GCC's unwinder statically (`libgcc_eh.a`, found with `cc
//! -print-file-name`), ahead of std's `-lgcc_s`, so the executable needs no libgcc_s.so: every
//! shared library is opened, mapped and relocated at every start, and this one only serves
//! panics and backtraces (release panics abort). With libm gone too (`main.rs`'s `pow`) the
//! helper loads libc alone: `locksmith --version` 0.867 → 0.757 ms (flock --version 0.939 ms
//! beside it, A/B alternated 800×), RSS at OK 4282 → 4194 KiB. Where `libgcc_eh.a` is not
//! found, std's dynamic libgcc_s is linked as before. Unwinding (`catch_unwind`, the test
//! harness) and `RUST_BACKTRACE` work the same with the static unwinder.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-no-pie");
        if let Some(dir) = libgcc_eh_dir() {
            println!("cargo:rustc-link-search=native={dir}");
            println!("cargo:rustc-link-lib=static:-bundle=gcc_eh");
        }
    }
}

/// The directory of GCC's static unwinder `libgcc_eh.a`, as the C compiler says.
fn libgcc_eh_dir() -> Option<String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()?;
    let path = std::path::PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    if !path.is_absolute() || !path.is_file() {
        return None;
    }
    Some(path.parent()?.to_str()?.to_string())
}
