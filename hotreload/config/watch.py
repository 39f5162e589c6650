"""The `[watch]` table: how file events are coalesced into one reload, and how files are seen."""

from __future__ import annotations

from dataclasses import dataclass

from hotreload.config.checker import Checker


@dataclass(frozen=True)
class WatchConfig:
    """File watching: a burst of events is coalesced by a quiet window and a maximum window."""

    quiet_ms: int = 100
    max_wait_ms: int = 1500
    ignore: tuple[str, ...] = ()
    #: Poll the file system instead of inotify (WSL2 Windows drives, some bind mounts).
    poll: bool = False
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
