"""Read and validate `hotreload.toml` (or `[tool.hotreload]` in `pyproject.toml`).

Every error names the file, the key and what was expected; unknown keys are rejected with
the closest known key suggested, because a misspelt `warmup_iter` silently ignored would
cost a user an afternoon.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):  # noqa: UP036 - tomli kept for a 3.10 backport
    import tomllib
else:  # pragma: no cover - the project requires 3.11, kept for forks on 3.10
    import tomli as tomllib

from hotreload import config_weights as cw
from hotreload.config_shapes import parse_shapes
from hotreload.errors import ConfigError, did_you_mean

CONFIG_FILENAME = "hotreload.toml"
PYPROJECT = "pyproject.toml"
#: Overrides every model's `device` (used by scripts/gpu-check.sh to force `cuda:0`).
DEVICE_ENV = "HOTRELOAD_DEVICE"

POLICIES = ("availability", "resource", "auto")
STRATEGIES = ("inplace", "respawn")
RESET_MODES = ("never", "on-wedge", "ask")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class EntryPoint:
    """Where a callable lives: `package.module:attr` or `path/to/file.py:attr`."""

    #: The text as written in the config.
    spec: str
    #: Dotted module name, or None when the entry is a file path.
    module: str | None
    #: Absolute path of the file, or None when the entry is a module name.
    file: Path | None
    #: Attribute name inside the module (may be dotted: `Class.build`); "" for TorchScript.
    attr: str
    #: `file` is a TorchScript archive (torch.jit.save) that is the model: no factory.
    torchscript: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "module": self.module,
            "file": str(self.file) if self.file else None,
            "attr": self.attr,
            "torchscript": self.torchscript,
        }


@dataclass(frozen=True)
class Deadlines:
    """Upper bounds, in seconds, for each reload phase; past one the phase fails."""

    start_s: float = 120.0
    drain_s: float = 10.0
    sync_s: float = 5.0
    load_s: float = 120.0
    warm_s: float = 60.0
    smoke_s: float = 30.0
    #: A forward running longer than this means the worker is wedged (hung kernel, deadlock).
    forward_s: float = 60.0
    #: How long a stopping worker may take to exit before it is killed.
    stop_s: float = 10.0

    @property
    def drain_wait_s(self) -> float:
        """How long a drain waits for in-flight requests: drain_s, but never less than
        forward_s. A forward up to forward_s long is legitimate (a big batch), so a drain
        that gave up sooner would kill a healthy worker as hung and fail its requests."""
        return max(self.drain_s, self.forward_s)


@dataclass(frozen=True)
class Threads:
    """torch intra-op and inter-op thread counts, applied before the first op."""

    intra_op: int
    inter_op: int


@dataclass(frozen=True)
class ModelConfig:
    """One `[[models]]` entry, with paths made absolute against the project root."""

    name: str
    entry: EntryPoint
    example: EntryPoint
    weights: tuple[Path, ...] = ()
    #: How the weights files' keys map onto the module's (a factory that wraps the model).
    weights_prefix: cw.WeightsPrefix | None = None
    device: str = "auto"
    warmup_iters: int = 3
    max_queue_size: int = 256
    request_timeout_s: float = 30.0
    #: How many requests the router keeps in flight inside the worker (pipelining).
    max_inflight: int = 8
    threads: Threads | None = None
    #: CPUs of its own for the serving worker (engine/cpus.py): "auto" (as many as `threads`
    #: when at least one CPU is left for the rest), "off", or explicit CPU ids.
    cpus: str | tuple[int, ...] = "auto"
    env: Mapping[str, str] = field(default_factory=dict)
    watch: tuple[Path, ...] = ()
    ignore: tuple[str, ...] = ()
    policy: str = "auto"
    strategy: str = "inplace"
    #: Let a reload change the output shape or dtype (smoke rejects it otherwise).
    allow_output_change: bool = False
    #: While requests are being served, a build (load, warm-up, smoke) pauses after each
    #: step for this many times the step's duration (at most 50 ms a pause): the requests
    #: keep the CPU. 0: never pause.
    build_pace: float = 3.0
    #: strategy "respawn": keep the next worker process started ahead of time (torch
    #: imported, idle, at low priority while it starts), so a reload only builds the model.
    standby: bool = True
    #: strategy "respawn" with a standby: a retired worker whose streams synced idle becomes
    #: the next standby (its models dropped) up to this many times, so no reload pays for a
    #: fresh process and its imports; then a fresh process. 0: always a fresh process.
    recycle: int = 20
    #: Output signature a user pins: {"shape": [...], "dtype": "float32"}; None = learn it.
    expected_output: Mapping[str, Any] | None = None
    deadlines: Deadlines = field(default_factory=Deadlines)
    #: Input name -> dimensions, -1 where any size is accepted (config_shapes.py).
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class WatchConfig:
    """File watching: a burst of events is coalesced by a quiet window and a maximum window."""

    quiet_ms: int = 100
    max_wait_ms: int = 1500
    ignore: tuple[str, ...] = ()
    #: Poll the file system instead of inotify (WSL2 Windows drives, some bind mounts).
    poll: bool = False
    poll_interval_ms: int = 500


@dataclass(frozen=True)
class GpuConfig:
    reset: str = "never"
    sample_interval_ms: int = 500


@dataclass(frozen=True)
class CheckConfig:
    reloads: int = 3
    #: Memory growth after a reload, against the first load, that fails `hotreload check`.
    leak_threshold_mib: float = 64.0
    p99_ms: float | None = None
    burst_requests: int = 200


@dataclass(frozen=True)
class HttpConfig:
    """The KServe v2 HTTP endpoint (off by default; `--http HOST:PORT` turns it on)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 8000
    #: A second listener serving only /metrics (Triton serves it on 8002).
    metrics_port: int | None = None
    #: Seconds a request body may take to arrive in full (then 408, and the connection closes).
    body_timeout_s: float = 60.0
    #: Seconds an idle keep-alive connection stays open.
    keepalive_timeout_s: float = 75.0
    #: Largest body after gzip/deflate inflation, in MiB (None: max_frame_mib).
    max_inflated_mib: int | None = None


@dataclass(frozen=True)
class Config:
    """The whole validated config."""

    path: Path
    root: Path
    models: tuple[ModelConfig, ...]
    state_dir: Path
    socket_dir: Path | None = None
    max_frame_mib: int = 64
    watch: WatchConfig = field(default_factory=WatchConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    check: CheckConfig = field(default_factory=CheckConfig)
    http: HttpConfig = field(default_factory=HttpConfig)

    def model(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.name == name:
                return m
        known = ", ".join(m.name for m in self.models)
        raise ConfigError(
            f"no model named {name!r}; the config declares: {known}", path=str(self.path)
        )

    @property
    def max_frame_bytes(self) -> int:
        return self.max_frame_mib * 1024 * 1024


# --------------------------------------------------------------------------------------
# Finding and parsing the file


def find_config(explicit: str | os.PathLike[str] | None = None, cwd: Path | None = None) -> Path:
    """The config file to use: `--config`, else ./hotreload.toml, else ./pyproject.toml."""
    if explicit is not None:
        path = Path(explicit).expanduser()
        if path.is_dir():
            for name in (CONFIG_FILENAME, PYPROJECT):
                if (path / name).is_file():
                    return _warn_if_shadowed(path / name)
            raise ConfigError(f"folder has no {CONFIG_FILENAME} or {PYPROJECT}", path=str(path))
        if not path.is_file():
            raise ConfigError("file not found (check the --config path)", path=str(path))
        return path
    here = cwd or Path.cwd()
    if (here / CONFIG_FILENAME).is_file():
        return _warn_if_shadowed(here / CONFIG_FILENAME)
    if (here / PYPROJECT).is_file():
        return here / PYPROJECT
    raise ConfigError(
        f"no {CONFIG_FILENAME} or {PYPROJECT} in {here}; run `hotreload init` to write one "
        "or pass --config PATH"
    )


def _warn_if_shadowed(path: Path) -> Path:
    from hotreload.config_shadow import warn_if_shadowed

    if path.name == CONFIG_FILENAME:
        warn_if_shadowed(path.resolve())
    return path


def load_config(explicit: str | os.PathLike[str] | None = None, cwd: Path | None = None) -> Config:
    """Find, parse and validate the config. Raises ConfigError with a precise message."""
    path = find_config(explicit, cwd).resolve()
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", path=str(path)) from None
    prefix = ""
    if path.name == PYPROJECT:
        tool = raw.get("tool", {})
        if not isinstance(tool, dict) or "hotreload" not in tool:
            raise ConfigError(
                "has no [tool.hotreload] table; add one or use a hotreload.toml", path=str(path)
            )
        raw = tool["hotreload"]
        prefix = "tool.hotreload."
    return parse_config(raw, path=path, prefix=prefix)


# --------------------------------------------------------------------------------------
# Validation


#: Linux's own limit on CPU ids (CONFIG_NR_CPUS at most 8192): a range beyond is a typo.
MAX_CPU_ID = 8191
_CPU_LIST_RE = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


def _cpus(m: _Checker) -> str | tuple[int, ...]:
    """`cpus`: "auto", "off", a list of CPU ids, or the kernel's list format ("2-3,6")."""
    what = '"auto", "off", a list of CPU ids such as [2, 3], or "2-3"'
    raw = m.get("cpus", (str, list), "auto", what)
    if raw in ("auto", "off"):
        return str(raw)
    ids: list[int] = []
    if isinstance(raw, str):
        text = raw.replace(" ", "")
        if not _CPU_LIST_RE.match(text):
            m.fail(m.sub("cpus"), f"expected {what}, got {raw!r}")
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            if hi and int(hi) < int(lo):
                m.fail(m.sub("cpus"), f"range {part!r} runs backwards; write it low-high")
            if int(hi or lo) > MAX_CPU_ID:
                m.fail(
                    m.sub("cpus"),
                    f"CPU id {hi or lo} is past the largest Linux allows ({MAX_CPU_ID})",
                )
            ids.extend(range(int(lo), int(hi or lo) + 1))
    else:
        for i, c in enumerate(raw):
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                m.fail(f"{m.sub('cpus')}[{i}]", f"expected a CPU id >= 0, got {c!r}")
            ids.append(c)
    if not ids:
        m.fail(m.sub("cpus"), f'expected at least one CPU id (or "off"), got {raw!r}')
    if max(ids) > MAX_CPU_ID:
        m.fail(m.sub("cpus"), f"CPU id {max(ids)} is past the largest Linux allows ({MAX_CPU_ID})")
    if len(set(ids)) != len(ids):
        m.fail(m.sub("cpus"), f"CPU ids repeat in {raw!r}")
    return tuple(sorted(ids))


class _Checker:
    """Reads typed values out of one TOML table, reporting errors with the full key path."""

    def __init__(self, table: Any, *, path: Path, key: str, known: tuple[str, ...]) -> None:
        self.path = path
        self.key = key
        if not isinstance(table, dict):
            self.fail(key or "(top level)", f"expected a table, got {_kind(table)}")
        self.table: dict[str, Any] = table
        for name in table:
            if name not in known:
                suggestion = did_you_mean(name, list(known))
                allowed = ", ".join(known)
                self.fail(self.sub(name), f"unknown key{suggestion} (known keys here: {allowed})")

    def sub(self, name: str) -> str:
        return f"{self.key}.{name}" if self.key else name

    def fail(self, key: str, message: str) -> None:
        raise ConfigError(message, path=str(self.path), key=key)

    def get(self, name: str, kind: type | tuple[type, ...], default: Any, what: str) -> Any:
        if name not in self.table:
            return default
        value = self.table[name]
        # bool is an int in Python; `warmup_iters = true` must not pass as 1.
        if isinstance(value, bool) and bool not in _as_tuple(kind):
            self.fail(self.sub(name), f"expected {what}, got a boolean")
        if not isinstance(value, kind):
            self.fail(self.sub(name), f"expected {what}, got {_kind(value)} {value!r}")
        return value

    def number(
        self, name: str, default: float | None, *, minimum: float, what: str = "a number"
    ) -> float | None:
        value = self.get(name, (int, float), default, what)
        if value is not None and value < minimum:
            self.fail(self.sub(name), f"expected {what} >= {minimum}, got {value}")
        return None if value is None else float(value)

    def integer(self, name: str, default: int, *, minimum: int, maximum: int | None = None) -> int:
        value = self.get(name, int, default, "an integer")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
            self.fail(self.sub(name), f"expected an integer {bound}, got {value}")
        return int(value)

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.get(name, str, default, "a string")
        if value not in choices:
            hint = difflib.get_close_matches(value, choices, n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            self.fail(
                self.sub(name), f"expected one of {', '.join(choices)}; got {value!r}{suggestion}"
            )
        return value

    def str_list(self, name: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        value = self.get(name, (list, str), list(default), "a string or a list of strings")
        items = [value] if isinstance(value, str) else value
        for i, item in enumerate(items):
            if not isinstance(item, str) or not item:
                self.fail(f"{self.sub(name)}[{i}]", f"expected a non-empty string, got {item!r}")
        return tuple(items)


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
    }.get(type(value), type(value).__name__)


_TOP_KEYS = ("models", "state_dir", "socket_dir", "max_frame_mib", "watch", "gpu", "check", "http")
_MODEL_KEYS = (
    "name",
    "entry",
    "example",
    "weights",
    "weights_prefix",
    "device",
    "warmup_iters",
    "max_queue_size",
    "request_timeout_s",
    "max_inflight",
    "threads",
    "cpus",
    "env",
    "watch",
    "ignore",
    "policy",
    "strategy",
    "allow_output_change",
    "build_pace",
    "standby",
    "recycle",
    "expected_output",
    "deadlines",
    "shapes",
)
_DEADLINE_KEYS = tuple(Deadlines.__dataclass_fields__)


def parse_config(raw: Mapping[str, Any], *, path: Path, prefix: str = "") -> Config:
    """Validate a parsed TOML mapping. `prefix` is `tool.hotreload.` for pyproject files."""
    root = path.parent
    top = _Checker(dict(raw), path=path, key=prefix.rstrip("."), known=_TOP_KEYS)
    models_raw = top.get("models", list, None, "a list of [[models]] tables")
    if not models_raw:
        top.fail(
            top.sub("models"),
            "no models declared; add a [[models]] table with at least name, entry and example",
        )
    models: list[ModelConfig] = []
    seen: set[str] = set()
    for i, table in enumerate(models_raw):
        model = _parse_model(table, path=path, key=f"{top.sub('models')}[{i}]", root=root)
        if model.name in seen:
            top.fail(f"{top.sub('models')}[{i}].name", f"duplicate model name {model.name!r}")
        seen.add(model.name)
        models.append(model)

    state_dir = Path(top.get("state_dir", str, ".hotreload", "a folder path"))
    socket_dir = top.get("socket_dir", str, None, "a folder path")
    max_frame_mib = top.integer("max_frame_mib", 64, minimum=1, maximum=4096)

    w = _Checker(
        top.get("watch", dict, {}, "a table"),
        path=path,
        key=top.sub("watch"),
        known=tuple(WatchConfig.__dataclass_fields__),
    )
    quiet_ms = w.integer("quiet_ms", 100, minimum=0, maximum=60_000)
    max_wait_ms = w.integer("max_wait_ms", 1500, minimum=0, maximum=600_000)
    if max_wait_ms < quiet_ms:
        w.fail(w.sub("max_wait_ms"), f"must be >= quiet_ms ({quiet_ms}), got {max_wait_ms}")
    watch = WatchConfig(
        quiet_ms=quiet_ms,
        max_wait_ms=max_wait_ms,
        ignore=w.str_list("ignore"),
        poll=w.get("poll", bool, False, "true or false"),
        poll_interval_ms=w.integer("poll_interval_ms", 500, minimum=10, maximum=60_000),
    )

    g = _Checker(
        top.get("gpu", dict, {}, "a table"),
        path=path,
        key=top.sub("gpu"),
        known=tuple(GpuConfig.__dataclass_fields__),
    )
    gpu = GpuConfig(
        reset=g.choice("reset", "never", RESET_MODES),
        sample_interval_ms=g.integer("sample_interval_ms", 500, minimum=50, maximum=60_000),
    )

    c = _Checker(
        top.get("check", dict, {}, "a table"),
        path=path,
        key=top.sub("check"),
        known=tuple(CheckConfig.__dataclass_fields__),
    )
    check = CheckConfig(
        reloads=c.integer("reloads", 3, minimum=0, maximum=1000),
        leak_threshold_mib=c.number("leak_threshold_mib", 64.0, minimum=0.0) or 0.0,
        p99_ms=c.number("p99_ms", None, minimum=0.001),
        burst_requests=c.integer("burst_requests", 200, minimum=1, maximum=1_000_000),
    )

    h = _Checker(
        top.get("http", dict, {}, "a table"),
        path=path,
        key=top.sub("http"),
        known=tuple(HttpConfig.__dataclass_fields__),
    )
    http = HttpConfig(
        enabled=h.get("enabled", bool, False, "true or false"),
        host=h.get("host", str, "127.0.0.1", "a host name or address"),
        port=h.integer("port", 8000, minimum=0, maximum=65535),
        metrics_port=(
            h.integer("metrics_port", 0, minimum=0, maximum=65535)
            if "metrics_port" in h.table
            else None
        ),
        body_timeout_s=h.number("body_timeout_s", 60.0, minimum=0.001),
        keepalive_timeout_s=h.number("keepalive_timeout_s", 75.0, minimum=0.001),
        max_inflated_mib=h.integer("max_inflated_mib", 0, minimum=1, maximum=4096)
        if "max_inflated_mib" in h.table
        else None,
    )

    return Config(
        path=path,
        root=root,
        models=tuple(models),
        state_dir=state_dir if state_dir.is_absolute() else root / state_dir,
        socket_dir=Path(socket_dir).expanduser() if socket_dir else None,
        max_frame_mib=max_frame_mib,
        watch=watch,
        gpu=gpu,
        check=check,
        http=http,
    )


def _parse_entry(value: str, *, checker: _Checker, key: str, root: Path) -> EntryPoint:
    where = checker.sub(key)
    if key == "entry" and cw.looks_like_torchscript_entry(value):
        file = cw.torchscript_entry_file(value, checker=checker, key=key, root=root)
        return EntryPoint(spec=value, module=None, file=file, attr="", torchscript=True)
    if value.count(":") != 1:
        checker.fail(
            where,
            f"expected 'package.module:callable' or 'path/to/file.py:callable', got {value!r}",
        )
    target, attr = value.split(":")
    if not _IDENT_RE.match(attr):
        checker.fail(where, f"{attr!r} after ':' is not a Python name (in {value!r})")
    if target.endswith(".py") or "/" in target or os.sep in target:
        file = Path(target).expanduser()
        file = file if file.is_absolute() else root / file
        if not file.is_file():
            checker.fail(where, f"file {file} does not exist (paths are relative to {root})")
        return EntryPoint(spec=value, module=None, file=file.resolve(), attr=attr)
    if not _IDENT_RE.match(target):
        checker.fail(where, f"{target!r} is not a module name (in {value!r})")
    return EntryPoint(spec=value, module=target, file=None, attr=attr)


def _parse_model(table: Any, *, path: Path, key: str, root: Path) -> ModelConfig:
    m = _Checker(table, path=path, key=key, known=_MODEL_KEYS)
    for required in ("name", "entry", "example"):
        if required not in m.table:
            m.fail(m.sub(required), "missing; every [[models]] entry needs name, entry and example")
    name = m.get("name", str, None, "a string")
    if not _NAME_RE.match(name):
        m.fail(
            m.sub("name"),
            f"expected letters, digits, '_', '.', '-' (at most 64, starting with a letter or "
            f"digit), got {name!r}",
        )
    entry = _parse_entry(m.get("entry", str, None, "a string"), checker=m, key="entry", root=root)
    example = _parse_entry(
        m.get("example", str, None, "a string"), checker=m, key="example", root=root
    )

    weights = cw.parse_weights(m, root)
    weights_prefix = cw.parse_weights_prefix(m, weights)

    device = os.environ.get(DEVICE_ENV) or m.get("device", str, "auto", "a string")
    if not _DEVICE_RE.match(device):
        m.fail(m.sub("device"), f"expected 'auto', 'cpu' or 'cuda:N', got {device!r}")
    if device == "cuda":
        device = "cuda:0"

    threads: Threads | None = None
    if "threads" in m.table:
        raw = m.table["threads"]
        if isinstance(raw, int) and not isinstance(raw, bool):
            if raw < 1:
                m.fail(m.sub("threads"), f"expected a count >= 1, got {raw}")
            threads = Threads(intra_op=raw, inter_op=raw)
        elif isinstance(raw, dict):
            t = _Checker(raw, path=path, key=m.sub("threads"), known=("intra_op", "inter_op"))
            threads = Threads(
                intra_op=t.integer("intra_op", 1, minimum=1, maximum=1024),
                inter_op=t.integer("inter_op", 1, minimum=1, maximum=1024),
            )
        else:
            m.fail(
                m.sub("threads"),
                f"expected a count or {{ intra_op = N, inter_op = N }}, got {_kind(raw)}",
            )

    cpus = _cpus(m)

    env_raw = m.get("env", dict, {}, 'a table of NAME = "value"')
    for k, v in env_raw.items():
        if not isinstance(v, str):
            m.fail(f"{m.sub('env')}.{k}", f"expected a string value, got {_kind(v)} {v!r}")

    watch_items = m.str_list("watch")
    watch: list[Path] = []
    for i, item in enumerate(watch_items):
        p = Path(item).expanduser()
        p = p if p.is_absolute() else root / p
        if not p.exists():
            m.fail(f"{m.sub('watch')}[{i}]", f"path {p} does not exist")
        watch.append(p.resolve())
    if not watch:
        # Default: the folder of the entry file, or the project root for module entries.
        watch.append(entry.file.parent if entry.file else root.resolve())
    if entry.torchscript and entry.file is not None:
        watch = cw.watch_with_entry(watch, entry.file)

    expected = m.get("expected_output", dict, None, 'a table { shape = [...], dtype = "..." }')
    if expected is not None:
        e = _Checker(expected, path=path, key=m.sub("expected_output"), known=("shape", "dtype"))
        shape = e.get("shape", list, None, "a list of integers (-1 for any size)")
        if shape is not None and not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape
        ):
            e.fail(e.sub("shape"), f"expected integers >= -1, got {shape!r}")
        e.get("dtype", str, None, 'a dtype name such as "float32"')

    shapes_raw = m.get("shapes", dict, {}, "a table of input name = [dims], -1 for any size")
    shapes = parse_shapes(shapes_raw, m.sub("shapes"), m.fail)

    deadlines_raw = m.get("deadlines", dict, {}, "a table of phase = seconds")
    d = _Checker(deadlines_raw, path=path, key=m.sub("deadlines"), known=_DEADLINE_KEYS)
    deadlines = Deadlines(
        **{
            k: d.number(k, getattr(Deadlines, k), minimum=0.001, what="seconds")
            for k in _DEADLINE_KEYS
        }
    )

    return ModelConfig(
        name=name,
        entry=entry,
        example=example,
        weights=weights,
        weights_prefix=weights_prefix,
        device=device,
        warmup_iters=m.integer("warmup_iters", 3, minimum=0, maximum=10_000),
        max_queue_size=m.integer("max_queue_size", 256, minimum=1, maximum=1_000_000),
        request_timeout_s=m.number("request_timeout_s", 30.0, minimum=0.001, what="seconds")
        or 30.0,
        max_inflight=m.integer("max_inflight", 8, minimum=1, maximum=1024),
        threads=threads,
        cpus=cpus,
        env=dict(env_raw),
        watch=tuple(watch),
        ignore=m.str_list("ignore"),
        policy=m.choice("policy", "auto", POLICIES),
        strategy=m.choice("strategy", "inplace", STRATEGIES),
        allow_output_change=m.get("allow_output_change", bool, False, "true or false"),
        build_pace=m.number("build_pace", 3.0, minimum=0.0, what="a factor (0 = never pause)")
        or 0.0,
        standby=m.get("standby", bool, True, "true or false"),
        recycle=m.integer("recycle", 20, minimum=0, maximum=1_000_000),
        expected_output=expected,
        deadlines=deadlines,
        shapes=shapes,
    )


def with_overrides(model: ModelConfig, **changes: Any) -> ModelConfig:
    """A copy of `model` with some fields changed (tests and `check` use small deadlines)."""
    return replace(model, **changes)


ConfigLoader = Callable[[], Config]


def parse_http_address(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT`, `PORT` or `[::1]:PORT` -> (host, port); ValueError says why."""
    host, port_text = "127.0.0.1", text
    if text.startswith("["):
        end = text.find("]:")
        if end < 0:
            raise ValueError(f"expected [ADDRESS]:PORT, got {text!r}")
        host, port_text = text[1:end], text[end + 2 :]
    elif ":" in text:
        head, port_text = text.rsplit(":", 1)
        host = head or host
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"expected a port between 0 and 65535 in {text!r}")
    return host, int(port_text)


def with_cli_overrides(
    config: Config, *, http: str | None = None, metrics_port: int | None = None
) -> Config:
    """The config with command-line overrides applied (`--http`, `--metrics-port`)."""
    if http is None and metrics_port is None:
        return config
    h = config.http
    if http is not None:
        try:
            host, port = parse_http_address(http)
        except ValueError as exc:
            raise ConfigError(f"--http: {exc}") from None
        h = replace(h, enabled=True, host=host, port=port)
    if metrics_port is not None:
        if not 0 <= metrics_port <= 65535:
            raise ConfigError(f"--metrics-port: expected 0..65535, got {metrics_port}")
        h = replace(h, enabled=True, metrics_port=metrics_port)
    return replace(config, http=h)
