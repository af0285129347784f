//! Malformed input never crashes the helper: hundreds of random mutations of the example
//! profiles file (byte flips, deletions, truncations) each end in exit 0 or 78 with at most
//! one ERROR line, never a panic. (A cheap stand-in for fuzzing until cargo-fuzz, which
//! needs a nightly toolchain, can run here.)

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::*;

#[test]
fn mutated_profiles_files_never_panic() {
    let example =
        fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../profiles.example.toml"))
            .unwrap();
    let sb = Sandbox::new("");
    let mut rng = fastrand::Rng::with_seed(0x10c5_3171);
    for round in 0..300 {
        let mut bytes = example.clone();
        for _ in 0..rng.usize(1..6) {
            if bytes.is_empty() {
                break;
            }
            let i = rng.usize(..bytes.len());
            match rng.u8(..4) {
                0 => bytes[i] = rng.u8(..),
                1 => {
                    bytes.remove(i);
                }
                2 => bytes.insert(i, b"=[]\"'\n#.{}"[rng.usize(..10)]),
                _ => bytes.truncate(i),
            }
        }
        fs::write(&sb.profiles, &bytes).unwrap();
        for args in [
            &["profiles"][..],
            &["--wait", "0", "run", "demo", "--", "true"][..],
        ] {
            let mut c = std::process::Command::new(bin());
            c.arg("--profiles")
                .arg(&sb.profiles)
                .args(args)
                .current_dir(sb.path());
            let o = output_within(c, Duration::from_secs(30));
            let (out, err) = (stdout(&o), stderr(&o));
            assert!(
                !err.contains("panicked") && !out.contains("panicked"),
                "round {round}: a panic on {:?}: {err}",
                String::from_utf8_lossy(&bytes)
            );
            let code = code(o.status);
            assert!(
                matches!(code, 0 | 64 | 69 | 74 | 75 | 77 | 78),
                "round {round}: exit {code}: {out} {err}"
            );
            let errors = out
                .lines()
                .chain(err.lines())
                .filter(|l| l.starts_with("ERROR "))
                .count();
            assert!(
                errors <= 1,
                "round {round}: {errors} ERROR lines: {out} {err}"
            );
        }
    }
}

#[test]
fn random_records_never_panic_the_parsers() {
    use locksmith_helper::backend::owner::{Record, parse_state_entry};
    let mut rng = fastrand::Rng::with_seed(7);
    let good = Record::ours("p").render();
    for _ in 0..5000 {
        let mut s: Vec<char> = good.chars().collect();
        for _ in 0..rng.usize(1..8) {
            if s.is_empty() {
                break;
            }
            let i = rng.usize(..s.len());
            match rng.u8(..3) {
                0 => s[i] = rng.char(..),
                1 => {
                    s.remove(i);
                }
                _ => s.truncate(i),
            }
        }
        let text: String = s.into_iter().collect();
        let _ = Record::parse(&text);
        let _ = parse_state_entry(&text);
    }
}
