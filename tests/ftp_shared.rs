//! Shared (reader) locks over FTP (`locksmith/src/backend/ftp/shared.rs`): readers overlap,
//! writers exclude everyone and are not starved by a stream of readers, dead readers are
//! drained at once on this host and after `stale_after` from another, and nothing is left
//! behind. `every_server_shared!` runs the bodies against each server, like `every_server!`.

use std::fs;
use std::time::{Duration, Instant};

use crate::ftp_server::TestFtp;
use crate::support::*;

const T: Duration = Duration::from_secs(20);

macro_rules! shared_suite {
    ($start:expr; $($t:ident),* $(,)?) => {$(
        #[test]
        fn $t() {
            let Some(mut srv) = $start else { return };
            crate::ftp_shared::$t(&mut srv);
        }
    )*};
}
pub(crate) use shared_suite;

macro_rules! every_server_shared {
    ($start:expr) => {
        crate::ftp_shared::shared_suite!($start;
            readers_share_writers_exclude_and_nothing_is_left,
            reader_writer_checker_through_ftp,
            writer_is_not_starved_by_a_stream_of_readers,
            a_killed_reader_is_drained_at_once_on_this_host,
            break_refuses_live_readers_and_removes_dead_ones,
            kill9_soak_of_readers_and_writers,
            a_silent_reader_from_another_host_is_drained_after_stale_after,
        );
    };
}
pub(crate) use every_server_shared;

/// `ftp::sandbox` plus profile `r`: the same lock as `p`, shared; and `p3`/`r3`, the same
/// with stale_after 3 s (for timing tests that must survive a loaded machine).
fn sandbox(srv: &dyn TestFtp) -> Sandbox {
    let sb = crate::ftp::sandbox(srv);
    let text = fs::read_to_string(&sb.profiles).unwrap();
    let p = text
        .split("[profile.")
        .find(|s| s.starts_with("p]"))
        .expect("profile p")
        .trim_start_matches("p]");
    sb.write_profiles(&format!(
        "{text}\n[profile.r]{p}shared = true\n\n[profile.p3]{p}stale_after = \"3s\"\n\n[profile.r3]{p}stale_after = \"3s\"\nshared = true\n"
    ));
    sb
}

fn readers_dir_entries(srv: &dyn TestFtp) -> Vec<String> {
    fs::read_dir(srv.path("locks/p.readers"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

pub fn readers_share_writers_exclude_and_nothing_is_left(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let r1 = sb.hold(["r"]);
    let r2 = sb.hold(["--wait", "0", "--shared", "p"]);
    assert_eq!(r1.ok(), "OK r backend=ftp mode=shared token=0\n");
    assert_eq!(r2.ok(), "OK p backend=ftp mode=shared token=0\n");
    // Readers do not keep the gate.
    assert!(!srv.path("locks/p").exists());
    assert_eq!(readers_dir_entries(srv).len(), 2);
    let o = sb.output(["status", "--json", "p"]);
    assert_eq!(code(o.status), 1);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mode"], "shared", "{v}");
    assert_eq!(v["holders"].as_array().unwrap().len(), 2, "{v}");
    // A writer is busy, names a reader, and gives the gate back when it gives up.
    let o = sb.output(["--wait", "0", "p"]);
    assert_eq!(code(o.status), 75, "{}", stdout(&o));
    assert!(
        stdout(&o).contains(&format!("pid={}", r1.pid()))
            || stdout(&o).contains(&format!("pid={}", r2.pid())),
        "{}",
        stdout(&o)
    );
    assert!(
        !srv.path("locks/p").exists(),
        "a writer that gave up kept the gate"
    );
    // A writer waiting behind the readers gets in once they are gone.
    let mut w = sb.spawn_hold(["--wait", "20s", "p"]);
    // Once it holds the gate, new readers wait.
    eventually(T, "the writer holds the gate", || {
        srv.path("locks/p").exists()
    });
    let o = sb.output(["--wait", "0", "r"]);
    assert_eq!(code(o.status), 75, "a reader got in past a waiting writer");
    drop(r1);
    drop(r2);
    assert_eq!(
        w.read_line(T).as_deref(),
        Some("OK p backend=ftp mode=exclusive token=1\n")
    );
    assert!(
        !srv.path("locks/p.readers").exists(),
        "the writer leaves no empty readers directory"
    );
    let o = sb.output(["--wait", "0", "r"]);
    assert_eq!(code(o.status), 75, "a reader got in beside a writer");
    drop(w);
    eventually(T, "the writer's release", || !srv.path("locks/p").exists());
    // Readers again; after the last one leaves only the (empty) readers directory stays.
    let o = sb.output(["--wait", "5s", "run", "r", "--", "true"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert!(!srv.path("locks/p").exists());
    assert!(readers_dir_entries(srv).is_empty());
}

pub fn reader_writer_checker_through_ftp(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let t0 = Instant::now();
    let (violations, max_readers, tokens) = crate::shared::reader_writer_checker_sized(
        &sb,
        "p",
        // Readers stay inside ~10 ms: an FTP reader spends that long just registering,
        // and overlap is what is measured.
        &[("SPIN", "3000")],
        [4, 40, 2, 25],
    );
    eprintln!(
        "ftp ({}): 160 shared + 50 exclusive acquisitions in {:?}, max {max_readers} readers at once",
        srv.name(),
        t0.elapsed()
    );
    assert!(violations.is_empty(), "{violations:?}");
    assert!(max_readers > 1, "readers never overlapped");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "writer tokens not strictly increasing: {tokens:?}"
    );
    assert!(!srv.path("locks/p").exists());
    assert!(readers_dir_entries(srv).is_empty());
}

pub fn writer_is_not_starved_by_a_stream_of_readers(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let took = crate::shared::writer_gets_in_behind_a_stream_of_readers(&sb, "p");
    eprintln!("ftp ({}): writer got in after {took:?}", srv.name());
    // Generous: a loaded 2-core machine; without writer preference it would never get in.
    assert!(took < Duration::from_secs(15), "writer waited {took:?}");
}

pub fn a_killed_reader_is_drained_at_once_on_this_host(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let r = sb.hold(["r"]);
    r.ok();
    kill9(r.pid());
    let t0 = Instant::now();
    let w = sb.hold(["--wait", "10s", "p"]);
    let took = t0.elapsed();
    assert_eq!(
        w.ok(),
        "OK p backend=ftp mode=exclusive token=1 prev=crashed\n"
    );
    assert!(
        took < Duration::from_secs(1),
        "proof of death took {took:?}"
    );
    assert!(!srv.path("locks/p.readers").exists());
}

pub fn a_silent_reader_from_another_host_is_drained_after_stale_after(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let Some(r) = other_host_holder(&sb, "r3") else {
        return;
    };
    assert_eq!(r.ok(), "OK r3 backend=ftp mode=shared token=0\n");
    // Alive and heartbeating: a writer hammering for > 2 × stale_after never gets in.
    let mut w = sb.hold(["-vv", "--wait", "7s", "p3"]);
    let line = w.line.clone().unwrap_or_default();
    if line.starts_with("OK") {
        w.close_stdout();
        w.wait_exit(T);
        let mut r = r;
        let reader_said = r.read_line(Duration::from_millis(500));
        panic!(
            "a live reader was drained: {line} {}\nthe reader said: {reader_said:?}",
            w.stderr_text()
        );
    }
    let t0 = Instant::now();
    kill9(r.pid());
    let w = sb.hold(["--wait", "15s", "p3"]);
    let took = t0.elapsed();
    assert_eq!(
        w.ok(),
        "OK p3 backend=ftp mode=exclusive token=1 prev=crashed\n"
    );
    assert!(took >= Duration::from_millis(2600), "too early: {took:?}");
    assert!(took < Duration::from_secs(8), "too late: {took:?}");
}

pub fn break_refuses_live_readers_and_removes_dead_ones(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let r = sb.hold(["r"]);
    r.ok();
    let o = sb.output(["break", "p"]);
    assert_eq!(code(o.status), 75, "{}", stderr(&o));
    assert!(stderr(&o).contains("alive"), "{}", stderr(&o));
    kill9(r.pid());
    let o = sb.output(["break", "p"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert!(readers_dir_entries(srv).is_empty());
    let o = sb.output(["status", "p"]);
    assert_eq!(code(o.status), 0, "{}", stdout(&o));
}

/// Readers and writers in a loop while a killer SIGKILLs random locksmiths: never a writer
/// beside anyone alive, writer tokens strictly increasing, the lock recoverable afterwards.
pub fn kill9_soak_of_readers_and_writers(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    crate::shared::kill9_soak_in(&sb, "race", (30, 120));
}
