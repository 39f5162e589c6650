"""Does this machine make memory slow after a short idle? A diagnostic for reload figures.

    .venv/bin/python benchmarks/idle_memory.py [--mib 64] [--sleeps 0 0.25 0.5 1 2 3]

A reload runs code and touches memory that serving does not: the manager's reload path, the
standby worker's whole process. On a shared virtual machine, memory a process has not
touched for a moment can be many times slower to touch again, with no page fault counted in
the guest. The likely cause: while it slept, other work on the host evicted its data, its
TLB entries and the page-table entries behind them from the caches, and under virtualization
a TLB miss walks both the guest's and the host's page tables. The thread pays it in its own
CPU time. Then everything a reload does runs several times slower than the same code hot,
and competes that much longer with the requests for the cores.

This touches one byte per 4 KiB page of an already-resident buffer, hot and after each
sleep, and reports the thread's CPU time per page. On a machine without the effect the
figures after a sleep stay within a few times the hot ones.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

PAGE = 4096


def touch(buf: bytearray) -> int:
    """Read one byte per page (a memoryview slice with a page stride: one C loop)."""
    return sum(memoryview(buf)[::PAGE])


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def measure(buf: bytearray, sleep_s: float, rounds: int) -> tuple[float, int]:
    """Median thread CPU ms of one touch after `sleep_s` asleep, and the page faults seen."""
    times, faults = [], 0
    for _ in range(rounds):
        touch(buf)  # hot again before each idle period
        time.sleep(sleep_s)
        f0, c0 = minor_faults(), time.thread_time()
        touch(buf)
        times.append((time.thread_time() - c0) * 1000)
        faults += minor_faults() - f0
    return statistics.median(times), faults


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=64, help="buffer size (default 64 MiB)")
    parser.add_argument("--sleeps", type=float, nargs="+", default=[0.0, 0.25, 0.5, 1.0, 2.0, 3.0])
    parser.add_argument("--rounds", type=int, default=5, help="touches per sleep (median)")
    args = parser.parse_args()
    buf = bytearray(os.urandom(args.mib << 20))  # resident: every page written once
    pages = len(buf) // PAGE
    print(
        f"idle-memory check: {args.mib} MiB ({pages} pages), one read per page, "
        f"{os.cpu_count()} cores, median of {args.rounds}"
    )
    hot, _ = measure(buf, 0.0, args.rounds)
    print(f"  {'asleep before':>14} {'ms CPU':>8} {'us/page':>8} {'vs hot':>7} {'faults':>7}")
    for sleep_s in args.sleeps:
        ms, faults = (hot, 0) if sleep_s == 0 else measure(buf, sleep_s, args.rounds)
        print(
            f"  {sleep_s:>12.2f} s {ms:>8.2f} {ms * 1000 / pages:>8.3f} {ms / hot:>6.1f}x "
            f"{faults:>7}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
