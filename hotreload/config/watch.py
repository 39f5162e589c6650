"""The `[watch]` table: how file events are coalesced into one reload, and how files are seen."""

from __future__ import annotations

from dataclasses import dataclass

from hotreload.config.checker import Checker


@dataclass(frozen=True)
class WatchConfig:
    """File watching: a burst of events is coalesced by a quiet window and a maximum window."""

    #: A burst of file events reloads once this many ms of quiet have passed.
    quiet_ms: int = 100
    #: ...but never later than this many ms after the first event of the burst.
    max_wait_ms: int = 1500
    #: Globs ignored for every model, beside editor temp files, `.git`, `__pycache__` and the
    #: state folder (always ignored).
    ignore: tuple[str, ...] = ()
    #: Poll the file system instead of inotify (WSL2 Windows drives, some bind mounts).
    poll: bool = False
    #: With `poll = true`: how often the files are looked at.
    poll_interval_ms: int = 500


def parse_watch(top: Checker) -> WatchConfig:
    """`[watch]` from the top-level table (every key optional)."""
    w = top.subtable("watch", tuple(WatchConfig.__dataclass_fields__))
    quiet_ms = w.integer("quiet_ms", 100, minimum=0, maximum=60_000)
    max_wait_ms = w.integer("max_wait_ms", 1500, minimum=0, maximum=600_000)
    if max_wait_ms < quiet_ms:
        w.fail(w.sub("max_wait_ms"), f"must be >= quiet_ms ({quiet_ms}), got {max_wait_ms}")
    return WatchConfig(
        quiet_ms=quiet_ms,
        max_wait_ms=max_wait_ms,
        ignore=w.str_list("ignore"),
        poll=w.get("poll", bool, False, "true or false"),
        poll_interval_ms=w.integer("poll_interval_ms", 500, minimum=10, maximum=60_000),
    )
