"""What a reload produced, and the errors its phases raise."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ReloadOutcome:
    """What happened to one reload (also the reply to `hotreload reload` and HTTP load)."""

    model: str
    ok: bool
    #: The version serving after the reload (the old one when it failed).
    version: int
    trigger: str
    policy: str = ""
    strategy: str = ""
    #: The phase that failed, or None.
    phase: str | None = None
    error: str | None = None
    traceback: str | None = None
    #: Seconds per phase, in the order they ran.
    phases: dict[str, float] = field(default_factory=dict)
    total_s: float = 0.0
    detail: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class PhaseFailed(Exception):
    def __init__(self, phase: str, message: str, remote_traceback: str | None = None) -> None:
        self.phase = phase
        self.remote_traceback = remote_traceback
        super().__init__(message)


class Wedged(PhaseFailed):
    """Drain or sync past its deadline: the worker must be killed."""


@dataclass
class ReloadJob:
    trigger: str
    detail: list[str]
    weights_only: bool
    future: asyncio.Future[ReloadOutcome]

    def merge(self, trigger: str, detail: list[str], weights_only: bool) -> None:
        if trigger not in self.trigger.split("+"):
            self.trigger += "+" + trigger
        self.detail += [d for d in detail if d not in self.detail]
        # One code change among the edits means the code must be re-imported.
        self.weights_only = self.weights_only and weights_only
