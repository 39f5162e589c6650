"""Messages that carry engine data to the dashboard's widgets (small dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message

from hotreload.engine.event_kinds import BaseEvent, ChangeDetected, PhaseStart, State
from hotreload.tui.source import Sample

#: Event kinds of which only the latest per model matters: a burst collapses to one message.
COALESCING_KINDS = (State, ChangeDetected, PhaseStart)


@dataclass
class Sampled(Message):
    """One turn of the sampling loop. A newer one supersedes a queued older one."""

    sample: Sample
    #: History points this sample stands for (a sample taken after a longer, idle wait
    #: covers several refresh periods).
    points: int = 1

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, Sampled)


@dataclass
class EngineEvent(Message):
    """One event from the session's event stream, delivered on the app's loop."""

    event: BaseEvent
    #: History from before this dashboard attached: shown in the panels, never popped up.
    replayed: bool = False

    def can_replace(self, message: Message) -> bool:
        # Only chatty kinds coalesce; a reload outcome or an Xid is never dropped.
        if not isinstance(message, EngineEvent):
            return False
        mine, other = self.event, message.event
        return (
            isinstance(mine, COALESCING_KINDS)
            and type(other) is type(mine)
            and getattr(other, "model", None) == getattr(mine, "model", None)
        )


@dataclass
class SessionStarted(Message):
    """The session came up (`error` is set when a model could not start)."""

    error: str | None = None
    #: Set when the session cannot run at all (socket taken, ...): the app exits.
    fatal: str | None = None


@dataclass
class ActionDone(Message):
    """A key's background job finished; `text` is what to tell the user."""

    text: str
    severity: str = "information"


@dataclass
class ResetChecked(Message):
    """The reset dialog's precondition check finished (`decision` is a ResetDecision)."""

    decision: Any


@dataclass
class ResetFinished(Message):
    """A confirmed reset ran (`result` is a ResetResult)."""

    result: Any
