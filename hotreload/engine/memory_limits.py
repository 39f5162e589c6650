"""What the kernel says about memory: a process's RSS, the cgroup memory limit it lives
under (v2 `memory.max`, v1 `memory.limit_in_bytes`), and the OOM-kill counter, so a worker
the kernel killed for memory is reported as that (not as the "Connection reset by peer"
its socket saw) and `policy = "auto"` counts a container's limit, not only the host's RAM.

Plain reads of /proc and /sys; `proc` and `sys` are parameters so tests can point them at a
folder of their own. Every reader answers None when the file is missing or unreadable
(another OS, no memory controller): these figures refine a message, they never stop one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: A limit at or above this is "no limit" (v1 writes 2**63 rounded down to a page).
UNLIMITED = 1 << 60
MIB = 1024 * 1024


@dataclass(frozen=True)
class CgroupMemory:
    """The tightest memory limit over a process's cgroup and its ancestors."""

    limit_bytes: int
    #: Charged memory minus the inactive file cache the kernel reclaims before an OOM kill.
    used_bytes: int
    #: The cgroup folder the limit is set on.
    where: str

    @property
    def free_bytes(self) -> int:
        return max(0, self.limit_bytes - self.used_bytes)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None  # "max" (v2's no limit), or garbage


def _stat_field(text: str | None, name: str) -> int:
    """The number after `name` on its line ("oom_kill 3", "VmHWM:  1234 kB"), or 0."""
    for line in (text or "").splitlines():
        words = line.split()
        if len(words) > 1 and words[0] == name:
            return _int(words[1]) or 0
    return 0


def rss_bytes(pid: int, proc: Path = Path("/proc")) -> int | None:
    """Resident set size of `pid` now (None when it is gone)."""
    fields = (_read(proc / str(pid) / "statm") or "").split()
    if len(fields) < 2 or not fields[1].isdigit():
        return None
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The highest RSS `pid` has had (VmHWM), or None."""
    kib = _stat_field(_read(proc / str(pid) / "status"), "VmHWM:")
    return kib * 1024 if kib else None


def oom_kills(proc: Path = Path("/proc")) -> int | None:
    """OOM kills since boot, machine-wide (a cgroup's own kills count here too)."""
    text = _read(proc / "vmstat")
    return _stat_field(text, "oom_kill") if text and "oom_kill" in text else None


def cgroups_of(pid: int | str = "self", proc: Path = Path("/proc")) -> str | None:
    """`pid`'s /proc/PID/cgroup text (read while it lives: a dead process has none)."""
    return _read(proc / str(pid) / "cgroup")


def cgroup_memory(
    pid: int | str = "self",
    proc: Path = Path("/proc"),
    sys: Path = Path("/sys/fs/cgroup"),
    *,
    cgroups: str | None = None,
) -> CgroupMemory | None:
    """The memory limit `pid` runs under (or the process whose `cgroups_of` text is given),
    or None when no cgroup sets one."""
    best: CgroupMemory | None = None
    text = cgroups if cgroups is not None else cgroups_of(pid, proc)
    for line in (text or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":  # v2: one unified hierarchy
            found = _walk(sys, rel, "memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            found = _walk(
                sys / "memory",
                rel,
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_inactive_file",
            )
        else:
            continue
        if found is not None and (best is None or found.limit_bytes < best.limit_bytes):
            best = found
    return best


def _walk(
    root: Path, rel: str, limit_file: str, usage_file: str, inactive: str
) -> CgroupMemory | None:
    """The smallest limit from the cgroup folder up to the mount's root. Inside a cgroup
    namespace the path names a folder the mount does not have: its root is then ours."""
    folder = root / rel.lstrip("/")
    if not folder.is_dir():
        folder = root
    best: CgroupMemory | None = None
    while True:
        limit = _int(_read(folder / limit_file))
        if limit is not None and limit < UNLIMITED and (best is None or limit < best.limit_bytes):
            usage = _int(_read(folder / usage_file)) or 0
            cache = _stat_field(_read(folder / "memory.stat"), inactive)
            best = CgroupMemory(limit, max(0, usage - cache), str(folder))
        if folder == root or folder.parent == folder:
            return best
        folder = folder.parent


def describe_oom_kill(rss: int | None, peak: int | None, limit: CgroupMemory | None) -> str:
    """The reason line of a worker the kernel's OOM killer ended."""
    figures = []
    if rss is not None:
        figures.append(f"last RSS {rss / MIB:.0f} MiB")
    if peak is not None and (rss is None or peak > rss):
        figures.append(f"peak {peak / MIB:.0f} MiB")
    if limit is not None:
        figures.append(f"cgroup memory limit {limit.limit_bytes / MIB:.0f} MiB ({limit.where})")
    else:
        figures.append("no cgroup memory limit: the machine ran out")
    return "the kernel killed the worker for memory (OOM killer; " + ", ".join(figures) + ")"
