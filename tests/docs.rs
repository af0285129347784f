//! `locksmith help`, the man pages and the shell completions (issue 16, item 3), run as a user
//! would: help by every door says the same, the man pages render with man(1) without a groff
//! warning, and each shell's completion script — sourced into the real bash, fish and zsh —
//! completes subcommands, options and the profile names of the profiles file in use.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::support::*;

fn locksmith(args: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(args).env_remove("LOCKSMITH_PROFILES");
    output_within(c, Duration::from_secs(30))
}

/// A shell, or `None` with a visible SKIP outside CI.
fn shell(name: &str) -> Option<String> {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if found.is_none() {
        missing(&format!("{name} is not installed"), ".ci/run installs it");
    }
    found
}

/// A PATH on which `locksmith` is the binary under test (the scripts call it by name).
fn path_with_bin() -> String {
    let dir = Path::new(bin()).parent().unwrap();
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// A profiles file with a few names, and the script of `kind` written beside it.
fn fixture(kind: &str) -> (Sandbox, std::path::PathBuf) {
    let sb = Sandbox::new(
        r#"
[profile.phonestuff]
backend = "mkdir"
path = "{dir}/phone.lock"

[profile.nightly]
backend = "flock"
path = "{dir}/nightly.lock"

[profile.photos]
url = "link:{dir}/photos.lock"
"#,
    );
    let o = locksmith(&["--generate", kind]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    let script = sb.join(kind);
    std::fs::write(&script, &o.stdout).unwrap();
    (sb, script)
}

fn lines(s: &str) -> Vec<String> {
    let mut v: Vec<String> = s.split_whitespace().map(str::to_string).collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn help_by_every_door_says_the_same() {
    let long = locksmith(&["--help"]);
    assert_eq!(code(long.status), 0);
    assert!(stdout(&long).starts_with("locksmith - "));
    assert_eq!(stdout(&locksmith(&["help"])), stdout(&long));
    assert_eq!(stdout(&locksmith(&["-h"])), stdout(&long));
    for sub in [
        "hold", "run", "status", "break", "verify", "profiles", "help",
    ] {
        let h = locksmith(&["help", sub]);
        assert_eq!(code(h.status), 0, "{sub}: {}", stderr(&h));
        let text = stdout(&h);
        assert!(text.starts_with(&format!("locksmith {sub} - ")), "{text}");
        assert_eq!(stdout(&locksmith(&[sub, "--help"])), text, "{sub} --help");
    }
    // `help` is a subcommand, not a profile's name, and a typo gets a suggestion.
    let o = locksmith(&["help", "stauts"]);
    assert_eq!(code(o.status), 64);
    assert!(
        stderr(&o).contains("did you mean `status`?"),
        "{}",
        stderr(&o)
    );
    // Options of one subcommand are refused with another, naming where they belong.
    let o = locksmith(&["--json", "profiles"]);
    assert_eq!(code(o.status), 64);
    assert!(
        stderr(&o).contains("--json belongs to `status`"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn version_lists_the_backends_built_in() {
    let o = locksmith(&["--version"]);
    assert_eq!(code(o.status), 0);
    let out = stdout(&o);
    assert!(out.starts_with(&format!("locksmith {}\n", env!("CARGO_PKG_VERSION"))));
    assert!(
        out.contains("backends: flock, mkdir, link, symlink, ftp, postgres, etcd, s3, redis\n"),
        "{out}"
    );
}

/// Both man pages render with man(1), and groff finds nothing to warn about.
#[test]
fn man_pages_render_without_warnings() {
    for (kind, title, must) in [
        (
            "man",
            "LOCKSMITH(1)",
            &["--conflict-exit-code", "EXIT STATUS", "LOCKSMITH_PROFILES"][..],
        ),
        (
            "man-profiles",
            "LOCKSMITH-PROFILES(5)",
            &[
                "stale_after",
                "cache_time",
                "password_file",
                "endpoints",
                "sslmode",
            ][..],
        ),
    ] {
        let (sb, page) = fixture(kind);
        let mut c = Command::new("man");
        c.arg("-l")
            .arg(&page)
            .env("MANWIDTH", "80")
            .env("MANPAGER", "cat");
        c.env("LC_ALL", "C.UTF-8");
        let o = output_within(c, Duration::from_secs(30));
        assert_eq!(code(o.status), 0, "{}", stderr(&o));
        let text = stdout(&o);
        assert!(text.starts_with(title), "{kind}: {text}");
        for word in must {
            // man may hyphenate at a line's end; look in the text without line breaks.
            let flat = text.replace("‐\n", "").replace("-\n", "");
            let flat: String = flat.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(flat.contains(word), "{kind} misses {word}");
        }
        let mut c = Command::new("groff");
        c.args(["-man", "-Tutf8", "-ww", "-z"]).arg(&page);
        let o = output_within(c, Duration::from_secs(30));
        assert_eq!(code(o.status), 0);
        assert_eq!(stderr(&o), "", "{kind}: groff warns");
        drop(sb);
    }
}

/// What bash's completion offers for `line` (the word being completed is its last).
fn bash_complete(script: &Path, words: &[&str]) -> Vec<String> {
    let array: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let sh = format!(
        "source '{}'; COMP_WORDS=({}); COMP_CWORD={}; _locksmith; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        array.join(" "),
        words.len() - 1
    );
    let mut c = Command::new("bash");
    c.args(["--norc", "-c", &sh]).env("PATH", path_with_bin());
    let o = output_within(c, Duration::from_secs(30));
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    lines(&stdout(&o))
}

#[test]
fn bash_completes_subcommands_options_and_profile_names() {
    if shell("bash").is_none() {
        return;
    }
    let (sb, script) = fixture("complete-bash");
    let p = sb.profiles.display().to_string();
    assert_eq!(bash_complete(&script, &["locksmith", "st"]), ["status"]);
    assert_eq!(
        bash_complete(&script, &["locksmith", "--profiles", &p, "run", ""]),
        ["nightly", "phonestuff", "photos"]
    );
    assert_eq!(
        bash_complete(&script, &["locksmith", "--profiles", &p, "ph"]),
        ["phonestuff", "photos"]
    );
    assert_eq!(
        bash_complete(&script, &["locksmith", "status", "--j"]),
        ["--json"]
    );
    // --json is status's: not offered to run.
    assert!(
        bash_complete(&script, &["locksmith", "run", "--"])
            .iter()
            .all(|o| o != "--json")
    );
    assert_eq!(
        bash_complete(&script, &["locksmith", "--generate", "complete-"]),
        ["complete-bash", "complete-fish", "complete-zsh"]
    );
    assert_eq!(
        bash_complete(&script, &["locksmith", "help", "ve"]),
        ["verify"]
    );
    // After LOCK comes a command.
    assert!(bash_complete(&script, &["locksmith", "phonestuff", "tru"]).contains(&"true".into()));
    // Lock addresses: the schemes, then (bash splits the word at its colon) the PATH's files,
    // then the command.
    assert_eq!(
        bash_complete(&script, &["locksmith", "run", "mk"]),
        ["mkdir:"]
    );
    assert_eq!(
        bash_complete(&script, &["locksmith", "run", "re"]),
        ["redis://", "rediss://"]
    );
    let dir = format!("{}/", sb.path().display());
    let files = bash_complete(&script, &["locksmith", "run", "mkdir", ":", &dir]);
    assert!(files.contains(&p), "{files:?}");
    let after = ["locksmith", "run", "mkdir", ":", "/tmp/x", "tru"];
    assert!(bash_complete(&script, &after).contains(&"true".into()));
}

#[test]
fn fish_completes_subcommands_options_and_profile_names() {
    if shell("fish").is_none() {
        return;
    }
    let (sb, script) = fixture("complete-fish");
    let p = sb.profiles.display().to_string();
    let complete = |line: &str| -> Vec<String> {
        let mut c = Command::new("fish");
        c.args(["--no-config", "-c"])
            .arg(format!(
                "source '{}'; complete -C '{line}'",
                script.display()
            ))
            .env("PATH", path_with_bin());
        let o = output_within(c, Duration::from_secs(30));
        assert_eq!(code(o.status), 0, "{}", stderr(&o));
        // Each line: the completion, a tab, its description.
        let mut v: Vec<String> = stdout(&o)
            .lines()
            .map(|l| l.split('\t').next().unwrap().to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(complete("locksmith st"), ["status"]);
    assert_eq!(
        complete(&format!("locksmith --profiles {p} run ")),
        ["nightly", "phonestuff", "photos"]
    );
    assert_eq!(complete("locksmith status --j"), ["--json"]);
    assert!(complete("locksmith run --").iter().all(|o| o != "--json"));
    assert_eq!(complete("locksmith help ve"), ["verify"]);
    assert_eq!(complete("locksmith run mk"), ["mkdir:"]);
    assert_eq!(complete("locksmith run s3"), ["s3://"]);
    let files = complete(&format!("locksmith run mkdir:{}/", sb.path().display()));
    assert!(files.contains(&format!("mkdir:{p}")), "{files:?}");
    let files = complete(&format!("locksmith run {}/", sb.path().display()));
    assert!(files.contains(&p), "{files:?}");
}

/// zsh: the script is valid zsh, and `_locksmith`'s own decisions (what it hands to
/// `compadd` and `_describe`) are checked with those builtins replaced by functions that
/// print what they get — zsh's menu itself is zsh's.
#[test]
fn zsh_completes_subcommands_options_and_profile_names() {
    if shell("zsh").is_none() {
        return;
    }
    let (sb, script) = fixture("complete-zsh");
    let o = output_within(
        {
            let mut c = Command::new("zsh");
            c.arg("-n").arg(&script);
            c
        },
        Duration::from_secs(30),
    );
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    let p = sb.profiles.display().to_string();
    let complete = |words: &[&str]| -> Vec<String> {
        let array: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
        let sh = format!(
            r#"compdef() {{ : }}
compadd() {{ while [[ $1 == -* && $1 != -- ]]; do [[ $1 == -[XS] ]] && shift; shift; done; [[ $1 == -- ]] && shift; print -l -- "$@" }}
compset() {{ : }}
_describe() {{ [[ $1 == -t ]] && shift 2; local x; for x in ${{(P)2}}; do print -- ${{x%%:*}}; done }}
_files() {{ print -- FILES }}
_command_names() {{ print -- COMMANDS }}
_message() {{ : }}
source '{}'
words=({}); CURRENT={}
_locksmith
true"#,
            script.display(),
            array.join(" "),
            words.len()
        );
        let mut c = Command::new("zsh");
        c.args(["-f", "-c", &sh]).env("PATH", path_with_bin());
        let o = output_within(c, Duration::from_secs(30));
        assert_eq!((code(o.status), stderr(&o).as_str()), (0, ""));
        lines(&stdout(&o))
    };
    let first = complete(&["locksmith", ""]);
    assert!(
        first.contains(&"status".into()) && first.contains(&"verify".into()),
        "{first:?}"
    );
    assert_eq!(
        complete(&["locksmith", "--profiles", &p, "run", ""]),
        ["nightly", "phonestuff", "photos"]
    );
    let opts = complete(&["locksmith", "status", "--"]);
    assert!(opts.contains(&"--json".into()), "{opts:?}");
    assert!(!complete(&["locksmith", "run", "--"]).contains(&"--json".into()));
    assert_eq!(complete(&["locksmith", "--peer", ""]), ["FILES"]);
    assert_eq!(complete(&["locksmith", "phonestuff", ""]), ["COMMANDS"]);
    // compadd filters by the prefix itself: every scheme is handed to it.
    let schemes = complete(&["locksmith", "run", "mk"]);
    assert!(
        schemes.contains(&"mkdir:".into()) && schemes.contains(&"s3://".into()),
        "{schemes:?}"
    );
    assert_eq!(complete(&["locksmith", "run", "mkdir:/tm"]), ["FILES"]);
}

/// Issue 16's onboarding edges, each as a new user meets it.
mod onboarding {
    use std::io::{Read, Write};
    use std::process::{Command, Stdio};
    use std::time::Duration;

    use crate::support::*;

    /// With no profiles file anywhere, the error says what to do: an address, or where to
    /// write one.
    #[test]
    fn no_profiles_file_says_what_to_do() {
        let home = tempfile::tempdir().unwrap();
        let mut c = Command::new(bin());
        c.arg("nightly")
            .env_remove("LOCKSMITH_PROFILES")
            .env_remove("XDG_CONFIG_HOME")
            .env("HOME", home.path());
        let o = output_within(c, Duration::from_secs(30));
        assert_eq!(code(o.status), 78);
        let out = stdout(&o);
        assert!(
            out.starts_with("ERROR config: no profiles file found"),
            "{out}"
        );
        assert!(out.contains("lock by address instead"), "{out}");
        let want = home.path().join(".config/locksmith/profiles.toml");
        assert!(
            out.contains(&format!("or write {}", want.display())),
            "{out}"
        );
    }

    /// A mistyped profile gets the name it was probably meant to be.
    #[test]
    fn a_mistyped_profile_gets_a_suggestion() {
        let sb = Sandbox::standard();
        let o = sb.output(["run", "fasst", "--", "true"]);
        assert_eq!(code(o.status), 78);
        assert!(
            stderr(&o).contains("did you mean `fast`?"),
            "{}",
            stderr(&o)
        );
        // Nothing close: no suggestion.
        let o = sb.output(["run", "zzzzzz", "--", "true"]);
        assert!(!stderr(&o).contains("did you mean"), "{}", stderr(&o));
    }

    /// `profiles` names the file it read (on stderr: stdout stays one profile per line).
    #[test]
    fn profiles_names_the_file_it_read() {
        let sb = Sandbox::standard();
        let o = sb.output(["profiles"]);
        assert_eq!(code(o.status), 0);
        assert!(
            stderr(&o).contains(&format!("profiles of {}", sb.profiles.display())),
            "{}",
            stderr(&o)
        );
        assert!(
            stdout(&o).lines().all(|l| l.contains('\t')),
            "{}",
            stdout(&o)
        );
    }

    /// `-v` on a free lock shows what was resolved: backend, where, which file.
    #[test]
    fn verbose_shows_backend_location_and_profiles_file() {
        let sb = Sandbox::standard();
        let o = sb.output(["-v", "run", "m", "--", "true"]);
        assert_eq!(code(o.status), 0, "{}", stderr(&o));
        let want = format!(
            "lock m: backend mkdir, {} (profile of {})",
            sb.join("m.lock").display(),
            sb.profiles.display()
        );
        assert!(stderr(&o).contains(&want), "{}", stderr(&o));
        let lock = sb.join("addr.lock");
        let o = sb.output(["-v", "run", lock.to_str().unwrap(), "--", "true"]);
        assert_eq!(code(o.status), 0, "{}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!(
                "backend flock, {} (an address: no profiles file read)",
                lock.display()
            )),
            "{}",
            stderr(&o)
        );
    }

    /// Hold mode on a terminal (a real pty, from script(1)) says how to release, and Ctrl-C
    /// typed there releases.
    #[test]
    fn hold_on_a_terminal_says_how_to_release() {
        let sb = Sandbox::standard();
        let lock = sb.join("tty.lock");
        // script(1) runs the line with $SHELL -c: `exec` so that the terminal's Ctrl-C reaches
        // locksmith alone, as from an interactive shell (a non-interactive dash that waited for
        // it would die of the SIGINT itself and make script(1) exit 130).
        let line = format!("exec '{}' '{}'", bin(), lock.display());
        let mut c = Command::new("script");
        c.args(["-qec", &line, "/dev/null"])
            .env("SHELL", "/bin/sh")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = c.spawn().expect("script(1) from util-linux");
        let mut out = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut buf = [0u8; 512];
            while !String::from_utf8_lossy(&seen).contains("until Ctrl-C") {
                match out.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            // The pipe stays open: script(1) echoes what is typed next.
            (String::from_utf8_lossy(&seen).into_owned(), out)
        });
        let (seen, mut out) = reader.join().unwrap();
        assert!(seen.starts_with("OK "), "{seen}");
        assert!(
            seen.contains(&format!("holding {} until Ctrl-C", lock.display())),
            "{seen}"
        );
        // Held now: flock(1) cannot take it.
        let busy = Command::new("flock")
            .arg("-n")
            .arg(&lock)
            .arg("true")
            .status()
            .unwrap();
        assert_eq!(busy.code(), Some(1));
        child.stdin.as_mut().unwrap().write_all(b"\x03").unwrap();
        let mut rest = Vec::new();
        out.read_to_end(&mut rest).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0));
        let free = Command::new("flock")
            .arg("-n")
            .arg(&lock)
            .arg("true")
            .status()
            .unwrap();
        assert_eq!(free.code(), Some(0));
    }
}

/// Issue 25 finding 9: the man page's EXIT STATUS names run's own codes (126, 127, 128+N)
/// and flock(1)'s forms, and DESCRIPTION says what the README and SPEC §6 say of a dead
/// locksmith: breakable at once on proof of death on the same host, else after stale_after.
#[test]
fn man_page_exit_status_and_description_are_true() {
    let o = locksmith(&["--generate", "man"]);
    let man = String::from_utf8_lossy(&o.stdout).into_owned();
    let section = |name: &str| -> String {
        let at = man
            .find(&format!(".SH {name}\n"))
            .unwrap_or_else(|| panic!("{name}"));
        let rest = &man[at + 4..];
        rest[..rest.find("\n.SH ").unwrap_or(rest.len())].to_string()
    };
    let exit = section("EXIT STATUS");
    for code in ["126", "127", "128+N"] {
        assert!(exit.contains(code), "EXIT STATUS lacks {code}:\n{exit}");
    }
    let desc = section("DESCRIPTION");
    assert!(desc.contains("proof of death"), "{desc}");
    assert!(desc.contains("flock"), "names the flock(1) drop-in: {desc}");
}
