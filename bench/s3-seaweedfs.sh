#!/usr/bin/env bash
# locksmith's s3 backend on a throwaway SeaweedFS (`weed mini`, loopback). Measures, does not
# assert: spawn → OK, handoff (holder's pipe closed → waiter holds), crash release (the
# holder's parent SIGKILLed) and takeover after the holding helper itself is SIGKILLed (same
# host: proof of death). Medians (min–max) over RUNS runs (default 20). The bucket is made
# with curl's SigV4 (test credentials only). BENCH_TSV=FILE also writes the samples as TSV
# (for locksmith-bench --s3).
#
#   bench/s3-seaweedfs.sh [path/to/locksmith]     (default: target/release/locksmith)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/locksmith}
RUNS=${RUNS:-20}
[ -x "$BIN" ] || { echo "build first: cargo build --release -p locksmith-helper" >&2; exit 2; }
for t in weed curl python3; do
  command -v "$t" >/dev/null || { echo "needs $t" >&2; exit 2; }
done
dir=$(mktemp -d /tmp/locksmith-bench-s3.XXXXXX)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ports=(); for _ in $(seq 10); do ports+=("$(port)"); done
admin_grpc=$((ports[8] + 10000))
cat >"$dir/s3.json" <<EOF
{"identities":[{"name":"b","credentials":[{"accessKey":"bench","secretKey":"bench-secret"}],"actions":["Admin","Read","Write","List"]}]}
EOF
mkdir "$dir/data"
weed -logdir="$dir" mini -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 -master.telemetry=false \
  -webdav=false -admin.ui=false -s3.port.iceberg=0 -s3.port.lance=0 -s3.autoCreateBucket=false \
  -s3.config="$dir/s3.json" -master.port="${ports[0]}" -master.port.grpc="${ports[1]}" \
  -volume.port="${ports[2]}" -volume.port.grpc="${ports[3]}" -filer.port="${ports[4]}" \
  -filer.port.grpc="${ports[5]}" -s3.port="${ports[6]}" -s3.port.grpc="${ports[7]}" \
  -admin.port="${ports[8]}" -admin.port.grpc="$admin_grpc" >"$dir/weed.log" 2>&1 &
wpid=$!
disown $wpid
cleanup() {
  kill -9 $wpid 2>/dev/null || true
  for p in "${ports[@]}" "$admin_grpc"; do rm -f /tmp/seaweedfs-*-"$p".sock; done
  rm -rf "$dir"
}
trap cleanup EXIT
ep="http://127.0.0.1:${ports[6]}"
for _ in $(seq 100); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' --aws-sigv4 'aws:amz:us-east-1:s3' \
      --user bench:bench-secret -X PUT "$ep/bench")" = 200 ] && break
  sleep 0.1
done
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret
PYTHONPATH="$(pwd)/bench" python3 - "$BIN" "s3://bench/lock?endpoint=$ep" "$RUNS" "$ep" <<'PY'
import os, statistics, subprocess, sys, time
import semfair
BIN, ADDR, RUNS, EP = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

def spawn(*a):
    return subprocess.Popen([BIN, "-q", *a, ADDR], stdout=subprocess.PIPE)

def holder():
    h = spawn()
    assert h.stdout.readline().startswith(b"OK")
    return h

def waiting():
    w = subprocess.Popen([BIN, "--wait", "20s", ADDR], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Its one stderr line says it waits (setup, not the measured event).
    assert b"waiting" in w.stderr.readline()
    return w

def row(name, samples):
    ms = [s * 1000 for s in samples]
    print(f"| {name} | {len(ms)} | {statistics.median(ms):.1f} ms | {min(ms):.1f} ms – {max(ms):.1f} ms |")

ok, hand, crash, killed = [], [], [], []
for _ in range(RUNS):
    t = time.monotonic(); h = spawn(); assert h.stdout.readline().startswith(b"OK")
    ok.append(time.monotonic() - t); h.stdout.close(); h.wait()
for _ in range(RUNS):
    h = holder(); w = waiting()
    t = time.monotonic(); h.stdout.close(); assert w.stdout.readline().startswith(b"OK")
    hand.append(time.monotonic() - t); h.wait(); w.stdout.close(); w.wait()
for _ in range(RUNS):
    p = subprocess.Popen(["perl", "-e", "open(my $h, '-|', @ARGV) or die; print scalar <$h>; $| = 1; sleep 1000", BIN, "-q", ADDR], stdout=subprocess.PIPE)
    assert p.stdout.readline().startswith(b"OK")
    w = waiting()
    t = time.monotonic(); p.kill(); assert w.stdout.readline().startswith(b"OK")
    crash.append(time.monotonic() - t); p.wait(); w.stdout.close(); w.wait()
for _ in range(RUNS):
    h = holder(); w = waiting()
    t = time.monotonic(); h.kill(); assert w.stdout.readline().startswith(b"OK")
    killed.append(time.monotonic() - t); h.wait(); w.stdout.close(); w.wait()
print("| tool | n | median | min – max |")
print("| --- | ---: | ---: | ---: |")
row("locksmith s3: spawn → OK", ok)
row("locksmith s3: handoff (pipe closed → waiter holds)", hand)
row("locksmith s3: crash (parent SIGKILLed → waiter holds)", crash)
row("locksmith s3: helper SIGKILLed → waiter holds (same host: proof of death)", killed)
sem = semfair.rows("s3", BIN, lambda name: f"s3://bench/{name}?endpoint={EP}", max(3, RUNS // 4))
semfair.show(sem)
out = os.environ.get("BENCH_TSV")
if out:
    with open(out, "w") as fh:
        for metric, v in [("spawn → OK", ok), ("handoff", hand), ("crash: parent SIGKILL → waiter holds", crash),
                          ("helper SIGKILLed → waiter holds (proof of death)", killed)]:
            fh.write(f"s3: {metric}\tlocksmith s3\tms\t{','.join(f'{x * 1000:.4f}' for x in v)}\n")
        fh.write(semfair.tsv(sem))
PY
