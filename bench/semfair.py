"""Semaphores and fair queues on a network backend (SPEC §3b), measured the way the local
section of locksmith-bench does: 8 contenders each running `locksmith --slots N run LOCK --
true` (time per grant, N = 1 and 3) and `locksmith [--fair] run LOCK -- sleep 0.005` (p50 and
p99 of a run, with and without --fair). Imported by the scripts of the sections whose servers
they start themselves (etcd, s3); `address(name)` gives the lock's address for a name.
"""
import statistics, subprocess, threading, time

N, K = 8, 5


def _workers(argv, runs_each):
    """Runs `argv` K times in each of N threads; every run must exit 0. Returns each run's time."""
    took, errors = [], []

    def worker():
        for _ in range(runs_each):
            t = time.monotonic()
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
            if r.returncode != 0:
                errors.append(f"{argv}: exit {r.returncode}: {r.stderr.decode(errors='replace')}")
                return
            took.append(time.monotonic() - t)

    threads = [threading.Thread(target=worker) for _ in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(errors[0])
    return took


def rows(section, binary, address, runs, env=None):
    """The rows (metric, tool, unit, samples in ms) of `runs` alternating runs."""
    out = {}

    def rec(metric, tool, v):
        out.setdefault((metric, tool), []).append(v * 1000)

    for i in range(runs):
        for slots in ([1, 3] if i % 2 == 0 else [3, 1]):
            argv = [binary, "-q", "--slots", str(slots), "--wait", "60s", "run",
                    address(f"sem{slots}"), "--", "true"]
            t = time.monotonic()
            _workers(argv, K)
            rec(f"{section}: semaphore, {N} contenders: time per grant",
                f"locksmith --slots {slots} run {section} -- true (n={N})",
                (time.monotonic() - t) / (N * K))
        for fair in ([False, True] if i % 2 == 0 else [True, False]):
            flag = ["--fair"] if fair else []
            argv = [binary, "-q", *flag, "--wait", "60s", "run", address("fair"), "--",
                    "sleep", "0.005"]
            took = sorted(_workers(argv, K))
            at = lambda q: took[round((len(took) - 1) * q)]
            tool = f"locksmith {'--fair ' if fair else ''}run {section} -- sleep 0.005 (n={N})"
            rec(f"{section}: fair queue, {N} contenders: p50 of a run", tool, at(0.5))
            rec(f"{section}: fair queue, {N} contenders: p99 of a run", tool, at(0.99))
    return [(m, t, "ms", v) for (m, t), v in out.items()]


def tsv(rows_):
    return "".join(f"{m}\t{t}\t{u}\t{','.join(f'{x:.4f}' for x in v)}\n" for m, t, u, v in rows_)


def show(rows_):
    for m, t, u, v in rows_:
        print(f"| {m} | {t} | {statistics.median(v):.2f} {u} ({min(v):.2f}–{max(v):.2f}, n={len(v)}) |")
