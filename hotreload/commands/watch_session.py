"""`WatchSession`: a Session plus its file watcher, what `hotreload watch` runs.

Both the plain printer and the dashboard (over the socket ops in `dashboard_ops`) drive one;
this module imports neither, so the three import one way: watch -> these.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hotreload.commands.config_edit import apply_edit
from hotreload.commands.serve import http_front_ends
from hotreload.config import Config, load_config
from hotreload.engine import event_kinds
from hotreload.engine.event_kinds import BaseEvent, ReloadDone, StartFailed
from hotreload.engine.model import PhaseFailed
from hotreload.engine.session import Session
from hotreload.engine.used_files import files_used
from hotreload.engine.watcher import Change, FileWatcher
from hotreload.errors import ConfigError


class WatchSession:
    """A Session plus its file watcher: what both the plain printer and the dashboard drive."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.session = Session(config, front_ends=http_front_ends(config))
        self.watcher = FileWatcher(
            config,
            self._on_change,
            self.session.events,
            rules_for=lambda m: self.session.ignore_rules(m.ignore),
            uses=lambda m: files_used(m, self.session.models[m.name].record),
        )
        self.watcher.on_config_change = self._on_config_change
        self._config_edits = asyncio.Lock()
        #: "starting", "started" or "failed" (a model could not come up; the watcher runs
        #: anyway so that fixing the file brings it up).
        self.start_state = "starting"
        #: {"phase", "error"} of the model that could not come up.
        self.start_error: dict[str, str] | None = None
        self.session.events.subscribe(self._on_event)

    def _on_event(self, event: BaseEvent) -> None:
        # A model that failed at start and then came up (a save, `hotreload reload`, an
        # HTTP load): the session is no longer in a failed start, for a dashboard
        # attaching now as for the one already open.
        if (
            isinstance(event, ReloadDone)
            and self.start_state == "failed"
            and all(h.state == "serving" for h in self.session.models.values())
        ):
            self.start_state, self.start_error = "started", None

    async def _on_config_change(self) -> frozenset[str]:
        """Apply the saved config; the models it built anew (the watcher's flush needs not
        reload them for the files saved with it)."""
        # One edit at a time, each read once the one before has applied (its reloads done):
        # it is compared with what serves then, and the file as it is then.
        async with self._config_edits:
            try:
                new = await asyncio.to_thread(load_config, self.config.path)
            except ConfigError as exc:
                self.session.events.emit(
                    event_kinds.ConfigError(error=f"{exc}; the running session keeps its settings")
                )
                return frozenset()
            return await apply_edit(self, new)

    async def _on_change(self, change: Change) -> None:
        root = self.config.root
        shown = [_rel(p, root) for p in change.paths]
        await self.session.reload_model(
            change.model, trigger="file", detail=shown, weights_only=change.weights_only
        )

    async def start(self) -> None:
        await self.watcher.prime()
        await self.session.start()
        await self.watcher.start()
        self.start_state = "started"

    async def start_keep_going(self) -> None:
        """Start; a model that cannot come up is recorded (`start_state` "failed", and its
        `start_failed` event) and the watcher starts anyway: the user fixes the file, saves,
        and the reload brings it up."""
        await self.watcher.prime()
        # The socket first, outside the try: another session serving on it is no model
        # failure a save could fix (exit 3, "already serving"), so it must not keep going.
        await self.session.open()
        try:
            await self.session.start()
        except PhaseFailed as exc:
            self.start_error = {"phase": exc.phase, "error": str(exc)}
        except ConfigError:
            raise  # `cpus` this machine cannot honour: no save fixes that, the config does
        except Exception as exc:  # spawning failed (EMFILE, ENOMEM), or a bug of ours
            self.start_error = {"phase": "start", "error": repr(exc)}
            self._refuse_unstarted(exc)
        await self.watcher.start()
        self.start_state = "started" if self.start_error is None else "failed"

    def _refuse_unstarted(self, exc: Exception) -> None:
        """Say why a model that never came up does not start, and answer its requests at
        once with that (not after 30 s "in the queue")."""
        for host in self.session.models.values():
            if host.worker is not None and host.worker.alive:
                continue
            self.session.events.emit(
                StartFailed(model=host.name, phase="start", error=repr(exc), traceback=None)
            )
            host.refuse_until_reload(f"failed to start ({exc!r})")

    def _pids_on(self, index: int) -> list[int]:
        return [
            h.worker.pid
            for h in self.session.models.values()
            if h.worker is not None
            and h.worker.pid
            and (h.worker.device or "").startswith(f"cuda:{index}")
        ]

    def check_reset(self, index: int) -> Any:
        """Whether GPU `index` may be reset now (`ResetDecision`). Blocking: a thread."""
        from hotreload.gpu.reset import check_reset

        return check_reset(*self._reset_args(index))

    def reset(self, index: int) -> Any:
        """Reset GPU `index` where allowed (`ResetResult`). Blocking: a thread."""
        from hotreload.gpu.reset import reset_gpu

        return reset_gpu(*self._reset_args(index))

    def _reset_args(self, index: int) -> tuple[int, list[int], list[Any], bool]:
        """(index, our worker pids on it, Xid history, allowed by the config)."""
        xids = list(self.session.telemetry.xids)
        return index, self._pids_on(index), xids, self.config.gpu.reset != "never"

    async def stop(self) -> None:
        await self.watcher.stop()
        await self.session.stop()


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
