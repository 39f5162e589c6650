"""The save job (`hotreload save MODEL DIR`): the serving version's weights, pushed ones
included, written by its worker into a folder (worker/save_weights.py). A job of the
model's own, so no reload swaps the version out while its tensors are being written."""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from hotreload.engine.model.jobs import Job
from hotreload.engine.worker_port import Worker, WorkerDied, WorkerReplyError
from hotreload.errors import BadRequestError
from hotreload.protocol.messages import SaveReply, SaveRequest

#: The model's supervisor.ModelSupervisor (which imports this module: typed loosely here).
Supervisor = Any


@dataclass
class SaveJob(Job):
    kind: ClassVar[str] = "save"
    #: Absolute: the worker may run in another folder.
    folder: Path = Path()
    #: Write into a folder with files in it (those of the same names are overwritten).
    force: bool = False


#: A worker's save still writing past its deadline (the worker cannot stop it part way):
#: the folder, and the call awaited to its end. One at a time per worker.
_writing: weakref.WeakKeyDictionary[Worker, tuple[Path, asyncio.Task[SaveReply]]] = (
    weakref.WeakKeyDictionary()
)


async def run(sup: Supervisor, job: SaveJob) -> dict[str, Any]:
    """What was written (files, tensors, bytes) with the version and digest saved; or
    BadRequestError saying why nothing was, or that it is still being written.

    The worker writes on its loader thread: a save past `deadlines.load_s` runs on there
    (a reload's LOAD queued behind it waits for it, bounded by its own `load_s`), so the
    reply says so and names the folder to check, and the next save waits for it."""
    rec = sup.record
    worker, current = rec.serving, rec.current
    if worker is None or not worker.alive or current is None:
        raise BadRequestError(
            f"model {sup.name!r} is {rec.state}: no version serves to save; reload it first"
        )
    if not job.force and job.folder.is_dir() and any(job.folder.iterdir()):
        raise BadRequestError(
            f"model {sup.name!r}: nothing saved: {job.folder} is not empty (a save there "
            "would overwrite its files of the same names); name a new or empty folder, or "
            "pass --force to write into it"
        )
    deadline = sup.model.deadlines.load_s
    earlier = _writing.get(worker)
    if earlier is not None and not earlier[1].done():
        raise BadRequestError(
            f"model {sup.name!r}: nothing saved: the save into {earlier[0]} is still being "
            "written by the worker; try again once it has finished"
        )
    request = SaveRequest(str(job.folder), sup.name, current.digest)
    call = asyncio.create_task(worker.save(request, None))
    call.add_done_callback(lambda t: t.cancelled() or t.exception())  # read: never unawaited
    _writing[worker] = (job.folder, call)
    try:
        reply = await asyncio.wait_for(asyncio.shield(call), deadline)
    except TimeoutError:
        raise BadRequestError(
            f"model {sup.name!r}: the save did not finish within {deadline:g} s "
            f"(deadlines.load_s) and is still being written by the worker; check {job.folder} "
            "after it finishes (its hotreload.json is written last), or raise deadlines.load_s"
        ) from None
    except (WorkerReplyError, WorkerDied) as exc:
        raise BadRequestError(f"model {sup.name!r}: nothing saved: {exc}") from None
    return {
        "model": sup.name,
        "version": current.version,
        "digest": current.digest,
        "folder": str(job.folder),
        "files": reply.files,
        "tensors": reply.tensors,
        "bytes": reply.bytes,
        "pretrained": reply.pretrained,
    }
