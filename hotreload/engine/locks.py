"""One reload at a time per device: an asyncio lock inside the process, and an `fcntl`
file lock shared by every hotreload process of this user, so two sessions on one GPU never
reload at once (two loads racing for VRAM is how a reload runs a device out of memory).

The lock files live in a folder only this user can enter (`user_runtime_dir()/locks`, 0700,
files 0600): in a folder every user could write, another user could hold a lock (and stall
every reload) or plant a symbolic link for us to open. Sessions of other users are not
serialized with ours; the kernel's own limits keep them apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import re
import stat
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from hotreload.errors import HotreloadError
from hotreload.paths import ensure_private_dir, user_runtime_dir

#: Folder of the lock files (tests point it at a folder of their run).
LOCK_DIR_ENV = "HOTRELOAD_LOCK_DIR"


def default_lock_dir() -> Path:
    env = os.environ.get(LOCK_DIR_ENV)
    if env:
        return Path(env)
    return user_runtime_dir() / "locks"


def ensure_lock_dir(folder: Path) -> Path:
    """Create the lock folder 0700 (and the per-user folder it is in), or refuse one that is
    a symbolic link or belongs to someone else, saying what to do."""
    fix = f"remove it, or point {LOCK_DIR_ENV} at a folder of your own"
    runtime = user_runtime_dir()
    if folder.parent == runtime:
        ensure_private_dir(runtime, fix)
    return ensure_private_dir(folder, fix)


def open_lock_file(folder: Path, key: str) -> int:
    """A descriptor on the lock file for `key` (created 0600). Never follows a symbolic link
    and refuses a file that is not a plain one of ours."""
    ensure_lock_dir(folder)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key)
    path = folder / f"{safe}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HotreloadError(
                f"{path} is a symbolic link; hotreload never follows one in its lock folder: "
                "remove it"
            ) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        raise HotreloadError(
            f"{path} is not a plain file of yours (uid {st.st_uid}); remove it and try again"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.fchmod(fd, 0o600)
    return fd


def mark_holder(fd: int) -> None:
    """Write this process's pid into a lock file it holds (named in "waiting for" lines)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)


class DeviceLocks:
    """`async with locks.hold("cuda:0"):` serializes reloads on that device machine-wide."""

    def __init__(self, folder: Path | None = None, poll_s: float = 0.02) -> None:
        self.folder = folder or default_lock_dir()
        self.poll_s = poll_s
        self._local: dict[str, asyncio.Lock] = {}

    def _lock(self, key: str) -> asyncio.Lock:
        if key not in self._local:
            self._local[key] = asyncio.Lock()
        return self._local[key]

    @contextlib.asynccontextmanager
    async def hold(
        self, key: str, on_wait: Callable[[str], None] | None = None
    ) -> AsyncIterator[float]:
        """Hold the device lock; yields the seconds spent waiting for another holder."""
        contended_since: float | None = None
        if self._lock(key).locked():
            contended_since = time.monotonic()
        async with self._lock(key):
            fd = await asyncio.to_thread(open_lock_file, self.folder, key)
            told = False
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except OSError as exc:
                        if exc.errno not in (errno.EAGAIN, errno.EACCES):
                            raise
                    if contended_since is None:
                        contended_since = time.monotonic()
                    if on_wait is not None and not told:
                        told = True
                        holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                        on_wait(f"waiting for the {key} reload lock (held by pid {holder or '?'})")
                    await asyncio.sleep(self.poll_s)
                mark_holder(fd)
                yield 0.0 if contended_since is None else time.monotonic() - contended_since
            finally:
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
