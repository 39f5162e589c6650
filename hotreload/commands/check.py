"""`hotreload check`: the pre-commit smoke check. Headless; never imports textual.

For each model, in a fresh worker and through the same reload path as `watch`: load, warm,
answer a request, survive N reloads, give memory back, raise no Xid; optionally meet a p99
budget. One line per step, a verdict, and for a failure what to look at.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from hotreload.commands.check_progress import LiveProgress
from hotreload.commands.check_results import (
    ModelReport,
    Step,
    run_checks,
)
from hotreload.config import Config, ModelConfig, load_config
from hotreload.engine.compile_figures import compile_text
from hotreload.engine.event_kinds import BaseEvent, LockWait
from hotreload.engine.events import EventBus
from hotreload.engine.model import PhaseFailed
from hotreload.engine.session import Session
from hotreload.engine.signature import describe_dynamic, stand_in_inputs
from hotreload.engine.stats import percentile
from hotreload.engine.worker_port import WorkerDied, WorkerReplyError
from hotreload.errors import ClientError, ConfigError
from hotreload.exitcodes import (
    EXIT_ENVIRONMENT,
    EXIT_USAGE,
    error_exit,
    exit_code_for,
)
from hotreload.paths import ensure_state_dir, write_private_file
from hotreload.preflight import preflight
from hotreload.protocol.messages import SHAPES_REFUSED, StatusReply, StatusRequest
from hotreload.protocol.tensors import decode_tensors, encode_tensors

MIB = 2**20
RECORD_FILE = "check-record.json"


class CheckFailed(Exception):
    pass


def _mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB"


def _memory_figure(status: StatusReply | None) -> tuple[str, int]:
    if status is not None and status.allocator:
        return "torch allocated", int(status.allocator["allocated_bytes"])
    return "worker RSS", status.rss_bytes if status is not None else 0


def _example_request(view: Any, resize: bool = False) -> tuple[dict[str, Any], bytes]:
    """Stand-in inputs (zeros, batch 1) as a wire request; see `stand_in_inputs`."""
    metas, blobs = encode_tensors(stand_in_inputs(list(view.inputs), resize))
    return {"tensors": metas, "form": view.input_form}, b"".join(bytes(b) for b in blobs)


def _finite(frame: Any) -> str | None:
    """The name of an output holding NaN or inf, or None."""
    arrays = decode_tensors(frame.header["tensors"], frame.payload)
    for name, arr in arrays.items():
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            return name
    return None


class ModelCheck:
    def __init__(
        self,
        config: Config,
        model: ModelConfig,
        reloads: int,
        p99_ms: float | None,
        progress: LiveProgress | None = None,
    ) -> None:
        self.config = replace(config, models=(model,))
        #: In a terminal: shows each step as it starts and ends (None: report at the end).
        self.progress = progress
        self.model = model
        self.reloads = reloads
        self.p99_ms = p99_ms
        self.report = ModelReport(model.name, policy=model.policy, strategy=model.strategy)
        self.record_path = config.state_dir / RECORD_FILE

    async def step(self, name: str, coro: Any) -> Any:
        t0 = time.monotonic()
        if self.progress is not None:
            self.progress.started(name)
        try:
            detail, figures, result = await coro
        except CheckFailed as exc:
            hint = exc.args[1] if len(exc.args) > 1 else None
            tb = exc.args[2] if len(exc.args) > 2 else None
            self._add(Step(name, False, time.monotonic() - t0, str(exc.args[0]), {}, hint, tb))
            raise
        except (ClientError, WorkerDied, WorkerReplyError, TimeoutError) as exc:
            # The model failed a request (or its worker died): a failed check, not a broken
            # environment, so exit 1 with the step and the model's traceback.
            tb = getattr(exc, "remote_traceback", None)
            message = str(exc).split("\n--- remote traceback ---", 1)[0] or "timed out"
            hint = (
                "forward() failed on zeros shaped like the example, batch 1" + _see_traceback(tb)
                if name == "infer"
                else "the worker stopped answering: see the error"
            )
            self._add(Step(name, False, time.monotonic() - t0, message, {}, hint, tb))
            raise CheckFailed(message) from exc
        self._add(Step(name, True, time.monotonic() - t0, detail, figures))
        return result

    def _say_wait(self, event: BaseEvent) -> None:
        """A reload waiting for its device's lock is said at once, with the holder: a check
        silent for half a minute reads as a hang."""
        if isinstance(event, LockWait):
            line = f"{event.model}: {event.message}"
            if self.progress is not None:
                self.progress.note(line)
            else:
                print(f"hotreload check: {line}", file=sys.stderr, flush=True)

    def _add(self, step: Step) -> None:
        self.report.steps.append(step)
        if self.progress is not None:
            self.progress.finished(step)

    async def run(self) -> ModelReport:
        events = EventBus(None)
        events.subscribe(self._say_wait)
        session = Session(
            self.config,
            events=events,
            endpoint=False,
        )
        started_at = time.time()
        if self.progress is not None:
            self.progress.model(self.model.name, self.model.policy, self.model.strategy)
        try:
            await self._run(session, started_at)
        except CheckFailed:
            pass
        finally:
            await session.stop()
        return self.report

    async def _run(self, session: Session, started_at: float) -> None:
        host = session.models[self.model.name]

        async def start() -> tuple[str, dict[str, Any], None]:
            try:
                await session.start()
            except PhaseFailed as exc:
                if exit_code_for(exc) == EXIT_ENVIRONMENT:  # its worker could not start
                    self.report.environment_error = str(exc)
                raise CheckFailed(
                    f"{exc.phase} failed: {exc}",
                    _hint_for(exc.phase, exc.remote_traceback, str(exc), self.model),
                    exc.remote_traceback,
                ) from None
            info = host.view
            assert info.has_version
            self.report.device = info.device or ""
            passes = ", ".join(f"{p:.1f}" for p in info.warm_passes_ms[:5])
            return (
                f"v1 on {self.report.device}: load {info.load_s * 1000:.0f} ms, "
                f"warm-up {info.warm_s * 1000:.0f} ms ({passes} ms){_compiled(info.compile)}",
                {
                    "load_s": info.load_s,
                    "warm_s": info.warm_s,
                    "warm_passes_ms": list(info.warm_passes_ms),
                    # torch.compile in the warm phase (None: an eager model).
                    "compile": info.compile,
                },
                None,
            )

        await self.step("load+warm", start())

        async def infer() -> tuple[str, dict[str, Any], None]:
            outputs = list(host.view.outputs)
            self._check_record(outputs)
            header, payload = _example_request(host.view)
            frame = await asyncio.wait_for(
                host.router.submit_future(header, payload), self.model.request_timeout_s
            )
            bad = _finite(frame)
            if bad:
                raise CheckFailed(
                    f"output {bad!r} has non-finite values for a zeros input",
                    "look for a division by zero or log of zero in forward()",
                )
            sig = ", ".join(f"{o['name']} {o['dtype']}{o['shape']}" for o in outputs)
            dynamic = describe_dynamic(list(host.view.inputs))
            if dynamic:
                # The declared dynamic dimensions, at another size than the example's.
                header, payload = _example_request(host.view, resize=True)
                shapes = [m["shape"] for m in header["tensors"]]
                try:
                    frame = await asyncio.wait_for(
                        host.router.submit_future(header, payload), self.model.request_timeout_s
                    )
                except ClientError as exc:
                    raise CheckFailed(
                        f"the model failed for inputs of shape {shapes}, which its `shapes` "
                        f"({dynamic}) accept: {exc}",
                        "fix forward() for those sizes, or declare those dimensions fixed",
                    ) from None
                sig += f"; dynamic {dynamic}: ok at {shapes}"
            return f"outputs finite: {sig}", {"outputs": outputs}, None

        await self.step("infer", infer())
        label, baseline = _memory_figure(await self._settled_status(host))
        threshold = self.config.check.leak_threshold_mib * MIB

        for i in range(1, self.reloads + 1):

            async def reload_once(i: int = i) -> tuple[str, dict[str, Any], None]:
                # Forced: the files did not change, and each cycle must build (unchanged.py).
                outcome = await host.reload("check", [f"cycle {i}"], force=True)
                self.report.policy = outcome.policy or self.report.policy
                if not outcome.ok:
                    raise CheckFailed(
                        f"reload failed in {outcome.phase}: {outcome.error}",
                        _hint_for(
                            outcome.phase, outcome.traceback, outcome.error or "", self.model
                        ),
                        outcome.traceback,
                    )
                _, now = _memory_figure(await self._settled_status(host))
                growth = now - baseline
                phases = " ".join(f"{k} {v * 1000:.0f}" for k, v in outcome.phases.items())
                figures = {
                    "version": outcome.version,
                    "total_s": outcome.total_s,
                    "phases": outcome.phases,
                    "memory_bytes": now,
                    "growth_bytes": growth,
                    "memory_kind": label,
                    "compile": host.view.compile,
                }
                if growth > threshold:
                    raise CheckFailed(
                        f"{label} grew by {_mib(growth)} since the first load "
                        f"({_mib(baseline)} -> {_mib(now)}), over the {_mib(threshold)} threshold",
                        "something keeps a reference to each old version (a module-level cache, a "
                        "global list, a hook); raise [check] leak_threshold_mib if it is expected",
                    )
                return (
                    f"v{outcome.version} in {outcome.total_s * 1000:.0f} ms ({phases} ms); "
                    f"{label} {'+' if growth >= 0 else ''}{_mib(growth)}"
                    f"{_compiled(host.view.compile)}",
                    figures,
                    None,
                )

            await self.step(f"reload {i}", reload_once())

        if self.p99_ms is not None:
            await self.step("p99", self._burst(host))

        async def xids() -> tuple[str, dict[str, Any], None]:
            seen = [x for x in session.telemetry.xids if x.received_at >= started_at]
            if seen:
                names = "; ".join(f"Xid {x.xid} {x.name} ({x.severity})" for x in seen[:5])
                raise CheckFailed(
                    f"{len(seen)} Xid event(s) during the check: {names}",
                    "run `hotreload xid` for the recommended action of each",
                )
            sources = session.telemetry.xid_sources
            active = [s["name"] for s in sources if s["active"]]
            return (
                f"none ({', '.join(active) or 'no source readable'})",
                {"xid_events": 0, "sources": sources},
                None,
            )

        await self.step("xid", xids())
        self._write_record(list(host.view.outputs))

    async def _settled_status(self, host: Any) -> StatusReply | None:
        worker = host.worker
        if worker is None:
            return None
        return await worker.status(StatusRequest(collect=True), 30.0)

    async def _burst(self, host: Any) -> tuple[str, dict[str, Any], None]:
        n = self.config.check.burst_requests
        header, payload = _example_request(host.view)
        latencies: list[float] = []

        async def one() -> None:
            t0 = time.perf_counter()
            await host.router.submit_future(dict(header), payload)
            latencies.append((time.perf_counter() - t0) * 1000)

        concurrency = 4
        for start in range(0, n, concurrency):
            await asyncio.gather(*(one() for _ in range(min(concurrency, n - start))))
        values = sorted(latencies)
        p50, p99 = percentile(values, 50), percentile(values, 99)
        figures = {"requests": n, "p50_ms": p50, "p99_ms": p99, "budget_ms": self.p99_ms}
        if self.p99_ms is not None and p99 > self.p99_ms:
            raise CheckFailed(
                f"p99 {p99:.2f} ms over {n} requests exceeds the {self.p99_ms:g} ms budget "
                f"(p50 {p50:.2f} ms)",
                "profile forward(); check threads and device in the config",
            )
        return f"{n} requests: p50 {p50:.2f} ms, p99 {p99:.2f} ms", figures, None

    # ------------------------------------------------------------------ recorded signature

    def _load_record(self) -> dict[str, Any]:
        try:
            return json.loads(self.record_path.read_text())
        except (OSError, ValueError):
            return {}

    def _check_record(self, outputs: list[dict[str, Any]]) -> None:
        if self.model.allow_output_change:
            return
        recorded = self._load_record().get(self.model.name)
        if not recorded:
            return
        old = [(o["name"], o["dtype"], o["shape"]) for o in recorded["outputs"]]
        new = [(o["name"], o["dtype"], o["shape"]) for o in outputs]
        if old != new:
            raise CheckFailed(
                f"output changed since the last passing check: {_sig(old)} -> {_sig(new)}",
                f"if intended, delete {self.record_path} (or set allow_output_change = true)",
            )

    def _write_record(self, outputs: list[dict[str, Any]]) -> None:
        data = self._load_record()
        data[self.model.name] = {"outputs": outputs, "checked_at": time.time()}
        try:
            ensure_state_dir(self.record_path.parent)
            write_private_file(self.record_path, json.dumps(data, indent=2) + "\n")
        except OSError:
            pass  # a read-only checkout still gets its verdict


def _sig(sig: list[tuple[str, str, list[int]]]) -> str:
    return ", ".join(f"{n} {d}{s}" for n, d, s in sig)


def _see_traceback(traceback: str | None) -> str:
    """Sends the reader to the traceback only when one is printed (a LoadError has none:
    its message is the whole story)."""
    return ": see the traceback below" if traceback else ""


def _load_step(model: ModelConfig, error: str, traceback: str | None) -> str:
    """ "example" when a load failed in the model's example callable (the worker's error
    names it, or the traceback runs through it), "shapes" when the config's `shapes` did not
    fit the example it returned, else "load": the import of the code, the factory or the
    weights, which run before it."""
    if SHAPES_REFUSED in error:
        return "shapes"
    example = model.example
    frame = f", in {example.attr.rsplit('.', 1)[-1]}\n"
    if example.spec in error or (example.attr and frame in (traceback or "")):
        return "example"
    return "load"


def _compiled(figures: dict[str, Any] | None) -> str:
    """`; compiled 1.20 s (...)` for a version torch.compile ran in; "" for an eager one."""
    return f"; {compile_text(figures)}" if figures else ""


def _hint_for(
    phase: str | None, traceback: str | None, error: str = "", model: ModelConfig | None = None
) -> str:
    if phase == "load" and model is not None:
        phase = _load_step(model, error, traceback)
    hint = {
        "start": "the worker process could not start: check that torch imports in this "
        "environment and that the configured device exists (`hotreload doctor`)",
        "load": "the factory, the import of your code or the weights failed",
        "example": f"the example callable {model.example.spec if model else ''} failed: it "
        "must run and return a torch tensor, a str or list of str, or a tuple/list/dict of them",
        "shapes": "the model loaded and its example ran; the `shapes` table in "
        f"{model.name if model else 'the model'}'s config section does not fit what the "
        "example returned: fix it as the error says, or remove it (dimension 0 free)",
        "warm": "the example input failed in forward()",
        "smoke": "the example's output is non-finite or changed shape/dtype",
        "drain": "a forward never returned: look for a deadlock or an infinite loop",
        "sync": "a CUDA stream stayed busy: a kernel is hung",
    }.get(phase or "")
    if hint is None:
        return "see the error above"
    return hint + (_see_traceback(traceback) if phase in ("load", "example", "warm") else "")


async def _check(
    config: Config,
    models: list[ModelConfig],
    reloads: int,
    p99_ms: float | None,
    progress: LiveProgress | None = None,
) -> list[ModelReport]:
    reports = []
    for model in models:
        reports.append(await ModelCheck(config, model, reloads, p99_ms, progress).run())
    return reports


def check_main(
    config_path: str | None,
    *,
    model: str | None = None,
    reloads: int | None = None,
    as_json: bool = False,
    p99_ms: float | None = None,
    openai: bool = False,
    clients: str | None = None,
) -> int:
    if clients is not None and not openai:
        print(
            "hotreload check: --clients chooses among the --openai clients; add --openai, "
            "or drop --clients",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if openai:
        if reloads is not None or p99_ms is not None:
            print(
                "hotreload check: --openai runs the client steps only; drop --reloads and "
                "--p99-ms, or run them in a separate `hotreload check`",
                file=sys.stderr,
            )
            return EXIT_USAGE
        # Imported here: the client self-test is a module of its own (openai loads lazily).
        from hotreload.commands.check_openai import check_openai_main

        return check_openai_main(config_path, model=model, as_json=as_json, clients=clients)
    try:
        config = load_config(config_path)
        models = [config.model(model)] if model else list(config.models)
        preflight(config, models)
    except ConfigError as exc:
        return error_exit("hotreload check", exc)
    if reloads is not None and reloads < 0:
        print("hotreload check: --reloads must be 0 or more", file=sys.stderr)
        return EXIT_USAGE
    n = config.check.reloads if reloads is None else reloads
    budget = p99_ms if p99_ms is not None else config.check.p99_ms
    cpu_models = [m.name for m in models if m.device == "cpu"]

    def note(reports: list[ModelReport]) -> str | None:
        devices = {r.device for r in reports if r.device}
        if not devices or any(d != "cpu" for d in devices):
            return None
        why = 'set device = "cpu"' if len(cpu_models) == len(models) else "no CUDA device found"
        return f"running on the CPU ({why}); GPU checks (device memory, streams) do not apply"

    return run_checks(partial(_check, config, models, n, budget), as_json, config.path, note)
