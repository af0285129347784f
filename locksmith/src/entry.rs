// The body of both executables, `locksmith` (src/main.rs) and its companion `locksmith-net`
// (src/bin/locksmith-net.rs, every backend; `locksmith_helper::companion`): included by each,
// so that each has its own C `main` (a `#[no_mangle]` item of the library would not be).

use locksmith_helper::cli::{self, Command, doc, usage};
use locksmith_helper::{commands, log, protocol};

// SAFETY: `main` is the one C entry point of this executable (`#![no_main]`: std defines
// none); glibc calls it once, with the arguments std reads by itself.
#[cfg(not(test))]
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    locksmith_helper::sys::init_process();
    locksmith_helper::companion::allow();
    let code = run();
    std::process::exit(code.into())
}

// SAFETY: no other `pow` is defined in this executable; this one is the C function's
// contract (libm's, ported to Rust by the `libm` crate). Its one caller is tokio's
// multi-thread scheduler (etcd's runtime: a poll-time average); defined here, the binary no
// longer loads libm.so at every start (issue 29: one shared library less, 312 KiB of RSS).
#[cfg(feature = "etcd")]
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
extern "C" fn pow(x: f64, y: f64) -> f64 {
    libm::pow(x, y)
}

#[cfg_attr(test, allow(dead_code))]
fn run() -> u8 {
    // Backoff jitter must differ between helpers started together (fastrand's own seed is
    // the clock; see host::random_u64).
    fastrand::seed(locksmith_helper::host::random_u64());
    let mut argv = std::env::args_os();
    let name = argv.next();
    let args: Vec<_> = argv.collect();
    // Under the name `flock` (a symlink or a copy): util-linux's flock(1) (SPEC §3c).
    if let Some(name) = &name
        && std::path::Path::new(name)
            .file_name()
            .is_some_and(|n| n == "flock")
    {
        return locksmith_helper::flock1::main(name, args) as u8;
    }
    if let Some(level) = std::env::var("LOCKSMITH_LOG")
        .ok()
        .and_then(|v| log::level_from_env(&v))
    {
        log::set_level(level);
    }
    let cli = match cli::parse(args.clone()) {
        Ok(cli) => cli,
        Err(e) => {
            protocol::error(&e, cli::looks_like_hold(&args));
            return e.kind().exit_code() as u8;
        }
    };
    if cli.quiet {
        log::set_level(log::QUIET);
    } else if cli.verbose > 0 {
        log::set_level(log::NORMAL + cli.verbose);
    }
    let on_stdout = cli.command.errors_on_stdout();
    let text = match &cli.command {
        Command::Help { topic: None } => Some(doc::help()),
        Command::Help { topic: Some(t) } => Some(doc::help_for(
            usage::subcommand(t).expect("checked by cli::parse"),
        )),
        Command::Version => Some(doc::version()),
        Command::Generate { kind } => Some(match kind.as_str() {
            "man" => doc::man(),
            "man-profiles" => doc::man_profiles(),
            "complete-bash" => doc::bash(),
            "complete-zsh" => doc::zsh(),
            "complete-fish" => doc::fish(),
            _ => unreachable!("checked by cli::parse"),
        }),
        _ => None,
    };
    let result = match text {
        Some(text) => protocol::report(&text)
            .map(|_| 0)
            .map_err(|e| locksmith_helper::error::Error::io("writing help", e)),
        None => commands::dispatch(&cli),
    };
    match result {
        Ok(code) => code as u8,
        Err(e) => {
            if on_stdout {
                // Nothing is held now: a parent that does not read must not keep us in
                // write(2) beyond a SIGTERM (issue 15).
                locksmith_helper::sys::default_termination_signals();
            }
            protocol::error(&e, on_stdout);
            e.kind().exit_code() as u8
        }
    }
}
