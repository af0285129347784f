#!/usr/bin/env bash
# Side by side against a private pure-ftpd on 127.0.0.1: `locksmith p` (backend ftp) and the
# seed's Perl helper reconstructed (Net::FTP: MKD loop with `sleep 4`, then PWD + a dot down the
# pipe every 5 s; it notices the parent only when that dot fails). Alternating, RUNS each:
# spawn → OK (beside the raw connect+login+MKD floor), pipe close → lock directory gone on the
# server's disk, parent SIGKILL → gone, handoff to a waiter, RSS. SLOW_RUNS (default 3) bounds
# the seed's slow rows; BENCH_TSV=FILE also writes the samples as TSV (for locksmith-bench --ftp).
# Needs root, pure-ftpd, openssl, perl, python3.  Usage: bench/ftp-vs-seed.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-10}
B=${LOCKSMITH_BIN:-target/release/locksmith}
[ -x "$B" ] || cargo build -q --release -p locksmith-helper
D=$(mktemp -d); chmod 755 "$D"; root="$D/root"; mkdir -p "$root/locks"; chown -R 65534:65534 "$root"
hash=$(printf 'secret\n' | openssl passwd -6 -stdin)
echo "locker:$hash:65534:65534::$root/./::::::::::::" > "$D/passwd"
pure-pw mkdb "$D/pdb" -f "$D/passwd" >/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pure-ftpd -S "127.0.0.1,$port" -l "puredb:$D/pdb" -E -A -H -c 50 -C 50 -p 41000:41200 -P 127.0.0.1 >/dev/null 2>&1 &
PID=$!
disown $PID
trap 'kill -9 $PID 2>/dev/null || true; pkill -9 -P $PID 2>/dev/null || true; rm -rf "$D"' EXIT
for _ in $(seq 100); do python3 -c "import socket; socket.create_connection(('127.0.0.1',$port),1)" 2>/dev/null && break; sleep 0.05; done
cat > "$D/p.toml" <<EOF
[profile.p]
backend = "ftp"
host = "127.0.0.1"
port = $port
user = "locker"
password_env = "FTPPW"
path = "locks/p"
EOF
# The semaphore and fair-queue rows' locks (bench/semfair.py), taken by profile name.
for n in sem1 sem3 fair; do
  printf '\n[profile.%s]\nbackend = "ftp"\nhost = "127.0.0.1"\nport = %s\nuser = "locker"\npassword_env = "FTPPW"\npath = "locks/%s"\n' "$n" "$port" "$n" >> "$D/p.toml"
done
cat > "$D/seed.pl" <<EOF
use Net::FTP;
\$SIG{PIPE} = 'IGNORE';
my \$ftp = Net::FTP->new("127.0.0.1", Port => $port, Passive => 1) or die "connect: \$@";
\$ftp->login("locker", "secret") or die "login";
until (\$ftp->mkdir("locks/s")) { sleep 4 }
\$| = 1;
print "OK\n";
while (1) { sleep 5; \$ftp->pwd; print "." or last; }
\$ftp->rmdir("locks/s");
\$ftp->quit;
EOF
FTPPW=secret LOCKSMITH_PROFILES="$D/p.toml" PYTHONPATH="$(pwd)/bench" python3 - "$B" "$D" "$root" "$RUNS" "$port" <<'PY'
import ftplib, os, signal, subprocess, sys, time, statistics
import semfair
b, d, root, runs, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
slow = max(1, int(os.environ.get("SLOW_RUNS", "3")))
tools = {
    "locksmith p (ftp)": ([b, "--profiles", d + "/p.toml", "p"], root + "/locks/p"),
    "seed Perl helper": (["perl", d + "/seed.pl"], root + "/locks/s"),
}
rows = {}  # (metric, tool, unit) -> samples
def rec(metric, tool, unit, v):
    rows.setdefault((metric, tool, unit), []).append(v)
def gone(lock, t0, what):
    while os.path.exists(lock):
        if time.perf_counter() - t0 > 30: raise SystemExit(f"{what}: lock not released in 30 s")
        time.sleep(0.0002)
    return time.perf_counter()
def holder(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = p.stdout.readline()
    assert line.startswith(b"OK"), (cmd, line)
    return p
# A parent that holds the helper's pipe and relays its OK: killing it is the crash case.
PARENT = 'open(L, "-|", @ARGV) or die "spawn: $!"; $| = 1; print scalar(<L>); sleep 1000;'
for i in range(runs):
    # The floor: what any FTP lock must pay at least, on a fresh connection.
    t0 = time.perf_counter()
    f = ftplib.FTP(); f.connect("127.0.0.1", port); f.login("locker", "secret"); f.mkd("locks/floor")
    rec("FTP spawn → OK", "floor: connect + login + MKD (python ftplib)", "ms", (time.perf_counter() - t0) * 1000)
    f.rmd("locks/floor"); f.quit()
    for k in (list(tools) if i % 2 == 0 else list(reversed(tools))):
        cmd, lock = tools[k]
        t0 = time.perf_counter()
        p = holder(cmd)
        t1 = time.perf_counter()
        with open(f"/proc/{p.pid}/status") as fh:
            rss = next(int(l.split()[1]) for l in fh if l.startswith("VmRSS"))
        p.stdout.close()
        t2 = time.perf_counter()
        t3 = gone(lock, t2, k)
        p.wait()
        rec("FTP spawn → OK", k, "ms", (t1 - t0) * 1000)
        rec("FTP pipe close → lock gone", k, "ms", (t3 - t2) * 1000)
        rec("FTP RSS while holding", k, "MiB", rss / 1024)
        # Parent SIGKILLed: the helper's own release, seen on the server's disk.
        if k.startswith("locksmith") or i < slow:
            par = subprocess.Popen(["perl", "-e", PARENT] + cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            line = par.stdout.readline()
            assert line.startswith(b"OK"), (k, line)
            t0 = time.perf_counter()
            par.send_signal(signal.SIGKILL)
            t1 = gone(lock, t0, k + " after parent SIGKILL")
            par.wait(); par.stdout.close()
            rec("FTP parent SIGKILL → lock gone", k, "ms", (t1 - t0) * 1000)
        # Handoff: the holder's pipe closes, a waiter that polls the server takes over.
        if k.startswith("locksmith") or i < slow:
            a = holder(cmd)
            w = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            time.sleep(0.3)
            t0 = time.perf_counter()
            a.stdout.close()
            line = w.stdout.readline()
            t1 = time.perf_counter()
            assert line.startswith(b"OK"), (k, line)
            a.wait(); w.stdout.close(); gone(lock, time.perf_counter(), k); w.wait()
            rec("FTP handoff (holder's pipe closed → waiter's OK)", k, "ms", (t1 - t0) * 1000)
print(f"pure-ftpd on 127.0.0.1, {runs} runs each ({slow} for the seed's slow rows), alternating; medians (min–max)")
for (m, k, u), v in rows.items():
    print(f"{m:52s} {k:46s} {statistics.median(v):9.2f} {u} ({min(v):.2f}–{max(v):.2f}, n={len(v)})")
# Semaphores and fair queues (SPEC §3b; issue 26), as for the other network backends: the
# locks are profiles of $D/p.toml (LOCKSMITH_PROFILES).
sem = semfair.rows("ftp", b, lambda name: name, max(3, runs // 4))
semfair.show(sem)
out = os.environ.get("BENCH_TSV")
if out:
    with open(out, "w") as fh:
        for (m, k, u), v in rows.items():
            fh.write(f"{m}\t{k}\t{u}\t{','.join(f'{x:.4f}' for x in v)}\n")
        fh.write(semfair.tsv(sem))
PY
