//! status, break and profiles (SPEC §3, §5).

use std::time::Duration;

use crate::support::*;

const T: Duration = Duration::from_secs(10);

#[test]
fn status_free_and_held_text_and_json() {
    let sb = Sandbox::standard();
    for p in LOCAL {
        let backend = match p {
            "f" => "flock",
            "m" => "mkdir",
            "l" => "link",
            _ => "symlink",
        };
        let o = sb.output(["status", p]);
        assert_eq!(code(o.status), 0);
        assert_eq!(stdout(&o), format!("{p}: free (backend {backend})\n"));
        let o = sb.output(["status", "--json", p]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["held"], false);
        assert_eq!(v["holders"].as_array().unwrap().len(), 0);

        let h = sb.hold([p]);
        h.ok();
        let o = sb.output(["status", p]);
        assert_eq!(code(o.status), 1, "held");
        let text = stdout(&o);
        assert!(
            text.contains(&format!("pid={} ppid={}", h.pid(), std::process::id())),
            "{text}"
        );
        assert!(text.contains("[alive]"), "{text}");
        let o = sb.output(["status", "--json", p]);
        assert_eq!(code(o.status), 1);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["profile"], p);
        assert_eq!(v["backend"], backend);
        assert_eq!(v["held"], true);
        assert_eq!(v["mode"], "exclusive");
        let holder = &v["holders"][0];
        assert_eq!(holder["pid"], h.pid());
        assert_eq!(holder["ppid"], std::process::id());
        assert_eq!(holder["alive"], true);
        for key in ["host", "since", "token"] {
            assert!(holder.get(key).is_some(), "{key} present (maybe null)");
        }
    }
}

#[test]
fn status_says_stale_for_a_dead_holder() {
    let sb = Sandbox::standard();
    let mut h = sb.hold(["m"]);
    h.ok();
    kill9(h.pid());
    h.wait_exit(T);
    let o = sb.output(["status", "m"]);
    assert_eq!(code(o.status), 1, "stale is still held");
    assert!(stdout(&o).contains("[stale]"), "{}", stdout(&o));
    let o = sb.output(["status", "--json", "m"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["holders"][0]["alive"], false);
}

#[test]
fn break_refuses_live_takes_dead_and_frees_nothing_twice() {
    let sb = Sandbox::standard();
    let o = sb.output(["break", "m"]);
    assert_eq!(code(o.status), 0, "a free lock: {}", stderr(&o));
    assert_eq!(stdout(&o), "m: free, nothing to break\n");

    let h = sb.hold(["m"]);
    h.ok();
    let o = sb.output(["break", "m"]);
    assert_eq!(code(o.status), 75);
    assert!(stderr(&o).starts_with("ERROR busy: "), "{}", stderr(&o));
    assert!(sb.join("m.lock").exists(), "a live holder was broken");
    drop(h);

    let mut h = sb.hold(["m"]);
    h.ok();
    kill9(h.pid());
    h.wait_exit(T);
    let o = sb.output(["break", "m"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).starts_with("m: broke the lock of host="),
        "{}",
        stdout(&o)
    );
    assert!(!sb.join("m.lock").exists());

    let h = sb.hold(["m"]);
    h.ok();
    let o = sb.output(["break", "--force", "m"]);
    assert_eq!(code(o.status), 0, "--force breaks a live holder");
    // The broken holder notices at its next heartbeat (5 s by default) — not tested here —
    // and its release must not remove anyone else's lock:
    let next = sb.hold(["m"]);
    next.ok();
    drop(h);
    assert!(
        sb.join("m.lock").exists(),
        "the old holder's release removed its successor"
    );
    let o = sb.output(["break", "f"]);
    assert_eq!(code(o.status), 64, "break does not apply to flock");
}

#[test]
fn broken_holder_says_lost() {
    let sb = Sandbox::standard();
    let mut h = sb.hold(["fast"]);
    h.ok();
    let o = sb.output(["break", "--force", "fast"]);
    assert_eq!(code(o.status), 0);
    // Its next heartbeat (200 ms) finds its owner record gone.
    let line = h.read_line(T).expect("a LOST line");
    assert!(line.starts_with("LOST "), "{line}");
    assert_eq!(code(h.wait_exit(T)), 74);
}

#[test]
fn profiles_lists_names_and_backends() {
    let sb = Sandbox::standard();
    let o = sb.output(["profiles"]);
    assert_eq!(code(o.status), 0);
    assert_eq!(
        stdout(&o),
        "f\tflock\nfast\tmkdir\nl\tlink\nlfast\tlink\nm\tmkdir\ns\tsymlink\nsfast\tsymlink\n"
    );
}

/// Issue 25 finding 4: `status` on a lock whose directory does not exist is 78 naming the
/// missing directory, as taking it is — not `free` — for every file backend, by address
/// and by profile.
#[test]
fn status_of_a_lock_in_a_missing_directory_is_78() {
    let sb = Sandbox::new("[profile.gone]\nbackend = \"flock\"\npath = \"{dir}/missing/g.lock\"\n");
    let missing = sb.join("missing");
    let missing = missing.to_str().unwrap();
    let mut locks: Vec<String> = ["", "flock:", "mkdir:", "link:", "symlink:"]
        .iter()
        .map(|s| format!("{s}{missing}/x.lock"))
        .collect();
    locks.push("gone".into());
    for lock in &locks {
        let o = sb.output(["status", lock]);
        assert_eq!(code(o.status), 78, "{lock}: {}{}", stdout(&o), stderr(&o));
        assert!(stderr(&o).contains(missing), "{lock}: {}", stderr(&o));
        assert_eq!(stdout(&o), "", "{lock}");
        let o = sb.output(["-n", "run", lock, "--", "true"]);
        assert_eq!(code(o.status), 78, "{lock}: taking it");
    }
    assert!(!sb.join("missing").exists());
}
