//! `profiles.example.toml` never rots: every profile of a built backend validates, and the
//! `demo` profile works from the repository root, as the README's first command uses it.

use std::path::PathBuf;

use crate::support::*;

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../profiles.example.toml")
}

#[test]
fn example_profiles_validate() {
    let mut c = std::process::Command::new(bin());
    c.arg("--profiles").arg(example()).arg("profiles");
    let o = output_within(c, std::time::Duration::from_secs(30));
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    let out = stdout(&o);
    for line in out.lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        let built = [
            "flock", "mkdir", "link", "symlink", "ftp", "postgres", "etcd", "s3", "redis",
        ]
        .contains(&cols[1]);
        if built {
            assert_eq!(
                cols.len(),
                2,
                "a built backend's profile must validate: {line}"
            );
        } else {
            assert!(line.contains("not built into this version"), "{line}");
        }
    }
    for name in [
        "demo",
        "demo-url",
        "counter",
        "config",
        "downloads",
        "phonestuff",
        "deploy",
        "nightly",
        "reports",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{name}\t"))),
            "{name} missing"
        );
    }
}

#[test]
fn demo_profile_runs() {
    let mut c = std::process::Command::new(bin());
    c.arg("--profiles").arg(example()).args([
        "run",
        "demo",
        "--",
        "sh",
        "-c",
        "echo holding $LOCKSMITH_PROFILE",
    ]);
    let o = output_within(c, std::time::Duration::from_secs(30));
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), "holding demo\n");
}

/// Issue 14: the README's first command, a lock by address, works with nothing but the binary
/// (no profiles file anywhere: `HOME` empty, no `XDG_CONFIG_HOME`, no `LOCKSMITH_PROFILES`).
#[test]
fn readme_first_command_runs_by_address() {
    let readme = std::fs::read_to_string(example().with_file_name("README.md")).unwrap();
    assert!(
        readme.contains("-- run /tmp/demo.lock -- sh -c 'echo \"holding $LOCKSMITH_PROFILE\"'"),
        "the README's first command is a lock by address"
    );
    let mut c = std::process::Command::new(bin());
    c.env_remove("LOCKSMITH_PROFILES")
        .env_remove("XDG_CONFIG_HOME")
        .env("HOME", "")
        .current_dir("/")
        .args(["run", "/tmp/demo.lock", "--", "sh", "-c"])
        .arg("echo \"holding $LOCKSMITH_PROFILE\"");
    let o = output_within(c, std::time::Duration::from_secs(30));
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), "holding /tmp/demo.lock\n");
}

/// Issue 25 finding 10: the .deb installs profiles.example.toml under /usr/share/doc, so its
/// `demo` profiles must not lock beside the file (root would write into /usr/share/doc); and
/// the package's synopsis (the crate's description) is one short line that dpkg need not wrap.
#[test]
fn the_packaged_example_writes_nothing_beside_itself_and_the_synopsis_fits() {
    let text = std::fs::read_to_string(example()).unwrap();
    let doc: toml::Table = text.parse().unwrap();
    let profiles = doc["profile"].as_table().unwrap();
    for name in ["demo", "demo-url"] {
        let p = profiles[name].as_table().unwrap();
        let place = p
            .get("path")
            .or_else(|| p.get("url"))
            .and_then(|v| v.as_str())
            .unwrap();
        let path = place.split_once(':').map_or(place, |(_, rest)| rest);
        assert!(
            path.starts_with("/tmp/") || path.starts_with("/run/lock/"),
            "{name}: {place}"
        );
    }
    let cargo: toml::Table =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .unwrap()
            .parse()
            .unwrap();
    let synopsis = cargo["package"]["description"].as_str().unwrap();
    assert!(synopsis.len() <= 79, "{} chars: {synopsis}", synopsis.len());
    assert!(
        !synopsis.ends_with('.'),
        "a Debian synopsis is no sentence: {synopsis}"
    );
}
