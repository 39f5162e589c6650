"""`hotreload doctor`: one line per environment check, OK / WARN / FAIL and what to do.

Exit 0 when nothing FAILs. Torch and cuda-python are probed in a subprocess with a timeout,
so this (manager) process never imports torch or initialises CUDA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from hotreload.exitcodes import EXIT_FAILURE, EXIT_OK
from hotreload.gpu import kernel_log
from hotreload.gpu.nvml import GpuSnapshot, take_snapshot
from hotreload.gpu.readings import format_cuda_version
from hotreload.gpu.reset import ResetProbes, check_reset
from hotreload.gpu.xid_parse import parse_lines

OK, WARN, FAIL = "OK", "WARN", "FAIL"
SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".venv",
        "venv",
        "__pycache__",
        "node_modules",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
    }
)
# Keys torch's caching allocator understands in PYTORCH_CUDA_ALLOC_CONF.
ALLOC_CONF_KEYS = frozenset(
    {
        "backend",
        "expandable_segments",
        "garbage_collection_threshold",
        "max_split_size_mb",
        "max_non_split_rounding_mb",
        "roundup_power2_divisions",
        "release_lock_on_cudamalloc",
        "pinned_use_cuda_host_register",
        "pinned_num_register_threads",
        "pinned_use_background_threads",
    }
)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK, WARN or FAIL
    message: str
    #: What to do about it; empty for OK.
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status:<4}  {self.name}: {self.message}"
        return f"{text}  -> {self.fix}" if self.fix else text


# Runs in a fresh interpreter: prints one JSON object, never raises.
_PROBE = r"""
import json, os, sys
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda_build"] = torch.version.cuda
    out["threads"] = torch.get_num_threads()
    out["interop_threads"] = torch.get_num_interop_threads()
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
    except Exception as exc:
        out["cuda_error"] = str(exc)
except Exception as exc:
    out["torch_error"] = f"{type(exc).__name__}: {exc}"
try:
    try:
        from cuda.bindings import runtime as rt
        import cuda.bindings as cb
        out["cuda_python"] = getattr(cb, "__version__", "?")
    except ImportError:
        from cuda import cudart as rt
        import cuda
        out["cuda_python"] = getattr(cuda, "__version__", "?")
    err, ver = rt.cudaDriverGetVersion()
    out["cuda_python_driver"] = int(ver) if int(err) == 0 else None
    err, ver = rt.cudaRuntimeGetVersion()
    out["cuda_python_runtime"] = int(ver) if int(err) == 0 else None
except Exception as exc:
    out["cuda_python_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def probe_python_env(timeout_s: float = 90.0) -> dict[str, Any]:
    """Torch and cuda-python facts from a subprocess; {"probe_error": ...} if it failed."""
    try:
        res = subprocess.run(
            [sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"probe_error": f"importing torch took over {timeout_s:g} s"}
    except OSError as exc:
        return {"probe_error": str(exc)}
    lines = res.stdout.strip().splitlines()
    try:
        return dict(json.loads(lines[-1]))
    except (IndexError, ValueError):
        tail = res.stderr.strip().splitlines()[-1:] or [f"exit code {res.returncode}"]
        return {"probe_error": tail[0]}


def check_gpus(snap: GpuSnapshot) -> list[Check]:
    if not snap.available:
        gpus = Check(
            "GPUs",
            WARN,
            f"no NVIDIA GPU found ({snap.reason}); hotreload will run on the CPU",
            "install the NVIDIA driver if this machine has a GPU",
        )
        if snap.reason_kind in ("library_not_found", "not_installed", "no_gpu"):
            nvml = Check("NVML", WARN, f"not available: {snap.reason}", "no GPU telemetry")
        else:
            nvml = Check("NVML", FAIL, f"not available: {snap.reason}", _nvml_fix(snap))
        return [gpus, nvml]
    names = ", ".join(f"{d.index}: {d.name}" for d in snap.devices)
    return [
        Check(
            "GPUs",
            OK,
            f"{len(snap.devices)} found ({names}); driver {snap.driver_version}, "
            f"CUDA {snap.cuda_driver_version}",
        ),
        Check("NVML", OK, "available"),
    ]


def _nvml_fix(snap: GpuSnapshot) -> str:
    return {
        "driver_not_loaded": "load the driver (modprobe nvidia) or reboot",
        "version_mismatch": "reboot: the driver was upgraded but the old module is loaded",
        "no_permission": "check the permissions of /dev/nvidia*",
        "gpu_lost": "power-cycle the machine",
    }.get(snap.reason_kind or "", "see nvidia-smi for details")


def check_torch(env: dict[str, Any], snap: GpuSnapshot) -> Check:
    if "probe_error" in env:
        return Check("torch", FAIL, f"could not probe: {env['probe_error']}", "reinstall torch")
    if "torch_error" in env:
        return Check("torch", FAIL, f"not importable: {env['torch_error']}", "pip install torch")
    ver, build = env["torch"], env.get("torch_cuda_build")
    if not snap.available:
        kind = f"CUDA {build} build" if build else "CPU build"
        return Check("torch", OK, f"{ver} ({kind}); no GPU to use, models run on the CPU")
    if not build:
        return Check(
            "torch",
            WARN,
            f"{ver} is a CPU-only build but a GPU is present",
            "install a CUDA build of torch (see pytorch.org)",
        )
    if not env.get("cuda_available"):
        why = env.get("cuda_error", "torch.cuda.is_available() is False")
        return Check(
            "torch",
            FAIL,
            f"{ver} (CUDA {build}) does not see the GPU: {why}",
            f"the driver (CUDA {snap.cuda_driver_version}) may be older than torch's CUDA {build}",
        )
    return Check("torch", OK, f"{ver} (CUDA {build}) sees {env.get('device_count', 0)} GPU(s)")


def check_cuda_python(env: dict[str, Any], snap: GpuSnapshot) -> Check:
    if "cuda_python_error" in env:
        return Check(
            "cuda-python",
            WARN,
            f"not importable: {env['cuda_python_error']}",
            "pip install cuda-python (needed to sync raw CUDA stream handles)",
        )
    if "cuda_python" not in env:
        return Check("cuda-python", WARN, "not probed", "")
    ver = env["cuda_python"]
    runtime = env.get("cuda_python_runtime")
    driver = env.get("cuda_python_driver")
    if not snap.available or not driver:
        return Check("cuda-python", OK, f"{ver} importable; no driver to check it against")
    if runtime and driver < runtime // 1000 * 1000:
        return Check(
            "cuda-python",
            WARN,
            f"{ver} targets CUDA {format_cuda_version(runtime)} but the driver supports CUDA "
            f"{format_cuda_version(driver)}",
            f"pip install 'cuda-python<{runtime // 1000}' or upgrade the driver",
        )
    return Check("cuda-python", OK, f"{ver}; driver supports CUDA {format_cuda_version(driver)}")


def check_xid_sources(choice: kernel_log.KernelLogChoice, snap: GpuSnapshot) -> Check:
    nvml = "NVML events available" if snap.available else "no NVML events (no GPU)"
    if choice.method is None:
        return Check(
            "Xid sources",
            WARN,
            f"kernel log not readable ({choice.detail}); {nvml}",
            "run as root, `sudo sysctl kernel.dmesg_restrict=0`, or join the adm / "
            "systemd-journal group",
        )
    return Check("Xid sources", OK, f"kernel log: {choice.detail}; {nvml}")


def check_recent_xids(lines: list[str] | None, how: str) -> Check:
    if lines is None:
        return Check(
            "recent Xids",
            WARN,
            f"cannot read the kernel log ({how})",
            "run as root, or `sudo dmesg | hotreload xid --from -` to read it once",
        )
    events = list(parse_lines(lines))
    if not events:
        return Check("recent Xids", OK, f"none in the kernel log ({how})")
    codes: dict[int, int] = {}
    for e in events:
        codes[e.xid] = codes.get(e.xid, 0) + 1
    summary = ", ".join(f"Xid {c} x{n}" for c, n in sorted(codes.items()))
    last = events[-1]
    if 79 in codes:
        return Check(
            "recent Xids",
            FAIL,
            f"{summary}; a GPU fell off the bus",
            "power-cycle the machine before using the GPU again",
        )
    return Check(
        "recent Xids",
        WARN,
        f"{summary}; last: Xid {last.xid} {last.name} [{last.severity}]",
        f"{last.action} (`hotreload xid --from -` reads a saved log)",
    )


def check_reset_possible(snap: GpuSnapshot, probes: ResetProbes | None) -> Check:
    if not snap.available or not snap.devices:
        return Check("GPU reset", WARN, "not possible: no GPU", "")
    decision = check_reset(snap.devices[0].index, (), (), allow=True, probes=probes)
    if decision.allowed:
        return Check("GPU reset", OK, 'possible on GPU 0 (off unless reset = "on-wedge"/"ask")')
    pids = (
        f" (PIDs {', '.join(map(str, decision.blocking_pids))})" if decision.blocking_pids else ""
    )
    return Check("GPU reset", WARN, f"not possible now: {decision.reason}{pids}", "")


def check_alloc_conf(value: str | None) -> Check:
    name = "PYTORCH_CUDA_ALLOC_CONF"
    if not value:
        return Check(name, OK, "not set (hotreload sets it per worker from the config)")
    unknown, malformed = [], []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        if ":" not in part:
            malformed.append(part)
            continue
        key = part.split(":", 1)[0].strip()
        if key not in ALLOC_CONF_KEYS:
            unknown.append(key)
    if malformed:
        return Check(
            name,
            FAIL,
            f"{value!r}: expected key:value pairs, got {malformed}",
            "fix the value, e.g. expandable_segments:True",
        )
    if unknown:
        return Check(name, WARN, f"{value!r}: unknown keys {unknown}", "check the spelling")
    return Check(name, OK, value)


def check_threads(env: dict[str, Any], cores: int) -> Check:
    if "threads" not in env:
        return Check("torch threads", WARN, "unknown (torch not probed)", "")
    intra, inter = int(env["threads"]), int(env["interop_threads"])
    msg = f"{intra} intra-op + {inter} inter-op threads on {cores} cores"
    if intra > cores:
        return Check(
            "torch threads",
            WARN,
            msg + " (oversubscribed)",
            "set torch_threads in the config (or OMP_NUM_THREADS) to at most the core count",
        )
    return Check("torch threads", OK, msg + "; each worker gets explicit counts from the config")


def count_watch_dirs(roots: Iterable[Path], limit: int = 1_000_000) -> int:
    """Folders an inotify watcher would need one watch each for (skipping VCS/venv/caches)."""
    n = 0
    for root in roots:
        if not root.is_dir():
            continue
        for _dirpath, dirnames, _files in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
            n += 1
            if n >= limit:
                return n
    return n


def check_inotify(n_dirs: int, limit_path: str = "/proc/sys/fs/inotify/max_user_watches") -> Check:
    try:
        limit = int(Path(limit_path).read_text().strip())
    except (OSError, ValueError):
        return Check("inotify", WARN, f"cannot read {limit_path}; the watcher may poll", "")
    msg = f"{n_dirs} folders to watch, limit {limit} watches"
    fix = f"sudo sysctl fs.inotify.max_user_watches={max(limit * 2, n_dirs * 4)}"
    if n_dirs >= limit:
        return Check("inotify", FAIL, msg, fix + " or narrow the watched paths")
    if n_dirs > limit // 2:  # other programs (editors, IDEs) hold watches too
        return Check("inotify", WARN, msg + " (over half used)", fix)
    return Check("inotify", OK, msg)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def collect_checks(
    watch_dirs: list[Path] | None = None,
    *,
    snapshot: Callable[[], GpuSnapshot] = take_snapshot,
    python_env: Callable[[], dict[str, Any]] = probe_python_env,
    reset_probes: ResetProbes | None = None,
) -> list[Check]:
    """Run every check (the work behind `run_doctor`)."""
    snap = snapshot()
    env = python_env()
    checks = check_gpus(snap)
    checks.append(check_torch(env, snap))
    checks.append(check_cuda_python(env, snap))
    checks.append(check_xid_sources(kernel_log.probe_kernel_log(), snap))
    lines, how = kernel_log.read_kernel_log_once()
    checks.append(check_recent_xids(lines, how))
    checks.append(check_reset_possible(snap, reset_probes))
    checks.append(check_alloc_conf(os.environ.get("PYTORCH_CUDA_ALLOC_CONF")))
    checks.append(check_threads(env, _cores()))
    roots = watch_dirs if watch_dirs is not None else [Path.cwd()]
    checks.append(check_inotify(count_watch_dirs(roots)))
    return checks


def run_doctor(
    watch_dirs: list[Path] | None = None, as_json: bool = False, out: TextIO | None = None
) -> int:
    """Print the checks (to stdout by default); EXIT_OK unless one FAILs."""
    out = out or sys.stdout
    checks = collect_checks(watch_dirs)
    failed = any(c.status == FAIL for c in checks)
    if as_json:
        out.write(json.dumps({"ok": not failed, "checks": [asdict(c) for c in checks]}, indent=2))
        out.write("\n")
    else:
        for c in checks:
            out.write(c.line() + "\n")
        n_warn = sum(c.status == WARN for c in checks)
        n_fail = sum(c.status == FAIL for c in checks)
        out.write(f"{len(checks)} checks: {n_fail} failed, {n_warn} warnings\n")
    return EXIT_FAILURE if failed else EXIT_OK
