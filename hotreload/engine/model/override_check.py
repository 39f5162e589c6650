"""When to say that the weights file overrode a code edit.

An edit of the code that leaves the example's output the same to the bit, with weights
declared, most likely changed a value build() sets parameters from (SCALE), which the
weights file then overwrote: without a word, it looks as if reloading did not work.
"""

from __future__ import annotations

from hotreload.config import ModelConfig
from hotreload.engine.model.jobs import ReloadJob
from hotreload.engine.model.record import VersionInfo


def override_warning(
    model: ModelConfig, job: ReloadJob, old: VersionInfo | None, new: VersionInfo
) -> str | None:
    """The warning for `new`, built by `job` after `old`, or None."""
    if (
        job.weights_only
        or "file" not in job.trigger.split("+")
        or old is None
        or new.output_digest is None
        or new.output_digest != old.output_digest
    ):
        return None
    files = ", ".join(p.name for p in model.weights)
    return (
        f"v{new.version} answers the example exactly as v{old.version} did although its "
        f"code changed: {files} is loaded after build() and overrides the parameters "
        "build() sets, so editing a value they are initialised from changes nothing; "
        "change the weights file, or apply the value in forward() (shown once)"
    )
