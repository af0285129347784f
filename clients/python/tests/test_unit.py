"""The parts that need no real helper: line parsing, argument building, helper lookup,
and the guard against a fake helper (a shell script that acts by the tag's prefix)."""

import datetime
import io
import os
import random
import stat
import string
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import support  # noqa: F401  (puts the package under test on sys.path)

import netlock
from netlock import _protocol, _spawn

FAKE = r"""#!/bin/sh
# Fake locksmith: behaves according to the tag (the last argument).
for a in "$@"; do tag=$a; done
# The first lock named (the word after `hold`): the OK line's profile field for a set.
first=; after=
for a in "$@"; do
  if [ -n "$after" ] && [ -z "$first" ]; then first=$a; fi
  [ "$a" = hold ] && after=1
done
dir=$(dirname "$0")
printf '%s\n' "$@" > "$dir/$tag.args"
case $tag in
pair*)    echo "OK $first backend=fake,other mode=exclusive,shared token=5, locks=2"
          cat >/dev/null
          touch "$dir/$tag.released" ;;
semset*)  echo "OK $first backend=fake,other token=5,6 slot=,2 slots=,3 locks=2"
          cat >/dev/null
          touch "$dir/$tag.released" ;;
sem*)     echo "OK $tag backend=fake mode=exclusive token=7 slot=1 slots=3"
          cat >/dev/null
          touch "$dir/$tag.released" ;;
merged*)  echo "OK $first backend=fake mode=exclusive token=3"
          cat >/dev/null
          touch "$dir/$tag.released" ;;
busy*)    echo "ERROR busy: held by host=h pid=1 ppid=0"; exit 75 ;;
odd*)     echo "ERROR strange: what"; exit 78 ;;
quiet*)   exit 69 ;;
zero*)    exit 0 ;;
garbage*) echo "hello there"; exec cat >/dev/null ;;
other*)   echo "OK someone-else backend=fake"; exec cat >/dev/null ;;
lost*)    echo "OK $tag backend=fake mode=exclusive token=9"; echo "LOST server went away"; exit 74 ;;
early*)   echo "OK $tag backend=fake"; exit 0 ;;
relfail*) echo "OK $tag backend=fake"; cat >/dev/null; exit 74 ;;
*)        echo "OK $tag backend=fake mode=exclusive token=42 prev=crashed since=2025-01-01T00:00:00Z"
          cat >/dev/null
          touch "$dir/$tag.released" ;;
esac
"""


def random_name(rnd: random.Random) -> str:
    """A profile name: [A-Za-z0-9._-]{1,64}."""
    chars = string.ascii_letters + string.digits + "._-"
    return "".join(rnd.choice(chars) for _ in range(rnd.randint(1, 64)))


def random_address(rnd: random.Random) -> str:
    """A lock address as the helper echoes it (SPEC 3a: as given, spaces written %20): a
    scheme or a bare path, parts with ':', '=', '%20', and often a query '?k=v&k=v'."""
    scheme = rnd.choice(
        ["mkdir:", "flock:", "link:", "symlink:", "postgres://", "postgresql://", "ftp://", "ftps://",
         "etcd://", "s3://", "redis://", "/", "./"]
    )
    parts = ["tmp", "a", "x.lock", "/", "%20", ":", "=", "db.example:5432", "h:2379,h2:2379", "app",
             "locks", "%2F", "a%20b", "x=y", "\u00e9", "@", "-", "_"]
    addr = scheme + "".join(rnd.choice(parts) for _ in range(rnd.randint(1, 5)))
    if rnd.random() < 0.8:
        keys = ["lock", "stale_after", "wait", "shared", "slots", "fair", "key", "endpoint", "tls", "", "k"]
        values = ["30s", "0", "true", "py", "3", "http://127.0.0.1:9000", "/etc/ca.pem", "a%20b", "x=y",
                  "==", "?", ":", ""]
        pairs = [
            rnd.choice(keys) + rnd.choice(["=", "=", "=", "", "=="]) + rnd.choice(values)
            for _ in range(rnd.randrange(4))
        ]
        addr += rnd.choice(["?", "?", "?", "??", "?&"]) + "&".join(pairs)
    return addr


class ParseTest(unittest.TestCase):
    def test_ok_line_fields(self):
        line = "OK deploy backend=etcd mode=exclusive token=18446744073709551615 since=2025-01-02T03:04:05Z"
        ok = _protocol.parse(line)
        self.assertIsInstance(ok, _protocol.OkLine)
        self.assertEqual(ok.raw, line)
        self.assertEqual(ok.profile, "deploy")
        self.assertEqual(ok.get("backend"), "etcd")
        self.assertEqual(ok.token, 2**64 - 1)
        self.assertEqual(ok.get("since"), "2025-01-02T03:04:05Z")
        self.assertIsNone(ok.get("nope"))

    def test_ok_tolerates_extra_whitespace_and_cr(self):
        ok = _protocol.parse("OK  demo   backend=flock token=3 \r")
        self.assertEqual((ok.profile, ok.token), ("demo", 3))
        self.assertIsNone(_protocol.parse("OK x backend=flock").token)

    def test_ok_rejects_malformed(self):
        for line in [
            "OK",
            "OK backend=flock",
            "OK demo",
            "OK demo backend=",
            "OK demo backend=flock junk",
            "OK demo backend=flock =x",
            "OK demo backend=flock backend=mkdir",
            "OK demo backend=flock mode=weird",
            "OK demo backend=flock token=-1",
            "OK demo backend=flock token=18446744073709551616",
            "OK demo backend=flock token=１",
        ]:
            with self.assertRaises(netlock.ProtocolError, msg=line):
                _protocol.parse(line)

    def test_ok_for_several_locks(self):
        # SPEC 3b: values comma-separated in the order named, an empty token place for a lock
        # without one, locks=N.
        ok = _protocol.parse(
            "OK a backend=mkdir,flock,etcd mode=exclusive,shared,exclusive token=4,9, prev=crashed locks=3"
        )
        self.assertEqual(ok.profile, "a")
        self.assertEqual(
            [(h.backend, h.shared, h.token) for h in ok.locks],
            [("mkdir", False, 4), ("flock", True, 9), ("etcd", False, None)],
        )
        self.assertIsNone(ok.token, "one token cannot stand for a set")
        ok = _protocol.parse("OK /tmp/x backend=flock,flock locks=2")
        self.assertEqual([(h.shared, h.token) for h in ok.locks], [(False, None), (False, None)])
        one = _protocol.parse("OK a backend=mkdir mode=exclusive token=4")
        self.assertEqual((len(one.locks), one.token), (1, 4))
        for line in [
            "OK a backend=mkdir,flock mode=exclusive,exclusive token=1,2",
            "OK a backend=mkdir token=4,9",
            "OK a backend=mkdir token=",
            "OK a backend=mkdir,flock token=1,2,3 locks=2",
            "OK a backend=mkdir,flock mode=exclusive locks=2",
            "OK a backend=mkdir, locks=2",
            "OK a backend=mkdir,flock mode=exclusive,sideways locks=2",
            "OK a backend=mkdir,flock token=1,x locks=2",
            "OK a backend=mkdir,flock locks=0",
            "OK a backend=mkdir,flock locks=two",
            "OK a backend=mkdir,flock locks=",
        ]:
            with self.assertRaises(netlock.ProtocolError, msg=line):
                _protocol.parse(line)

    def test_ok_with_slots(self):
        one = _protocol.parse("OK /tmp/x backend=flock mode=exclusive token=2 slot=1 slots=2")
        self.assertEqual((one.slot, one.slot_count, one.token), (1, 2, 2))
        plain = _protocol.parse("OK /tmp/x backend=flock mode=exclusive token=2")
        self.assertEqual((plain.slot, plain.slot_count), (None, None))
        s = _protocol.parse("OK a backend=mkdir,flock token=1,2 slot=1, slots=2, locks=2")
        self.assertEqual([(h.slot, h.slots) for h in s.locks], [(1, 2), (None, None)])
        self.assertEqual((s.slot, s.slot_count), (None, None), "one slot cannot stand for a set")
        both = _protocol.parse("OK a backend=flock,flock slot=0,1023 slots=3,1024 locks=2")
        self.assertEqual((both.locks[1].slot, both.locks[1].slots), (1023, 1024))
        for bad in [
            "OK a backend=flock slot=1",
            "OK a backend=flock slots=2",
            "OK a backend=flock slot=2 slots=2",
            "OK a backend=flock slot= slots=2",
            "OK a backend=flock slot=x slots=2",
            "OK a backend=flock slot=-1 slots=2",
            "OK a backend=flock slot=+1 slots=2",
            "OK a backend=flock slot=\u0661 slots=2",
            "OK a backend=flock slot=0 slots=4294967296",
            "OK a backend=flock slot=0 slots=0",
            "OK a backend=flock,flock slot=0 slots=2, locks=2",
            "OK a backend=flock,flock slot=0, slots=2 locks=2",
            "OK a backend=flock,flock slot=0,1 slots=2,2,2 locks=2",
            "OK a backend=flock,flock slot=,1 slots=2, locks=2",
        ]:
            with self.assertRaises(netlock.ProtocolError, msg=bad):
                _protocol.parse(bad)

    def test_ok_profile_is_the_first_word_even_for_an_address_with_a_query(self):
        # Issue 25: for a lock address the profile field is the address as given (spaces
        # written %20), `?k=v` and all: it is the profile, not a missing one.
        for line, profile in [
            ("OK mkdir:/x?stale_after=30s backend=mkdir mode=exclusive token=1", "mkdir:/x?stale_after=30s"),
            ("OK postgres://db:5432/app?lock=py backend=postgres", "postgres://db:5432/app?lock=py"),
            ("OK mkdir:/a%20b?stale_after=30s&wait=0 backend=mkdir token=2", "mkdir:/a%20b?stale_after=30s&wait=0"),
            ("OK backend=flock backend=flock", "backend=flock"),
            ("OK = backend=flock", "="),
        ]:
            ok = _protocol.parse(line)
            self.assertEqual(ok.profile, profile, line)
            self.assertEqual(len(ok.fields), len(line.split(" ")) - 2, line)
        self.assertIsNone(_protocol.parse("OK mkdir:/x?stale_after=30s backend=mkdir").get("stale_after"))

    def test_ok_lines_round_trip_randomized(self):
        # A seeded random loop (no hypothesis needed): OK lines as the helper writes them,
        # the profile a name or a lock address with ?, =, :, %20 in it, every field back.
        # NETLOCK_TEST_SEED picks another seed, NETLOCK_TEST_CASES a longer run.
        seed = int(os.environ.get("NETLOCK_TEST_SEED", "25"))
        cases = int(os.environ.get("NETLOCK_TEST_CASES", "3000"))
        rnd = random.Random(seed)
        for i in range(cases):
            profile = random_address(rnd) if rnd.random() < 0.7 else random_name(rnd)
            fields = [("backend", rnd.choice(["flock", "mkdir", "postgres", "x"]))]
            if rnd.random() < 0.7:
                fields.append(("mode", rnd.choice(["exclusive", "shared"])))
            token = rnd.choice([None, 0, 1, rnd.randrange(2**64), 2**64 - 1])
            if token is not None:
                fields.append(("token", str(token)))
            if rnd.random() < 0.3:
                fields.append(("prev", "crashed"))
            # A semaphore's slot=K slots=N (SPEC 3b), K < N.
            slot = slots = None
            if rnd.random() < 0.3:
                slots = rnd.choice([1, 2, 3, 1024, rnd.randrange(1, 2**32)])
                slot = rnd.randrange(slots)
                fields += [("slot", str(slot)), ("slots", str(slots))]
            for key in rnd.sample(["since", "host", "pid", "note"], rnd.randrange(3)):
                fields.append((key, rnd.choice(["", "2025-01-01T00:00:00Z", "3", "a=b", "x?y", "%20", ":"])))
            seps = [rnd.choice([" ", " ", " ", "  ", "\t", " \t"]) for _ in range(len(fields) + 1)]
            line = "OK" + seps[0] + profile
            for sep, (k, v) in zip(seps[1:], fields):
                line += f"{sep}{k}={v}"
            line += rnd.choice(["", "", " ", "\r", " \r"])
            with self.subTest(case=i, seed=seed, line=line):
                ok = _protocol.parse(line)
                self.assertIsInstance(ok, _protocol.OkLine)
                self.assertEqual(ok.raw, line)
                self.assertEqual(ok.profile, profile)
                self.assertEqual(ok.fields, fields)
                self.assertEqual(ok.token, token)
                self.assertEqual((ok.slot, ok.slot_count), (slot, slots))

    def test_ok_lines_for_several_locks_round_trip_randomized(self):
        # Several locks as the helper writes them (SPEC 3b): each lock's backend, mode and
        # token come back in order, an empty token place as None.
        seed = int(os.environ.get("NETLOCK_TEST_SEED", "25"))
        rnd = random.Random(seed)
        for i in range(int(os.environ.get("NETLOCK_TEST_CASES", "3000")) // 3):
            profile = random_address(rnd) if rnd.random() < 0.7 else random_name(rnd)
            n = rnd.randint(2, 5)
            locks = [
                (
                    rnd.choice(["flock", "mkdir", "postgres", "etcd"]),
                    rnd.random() < 0.3,
                    rnd.choice([None, 0, 1, rnd.randrange(2**64), 2**64 - 1]),
                    rnd.choice([None, None, (0, 2), (1, 2), (1023, 1024)]),
                )
                for _ in range(n)
            ]
            line = f"OK {profile} backend={','.join(b for b, _, _, _ in locks)} mode=" + ",".join(
                "shared" if s else "exclusive" for _, s, _, _ in locks
            )
            if any(t is not None for _, _, t, _ in locks):
                line += " token=" + ",".join("" if t is None else str(t) for _, _, t, _ in locks)
            if any(k is not None for _, _, _, k in locks):
                line += " slot=" + ",".join("" if k is None else str(k[0]) for _, _, _, k in locks)
                line += " slots=" + ",".join("" if k is None else str(k[1]) for _, _, _, k in locks)
            line += f" locks={n}"
            with self.subTest(case=i, seed=seed, line=line):
                ok = _protocol.parse(line)
                self.assertEqual(ok.profile, profile)
                self.assertEqual(
                    [(h.backend, h.shared, h.token, None if h.slot is None else (h.slot, h.slots)) for h in ok.locks],
                    locks,
                )
                self.assertIsNone(ok.token)
                self.assertIsNone(ok.slot)

    def test_error_lines(self):
        for word, cls in [
            ("busy", netlock.Busy),
            ("config", netlock.Config),
            ("unavailable", netlock.Unavailable),
            ("denied", netlock.Denied),
            ("lost", netlock.Lost),
            ("usage", netlock.Usage),
            ("io", netlock.Io),
        ]:
            e = _protocol.parse(f"ERROR {word}: it went: wrong ")
            self.assertIs(e.cls, cls)
            self.assertEqual(e.message, "it went: wrong")
        self.assertIsNone(_protocol.parse("ERROR spawn: x").cls, "spawn is the client's word")
        for line in ["ERROR no colon", "ERROR : empty kind", "hello", ""]:
            with self.assertRaises(netlock.ProtocolError, msg=line):
                _protocol.parse(line)

    def test_lost_lines(self):
        self.assertEqual(_protocol.parse("LOST server went away").reason, "server went away")
        self.assertEqual(_protocol.parse("LOST").reason, "")

    def test_line_reader_is_byte_exact(self):
        r, w = os.pipe()
        os.write(w, b"OK a backend=flock\nLOST gone\npartial")
        os.close(w)
        reader = _protocol.LineReader(r)
        self.assertEqual(reader.read_line(), "OK a backend=flock")
        self.assertEqual(reader.read_line(), "LOST gone")
        with self.assertRaisesRegex(netlock.ProtocolError, "middle of a line"):
            reader.read_line()
        self.assertIsNone(reader.read_line())
        os.close(r)

    def test_line_reader_caps_and_utf8(self):
        r, w = os.pipe()
        os.write(w, b"OK \xff\n")
        os.close(w)
        with self.assertRaisesRegex(netlock.ProtocolError, "not UTF-8"):
            _protocol.LineReader(r).read_line()
        os.close(r)
        reader = _protocol.LineReader(-1)
        reader.buf += b"x" * _protocol.MAX_LINE
        with self.assertRaisesRegex(netlock.ProtocolError, "longer than"):
            reader.take_line()


class ArgsTest(unittest.TestCase):
    def test_wait_arguments(self):
        w = _spawn.wait_arg
        self.assertIsNone(w(None))
        self.assertEqual(w(0), "0")
        self.assertEqual(w(0.0), "0")
        self.assertEqual(w("0"), "0")
        self.assertEqual(w(0.3), "300ms")
        self.assertEqual(w(1e-9), "1ms", "a non-zero wait never becomes try-once")
        self.assertEqual(w(0.0025), "3ms")
        self.assertEqual(w(10), "10000ms")
        self.assertEqual(w("1.5"), "1500ms")
        self.assertEqual(w(datetime.timedelta(minutes=1)), "60000ms")
        self.assertEqual(w(float("inf")), "forever")
        self.assertEqual(w("forever"), "forever")
        self.assertEqual(w("1m30s"), "1m30s")
        for bad in [-1, float("nan"), "", " ", "-5s", "1 m", True, [1]]:
            with self.assertRaises(netlock.Usage, msg=repr(bad)):
                w(bad)

    def test_helper_args(self):
        self.assertEqual(_spawn.helper_args("demo", None, None, False), ["--watch-stdin", "hold", "demo"])
        self.assertEqual(
            _spawn.helper_args("demo", Path("/etc/p.toml"), "1500ms", True),
            ["--watch-stdin", "--profiles", "/etc/p.toml", "--wait", "1500ms", "--shared", "hold", "demo"],
        )

    def test_slots_arguments(self):
        for good in [1, 2, 1024]:
            self.assertEqual(_spawn.slots_arg(good), str(good))
        self.assertIsNone(_spawn.slots_arg(None))
        for bad in [0, 1025, -1, "x", "2", 2.0, True, [2]]:
            with self.assertRaises(netlock.Usage, msg=repr(bad)):
                _spawn.slots_arg(bad)
        self.assertEqual(
            _spawn.helper_args(["a", "b"], None, "0", True, "3"),
            ["--watch-stdin", "--wait", "0", "--shared", "--slots", "3", "hold", "a", "b"],
        )

    def test_fair_arguments(self):
        self.assertIs(_spawn.fair_arg(True), True)
        self.assertIs(_spawn.fair_arg(False), False)
        self.assertIs(_spawn.fair_arg(None), False)
        for bad in ["yes", "true", "", 1, 0, 1.0, [True]]:
            with self.assertRaisesRegex(netlock.Usage, "expected True or False", msg=repr(bad)):
                _spawn.fair_arg(bad)
        self.assertEqual(
            _spawn.helper_args(["a", "b"], None, "0", False, "3", True),
            ["--watch-stdin", "--wait", "0", "--slots", "3", "--fair", "hold", "a", "b"],
        )
        self.assertEqual(_spawn.helper_args("a", None, None, False, None, False), ["--watch-stdin", "hold", "a"])

    def test_tags(self):
        for good in ["demo", "a", "phone.stuff_1-2", "x-", "/var/lock/x.lock"]:
            self.assertEqual(_spawn.check_tag(good), good)
        for bad in ["", "-v", "--help", "a\nb", "a\x00", 5, None]:
            with self.assertRaises(netlock.Usage, msg=repr(bad)):
                _spawn.check_tag(bad)


class LookupTest(unittest.TestCase):
    def setUp(self):
        self.dir = Path(tempfile.mkdtemp(prefix="netlock-lookup-"))
        self.bin = self.dir / "bin"
        self.bin.mkdir(mode=0o755)
        self.exe = self.bin / "locksmith"
        self.exe.write_text("#!/bin/sh\nexit 0\n")
        self.exe.chmod(0o755)

    def tearDown(self):
        for p in (self.bin, self.dir):
            p.chmod(0o700)
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)

    def test_order_explicit_env_path(self):
        env = {"PATH": f"{self.bin}", "LOCKSMITH_BIN": "/env/ls"}
        with mock.patch.dict(os.environ, env, clear=True):
            self.assertEqual(_spawn.find_helper("/x/ls"), ("/x/ls", "given as helper="))
            self.assertEqual(_spawn.find_helper(), ("/env/ls", "from $LOCKSMITH_BIN"))
        with mock.patch.dict(os.environ, {"PATH": f"{self.bin}", "LOCKSMITH_BIN": ""}, clear=True):
            self.assertEqual(_spawn.find_helper(), (str(self.exe), "looked up on $PATH"))

    def test_path_skips_relative_and_writable_directories(self):
        with mock.patch.dict(os.environ, {"PATH": "relative:.:"}, clear=True):
            with self.assertRaises(netlock.SpawnError):
                _spawn.find_helper()
        self.bin.chmod(0o777)
        with mock.patch.dict(os.environ, {"PATH": str(self.bin)}, clear=True):
            with self.assertRaisesRegex(netlock.SpawnError, "writable by group or others"):
                _spawn.find_helper()
        self.bin.chmod(0o775)
        self.assertIn("writable", _spawn.untrusted(str(self.exe)))
        self.bin.chmod(0o755)
        self.exe.chmod(0o777)
        self.assertIn("writable", _spawn.untrusted(str(self.exe)))
        self.exe.chmod(0o755)
        self.assertIsNone(_spawn.untrusted(str(self.exe)))
        # An ancestor writable by others without the sticky bit could rename bin/ away.
        self.dir.chmod(0o777)
        self.assertIn("writable", _spawn.untrusted(str(self.exe)))
        self.dir.chmod(0o777 | stat.S_ISVTX)
        self.assertIsNone(_spawn.untrusted(str(self.exe)), "a sticky ancestor, as /tmp, is fine")

    def test_symlink_target_is_checked_too(self):
        other = self.dir / "other"
        other.mkdir(mode=0o777)
        other.chmod(0o777)
        real = other / "locksmith-real"
        real.write_text("#!/bin/sh\n")
        real.chmod(0o755)
        link = self.bin / "ls-link"
        link.symlink_to(real)
        self.assertIn("writable", _spawn.untrusted(str(link)))


class TestHelperDiscoveryTest(unittest.TestCase):
    """How the test suites find the real helper (issue 25 finding 6): in cargo's target
    directory, wherever ``CARGO_TARGET_DIR`` puts it; ``LOCKSMITH_BIN`` wins; a missing
    helper skips, and fails under ``CI=true``."""

    def setUp(self):
        self.target = Path(tempfile.mkdtemp(prefix="netlock-py-target-"))
        self.env = mock.patch.dict(os.environ, {"CARGO_TARGET_DIR": str(self.target)})
        self.env.start()
        for var in ("LOCKSMITH_BIN", "CI"):
            os.environ.pop(var, None)

    def tearDown(self):
        self.env.stop()
        import shutil

        shutil.rmtree(self.target, ignore_errors=True)

    def built(self) -> Path:
        path = self.target / "debug" / "locksmith"
        path.parent.mkdir(parents=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
        return path

    def test_helper_in_cargo_target_dir(self):
        self.assertEqual(support.cargo_target_dir(), self.target)
        built = self.built()
        self.assertEqual(support.helper(), str(built))

    def test_locksmith_bin_wins(self):
        self.built()
        other = self.target / "elsewhere"
        other.write_text("#!/bin/sh\n")
        other.chmod(0o755)
        os.environ["LOCKSMITH_BIN"] = str(other)
        self.assertEqual(support.helper(), str(other))

    def test_missing_helper_skips_but_fails_under_ci(self):
        with self.assertRaisesRegex(unittest.SkipTest, str(self.target)):
            support.helper()
        os.environ["CI"] = "true"
        with self.assertRaisesRegex(AssertionError, "no locksmith helper at " + str(self.target)):
            support.helper()


class FakeHelperTest(unittest.TestCase):
    """The guard's handling of every kind of helper answer, against a fake helper."""

    @classmethod
    def setUpClass(cls):
        cls.dir = Path(tempfile.mkdtemp(prefix="netlock-fake-"))
        cls.fake = cls.dir / "fake-locksmith"
        cls.fake.write_text(FAKE)
        cls.fake.chmod(0o755)

    @classmethod
    def tearDownClass(cls):
        import shutil

        shutil.rmtree(cls.dir, ignore_errors=True)

    def lock(self, tag, **kw):
        return netlock.lock(tag, helper=self.fake, **kw)

    def test_ok_fields_and_release(self):
        lk = self.lock("plain1", profiles="/p.toml", wait=1.5, shared=True)
        self.assertEqual(
            (self.dir / "plain1.args").read_text().split("\n")[:-1],
            ["--watch-stdin", "--profiles", "/p.toml", "--wait", "1500ms", "--shared", "hold", "plain1"],
        )
        self.assertEqual((lk.token, lk.prev_crashed, lk.backend, lk.profile), (42, True, "fake", "plain1"))
        self.assertEqual(lk.field("since"), "2025-01-01T00:00:00Z")
        self.assertFalse(lk.lost)
        self.assertTrue(lk.unlock())
        self.assertTrue((self.dir / "plain1.released").exists(), "unlock returned before the helper finished")
        self.assertFalse(lk.unlock(), "a second unlock is a no-op")
        self.assertFalse(lk.held)
        self.assertFalse(lk.lost, "a clean unlock is not a loss")
        support.assert_no_children(self)

    def test_several_locks(self):
        lk = netlock.lock("set1", "pair1", helper=self.fake)
        self.assertEqual((self.dir / "pair1.args").read_text(), "--watch-stdin\nhold\nset1\npair1\n")
        self.assertEqual(lk.tags, ["set1", "pair1"])
        self.assertEqual(lk.tokens, [5, None])
        self.assertEqual(lk.backends, ["fake", "other"])
        self.assertEqual((lk.backend, lk.profile), ("fake,other", "set1"))
        self.assertIsNone(lk.token, "one token cannot stand for a set")
        self.assertFalse(lk.shared, "one of the two is exclusive")
        self.assertIn("tokens=[5, None]", repr(lk))
        self.assertTrue(lk.unlock())
        self.assertTrue((self.dir / "pair1.released").exists())
        # The same name twice: sent once, reported in each place it was given.
        lk = netlock.try_lock("set2", "pair2", "set2", helper=self.fake)
        self.assertEqual(
            (self.dir / "pair2.args").read_text(), "--watch-stdin\n--wait\n0\nhold\nset2\npair2\n"
        )
        self.assertEqual(lk.tokens, [5, None, 5])
        self.assertEqual(lk.backends, ["fake", "other", "fake"])
        lk.unlock()
        lk = netlock.lock("okay6", "okay6", helper=self.fake)
        self.assertEqual((self.dir / "okay6.args").read_text(), "--watch-stdin\nhold\nokay6\n")
        self.assertEqual((lk.tokens, lk.token), ([42, 42], 42))
        lk.unlock()
        # Two names for one lock: which token is whose cannot be told.
        with self.assertRaisesRegex(netlock.Usage, "name each lock once; released$"):
            netlock.lock("set3", "merged1", helper=self.fake)
        self.assertTrue((self.dir / "merged1.released").exists())
        with self.assertRaises(netlock.Usage):
            netlock.lock("okay7", "-v", helper=self.fake)
        self.assertFalse((self.dir / "-v.args").exists(), "spawned with a bad name in the set")
        support.assert_no_children(self)

    def test_slots(self):
        lk = self.lock("sem1", slots=3)
        self.assertEqual((self.dir / "sem1.args").read_text(), "--watch-stdin\n--slots\n3\nhold\nsem1\n")
        self.assertEqual((lk.slot, lk.slot_count, lk.slots, lk.slot_counts), (1, 3, [1], [3]))
        self.assertIn("slot=1/3", repr(lk))
        lk.unlock()
        lk = self.lock("plain2")
        self.assertEqual((lk.slot, lk.slot_count, lk.slots), (None, None, [None]))
        lk.unlock()
        lk = netlock.try_lock("set4", "semset1", "set4", slots=1, helper=self.fake)
        self.assertEqual(
            (self.dir / "semset1.args").read_text(),
            "--watch-stdin\n--wait\n0\n--slots\n1\nhold\nset4\nsemset1\n",
        )
        self.assertEqual(lk.slots, [None, 2, None])
        self.assertEqual(lk.slot_counts, [None, 3, None])
        self.assertIsNone(lk.slot, "one slot cannot stand for a set")
        lk.unlock()
        # Bad numbers: refused before anything is spawned.
        for n, tag in [(0, "sem2"), (1025, "sem3"), ("x", "sem4"), (True, "sem5")]:
            with self.assertRaisesRegex(netlock.Usage, "1 to 1024", msg=repr(n)):
                self.lock(tag, slots=n)
            with self.assertRaises(netlock.Usage, msg=repr(n)):
                netlock.try_lock(tag, slots=n, helper=self.fake)
            self.assertFalse((self.dir / f"{tag}.args").exists(), f"spawned with slots={n!r}")
        support.assert_no_children(self)

    def test_fair(self):
        lk = self.lock("plain3", fair=True)
        self.assertEqual((self.dir / "plain3.args").read_text(), "--watch-stdin\n--fair\nhold\nplain3\n")
        lk.unlock()
        lk = netlock.try_lock("sem6", slots=2, fair=True, helper=self.fake)
        self.assertEqual(
            (self.dir / "sem6.args").read_text(), "--watch-stdin\n--wait\n0\n--slots\n2\n--fair\nhold\nsem6\n"
        )
        lk.unlock()
        # False (the default) passes nothing: the profile decides.
        lk = self.lock("plain4", fair=False)
        self.assertEqual((self.dir / "plain4.args").read_text(), "--watch-stdin\nhold\nplain4\n")
        lk.unlock()
        # Not a boolean: refused before anything is spawned.
        for bad, tag in [("yes", "plain5"), (1, "plain6"), ("", "plain7")]:
            with self.assertRaisesRegex(netlock.Usage, "expected True or False", msg=repr(bad)):
                self.lock(tag, fair=bad)
            with self.assertRaises(netlock.Usage, msg=repr(bad)):
                netlock.try_lock(tag, fair=bad, helper=self.fake)
            self.assertFalse((self.dir / f"{tag}.args").exists(), f"spawned with fair={bad!r}")
        support.assert_no_children(self)

    def test_error_kinds(self):
        with self.assertRaises(netlock.Busy) as c:
            self.lock("busy1")
        self.assertEqual((c.exception.kind, c.exception.exit_code), ("busy", 75))
        self.assertEqual(str(c.exception), "locksmith: busy: held by host=h pid=1 ppid=0")
        self.assertIsNone(netlock.try_lock("busy2", helper=self.fake))
        with self.assertRaises(netlock.Config) as c:
            self.lock("odd1")  # unknown word: the exit code decides, the word is kept
        self.assertEqual(c.exception.message, "strange: what")
        with self.assertRaises(netlock.Unavailable) as c:
            self.lock("quiet1")
        self.assertEqual(c.exception.exit_code, 69)
        self.assertIn("without writing a status line", c.exception.message)
        with self.assertRaises(netlock.ProtocolError):
            self.lock("zero1")
        with self.assertRaises(netlock.ProtocolError):
            self.lock("garbage1")
        with self.assertRaisesRegex(netlock.ProtocolError, "instead of"):
            self.lock("other1")
        with self.assertRaises(netlock.SpawnError):
            netlock.lock("x", helper=self.dir / "missing")
        support.assert_no_children(self)

    def test_lost_line_is_seen_and_reported(self):
        lk = self.lock("lost1")
        self.assertEqual(lk.token, 9)
        self.assertTrue(lk.wait_lost(10))
        self.assertTrue(lk.lost)
        with self.assertRaises(netlock.Lost) as c:
            lk.check()
        self.assertEqual(c.exception.message, "server went away")
        with self.assertRaises(netlock.Lost) as c:
            lk.unlock()
        self.assertEqual((c.exception.message, c.exception.exit_code), ("server went away", 74))
        self.assertTrue(lk.lost, "still lost after the unlock that reported it")
        support.assert_no_children(self)

    def test_early_exit_and_failed_release(self):
        lk = self.lock("early1")
        self.assertTrue(lk.wait_lost(10))
        with self.assertRaisesRegex(netlock.Lost, "before unlock was asked for") as c:
            lk.unlock()
        self.assertEqual(c.exception.exit_code, 0)
        self.assertTrue(lk.lost, "an early exit is a loss, before and after unlock")
        lk = self.lock("relfail1")
        self.assertFalse(lk.lost)
        with self.assertRaisesRegex(netlock.Lost, "while releasing") as c:
            lk.unlock()
        self.assertEqual(c.exception.exit_code, 74)
        self.assertTrue(lk.lost, "a failed release is a loss")
        self.assertFalse(lk.held)
        support.assert_no_children(self)

    def test_interrupted_unlock_is_lost_only_if_the_release_failed(self):
        # KeyboardInterrupt while unlock waits for the helper: it is reaped anyway, and its
        # exit status still decides whether the lock was lost.
        for tag, lost in [("plain2", False), ("relfail4", True)]:
            lk = self.lock(tag)
            real_wait = lk._proc.wait
            calls = []

            def wait(*args):
                calls.append(args)
                if len(calls) == 1:
                    raise KeyboardInterrupt
                return real_wait(*args)

            with mock.patch.object(lk._proc, "wait", side_effect=wait):
                with self.assertRaises(KeyboardInterrupt):
                    lk.unlock()
            self.assertEqual(len(calls), 2, "the helper was reaped after the interrupt")
            self.assertEqual((lk.lost, lk.held), (lost, False), tag)
        support.assert_no_children(self)

    def test_with_block(self):
        with self.lock("with1") as lk:
            self.assertFalse(lk.lost)
        self.assertTrue((self.dir / "with1.released").exists())
        self.assertFalse(lk.lost, "a clean release at the end of the block is not a loss")
        # The body's exception wins over a failed release, which is reported on stderr.
        with mock.patch("sys.stderr", new_callable=io.StringIO) as err:
            with self.assertRaises(KeyError):
                with self.lock("relfail2"):
                    raise KeyError("body")
        self.assertIn("netlock: releasing 'relfail2': locksmith: lost:", err.getvalue())
        with self.assertRaises(netlock.Lost):
            with self.lock("relfail3"):
                pass
        support.assert_no_children(self)


if __name__ == "__main__":
    unittest.main()
