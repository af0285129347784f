//! How long an sshfs mount may serve stale data, read from the command line of the sshfs
//! process that serves it (issue 28, item 6: a default profile on sshfs was refused until the
//! user stated `cache_time`).
//!
//! `/proc/self/mountinfo` shows none of sshfs's options, but its daemon's `/proc/PID/cmdline`
//! does, and sshfs reads its caches from nothing else. What counts (sshfs 3.x's `sshfs.c` and
//! `cache.c`, libfuse 3's `fuse.c` and `fuse_opt.c`):
//! - sshfs's own cache of attributes, names and symbolic links, unless `-o dir_cache=no` (or
//!   `cache=no`): `dcache_timeout=N` / `cache_timeout=N` set all three (default 20 s),
//!   `dcache_{stat,dir,link}_timeout=N` (and `cache_…`) one each, the last one given wins. An
//!   entry stays valid while `time(NULL)` has not passed the whole second it was stored in plus
//!   N: up to N + 1 s;
//! - the kernel's entry, attribute and negative-lookup caches, as libfuse gives them to it:
//!   `entry_timeout` and `attr_timeout` (1 s each by default), `negative_timeout` (0). They
//!   may keep what sshfs's cache answered, so the two add up: sshfs's defaults give 20 + 1 +
//!   1 = 22 s;
//! - a file's content: sshfs opens without `keep_cache`, so the kernel drops a file's pages
//!   at every open and the heartbeat record is read from the server. `-o kernel_cache` and
//!   `-o auto_cache` keep them across opens for as long as the (cached) attributes look
//!   unchanged — with SFTP's whole-second times, a record rewritten within the second may
//!   never look changed: no time bounds that, and the cache time stays unknown.
//!
//! The daemon is found by `/proc/PID/comm` (`sshfs`: reading another process's `cmdline`
//! takes its memory map lock, and a process stuck on a hung mount could hold it), owned by
//! the user the mount's `user_id` names, whose command line names the mount point — absolute
//! as given or resolved as sshfs's `realpath(3)` did (its parent only: a look into the mount
//! itself could hang with its server), or relative to the process's working directory (gone
//! to `/` once sshfs daemonises: then a relative mount point counts where it ends the mount's
//! path and the host argument is the mount's source) — and whose mount namespace holds this
//! very mount
//! (its `/proc/PID/mountinfo` lists the mount's device number, one per FUSE connection: an
//! sshfs whose mount at that path was since lazily unmounted does not). Where several
//! processes match, the longest cache counts. Where none can be seen (another pid namespace,
//! `/proc` mounted with `hidepid`, a relative mount point whose directory sshfs has left), the cache
//! time stays unknown and the profile must state it, as before. Honest limit: a process that
//! matches all of that but serves another mount at the same path in the same namespace
//! (mounts stacked on one point) counts too, which can only lengthen the time — unless the
//! one serving this mount is hidden while such a one is seen.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// sshfs's `DEFAULT_CACHE_TIMEOUT_SECS` (cache.c, 2.x and 3.x).
const DEFAULT_TIMEOUT: u32 = 20;
/// libfuse 3's defaults for the kernel's caches (`fuse_new`): entry, attribute, negative.
const DEFAULT_KERNEL: [f64; 3] = [1.0, 1.0, 0.0];

/// What an sshfs command line says about its caches and where it mounts.
#[derive(Clone, Debug, PartialEq)]
pub struct Args {
    /// The first argument with a `:` (sshfs's `[user@]host:[dir]`).
    pub host: Option<String>,
    /// The next argument that is no option: the mount point, as given.
    pub point: Option<String>,
    /// sshfs's own cache is on (`dir_cache`, `cache`).
    dir_cache: bool,
    /// Its timeouts, in seconds: attributes, names, symbolic links.
    timeouts: [u32; 3],
    /// The kernel's timeouts, in seconds: entry, attribute, negative lookup.
    kernel: [f64; 3],
    /// The option that lets the kernel keep content across opens (`kernel_cache`,
    /// `auto_cache`), if the last word on it does.
    keeps_content: Option<&'static str>,
    /// The cache options given, as given, for messages.
    said: Vec<String>,
    /// A cache option whose value this reader cannot read (sshfs may read more: `sscanf`).
    unreadable: Option<String>,
}

impl Args {
    /// Reads sshfs's argument vector (`argv[0]` first) as sshfs and libfuse read it
    /// (`fuse_opt_parse`): `-o a,b` and `-oa,b` (commas escaped with `\`), repeated `-o`
    /// (the last value of an option wins), `--` ending the options, `-p PORT` and `-F FILE`
    /// taking the next argument. A cache option whose value it cannot read leaves the cache
    /// unknown ([`Args::cache`]).
    pub fn parse<S: AsRef<str>>(argv: &[S]) -> Args {
        let mut a = Args {
            host: None,
            point: None,
            dir_cache: true,
            timeouts: [DEFAULT_TIMEOUT; 3],
            kernel: DEFAULT_KERNEL,
            keeps_content: None,
            said: Vec::new(),
            unreadable: None,
        };
        let mut words = argv.iter().map(AsRef::as_ref).skip(1);
        let mut options_end = false;
        while let Some(w) = words.next() {
            if options_end || !w.starts_with('-') {
                a.nonopt(w);
            } else if w == "--" {
                options_end = true;
            } else if let Some(group) = w.strip_prefix("-o") {
                let group = if group.is_empty() {
                    words.next().unwrap_or("")
                } else {
                    group
                };
                for opt in split_group(group) {
                    if let Err(opt) = a.option(&opt) {
                        a.unreadable = Some(opt);
                    }
                }
            } else if w == "-p" || w == "-F" {
                words.next();
            }
        }
        a
    }

    fn nonopt(&mut self, w: &str) {
        if self.host.is_none() && w.contains(':') {
            self.host = Some(w.to_string());
        } else if self.point.is_none() {
            self.point = Some(w.to_string());
        }
    }

    /// One option of a `-o` group; `Err`: a cache option whose value cannot be read.
    fn option(&mut self, opt: &str) -> Result<(), String> {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let secs = || -> Result<u32, String> {
            value
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| opt.to_string())
        };
        let float = || -> Result<f64, String> {
            value
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v >= 0.0 && *v < 1e9)
                .ok_or_else(|| opt.to_string())
        };
        let mut said = true;
        match (key, value) {
            ("dir_cache" | "cache", Some("yes")) => self.dir_cache = true,
            ("dir_cache" | "cache", Some("no")) => self.dir_cache = false,
            ("dcache_timeout" | "cache_timeout", Some(_)) => self.timeouts = [secs()?; 3],
            ("dcache_stat_timeout" | "cache_stat_timeout", Some(_)) => self.timeouts[0] = secs()?,
            ("dcache_dir_timeout" | "cache_dir_timeout", Some(_)) => self.timeouts[1] = secs()?,
            ("dcache_link_timeout" | "cache_link_timeout", Some(_)) => self.timeouts[2] = secs()?,
            ("entry_timeout", Some(_)) => self.kernel[0] = float()?,
            ("attr_timeout", Some(_)) => self.kernel[1] = float()?,
            ("negative_timeout", Some(_)) => self.kernel[2] = float()?,
            ("kernel_cache", None) => self.keeps_content = Some("kernel_cache"),
            ("auto_cache", None) => self.keeps_content = Some("auto_cache"),
            ("noauto_cache", None) if self.keeps_content == Some("auto_cache") => {
                self.keeps_content = None
            }
            _ => said = false,
        }
        if said {
            self.said.push(opt.to_string());
        }
        Ok(())
    }

    /// How late the mount may show another client's changes, and on what it is counted;
    /// `Err`: why no time bounds it.
    pub fn cache(&self) -> Result<(Duration, String), String> {
        if let Some(o) = &self.unreadable {
            return Err(format!("-o {o}, a value locksmith cannot read"));
        }
        if let Some(o) = self.keeps_content {
            return Err(format!(
                "-o {o}: the kernel may keep a file's content across opens while its cached times look unchanged, so no time bounds how late a heartbeat shows"
            ));
        }
        let own = if self.dir_cache {
            u64::from(*self.timeouts.iter().max().expect("three")) + 1
        } else {
            0
        };
        let kernel = self.kernel.iter().copied().fold(0.0, f64::max);
        let total = Duration::from_secs(own) + Duration::from_secs_f64(kernel);
        let given = if self.said.is_empty() {
            "sshfs's defaults".to_string()
        } else {
            self.said.join(",")
        };
        let own = if self.dir_cache {
            format!("sshfs's cache up to {own}s, its timeout + 1s as it counts whole seconds")
        } else {
            "sshfs's cache off".to_string()
        };
        Ok((
            total,
            format!(
                "{given}: {own}, + the kernel's {}",
                crate::settings::fmt_duration(Duration::from_secs_f64(kernel))
            ),
        ))
    }
}

/// The options of a `-o` group, split at unescaped commas, `\` escapes undone (`\,`, `\\`,
/// `\ooo` octal), as `fuse_opt_parse` does.
fn split_group(group: &str) -> Vec<String> {
    let mut out = vec![Vec::<u8>::new()];
    let b = group.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let cur = out.last_mut().expect("one at least");
        match b[i] {
            b',' => out.push(Vec::new()),
            b'\\' if i + 1 < b.len() => {
                let oct = b.get(i + 1..i + 4).filter(|d| {
                    (b'0'..=b'3').contains(&d[0])
                        && d[1..].iter().all(|c| (b'0'..=b'7').contains(c))
                });
                match oct {
                    Some(d) => {
                        cur.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                        i += 3;
                    }
                    None => {
                        cur.push(b[i + 1]);
                        i += 1;
                    }
                }
            }
            c => cur.push(c),
        }
        i += 1;
    }
    out.into_iter()
        .map(|o| String::from_utf8_lossy(&o).into_owned())
        .collect()
}

/// `path` with `.` and `..` taken out and slashes merged, without looking at the filesystem.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// Whether the mount point `arg`, as the process with working directory `cwd` gave it,
/// names `point` (the mount's, from mountinfo: no symbolic link in it); `host` and `source`
/// (the mount's) decide a relative one whose working directory no longer says.
fn names_point(
    arg: &str,
    cwd: Option<&Path>,
    point: &Path,
    host: Option<&str>,
    source: &str,
) -> bool {
    let arg = Path::new(arg);
    if arg.is_absolute() {
        return is_path_of(arg, point);
    }
    if cwd.is_some_and(|c| is_path_of(&c.join(arg), point)) {
        return true;
    }
    let rel = lexical(arg);
    let plain = arg
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    plain
        && !rel.as_os_str().is_empty()
        && point.ends_with(&rel)
        && host.is_some_and(|h| same_source(h, source))
}

/// Whether the absolute `path` is `point` (which has no symbolic link in it): as written, where
/// it has no `..` (a `..` after a symbolic link goes elsewhere), else as sshfs resolved it
/// (`realpath(3)`): its parent resolved, never the mount point itself (a look into the mount
/// could hang with its server).
fn is_path_of(path: &Path, point: &Path) -> bool {
    let dotdot = path.components().any(|c| c == Component::ParentDir);
    if !dotdot && lexical(path) == point {
        return true;
    }
    let resolved = || {
        Some(
            std::fs::canonicalize(path.parent()?)
                .ok()?
                .join(path.file_name()?),
        )
    };
    resolved().is_some_and(|r| r == point)
}

/// sshfs's host argument against the mount's source in mountinfo (sshfs escapes commas in it
/// with `\`).
fn same_source(host: &str, source: &str) -> bool {
    host == source || host.replace(',', "\\,") == source
}

/// An sshfs mount, as this process's `/proc/self/mountinfo` shows it.
pub struct Mount<'a> {
    /// Where it is mounted (unescaped).
    pub point: &'a Path,
    /// Its source (unescaped): sshfs's host argument.
    pub source: &'a str,
    /// The user who mounted it (`user_id=`), where it says.
    pub uid: Option<u32>,
    /// Its device, `major:minor`: one per FUSE connection, so one per sshfs process.
    pub dev: &'a str,
}

/// The cache of the sshfs mount `m`, by the command line of the sshfs process serving it:
/// `Ok` with the time and what it was counted from, `Err` with why it is unknown.
pub fn mount_cache(m: &Mount<'_>) -> Result<(Duration, String), String> {
    let point = m.point;
    let mut found: Option<(Duration, String)> = None;
    let mut unknown: Option<String> = None;
    let dir = std::fs::read_dir("/proc").map_err(|e| format!("cannot list /proc: {e}"))?;
    for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        if std::fs::read(proc.join("comm")).ok().as_deref() != Some(b"sshfs\n") {
            continue;
        }
        if let Some(uid) = m.uid
            && real_uid(&proc) != Some(uid)
        {
            continue;
        }
        let Ok(raw) = std::fs::read(proc.join("cmdline")) else {
            continue;
        };
        let argv: Vec<String> = raw
            .strip_suffix(b"\0")
            .unwrap_or(&raw)
            .split(|&b| b == 0)
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect();
        let args = Args::parse(&argv);
        let cwd = std::fs::read_link(proc.join("cwd")).ok();
        let ours = args
            .point
            .as_deref()
            .is_some_and(|p| names_point(p, cwd.as_deref(), point, args.host.as_deref(), m.source));
        // Its mount namespace holds this very mount: not an sshfs whose mount at that path
        // was since unmounted (lazily, while something kept it) or is another one elsewhere.
        if !ours || !holds_dev(&proc, m.dev) {
            continue;
        }
        match args.cache() {
            Err(why) => unknown = Some(format!("its sshfs process {pid} runs with {why}")),
            Ok((t, how)) if found.as_ref().is_none_or(|(f, _)| t > *f) => {
                found = Some((t, format!("per its sshfs process {pid}, {how}")))
            }
            Ok(_) => {}
        }
    }
    match (unknown, found) {
        (Some(why), _) => Err(why),
        (None, Some(f)) => Ok(f),
        (None, None) => Err(format!(
            "no sshfs process serving {} can be seen here to read its options from; another pid namespace, /proc mounted with hidepid or a relative mount point whose directory sshfs has left hide it",
            point.display()
        )),
    }
}

/// Whether the mount namespace of the process at `proc` has a mount of device `dev`
/// (`/proc/PID/mountinfo`, field 3).
fn holds_dev(proc: &Path, dev: &str) -> bool {
    std::fs::read_to_string(proc.join("mountinfo"))
        .is_ok_and(|info| info.lines().any(|l| l.split(' ').nth(2) == Some(dev)))
}

/// The real user id of the process at `proc` (`/proc/PID/status`, `Uid:`).
fn real_uid(proc: &Path) -> Option<u32> {
    let status = std::fs::read_to_string(proc.join("status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Args {
        let argv: Vec<&str> = line.split(' ').collect();
        Args::parse(&argv)
    }

    fn secs(a: &Args) -> Duration {
        a.cache().unwrap().0
    }

    #[test]
    fn defaults_are_sshfs_and_libfuse_defaults() {
        let a = parse("sshfs user@host:/srv /mnt/a");
        assert_eq!(a.host.as_deref(), Some("user@host:/srv"));
        assert_eq!(a.point.as_deref(), Some("/mnt/a"));
        // 20 s + 1 s for sshfs's whole-second clock + the kernel's 1 s.
        assert_eq!(secs(&a), Duration::from_secs(22));
        assert!(a.cache().unwrap().1.contains("sshfs's defaults"));
    }

    #[test]
    fn option_forms_as_fuse_opt_parse_reads_them() {
        // -o a,b with the mount point after the options.
        let a = parse("sshfs -f -o directport=2222,cache_timeout=2 127.0.0.1:/srv /mnt/a");
        assert_eq!(secs(&a), Duration::from_secs(4));
        assert_eq!(a.point.as_deref(), Some("/mnt/a"));
        // -oa=b joined, the mount point before the options (mount.fuse3's form).
        let a = parse("sshfs 127.0.0.1:/srv /mnt/b -odirectport=2222,dcache_timeout=1");
        assert_eq!(secs(&a), Duration::from_secs(3));
        assert_eq!(a.point.as_deref(), Some("/mnt/b"));
        // Repeated -o: the last value wins, per field.
        let a =
            parse("sshfs h:/ /m -o cache_timeout=30 -o dcache_stat_timeout=5 -o cache_timeout=3");
        assert_eq!(secs(&a), Duration::from_secs(5));
        let a = parse("sshfs h:/ /m -o cache_timeout=3 -o dcache_dir_timeout=40");
        assert_eq!(secs(&a), Duration::from_secs(42));
        assert!(
            a.cache()
                .unwrap()
                .1
                .contains("cache_timeout=3,dcache_dir_timeout=40")
        );
        // -p and -F take the next argument: not a mount point.
        let a = parse("sshfs -p 2222 -F /etc/ssh/cfg h:/ /m");
        assert_eq!(a.point.as_deref(), Some("/m"));
        // After --, everything is an argument.
        let a = parse("sshfs -o cache_timeout=1 -- h:/ -odd");
        assert_eq!(a.point.as_deref(), Some("-odd"));
        assert_eq!(secs(&a), Duration::from_secs(3));
        // Escaped commas belong to the option.
        assert_eq!(split_group(r"a=x\,y,b,c\054d"), ["a=x,y", "b", "c,d"]);
        // ssh's and FUSE's other options change nothing.
        let a = parse("sshfs h:/ /m -o ServerAliveInterval=15,reconnect,allow_other,max_conns=4");
        assert_eq!(secs(&a), Duration::from_secs(22));
    }

    #[test]
    fn the_kernels_caches_add_to_sshfs_own() {
        let a = parse("sshfs h:/ /m -o cache=no");
        assert_eq!(secs(&a), Duration::from_secs(1));
        let a = parse("sshfs h:/ /m -o dir_cache=no,entry_timeout=0,attr_timeout=0");
        assert_eq!(secs(&a), Duration::ZERO);
        let a = parse("sshfs h:/ /m -o dir_cache=no,cache=yes,dcache_timeout=0,attr_timeout=0.5");
        assert_eq!(secs(&a), Duration::from_millis(2000));
        let a = parse("sshfs h:/ /m -o cache_timeout=1,negative_timeout=7");
        assert_eq!(secs(&a), Duration::from_secs(9));
    }

    #[test]
    fn content_kept_across_opens_leaves_the_cache_unknown() {
        let e = parse("sshfs h:/ /m -o kernel_cache,cache_timeout=1")
            .cache()
            .unwrap_err();
        assert!(e.contains("kernel_cache"), "{e}");
        let e = parse("sshfs h:/ /m -o auto_cache").cache().unwrap_err();
        assert!(e.contains("auto_cache"), "{e}");
        assert!(
            parse("sshfs h:/ /m -o auto_cache,noauto_cache")
                .cache()
                .is_ok()
        );
        assert!(parse("sshfs h:/ /m -o direct_io").cache().is_ok());
    }

    #[test]
    fn unreadable_values_are_errors() {
        for bad in [
            "cache_timeout=20x",
            "cache_timeout=-1",
            "cache_timeout=",
            "attr_timeout=nan",
            "entry_timeout=-1",
        ] {
            let argv = ["sshfs", "h:/", "/m", "-o", bad];
            let e = Args::parse(&argv).cache().unwrap_err();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn which_mount_a_command_line_names() {
        let p = Path::new("/home/u/mnt");
        assert!(names_point("/home/u/mnt", None, p, None, "h:/"));
        assert!(names_point("/home/u//mnt/", None, p, None, "h:/"));
        assert!(names_point("/home/./u/mnt", None, p, None, "h:/"));
        // A `..` is resolved on the filesystem, as sshfs's realpath(3) did; where it cannot
        // be, no match.
        let gone = Path::new("/nonexistent-locksmith-test/mnt");
        assert!(!names_point(
            "/nonexistent-locksmith-test/x/../mnt",
            None,
            gone,
            None,
            "h:/"
        ));
        assert!(!names_point("/home/u/mnt2", None, p, None, "h:/"));
        // Relative: by the working directory, else by its end and the source.
        assert!(names_point(
            "mnt",
            Some(Path::new("/home/u")),
            p,
            None,
            "h:/"
        ));
        assert!(names_point(
            "mnt",
            Some(Path::new("/")),
            p,
            Some("h:/"),
            "h:/"
        ));
        assert!(names_point(
            "u/mnt",
            Some(Path::new("/")),
            p,
            Some("h:/"),
            "h:/"
        ));
        assert!(!names_point(
            "mnt",
            Some(Path::new("/")),
            p,
            Some("other:/"),
            "h:/"
        ));
        assert!(!names_point(
            "nt",
            Some(Path::new("/")),
            p,
            Some("h:/"),
            "h:/"
        ));
        assert!(!names_point(
            "../mnt",
            Some(Path::new("/")),
            p,
            Some("h:/"),
            "h:/"
        ));
        assert!(same_source("h:/a,b", "h:/a\\,b"));
    }

    #[test]
    fn a_mount_point_through_a_symbolic_link_is_resolved_as_sshfs_does() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        for dir in ["a", "a/b", "a/b/mnt", "a/mnt", "mnt"] {
            std::fs::create_dir(root.join(dir)).unwrap();
        }
        std::os::unix::fs::symlink(root.join("a/b"), root.join("link")).unwrap();
        let arg = |p: &str| root.join(p).to_string_lossy().into_owned();
        let point = root.join("a/b/mnt");
        assert!(names_point(&arg("link/mnt"), None, &point, None, "h:/"));
        assert!(names_point(
            &arg("mnt/../link/mnt"),
            None,
            &point,
            None,
            "h:/"
        ));
        assert!(names_point("link/mnt", Some(&root), &point, None, "h:/"));
        // `link/..` is `a` (the parent of the link's target), not the root as written.
        assert!(names_point(
            &arg("link/../mnt"),
            None,
            &root.join("a/mnt"),
            None,
            "h:/"
        ));
        assert!(!names_point(
            &arg("link/../mnt"),
            None,
            &root.join("mnt"),
            None,
            "h:/"
        ));
    }
}
