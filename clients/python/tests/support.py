"""Shared set-up for the tests: the package under test, the real helper, a sandbox.

The tests run against the real ``locksmith`` binary: ``$LOCKSMITH_BIN``, else
``debug/locksmith`` in this repository's cargo target directory, found as cargo finds it
(``cargo metadata``'s ``target_directory``: ``$CARGO_TARGET_DIR``, ``build.target-dir``, else
``target/``; ``cargo build -p locksmith-helper`` makes it). Without it they are skipped,
except under ``CI=true``, where a missing helper is a failure.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE_ROOT = HERE.parent  # clients/python: test this source, not an installed copy
REPO = HERE.parents[2]

if str(PACKAGE_ROOT) not in sys.path:
    sys.path.insert(0, str(PACKAGE_ROOT))

import netlock  # noqa: E402  (after the path set-up)

# Every blocking call in the tests is bounded: the profiles say wait = "20s" unless a test
# passes its own wait, so a regression fails instead of hanging.
PROFILES = """\
[defaults]
wait = "20s"

[profile.f]
backend = "flock"
path = "{dir}/f.lock"

[profile.m]
backend = "mkdir"
path = "{dir}/m.lock"

[profile.fast]
backend = "mkdir"
path = "{dir}/fast.lock"
poll = "20ms"
max_poll = "100ms"
keepalive = "200ms"
stale_after = "1500ms"
"""


def cargo_target_dir() -> Path:
    """This repository's cargo target directory, as cargo itself resolves it (``cargo
    metadata``); without cargo, ``$CARGO_TARGET_DIR`` (relative to the repository), else
    ``target/``."""
    try:
        out = subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            check=True,
            timeout=60,
        ).stdout
        return Path(json.loads(out)["target_directory"])
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        return REPO / os.environ.get("CARGO_TARGET_DIR", "target")


def helper() -> str:
    """The real helper, or skip (fail under CI=true) if it is not built."""
    path = os.environ.get("LOCKSMITH_BIN") or str(cargo_target_dir() / "debug" / "locksmith")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        why = f"no locksmith helper at {path} (run `cargo build -p locksmith-helper`, or set LOCKSMITH_BIN)"
        if os.environ.get("CI") == "true":
            raise AssertionError(why)
        raise unittest.SkipTest(why)
    return os.path.abspath(path)


def setup_environment() -> str:
    """Points the package at the real helper and quiets its stderr; returns the helper."""
    path = helper()
    os.environ["LOCKSMITH_BIN"] = path
    os.environ.setdefault("LOCKSMITH_LOG", "quiet")
    return path


class Sandbox:
    """A temporary directory with a profiles file (mode 0600) naming locks inside it."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="netlock-py-"))
        self.profiles = self.dir / "profiles.toml"
        fd = os.open(self.profiles, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(PROFILES.format(dir=self.dir))

    def path(self, name: str) -> Path:
        return self.dir / name

    def lock(self, tag: str, *more: str, **kw) -> "netlock.Lock":
        return netlock.lock(tag, *more, profiles=self.profiles, **kw)

    def try_lock(self, tag: str, *more: str, **kw):
        return netlock.try_lock(tag, *more, profiles=self.profiles, **kw)

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def child_env() -> dict:
    """The environment for a Python child that imports this source of the package."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    return env


def assert_no_children(test: unittest.TestCase) -> None:
    """No child process is left, running or zombie: every helper has been reaped."""
    try:
        pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return
    test.fail(f"a child process was left behind (waitpid -> pid {pid}, status {status})")
