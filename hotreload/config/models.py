"""The `[[models]]` tables: what each model is built from, where it serves, its deadlines.

`parse_model` reads one table through a `Checker`; the keys about what a model is loaded
from (`weights`, `weights_prefix`, a TorchScript `entry`) are in `weights`, `shapes` in
`shapes`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hotreload.config import adapters as adapters_mod
from hotreload.config import weights as weights_mod
from hotreload.config.checker import Checker, kind_of
from hotreload.config.evals import EVAL_TIMEOUT_S, parse_eval
from hotreload.config.golden import parse_golden
from hotreload.config.shapes import parse_shapes
from hotreload.config.text import parse_max_prompt_tokens, parse_text

#: Overrides every model's `device` (used by scripts/gpu-check.sh to force `cuda:0`).
DEVICE_ENV = "HOTRELOAD_DEVICE"

POLICIES = ("availability", "resource", "auto")
STRATEGIES = ("inplace", "respawn")
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

    #: How long a model may take to come up at session start (load, warm-up, smoke).
    start_s: float = 120.0
    #: How long a reload waits for the old version's in-flight requests; never less than
    #: `forward_s` (a long forward is not a hung one).
    drain_s: float = 10.0
    #: How long a reload polls the old version's CUDA streams until they are idle.
    sync_s: float = 5.0
    #: How long importing the code, calling the factory and loading the weights may take.
    load_s: float = 120.0
    #: How long all `warmup_iters` warm-up passes together may take.
    warm_s: float = 60.0
    #: How long the smoke test (one pass on the example, outputs checked) may take.
    smoke_s: float = 30.0
    #: A forward running longer than this means the worker is wedged (hung kernel, deadlock).
    forward_s: float = 60.0
    #: How long a stopping worker may take to exit before it is killed.
    stop_s: float = 10.0
    #: How long a reload waits for a weights file still being written (a trainer's save).
    checkpoint_s: float = 30.0

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

    #: The model's name in requests, URLs and status: letters, digits, `_`, `.`,
    #: `-`, at most 64.
    name: str
    #: The factory: `"file.py:callable"` or `"package.module:callable"`, returning a
    #: `torch.nn.Module` or any callable; or `"model.pt"`, a TorchScript archive.
    entry: EntryPoint
    #: A callable returning an example input (a tensor, `str` or list of `str`, or a
    #: tuple or dict of them): the warm-up and smoke-test input, and the shape requests must have.
    example: EntryPoint
    #: Files loaded strictly into the module after `build()`: `.safetensors`, or `.pt`, `.pth`,
    #: `.bin` of `torch.save(model.state_dict())` (read with `weights_only=True`).
    weights: tuple[Path, ...] = ()
    #: How the weights files' keys map onto the module's, for a factory that wraps the model:
    #: `"inner."` goes in front of every key, `{ strip = "model.", add = "inner." }` strips first.
    weights_prefix: weights_mod.WeightsPrefix | None = None
    #: `"auto"` (the first CUDA device torch sees, else the CPU), `"cpu"` or `"cuda:N"`.
    #: The environment variable `HOTRELOAD_DEVICE` overrides it for every model.
    device: str = "auto"
    #: Passes over the example before a version serves.
    warmup_iters: int = 3
    #: Requests waiting for the model at most; past it a request is refused at once
    #: ("Exceeds maximum queue size").
    max_queue_size: int = 256
    #: Seconds a request may wait and run before it is answered as timed out (a client's own
    #: timeout, when shorter, wins).
    request_timeout_s: float = 30.0
    #: How many requests the router keeps in flight inside the worker (pipelining).
    max_inflight: int = 8
    #: torch intra-op and inter-op threads, set before the first op: a count, or
    #: `{ intra_op = N, inter_op = N }`. Unset: torch's default (every core).
    threads: Threads | None = None
    #: CPUs of its own for the serving worker: `"auto"` (as many as `threads`, when at least
    #: one CPU is left for the rest), `"off"`, or CPU ids (`[3]`, `"2-3"`).
    cpus: str | tuple[int, ...] = "auto"
    #: Environment variables set in the worker before torch is imported
    #: (`PYTORCH_CUDA_ALLOC_CONF`, ...): a table of `NAME = "value"`.
    env: Mapping[str, str] = field(default_factory=dict)
    #: Folders (or files) whose every edit reloads this model: list what the import graph
    #: cannot see (data files `build()` reads). Modules under them are re-imported on a
    #: reload. Left out: the entry file's folder (the project root for a module entry),
    #: where only the code the model imports, its entry, example and weights reload it.
    watch: tuple[Path, ...] = ()
    #: The `watch` paths the config lists itself (every edit under them reloads the model);
    #: empty when `watch` is left to its default.
    watch_listed: tuple[Path, ...] = ()
    #: Globs, relative to the watched folders, whose edits never reload this model.
    ignore: tuple[str, ...] = ()
    #: `"availability"` (load the next version beside the old one, then swap), `"resource"`
    #: (unload first), or `"auto"` (availability when free memory allows).
    policy: str = "auto"
    #: `"inplace"` (re-import the code in the serving worker) or `"respawn"` (build in another
    #: worker process and hand over to it).
    strategy: str = "inplace"
    #: Let a reload change the output shape or dtype (smoke rejects it otherwise).
    allow_output_change: bool = False
    #: Inputs every new version runs before it serves, beside the example, compared with
    #: the version it replaces: `"model.py:golden"`, a callable returning a list of inputs
    #: (prompts, for a generator). Unset: the example alone.
    golden: EntryPoint | None = None
    #: `"any"` (show what the golden outputs changed) or `"same"` (refuse a version whose
    #: golden outputs change by more than `tolerance`: a refactor).
    expect: str = "any"
    #: The largest absolute difference of a golden output `expect = "same"` allows
    #: (0: bit-equal).
    tolerance: float = 0.0
    #: How many good versions (code snapshot, weights, pushed weights) are kept for
    #: `hotreload rollback`, the serving one included. Each holds a copy of its code and
    #: of its pushes (on disk, once no serving version holds them); large weights files
    #: are hard-linked, not copied.
    keep_versions: int = 3
    #: How many of the input shapes the model served lately (the newest distinct ones,
    #: up to 16, seen in the last 10 minutes) each build's warm phase runs before the swap,
    #: so no request after it pays their compile (torch.compile), CUDA graph capture,
    #: cuDNN autotuning or allocator growth. On a CPU only a compiled model replays them;
    #: 0 replays none. See docs/compiled.md.
    replay_shapes: int = 16
    #: Scores every new version (an edit, a push, a rollback) once it serves, off the
    #: request path: `"evals.py:score"`, a callable given the model that returns a dict of
    #: floats. Its figures go to the history, the dashboard, the report and `status`; an
    #: eval that raises is shown, and the version serves on. Unset: no eval.
    eval: EntryPoint | None = None
    #: Seconds the eval may take; past them it is reported as timed out.
    eval_timeout_s: float = EVAL_TIMEOUT_S
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
    #: The output signature `hotreload check` expects: `{ shape = [-1, 10], dtype = "float32" }`.
    #: Unset: the last passing check's.
    expected_output: Mapping[str, Any] | None = None
    #: Seconds each phase may take: the `[models.deadlines]` table.
    deadlines: Deadlines = field(default_factory=Deadlines)
    #: Input dimensions that may vary: `{ input_ids = [-1, -1] }`, -1 where any size is
    #: accepted. Unset: dimension 0 (the batch) only.
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: A causal LM serving the OpenAI-compatible text routes (config/text.py; docs/eval-harness.md).
    generator: bool = False
    #: Its tokenizer: a folder as `save_pretrained` writes it (unset: the model module's
    #: own `encode`/`decode`).
    tokenizer: Path | None = None
    #: The most tokens a text request's prompt may hold; longer is refused at once (400).
    #: Unset: the model's context length, read from its config (`max_position_embeddings`,
    #: `n_positions`, ...) or its tokenizer's `model_max_length`, less the request's
    #: `max_tokens`; the context bound applies as well when this is set.
    max_prompt_tokens: int | None = None
    #: peft LoRA adapter folders served over the base, chosen per request
    #: (`parameters={"adapter": name}`): `{ a = "adapters/a" }` or a list of folders.
    adapters: tuple[adapters_mod.Adapter, ...] = ()
    #: What a request naming no adapter gets: an adapter's name, or "base" for the base
    #: alone. Unset: the first declared adapter.
    default_adapter: str | None = None

    @property
    def weight_files(self) -> tuple[Path, ...]:
        """Every file whose save changes this model's weights: the `weights` files, then
        each adapter's adapter_config.json and adapter_model.safetensors."""
        return self.weights + tuple(f for a in self.adapters for f in a.files)


MODEL_KEYS = (
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
    "golden",
    "expect",
    "tolerance",
    "keep_versions",
    "replay_shapes",
    "eval",
    "eval_timeout_s",
    "build_pace",
    "standby",
    "recycle",
    "expected_output",
    "deadlines",
    "shapes",
    "generator",
    "tokenizer",
    "max_prompt_tokens",
    "adapters",
    "default_adapter",
)
_DEADLINE_KEYS = tuple(Deadlines.__dataclass_fields__)


#: Linux's own limit on CPU ids (CONFIG_NR_CPUS at most 8192): a range beyond is a typo.
MAX_CPU_ID = 8191
_CPU_LIST_RE = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


def parse_cpus(m: Checker) -> str | tuple[int, ...]:
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


def parse_entry(value: str, *, checker: Checker, key: str, root: Path) -> EntryPoint:
    where = checker.sub(key)
    if key == "entry" and weights_mod.looks_like_torchscript_entry(value):
        file = weights_mod.torchscript_entry_file(value, checker=checker, key=key, root=root)
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


def parse_model(table: Any, *, path: Path, key: str, root: Path) -> ModelConfig:
    m = Checker(table, path=path, key=key, known=MODEL_KEYS)
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
    entry = parse_entry(m.get("entry", str, None, "a string"), checker=m, key="entry", root=root)
    example = parse_entry(
        m.get("example", str, None, "a string"), checker=m, key="example", root=root
    )

    weights = weights_mod.parse_weights(m, root)
    weights_prefix = weights_mod.parse_weights_prefix(m, weights)

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
            t = Checker(raw, path=path, key=m.sub("threads"), known=("intra_op", "inter_op"))
            threads = Threads(
                intra_op=t.integer("intra_op", 1, minimum=1, maximum=1024),
                inter_op=t.integer("inter_op", 1, minimum=1, maximum=1024),
            )
        else:
            m.fail(
                m.sub("threads"),
                f"expected a count or {{ intra_op = N, inter_op = N }}, got {kind_of(raw)}",
            )

    cpus = parse_cpus(m)

    env_raw = m.get("env", dict, {}, 'a table of NAME = "value"')
    for k, v in env_raw.items():
        if not isinstance(v, str):
            m.fail(f"{m.sub('env')}.{k}", f"expected a string value, got {kind_of(v)} {v!r}")

    watch_items = m.str_list("watch")
    watch: list[Path] = []
    for i, item in enumerate(watch_items):
        p = Path(item).expanduser()
        p = p if p.is_absolute() else root / p
        if not p.exists():
            m.fail(f"{m.sub('watch')}[{i}]", f"path {p} does not exist")
        watch.append(p.resolve())
    watch_listed = tuple(watch)
    if not watch:
        # Default: the folder of the entry file, or the project root for module entries.
        watch.append(entry.file.parent if entry.file else root.resolve())
    if entry.torchscript and entry.file is not None:
        watch = weights_mod.watch_with_entry(watch, entry.file)

    expected = m.get("expected_output", dict, None, 'a table { shape = [...], dtype = "..." }')
    if expected is not None:
        e = Checker(expected, path=path, key=m.sub("expected_output"), known=("shape", "dtype"))
        shape = e.get("shape", list, None, "a list of integers (-1 for any size)")
        if shape is not None and not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape
        ):
            e.fail(e.sub("shape"), f"expected integers >= -1, got {shape!r}")
        e.get("dtype", str, None, 'a dtype name such as "float32"')

    shapes_raw = m.get("shapes", dict, {}, "a table of input name = [dims], -1 for any size")
    shapes = parse_shapes(shapes_raw, m.sub("shapes"), m.fail)

    deadlines_raw = m.get("deadlines", dict, {}, "a table of phase = seconds")
    d = Checker(deadlines_raw, path=path, key=m.sub("deadlines"), known=_DEADLINE_KEYS)
    deadlines = Deadlines(
        **{
            k: d.number(k, getattr(Deadlines, k), minimum=0.001, what="seconds")
            for k in _DEADLINE_KEYS
        }
    )

    generator, tokenizer = parse_text(m, root)
    golden, expect, tolerance = parse_golden(m, root, parse_entry)
    eval_entry, eval_timeout_s = parse_eval(m, root, parse_entry)
    adapters = adapters_mod.parse_adapters(m, root)
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
        watch_listed=watch_listed,
        ignore=m.str_list("ignore"),
        policy=m.choice("policy", "auto", POLICIES),
        strategy=m.choice("strategy", "inplace", STRATEGIES),
        allow_output_change=m.get("allow_output_change", bool, False, "true or false"),
        golden=golden,
        expect=expect,
        tolerance=tolerance,
        keep_versions=m.integer("keep_versions", 3, minimum=1, maximum=100),
        # At most what the router's log keeps (engine/served_shapes.py DEFAULT_LIMIT).
        replay_shapes=m.integer("replay_shapes", 16, minimum=0, maximum=16),
        eval=eval_entry,
        eval_timeout_s=eval_timeout_s,
        build_pace=m.number("build_pace", 3.0, minimum=0.0, what="a factor (0 = never pause)")
        or 0.0,
        standby=m.get("standby", bool, True, "true or false"),
        recycle=m.integer("recycle", 20, minimum=0, maximum=1_000_000),
        expected_output=expected,
        deadlines=deadlines,
        shapes=shapes,
        generator=generator,
        tokenizer=tokenizer,
        max_prompt_tokens=parse_max_prompt_tokens(m, generator),
        adapters=adapters,
        default_adapter=adapters_mod.parse_default_adapter(m, adapters),
    )


def with_overrides(model: ModelConfig, **changes: Any) -> ModelConfig:
    """A copy of `model` with some fields changed (tests and `check` use small deadlines)."""
    return replace(model, **changes)
