//! Semaphores (SPEC §3b): `--slots N` admits up to N holders at once, each in its own slot
//! (`slot=K`, `LOCKSMITH_SLOT`), never more; every grant's fencing token is above every
//! earlier one whatever the slot; all contenders of one lock agree on N (78 otherwise); and
//! each slot keeps §6's promises (a killed holder's slot is taken again).

use std::collections::BTreeSet;
use std::fs;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// The file backends, as address schemes.
const FILE_BACKENDS: [&str; 4] = ["flock", "mkdir", "link", "symlink"];

/// The `key=value` field of an OK line.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.trim_end()
        .split(' ')
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
}

fn address(sb: &Sandbox, backend: &str, name: &str, query: &str) -> String {
    format!("{backend}:{}{query}", sb.join(name).display())
}

/// Three holders of `lock` with `--slots 3`, taken one after the other.
fn held_three(sb: &Sandbox, lock: &str) -> Vec<Held> {
    (0..3).map(|_| sb.hold(["--slots", "3", lock])).collect()
}

#[test]
fn n_holders_get_n_different_slots_and_the_next_is_busy_on_every_file_backend() {
    let sb = Sandbox::standard();
    for backend in FILE_BACKENDS {
        let lock = address(&sb, backend, &format!("{backend}.sem"), "");
        let mut held = held_three(&sb, &lock);
        let mut slots = BTreeSet::new();
        let mut tokens = BTreeSet::new();
        for h in &held {
            let ok = h.ok().to_string();
            assert_eq!(field(&ok, "slots"), Some("3"), "{backend}: {ok}");
            slots.insert(field(&ok, "slot").expect("slot=").to_string());
            tokens.insert(token_of(&ok));
        }
        assert_eq!(
            slots.len(),
            3,
            "{backend}: three holders, three slots: {slots:?}"
        );
        assert_eq!(
            tokens.len(),
            3,
            "{backend}: three grants, three tokens: {tokens:?}"
        );
        // Full: the fourth is busy, and says who holds.
        let o = sb.output(["--slots", "3", "--wait", "0", lock.as_str()]);
        assert_eq!(code(o.status), 75, "{backend}: {}", stdout(&o));
        assert!(stdout(&o).contains("slot="), "{backend}: {}", stdout(&o));
        let st = sb.output(["--slots", "3", "status", lock.as_str()]);
        assert_eq!(code(st.status), 1, "{backend}: status of a held semaphore");
        assert_eq!(stdout(&st).lines().count(), 3, "{}", stdout(&st));
        // One leaves: the next gets exactly its slot, with a token above all before.
        let freed = field(held[1].ok(), "slot").unwrap().to_string();
        let mut gone = held.remove(1);
        gone.close_stdout();
        assert!(gone.wait_exit(Duration::from_secs(10)).success());
        let next = sb.hold(["--slots", "3", lock.as_str()]);
        assert_eq!(
            field(next.ok(), "slot"),
            Some(freed.as_str()),
            "{}",
            next.ok()
        );
        assert!(token_of(next.ok()) > *tokens.iter().max().unwrap());
        drop(next);
        drop(held);
    }
}

/// Each run of CMD: a marker per slot made with O_EXCL (two holders in one slot would
/// collide), the number of holders inside written down, the token logged; then out after
/// `$SPIN` turns of a loop (300 unless given: a backend whose grants are slow gives more, so
/// that holders can be inside together at all).
const INSIDE: &str = r#"
if ! mkdir "$D/in.$LOCKSMITH_SLOT" 2>/dev/null; then echo "slot $LOCKSMITH_SLOT" >> "$D/overlaps"; fi
ls -d "$D"/in.* | wc -l >> "$D/inside"
echo "$LOCKSMITH_TOKEN" >> "$D/tokens"
i=0; while [ $i -lt "${SPIN:-300}" ]; do i=$((i+1)); done
rmdir "$D/in.$LOCKSMITH_SLOT"
"#;

/// `workers` loops of `rounds` runs each on a lock of `n` slots: the number inside at each
/// entry, every run's token, and the overlaps (two holders in one slot).
pub fn race(
    sb: &Sandbox,
    lock: &str,
    n: u32,
    workers: usize,
    rounds: usize,
) -> (Vec<usize>, Vec<u64>, usize) {
    race_env(sb, lock, n, workers, rounds, &[])
}

/// [`race`], every run with `env` set (a server's credentials; `SPIN`).
pub fn race_env(
    sb: &Sandbox,
    lock: &str,
    n: u32,
    workers: usize,
    rounds: usize,
    env: &[(&str, &str)],
) -> (Vec<usize>, Vec<u64>, usize) {
    let d = sb.join("race");
    let _ = fs::remove_dir_all(&d);
    fs::create_dir(&d).unwrap();
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            let n = n.to_string();
            let mut c: Command = sb.cmd([
                "--slots",
                n.as_str(),
                "--wait",
                "120s",
                "run",
                lock,
                "--",
                "sh",
                "-c",
                INSIDE,
            ]);
            c.env("D", &d).envs(env.iter().copied());
            std::thread::spawn(move || {
                for k in 0..rounds {
                    let o = c.output().unwrap();
                    assert!(
                        o.status.success(),
                        "round {k}: exit {}: {}",
                        code(o.status),
                        stderr(&o)
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a worker failed");
    }
    let lines = |f: &str| fs::read_to_string(d.join(f)).unwrap_or_default();
    let inside = lines("inside")
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    let tokens = lines("tokens")
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    (inside, tokens, lines("overlaps").lines().count())
}

#[test]
fn racing_contenders_never_exceed_n_and_every_grant_gets_its_own_token() {
    let _heavy = heavy();
    let sb = Sandbox::standard();
    let (n, workers, rounds) = (3, 6, 8);
    for backend in FILE_BACKENDS {
        let lock = address(&sb, backend, &format!("{backend}.race"), "");
        let (inside, tokens, overlaps) = race(&sb, &lock, n, workers, rounds);
        assert_eq!(overlaps, 0, "{backend}: two holders in one slot");
        assert_eq!(
            inside.len(),
            workers * rounds,
            "{backend}: every run ran once"
        );
        let most = *inside.iter().max().unwrap();
        assert!(
            most <= n as usize,
            "{backend}: {most} holders inside a lock of {n} slots"
        );
        // Every grant issued one token of the lock's one counter, each once, none skipped
        // (flock's first token is its clock floor, the others' 1).
        let set: BTreeSet<u64> = tokens.iter().copied().collect();
        let first = *set.first().expect("tokens");
        let want: BTreeSet<u64> = (first..first + (workers * rounds) as u64).collect();
        assert_eq!(set, want, "{backend}: tokens {tokens:?}");
        eprintln!(
            "{backend}: at most {most} of {n} inside over {} runs",
            workers * rounds
        );
    }
}

#[test]
fn contenders_that_disagree_on_the_number_of_slots_are_refused_naming_both() {
    let sb = Sandbox::standard();
    for backend in FILE_BACKENDS {
        let lock = address(&sb, backend, &format!("{backend}.n"), "");
        let h = sb.hold(["--slots", "3", lock.as_str()]);
        assert!(h.ok().starts_with("OK "), "{backend}: {}", h.ok());
        // (The holder's own slot is checked below: with one holder, a contender of 2 finds a
        // free slot of its own and is refused when it asks the lock.)
        for other in ["2", "1", "4"] {
            let o = sb.output(["--slots", other, "--wait", "0", lock.as_str()]);
            let out = stdout(&o);
            assert_eq!(code(o.status), 78, "{backend} --slots {other}: {out}");
            assert!(
                out.starts_with("ERROR config:")
                    && out.contains("3 slot")
                    && out.contains(&format!("asks for {other}")),
                "{backend} --slots {other}: {out}"
            );
        }
        // A contender of fewer slots whose slots are all busy is told at once too.
        let more: Vec<Held> = (0..2)
            .map(|_| sb.hold(["--slots", "3", lock.as_str()]))
            .collect();
        let o = sb.output(["--slots", "2", "--wait", "5s", lock.as_str()]);
        assert_eq!(
            code(o.status),
            78,
            "{backend} --slots 2, all busy: {}",
            stdout(&o)
        );
        assert!(
            stdout(&o).contains("more than 2 slots") && stdout(&o).contains("asks for 2"),
            "{backend}: {}",
            stdout(&o)
        );
        drop(more);
        // Still only the one holder (the two others gone), and the refused left no slot taken.
        eventually(
            Duration::from_secs(10),
            "only the first holder left",
            || {
                let st = sb.output(["--slots", "3", "status", lock.as_str()]);
                stdout(&st).lines().count() == 1
            },
        );
        drop(h);
        // Once nobody holds, the next contender's number stands.
        eventually(Duration::from_secs(10), "the semaphore is free", || {
            code(sb.output(["--slots", "3", "status", lock.as_str()]).status) == 0
        });
        let two = sb.hold(["--slots", "2", lock.as_str()]);
        assert_eq!(
            field(two.ok(), "slots"),
            Some("2"),
            "{backend}: {}",
            two.ok()
        );
        drop(two);
        eventually(Duration::from_secs(10), "free again", || {
            code(sb.output(["--slots", "2", "status", lock.as_str()]).status) == 0
        });
        let one = sb.hold([lock.as_str()]);
        assert!(one.ok().starts_with("OK "), "{backend}: {}", one.ok());
        assert_eq!(
            field(one.ok(), "slot"),
            None,
            "a lock of one slot says none: {}",
            one.ok()
        );
    }
}

#[test]
fn a_killed_holder_s_slot_is_taken_again_and_tokens_keep_rising() {
    let sb = Sandbox::standard();
    for backend in FILE_BACKENDS {
        let lock = address(
            &sb,
            backend,
            &format!("{backend}.kill"),
            "?stale_after=2s&keepalive=200ms",
        );
        killed_slots_come_back(&|args| sb.hold(args), &lock, 4);
    }
}

/// `rounds` times: three holders of `lock` with `--slots 3` (by `hold`, which reads the OK
/// line), each token above every earlier round's, all three killed with SIGKILL; then every
/// slot is taken again (proof of death on this host), the tokens still rising.
pub fn killed_slots_come_back(hold: &dyn Fn(&[&str]) -> Held, lock: &str, rounds: usize) {
    let mut last = 0;
    for round in 0..rounds {
        let held: Vec<Held> = (0..3).map(|_| hold(&["--slots", "3", lock])).collect();
        let mut slots = BTreeSet::new();
        for h in &held {
            assert!(
                h.ok().starts_with("OK "),
                "{lock} round {round}: {}",
                h.ok()
            );
            let t = token_of(h.ok());
            assert!(t > last, "{lock} round {round}: token {t} after {last}");
            slots.insert(field(h.ok(), "slot").expect("slot=").to_string());
        }
        assert_eq!(slots.len(), 3, "{lock} round {round}: {slots:?}");
        last = held.iter().map(|h| token_of(h.ok())).max().unwrap();
        // kill -9 every holder: every slot must come back (proof of death on this host).
        for h in &held {
            kill9(h.pid());
        }
        drop(held);
    }
    let back: Vec<Held> = (0..3)
        .map(|_| hold(&["--slots", "3", "--wait", "20s", lock]))
        .collect();
    for h in &back {
        assert!(h.ok().starts_with("OK "), "{lock}: {}", h.ok());
        assert!(token_of(h.ok()) > last);
    }
}

#[test]
fn bad_numbers_of_slots_are_refused_and_take_nothing() {
    let sb = Sandbox::standard();
    let lock = address(&sb, "mkdir", "bad.lock", "");
    for n in ["0", "1025", "x", "-1", "2.5", ""] {
        let o = sb.output(["--slots", n, lock.as_str()]);
        assert_eq!(code(o.status), 64, "--slots {n:?}: {}", stdout(&o));
        assert!(stdout(&o).starts_with("ERROR usage:"), "{}", stdout(&o));
        let q = format!("{lock}?slots={n}");
        let o = sb.output([q.as_str()]);
        assert_eq!(code(o.status), 64, "{q}: {}", stdout(&o));
    }
    let o = sb.output(["--slots", "2", "--shared", "flock:/tmp/x"]);
    assert_eq!(code(o.status), 64, "{}", stdout(&o));
    sb.write_profiles(
        r#"
[profile.zero]
backend = "mkdir"
path = "{dir}/zero.lock"
slots = 0

[profile.many]
backend = "mkdir"
path = "{dir}/many.lock"
slots = 1025

[profile.text]
backend = "mkdir"
path = "{dir}/text.lock"
slots = "2"

[profile.sharedslots]
backend = "flock"
path = "{dir}/ss.lock"
slots = 2
shared = true
"#,
    );
    for p in ["zero", "many", "text", "sharedslots"] {
        let o = sb.output([p]);
        assert_eq!(code(o.status), 78, "{p}: {}", stdout(&o));
        assert!(
            stdout(&o).starts_with("ERROR config:"),
            "{p}: {}",
            stdout(&o)
        );
    }
    let names = sb.listing();
    assert!(
        names
            .iter()
            .all(|n| !n.contains("bad") && !n.contains("zero") && !n.contains("many")),
        "nothing made: {names:?}"
    );
}

#[test]
fn a_slot_held_from_another_pid_namespace_comes_back_only_after_stale_after() {
    let sb = Sandbox::standard();
    let Some(prefix) = other_pidns() else {
        return;
    };
    let stale = Duration::from_secs(2);
    for backend in ["mkdir", "link", "symlink"] {
        let lock = address(
            &sb,
            backend,
            &format!("{backend}.ns"),
            "?stale_after=2s&keepalive=200ms&poll=20ms&max_poll=100ms",
        );
        // Both slots taken: one by "another host" (no proof of death reaches it), one here.
        let mut c = sb.cmd_via(prefix, ["--slots", "2", lock.as_str()]);
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut far = Held::spawn(c);
        let line = far.read_line(Duration::from_secs(20)).unwrap_or_default();
        assert!(line.starts_with("OK "), "{backend}: {line}");
        let near = sb.hold(["--slots", "2", lock.as_str()]);
        assert!(near.ok().starts_with("OK "), "{backend}: {}", near.ok());
        // The far holder dies with its namespace: its slot is silent, not provably dead.
        let killed = std::time::Instant::now();
        kill9(far.pid());
        let _ = far.wait_exit(Duration::from_secs(10));
        let next = sb.hold(["--slots", "2", "--wait", "30s", lock.as_str()]);
        let waited = killed.elapsed();
        assert!(next.ok().starts_with("OK "), "{backend}: {}", next.ok());
        assert_eq!(
            field(next.ok(), "slot"),
            field(&line, "slot"),
            "{backend}: the far holder's slot"
        );
        assert!(
            waited + Duration::from_millis(300) >= stale,
            "{backend}: a silent holder's slot was taken after {waited:?}, before stale_after ({stale:?})"
        );
        assert!(
            token_of(next.ok()) > token_of(near.ok()),
            "{backend}: tokens keep rising"
        );
        drop(next);
        drop(near);
    }
}

/// SPEC §3b: a contender of one slot and one of several are held to the same rule. Readers
/// (shared, one slot) take no token, so no counter asks them: a contender of several slots
/// that finds a reader holding the lock itself gives its slot back and exits 78.
#[test]
fn a_slot_contender_beside_readers_of_the_lock_itself_is_refused() {
    let sb = Sandbox::standard();
    for backend in ["flock", "symlink"] {
        let lock = address(&sb, backend, &format!("{backend}.readers"), "");
        let reader = sb.hold(["--shared", lock.as_str()]);
        let o = sb.output(["--slots", "2", "--wait", "0", lock.as_str()]);
        assert_eq!(code(o.status), 78, "{backend}: {}", stdout(&o));
        assert!(
            stdout(&o).contains("1 slot (the lock itself") && stdout(&o).contains("asks for 2"),
            "{backend}: {}",
            stdout(&o)
        );
        drop(reader);
        // Nobody left in a slot: once the reader is gone, the semaphore is taken.
        let held = sb.hold(["--slots", "2", lock.as_str()]);
        assert_eq!(field(held.ok(), "slots"), Some("2"), "{}", held.ok());
    }
}

/// The part of every backend's semaphore test that is the same everywhere (each backend adds
/// its layout and counter): three holders of `lock` with `--slots 3` (commands made by `ls`)
/// get slots 0, 1 and 2 and a token each, which `status --json` shows beside each slot's
/// holder with its pid; a fourth is busy (75) and names the slots' holders; `--slots 1` and
/// `--slots 4` are refused with 78 naming both numbers. Returns the holders, still holding,
/// and their tokens in order.
pub fn three_holders(ls: crate::fair::Locksmith<'_>, lock: &str) -> (Vec<Held>, Vec<u64>) {
    let out = |args: &[&str]| output_within(ls(args), Duration::from_secs(60));
    let held: Vec<Held> = (0..3)
        .map(|_| {
            let mut c = ls(&["--slots", "3", lock]);
            c.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            let mut h = Held::spawn(c);
            h.read_line(Duration::from_secs(20));
            h
        })
        .collect();
    let mut want: Vec<(u64, u64, i64)> = held
        .iter()
        .map(|h| {
            let slot = field(h.ok(), "slot")
                .unwrap_or_else(|| panic!("{lock}: {}", h.ok()))
                .parse()
                .unwrap();
            (slot, token_of(h.ok()), i64::from(h.pid()))
        })
        .collect();
    want.sort();
    let slots: Vec<u64> = want.iter().map(|w| w.0).collect();
    assert_eq!(slots, [0, 1, 2], "{lock}: three holders, three slots");
    let mut tokens: Vec<u64> = want.iter().map(|w| w.1).collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "{lock}: a token per grant: {want:?}");
    // status: every slot's holder, with the token and pid of its OK line.
    let o = out(&["--slots", "3", "status", "--json", lock]);
    assert_eq!(code(o.status), 1, "{lock}: {}", stdout(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut shown: Vec<(u64, u64, i64)> = v["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["slot"].as_u64().unwrap(),
                h["token"].as_u64().unwrap_or(0),
                h["pid"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    shown.sort();
    assert_eq!(shown, want, "{lock}: {}", stdout(&o));
    // Full: the fourth is busy, naming the slots' holders.
    let o = out(&["--slots", "3", "--wait", "0", lock]);
    assert_eq!(code(o.status), 75, "{lock}: {}", stdout(&o));
    assert!(stdout(&o).contains("slot="), "{lock}: {}", stdout(&o));
    // Another number while they hold: 78 naming both, nothing taken.
    for other in ["1", "4"] {
        let o = out(&["--slots", other, "--wait", "0", lock]);
        let text = stdout(&o);
        assert_eq!(code(o.status), 78, "{lock} --slots {other}: {text}");
        assert!(
            text.starts_with("ERROR config:")
                && text.contains("3 slot")
                && text.contains(&format!("asks for {other}")),
            "{lock} --slots {other}: {text}"
        );
    }
    (held, tokens)
}

/// The race every backend's semaphore test runs ([`race_env`] on 3 slots): never two holders
/// in one slot, never more than three inside, every run once, a token per grant. Returns the
/// tokens in order.
pub fn race_checked(
    sb: &Sandbox,
    lock: &str,
    workers: usize,
    rounds: usize,
    env: &[(&str, &str)],
) -> Vec<u64> {
    let (inside, tokens, overlaps) = race_env(sb, lock, 3, workers, rounds, env);
    assert_eq!(overlaps, 0, "{lock}: two holders in one slot");
    assert_eq!(inside.len(), workers * rounds, "{lock}: every run ran once");
    let most = *inside.iter().max().unwrap();
    assert!(most <= 3, "{lock}: {most} inside 3 slots: {inside:?}");
    eprintln!(
        "{lock}: at most {most} of 3 inside over {} runs",
        inside.len()
    );
    let mut sorted = tokens.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        workers * rounds,
        "{lock}: a token per grant: {tokens:?}"
    );
    sorted
}

/// A reader (`--shared`, one slot) arriving while slots are held is refused too (SPEC §3b:
/// never more holders than the recorded N), and takes nothing: on the file backends that
/// share, then the part every backend shares ([`beside_three_holders`]) on each.
#[test]
fn a_reader_or_a_waiter_of_another_number_beside_slot_holders_is_refused_at_once() {
    let sb = Sandbox::standard();
    for backend in FILE_BACKENDS {
        let lock = address(&sb, backend, &format!("{backend}.beside"), "");
        // (Not `three_holders`: flock's status shows no tokens.)
        let mut held = held_three(&sb, &lock);
        let shared = matches!(backend, "flock" | "symlink");
        beside_three_holders(&|a| sb.cmd(a), &lock, &mut held, shared);
        drop(held);
        // Once nobody holds, a reader's number stands again.
        eventually(Duration::from_secs(10), "the semaphore is free", || {
            code(sb.output(["--slots", "3", "status", lock.as_str()]).status) == 0
        });
        if shared {
            let reader = sb.hold(["--shared", lock.as_str()]);
            assert!(reader.ok().starts_with("OK "), "{backend}: {}", reader.ok());
        }
    }
}

/// Beside the three holders of `lock` (`--slots 3`) that [`three_holders`] returned: a reader
/// (where `shared`) is refused with 78 naming both numbers; with slot 2 freed, a contender of
/// 2 slots, whose own slots are all held by contenders of 3, is refused at once rather than
/// waiting for a slot to free; neither leaves anything behind. `held` keeps slots 0 and 1.
pub fn beside_three_holders(
    ls: crate::fair::Locksmith<'_>,
    lock: &str,
    held: &mut Vec<Held>,
    shared: bool,
) {
    let out = |args: &[&str]| output_within(ls(args), Duration::from_secs(60));
    if shared {
        let o = out(&["--shared", "--wait", "0", lock]);
        let text = stdout(&o);
        assert_eq!(code(o.status), 78, "{lock} --shared: {text}");
        assert!(
            text.starts_with("ERROR config:")
                && text.contains("3 slot(s) recorded")
                && text.contains("asks for 1"),
            "{lock} --shared: {text}"
        );
    }
    let k = held
        .iter()
        .position(|h| field(h.ok(), "slot") == Some("2"))
        .expect("a holder of slot 2");
    let mut gone = held.remove(k);
    gone.close_stdout();
    assert!(gone.wait_exit(Duration::from_secs(20)).success(), "{lock}");
    let began = std::time::Instant::now();
    let o = out(&["--slots", "2", "--wait", "30s", lock]);
    let text = stdout(&o);
    assert_eq!(code(o.status), 78, "{lock} --slots 2 behind 3: {text}");
    assert!(
        text.contains("3 slot(s) recorded") && text.contains("asks for 2"),
        "{lock} --slots 2 behind 3: {text}"
    );
    assert!(
        began.elapsed() < Duration::from_secs(20),
        "{lock}: the waiter of 2 was refused only after {:?}",
        began.elapsed()
    );
    // Only slots 0 and 1 held: the refused took nothing (slot 2 is free).
    let o = out(&["--slots", "3", "status", "--json", lock]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut slots: Vec<u64> = v["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["slot"].as_u64().unwrap_or(99))
        .collect();
    slots.sort();
    assert_eq!(slots, [0, 1], "{lock}: {}", stdout(&o));
}

/// Each run of CMD in [`mixed_race`]: a marker `$D/$KIND.PID`, then every marker of the
/// other kind there is written down as an overlap (of two runs inside at once, the later
/// to make its marker sees the earlier's), then out after `$SPIN` turns.
const MIXED: &str = r#"
touch "$D/$KIND.$$"
for o in "$D/$OTHER".*; do [ -e "$o" ] && echo "$KIND.$$ beside $o" >> "$D/overlaps"; done
echo "$KIND $$ ${LOCKSMITH_SLOT:--} ${LOCKSMITH_TOKEN:--}" >> "$D/ran"
i=0; while [ $i -lt "${SPIN:-300}" ]; do i=$((i+1)); done
rm "$D/$KIND.$$"
"#;

/// `workers` loops of `rounds` runs each on `lock`, each run a contender of 2 slots or one
/// of one slot with `one` (`--shared`, or nothing: exclusive), in turn (half the workers
/// start with each: a kind that holds refuses the other, and its runs alone would go on);
/// each run ends admitted (0), busy (75) or refused for the other number (78). Returns how many runs
/// of each kind (slots, one) were admitted, and the overlaps: a run of one kind inside
/// beside a run of the other (with every admitted run's kind, pid, slot and token).
pub fn mixed_race(
    sb: &Sandbox,
    lock: &str,
    one: &[&str],
    workers: usize,
    rounds: usize,
    env: &[(&str, &str)],
) -> (usize, usize, Vec<String>) {
    // Exclusive contenders of one slot do not wait: a waiter behind its own kind would keep
    // the lock itself taken by that kind for good. (Readers wait only for writers.)
    let wait = if one.is_empty() { "0" } else { "60s" };
    let d = sb.join("mixed");
    let _ = fs::remove_dir_all(&d);
    fs::create_dir(&d).unwrap();
    let threads: Vec<_> = (0..workers)
        .map(|w| {
            let runs: Vec<Command> = ["s", "o"]
                .into_iter()
                .map(|kind| {
                    let (mut args, other): (Vec<&str>, _) = if kind == "s" {
                        (vec!["--slots", "2"], "o")
                    } else {
                        (one.to_vec(), "s")
                    };
                    args.extend(["--wait", wait, "run", lock, "--", "sh", "-c", MIXED]);
                    let mut c: Command = sb.cmd(args);
                    c.env("D", &d)
                        .env("KIND", kind)
                        .env("OTHER", other)
                        .envs(env.iter().copied());
                    c
                })
                .collect();
            std::thread::spawn(move || {
                let mut runs = runs;
                for k in 0..rounds {
                    let kind = (w + k) % 2;
                    let o = runs[kind].output().unwrap();
                    let said = format!("{}{}", stdout(&o), stderr(&o));
                    let refused = code(o.status) == 78
                        && said.lines().any(|l| {
                            l.starts_with("ERROR config:")
                                && l.contains("all contenders of one lock must agree")
                        });
                    assert!(
                        o.status.success() || refused || code(o.status) == 75,
                        "{} round {k}: exit {}: {said}",
                        ["s", "o"][kind],
                        code(o.status),
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a worker failed");
    }
    let ran = fs::read_to_string(d.join("ran")).unwrap_or_default();
    let mut overlaps: Vec<String> = fs::read_to_string(d.join("overlaps"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    if !overlaps.is_empty() {
        overlaps.push(format!("ran: {ran}"));
    }
    (
        ran.lines().filter(|l| l.starts_with("s ")).count(),
        ran.lines().filter(|l| l.starts_with("o ")).count(),
        overlaps,
    )
}

/// [`mixed_race`], checked: never a contender of 2 slots inside beside one of one slot
/// (acting at the same time, at least one of them is refused), and both kinds got in — on a
/// slow backend one kind may keep the other out for a whole race, so up to three more races
/// are run until each kind got in once.
pub fn mixed_race_checked(
    sb: &Sandbox,
    lock: &str,
    one: &[&str],
    workers: usize,
    rounds: usize,
    env: &[(&str, &str)],
) {
    let (mut slots, mut ones) = (0, 0);
    for race in 0..4 {
        let (s, o, overlaps) = mixed_race(sb, lock, one, workers, rounds, env);
        eprintln!(
            "{lock} {one:?} race {race}: {s} runs of 2 slots and {o} of one admitted of {}, {} overlaps",
            workers * rounds,
            overlaps.len()
        );
        assert!(
            overlaps.is_empty(),
            "{lock} {one:?}: another number inside beside: {overlaps:?}"
        );
        (slots, ones) = (slots + s, ones + o);
        if slots > 0 && ones > 0 {
            return;
        }
    }
    panic!("{lock} {one:?}: both kinds admitted ({slots}, {ones})");
}

/// Readers and contenders of 2 slots (flock, symlink: the backends that share), and
/// exclusive contenders of one slot and of 2 (every file backend), all at once, many
/// rounds: never both kinds inside together.
#[test]
fn contenders_of_one_slot_and_of_two_acting_at_once_are_never_both_admitted() {
    let _heavy = heavy();
    let sb = Sandbox::standard();
    for backend in FILE_BACKENDS {
        if matches!(backend, "flock" | "symlink") {
            let lock = address(&sb, backend, &format!("{backend}.mixr"), "");
            mixed_race_checked(&sb, &lock, &["--shared"], 8, 30, &[]);
        }
        let lock = address(&sb, backend, &format!("{backend}.mixx"), "");
        mixed_race_checked(&sb, &lock, &[], 8, 20, &[]);
    }
}

/// After the lock was used with one slot, contenders of 3 acting at once all agree with each
/// other: the looks that find whether a holder of one slot is still there must not find each
/// other (flock's look is a lock of its own for a moment: two of them refused each other, and
/// 78 came at once — the bench's semaphore row, issue 26).
#[test]
fn contenders_of_a_new_number_acting_at_once_after_the_lock_was_freed_are_not_refused() {
    let _heavy = heavy();
    let sb = Sandbox::standard();
    for backend in FILE_BACKENDS {
        let lock = address(&sb, backend, &format!("{backend}.renum"), "");
        for round in 0..4 {
            let o = sb.output(["--wait", "10s", "run", &lock, "--", "true"]);
            assert_eq!(code(o.status), 0, "{backend}: {}", stderr(&o));
            let workers: Vec<_> = (0..8)
                .map(|_| {
                    let mut c =
                        sb.cmd(["--slots", "3", "--wait", "60s", "run", &lock, "--", "true"]);
                    c.stdout(Stdio::null()).stderr(Stdio::piped());
                    std::thread::spawn(move || {
                        (0..4)
                            .map(|_| c.output().unwrap())
                            .filter(|o| !o.status.success())
                            .map(|o| format!("exit {}: {}", code(o.status), stderr(&o)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            let failed: Vec<String> = workers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect();
            assert!(
                failed.is_empty(),
                "{backend} round {round}: {} of 32 contenders of 3 slots failed after a run of one: {:?}",
                failed.len(),
                &failed[..failed.len().min(3)]
            );
        }
    }
}

/// SPEC §3b, "the lock records N while anyone holds or waits", on a backend whose waiters
/// keep a waiting room (`waiting.rs`): a waiter of 2 slots behind two holders is stopped
/// (SIGSTOP: the moment between a release and its next try, made long), both holders leave,
/// and a contender of 3 is refused (78, naming both numbers) rather than
/// taking the lock the waiter waits for; the waiter, let go, gets its slot. Once nobody holds
/// or waits, 3 stands.
pub fn a_stopped_waiter_keeps_its_number(ls: crate::fair::Locksmith<'_>, lock: &str) {
    use nix::sys::signal::Signal;
    let t = Duration::from_secs(30);
    let out = |args: &[&str]| output_within(ls(args), Duration::from_secs(60));
    let held = |args: &[&str]| {
        let mut c = ls(args);
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        Held::spawn(c)
    };
    let mut holders: Vec<Held> = (0..2)
        .map(|_| {
            let mut h = held(&["--slots", "2", lock]);
            h.read_line(t);
            assert!(h.ok().starts_with("OK "), "{lock}: {}", h.ok());
            h
        })
        .collect();
    let mut w = held(&["-v", "--slots", "2", lock]);
    w.wait_stderr("waiting in its waiting room", t);
    w.signal(Signal::SIGSTOP as i32);
    for h in &mut holders {
        h.close_stdout();
        assert!(h.wait_exit(t).success(), "{lock}: a holder's release");
    }
    let o = out(&["--slots", "3", "--wait", "0", lock]);
    let text = stdout(&o);
    assert_eq!(
        code(o.status),
        78,
        "{lock} --slots 3 beside a waiter of 2: {text}"
    );
    assert!(
        text.starts_with("ERROR config:")
            && text.contains("waited for with 2 slot(s)")
            && text.contains("waiting room")
            && text.contains("asks for 3"),
        "{lock}: {text}"
    );
    w.signal(Signal::SIGCONT as i32);
    w.read_line(t);
    assert_eq!(field(w.ok(), "slots"), Some("2"), "{lock}: {}", w.ok());
    w.close_stdout();
    assert!(w.wait_exit(t).success(), "{lock}: the waiter's release");
    // Nobody holds or waits: the next contender's number stands.
    let mut three = held(&["--slots", "3", lock]);
    three.read_line(t);
    assert_eq!(
        field(three.ok(), "slots"),
        Some("3"),
        "{lock}: {}",
        three.ok()
    );
}

#[test]
fn a_waiter_s_number_of_slots_stands_against_a_newcomer_on_the_lock_directory_backends() {
    let sb = Sandbox::standard();
    for backend in ["mkdir", "link", "symlink"] {
        let lock = address(&sb, backend, &format!("{backend}.room"), "");
        a_stopped_waiter_keeps_its_number(&|a| sb.cmd(a), &lock);
    }
}

/// Something else at the waiting room's name (a FIFO another user planted) fails nothing: a
/// waiter cannot wait there, says so at `-v` and is served all the same; a contender of
/// another number, once nobody holds or waits, is not kept out by it (no hang either).
#[test]
fn a_fifo_at_the_waiting_room_s_name_fails_no_waiter_and_no_contender() {
    let sb = Sandbox::standard();
    let t = Duration::from_secs(30);
    for backend in ["mkdir", "link", "symlink"] {
        let name = format!("{backend}.fifo");
        nix::unistd::mkfifo(
            &sb.join(&format!(".{name}.waiting")),
            nix::sys::stat::Mode::from_bits_truncate(0o666),
        )
        .unwrap();
        let lock = address(&sb, backend, &name, "");
        let h = sb.hold(["--slots", "2", lock.as_str()]);
        let h2 = sb.hold(["--slots", "2", lock.as_str()]);
        let mut w = sb.spawn_hold(["-v", "--slots", "2", lock.as_str()]);
        w.wait_stderr("cannot wait in its waiting room", t);
        drop(h);
        w.read_line(t);
        assert_eq!(field(w.ok(), "slots"), Some("2"), "{backend}: {}", w.ok());
        drop(w);
        drop(h2);
        eventually(t, "the semaphore is free", || {
            code(sb.output(["--slots", "2", "status", lock.as_str()]).status) == 0
        });
        let three = sb.hold(["--slots", "3", lock.as_str()]);
        assert_eq!(
            field(three.ok(), "slots"),
            Some("3"),
            "{backend}: {}",
            three.ok()
        );
    }
}

/// The room keeps a waiter's own number, not only that someone waits: a waiter of one slot
/// behind a reader (readers record nothing), the record saying 2, is stopped; the reader
/// leaves; a contender of 2 — the number recorded — is refused all the same (78, "waited
/// for with 1 slot(s)"); the waiter, let go, gets the lock.
#[test]
fn a_waiter_of_one_slot_behind_a_reader_keeps_its_number_against_the_recorded_one() {
    use nix::sys::signal::Signal;
    let sb = Sandbox::standard();
    let t = Duration::from_secs(30);
    let lock = address(&sb, "symlink", "symlink.behind", "");
    let two = sb.hold(["--slots", "2", lock.as_str()]);
    assert_eq!(field(two.ok(), "slots"), Some("2"), "{}", two.ok());
    drop(two);
    eventually(t, "the semaphore is free", || {
        code(sb.output(["--slots", "2", "status", lock.as_str()]).status) == 0
    });
    let reader = sb.hold(["--shared", lock.as_str()]);
    let mut w = sb.spawn_hold(["-v", lock.as_str()]);
    w.wait_stderr("waiting in its waiting room", t);
    w.signal(Signal::SIGSTOP as i32);
    drop(reader);
    eventually(t, "the reader gone", || {
        code(sb.output(["status", lock.as_str()]).status) == 0
    });
    let o = output_within(
        sb.cmd([
            "--slots",
            "2",
            "--wait",
            "0",
            "run",
            lock.as_str(),
            "--",
            "true",
        ]),
        t,
    );
    let text = format!("{}{}", stdout(&o), stderr(&o));
    assert_eq!(code(o.status), 78, "--slots 2 beside a waiter of 1: {text}");
    assert!(
        text.contains("waited for with 1 slot(s)") && text.contains("asks for 2"),
        "{text}"
    );
    w.signal(Signal::SIGCONT as i32);
    w.read_line(t);
    assert!(w.ok().starts_with("OK "), "{}", w.ok());
    assert_eq!(field(w.ok(), "slots"), None, "{}", w.ok());
}
