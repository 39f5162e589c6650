"""A serving session: every model's host, the client endpoint and the event stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from hotreload.config import Config
from hotreload.engine.cpus import CpuPlan, available_cpus, pin_process, pin_self, plan_cpus
from hotreload.engine.endpoint import Endpoint, Reply
from hotreload.engine.event_kinds import (
    Cpus,
    EventsFileError,
    GpuReset,
    RewarmDone,
    RewarmStarted,
    SessionStarted,
    SessionStopped,
    SessionStopping,
    StartFailed,
)
from hotreload.engine.events import EventBus
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.locks import DeviceLocks
from hotreload.engine.model import ModelSupervisor, ReloadOutcome
from hotreload.engine.push_intake import intake
from hotreload.engine.stats_log import StatsRecorder
from hotreload.engine.telemetry import GpuTelemetry
from hotreload.errors import BadRequestError
from hotreload.paths import (
    ensure_state_dir,
    snapshot_root,
    socket_path_for,
    write_private_file,
)
from hotreload.protocol.framing import Frame
from hotreload.protocol.messages import WarmRequest


class FrontEnd(Protocol):
    """A front end a command started beside the session (the KServe v2 HTTP endpoint)."""

    async def close(self) -> None: ...


#: Starts a front end on an opened session. The command that runs the session passes these
#: (`hotreload.commands.serve.http_front_ends`): the engine itself starts no front end.
FrontEndStarter = Callable[["Session"], Awaitable[FrontEnd]]


class Session:
    def __init__(
        self,
        config: Config,
        *,
        events: EventBus | None = None,
        telemetry: bool = True,
        endpoint: bool = True,
        snapshot_dir: Path | None = None,
        front_ends: Sequence[FrontEndStarter] = (),
    ) -> None:
        """`endpoint=False` serves no socket (hotreload check runs beside a live session),
        and starts none of `front_ends`."""
        self.config = config
        self.state_dir = config.state_dir
        self.events = events or EventBus(config.state_dir / "events.jsonl")
        self.locks = DeviceLocks(config=config.path)
        self.snapshot_dir = snapshot_dir or snapshot_root(config.path) / f"session-{os.getpid()}"
        #: One supervisor per model: the only owner of its workers and its state.
        self.models = {
            m.name: ModelSupervisor(
                m,
                config,
                self.events,
                self.locks,
                ignore=self.ignore_rules(m.ignore),
                snapshot_dir=self.snapshot_dir,
                escalate=self._escalate_wedge,
            )
            for m in config.models
        }
        self.telemetry = GpuTelemetry(
            self.events,
            own_pids=self.worker_pids,
            phase_of=self.reload_phase,
            interval_s=config.gpu.sample_interval_ms / 1000,
            watch_xids=telemetry,
        )
        self.socket_path = socket_path_for(config.path, config.socket_dir)
        self.endpoint = Endpoint(
            self.socket_path,
            {
                "status": self._op_status,
                "ping": self._op_ping,
                "reload": self._op_reload,
                "rollback": self._op_rollback,
                "save": self._op_save,
                "evals": self._op_evals,
                "wait_version": self._op_wait_version,
            },
            config.max_frame_bytes,
            fast_handlers={"infer": self._op_infer},
            peer_handlers={"update_weights": self._op_update_weights},
        )
        self.started_at = time.time()
        #: Who runs on which CPUs (made at open); the affinity to restore at stop.
        self.cpu_plan = CpuPlan()
        self._cpus_before: frozenset[int] | None = None
        self.with_endpoint = endpoint
        self._opened = False
        self._front_end_starters = tuple(front_ends)
        #: The front ends started at open (the HTTP endpoint), closed at stop.
        self.front_ends: list[FrontEnd] = []
        #: Latency, queue and memory figures over time, to `.hotreload/stats.jsonl`.
        self.stats_log: StatsRecorder | None = None
        #: Extra handlers (reload, ...) other layers register before start().
        self.handlers = self.endpoint.handlers

    def model(self, name: str | None) -> ModelSupervisor:
        """The supervisor of model `name` (None: the only one)."""
        if name is None and len(self.models) == 1:
            return next(iter(self.models.values()))
        if name not in self.models:
            known = ", ".join(self.models)
            raise BadRequestError(f"unknown model {name!r}; this session serves: {known}")
        return self.models[name]

    # ------------------------------------------------------------------ lifecycle

    async def open(self) -> None:
        """Open the socket (and the front ends, such as HTTP), start telemetry: clients can
        attach before any model is up. Raises HotreloadError when another session serves on
        the socket."""
        if self._opened:
            return
        self._place_on_cpus()
        self._opened = True
        try:
            if self.with_endpoint:
                await self.endpoint.start()
                self._write_session_file()
            self._announce_cpus()
            if self.with_endpoint:
                # Before the models start, so readiness is observable during warm-up.
                for start_front_end in self._front_end_starters:
                    self.front_ends.append(await start_front_end(self))
            await self.telemetry.start()
            if self.with_endpoint:  # a served session: `hotreload report` draws its figures
                self.stats_log = StatsRecorder(self, ensure_state_dir(self.config.state_dir))
                self.stats_log.start()
            await asyncio.to_thread(_prune_stale_snapshots, self.snapshot_dir.parent)
        except BaseException:
            self._leave_cpus()  # stop() may never run: an embedding process keeps its CPUs
            raise
        self.events.emit(
            SessionStarted(socket=str(self.socket_path), pid=os.getpid(), models=list(self.models))
        )

    async def start(self, *, keep_others: bool = False) -> list[str]:
        """Open the socket, then bring every model up (in parallel). Raises on a failed model;
        with `keep_others`, only when no model came up, and returns the names of those that
        failed (the others serve; a failed one answers its requests with why)."""
        await self.open()
        results = await asyncio.gather(
            *(sup.start() for sup in self.models.values()), return_exceptions=True
        )
        errors = [
            (h, r)
            for h, r in zip(self.models.values(), results, strict=True)
            if isinstance(r, BaseException)
        ]
        if errors:
            for host, err in errors:
                detail = getattr(err, "remote_traceback", None)
                self.events.emit(
                    StartFailed(
                        model=host.name,
                        phase=getattr(err, "phase", None),
                        error=str(err),
                        traceback=detail,
                    )
                )
            if not keep_others or len(errors) == len(self.models):
                raise errors[0][1]
        return [h.name for h, _ in errors]

    async def stop(self) -> None:
        """Stop intake, drain and stop every worker, remove the socket."""
        if self.with_endpoint and self._opened and not self.endpoint.bound:
            # open() failed before the socket was ours (another session serves on it): no
            # worker started, and the state folder's events are that session's, not ours.
            self._leave_cpus()
            self.events.close()
            return
        self.events.emit(SessionStopping())
        try:
            if self.stats_log is not None:
                await self.stats_log.stop()
            await asyncio.gather(
                *(sup.stop() for sup in self.models.values()), return_exceptions=True
            )
            for front_end in self.front_ends:
                # After the hosts drained: HTTP requests in flight got their replies.
                with contextlib.suppress(Exception):
                    await front_end.close()
            if self.with_endpoint:
                await self.endpoint.close()
                self._remove_session_file()
            await self.telemetry.stop()
            await asyncio.to_thread(_remove_snapshots, self.snapshot_dir)
        finally:
            self._leave_cpus()
        self.events.emit(SessionStopped())
        self.events.close()

    def _place_on_cpus(self) -> None:
        """Claim each model's serving CPUs (engine/cpus.py) and move this process onto the
        rest: the workers it starts (standby, builds) inherit that. Raises ConfigError for
        an explicit `cpus` this machine cannot honour."""
        available = available_cpus()
        plan = plan_cpus(self.config.models, available)
        self.cpu_plan = plan
        if plan.serving:
            self._cpus_before = available
            pin_self(plan.rest)
            for name, cpus in plan.serving.items():
                workers = self.models[name].workers
                workers.cpus, workers.cpus_rest = cpus, plan.rest

    def _announce_cpus(self) -> None:
        """The placement line, once the socket is ours: a session refused as "already
        serving" must not first print where it would have run."""
        plan = self.cpu_plan
        if plan.serving or plan.notes:
            self.events.emit(
                Cpus(
                    serving={k: sorted(v) for k, v in plan.serving.items()},
                    rest=sorted(plan.rest),
                    detail=plan.describe(),
                )
            )

    def release_from_cpus(self, pid: int) -> None:
        """A process the session starts that is neither reload work nor serving (the
        dashboard, niced) may run anywhere, as it would without `cpus`: confined to the
        rest with the manager, its drawing showed in request p99 (1.47x vs 1.09x, 8
        clients, benchmarks/dashboard.py)."""
        if self._cpus_before is not None:
            pin_process(pid, self._cpus_before)

    def _leave_cpus(self) -> None:
        """Release the claims; an embedding process (tests) gets its CPUs back. Several
        sessions in one process restore correctly only when stopped in reverse order."""
        self.cpu_plan.release()
        for sup in self.models.values():
            sup.workers.cpus, sup.workers.cpus_rest = None, frozenset()
        if self._cpus_before is not None:
            pin_self(self._cpus_before)
            self._cpus_before = None

    def _session_file(self) -> Path:
        return self.state_dir / "session.json"

    def _write_session_file(self) -> None:
        """session.json, for `hotreload status` and the dashboard. A full (or read-only)
        state folder is said once and the session serves anyway, as a full disk
        mid-session is: the socket, not this file, is how clients find it."""
        data = {
            "pid": os.getpid(),
            "socket": str(self.socket_path),
            "config": str(self.config.path),
            "started_at": self.started_at,
        }
        try:
            ensure_state_dir(self.state_dir)
            write_private_file(self._session_file(), json.dumps(data, indent=2) + "\n")
        except OSError as exc:
            self.events.emit(
                EventsFileError(
                    message=f"the state folder {self.state_dir} cannot be written "
                    f"({exc.strerror or exc}); the session runs on without session.json"
                )
            )

    def _remove_session_file(self) -> None:
        try:
            data = json.loads(self._session_file().read_text())
            if data.get("pid") == os.getpid():
                self._session_file().unlink()
        except (OSError, ValueError):
            pass

    # ------------------------------------------------------------------ GPU

    def worker_pids(self) -> list[int]:
        """Every worker process of this session (marked as ours in GPU process lists)."""
        workers = [w for sup in self.models.values() for w in sup.record.workers()]
        serving = {id(sup.worker) for sup in self.models.values()}
        # The serving worker counts even while it exits: its GPU memory is still ours.
        return [w.pid for w in workers if w.pid and (w.alive or id(w) in serving)]

    def reload_phase(self) -> str | None:
        """`model:phase` of a reload running now (Xid events are tagged with it)."""
        for sup in self.models.values():
            if sup.reload_phase:
                return f"{sup.name}:{sup.reload_phase}"
        return None

    @property
    def gpu_snapshot(self) -> Any:
        """The latest GPU reading (`hotreload.gpu.nvml.GpuSnapshot`), or None."""
        return self.telemetry.snapshot

    async def _escalate_wedge(self, model: str, device: str | None) -> None:
        """After a wedged worker of `model` was killed: a GPU reset of the `device` it ran
        on, where `[gpu] reset` allows one."""
        mode = self.config.gpu.reset
        if mode == "never" or not device or not device.startswith("cuda"):
            return
        from hotreload.gpu.reset import reset_on_wedge

        index = int(device.split(":")[1]) if ":" in device else 0
        if mode == "ask":
            self.events.emit(
                GpuReset(
                    model=model,
                    ok=False,
                    message=f"a GPU reset may help {device}: press x in the dashboard to review "
                    'and confirm it (reset = "ask")',
                )
            )
            return
        result = await asyncio.to_thread(
            reset_on_wedge, mode, index, self.worker_pids(), list(self.telemetry.xids)
        )
        if result is not None:
            self.events.emit(GpuReset(model=model, ok=result.ok, message=result.message))

    def ignore_rules(self, model_globs: tuple[str, ...] = ()) -> IgnoreRules:
        """What never triggers a reload (or goes into a snapshot) for a model."""
        return IgnoreRules(
            (*self.config.watch.ignore, *model_globs), extra_dirs=[self.config.state_dir]
        )

    # ------------------------------------------------------------------ reloads

    async def reload_model(
        self,
        name: str | None,
        *,
        trigger: str = "command",
        detail: list[str] | None = None,
        weights_only: bool = False,
        force: bool = False,
    ) -> ReloadOutcome:
        """Reload one model through its serialized reloader; returns when it is done."""
        host = self.model(name)
        return await host.reload(trigger, detail, weights_only=weights_only, force=force)

    async def reload_all(self, *, trigger: str = "command", force: bool = False) -> list[Any]:
        reloads = (self.reload_model(n, trigger=trigger, force=force) for n in self.models)
        return list(await asyncio.gather(*reloads))

    async def rewarm(self, name: str | None) -> dict[str, Any]:
        """Run the serving version's warm-up again (on its serving thread, between requests)."""
        host = self.model(name)
        if host.worker is None or not host.worker.alive:
            raise BadRequestError(f"model {host.name!r} has no running worker to warm")
        self.events.emit(RewarmStarted(model=host.name))
        r = await host.worker.warm(
            WarmRequest("current", host.model.warmup_iters), host.model.deadlines.warm_s
        )
        self.events.emit(RewarmDone(model=host.name, warm_s=r.warm_s, passes_ms=r.passes_ms))
        return r.wire()

    async def unload_model(self, name: str) -> None:
        await self.model(name).unload()

    async def _op_reload(
        self, header: dict[str, Any], payload: memoryview | bytes
    ) -> tuple[dict[str, Any], list[Any]]:
        name = header.get("model")
        trigger, force = str(header.get("trigger") or "command"), header.get("force") is True
        if name is None and len(self.models) > 1:
            outcomes = await self.reload_all(trigger=trigger, force=force)
        else:
            outcomes = [await self.reload_model(name, trigger=trigger, force=force)]
        return {"ok": True, "outcomes": [o.as_dict() for o in outcomes]}, []

    async def _op_rollback(
        self, header: dict[str, Any], payload: memoryview | bytes
    ) -> tuple[dict[str, Any], list[Any]]:
        """`hotreload rollback`, the dashboard's key: a kept version served again as the
        next version (engine/model/rollback.py); `version` None: the one before."""
        version = header.get("version")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
            raise BadRequestError(
                f"'version' must be a version number (1, 2, ...), got {version!r}"
            )
        outcome = await self.model(header.get("model")).rollback(version)
        return {"ok": True, "outcomes": [outcome.as_dict()]}, []

    async def _op_save(
        self, header: dict[str, Any], payload: memoryview | bytes
    ) -> tuple[dict[str, Any], list[Any]]:
        """`hotreload save`: the serving weights into `folder` (an absolute path)."""
        folder = header.get("folder")
        if not isinstance(folder, str) or not Path(folder).is_absolute():
            raise BadRequestError(f"'folder' must be an absolute path, got {folder!r}")
        force = header.get("force", False)
        if not isinstance(force, bool):
            raise BadRequestError(f"'force' must be true or false, got {force!r}")
        saved = await self.model(header.get("model")).save(Path(folder), force=force)
        return {"ok": True, "saved": saved}, []

    async def _op_evals(
        self, header: dict[str, Any], payload: memoryview | bytes
    ) -> tuple[dict[str, Any], list[Any]]:
        """The eval results of a model's versions from `since` on (engine/model/evals.py),
        oldest first, from its history: no worker is asked. `configured`: it has an eval."""
        since = header.get("since", 0)
        if not isinstance(since, int) or isinstance(since, bool):
            raise BadRequestError(f"'since' must be a version number, got {since!r}")
        host = self.model(header.get("model"))
        found = {o.eval["version"]: o.eval for o in host.history if o.eval}
        if host.current is not None and host.current.eval:  # a start's has no history row
            found.setdefault(host.current.eval["version"], host.current.eval)
        evals = [found[v] for v in sorted(found) if v >= since]
        return {"ok": True, "configured": host.model.eval is not None, "evals": evals}, []

    async def _op_update_weights(
        self, header: dict[str, Any], payload: memoryview | bytes, peer_pid: int | None
    ) -> tuple[dict[str, Any], list[Any]]:
        """A trainer's push (`Client.update_weights`): the next version, with its digest.
        The descriptor and its memfd are checked here, off the event loop's blocking
        calls (engine/push_intake.py), before the model's push path sees them."""
        sup = self.model(header.get("model"))
        state = header.get("state")
        if state is None:
            raise BadRequestError("update_weights needs 'state': the pushed state's descriptor")
        checked = await intake(state, peer_pid)
        try:
            result = await sup.push(
                checked.descriptor,
                strict=bool(header.get("strict", True)),
                base_digest=header.get("base_digest"),
            )
        finally:
            checked.close_later()
        return {"ok": True, "model": sup.name, **result}, []

    async def _op_wait_version(
        self, header: dict[str, Any], payload: memoryview | bytes
    ) -> tuple[dict[str, Any], list[Any]]:
        sup = self.model(header.get("model"))
        if "version" not in header:
            raise BadRequestError("wait_version needs 'version': the version to wait for")
        timeout = header.get("timeout_s") or sup.model.request_timeout_s
        version = await sup.wait_version(int(header["version"]), float(timeout))
        return {"ok": True, "model": sup.name, "version": version}, []

    # ------------------------------------------------------------------ client ops

    def _op_infer(self, header: dict[str, Any], payload: memoryview | bytes, reply: Reply) -> None:
        host = self.model(header.get("model"))

        def done(frame: Frame | None, error: BaseException | None) -> None:
            if error is not None or frame is None:
                reply(None, error or RuntimeError("no reply"))
                return
            h = frame.header
            out = {
                "ok": True,
                "model": host.name,
                "version": h.get("version"),
                "digest": h.get("digest"),
                "form": h.get("form"),
                "tensors": h.get("tensors", []),
                "compute_ms": h.get("compute_ms"),
            }
            reply(out, [frame.payload] if len(frame.payload) else [])

        host.router.submit(header, payload, done)

    async def _op_status(
        self, header: dict[str, Any], payload: memoryview | bytes
    ) -> tuple[dict[str, Any], list[Any]]:
        return {"ok": True, **(await self.status())}, []

    async def _op_ping(
        self, header: dict[str, Any], payload: memoryview | bytes
    ) -> tuple[dict[str, Any], list[Any]]:
        return {"ok": True, "pid": os.getpid()}, []

    async def status(self, worker_max_age_s: float = 0.0) -> dict[str, Any]:
        """Every model's figures; workers are asked again only when their last answer is
        older than `worker_max_age_s` (the dashboard samples twice a second)."""
        models = await asyncio.gather(*(h.status(worker_max_age_s) for h in self.models.values()))
        for m in models:
            # cpus = "auto" that pinned nothing says why where people look, not only at start.
            short, why = self.cpu_plan.unpinned.get(m["name"], (None, None))
            m["cpus_unpinned"], m["cpus_unpinned_short"] = why, short
        return {
            "pid": os.getpid(),
            "config": str(self.config.path),
            "socket": str(self.socket_path),
            "uptime_s": round(time.time() - self.started_at, 3),
            "models": list(models),
        }


def _prune_stale_snapshots(folder: Path) -> None:
    """Remove snapshot folders of sessions that died without cleaning up."""
    if not folder.is_dir():
        return
    for child in folder.glob("session-*"):
        pid = child.name.removeprefix("session-")
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                shutil.rmtree(child, ignore_errors=True)
            except PermissionError:
                pass  # another user's live session


def _remove_snapshots(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        folder.parent.rmdir()  # only when no other session of this config is left
