"""Modal screens: the GPU reset confirmation and the help page."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from hotreload.tui.messages import ResetChecked, ResetFinished
from hotreload.tui.source import DashboardSource, ResetTarget

RESET_EXPLAINED = (
    "A reset (nvidia-smi --gpu-reset) re-initialises the GPU: it clears hung contexts "
    "and stuck streams, and destroys every CUDA context on it. Allowed only when:\n"
    ' • [gpu] reset is "on-wedge" or "ask" in the config (this session: {mode})\n'
    " • you are root, or sudo runs nvidia-smi without a password\n"
    " • nothing uses the GPU: other programs and hotreload's workers have stopped\n"
    " • no Xid 79 was seen (a GPU off the bus needs a power cycle, not a reset)"
)


class ResetDialog(ModalScreen[None]):
    """Explains a reset, checks its preconditions off the loop, and asks to confirm."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,n", "dismiss_dialog", "Close")]

    def __init__(self, source: DashboardSource, target: ResetTarget) -> None:
        super().__init__()
        self.source = source
        self.target = target

    def compose(self) -> ComposeResult:
        where = f"GPU {self.target.index}" if self.target.index is not None else "the GPU"
        with Vertical(id="dialog"):
            yield Static(Text(f"Reset {where}?", "bold"), id="dialog-title")
            # Text, not markup: "[gpu]" must print as it is.
            yield Static(Text(RESET_EXPLAINED.format(mode=self.source.reset_mode)), id="explain")
            yield Static(Text("checking the preconditions…", "yellow"), id="decision")
            with Horizontal(id="buttons"):
                yield Button("Reset GPU", id="confirm", variant="error", disabled=True)
                yield Button("Close", id="cancel", variant="primary")

    def on_mount(self) -> None:
        if self.target.index is None:
            self._show(False, f"No reset possible. {self.target.reason} Nothing was done.")
            self.query_one("#confirm", Button).display = False
        else:
            self._check(self.target.index)
        self.query_one("#cancel", Button).focus()

    def _show(self, allowed: bool, text: str) -> None:
        style = "bold green" if allowed else "bold red"
        self.query_one("#decision", Static).update(Text(text, style))
        self.query_one("#confirm", Button).disabled = not allowed

    @work(thread=True, exclusive=True, group="reset-check")
    def _check(self, index: int) -> None:
        # check_reset may run sudo and nvidia-smi: a thread, never the event loop.
        self.post_message(ResetChecked(self.source.check_reset(index)))

    def on_reset_checked(self, message: ResetChecked) -> None:
        d = message.decision
        if d.allowed:
            self._show(True, f"Allowed: {d.reason}. Will run: {' '.join(d.command)}")
        else:
            pids = f" (blocking PIDs: {', '.join(map(str, d.blocking_pids))})"
            self._show(False, f"Not allowed: {d.reason}{pids if d.blocking_pids else ''}.")

    @on(Button.Pressed, "#confirm")
    def _confirm(self) -> None:
        assert self.target.index is not None
        self.query_one("#confirm", Button).disabled = True
        self.query_one("#decision", Static).update(Text("resetting…", "bold yellow"))
        self._reset(self.target.index)

    @work(thread=True, exclusive=True, group="reset-run")
    def _reset(self, index: int) -> None:
        self.post_message(ResetFinished(self.source.reset(index)))

    def on_reset_finished(self, message: ResetFinished) -> None:
        r = message.result
        self.app.notify(r.message, severity="information" if r.ok else "error", timeout=10)
        self.dismiss(None)

    @on(Button.Pressed, "#cancel")
    def action_dismiss_dialog(self) -> None:
        self.dismiss(None)


HELP = """\
[b]Keys[/b]  (escape, ? or q closes this help)
  ↑ ↓      select a model (Queue, Latency, Memory follow)
  tab      next table
  r / R    reload the selected model / every model
  w        re-run the selected model's warm-up
  b        roll the selected model back to its previous version
  p        pause or resume the file watcher
  x        reset the GPU (explains it; only where allowed)
  l        start or stop the demo load (a few hundred req/s)
  ?        this help
  q        quit: under `hotreload watch`, drain and stop every
           worker; a `hotreload dashboard` only detaches

[b]Panels[/b]
  Models   version (v3 d513bd5d +1 push: its weights' digest and
           the trainer pushes laid over the files' weights),
           state, policy/strategy, device, last reload
  Queue    waiting now / limit, 2-minute sparkline, rejected,
           timed out
  Latency  p50 / p95 / p99 over 60 s, sparkline of p99; for a
           text generator tokens/s and time to first token
  Memory   per GPU used/total and hotreload's share; per model
           torch allocated/reserved (CPU: worker RSS) and growth
           since the first load: a leak climbs across reloads
  Reloads  one row per reload, newest first (auto→availability:
           the policy auto chose); the selected one is detailed
           below, with error and traceback if it failed
  Xid      GPU errors (NVML, kernel log); critical ones in red
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "dismiss_help", "Close")
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            # Keys first, the way to close in their title: at 80x24 the panels part is
            # below the fold (it scrolls), the keys and how to leave are not.
            yield Static(HELP)
            yield Static(Text("escape, ? or q to close", "dim"))

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
