"""The session's first look at a push (`update_weights`), before any file is opened.

A descriptor names the pushed memory by a path, `/proc/<pid>/fd/<n>`. Opened as it comes,
that path could be anything the client holds as fd n: a FIFO blocks `open(2)` until a
writer appears, and on the event loop that froze every client of the session (ping timed
out, 8 of 8 clients hung). So a path is never opened blindly:

1. the descriptor is checked with the sender's pid (SO_PEERCRED): a client pushes memory
   of its own process only, never another process's sealed memfd;
2. what the path points at is read with `readlink` (it never blocks) and must be the memfd
   the descriptor names;
3. it is opened with O_NONBLOCK (a FIFO swapped in after step 2 cannot block either), on
   a thread, and the opened file must be a regular memfd with the seals a reader needs;
4. the worker checks names, shapes and dtypes against its model before it reads a byte
   (worker/weight_sources.py).

What passes goes on as a descriptor of a memfd that the session itself holds open, so the
model's push path opens only the session's own, checked, file.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import stat
from dataclasses import dataclass
from typing import Any

from hotreload.errors import BadRequestError
from hotreload.protocol.shared_state import REQUIRED_SEALS, validate_descriptor

#: How long opening and checking a pushed memfd may take (it never should block at all).
OPEN_TIMEOUT_S = 5.0


@dataclass
class CheckedPush:
    """A descriptor whose memfd the session holds (`fd`); close it once the push is done."""

    descriptor: dict[str, Any]
    fd: int | None

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close_later(self) -> None:
        """Close on a thread: the model took a reference of its own (or failed), so ours may
        be the last one, and freeing a large memfd's pages in close(2) takes long (0.28 s
        for 1 GiB), which must not stall the event loop."""
        if self.fd is not None:
            asyncio.get_running_loop().run_in_executor(None, self.close)


def _refuse(message: str) -> BadRequestError:
    return BadRequestError(f"update_weights: {message}")


async def intake(descriptor: Any, peer_pid: int | None) -> CheckedPush:
    """Check a push and take the session's own reference to its memfd (see the module)."""
    if peer_pid is None:
        raise _refuse(
            "the session could not tell which process sent this push (no peer credentials "
            "on the socket), so it cannot check whose memory it names"
        )
    try:
        validate_descriptor(descriptor, peer_pid=peer_pid)
    except ValueError as exc:
        raise _refuse(str(exc)) from None
    if not descriptor["tensors"]:
        # An empty push changes nothing: it must not make a new version (under strict too).
        raise _refuse("the pushed state holds no tensor; push the tensors to change")
    state = dict(descriptor)
    if not state.get("path"):
        return CheckedPush(state, None)
    try:
        fd = await asyncio.wait_for(
            asyncio.to_thread(_open_checked, state["path"], state["memfd_name"]), OPEN_TIMEOUT_S
        )
    except TimeoutError:
        raise _refuse(f"opening {state['path']} did not finish in {OPEN_TIMEOUT_S} s") from None
    state["path"] = f"/proc/{os.getpid()}/fd/{fd}"
    return CheckedPush(state, fd)


def _open_checked(path: str, memfd_name: str) -> int:
    """Open the client's memfd without ever blocking; raises BadRequestError unless it is
    the sealed memfd named `memfd_name`."""
    want = f"/memfd:{memfd_name}"
    try:
        target = os.readlink(path)
    except OSError as exc:
        raise _refuse(
            f"the pushed memory {path} cannot be found ({exc.strerror}); the client closed "
            "it before the session read it, or runs as another user"
        ) from None
    if target.removesuffix(" (deleted)") != want:
        raise _refuse(
            f"{path} is {target!r}, not the memfd {memfd_name!r} the descriptor names; push "
            "a state packed by hotreload.protocol.shared_state.pack_state"
        )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise _refuse(f"the pushed memory {path} cannot be opened ({exc.strerror})") from None
    try:
        _check_opened(fd, path, want)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_opened(fd: int, path: str, want: str) -> None:
    """What was opened is what was checked: the fd may have been swapped in between."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(f"{path} is not a memfd (not a regular file); only a sealed memfd is read")
    if os.readlink(f"/proc/self/fd/{fd}").removesuffix(" (deleted)") != want:
        raise _refuse(f"{path} changed while the session opened it; push again")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        raise _refuse(f"{path} is not a memfd that can be sealed") from None
    if seals & REQUIRED_SEALS != REQUIRED_SEALS:
        raise _refuse(
            f"{path} is not sealed against writes and resizes; pack the state with "
            "pack_state, which seals it"
        )
