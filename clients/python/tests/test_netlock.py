"""The package against the real ``locksmith`` helper, on flock and mkdir locks in a
temporary directory. Nothing here sleeps to synchronise: the tests wait on the helper's
lines (``lock()``, ``wait_lost()``), on its exit (``unlock()``), or on a child's output."""

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
from pathlib import Path
from unittest import mock

import support

import netlock


def setUpModule():
    support.setup_environment()


class NetlockTest(unittest.TestCase):
    def setUp(self):
        self.sb = support.Sandbox()

    def tearDown(self):
        self.sb.cleanup()

    # -- hold and release ------------------------------------------------------------

    def test_hold_and_unlock_flock(self):
        lk = self.sb.lock("f")
        self.assertEqual((lk.profile, lk.backend, lk.shared), ("f", "flock", False))
        self.assertIsInstance(lk.token, int)
        self.assertTrue(lk.status_line.startswith("OK f backend=flock"))
        self.assertFalse(lk.lost)
        self.assertTrue(lk.held)
        self.assertIsNone(self.sb.try_lock("f"), "a second holder got a held lock")
        self.assertTrue(lk.unlock())
        self.assertFalse(lk.held, "an unlocked lock is no longer held")
        self.assertFalse(lk.lost, "a clean unlock is not a loss")
        start = time.monotonic()
        self.assertFalse(lk.wait_lost(5), "wait_lost after a clean unlock: not lost, at once")
        self.assertLess(time.monotonic() - start, 1.0)
        self.assertFalse(lk.unlock(), "a second unlock is a no-op")
        self.assertFalse(lk.lost)
        again = self.sb.try_lock("f")
        self.assertIsNotNone(again, "the lock was not free right after unlock returned")
        again.unlock()
        support.assert_no_children(self)

    def test_address_with_a_query_is_held_and_released(self):
        # Issue 25: the OK line's profile field is then the address, `?k=v` and all (spaces
        # and every other whitespace character written %XX per UTF-8 byte); it used to be
        # refused as "OK without a profile name".
        for name in ["x", "a b", "a\u00a0b\u2003c"]:
            address = f"mkdir:{self.sb.dir}/{name}?stale_after=30s"
            shown = address.replace(" ", "%20").replace("\u00a0", "%C2%A0").replace("\u2003", "%E2%80%83")
            lock_dir = self.sb.path(name)
            with self.subTest(address=address):
                lk = netlock.lock(address, wait=20)
                self.assertEqual((lk.profile, lk.backend), (shown, "mkdir"))
                self.assertIsInstance(lk.token, int)
                self.assertTrue(lk.held)
                self.assertTrue(lock_dir.is_dir(), "the mkdir lock directory exists while held")
                self.assertIsNone(netlock.try_lock(address), "a second holder got a held lock")
                self.assertTrue(lk.unlock())
                self.assertFalse(lock_dir.exists(), "unlock returned before the lock was gone")
                again = netlock.try_lock(address)
                self.assertIsNotNone(again, "the lock was not free right after unlock returned")
                again.unlock()
        support.assert_no_children(self)

    def test_unlock_returns_once_the_lock_is_gone_mkdir(self):
        lock_dir = self.sb.path("m.lock")
        lk = self.sb.lock("m")
        self.assertEqual(lk.backend, "mkdir")
        self.assertTrue(lock_dir.is_dir(), "the mkdir lock directory exists while held")
        lk.unlock()
        self.assertFalse(lock_dir.exists(), "unlock returned before the lock directory was removed")
        support.assert_no_children(self)

    def test_with_block_releases(self):
        lock_dir = self.sb.path("m.lock")
        with self.sb.lock("m") as lk:
            self.assertTrue(lock_dir.is_dir())
            self.assertFalse(lk.lost)
        self.assertFalse(lock_dir.exists(), "the with block ended without releasing")
        self.assertFalse(lk.held)
        self.assertFalse(lk.lost, "a clean release at the end of the block is not a loss")
        with self.assertRaises(ZeroDivisionError):
            with self.sb.lock("m"):
                1 / 0
        self.assertFalse(lock_dir.exists(), "an exception in the block kept the lock")
        support.assert_no_children(self)

    def test_release_on_garbage_collection(self):
        def work():
            lk = self.sb.lock("f")
            self.assertFalse(lk.lost)
            # lk goes out of scope here

        work()
        lk = self.sb.try_lock("f")
        self.assertIsNotNone(lk, "the lock outlived its object")
        del lk
        self.assertIsNotNone(self.sb.try_lock("f"), "del did not release")
        support.assert_no_children(self)

    def test_lock_held_in_a_global_is_released_at_exit_quietly(self):
        code = 'import sys, netlock\nl = netlock.lock("m", profiles=sys.argv[1])\nprint("held")\n'
        out = subprocess.run(
            [sys.executable, "-X", "dev", "-c", code, str(self.sb.profiles)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=support.child_env(),
            text=True,
            timeout=60,
        )
        self.assertEqual((out.returncode, out.stdout), (0, "held\n"), "no warning or error at exit")
        lk = self.sb.lock("m", wait=10)
        self.assertFalse(lk.prev_crashed, "the exit was a clean release")
        lk.unlock()

    # -- several locks at once (SPEC 3b) ------------------------------------------------

    def free(self, lock: str) -> bool:
        """Whether ``lock`` is free now: ``locksmith status LOCK`` exits 0 for a free lock."""
        out = subprocess.run(
            [os.environ["LOCKSMITH_BIN"], "--profiles", str(self.sb.profiles), "status", lock],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
        self.assertIn(out.returncode, (0, 1), f"status {lock}: {out.stderr}")
        return out.returncode == 0

    def two_locks(self):
        """An mkdir: address and a plain path (a flock file): two backends."""
        return f"mkdir:{self.sb.dir}/m2", f"{self.sb.dir}/f2.lock"

    def test_several_locks_held_together_and_released(self):
        m, f = self.two_locks()
        lk = netlock.lock(m, f, wait=20)
        self.assertEqual(lk.tags, [m, f])
        self.assertEqual(lk.backends, ["mkdir", "flock"])
        # A file backend's first token is the clock's floor (issue 28: its state may be
        # cleaned away).
        self.assertGreater(lk.tokens[0], 1, lk.status_line)
        self.assertGreater(lk.tokens[1], 1, lk.status_line)
        self.assertIsNone(lk.token, "one token cannot stand for the set")
        self.assertEqual(lk.profile, m)
        self.assertTrue(lk.held)
        self.assertTrue(self.sb.path("m2").is_dir())
        self.assertFalse(self.free(m) or self.free(f), "both held")
        self.assertIsNone(netlock.try_lock(f), "a second holder got a held lock")
        self.assertTrue(lk.unlock())
        self.assertTrue(self.free(m) and self.free(f), "unlock returned before every lock was gone")
        # The end of a with block, and a profile in the set.
        with self.sb.lock("m", f) as lk:
            self.assertEqual(lk.backends, ["mkdir", "flock"])
            self.assertFalse(self.free("m") or self.free(f))
        self.assertTrue(self.free("m") and self.free(f), "the with block left a lock held")
        # Garbage collection.
        lk = netlock.lock(f, m, wait=20)
        del lk
        self.assertTrue(self.free(m) and self.free(f), "del left a lock held")
        support.assert_no_children(self)

    def test_several_locks_tokens_in_the_order_named(self):
        m, f = self.two_locks()
        # m alone twice (its first token: the clock's floor, issue 28): the two locks'
        # tokens differ from here on.
        with netlock.lock(m, wait=20) as one:
            first_m = one.token
            self.assertEqual(one.tokens, [first_m])
        with netlock.lock(m, wait=20) as one:
            self.assertEqual((one.token, one.tokens), (first_m + 1, [first_m + 1]))
        with netlock.lock(m, f, wait=20) as lk:
            self.assertEqual(lk.tokens[0], first_m + 2, lk.status_line)
            first_f = lk.tokens[1]  # flock's first token: the clock's floor (issue 28)
        with netlock.lock(f, m, wait=20) as lk:
            self.assertEqual(
                (lk.tokens, lk.backends),
                ([first_f + 1, first_m + 3], ["flock", "mkdir"]),
                lk.status_line,
            )
        support.assert_no_children(self)

    def test_several_locks_the_same_lock_twice(self):
        m, f = self.two_locks()
        with netlock.lock(m, f, m, wait=20) as lk:
            first_m, first_f = lk.tokens[:2]  # the clock's floors (issue 28)
            self.assertEqual(lk.tokens, [first_m, first_f, first_m])
            self.assertEqual(lk.backends, ["mkdir", "flock", "mkdir"])
            self.assertEqual(lk.field("locks"), "2")
        with netlock.lock(f, f, wait=20) as lk:
            self.assertIsNone(lk.field("locks"), lk.status_line)
            self.assertEqual((lk.tokens, lk.token), ([first_f + 1, first_f + 1], first_f + 1))
        # Two names for one lock (a path and its flock: address): refused, nothing held.
        with self.assertRaisesRegex(netlock.Usage, "name each lock once"):
            netlock.lock(f, m, f"flock:{f}", wait=20)
        self.assertTrue(self.free(m) and self.free(f), "a refused set left a lock held")
        support.assert_no_children(self)

    def test_several_locks_one_busy_is_busy_and_nothing_held(self):
        m, f = self.two_locks()
        z = f"mkdir:{self.sb.dir}/z2"
        for busy in (m, f):
            with self.subTest(busy=busy):
                holder = netlock.lock(busy, wait=20)
                self.assertIsNone(netlock.try_lock(z, m, f), f"{busy} is held: the set must be busy")
                with self.assertRaises(netlock.Busy) as c:
                    netlock.lock(m, f, z, wait=0.2)
                self.assertEqual(c.exception.exit_code, 75)
                self.assertTrue(holder.held, "the holder was disturbed")
                for other in (m, f, z):
                    if other != busy:
                        self.assertTrue(self.free(other), f"{other} left held after the set failed on {busy}")
                holder.unlock()
        lk = netlock.try_lock(m, f, z)
        self.assertIsNotNone(lk, "the set was not free once the holder let go")
        lk.unlock()
        support.assert_no_children(self)

    def test_several_locks_addresses_with_queries_and_spaces(self):
        q = f"mkdir:{self.sb.dir}/q?stale_after=30s"
        spaced = f"mkdir:{self.sb.dir}/a b?stale_after=30s&poll=50ms"
        _, f = self.two_locks()
        for first, second in ((q, f), (spaced, q), (f, spaced)):
            with self.subTest(first=first, second=second):
                lk = netlock.lock(first, second, wait=20)
                self.assertEqual(lk.profile, first.replace(" ", "%20"))
                self.assertTrue(all(isinstance(t, int) for t in lk.tokens), lk.status_line)
                self.assertFalse(self.free(first) or self.free(second))
                lk.unlock()
                self.assertTrue(self.free(first) and self.free(second))
        support.assert_no_children(self)

    # -- semaphores (--slots N) -------------------------------------------------------

    def _two_slots_then_busy_then_the_freed_slot(self, lock):
        a = netlock.lock(lock, slots=2, wait=20)
        b = netlock.lock(lock, slots=2, wait=20)
        self.assertEqual(sorted([a.slot, b.slot]), [0, 1], (a.status_line, b.status_line))
        self.assertEqual((a.slot_count, b.slot_count), (2, 2))
        self.assertEqual(a.slots, [a.slot])
        self.assertIn(f" slot={a.slot} slots=2", a.status_line)
        self.assertGreater(b.token, a.token, "tokens rise across slots")
        self.assertIsNone(netlock.try_lock(lock, slots=2), "a third holder of 2 slots got in")
        with self.assertRaises(netlock.Busy) as c:
            netlock.lock(lock, slots=2, wait=0)
        self.assertEqual(c.exception.exit_code, 75)
        freed = a.slot
        a.unlock()
        c = netlock.lock(lock, slots=2, wait=20)
        self.assertEqual(c.slot, freed, "the third takes the slot given back")
        self.assertGreater(c.token, b.token)
        self.assertTrue(b.held and c.held)
        b.unlock()
        c.unlock()
        d, e = netlock.try_lock(lock, slots=2), netlock.try_lock(lock, slots=2)
        self.assertNotEqual(d.slot, e.slot)
        d.unlock()
        e.unlock()
        support.assert_no_children(self)

    def test_slots_flock_two_holders_and_no_more(self):
        self._two_slots_then_busy_then_the_freed_slot(str(self.sb.path("gpu")))

    def test_slots_mkdir_two_holders_and_no_more(self):
        self._two_slots_then_busy_then_the_freed_slot(f"mkdir:{self.sb.path('gpu')}")

    def test_slots_none_and_one_report_no_slot(self):
        lk = self.sb.lock("f")
        self.assertEqual((lk.slot, lk.slot_count, lk.slots), (None, None, [None]))
        lk.unlock()
        lk = self.sb.lock("f", slots=1)
        self.assertEqual((lk.slot, lk.slot_count), (None, None))
        self.assertNotIn(" slot=", lk.status_line)
        self.assertIsNone(self.sb.try_lock("f", slots=1), "slots=1 is the plain lock")
        lk.unlock()

    def test_slots_bad_values_are_refused_before_spawning(self):
        for bad in (0, 1025, "x", "2", 1.5, True):
            with self.subTest(slots=bad):
                with self.assertRaises(netlock.Usage) as c:
                    netlock.lock("/tmp/never-taken", slots=bad, helper="/nonexistent/locksmith")
                self.assertIsNone(c.exception.exit_code, "nothing ran")
                with self.assertRaises(netlock.Usage):
                    netlock.try_lock("/tmp/never-taken", slots=bad, helper="/nonexistent/locksmith")
        support.assert_no_children(self)

    def test_slots_another_number_is_config_and_takes_nothing(self):
        lock = str(self.sb.path("x"))
        held = netlock.lock(lock, slots=2, wait=20)
        with self.assertRaises(netlock.Config) as c:
            netlock.lock(lock, slots=3, wait=0)
        self.assertEqual(c.exception.exit_code, 78)
        other = netlock.try_lock(lock, slots=2)
        self.assertIsNotNone(other, "the refused contender took the second slot")
        other.unlock()
        with self.assertRaises(netlock.Usage) as c:
            netlock.lock(lock, slots=2, shared=True, wait=0)
        self.assertEqual(c.exception.exit_code, 64)
        held.unlock()
        support.assert_no_children(self)

    def test_slots_a_set_where_one_lock_has_slots(self):
        sem = f"flock:{self.sb.dir}/sem?slots=2"
        plain = f"mkdir:{self.sb.dir}/plain"
        lk = netlock.lock(plain, sem, wait=20)
        self.assertEqual(lk.slots[0], None, lk.status_line)
        k = lk.slots[1]
        self.assertIn(k, (0, 1))
        self.assertEqual(lk.slot_counts, [None, 2])
        self.assertEqual((lk.slot, lk.slot_count), (None, None), "one slot cannot stand for a set")
        self.assertIsNone(netlock.try_lock(plain), "the plain lock is held")
        other = netlock.try_lock(sem)
        self.assertEqual(other.slot, 1 - k, "the semaphore had one more slot")
        self.assertIsNone(netlock.try_lock(sem))
        other.unlock()
        lk.unlock()
        # slots= on the set applies to every lock.
        a, b = str(self.sb.path("a")), f"mkdir:{self.sb.dir}/b"
        first = netlock.lock(a, b, slots=2, wait=20)
        second = netlock.lock(b, a, slots=2, wait=20)
        self.assertEqual(first.slot_counts, [2, 2])
        self.assertNotEqual(first.slots[0], second.slots[1])
        self.assertNotEqual(first.slots[1], second.slots[0])
        self.assertIsNone(netlock.try_lock(a, slots=2))
        first.unlock()
        second.unlock()
        support.assert_no_children(self)

    # -- fair queues (--fair) ---------------------------------------------------------

    def _waiters(self, status_args):
        """The pids of the waiters a ``status --json`` command lists, in order (it exits 0 when
        the lock is free, 1 when held)."""
        done = subprocess.run(status_args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, timeout=60)
        self.assertIn(done.returncode, (0, 1), f"{status_args}: {done.stdout!r}")
        return [w["pid"] for w in json.loads(done.stdout)["waiters"]]

    def _line(self, lock, fair_flag=True):
        """The waiters in ``lock``'s fair queue as ``locksmith [--fair] status --json`` lists
        them: their pids (each a Lock's helper), in order."""
        args = [os.environ["LOCKSMITH_BIN"]] + (["--fair"] if fair_flag else []) + ["status", "--json", lock]
        return self._waiters(args)

    def _one_more_in_line(self, lock, before, fair_flag=True):
        """Polls the line until the waiter that just began to wait is in it, after ``before``."""
        deadline = time.monotonic() + 30
        while True:
            now = self._line(lock, fair_flag)
            if len(now) > len(before):
                self.assertEqual(now[: len(before)], before, "the line keeps its order")
                self.assertEqual(len(now), len(before) + 1, f"one waiter at a time: {now}")
                return now
            self.assertLess(time.monotonic(), deadline, f"the waiter never showed in line: {now}")
            time.sleep(0.02)

    def _served_in_order(self, lock, holder, waiter, n=3, fair_flag=True):
        """``holder`` holds; ``n`` waiters (threads calling ``waiter()``) begin to wait one after
        another, each seen in line (``status --json``) before the next starts; then the holder
        lets go. Each waiter, once it holds the lock, records (its number, its helper's pid) and
        lets go: the records must be in the order they came, pid for pid."""
        served, errors, threads, line = [], [], [], []

        def wait_in_line(i):
            try:
                with waiter() as lk:
                    served.append((i, lk.helper_pid))
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        try:
            for i in range(1, n + 1):
                t = threading.Thread(target=wait_in_line, args=(i,))
                t.start()
                threads.append(t)
                line = self._one_more_in_line(lock, line, fair_flag)
            holder.unlock()
        finally:
            holder.unlock()
            for t in threads:
                t.join(90)
        self.assertEqual(errors, [])
        self.assertEqual(served, list(zip(range(1, n + 1), line)), "served in the order they came")
        self.assertEqual(self._line(lock, fair_flag), [], "nobody left in line")

    def _three_fair_waiters(self, lock):
        holder = netlock.lock(lock, fair=True, wait=20)
        self._served_in_order(lock, holder, lambda: netlock.lock(lock, fair=True, wait=60))
        support.assert_no_children(self)

    def test_fair_flock_waiters_are_served_in_the_order_they_came(self):
        self._three_fair_waiters(str(self.sb.path("deploy")))

    def test_fair_mkdir_waiters_are_served_in_the_order_they_came(self):
        self._three_fair_waiters(f"mkdir:{self.sb.path('deploy')}")

    def test_fair_waiter_that_gives_up_leaves_the_line(self):
        # Its wait runs out: Busy, and it is gone from the line at once; the one behind it
        # keeps its place and gets the lock when the holder lets go.
        lock = f"mkdir:{self.sb.path('x')}"
        holder = netlock.lock(lock, fair=True, wait=20)
        outcome = {}

        def quit_():
            try:
                netlock.lock(lock, fair=True, wait=3)
            except netlock.Busy as e:
                outcome["quitter"] = e

        def stay():
            with netlock.lock(lock, fair=True, wait=60) as lk:
                outcome["stayer"] = lk.helper_pid

        quitter = threading.Thread(target=quit_)
        quitter.start()
        first = self._one_more_in_line(lock, [])
        stayer = threading.Thread(target=stay)
        stayer.start()
        both = self._one_more_in_line(lock, first)
        quitter.join(30)
        self.assertEqual(outcome["quitter"].exit_code, 75)
        self.assertEqual(self._line(lock), [both[1]], "the one that gave up left the line")
        holder.unlock()
        stayer.join(60)
        self.assertEqual(outcome.get("stayer"), both[1], "the next in line got it")
        self.assertEqual(self._line(lock), [])
        support.assert_no_children(self)

    def test_fair_by_address_with_slots_puts_plain_locks_in_line(self):
        # ?fair=true&slots=2 in the address, nothing as arguments: two holders fill both
        # slots, three plain waiters line up and go through the slot given back, in order.
        lock = f"mkdir:{self.sb.path('x')}?fair=true&slots=2"
        a, b = netlock.lock(lock, wait=20), netlock.lock(lock, wait=20)
        self.assertEqual((a.profile, a.slot_count, b.slot_count), (lock, 2, 2))
        self._served_in_order(lock, a, lambda: netlock.lock(lock, wait=60), fair_flag=False)
        self.assertTrue(b.held, "the other slot was held all along")
        b.unlock()
        support.assert_no_children(self)

    def test_fair_by_profile_key(self):
        # A profile that says fair = true: plain lock() calls wait in line.
        with open(self.sb.profiles, "a") as f:
            f.write(f'\n[profile.fairq]\nbackend = "mkdir"\npath = "{self.sb.dir}/fairq.lock"\nfair = true\n')
        holder = self.sb.lock("fairq")
        profiles = str(self.sb.profiles)

        def line_of(_lock, fair_flag=True):
            return self._waiters([os.environ["LOCKSMITH_BIN"], "--profiles", profiles, "status", "--json", "fairq"])

        with mock.patch.object(self, "_line", line_of):
            self._served_in_order("fairq", holder, lambda: self.sb.lock("fairq", wait=60), n=2)
        support.assert_no_children(self)

    def test_fair_not_a_boolean_is_refused_before_spawning(self):
        for bad in ("yes", "true", 1, 0, [True]):
            with self.subTest(fair=bad):
                with self.assertRaises(netlock.Usage) as c:
                    netlock.lock("/tmp/never-taken", fair=bad, helper="/nonexistent/locksmith")
                self.assertIsNone(c.exception.exit_code, "nothing ran")
                self.assertIn("expected True or False", c.exception.message)
                with self.assertRaises(netlock.Usage):
                    netlock.try_lock("/tmp/never-taken", fair=bad, helper="/nonexistent/locksmith")
        support.assert_no_children(self)

    # -- busy, waiting, errors --------------------------------------------------------

    def test_try_lock_returns_none_when_busy(self):
        holder = self.sb.lock("m")
        self.assertIsNone(self.sb.try_lock("m"))
        self.assertIsNone(netlock.try_lock("m", profiles=str(self.sb.profiles)))
        self.assertFalse(holder.lost, "a failed try disturbed the holder")
        holder.unlock()
        support.assert_no_children(self)

    def test_wait_timeout_raises_busy(self):
        holder = self.sb.lock("f")
        for wait in (0.3, "300ms", datetime.timedelta(milliseconds=300)):
            start = time.monotonic()
            with self.assertRaises(netlock.Busy) as c:
                self.sb.lock("f", wait=wait)
            took = time.monotonic() - start
            err = c.exception
            self.assertIsInstance(err, netlock.Error)
            self.assertEqual((err.kind, err.exit_code), ("busy", 75))
            self.assertIn("held by", err.message)
            self.assertTrue(str(err).startswith("locksmith: busy: "), str(err))
            self.assertGreaterEqual(took, 0.3, f"gave up after {took:.3f} s, before the wait ran out")
        # try_lock with a wait waits that long, then says None.
        self.assertIsNone(self.sb.try_lock("f", wait=0.1))
        holder.unlock()
        support.assert_no_children(self)

    def test_waiter_gets_the_lock_when_released(self):
        holder = self.sb.lock("m")
        code = textwrap.dedent(
            """
            import sys, netlock
            print("waiting", flush=True)
            with netlock.lock("m", profiles=sys.argv[1], wait=20) as l:
                print("got", l.token, flush=True)
            """
        )
        child = subprocess.Popen(
            [sys.executable, "-c", code, str(self.sb.profiles)],
            stdout=subprocess.PIPE,
            env=support.child_env(),
            text=True,
        )
        self.assertEqual(child.stdout.readline(), "waiting\n")
        holder.unlock()
        got = child.stdout.readline().split()
        self.assertEqual(got[0], "got")
        self.assertGreater(int(got[1]), holder.token)
        self.assertEqual(child.wait(30), 0)
        child.stdout.close()

    def test_config_error_unknown_profile(self):
        with self.assertRaises(netlock.Config) as c:
            self.sb.lock("nope")
        err = c.exception
        self.assertEqual((err.kind, err.exit_code), ("config", 78))
        self.assertIn("unknown profile", err.message)
        with self.assertRaises(netlock.Config):
            self.sb.try_lock("nope")  # only busy becomes None
        with self.assertRaises(netlock.Config) as c:
            netlock.lock("f", profiles=self.sb.path("missing.toml"))
        self.assertEqual(c.exception.exit_code, 78)
        support.assert_no_children(self)

    def test_usage_errors(self):
        with self.assertRaises(netlock.Usage) as c:
            self.sb.lock("m", shared=True)  # mkdir has no shared mode
        self.assertEqual((c.exception.kind, c.exception.exit_code), ("usage", 64))
        with self.assertRaises(netlock.Usage) as c:
            self.sb.lock("-v")  # refused before anything is spawned
        self.assertIsNone(c.exception.exit_code)
        support.assert_no_children(self)

    def test_spawn_error(self):
        with self.assertRaises(netlock.SpawnError) as c:
            self.sb.lock("f", helper=self.sb.path("no-such-locksmith"))
        self.assertEqual(c.exception.kind, "spawn")
        with mock.patch.dict(os.environ, {"LOCKSMITH_BIN": str(self.sb.path("nope"))}):
            with self.assertRaises(netlock.SpawnError, msg="$LOCKSMITH_BIN missing must not fall through"):
                self.sb.lock("f")

    def test_helper_found_on_path(self):
        bindir = self.sb.path("bin")
        bindir.mkdir(mode=0o755)
        wrapper = bindir / "locksmith"
        wrapper.write_text(f'#!/bin/sh\nexec "{os.environ["LOCKSMITH_BIN"]}" "$@"\n')
        wrapper.chmod(0o755)
        env = {"LOCKSMITH_BIN": "", "PATH": f"relative/dir:{bindir}:/usr/bin:/bin"}
        with mock.patch.dict(os.environ, env):
            with self.sb.lock("f") as lk:
                self.assertEqual(lk.backend, "flock")
            bindir.chmod(0o777)
            try:
                with self.assertRaisesRegex(netlock.SpawnError, "writable by group or others"):
                    self.sb.lock("f")
            finally:
                bindir.chmod(0o755)
        support.assert_no_children(self)

    def test_shared_flock(self):
        r1 = self.sb.lock("f", shared=True)
        r2 = self.sb.try_lock("f", shared=True)
        self.assertIsNotNone(r2, "two readers must hold together")
        self.assertTrue(r1.shared and r2.shared)
        self.assertIsNone(self.sb.try_lock("f"), "a writer got in beside readers")
        r1.unlock()
        r2.unlock()
        w = self.sb.try_lock("f")
        self.assertIsNotNone(w)
        self.assertFalse(w.shared)
        w.unlock()

    # -- tokens, crashes, LOST ---------------------------------------------------------

    def test_tokens_increase(self):
        tokens = []
        for tag in ("m", "m", "m", "f", "f"):
            with self.sb.lock(tag) as lk:
                self.assertFalse(lk.prev_crashed, "a clean release left prev=crashed")
                tokens.append((tag, lk.token))
        m = [t for tag, t in tokens if tag == "m"]
        f = [t for tag, t in tokens if tag == "f"]
        self.assertTrue(all(isinstance(t, int) for t in m + f), tokens)
        self.assertEqual(m, sorted(set(m)), f"mkdir tokens must strictly increase: {m}")
        self.assertEqual(f, sorted(set(f)), f"flock tokens must strictly increase: {f}")

    def test_killed_helper_is_lost_and_next_holder_sees_prev_crashed(self):
        first = self.sb.lock("m")
        self.assertFalse(first.lost)
        os.kill(first.helper_pid, signal.SIGKILL)
        self.assertTrue(first.wait_lost(20), "the helper's death was not noticed")
        self.assertTrue(first.lost)
        with self.assertRaisesRegex(netlock.Lost, "killed by signal 9") as c:
            first.unlock()
        self.assertIsNone(c.exception.exit_code)
        self.assertTrue(first.lost, "still lost after the unlock that reported it")
        self.assertFalse(first.held)
        # Same host: the dead holder's lock is broken by proof of death, not after stale_after.
        second = self.sb.lock("m", wait=10)
        self.assertTrue(second.prev_crashed, second.status_line)
        self.assertGreater(second.token, first.token)
        second.unlock()
        third = self.sb.lock("m")
        self.assertFalse(third.prev_crashed, "a clean release must clear prev=crashed")
        self.assertGreater(third.token, second.token)
        third.unlock()
        support.assert_no_children(self)

    def test_lost_when_the_lock_directory_is_removed(self):
        lk = self.sb.lock("fast")
        self.assertFalse(lk.lost)
        self.assertIsNone(lk.check())
        # Someone removes the lock under us: the next heartbeat (200 ms) says LOST.
        shutil.rmtree(self.sb.path("fast.lock"))
        start = time.monotonic()
        self.assertTrue(lk.wait_lost(20), "no LOST after the lock directory was removed")
        self.assertLess(time.monotonic() - start, 1.5, "LOST must come before stale_after")
        self.assertTrue(lk.lost)
        self.assertFalse(lk.held)
        with self.assertRaises(netlock.Lost) as c:
            lk.check()
        self.assertIn("broken", c.exception.message)
        with self.assertRaises(netlock.Lost) as c:
            lk.unlock()
        self.assertEqual((c.exception.kind, c.exception.exit_code), ("lost", 74))
        self.assertTrue(lk.lost, "still lost after the unlock that reported it")
        self.assertFalse(lk.held)
        support.assert_no_children(self)

    def test_lost_check_does_not_block(self):
        lk = self.sb.lock("m")
        start = time.monotonic()
        for _ in range(1000):
            self.assertFalse(lk.lost)
        self.assertLess(time.monotonic() - start, 1.0)
        self.assertFalse(lk.wait_lost(0.05), "wait_lost(timeout) on a held lock is False")
        lk.unlock()

    # -- processes ----------------------------------------------------------------------

    def test_release_on_process_death(self):
        code = textwrap.dedent(
            """
            import sys, netlock
            l = netlock.lock("m", profiles=sys.argv[1])
            print("held", l.token, flush=True)
            sys.stdin.read()  # until killed
            """
        )
        child = subprocess.Popen(
            [sys.executable, "-c", code, str(self.sb.profiles)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=support.child_env(),
            text=True,
        )
        line = child.stdout.readline().split()
        self.assertEqual(line[0], "held")
        self.assertIsNone(self.sb.try_lock("m"), "the child does not hold the lock")
        child.kill()
        child.wait()
        child.stdin.close()
        child.stdout.close()
        # The child's helper sees its parent die and releases at once (a normal release).
        lk = self.sb.lock("m", wait=10)
        self.assertFalse(lk.prev_crashed, "a parent's death is a clean release")
        self.assertGreater(lk.token, int(line[1]))
        lk.unlock()

    def test_exception_from_a_signal_handler_while_waiting_stops_and_reaps_the_helper(self):
        holder = self.sb.lock("f")

        def timed_out(signum, frame):
            raise TimeoutError("timed out")

        old = signal.signal(signal.SIGALRM, timed_out)
        try:
            signal.alarm(1)
            with self.assertRaisesRegex(TimeoutError, "timed out"):
                self.sb.lock("f", wait="forever")
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        self.assertFalse(holder.lost, "the holder was disturbed")
        holder.unlock()
        support.assert_no_children(self)  # the interrupted waiter's helper was reaped
        nxt = self.sb.try_lock("f")
        self.assertIsNotNone(nxt, "the interrupted waiter took the lock")
        nxt.unlock()

    @unittest.skipUnless(hasattr(os, "fork"), "needs fork")
    def test_forked_child_does_not_keep_the_lock(self):
        lk = self.sb.lock("f")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: our copies of the helper's pipes were closed at fork
            try:
                os.close(w)
                os.read(r, 1)  # until the parent says go
            finally:
                os._exit(0)
        os.close(r)
        try:
            self.assertTrue(lk.unlock())
            self.assertIsNotNone(self.sb.try_lock("f"), "a forked child kept the lock alive")
        finally:
            os.close(w)
            os.waitpid(pid, 0)
        support.assert_no_children(self)

    def test_counter_race_flock(self):
        self.counter_race("f")

    def test_counter_race_mkdir(self):
        self.counter_race("m")

    def test_slots_race_flock(self):
        self.slots_race(str(self.sb.path("sem-race")))

    def test_slots_race_mkdir(self):
        self.slots_race(f"mkdir:{self.sb.path('sem-race')}")

    def slots_race(self, lock, procs=6, rounds=8, slots=2):
        """procs processes each take a slot of a slots-slot semaphore rounds times and add 1 to
        that slot's counter file (not atomically), marking the slot occupied with an O_EXCL
        file meanwhile: no slot ever has two holders, and the counters add up to procs x rounds."""
        base = self.sb.path("slot")
        code = textwrap.dedent(
            """
            import os, sys, netlock
            lock, base, rounds, slots = sys.argv[1:]
            for _ in range(int(rounds)):
                with netlock.lock(lock, slots=int(slots), wait=60) as l:
                    assert l.slot is not None and 0 <= l.slot < int(slots), l.status_line
                    marker = f"{base}-{l.slot}.held"
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # two in one slot: fails
                    path = f"{base}-{l.slot}.count"
                    value = int(open(path).read()) if os.path.exists(path) else 0
                    with open(path, "w") as f:  # truncate, then write: not atomic
                        f.write(str(value + 1))
                    os.unlink(marker)
            """
        )
        children = [
            subprocess.Popen(
                [sys.executable, "-c", code, lock, str(base), str(rounds), str(slots)],
                env=support.child_env(),
            )
            for _ in range(procs)
        ]
        for child in children:
            child.wait(timeout=300)
            self.assertEqual(child.returncode, 0, "a worker failed (see its stderr)")
        counts = [int(p.read_text()) for p in sorted(self.sb.dir.glob("slot-*.count"))]
        self.assertEqual(sum(counts), procs * rounds, counts)
        self.assertLessEqual(len(counts), slots)
        self.assertEqual(list(self.sb.dir.glob("slot-*.held")), [])
        support.assert_no_children(self)

    def counter_race(self, tag, procs=4, rounds=100):
        """procs processes each add 1 to a counter file rounds times, under the lock."""
        counter = self.sb.path(f"counter-{tag}")
        counter.write_text("0")
        code = textwrap.dedent(
            """
            import sys, netlock
            profiles, tag, path, rounds = sys.argv[1:]
            crashed = 0
            for _ in range(int(rounds)):
                with netlock.lock(tag, profiles=profiles, wait=60) as l:
                    crashed += l.prev_crashed
                    with open(path) as f:
                        value = int(f.read())
                    with open(path, "w") as f:  # truncate, then write: not atomic
                        f.write(str(value + 1))
            print(crashed)
            """
        )
        children = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(self.sb.profiles), tag, str(counter), str(rounds)],
                stdout=subprocess.PIPE,
                env=support.child_env(),
                text=True,
            )
            for _ in range(procs)
        ]
        outs = []
        for child in children:
            out, _ = child.communicate(timeout=300)
            outs.append(out.strip())
            self.assertEqual(child.returncode, 0, f"a worker failed: {out}")
        self.assertEqual(int(counter.read_text()), procs * rounds)
        self.assertEqual(outs, ["0"] * procs, "prev=crashed after clean releases")
        support.assert_no_children(self)


if __name__ == "__main__":
    unittest.main()
