"""One reload at a time per device: an asyncio lock inside the process, and an `fcntl`
file lock shared by every hotreload process on the machine, so two sessions on one GPU never
reload at once (two loads racing for VRAM is how a reload runs a device out of memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

#: Folder of the machine-wide lock files (tests point it elsewhere).
LOCK_DIR_ENV = "HOTRELOAD_LOCK_DIR"


def default_lock_dir() -> Path:
    env = os.environ.get(LOCK_DIR_ENV)
    if env:
        return Path(env)
    # Shared by all users (sticky like /tmp): a GPU is a machine-wide resource.
    return Path(tempfile.gettempdir()) / "hotreload-locks"


def open_lock_file(folder: Path, key: str) -> int:
    try:
        folder.mkdir(mode=0o1777, parents=True, exist_ok=True)
        if folder.stat().st_uid == os.getuid():
            os.chmod(folder, 0o1777)
    except OSError:
        pass
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key)
    path = folder / f"{safe}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666)
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
