"""scripts/setup.sh's apt branch, run for real: as root, and as an ordinary user through sudo.

A fresh machine lacking redis-server or promtool takes this branch; machines
that already have both never do, which is how a broken branch once stopped
every fresh `make serve`. So the test installs a small Debian package that is
absent (GNU hello, about 50 KB), checks that it runs, and removes it again so
the next run exercises the branch too. The venv and checkpoint branches run
on every fresh clone (`make test` creates .venv and fetches the checkpoint
into .cache/, both ignored by git), which is what CI is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"
PACKAGE, PROGRAM = "hello", "/usr/bin/hello"
TEST_USER = "tserve-setup-test"
SUDOERS = Path("/etc/sudoers.d/tserve-setup-test")

pytestmark = [
    pytest.mark.slow,  # apt-get for real: not in the fast layer
    pytest.mark.skipif(shutil.which("apt-get") is None, reason="not a Debian-family system"),
    pytest.mark.skipif(os.geteuid() != 0, reason="installs and removes a Debian package: needs root"),
]


def installed(package: str) -> bool:
    return subprocess.run(["dpkg", "-s", package], capture_output=True).returncode == 0


def purge(package: str) -> None:
    if installed(package):
        subprocess.run(
            ["apt-get", "purge", "-y", "-qq", package],
            check=True,
            capture_output=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )


@pytest.fixture
def absent_package() -> Iterator[str]:
    purge(PACKAGE)
    assert not installed(PACKAGE)
    yield PACKAGE
    purge(PACKAGE)


def run_setup(
    *args: str, user: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    command = [str(SETUP), *args]
    if user is not None:
        command = ["runuser", "-u", user, "--", *command]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=600,
        cwd="/",
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


def assert_hello_works(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr
    assert f"installing {PACKAGE} with apt-get" in result.stderr
    assert installed(PACKAGE)
    assert subprocess.run([PROGRAM], capture_output=True, text=True).stdout.strip() == "Hello, world!"


def test_apt_branch_as_root(absent_package: str) -> None:
    assert_hello_works(run_setup("--apt-install", absent_package))
    again = run_setup("--apt-install", absent_package)  # installed now: nothing to do, nothing said
    assert again.returncode == 0 and "installing" not in again.stderr


@contextlib.contextmanager
def user_with_sudo() -> Iterator[str]:
    """A throwaway system user allowed to run anything as root through sudo, removed afterwards."""
    if shutil.which("sudo") is None:
        # The script's own apt branch brings sudo where it is missing.
        result = run_setup("--apt-install", "sudo")
        assert result.returncode == 0, result.stderr
    subprocess.run(["useradd", "--system", "--no-create-home", TEST_USER], check=True, capture_output=True)
    try:
        SUDOERS.write_text(f"{TEST_USER} ALL=(root) NOPASSWD: ALL\n")
        SUDOERS.chmod(0o440)
        yield TEST_USER
    finally:
        SUDOERS.unlink(missing_ok=True)
        subprocess.run(["userdel", TEST_USER], capture_output=True)


def test_apt_branch_through_sudo(absent_package: str) -> None:
    with user_with_sudo() as user:
        whoami = subprocess.run(["runuser", "-u", user, "--", "id", "-u"], capture_output=True, text=True)
        assert whoami.stdout.strip() != "0"  # the script really runs unprivileged and must use sudo
        assert_hello_works(run_setup("--apt-install", absent_package, user=user))


def test_apt_branch_refuses_clearly_without_root_or_sudo(absent_package: str) -> None:
    """No root and no sudo: a clear message and a failing exit, not a confusing shell error."""
    result = subprocess.run(
        ["runuser", "-u", "nobody", "--", "env", "PATH=/usr/bin:/bin", str(SETUP), "--apt-install", PACKAGE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode != 0
    if not shutil.which("sudo", path="/usr/bin:/bin"):
        assert "need root" in result.stderr and "sudo is not installed" in result.stderr
    # Where sudo exists, nobody may not use it: sudo itself refuses, and nothing is installed either way.
    assert not installed(PACKAGE)


DPKG_LOCKS = ["/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock"]
LISTS_LOCK = "/var/lib/apt/lists/lock"  # `apt-get update`'s, which apt's DPkg::Lock::Timeout does not cover

# A stand-in for unattended-upgrade: takes the locks the way apt and dpkg do (fcntl, whole file, waiting
# its turn if a real apt holds them now), says so, holds them for argv[1] seconds, and exits.
HOLDER = """
import fcntl, os, sys, time
fds = [os.open(path, os.O_RDWR | os.O_CREAT, 0o640) for path in sys.argv[2:]]
for fd in fds:
    fcntl.lockf(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[1]))
"""


@contextlib.contextmanager
def locks_held(seconds: float, *paths: str) -> Iterator[subprocess.Popen[str]]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(seconds), *paths], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait(timeout=10)


@pytest.mark.parametrize("paths", [DPKG_LOCKS, [LISTS_LOCK]], ids=["dpkg-locks", "lists-lock"])
def test_apt_branch_waits_for_a_held_lock(absent_package: str, paths: list[str]) -> None:
    with locks_held(4, *paths) as holder:
        result = run_setup("--apt-install", absent_package, env={"APT_LOCK_TIMEOUT": "300"})
        assert holder.poll() is not None, "setup finished while the lock was still held"
    assert "waiting up to 300s for another package manager" in result.stderr, result.stderr
    assert f"{paths[0]} is held by process {holder.pid}" in result.stderr, result.stderr
    assert result.stderr.count("waiting up to") == 1, "said once, not once a second"
    assert_hello_works(result)


def test_apt_branch_gives_up_after_the_timeout(absent_package: str) -> None:
    with locks_held(60, *DPKG_LOCKS) as holder:
        result = run_setup("--apt-install", absent_package, env={"APT_LOCK_TIMEOUT": "2"})
        assert holder.poll() is None, "it waited for the holder to end"
    assert result.returncode != 0
    assert "gave up waiting for apt/dpkg after 2s" in result.stderr, result.stderr
    assert f"held by process {holder.pid}" in result.stderr
    assert not installed(PACKAGE)
