//! `locksmith-bench`: locksmith side by side with flock(1) (and lockfile-progs / dotlockfile
//! where installed), in one run, alternating the order of the tools every iteration so that
//! machine noise falls on all of them alike. See `bench/README.md` for what each metric
//! measures and why the flock(1) equivalents are fair.
//!
//! ```text
//! cargo run --release -p locksmith-bench [-- --runs N] [--quick]
//! ```
// The report *is* this program's output: stdout here is a terminal or a file for humans, not
// the pipe protocol that the workspace lints protect (they exist for locksmith's stdout).
#![allow(clippy::print_stdout)]
// clippy.toml disallows `std::io::stdout` for the same protocol reason; the bench's hidden
// `__hold-parent` mode writes its child's OK line to its own stdout on purpose.
#![allow(clippy::disallowed_methods)]

mod report;
mod scenarios;
mod servers;
mod stats;

use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use scenarios::{Ctx, Flock1Wait, Rival};
use testkit::postgres::Pg;
use testkit::proc::{self, Result};
use testkit::redis::Redis;
use testkit::sshfs::Sshfs;

/// The local backends' profiles (see `scenarios::Ctx::new`).
const LOCAL: [&str; 4] = ["f", "m", "l", "s"];
/// Those that take shared locks.
const SHARING: [&str; 2] = ["f", "s"];

fn has_filelock() -> bool {
    Command::new("python3")
        .args(["-c", "import filelock"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
use stats::{Ratio, Row, Samples, Unit};

const USAGE: &str = "\
locksmith-bench - locksmith side by side with flock(1), alternating, medians with min-max

Usage: cargo run --release -p locksmith-bench -- [OPTIONS]

Options:
  --runs N           measured runs per metric and tool [default: 30; 10 with --quick]
  --quick            short run while developing: 10 runs, 2 s wakeup window
  --window SECS      wakeup-counting window while holding [default: 10; 2 with --quick]
  --slow-runs N      runs of the dot-lock rivals' handoff (they poll: seconds each) [default: 5]
  --out DIR          also write bench.json, latency.svg and BENCHMARKS.md there
                     [default: target/bench]
  --ftp              also the FTP section (bench/ftp-vs-seed.sh: a private pure-ftpd, the
                     seed's Perl helper beside locksmith; needs root)
  --pg               also the PostgreSQL section (a throwaway cluster on 127.0.0.1, backend
                     `postgres` beside flock(1); needs root and the postgres user)
  --redis            also the Redis section (a throwaway Debian redis-server on 127.0.0.1,
                     backend `redis` beside flock(1))
  --etcd             the etcd section: bench/etcd-vs-etcdctl.sh (a private etcd member;
                     `etcdctl lock` beside locksmith's etcd backend)
  --s3               the s3 section: bench/s3-seaweedfs.sh (a private SeaweedFS `weed mini`;
                     spawn -> OK, handoff, crash release, helper SIGKILLed)
  --sshfs            also the network-filesystem section: a directory served by OpenSSH's
                     sftp-server behind socat on 127.0.0.1, mounted twice with sshfs (two
                     mounts, own caches each: two hosts). mkdir/link/symlink (cache_time 1s)
                     and flock (local = true) beside `flock F true` on the mount: full cycle;
                     handoff mount a -> mount b; holder SIGKILLed on a -> waiter on b holds,
                     checked against SPEC §6's window (earlier = FAILURE in the notes). Needs
                     sshfs, socat, sftp-server, fusermount3, /dev/fuse (else skipped with a
                     note) and root; unmounts and stops its servers at the end, also on error
  --sshfs-only       only the --sshfs section (it has its own local-disk reference rows):
                     ~5 min with --runs 10
  --locksmith PATH   the locksmith binary [default: $LOCKSMITH_BIN, else build it with
                     `cargo build --release -p locksmith-helper` and use target/release/locksmith]
  -h, --help         this text
";

struct Args {
    runs: usize,
    slow_runs: usize,
    window: Duration,
    locksmith: Option<PathBuf>,
    out: PathBuf,
    ftp: bool,
    pg: bool,
    redis: bool,
    etcd: bool,
    s3: bool,
    sshfs: bool,
    sshfs_only: bool,
}

fn parse_args(mut it: impl Iterator<Item = OsString>) -> Result<Option<Args>> {
    let mut runs = None;
    let mut window = None;
    let mut quick = false;
    let mut locksmith = None;
    let mut slow_runs = 5;
    let mut out = None;
    let mut ftp = false;
    let mut pg = false;
    let mut redis = false;
    let mut etcd = false;
    let mut s3 = false;
    let mut sshfs = false;
    let mut sshfs_only = false;
    while let Some(a) = it.next() {
        let a = a.to_string_lossy().into_owned();
        let mut value = |name: &str| -> Result<String> {
            it.next()
                .map(|v| v.to_string_lossy().into_owned())
                .ok_or(format!("{name} needs a value"))
        };
        match a.as_str() {
            "--runs" => {
                let n: usize = value("--runs")?
                    .parse()
                    .map_err(|e| format!("--runs: {e}"))?;
                if n == 0 {
                    return Err("--runs must be at least 1".into());
                }
                runs = Some(n);
            }
            "--window" => {
                let s: f64 = value("--window")?
                    .parse()
                    .map_err(|e| format!("--window: {e}"))?;
                if !(0.1..=600.0).contains(&s) {
                    return Err("--window must be between 0.1 and 600 seconds".into());
                }
                window = Some(Duration::from_secs_f64(s));
            }
            "--quick" => quick = true,
            "--ftp" => ftp = true,
            "--pg" => pg = true,
            "--redis" => redis = true,
            "--etcd" => etcd = true,
            "--s3" => s3 = true,
            "--sshfs" => sshfs = true,
            "--sshfs-only" => (sshfs, sshfs_only) = (true, true),
            "--slow-runs" => {
                slow_runs = value("--slow-runs")?
                    .parse()
                    .map_err(|e| format!("--slow-runs: {e}"))?;
            }
            "--out" => out = Some(PathBuf::from(value("--out")?)),
            "--locksmith" => locksmith = Some(PathBuf::from(value("--locksmith")?)),
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(None);
            }
            other => return Err(format!("unknown argument `{other}` (see --help)")),
        }
    }
    Ok(Some(Args {
        slow_runs,
        out: out.unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .map_or_else(|| PathBuf::from("target"), |w| w.join("target"))
                .join("bench")
        }),
        ftp,
        pg,
        redis,
        etcd,
        s3,
        sshfs,
        sshfs_only,
        runs: runs.unwrap_or(if quick { 10 } else { 30 }),
        window: window.unwrap_or(Duration::from_secs(if quick { 2 } else { 10 })),
        locksmith,
    }))
}

fn main() -> ExitCode {
    let mut argv = std::env::args_os().skip(1).peekable();
    if argv.peek().is_some_and(|a| a == scenarios::HOLD_PARENT) {
        argv.next();
        return hold_parent(argv.collect());
    }
    let args = match parse_args(argv) {
        Ok(Some(a)) => a,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("locksmith-bench: {e}");
            return ExitCode::from(64);
        }
    };
    match bench(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("locksmith-bench: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The hidden parent of the crash-release measurement: spawns locksmith (hold mode) with
/// its stdout on a pipe that only this process reads, relays the OK line and locksmith's
/// pid to the bench, then blocks until the bench kills it (or closes our stdin).
fn hold_parent(cmd: Vec<OsString>) -> ExitCode {
    let Some((prog, args)) = cmd.split_first() else {
        return ExitCode::from(64);
    };
    let mut child = match Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("locksmith-bench parent: cannot spawn: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut pipe = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    let _ = pipe.read_line(&mut line);
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", line.trim_end());
        let _ = writeln!(out, "pid {}", child.id());
        let _ = out.flush();
    }
    // Hold until the bench closes our stdin (or SIGKILLs us: the case measured).
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    drop(pipe);
    let _ = child.wait();
    ExitCode::SUCCESS
}

/// A private directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "locksmith-bench.{}.{nanos:08x}",
            std::process::id()
        ));
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A server section the user asked for (`on`): started, or skipped with a note saying why.
fn optional<T, E: std::fmt::Display>(
    on: bool,
    what: &str,
    notes: &mut Vec<String>,
    start: impl FnOnce() -> std::result::Result<T, E>,
) -> Option<T> {
    if !on {
        return None;
    }
    start()
        .map_err(|e| notes.push(format!("{what} section skipped: {e}")))
        .ok()
}

/// Writes a just-built binary's pages back to disk before anything is measured: the kernel
/// counts a mapped page that is still dirty in the page cache as the process's own
/// (`Private_Dirty` in smaps), so a holder of a binary linked seconds ago read 2.6–3.0 MiB
/// of private dirty memory instead of 0.16 MiB (measured: `cp` of the binary, then at once
/// 3.0 MiB; after `sync` 0.15 MiB).
fn write_back(bin: &Path) {
    if let Err(e) = fs::File::open(bin).and_then(|f| f.sync_all()) {
        eprintln!(
            "locksmith-bench: cannot write {} back ({e}): its memory may read high",
            bin.display()
        );
    }
}

fn find_locksmith(arg: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = arg
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("LOCKSMITH_BIN").map(PathBuf::from))
    {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("no locksmith binary at {}", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let target = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("cannot find the target directory")?;
    let bin = target.join("release").join("locksmith");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("no workspace directory")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("locksmith-bench: cargo build --release -p locksmith-helper");
    let st = Command::new(&cargo)
        .args(["build", "--release", "-p", "locksmith-helper"])
        .current_dir(workspace)
        .stdin(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run {}: {e}", cargo.to_string_lossy()))?;
    if !st.success() {
        return Err(format!("building locksmith failed ({st})"));
    }
    if !bin.is_file() {
        return Err(format!(
            "built, but no binary at {} (CARGO_TARGET_DIR elsewhere? use --locksmith PATH)",
            bin.display()
        ));
    }
    Ok(bin)
}

fn read_trim(path: &str) -> String {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "?".into())
}

/// A tool in an alternating comparison: a name and one run (its argument says whether the
/// run is recorded, i.e. not the warm-up).
pub struct Tool<'a> {
    pub name: String,
    pub run: Box<dyn FnMut(bool) -> Result<Duration> + 'a>,
}

/// Runs every tool once per iteration, rotating the order each iteration, after one
/// unrecorded warm-up iteration. Returns each tool's samples in milliseconds.
fn alternate(metric: &str, runs: usize, tools: &mut [Tool<'_>]) -> Result<Vec<Samples>> {
    let k = tools.len();
    let mut out = vec![Samples::default(); k];
    let started = Instant::now();
    eprint!("locksmith-bench: {metric}: ");
    for i in 0..=runs {
        for j in 0..k {
            let t = (i + j) % k;
            let d =
                (tools[t].run)(i > 0).map_err(|e| format!("{metric}, {}: {e}", tools[t].name))?;
            if i > 0 {
                out[t].push(d.as_secs_f64() * 1e3);
            }
        }
        if i % 10 == 0 {
            eprint!(".");
        }
    }
    eprintln!(" {:.1} s", started.elapsed().as_secs_f64());
    Ok(out)
}

fn rows(metric: &str, tools: &[Tool<'_>], samples: Vec<Samples>, reference: usize) -> Vec<Row> {
    let r = samples[reference].median();
    tools
        .iter()
        .zip(samples)
        .enumerate()
        .map(|(i, (t, s))| Row {
            metric: metric.into(),
            tool: t.name.clone(),
            unit: Unit::Ms,
            samples: s,
            ratio: if i == reference {
                Ratio::IsReference
            } else {
                Ratio::Vs(r)
            },
        })
        .collect()
}

fn bench(args: &Args) -> Result<()> {
    proc::start_watchdog();
    for tool in ["flock", "stdbuf", "kill"] {
        if proc::on_path(tool).is_none() {
            return Err(format!(
                "`{tool}` is not on PATH (util-linux / coreutils / procps): the reference needs it"
            ));
        }
    }
    let locksmith = find_locksmith(args.locksmith.as_deref())?;
    write_back(&locksmith);
    let dir = TempDir::new()?;
    // The PostgreSQL cluster first: its profile goes into the one profiles file.
    let mut net_notes: Vec<String> = Vec::new();
    let pg = optional(args.pg, "PostgreSQL", &mut net_notes, Pg::start_trusting);
    let redis = optional(args.redis, "Redis", &mut net_notes, Redis::start);
    // The sshfs mounts likewise (unmounted when `sshfs` drops, also on an error).
    if args.sshfs {
        eprintln!("locksmith-bench: serving a directory over SFTP, mounting it twice (sshfs)");
    }
    let sshfs = optional(args.sshfs, "sshfs", &mut net_notes, Sshfs::start);
    let mut ctx = Ctx::new(
        locksmith.clone(),
        dir.0.clone(),
        &(pg.as_ref().map(servers::pg_profiles).unwrap_or_default()
            + &redis
                .as_ref()
                .map(servers::redis_profiles)
                .unwrap_or_default()
            + &sshfs
                .as_ref()
                .map(servers::sshfs_profiles)
                .unwrap_or_default()),
    )?;
    if let Some(fx) = &sshfs {
        ctx = ctx.with_netfs_server(fx.server.clone());
    }
    let load_before = read_trim("/proc/loadavg");

    let mut skipped = Vec::new();
    let (mut table, hold) = if args.sshfs_only {
        (Vec::new(), None)
    } else {
        let (t, h) = local_rows(&ctx, args, &mut skipped, &mut net_notes)?;
        (t, Some(h))
    };

    // ---- PostgreSQL and Redis: each backend beside flock(1), same loop ----------------------
    if let Some(pg) = &pg {
        let m = format!("{}, TCP loopback", pg.version());
        table.extend(server_rows(
            &ctx,
            "postgres",
            "pg",
            "connect, pg_advisory_lock",
            &m,
            args.runs,
        )?);
    }
    if redis.is_some() {
        let m = format!("{}, TCP loopback", Redis::version());
        table.extend(server_rows(
            &ctx,
            "redis",
            "rd",
            "connect, SET NX PX script",
            &m,
            args.runs,
        )?);
    }
    if args.etcd {
        match etcd_rows(&locksmith, args) {
            Ok(r) => table.extend(r),
            Err(e) => net_notes.push(format!("etcd section failed: {e}")),
        }
    }
    if args.s3 {
        match s3_rows(&locksmith, args) {
            Ok(r) => table.extend(r),
            Err(e) => net_notes.push(format!("s3 section failed: {e}")),
        }
    }

    if let Some(fx) = &sshfs {
        table.extend(sshfs_rows(&ctx, fx, args, &mut net_notes)?);
    }

    let load_after = read_trim("/proc/loadavg");

    // ---- FTP: locksmith beside the seed's Perl helper, on a private pure-ftpd ---------------
    let mut ftp_note = None;
    if args.ftp {
        match ftp_rows(&locksmith, args) {
            Ok(r) => table.extend(r),
            Err(e) => ftp_note = Some(format!("FTP section failed: {e}")),
        }
    }

    // ---- report ---------------------------------------------------------------------------
    let mut head = String::new();
    let _ = writeln!(
        head,
        "{} measured runs per metric and tool (plus one warm-up; {} for the dot-lock rivals' handoff), order of tools rotated every run.",
        args.runs, args.slow_runs
    );
    let _ = writeln!(
        head,
        "machine: {} CPU(s), {}, kernel {}; load average before: {load_before}; after: {load_after}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model(),
        read_trim("/proc/sys/kernel/osrelease"),
    );
    let _ = writeln!(
        head,
        "locksmith: {} ({}); {}",
        locksmith.display(),
        proc::first_line_of(&locksmith.to_string_lossy(), &["--version"])
            .unwrap_or_else(|| "?".into()),
        proc::first_line_of("flock", &["--version"]).unwrap_or_else(|| "flock ?".into()),
    );
    let _ = writeln!(
        head,
        "times: median and min – max in ms; ratio = median / the metric's reference median"
    );
    let targets = targets(&table, hold.as_ref());
    let mut notes: Vec<String> = skipped.iter().map(|s| s.to_string()).collect();
    if let Some(hold) = &hold {
        notes.push(format!(
            "threads while holding: {}",
            hold.rows
                .iter()
                .map(|h| format!("{} {}", h.name, h.threads))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    notes.extend(ctx.leftovers());
    notes.extend(ctx.take_notes());
    notes.extend(ftp_note);
    notes.extend(net_notes);
    println!("# locksmith-bench");
    println!();
    print!("{head}");
    println!();
    print!("{}", stats::table(&table));
    println!();
    if !targets.is_empty() {
        print!("{targets}");
        println!();
    }
    println!("notes:");
    for n in &notes {
        println!("- {n}");
    }
    fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let date = proc::first_line_of("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();
    for (name, text) in [
        ("bench.json", report::json(&table, &head, &date)),
        ("latency.svg", report::svg(&table)),
        (
            "BENCHMARKS.md",
            report::markdown(&table, &head, &targets, &notes, &date),
        ),
    ] {
        let path = args.out.join(name);
        fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    eprintln!(
        "locksmith-bench: wrote bench.json, latency.svg and BENCHMARKS.md to {}",
        args.out.display()
    );
    Ok(())
}

/// The local-disk sections (everything but the network ones): full cycle, spawn → OK,
/// handoff, crash release, helper killed, races, herds, RSS and wakeups while holding.
fn local_rows(
    ctx: &Ctx,
    args: &Args,
    skipped: &mut Vec<&'static str>,
    net_notes: &mut Vec<String>,
) -> Result<(Vec<Row>, scenarios::Holding)> {
    // ---- 1. full cycle -------------------------------------------------------------------
    // Ten times the runs of the other sections: a run is 2 ms, the ratios asked of it are
    // within a few percent, and 30 runs of a spread of ±25% left the median ±4% from run to
    // run of the bench (issue 29: 0.95-1.02x over five runs of the same binaries).
    let cycle_runs = args.runs * 10;
    let mut cycle_tools: Vec<Tool<'_>> = vec![
        Tool {
            name: "flock F true".into(),
            run: Box::new(|_| ctx.cycle_flock1()),
        },
        Tool {
            name: "true (spawn+reap floor)".into(),
            run: Box::new(|_| ctx.cycle_true()),
        },
        Tool {
            name: "locksmith F true (flock(1)'s form: no token)".into(),
            run: Box::new(|_| ctx.cycle_locksmith_flock_form()),
        },
    ];
    let c = ctx;
    for b in LOCAL {
        cycle_tools.push(Tool {
            name: format!("locksmith run {b} -- true"),
            run: Box::new(move |_| c.cycle_locksmith(b)),
        });
    }
    // Several locks at once (SPEC §3b): what each more lock costs.
    for set in [&["f", "m"][..], &LOCAL[..]] {
        cycle_tools.push(Tool {
            name: format!("locksmith run {} -- true (several locks)", set.join(" ")),
            run: Box::new(move |_| c.cycle_locksmith_set(set)),
        });
    }
    if proc::on_path("lockfile-create").is_some() && proc::on_path("lockfile-remove").is_some() {
        cycle_tools.push(Tool {
            name: "lockfile-create; true; lockfile-remove".into(),
            run: Box::new(|_| ctx.cycle_lockfile_progs()),
        });
    } else {
        skipped.push("lockfile-progs (lockfile-create) is not installed: skipped");
    }
    if proc::on_path("dotlockfile").is_some() {
        cycle_tools.push(Tool {
            name: "dotlockfile -l; true; dotlockfile -u".into(),
            run: Box::new(|_| ctx.cycle_dotlockfile()),
        });
    } else {
        skipped.push("dotlockfile (liblockfile-bin) is not installed: skipped");
    }
    let filelock = has_filelock();
    if filelock {
        cycle_tools.push(Tool {
            name: "python3 filelock: lock; unlock (interpreter start included)".into(),
            run: Box::new(|_| ctx.cycle_filelock()),
        });
    } else {
        skipped.push("Python filelock is not installed (pip install filelock): skipped");
    }
    let s = alternate("full cycle", cycle_runs, &mut cycle_tools)?;
    let mut table = rows("full cycle", &cycle_tools, s, 0);
    // The floor row is context, not a competitor.
    if let Some(r) = table.iter_mut().find(|r| r.tool.starts_with("true")) {
        r.ratio = Ratio::None;
    }
    drop(cycle_tools);

    // ---- 1b. start-up: `--version`, the smallest whole run of each program (issue 29) ----
    let mut startup_tools: Vec<Tool<'_>> = vec![
        Tool {
            name: "flock --version".into(),
            run: Box::new(|_| ctx.startup_flock1()),
        },
        Tool {
            name: "locksmith --version".into(),
            run: Box::new(|_| ctx.startup_locksmith()),
        },
    ];
    let s = alternate("start-up", cycle_runs, &mut startup_tools)?;
    table.extend(rows("start-up", &startup_tools, s, 0));
    drop(startup_tools);

    // ---- 2. spawn → OK (and RSS at OK) -------------------------------------------------
    let mut rss: Vec<Samples> = vec![Samples::default(); LOCAL.len()];
    let mut dirty: Vec<Samples> = vec![Samples::default(); LOCAL.len()];
    let mut spawn_tools: Vec<Tool<'_>> = vec![Tool {
        name: "flock F echo OK".into(),
        run: Box::new(|_| ctx.spawn_ok_flock1()),
    }];
    for ((b, r), d) in LOCAL.into_iter().zip(rss.iter_mut()).zip(dirty.iter_mut()) {
        spawn_tools.push(Tool {
            name: format!("locksmith {b}"),
            run: Box::new(move |rec| c.spawn_ok_locksmith(b, rec.then_some((&mut *r, &mut *d)))),
        });
    }
    for b in SHARING {
        spawn_tools.push(Tool {
            name: format!("locksmith --shared {b} (joining a reader)"),
            run: Box::new(move |_| c.spawn_ok_shared(b)),
        });
    }
    let s = alternate("spawn → OK", args.runs, &mut spawn_tools)?;
    table.extend(rows("spawn → OK", &spawn_tools, s, 0));
    drop(spawn_tools);

    // ---- 3. handoff: holder releases (pipe closed) → blocked waiter holds ------------------
    let mut handoff_tools: Vec<Tool<'_>> = vec![
        Tool {
            name: "flock(1): close stdin of `flock -F F cat`; waiter's echo OK".into(),
            run: Box::new(|_| ctx.handoff_flock1(Flock1Wait::Cmd)),
        },
        Tool {
            name: "flock(1): same; waiter's lock taken (strict)".into(),
            run: Box::new(|_| ctx.handoff_flock1(Flock1Wait::Taken)),
        },
    ];
    for b in LOCAL {
        handoff_tools.push(Tool {
            name: format!("locksmith {b}: close holder's stdout pipe"),
            run: Box::new(move |_| c.handoff_locksmith(b)),
        });
    }
    if filelock {
        handoff_tools.push(Tool {
            name: "python3 filelock: close holder's stdin (waiter polls)".into(),
            run: Box::new(|_| ctx.handoff_rival(Rival::Filelock)),
        });
    }
    let s = alternate("handoff", args.runs, &mut handoff_tools)?;
    table.extend(rows("handoff", &handoff_tools, s, 0));
    drop(handoff_tools);

    // ---- 3b. handoff against the dot-lock rivals, which poll with sleeps (seconds) --------
    let mut slow_tools: Vec<Tool<'_>> = vec![
        Tool {
            name: "flock(1): close stdin of `flock -F F cat`; waiter's echo OK".into(),
            run: Box::new(|_| ctx.handoff_flock1(Flock1Wait::Cmd)),
        },
        Tool {
            name: "locksmith f: close holder's stdout pipe".into(),
            run: Box::new(|_| ctx.handoff_locksmith("f")),
        },
    ];
    if proc::on_path("lockfile-create").is_some() {
        slow_tools.push(Tool {
            name: "lockfile-progs: lockfile-remove; waiter's lockfile-create --retry".into(),
            run: Box::new(|_| ctx.handoff_rival(Rival::LockfileProgs)),
        });
    }
    if proc::on_path("dotlockfile").is_some() {
        slow_tools.push(Tool {
            name: "dotlockfile: dotlockfile -u; waiter's dotlockfile -l -r".into(),
            run: Box::new(|_| ctx.handoff_rival(Rival::Dotlockfile)),
        });
    }
    if slow_tools.len() > 2 && args.slow_runs > 0 {
        let s = alternate("handoff (dot-lock rivals)", args.slow_runs, &mut slow_tools)?;
        table.extend(rows("handoff, dot-lock rivals", &slow_tools, s, 0));
    }
    drop(slow_tools);

    // ---- 4. crash release: the holder's parent is SIGKILLed → blocked waiter holds ---------
    let mut crash_tools: Vec<Tool<'_>> = vec![
        Tool {
            name: "flock(1): kill -9 `flock -F F sleep`; waiter's echo OK".into(),
            run: Box::new(|_| ctx.crash_flock1(Flock1Wait::Cmd)),
        },
        Tool {
            name: "flock(1): same; waiter's lock taken (strict)".into(),
            run: Box::new(|_| ctx.crash_flock1(Flock1Wait::Taken)),
        },
    ];
    for b in LOCAL {
        crash_tools.push(Tool {
            name: format!("locksmith {b}: kill -9 its parent"),
            run: Box::new(move |_| c.crash_locksmith(b)),
        });
    }
    if filelock {
        crash_tools.push(Tool {
            name: "python3 filelock: kill -9 the holder (waiter polls)".into(),
            run: Box::new(|_| ctx.crash_filelock()),
        });
    }
    let s = alternate("crash release", args.runs, &mut crash_tools)?;
    table.extend(rows("crash release", &crash_tools, s, 0));
    drop(crash_tools);

    // ---- 4b. takeover after the helper itself is SIGKILLed (same host) ---------------------
    let mut kill_tools: Vec<Tool<'_>> = LOCAL
        .into_iter()
        .map(|b| Tool {
            name: format!("locksmith {b}: kill -9 the holding locksmith"),
            run: Box::new(move |_| c.helper_kill_locksmith(b)),
        })
        .collect();
    let s = alternate("helper SIGKILL → waiter holds", args.runs, &mut kill_tools)?;
    table.extend(rows("helper killed", &kill_tools, s, 0));
    drop(kill_tools);

    // ---- 4b'. the same in another pid namespace (as on another host): SPEC §6's window ------
    if scenarios::Ctx::can_unshare_pid() {
        let (lo, hi) = scenarios::OTHER_NS_WINDOW_MS;
        let mut ns_tools: Vec<Tool<'_>> = vec![Tool {
            name: "locksmith f: kill -9 the holder's pid namespace (the kernel frees flock)".into(),
            run: Box::new(move |_| c.helper_kill_other_ns("f")),
        }];
        for b in ["mx", "lx", "sx"] {
            ns_tools.push(Tool {
                name: format!(
                    "locksmith {b}: kill -9 the holder's pid namespace (stale_after 1.5 s; SPEC §6 window {:.1}–{:.1} s)",
                    lo / 1e3,
                    hi / 1e3
                ),
                run: Box::new(move |_| c.helper_kill_other_ns(b)),
            });
        }
        // Each run of a file backend waits out stale_after: a third of the runs (≥ 10).
        let ns_runs = (args.runs / 3).max(10);
        let s = alternate(
            "helper SIGKILL in another pid namespace",
            ns_runs,
            &mut ns_tools,
        )?;
        let mut r = rows("helper killed, other pid namespace", &ns_tools, s, 0);
        for row in r.iter_mut().skip(1) {
            row.ratio = Ratio::None;
            let (min, max) = (row.samples.min(), row.samples.max());
            if min < lo || max > hi {
                net_notes.push(format!(
                    "{}: takeover {min:.0}–{max:.0} ms, outside SPEC §6's window {lo:.0}–{hi:.0} ms",
                    row.tool
                ));
            }
        }
        table.extend(r);
        drop(ns_tools);
    } else {
        net_notes.push("helper SIGKILL in another pid namespace: skipped (`unshare --pid --fork` is not allowed here)".into());
    }

    // ---- 4c. the seed's counter race: time per increment with 1, 2, 4, 8 contenders ---------
    let race_runs = (args.runs / 10).max(1);
    let per = if args.runs >= 30 { 25 } else { 10 };
    for n in [1usize, 2, 4, 8] {
        // Two contenders are issue 29's contended-handoff target: 3 rounds of 50 increments
        // gave bimodal rows (a round 1.02×, the median 1.63×; another run's mkdir 2.07–6.52 ms
        // per increment), so that row takes 5 rounds of 6× as many.
        let (rounds, per) = if n == 2 {
            (race_runs.max(5), per * 6)
        } else {
            (race_runs, per)
        };
        let mut race_tools: Vec<Tool<'_>> = vec![Tool {
            name: format!("flock F sh (n={n})"),
            run: Box::new(move |_| c.race(None, n, per)),
        }];
        for b in LOCAL {
            race_tools.push(Tool {
                name: format!("locksmith run {b} sh (n={n})"),
                run: Box::new(move |_| c.race(Some(b), n, per)),
            });
        }
        let metric = format!("race, {n} contenders");
        let s = alternate(&metric, rounds, &mut race_tools)?;
        table.extend(rows(&metric, &race_tools, s, 0));
    }

    // ---- 4c'. semaphores (SPEC §3b): time per grant, 8 contenders, 3 slots against 1 ------
    {
        let n = 8;
        let mut slot_tools: Vec<Tool<'_>> = Vec::new();
        for b in LOCAL {
            for slots in [1u32, 3] {
                slot_tools.push(Tool {
                    name: format!("locksmith --slots {slots} run {b} -- true (n={n})"),
                    run: Box::new(move |_| c.slots(b, slots, n, per)),
                });
            }
        }
        let metric = format!("semaphore, {n} contenders: time per grant");
        let s = alternate(&metric, race_runs, &mut slot_tools)?;
        let mut r = rows(&metric, &slot_tools, s, 0);
        for row in &mut r {
            row.ratio = Ratio::None;
        }
        table.extend(r);
    }

    // ---- 4c''. fair queues (SPEC §3b): a run's time, p50 and p99, with and without --fair ----
    {
        let (n, k) = (8usize, 10usize);
        let p50: std::cell::RefCell<Vec<Samples>> =
            std::cell::RefCell::new(vec![Samples::default(); LOCAL.len() * 2]);
        let p50 = &p50;
        let mut fair_tools: Vec<Tool<'_>> = Vec::new();
        for (i, b) in LOCAL.iter().enumerate() {
            for (j, fair) in [false, true].into_iter().enumerate() {
                let flag = if fair { "--fair " } else { "" };
                fair_tools.push(Tool {
                    name: format!("locksmith {flag}run {b} -- sleep 0.005 (n={n})"),
                    run: Box::new(move |recorded| {
                        let (median, p99) = c.fair(b, fair, n, k)?;
                        if recorded {
                            p50.borrow_mut()[i * 2 + j].push(median.as_secs_f64() * 1e3);
                        }
                        Ok(p99)
                    }),
                });
            }
        }
        let metric = format!("fair queue, {n} contenders: p99 of a run");
        let s = alternate(&metric, race_runs, &mut fair_tools)?;
        let mut r = rows(&metric, &fair_tools, s, 0);
        let medians = p50.borrow().clone();
        let metric50 = format!("fair queue, {n} contenders: p50 of a run");
        let mut r50: Vec<Row> = fair_tools
            .iter()
            .zip(medians)
            .map(|(t, samples)| Row {
                metric: metric50.clone(),
                tool: t.name.clone(),
                unit: Unit::Ms,
                samples,
                ratio: Ratio::None,
            })
            .collect();
        for row in &mut r {
            row.ratio = Ratio::None;
        }
        table.append(&mut r50);
        table.extend(r);
    }

    // ---- 4d. the herd (issue 15): n waiters on one lock, until the last one has held ------
    // Runs per size: a thousand waiters take seconds per tool and run.
    let largest = 1000;
    let mut per_waiter: Vec<(String, Samples, Samples)> = Vec::new();
    for (n, runs) in [
        (10usize, (args.runs / 3).max(3)),
        (100, (args.runs / 6).max(3)),
        (largest, (args.runs / 10).max(1)),
    ] {
        let used: std::cell::RefCell<Vec<(Samples, Samples)>> =
            std::cell::RefCell::new(vec![Default::default(); LOCAL.len() + 1]);
        let used = &used;
        let mut herd_tools: Vec<Tool<'_>> = Vec::new();
        for (i, b) in std::iter::once(None).chain(LOCAL.map(Some)).enumerate() {
            herd_tools.push(Tool {
                name: match b {
                    None => format!("flock F sh (n={n})"),
                    Some(b) => format!("locksmith run {b} sh (n={n})"),
                },
                run: Box::new(move |recorded| {
                    let (took, seen) = c.herd(b, n, recorded && n == largest)?;
                    let mut u = used.borrow_mut();
                    for (kib, fds) in seen {
                        u[i].0.push(kib as f64 / 1024.0);
                        u[i].1.push(fds as f64);
                    }
                    Ok(took)
                }),
            });
        }
        let metric = format!("herd, {n} waiters");
        let s = alternate(&metric, runs, &mut herd_tools)?;
        table.extend(rows(&metric, &herd_tools, s, 0));
        if n == largest {
            for (t, (mem, fds)) in herd_tools.iter().zip(used.take()) {
                per_waiter.push((t.name.clone(), mem, fds));
            }
        }
    }
    // ---- 4d'. a fair line (SPEC §3b, issue 26): the herd's 100 waiters, each with --fair ----
    {
        let n = 100;
        let mut line_tools: Vec<Tool<'_>> = vec![Tool {
            name: format!("flock F sh (n={n})"),
            run: Box::new(move |_| Ok(c.herd(None, n, false)?.0)),
        }];
        for b in LOCAL {
            line_tools.push(Tool {
                name: format!("locksmith --fair run {b} sh (n={n})"),
                run: Box::new(move |_| c.fair_line(b, n)),
            });
        }
        let metric = format!("fair line, {n} waiters");
        let s = alternate(&metric, (args.runs / 6).max(3), &mut line_tools)?;
        table.extend(rows(&metric, &line_tools, s, 0));
    }
    let ref_mem = per_waiter.first().map(|(_, m, _)| m.median());
    let ref_fds = per_waiter.first().map(|(_, _, f)| f.median());
    for (i, (tool, mem, _)) in per_waiter.iter().enumerate() {
        table.push(Row {
            metric: format!("private memory per waiter, {largest} waiting"),
            tool: tool.clone(),
            unit: Unit::MiB,
            samples: mem.clone(),
            ratio: match (i, ref_mem) {
                (0, _) | (_, None) => Ratio::IsReference,
                (_, Some(r)) => Ratio::Vs(r),
            },
        });
    }
    for (i, (tool, _, fds)) in per_waiter.iter().enumerate() {
        table.push(Row {
            metric: format!("descriptors per waiter, {largest} waiting"),
            tool: tool.clone(),
            unit: Unit::Count,
            samples: fds.clone(),
            ratio: match (i, ref_fds) {
                (0, _) | (_, None) => Ratio::IsReference,
                (_, Some(r)) => Ratio::Vs(r),
            },
        });
    }

    // ---- 5. RSS and wakeups while holding --------------------------------------------------
    let kib = |s: &Samples| {
        let mut m = Samples::default();
        for v in s.values() {
            m.push(v / 1024.0);
        }
        m
    };
    let hold = ctx.holding(args.window)?;
    let mut ref_rss = Samples::default();
    ref_rss.push(hold.reference_rss_kib as f64 / 1024.0);
    table.push(Row {
        metric: "RSS while holding".into(),
        tool: "flock(1) process of `flock F cat`".into(),
        unit: Unit::MiB,
        samples: ref_rss,
        ratio: Ratio::IsReference,
    });
    let ref_rss_median = hold.reference_rss_kib as f64 / 1024.0;
    for (b, s) in LOCAL.into_iter().zip(&rss) {
        table.push(Row {
            metric: "RSS while holding".into(),
            tool: format!("locksmith {b} (at OK, every spawn → OK run)"),
            unit: Unit::MiB,
            samples: kib(s),
            ratio: Ratio::Vs(ref_rss_median),
        });
    }
    let mut ref_dirty = Samples::default();
    ref_dirty.push(hold.reference_dirty_kib as f64 / 1024.0);
    table.push(Row {
        metric: "private dirty memory while holding".into(),
        tool: "flock(1) process of `flock F cat`".into(),
        unit: Unit::MiB,
        samples: ref_dirty,
        ratio: Ratio::IsReference,
    });
    let ref_dirty_median = hold.reference_dirty_kib as f64 / 1024.0;
    for (b, s) in LOCAL.into_iter().zip(&dirty) {
        table.push(Row {
            metric: "private dirty memory while holding".into(),
            tool: format!("locksmith {b} (at OK; the rest of RSS is shared file pages)"),
            unit: Unit::MiB,
            samples: kib(s),
            ratio: Ratio::Vs(ref_dirty_median),
        });
    }
    let window = format!("wakeups in {:.0} s holding", args.window.as_secs_f64());
    for h in &hold.rows {
        let mut s = Samples::default();
        s.push(h.switches as f64);
        table.push(Row {
            metric: window.clone(),
            tool: h.name.clone(),
            unit: Unit::Count,
            samples: s,
            ratio: Ratio::None,
        });
    }

    Ok((table, hold))
}

/// The sshfs section: the same lock through mount `a` and mount `b` of one served directory
/// (profiles `nm-*` mkdir, `nl-*` link, `ns-*` symlink, `nf-a` flock with `local = true`; see
/// `servers::Sshfs::profiles`), each metric in the same rotating loop as the rest.
fn sshfs_rows(ctx: &Ctx, fx: &Sshfs, args: &Args, notes: &mut Vec<String>) -> Result<Vec<Row>> {
    let c = ctx;
    let on_a = fx.a.join("flock1.lock").to_string_lossy().into_owned();
    let on_a = on_a.as_str();
    let net = [("nm", "mkdir"), ("nl", "link"), ("ns", "symlink")];
    let mut table = Vec::new();
    notes.push(format!(
        "sshfs section: {}; one directory served by {} behind socat on 127.0.0.1, mount a with sshfs's default caches, mount b with `{}`; heartbeat profiles: stale_after 3 s, keepalive 300 ms, poll 20 ms, max_poll 200 ms, cache_time 1s",
        Sshfs::version(),
        testkit::sshfs::SFTP_SERVER,
        Sshfs::B_OPTIONS
    ));

    // Full cycle on mount a, beside flock(1) on the same mount and the local-disk figures.
    let mut tools: Vec<Tool<'_>> = vec![Tool {
        name: "flock F true (F on mount a)".into(),
        run: Box::new(move |_| c.cycle_flock1_at(on_a)),
    }];
    for (p, backend) in net {
        tools.push(Tool {
            name: format!("locksmith run {p}-a -- true ({backend}, cache_time 1s)"),
            run: Box::new(move |_| c.cycle_locksmith(&format!("{p}-a"))),
        });
    }
    tools.push(Tool {
        name: "locksmith run nf-a -- true (flock, local = true)".into(),
        run: Box::new(move |_| c.cycle_locksmith("nf-a")),
    });
    tools.push(Tool {
        name: "local disk: flock F true".into(),
        run: Box::new(move |_| c.cycle_flock1()),
    });
    for b in LOCAL {
        tools.push(Tool {
            name: format!("local disk: locksmith run {b} -- true"),
            run: Box::new(move |_| c.cycle_locksmith(b)),
        });
    }
    let m = "sshfs: full cycle on mount a";
    let s = alternate(m, args.runs, &mut tools)?;
    // The local-disk rows too are against flock(1) on the mount: the price of the network.
    table.extend(rows(m, &tools, s, 0));
    drop(tools);

    // Handoff: the holder on mount a releases (pipe closed), the waiter on mount b holds.
    let mut tools: Vec<Tool<'_>> = vec![
        Tool {
            name: "flock(1) on mount a: close stdin of `flock -F F cat`; waiter's echo OK (same mount: flock(2) through FUSE excludes nothing across mounts)".into(),
            run: Box::new(move |_| c.handoff_flock1_at(on_a, Flock1Wait::Cmd)),
        },
        Tool {
            name: "locksmith nf-a → nf-a (flock, local = true; same mount)".into(),
            run: Box::new(move |_| c.handoff_locksmith("nf-a")),
        },
    ];
    for (p, backend) in net {
        tools.push(Tool {
            name: format!("locksmith {p}-a → {p}-b ({backend}): close holder's stdout pipe"),
            run: Box::new(move |_| c.handoff_across(&format!("{p}-a"), &format!("{p}-b"))),
        });
    }
    let m = "sshfs: handoff, holder on mount a → waiter on mount b";
    let s = alternate(m, args.runs, &mut tools)?;
    table.extend(rows(m, &tools, s, 0));
    drop(tools);

    // The holding locksmith SIGKILLed (in its own pid namespace: no proof of death) on
    // mount a; the waiter on mount b must wait out stale_after, inside SPEC §6's window.
    if !Ctx::can_unshare_pid() {
        notes.push("sshfs: helper SIGKILL across mounts skipped (`unshare --pid --fork` is not allowed here)".into());
        return Ok(table);
    }
    let (lo, hi) = servers::NETFS_WINDOW_MS;
    let mut tools: Vec<Tool<'_>> = net
        .into_iter()
        .map(|(p, backend)| Tool {
            name: format!(
                "locksmith {p}-a → {p}-b ({backend}): kill -9 the holder's pid namespace (stale_after 3 s; SPEC §6 window {:.1}–{:.1} s)",
                lo / 1e3,
                hi / 1e3
            ),
            run: Box::new(move |_| {
                c.helper_kill_other_ns_across(&format!("{p}-a"), &format!("{p}-b"))
            }),
        })
        .collect();
    // Each run waits out stale_after: a third of the runs (≥ 10).
    let kill_runs = (args.runs / 3).max(10);
    let m = "sshfs: helper killed on mount a → waiter on mount b holds";
    let s = alternate(m, kill_runs, &mut tools)?;
    let mut r = rows(m, &tools, s, 0);
    for row in &mut r {
        row.ratio = Ratio::None;
        let (min, max) = (row.samples.min(), row.samples.max());
        let early = row.samples.values().iter().filter(|&&v| v < lo).count();
        if early > 0 {
            notes.push(format!(
                "FAILURE: {}: {early} takeover(s) before SPEC §6's window (min {min:.0} ms < {lo:.0} ms): a live holder could have been broken",
                row.tool
            ));
        }
        if early == 0 && max <= hi {
            notes.push(format!(
                "{}: every takeover inside SPEC §6's window {lo:.0}–{hi:.0} ms (min {min:.0} ms, max {max:.0} ms)",
                row.tool
            ));
        }
        if max > hi {
            notes.push(format!(
                "{}: takeover up to {max:.0} ms, past SPEC §6's window end {hi:.0} ms (late, not unsafe; the OK line's trip to the bench and a loaded machine count here)",
                row.tool
            ));
        }
    }
    table.extend(r);
    Ok(table)
}

/// Runs `bench/ftp-vs-seed.sh` (a private pure-ftpd; the seed's Perl helper beside
/// locksmith) and reads its samples back.
/// A server backend's rows (profile `profile`, section `section`) beside flock(1): spawn → OK
/// (`takes`: what locksmith does to get there; `server`: the server, for the metric's name),
/// handoff, crash release (its parent killed, and the holding locksmith itself killed).
fn server_rows(
    c: &Ctx,
    section: &str,
    profile: &str,
    takes: &str,
    server: &str,
    runs: usize,
) -> Result<Vec<Row>> {
    let mut table = Vec::new();
    let mut tools: Vec<Tool<'_>> = vec![
        Tool {
            name: "flock F echo OK".into(),
            run: Box::new(|_| c.spawn_ok_flock1()),
        },
        Tool {
            name: format!("locksmith {profile} ({takes})"),
            run: Box::new(|_| c.spawn_ok_locksmith(profile, None)),
        },
    ];
    let m = format!("{section}: spawn → OK ({server})");
    let s = alternate(&m, runs, &mut tools)?;
    table.extend(rows(&m, &tools, s, 0));
    let mut tools: Vec<Tool<'_>> = vec![
        Tool {
            name: "flock(1): close stdin of `flock -F F cat`; waiter's echo OK".into(),
            run: Box::new(|_| c.handoff_flock1(Flock1Wait::Cmd)),
        },
        Tool {
            name: format!("locksmith {profile}: close holder's stdout pipe"),
            run: Box::new(|_| c.handoff_locksmith(profile)),
        },
    ];
    let m = format!("{section}: handoff");
    let s = alternate(&m, runs, &mut tools)?;
    table.extend(rows(&m, &tools, s, 0));
    let mut tools: Vec<Tool<'_>> = vec![
        Tool {
            name: "flock(1): kill -9 `flock -F F sleep`; waiter's echo OK".into(),
            run: Box::new(|_| c.crash_flock1(Flock1Wait::Cmd)),
        },
        Tool {
            name: format!("locksmith {profile}: kill -9 its parent"),
            run: Box::new(|_| c.crash_locksmith(profile)),
        },
        Tool {
            name: format!("locksmith {profile}: kill -9 the holding locksmith"),
            run: Box::new(|_| c.helper_kill_locksmith(profile)),
        },
    ];
    let m = format!("{section}: crash release");
    let s = alternate(&m, runs, &mut tools)?;
    table.extend(rows(&m, &tools, s, 0));
    // Semaphores and fair queues on the server (SPEC §3b), as the local section measures them.
    let (n, k) = (8usize, 5usize);
    let mut tools: Vec<Tool<'_>> = [1u32, 3]
        .into_iter()
        .map(|slots| Tool {
            name: format!("locksmith --slots {slots} run {profile} -- true (n={n})"),
            run: Box::new(move |_| c.slots(profile, slots, n, k)),
        })
        .collect();
    let m = format!("{section}: semaphore, {n} contenders: time per grant");
    let s = alternate(&m, (runs / 3).max(3), &mut tools)?;
    let mut r = rows(&m, &tools, s, 0);
    for row in &mut r {
        row.ratio = Ratio::None;
    }
    table.extend(r);
    let p50: std::cell::RefCell<[Samples; 2]> = Default::default();
    let p50 = &p50;
    let mut tools: Vec<Tool<'_>> = [false, true]
        .into_iter()
        .enumerate()
        .map(|(i, fair)| Tool {
            name: format!(
                "locksmith {}run {profile} -- sleep 0.005 (n={n})",
                if fair { "--fair " } else { "" }
            ),
            run: Box::new(move |recorded| {
                let (median, p99) = c.fair(profile, fair, n, k)?;
                if recorded {
                    p50.borrow_mut()[i].push(median.as_secs_f64() * 1e3);
                }
                Ok(p99)
            }),
        })
        .collect();
    let m99 = format!("{section}: fair queue, {n} contenders: p99 of a run");
    let s = alternate(&m99, (runs / 3).max(3), &mut tools)?;
    let mut r = rows(&m99, &tools, s, 0);
    let m50 = format!("{section}: fair queue, {n} contenders: p50 of a run");
    for (t, samples) in tools.iter().zip(p50.take()) {
        table.push(Row {
            metric: m50.clone(),
            tool: t.name.clone(),
            unit: Unit::Ms,
            samples,
            ratio: Ratio::None,
        });
    }
    for row in &mut r {
        row.ratio = Ratio::None;
    }
    table.extend(r);
    Ok(table)
}

fn ftp_rows(locksmith: &Path, args: &Args) -> Result<Vec<Row>> {
    let mut c = Command::new("bash");
    c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("ftp-vs-seed.sh"))
        .arg(args.runs.min(10).to_string())
        .env("LOCKSMITH_BIN", locksmith)
        .env("SLOW_RUNS", args.slow_runs.max(1).to_string());
    script_rows("FTP", "ftp-vs-seed.sh", c)
}

/// Runs `bench/etcd-vs-etcdctl.sh` (a private etcd member; `etcdctl lock` beside locksmith)
/// and reads its samples back.
fn etcd_rows(locksmith: &Path, args: &Args) -> Result<Vec<Row>> {
    let mut c = Command::new("bash");
    c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("etcd-vs-etcdctl.sh"))
        .arg(locksmith)
        .env("RUNS", args.runs.min(20).to_string())
        .env("SLOW_RUNS", args.slow_runs.max(1).to_string());
    script_rows("etcd", "etcd-vs-etcdctl.sh", c)
}

/// Runs `bench/s3-seaweedfs.sh` (a private SeaweedFS) and reads its samples back.
fn s3_rows(locksmith: &Path, args: &Args) -> Result<Vec<Row>> {
    let mut c = Command::new("bash");
    c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("s3-seaweedfs.sh"))
        .arg(locksmith)
        .env("RUNS", args.runs.min(20).to_string());
    script_rows("s3", "s3-seaweedfs.sh", c)
}

/// Runs a section's script with `BENCH_TSV` set and turns its TSV (metric, tool, unit,
/// samples) into rows, locksmith the reference of each metric.
fn script_rows(section: &str, script: &str, mut c: Command) -> Result<Vec<Row>> {
    let tsv = std::env::temp_dir().join(format!(
        "locksmith-bench-{section}.{}.tsv",
        std::process::id()
    ));
    eprintln!("locksmith-bench: {section} section (bench/{script}) ...");
    let st = c
        .env("BENCH_TSV", &tsv)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run bench/{script}: {e}"))?;
    if !st.success() {
        return Err(format!("bench/{script} failed ({st})"));
    }
    let text = fs::read_to_string(&tsv).map_err(|e| format!("{}: {e}", tsv.display()))?;
    let _ = fs::remove_file(&tsv);
    let mut out: Vec<Row> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let [metric, tool, unit, values] = f.as_slice() else {
            return Err(format!("bad line from bench/{script}: {line:?}"));
        };
        let mut samples = Samples::default();
        for v in values.split(',') {
            samples.push(v.parse().map_err(|e| format!("{v:?}: {e}"))?);
        }
        out.push(Row {
            metric: metric.to_string(),
            tool: tool.to_string(),
            unit: if *unit == "MiB" { Unit::MiB } else { Unit::Ms },
            samples,
            ratio: Ratio::None,
        });
    }
    // Each metric's rows together, metrics in the order they first appear.
    let mut order: Vec<String> = Vec::new();
    for r in &out {
        if !order.contains(&r.metric) {
            order.push(r.metric.clone());
        }
    }
    out.sort_by_key(|r| order.iter().position(|m| *m == r.metric));
    // Within each metric, locksmith is the reference the others are compared to (none when
    // locksmith is alone in it: the semaphore and fair-queue rows of `bench/semfair.py`).
    let metrics = order;
    for m in metrics {
        if !out
            .iter()
            .any(|r| r.metric == m && !r.tool.starts_with("locksmith"))
        {
            continue;
        }
        if let Some(r) = out
            .iter()
            .find(|r| r.metric == m && r.tool.starts_with("locksmith"))
            .map(|r| r.samples.median())
        {
            for row in out.iter_mut().filter(|row| row.metric == m) {
                row.ratio = if row.tool.starts_with("locksmith") {
                    Ratio::IsReference
                } else {
                    Ratio::Vs(r)
                };
            }
        }
    }
    Ok(out)
}

fn median_of(table: &[Row], metric: &str, tool_prefix: &str) -> Option<f64> {
    table
        .iter()
        .find(|r| r.metric == metric && r.tool.starts_with(tool_prefix))
        .map(|r| r.samples.median())
}

fn targets(table: &[Row], hold: Option<&scenarios::Holding>) -> String {
    let mut text = String::new();
    let mark = |ok: bool| if ok { "PASS" } else { "MISS" }.to_string();
    let ms = |v: f64| stats::fmt_value(v, Unit::Ms);
    let mut lines: Vec<[String; 6]> = vec![
        [
            "target".into(),
            "locksmith".into(),
            "reference".into(),
            "ratio (limit)".into(),
            "result".into(),
            "strict ratio".into(),
        ],
        Default::default(),
    ];
    // (what, locksmith median, reference median, limit, strict reference median)
    let mut ratio =
        |what: String, a: Option<f64>, b: Option<f64>, limit: f64, strict: Option<f64>| {
            if let (Some(a), Some(b)) = (a, b) {
                let r = a / b;
                lines.push([
                    what,
                    ms(a),
                    ms(b),
                    format!("{r:.2}× (≤ {limit:.1}×)"),
                    mark(r <= limit),
                    strict.map_or(String::new(), |s| format!("{:.2}×", a / s)),
                ]);
            }
        };
    // Issue 29's targets: start-up and the flock cycle as fast as flock(1), the lock-directory
    // cycles within 1.2×, a contended handoff within 1.1× (flock) and 1.5× (the others), a
    // herd of 1,000 within 1.3×.
    ratio(
        "start-up: `locksmith --version` / `flock --version` (issue 29)".into(),
        median_of(table, "start-up", "locksmith"),
        median_of(table, "start-up", "flock"),
        1.0,
        None,
    );
    let cyc = median_of(table, "full cycle", "flock F true");
    // What the `run` cycle's target leaves to the fencing token: the same lock in flock(1)'s
    // form, where locksmith keeps nothing beside the file.
    ratio(
        "flock(1)'s form: `locksmith F true` / `flock F true` (no token state, no watch)".into(),
        median_of(table, "full cycle", "locksmith F true"),
        cyc,
        1.0,
        None,
    );
    for b in LOCAL {
        ratio(
            format!("run cycle: `locksmith run {b} -- true` / `flock F true` (issue 29)"),
            median_of(table, "full cycle", &format!("locksmith run {b}")),
            cyc,
            if b == "f" { 1.0 } else { 1.2 },
            None,
        );
    }
    let two = median_of(table, "race, 2 contenders", "flock F");
    for b in LOCAL {
        ratio(
            format!("two loops on one lock, locksmith {b} / flock(1) (issue 29)"),
            median_of(table, "race, 2 contenders", &format!("locksmith run {b}")),
            two,
            if b == "f" { 1.1 } else { 1.5 },
            None,
        );
    }
    let herd = median_of(table, "herd, 1000 waiters", "flock F");
    for b in LOCAL {
        ratio(
            format!("1,000 waiters all served, locksmith {b} / flock(1) (issue 29)"),
            median_of(table, "herd, 1000 waiters", &format!("locksmith run {b}")),
            herd,
            1.3,
            None,
        );
    }
    let crash_ref = median_of(table, "crash release", "flock(1): kill");
    let crash_strict = median_of(table, "crash release", "flock(1): same");
    for b in LOCAL {
        ratio(
            format!("pipe close → waiter holds, locksmith {b} / flock(1) crash release"),
            median_of(table, "handoff", &format!("locksmith {b}")),
            crash_ref,
            1.0,
            crash_strict,
        );
        ratio(
            format!("parent SIGKILL → waiter holds, locksmith {b} / flock(1) crash release"),
            median_of(table, "crash release", &format!("locksmith {b}")),
            crash_ref,
            1.0,
            crash_strict,
        );
    }
    let handoff_ref = median_of(table, "handoff", "flock(1): close");
    let handoff_strict = median_of(table, "handoff", "flock(1): same");
    for b in LOCAL {
        ratio(
            format!("handoff, locksmith {b} / flock(1) handoff (issue 5)"),
            median_of(table, "handoff", &format!("locksmith {b}")),
            handoff_ref,
            1.0,
            handoff_strict,
        );
    }
    for b in LOCAL {
        let prefix = format!("locksmith {b}");
        if let Some(mib) = table
            .iter()
            .find(|r| r.metric == "RSS while holding" && r.tool.starts_with(&prefix))
            .map(|r| r.samples.max())
        {
            lines.push([
                format!("RSS of a holding locksmith {b} (largest of the runs)"),
                stats::fmt_value(mib, Unit::MiB),
                String::new(),
                "≤ 2.5 MiB".into(),
                mark(mib <= 2.5),
                String::new(),
            ]);
        }
        if let Some(mib) = table
            .iter()
            .find(|r| {
                r.metric == "private dirty memory while holding" && r.tool.starts_with(&prefix)
            })
            .map(|r| r.samples.median())
        {
            lines.push([
                format!("private dirty memory of a holding locksmith {b} (median)"),
                stats::fmt_value(mib, Unit::MiB),
                String::new(),
                "≤ 0.25 MiB".into(),
                mark(mib <= 0.25),
                String::new(),
            ]);
        }
    }
    if let Some(ms_ftp) = median_of(table, "FTP parent SIGKILL → lock gone", "locksmith") {
        lines.push([
            "FTP: parent SIGKILL → lock gone on the server (holder-side release)".into(),
            ms(ms_ftp),
            String::new(),
            "≤ 5 ms".into(),
            mark(ms_ftp <= 5.0),
            String::new(),
        ]);
    }
    if let Some(hold) = hold
        && let Some(h) = hold.rows.iter().find(|h| h.name.starts_with("locksmith f"))
    {
        lines.push([
            format!(
                "wakeups while holding flock ({:.0} s)",
                hold.window.as_secs_f64()
            ),
            h.switches.to_string(),
            String::new(),
            "= 0".into(),
            mark(h.switches == 0),
            String::new(),
        ]);
    }
    let mut width = [0usize; 6];
    for l in &lines {
        for (w, c) in width.iter_mut().zip(l.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    if lines.len() == 2 {
        return text; // no local-disk section ran (--sshfs-only)
    }
    lines[1] = width.map(|w| "-".repeat(w));
    let _ = writeln!(
        text,
        "targets (issues 5 and 29; the RSS and private-memory limits are issue 29's):"
    );
    for l in &lines {
        let mut out = String::from("  ");
        for (i, (c, w)) in l.iter().zip(width.iter()).enumerate() {
            let pad = " ".repeat(w - c.chars().count());
            if i == 0 || i == 4 {
                out.push_str(&format!("{c}{pad}  "));
            } else {
                out.push_str(&format!("{pad}{c}  "));
            }
        }
        let _ = writeln!(text, "{}", out.trim_end());
    }
    let _ = writeln!(
        text,
        "  reference = flock(1) until the waiter's CMD prints (`flock F echo OK`); strict ratio = against\n  \
         the moment the flock(1) waiter's flock(2) returned (its --verbose message, before any fork)."
    );
    text
}
