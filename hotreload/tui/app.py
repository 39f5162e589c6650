"""The `hotreload watch` dashboard.

Data path: one long-lived sampling loop (an async worker that never overlaps itself) awaits
`source.sample()` every `refresh_s` and posts a `Sampled` message; engine events arrive
through the source's subscription as `EngineEvent` messages. Both coalesce when they queue
up. Handlers only update `DashboardState` and set one reactive per widget; anything slow
(reloads, warm-up, stopping workers, the reset check) runs in a worker that posts back.
"""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial
from typing import Any, ClassVar

from rich.text import Text
from textual import events, on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.driver import Driver
from textual.widgets import DataTable, Footer

from hotreload.engine.compile_figures import compile_text
from hotreload.engine.event_kinds import (
    BaseEvent,
    ConfigChanged,
    ConfigError,
    FileUnused,
    GpuReset,
    LockWait,
    PhaseEnd,
    PhaseStart,
    Ready,
    ReloadDone,
    ReloadFailed,
    ReloadRequested,
    SessionLost,
    SessionStopping,
    State,
    WatchError,
    WatchWaiting,
    Wedged,
    WeightsOverride,
    WorkerDied,
    Xid,
)
from hotreload.errors import HotreloadError
from hotreload.exitcodes import EXIT_ENVIRONMENT, EXIT_OK
from hotreload.tui import render
from hotreload.tui.dialogs import HelpScreen, ResetDialog
from hotreload.tui.fit import MODEL_COLUMNS, RELOAD_COLUMNS, fit_model_rows, fit_reload_rows
from hotreload.tui.golden_panel import GoldenPanel
from hotreload.tui.loadgen import LoadGenerator
from hotreload.tui.messages import ActionDone, EngineEvent, Sampled, SessionStarted
from hotreload.tui.source import DashboardSource, reset_target
from hotreload.tui.state import DashboardState, activity
from hotreload.tui.terminal import clean_exit_driver
from hotreload.tui.widgets import Panel, RowsTable, StatusLine, set_border

#: Default time between samples.
REFRESH_S = 0.5
#: The header until every model is up (the seconds so far follow it).
STARTING = "starting: spawning workers, loading and warming up"
#: The header while a model that could not start waits for a fix.
START_FAILED = "start failed: fix the file and save"
#: Time between samples while nothing moves (no request, no reload, no state change).
IDLE_REFRESH_S = 1.0
#: What `q` leaves on the terminal of an attached dashboard (`hotreload dashboard`).
DETACHED = "detached; the session keeps serving (Ctrl-C where `hotreload watch` runs stops it)"


class DashboardApp(App[int]):
    CSS_PATH = "dashboard.tcss"
    TITLE = "hotreload watch"
    ENABLE_COMMAND_PALETTE = False
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-narrow"), (100, "-wide")]
    VERTICAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-short"), (30, "-tall")]
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "reload", "Reload"),
        Binding("R", "reload_all", "All"),
        Binding("w", "rewarm", "Warm"),
        Binding("b", "rollback", "Back"),  # "Rollback" would take the footer past 80 columns
        Binding("p", "pause", "Pause"),
        Binding("x", "reset_gpu", "Reset GPU"),
        Binding("l", "load", "Load"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(
        self,
        source: DashboardSource,
        *,
        refresh_s: float = REFRESH_S,
        state: DashboardState | None = None,
        owner: bool = True,
    ) -> None:
        super().__init__()
        self.source = source
        #: True under `hotreload watch`: quitting stops the session. False for an attached
        #: `hotreload dashboard`: quitting only detaches.
        self.owner = owner
        self.refresh_s = refresh_s
        #: What earlier samples left (histories, baselines); a replay can hand one in.
        self.state = state or DashboardState()
        self.selected: str | None = None
        self.phase = STARTING
        self._mounted_at: float | None = None
        self.paused = False
        #: Files edited while paused, per the last sample (reloaded on resume).
        self.waiting = 0
        self.load: LoadGenerator | None = None
        #: Printed after the app closes when the session could not run at all.
        self.exit_message: str | None = None
        self._reload_items: list[Any] = []
        self._unsubscribe: Any = None
        self._wake = asyncio.Event()
        self._first_sample = asyncio.Event()
        self._quitting = False
        self._start_worker: Any = None

    def get_driver_class(self) -> type[Driver]:
        return clean_exit_driver(super().get_driver_class())

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        yield RowsTable("Models", MODEL_COLUMNS, id="models")
        with Horizontal(id="metrics"):
            yield Panel("Queue", id="queue")
            yield Panel("Latency", id="latency")
            yield Panel("Memory", id="memory")
        yield RowsTable("Reloads", RELOAD_COLUMNS, follow_newest=True, id="reloads")
        yield GoldenPanel(id="golden")
        with VerticalScroll(id="detail-box"):
            yield Panel("", id="detail")
        yield RowsTable(
            "Xid events",
            ("Time", "GPU", "Xid", "Severity", "Process", "Phase", "Name"),
            cursor=False,
            id="xids",
        )
        yield Footer()

    # ------------------------------------------------------------------ lifecycle

    def on_mount(self) -> None:
        self._unsubscribe = self.source.subscribe(
            lambda event, replayed: self.post_message(EngineEvent(event, replayed))
        )
        self.query_one("#models", RowsTable).focus()
        self._mounted_at = self.source.clock.now()
        self._render_status()
        self._start_worker = self._start_session()
        self._sample_loop()
        self.set_interval(1.0, self._tick)

    def on_resize(self, event: events.Resize) -> None:
        # After the layout, when the tables and panels have their new sizes to fit to.
        self.call_after_refresh(self._render_all)

    def on_panel_resized(self, message: Panel.Resized) -> None:
        self._render_panels()
        self._render_detail()

    def _tick(self) -> None:
        """Once a second: the clock, and the elapsed time of whatever is still running (a
        model loading, a reload's phase), so a long wait never looks like a hang."""
        self._render_status()
        sample = self.state.sample
        running = self.state.live or any(
            m.get("state") in render.TRANSIENT_STATES for m in (sample.models if sample else ())
        )
        if running:
            self._render_models()
            self._render_reloads()

    async def wait_for_first_sample(self, timeout: float = 30.0) -> None:
        """For callers that drive the app (tests, screenshots): the panels have data."""
        await asyncio.wait_for(self._first_sample.wait(), timeout)

    @work(group="session", exit_on_error=False)
    async def _start_session(self) -> None:
        from hotreload.engine.model import PhaseFailed

        try:
            await self.source.start()
        except PhaseFailed as exc:
            self.post_message(SessionStarted(error=f"{exc.phase}: {exc}"))
        except HotreloadError as exc:
            self.post_message(SessionStarted(fatal=str(exc)))
        except Exception as exc:  # the app must still close the session cleanly
            self.post_message(SessionStarted(fatal=f"could not start the session: {exc!r}"))
        else:
            self.post_message(SessionStarted())

    @work(group="sampler", exclusive=True, exit_on_error=False)
    async def _sample_loop(self) -> None:
        # One loop, one sample at a time: a slow status() delays the next turn, never overlaps.
        loop = asyncio.get_running_loop()
        last_activity: tuple[Any, ...] | None = None
        last_at = loop.time()
        while not self._quitting:
            wait = self.refresh_s
            try:
                sample = await self.source.sample()
            except Exception as exc:
                self.log.warning(f"sample failed: {exc!r}")
            else:
                now = loop.time()
                # Histories keep one point per refresh_s of wall time, however far apart
                # the samples were.
                points = max(1, min(8, round((now - last_at) / self.refresh_s)))
                last_at = now
                self.post_message(Sampled(sample, points))
                now_activity = activity(sample)
                if now_activity == last_activity and self.load is None:
                    # Nothing moved: sample less often. An engine event (a reload, a state
                    # change, an Xid) still wakes the loop at once.
                    wait = max(self.refresh_s, IDLE_REFRESH_S)
                last_activity = now_activity
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    def on_session_started(self, message: SessionStarted) -> None:
        if message.fatal:
            self.exit_message = message.fatal
            self.exit(return_code=EXIT_ENVIRONMENT)
            return
        self.phase = "" if message.error is None else START_FAILED
        if message.error:
            self.notify(f"a model could not start: {message.error}", severity="error", timeout=10)
        self._render_status()
        self._wake.set()

    # ------------------------------------------------------------------ data in

    def on_sampled(self, message: Sampled) -> None:
        self.state.update(message.sample, points=message.points)
        if self.selected is None or self.state.model(self.selected) is None:
            names = self.state.names()
            self.selected = names[0] if names else None
        self.paused = message.sample.paused
        self.waiting = message.sample.waiting
        self._render_all()
        self._first_sample.set()

    def on_engine_event(self, message: EngineEvent) -> None:
        event = message.event
        self.state.on_event(event)
        if not message.replayed:  # history from before this dashboard attached: not popped
            self._notify_for(event)
        if self.phase == START_FAILED and not self.state.start_errors:
            self.phase = ""  # the model that failed to start came up: say so no longer
            self._render_status()
        if isinstance(event, (ReloadDone, ReloadFailed, Ready, State, Xid, WatchWaiting)):
            self._wake.set()  # sample now: the outcome shows without waiting a turn
        if isinstance(event, (ReloadRequested, PhaseStart, PhaseEnd, LockWait)):
            self._render_reloads()

    def _notify_for(self, event: BaseEvent) -> None:
        match event:
            case SessionStopping() | SessionLost() as ended if not self._quitting:
                # Stopped from elsewhere (SIGTERM, another terminal): nothing left to show.
                clean = isinstance(ended, SessionStopping)
                self.exit_message = "the session stopped" if clean else "lost the session"
                self._quitting = True
                self.exit(return_code=EXIT_OK if clean else EXIT_ENVIRONMENT)
            case ConfigError(error=error):
                self.notify(str(error), title="config error", severity="error", timeout=10)
            case ConfigChanged(detail=detail):
                self.notify(str(detail), severity="warning", timeout=8)
            case ReloadDone(model=m, unchanged=str() as same):
                self.notify(f"{m}: {same}", timeout=3)
            case ReloadDone(model=m, version=v, total_s=total_s, compile=figures):
                compiled = f"; {compile_text(figures)}" if figures else ""
                self.notify(f"{m}: v{v} live in {total_s or 0:.2f} s{compiled}", timeout=3)
            case ReloadFailed(model=m, version=v, phase=phase, error=error):
                self.notify(
                    f"{m}: reload failed in {phase}: {error} - v{v} keeps serving",
                    severity="error",
                    timeout=8,
                )
            case Xid() as x if x.severity in render.CRITICAL_SEVERITIES or x.xid == 79:
                self.notify(
                    f"Xid {x.xid} on GPU {'?' if x.device is None else x.device}: {x.name}. "
                    f"{x.action}",
                    title="critical GPU error",
                    severity="error",
                    timeout=15,
                )
            case Wedged(model=m, phase=phase, detail=detail):
                self.notify(f"{m} wedged in {phase}: {detail}", severity="error")
            case WorkerDied(model=m, reason=reason):
                self.notify(f"{m}: worker died ({reason}); restarting", severity="warning")
            case GpuReset(message=message, ok=ok):
                self.notify(str(message), severity="information" if ok else "warning")
            case WatchError(error=error):
                self.notify(f"watcher: {error}", severity="warning")
            case FileUnused(path=path):  # once per file: why a save reloaded nothing
                self.notify(f"{path} is not used by any model: nothing reloads", timeout=5)
            case WeightsOverride(model=m, message=message):
                self.notify(f"{m}: {message}", severity="warning", timeout=15)
            case LockWait(model=m, message=message):
                self.notify(f"{m}: {message}", severity="warning", timeout=10)

    # ------------------------------------------------------------------ rendering

    def _render_all(self) -> None:
        self._render_models()
        self._render_panels()
        self._render_reloads()
        sample = self.state.sample
        xids = self.query_one("#xids", RowsTable)
        if sample is not None:
            xids.view = render.xid_rows(sample.xids, self.source.clock.hms)
            # The border's corners and the spaces around the text take 6 of its cells.
            sources = render.xid_sources_text(sample.xid_sources, xids.size.width - 6)
            set_border(xids, subtitle=sources)
        self._render_status()

    def _render_models(self) -> None:
        table, clock = self.query_one("#models", RowsTable), self.source.clock
        rows = partial(render.model_rows, self.state, clock.hms, clock.now())
        table.view = fit_model_rows(rows, table.inner_width(len(self.state.names())))

    def _render_panels(self) -> None:
        models = self.query_one("#models", RowsTable)
        # The border's corners and the spaces around the text take 6 of its cells.
        reach = render.reach_text(self.state.sample, self.selected, models.size.width - 6)
        set_border(models, subtitle=reach)
        m = self.state.model(self.selected)
        name = self.selected or ""
        queue = self.query_one("#queue", Panel)
        set_border(queue, title=f"Queue {name}")
        queue.view = render.queue_text(
            m, tuple(self.state.queue.get(name, ())), queue.content_size.width
        )
        latency = self.query_one("#latency", Panel)
        set_border(latency, title=f"Latency {name} (ms)")
        width, height = latency.content_size
        latency.view = render.latency_text(m, tuple(self.state.p99.get(name, ())), width, height)
        memory = self.query_one("#memory", Panel)
        memory.view = render.memory_text(self.state, self.selected, memory.content_size.width)
        self.query_one("#golden", GoldenPanel).show(m)

    def _render_reloads(self) -> None:
        table = self.query_one("#reloads", RowsTable)
        sample = self.state.sample
        self._reload_items = [None] * len(self.state.live) + list(
            reversed(sample.reloads if sample else ())
        )
        clock = self.source.clock
        rows = render.reload_rows(self.state, clock.hms, clock.now())
        columns, fitted = fit_reload_rows(rows, table.inner_width(len(rows)))
        table.show(fitted, columns)
        self._render_detail()

    def _render_detail(self) -> None:
        table = self.query_one("#reloads", RowsTable)
        row = table.cursor_row
        outcome = self._reload_items[row] if 0 <= row < len(self._reload_items) else None
        start_error = self.state.start_errors.get(self.selected or "")
        detail = self.query_one("#detail", Panel)
        detail.view = render.reload_detail(outcome, start_error, detail.content_size.width)
        box = self.query_one("#detail-box")
        box.set_class((outcome is not None and not outcome.ok) or start_error is not None, "-error")

    def _render_status(self) -> None:
        clock = self.source.clock
        right = Text()
        if self.phase:
            since = self._mounted_at if self.phase == STARTING else None
            elapsed = render.elapsed_text(since, clock.now())
            right.append(f" {self.phase}{elapsed} ", "bold black on yellow")
        elif self.paused:
            waiting = self.waiting
            note = f"{waiting} change{'s' if waiting != 1 else ''} waiting, " if waiting else ""
            right.append(f" ⏸ watcher PAUSED ({note}p resumes) ", "bold black on yellow")
        else:
            right.append(" ● watching ", "bold green")
        if self.load is not None:
            right.append(f" load ~{self.load.rate:.0f} req/s ", "bold black on cyan")
        right.append(f" {clock.hms(clock.now())} ", "dim")
        t = Text(" hotreload ", "bold reverse")
        # The config path gives way first when the line is too narrow.
        room = self.size.width - len(t) - len(right) - 2
        title = self.source.title
        if room < len(title):
            title = "…" + title[-room + 1 :] if room > 8 else ""
        t.append(f" {title}".ljust(max(room, 0) + 1))
        t.append_text(right)
        self.query_one("#status", StatusLine).view = t

    # ------------------------------------------------------------------ selection

    @on(DataTable.RowHighlighted, "#models")
    def _model_highlighted(self, event: DataTable.RowHighlighted) -> None:
        names = self.state.names()
        if 0 <= event.cursor_row < len(names):
            self.selected = names[event.cursor_row]
            self._render_panels()
            self._render_detail()

    @on(DataTable.RowHighlighted, "#reloads")
    def _reload_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._render_detail()

    # ------------------------------------------------------------------ keys

    def action_reload(self) -> None:
        if self.selected:
            self._reload(self.selected)

    def action_reload_all(self) -> None:
        self._reload(None)

    @work(group="reload", exit_on_error=False)
    async def _reload(self, model: str | None) -> None:
        # Outcomes are reported by their events; a reload refused outright is reported here.
        try:
            await self.source.reload(model)
        except Exception as exc:
            self.post_message(ActionDone(f"reload refused: {exc}", "error"))

    def action_rollback(self) -> None:
        if self.selected:
            self._rollback(self.selected)

    @work(group="reload", exit_on_error=False)
    async def _rollback(self, model: str) -> None:
        # The outcome is reported by its events; a rollback refused outright (no earlier
        # version kept) is reported here.
        try:
            await self.source.rollback(model)
        except Exception as exc:
            self.post_message(ActionDone(f"rollback refused: {exc}", "error"))

    def action_rewarm(self) -> None:
        if self.selected:
            self._rewarm(self.selected)

    @work(group="rewarm", exclusive=True, exit_on_error=False)
    async def _rewarm(self, model: str) -> None:
        try:
            r = await self.source.rewarm(model)
        except Exception as exc:
            self.post_message(ActionDone(f"{model}: warm-up not run: {exc}", "error"))
            return
        passes = ", ".join(f"{p:.1f}" for p in r.get("passes_ms", [])[:5])
        self.post_message(ActionDone(f"{model}: warm-up re-run: {passes} ms"))

    def on_action_done(self, message: ActionDone) -> None:
        self.notify(message.text, severity=message.severity)  # type: ignore[arg-type]

    def action_pause(self) -> None:
        self.paused = not self.paused
        self._render_status()
        self._set_paused(self.paused)

    @work(group="pause", exit_on_error=False)
    async def _set_paused(self, paused: bool) -> None:
        await self.source.set_paused(paused)

    def action_reset_gpu(self) -> None:
        sample = self.state.sample
        target = reset_target(self.state.model(self.selected), sample.gpu if sample else None)
        self.push_screen(ResetDialog(self.source, target))

    def action_load(self) -> None:
        if self.load is not None:
            self.workers.cancel_group(self, "load")
            self.load = None
            self.notify("load generator stopped")
        else:
            socket_path, targets = self.source.load_targets()
            if not targets:
                self.notify("no model is serving yet: nothing to load", severity="warning")
                return
            self.load = LoadGenerator(socket_path, targets)
            self._run_load(self.load)
            self.notify(f"load generator on: ~{self.load.rate:.0f} req/s in waves (l stops it)")
        self._render_status()

    @work(group="load", exclusive=True, exit_on_error=False)
    async def _run_load(self, load: LoadGenerator) -> None:
        await load.run()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        if self._quitting:
            return
        self._quitting = True
        self.phase = "stopping: draining requests and stopping workers" if self.owner else ""
        if not self.owner:
            self.exit_message = DETACHED  # printed once the screen is restored
        self._render_status()
        self.workers.cancel_group(self, "load")
        self._wake.set()
        self._quit()

    @work(group="quit", exit_on_error=False)
    async def _quit(self) -> None:
        if self._start_worker is not None:
            # Waiting to attach is all it does: the session's own process owns the workers.
            self._start_worker.cancel()
        if self._unsubscribe is not None:
            self._unsubscribe()
        await self.source.stop()
        self.exit(return_code=EXIT_OK)


def build_app(
    source: DashboardSource,
    *,
    refresh_s: float = REFRESH_S,
    state: DashboardState | None = None,
    owner: bool = True,
) -> DashboardApp:
    """The one factory the CLI, the tests and the screenshot use."""
    return DashboardApp(source, refresh_s=refresh_s, state=state, owner=owner)
