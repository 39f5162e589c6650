"""No other local user can stall a session's reloads or read its state: the lock folder and
the state folder are this user's own (0700, files 0600), and a symbolic link planted in
either is refused, never followed. Tests that are about another user run one (created with
`useradd`, so only as root)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from hotreload.config import load_config
from hotreload.engine.cpus import plan_cpus
from hotreload.engine.locks import LOCK_DIR_ENV, DeviceLocks, default_lock_dir, open_lock_file
from hotreload.errors import HotreloadError
from hotreload.paths import runtime_dir_note, socket_path_for
from tests.support import ServeProcess, make_project, wait_until

IS_ROOT = os.geteuid() == 0


class OtherUser:
    """A second local account; `run(*argv)` runs a command as it."""

    def __init__(self, name: str) -> None:
        self.name = name
        import pwd

        entry = pwd.getpwnam(name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        cmd = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)

    def popen(self, *argv: str) -> subprocess.Popen[bytes]:
        cmd = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", *argv]
        # A group of its own, so the whole of it (flock and its child) can be killed.
        return subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )


@pytest.fixture
def other_user() -> Iterator[OtherUser]:
    if not IS_ROOT:
        pytest.skip("needs a second local user: run as root so the test can `useradd` one")
    if shutil.which("useradd") is None or shutil.which("setpriv") is None:
        pytest.skip("needs useradd and setpriv (util-linux) to run as a second user")
    name = f"hrt{secrets.token_hex(4)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)
    user = OtherUser(name)
    try:
        yield user
    finally:
        # Whatever this test started as that user ends with it (it owns no other process).
        for proc in psutil.process_iter(["uids"]):
            if proc.info["uids"] and proc.info["uids"].real == user.uid:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        # -f: even if a process of it is somehow still alive (it must not outlive the test).
        subprocess.run(["userdel", "-f", name], check=False, capture_output=True)


@pytest.fixture
def machine_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A sticky world-writable folder standing for the machine's temp folder (like /tmp),
    with the default lock folder (no HOTRELOAD_LOCK_DIR, no XDG_RUNTIME_DIR) under it.
    (tmp_path first: pytest makes its own temp folders from TMPDIR too.)"""
    folder = Path(tempfile.mkdtemp(prefix="hotreload-machine-tmp-", dir="/tmp"))
    os.chmod(folder, 0o1777)
    monkeypatch.delenv(LOCK_DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(folder))
    tempfile.tempdir = None  # gettempdir() caches its answer
    try:
        yield folder
    finally:
        tempfile.tempdir = None
        monkeypatch.undo()
        tempfile.tempdir = None
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def cache_home() -> Iterator[Path]:
    """A folder for XDG_CACHE_HOME right in /tmp: a session socket in the cache's fallback
    runtime folder must fit in 107 bytes, which one under tmp_path may not (pytest-xdist puts
    tmp_path a folder deeper, and a long user name lengthens it)."""
    folder = Path(tempfile.mkdtemp(prefix="hr-cache-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_lock_folder_is_per_user_and_private(machine_tmp: Path) -> None:
    folder = default_lock_dir()
    assert folder == machine_tmp / f"hotreload-{os.getuid()}" / "locks"
    fd = open_lock_file(folder, "cuda:0")
    os.close(fd)
    assert _mode(folder.parent) == 0o700 and _mode(folder) == 0o700
    assert _mode(folder / "cuda_0.lock") == 0o600


def test_xdg_runtime_dir_is_used_only_when_it_is_ours(
    machine_tmp: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert default_lock_dir() == runtime / "hotreload" / "locks"
    if IS_ROOT:
        os.chown(runtime, 4321, 4321)  # someone else's: not a place for our locks
        assert default_lock_dir() == machine_tmp / f"hotreload-{os.getuid()}" / "locks"


def test_another_user_can_neither_hold_nor_open_our_locks(
    machine_tmp: Path, other_user: OtherUser
) -> None:
    folder = default_lock_dir()
    ours = folder / "cuda_0.lock"
    os.close(open_lock_file(folder, "cuda:0"))
    # What stalled reloads before: the other user holds the lock in the shared folder.
    old = machine_tmp / "hotreload-locks"
    holder = other_user.popen(
        "sh", "-c", f"mkdir -p {old} && exec flock -x {old}/cuda_0.lock sleep 60"
    )
    try:
        # Nor can it reach ours, or plant a file beside it.
        tried = other_user.run("flock", "-n", "-x", str(ours), "true")
        assert tried.returncode != 0 and "Permission denied" in tried.stderr
        planted = other_user.run("sh", "-c", f"ln -s /etc/passwd {folder}/cpu0.lock")
        assert planted.returncode != 0

        waits: list[str] = []

        async def reload_lock() -> float:
            async with DeviceLocks(poll_s=0.01).hold("cuda:0", on_wait=waits.append) as waited:
                return waited

        assert asyncio.run(asyncio.wait_for(reload_lock(), 30)) == 0.0
        assert waits == []
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(10)


def test_a_runtime_folder_made_by_another_user_is_passed_over_and_said(
    machine_tmp: Path, other_user: OtherUser, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38, item 9: a squatted `hotreload-<uid>` no longer stops the session; sockets
    and locks go to the user's cache folder, and one line says so."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    squat = machine_tmp / f"hotreload-{os.getuid()}"
    assert other_user.run("mkdir", "-m", "0777", str(squat)).returncode == 0
    fallback = cache_home / "hotreload" / "run"
    assert default_lock_dir() == fallback / "locks"
    os.close(open_lock_file(default_lock_dir(), "cuda:0"))
    assert _mode(fallback) == 0o700 and not any(squat.iterdir())
    note = runtime_dir_note()
    assert note is not None and "\n" not in note
    assert f"{squat} belongs to uid {other_user.uid}" in note and str(fallback) in note
    # Clients find the session's socket in the same place.
    assert socket_path_for(Path("/x/hotreload.toml")).parent == fallback


def test_every_runtime_folder_taken_is_refused_saying_why(
    machine_tmp: Path, other_user: OtherUser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    (cache / "hotreload").mkdir(parents=True)
    (cache / "hotreload" / "run").symlink_to(tmp_path)
    squat = machine_tmp / f"hotreload-{os.getuid()}"
    assert other_user.run("mkdir", "-m", "0777", str(squat)).returncode == 0
    with pytest.raises(HotreloadError, match=rf"{squat} belongs to uid {other_user.uid}"):
        open_lock_file(default_lock_dir(), "cuda:0")


def test_a_planted_symlink_in_the_lock_folder_is_refused_not_followed(
    machine_tmp: Path, tmp_path: Path, project: Path
) -> None:
    folder = default_lock_dir()
    os.close(open_lock_file(folder, "cpu"))  # creates the folder
    target = tmp_path / "elsewhere"
    (folder / "cuda_0.lock").symlink_to(target)
    with pytest.raises(HotreloadError, match=r"cuda_0\.lock is a symbolic link"):
        os.close(open_lock_file(folder, "cuda:0"))
    assert not target.exists()
    # CPU claims go through the same door: a planted claim file stops the plan with a reason.
    (folder / "cpu0.lock").symlink_to(target)
    model = replace(load_config(project).models[0], cpus=(0,))
    with pytest.raises(HotreloadError, match=r"cpu0\.lock is a symbolic link"):
        plan_cpus([model], frozenset({0, 1}), folder=folder)
    assert not target.exists()


def test_a_symlinked_runtime_folder_is_passed_over_not_followed(
    machine_tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "real").mkdir(mode=0o700)
    link = machine_tmp / f"hotreload-{os.getuid()}"
    link.symlink_to(tmp_path / "real")
    os.close(open_lock_file(default_lock_dir(), "cuda:0"))
    assert default_lock_dir() == tmp_path / "cache" / "hotreload" / "run" / "locks"
    assert not any((tmp_path / "real").iterdir())
    assert "not a plain folder" in (runtime_dir_note() or "")


# ---------------------------------------------------------------------- the state folder


@pytest.fixture
def open_project() -> Iterator[Path]:
    """The example project in a folder every user may enter (as a checkout in a shared home
    often is), so only the state folder's own modes keep another user out."""
    folder = Path(tempfile.mkdtemp(prefix="hotreload-open-project-", dir="/tmp"))
    os.chmod(folder, 0o755)
    try:
        config = make_project(folder)
        for path in [folder / "proj", *(folder / "proj").rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        yield config
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_state_is_private_to_the_user(open_project: Path, serve: ServeProcess.Factory) -> None:
    state = open_project.parent / ".hotreload"
    state.mkdir(mode=0o755)  # as an older hotreload left it
    (state / "events.jsonl").write_text("")
    os.chmod(state / "events.jsonl", 0o644)
    serve(open_project)
    assert _mode(state) == 0o700
    for name in ("events.jsonl", "session.json", ".gitignore"):
        assert _mode(state / name) == 0o600, name
    # The report's figures too, written once requests flow.
    import numpy as np

    from hotreload import Client

    Client(config=open_project).infer("mlp", np.zeros((1, 64), np.float32))
    wait_until(lambda: (state / "stats.jsonl").exists(), 30, what="stats.jsonl")
    assert _mode(state / "stats.jsonl") == 0o600


def test_another_user_cannot_read_the_state(
    open_project: Path, serve: ServeProcess.Factory, other_user: OtherUser
) -> None:
    serve(open_project)
    state = open_project.parent / ".hotreload"
    assert other_user.run("cat", str(open_project)).returncode == 0  # the project is open
    for argv in (("ls", str(state)), ("cat", str(state / "events.jsonl"))):
        denied = other_user.run(*argv)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, argv


@pytest.mark.parametrize("link", [".hotreload", ".hotreload/events.jsonl"])
def test_a_symlinked_state_folder_or_events_file_is_refused(
    project: Path, serve: ServeProcess.Factory, tmp_path: Path, link: str
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = project.parent / link
    where.parent.mkdir(exist_ok=True)
    where.symlink_to(elsewhere if link == ".hotreload" else elsewhere / "events.jsonl")
    proc = serve(project, wait_ready=False)
    code = proc.proc.wait(60)
    proc.stop()
    assert code == 3, proc.output
    assert f"{where} is" in proc.output and "symbolic link" in proc.output, proc.output
    assert list(elsewhere.iterdir()) == []  # nothing written through the link


def test_a_session_starts_beside_a_squatted_runtime_folder_and_says_where(
    machine_tmp: Path,
    other_user: OtherUser,
    cache_home: Path,
    serve: ServeProcess.Factory,
    project: Path,
) -> None:
    squat = machine_tmp / f"hotreload-{os.getuid()}"
    assert other_user.run("mkdir", "-m", "0777", str(squat)).returncode == 0
    env = {"TMPDIR": str(machine_tmp), "XDG_CACHE_HOME": str(cache_home)}
    session = serve(project, env=env)
    notes = [line for line in session.lines if "note:" in line and str(squat) in line]
    assert len(notes) == 1 and str(cache_home / "hotreload" / "run") in notes[0], session.output
    status = subprocess.run(
        [sys.executable, "-m", "hotreload", "status", "--config", str(project)],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env},
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
