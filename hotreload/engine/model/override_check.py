"""When to say that the weights file overrode a code edit.

An edit that changes the value build() gives a parameter (`SCALE` in
`nn.Parameter(torch.full((4,), SCALE))`) changes nothing that serves when a weights file then
replaces that parameter: without a word, it looks as if reloading did not work. The worker
digests what build() set each tensor before the files were applied (worker/init_values.py);
the warning is given when such a digest differs from the previous version's for a tensor
the files replaced, and for nothing else: not for a version whose code did not change, nor
for an edit back to the code that serves, nor for an edit of forward().
"""

from __future__ import annotations

from dataclasses import dataclass

from hotreload.config import ModelConfig
from hotreload.engine.event_kinds import WeightsOverride
from hotreload.engine.events import EventBus
from hotreload.engine.model.jobs import ReloadJob
from hotreload.engine.model.record import VersionInfo


@dataclass(frozen=True)
class OverrideWarning:
    message: str
    #: The tensors whose build() value changed and which the files replaced.
    names: frozenset[str]


def overridden(old: VersionInfo, new: VersionInfo) -> list[str]:
    """The tensors whose build()-set value differs between `old` and `new` (both replaced
    by the weights files: the worker digests only those)."""
    before, after = old.init_digests, new.init_digests
    return sorted(k for k, d in after.items() if k in before and before[k] != d)


def override_warning(
    model: ModelConfig, job: ReloadJob, old: VersionInfo | None, new: VersionInfo
) -> OverrideWarning | None:
    """The warning for `new`, built by `job` after `old`, or None."""
    if job.weights_only or old is None or not model.weights:
        return None
    names = overridden(old, new)
    if not names:
        return None
    files = ", ".join(p.name for p in model.weights)
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return OverrideWarning(
        f"v{new.version}'s build() sets {shown} to a new value, but {files} is loaded after "
        f"build() and replaces it, so v{new.version} answers with the file's values as "
        f"v{old.version} did; change the weights file, or apply the value in forward()",
        frozenset(names),
    )


class OverrideWarner:
    """Gives the warning for each tensor once a session (a later true case of another tensor
    is still said)."""

    def __init__(self, events: EventBus) -> None:
        self.events = events
        self.warned: set[str] = set()

    def check(
        self,
        model: ModelConfig,
        job: ReloadJob | None,
        old: VersionInfo | None,
        new: VersionInfo,
    ) -> None:
        warning = job and override_warning(model, job, old, new)
        if warning and not warning.names <= self.warned:
            self.warned |= warning.names
            self.events.emit(
                WeightsOverride(model=model.name, version=new.version, message=warning.message)
            )
