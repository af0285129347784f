#!/usr/bin/env bash
# locksmith's etcd backend beside `etcdctl lock` on the same throwaway etcd member (loopback).
# Measures, does not assert: spawn → OK, handoff (holder releases → waiter holds), crash release
# (the holder's parent SIGKILLed; etcdctl lock does not watch its parent, so for it the row is
# the holder itself SIGKILLed, freed when its session TTL runs out) and takeover after the
# holding helper itself is SIGKILLed (both with a 2 s TTL: locksmith's waiter on the same host
# revokes a dead holder's lease by proof of death, etcdctl's waits for the TTL; a locksmith
# holder in another pid namespace — as on another host — is waited out like etcdctl's).
# Medians (min–max) over RUNS runs (default 20; SLOW_RUNS, default 5, for the TTL-bound rows).
# BENCH_TSV=FILE also writes the samples as TSV (for locksmith-bench --etcd).
#
#   bench/etcd-vs-etcdctl.sh [path/to/locksmith]     (default: target/release/locksmith)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/locksmith}
RUNS=${RUNS:-20}
SLOW_RUNS=${SLOW_RUNS:-5}
[ -x "$BIN" ] || { echo "build first: cargo build --release -p locksmith-helper" >&2; exit 2; }
for t in etcd etcdctl perl python3; do
  command -v "$t" >/dev/null || { echo "needs $t" >&2; exit 2; }
done

dir=$(mktemp -d /tmp/locksmith-bench-etcd.XXXXXX)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cport=$(port); pport=$(port)
etcd --data-dir "$dir/data" --name b \
  --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
  --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
  --initial-cluster "b=http://127.0.0.1:$pport" >"$dir/etcd.log" 2>&1 &
epid=$!
trap 'kill -9 $epid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$cport" endpoint health >/dev/null 2>&1 && break
  sleep 0.1
done
cat >"$dir/p.toml" <<EOF
[profile.e]
backend = "etcd"
endpoints = ["http://127.0.0.1:$cport"]
prefix = "/bench/ls"

[profile.e2]
backend = "etcd"
endpoints = ["http://127.0.0.1:$cport"]
prefix = "/bench/ls2"
stale_after = "2s"
keepalive = "500ms"
EOF

PYTHONPATH="$(pwd)/bench" python3 - "$BIN" "$dir/p.toml" "$cport" "$RUNS" "$SLOW_RUNS" <<'PY'
import os, signal, statistics, subprocess, sys, time
import semfair
BIN, PROF, PORT, RUNS, SLOW = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
EP = f"--endpoints=127.0.0.1:{PORT}"
env = dict(os.environ, ETCDCTL_API="3")

def ls(*a):
    return [BIN, "-q", "--profiles", PROF, *a]

def ctl(name, ttl=10):
    return ["etcdctl", EP, "lock", f"--ttl={ttl}", name]

def spawn(cmd):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env)

def parent(cmd):
    # A Perl parent holding the helper's stdout pipe and echoing its first line (the seed's style).
    script = 'open(L, "-|", @ARGV) or die; $| = 1; my $l = <L>; print $l; sleep 1000;'
    return spawn(["perl", "-e", script, *cmd])

def line(p):
    l = p.stdout.readline()
    assert l, "no line"
    return time.monotonic()

def release_ls(p):
    p.stdout.close(); p.wait()

def release_ctl(p):
    p.send_signal(signal.SIGINT); p.wait()

def queued():
    time.sleep(0.3)  # let the waiter queue behind the holder (not part of the figure)

res = {}
def record(k, v):
    res.setdefault(k, []).append(v * 1000)

for i in range(RUNS):
    kinds = [("locksmith", lambda: ls("e"), release_ls), ("etcdctl", lambda: ctl("/bench/ctl"), release_ctl)]
    if i % 2: kinds.reverse()
    for name, cmd, rel in kinds:
        t0 = time.monotonic(); a = spawn(cmd()); t1 = line(a); record((name, "spawn → OK"), t1 - t0)
        b = spawn(cmd()); queued()
        t0 = time.monotonic(); rel(a); t1 = line(b); record((name, "handoff"), t1 - t0)
        rel(b)
    # Crash release: the holder's parent SIGKILLed (locksmith sees the pipe and the pidfd).
    a = parent(ls("e")); line(a); b = spawn(ls("e")); queued()
    t0 = time.monotonic(); a.kill(); a.wait(); t1 = line(b); record(("locksmith", "crash: parent SIGKILL → waiter holds"), t1 - t0)
    release_ls(b)

HELPER_KILL = "helper SIGKILLed → waiter holds (TTL 2 s)"
OTHER_NS = "helper SIGKILLed in another pid namespace → waiter holds (TTL 2 s)"
# `unshare` is killed, taking its pid namespace (and the holder in it) down.
in_ns = ["unshare", "--pid", "--fork", "--kill-child", "sh", "-c", '"$@"; :', "sh"]
can_unshare = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True).returncode == 0
for i in range(SLOW):
    cases = [("locksmith", HELPER_KILL, lambda: ls("e2")), ("etcdctl", HELPER_KILL, lambda: ctl("/bench/ctl2", 2))]
    if can_unshare:
        cases.append(("locksmith", OTHER_NS, lambda: in_ns + ls("e2")))
    for name, metric, cmd in cases:
        a = spawn(cmd()); line(a); b = spawn(cmd() if metric != OTHER_NS else ls("e2")); queued()
        t0 = time.monotonic(); a.kill(); a.wait(); t1 = line(b)
        record((name, metric), t1 - t0)
        if name == "locksmith": release_ls(b)
        else: release_ctl(b)

rows = []
for k in ["spawn → OK", "handoff", "crash: parent SIGKILL → waiter holds", HELPER_KILL, OTHER_NS]:
    cells = []
    for n in ["locksmith", "etcdctl"]:
        v = res.get((n, k))
        cells.append(f"{statistics.median(v):.2f} ms ({min(v):.2f}–{max(v):.2f}, n={len(v)})" if v else "—")
    rows.append(f"| {k} | {cells[0]} | {cells[1]} |")
print("| metric (median, min–max) | locksmith etcd | etcdctl lock |")
print("| --- | --- | --- |")
print("\n".join(rows))
sem = semfair.rows("etcd", BIN, lambda name: f"etcd://127.0.0.1:{PORT}/bench/{name}", max(3, RUNS // 4))
semfair.show(sem)
out = os.environ.get("BENCH_TSV")
if out:
    with open(out, "w") as fh:
        for (n, k), v in res.items():
            tool = "locksmith etcd" if n == "locksmith" else "etcdctl lock"
            fh.write(f"etcd: {k}\t{tool}\tms\t{','.join(f'{x:.4f}' for x in v)}\n")
        fh.write(semfair.tsv(sem))
PY
