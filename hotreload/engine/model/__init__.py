"""One served model's supervisor and everything it runs (see supervisor.py)."""

from hotreload.engine.model.jobs import PhaseFailed, ReloadOutcome, Wedged
from hotreload.engine.model.record import STATES, ModelRecord, VersionInfo
from hotreload.engine.model.supervisor import ModelSupervisor

__all__ = [
    "STATES",
    "ModelRecord",
    "ModelSupervisor",
    "PhaseFailed",
    "ReloadOutcome",
    "VersionInfo",
    "Wedged",
]
