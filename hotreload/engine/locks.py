"""One reload at a time per device: an asyncio lock inside the process and, for a GPU, an
`fcntl` file lock shared by every hotreload process of this user, so two sessions on one GPU
never load at once (two loads racing for VRAM is how a reload runs a device out of memory,
and loads on one GPU fragment its memory).

The CPU has no such lock across sessions: two unrelated projects' CPU reloads do not fight
over a device, and one made the other's `hotreload reload` wait 22 s in silence. Inside one
session, CPU reloads still go one at a time (they share the session's cores).

A wait that passes `tell_after_s` (1 s) is said at once, with who holds the lock: the
holder writes its pid, model and config into the lock file (in-process, the holding model
is known directly).

The lock files live in a folder only this user can enter (`user_runtime_dir()/locks`, 0700,
files 0600): in a folder every user could write, another user could hold a lock (and stall
every reload) or plant a symbolic link for us to open. Sessions of other users are not
serialized with ours; the kernel's own limits keep them apart."""

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
    return Path(os.environ.get(LOCK_DIR_ENV) or user_runtime_dir() / "locks")


def open_lock_file(folder: Path, key: str) -> int:
    """A descriptor on the lock file for `key` (created 0600, in `folder`, created 0700 with
    the per-user folder it is in). Never follows a symbolic link and refuses a file or
    folder that is not a plain one of ours, saying what to do."""
    fix = f"remove it, or point {LOCK_DIR_ENV} at a folder of your own"
    if folder.parent == user_runtime_dir():
        ensure_private_dir(folder.parent, fix)
    ensure_private_dir(folder, fix)
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


#: Longest holder text kept in a lock file (pid, model and config path).
_HOLDER_BYTES = 1024


def mark_holder(fd: int, holder: str | None = None) -> None:
    """Write who holds the lock (default: this pid) into its file, for "waiting for" lines."""
    os.ftruncate(fd, 0)
    text = holder if holder is not None else str(os.getpid())
    os.pwrite(fd, text.encode(errors="replace")[:_HOLDER_BYTES], 0)


class DeviceLocks:
    """`async with locks.hold("cuda:0", model="m"):` serializes reloads on that device: in
    this session always, and machine-wide for a GPU."""

    def __init__(
        self,
        folder: Path | None = None,
        poll_s: float = 0.02,
        *,
        config: str | os.PathLike[str] | None = None,
        tell_after_s: float = 1.0,
    ) -> None:
        self.folder = folder or default_lock_dir()
        self.poll_s = poll_s
        #: The session's config, named to whoever waits for a lock this session holds.
        self.config = str(config) if config is not None else None
        self.tell_after_s = tell_after_s
        self._local: dict[str, asyncio.Lock] = {}
        #: key -> who holds it in this process (the model), for a model waiting behind it.
        self._holders: dict[str, str] = {}

    def describe(self, model: str | None) -> str:
        parts = [f"pid {os.getpid()}"]
        if model:
            parts.append(f"model {model!r}")
        if self.config:
            parts.append(f"config {self.config}")
        return ", ".join(parts)

    @contextlib.asynccontextmanager
    async def hold(
        self,
        key: str,
        on_wait: Callable[[str], None] | None = None,
        *,
        model: str | None = None,
    ) -> AsyncIterator[float]:
        """Hold the device lock; yields the seconds spent waiting for another holder.
        `on_wait` is called once, as soon as the wait passes `tell_after_s`, with a line
        naming the holder."""
        started = time.monotonic()
        told = contended = False

        def tell(holder: str) -> None:
            nonlocal told, contended
            contended = True
            if on_wait is None or told or time.monotonic() - started < self.tell_after_s:
                return
            told = True
            on_wait(f"waiting for the {key} reload lock, held by {holder or 'another process'}")

        local = self._local.setdefault(key, asyncio.Lock())
        notice: asyncio.Task[None] | None = None
        if local.locked():
            contended = True  # waiters are served in turn, and told at tell_after_s

            async def say_later() -> None:
                await asyncio.sleep(max(0.0, self.tell_after_s - (time.monotonic() - started)))
                tell(self._holders.get(key, ""))

            notice = asyncio.create_task(say_later())
        try:
            await local.acquire()
        finally:
            if notice is not None:
                notice.cancel()
        fd = None
        try:
            # Named before any wait for the file lock: a model of this session waiting behind
            # it learns who holds the lock here, even while that one waits for another session.
            self._holders[key] = self.describe(model)
            if key != "cpu":  # across sessions for a GPU only (the module says why)
                fd = await asyncio.to_thread(open_lock_file, self.folder, key)
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except OSError as exc:
                        if exc.errno not in (errno.EAGAIN, errno.EACCES):
                            raise
                    tell(os.pread(fd, _HOLDER_BYTES, 0).decode(errors="replace").strip())
                    await asyncio.sleep(self.poll_s)
                mark_holder(fd, self.describe(model))
            yield time.monotonic() - started if contended else 0.0
        finally:
            self._holders.pop(key, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            local.release()
