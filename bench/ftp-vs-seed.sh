#!/usr/bin/env bash
# Side by side against a private pure-ftpd on 127.0.0.1: `locksmith p` (backend ftp) and the
# seed's Perl helper reconstructed (Net::FTP: MKD loop with `sleep 4`, then PWD + a dot down the
# pipe every 5 s; it notices the parent only when that dot fails). Alternating, RUNS each:
# spawn → OK, and pipe close → lock directory gone on the server's disk.
# Needs root, pure-ftpd, openssl, perl, python3.  Usage: bench/ftp-vs-seed.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-10}
B=${LOCKSMITH_BIN:-target/release/locksmith}
[ -x "$B" ] || cargo build -q --release -p locksmith
D=$(mktemp -d); chmod 755 "$D"; root="$D/root"; mkdir -p "$root/locks"; chown -R 65534:65534 "$root"
hash=$(printf 'secret\n' | openssl passwd -6 -stdin)
echo "locker:$hash:65534:65534::$root/./::::::::::::" > "$D/passwd"
pure-pw mkdb "$D/pdb" -f "$D/passwd" >/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pure-ftpd -S "127.0.0.1,$port" -l "puredb:$D/pdb" -E -A -H -c 50 -C 50 -p 41000:41200 -P 127.0.0.1 >/dev/null 2>&1 &
PID=$!
disown $PID
trap 'kill -9 $PID 2>/dev/null; pkill -9 -P $PID 2>/dev/null; rm -rf "$D"' EXIT
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
FTPPW=secret python3 - "$B" "$D" "$root" "$RUNS" <<'PY'
import os, subprocess, sys, time, statistics
b, d, root, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tools = {
    "locksmith p (ftp)": ([b, "--profiles", d + "/p.toml", "p"], root + "/locks/p"),
    "seed Perl helper": (["perl", d + "/seed.pl"], root + "/locks/s"),
}
res = {k: {"ok": [], "release": [], "rss": []} for k in tools}
for i in range(runs):
    for k in (list(tools) if i % 2 == 0 else list(reversed(tools))):
        cmd, lock = tools[k]
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        line = p.stdout.readline()
        t1 = time.perf_counter()
        assert line.startswith(b"OK"), (k, line)
        with open(f"/proc/{p.pid}/status") as f:
            rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS"))
        p.stdout.close()
        t2 = time.perf_counter()
        while os.path.exists(lock):
            if time.perf_counter() - t2 > 30: raise SystemExit(f"{k}: lock not released in 30 s")
            time.sleep(0.0005)
        t3 = time.perf_counter()
        p.wait()
        res[k]["ok"].append((t1 - t0) * 1000); res[k]["release"].append((t3 - t2) * 1000); res[k]["rss"].append(rss / 1024)
print(f"pure-ftpd on 127.0.0.1, {runs} runs each, alternating; medians (min–max)")
for k, r in res.items():
    f = lambda v, u: f"{statistics.median(v):.1f} {u} ({min(v):.1f}–{max(v):.1f})"
    print(f"{k:20s} spawn→OK {f(r['ok'], 'ms'):28s} pipe close→lock gone {f(r['release'], 'ms'):32s} RSS {f(r['rss'], 'MiB')}")
PY
