"""The worker's request loop: a reader, a serving thread, a loader thread, a control thread.

Threads, not asyncio: torch releases the GIL inside kernels, and keeping model loads on a
thread of their own is what stops a multi-second load from stalling requests (the failure
Roboflow's shared step pool showed). Replies from every thread go through one locked send.
"""

from __future__ import annotations

import gc
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from hotreload.errors import ProtocolError
from hotreload.protocol.framing import Frame, SocketFrameReader, pack_frame, send_frame
from hotreload.protocol.messages import (
    OPS,
    CancelRequest,
    DigestReply,
    DigestRequest,
    Done,
    EvalRequest,
    FreedReply,
    LoadReply,
    LoadRequest,
    OffloadRequest,
    ReleaseRequest,
    Reply,
    RestoreReply,
    RestoreRequest,
    RetireRequest,
    SaveRequest,
    SmokeReply,
    SmokeRequest,
    StatusReply,
    StatusRequest,
    SwapReply,
    SwapRequest,
    SyncRequest,
    WarmReply,
    WarmRequest,
)
from hotreload.protocol.ops import WorkerOp
from hotreload.protocol.tensors import encode_tensors
from hotreload.worker import (
    adapters,
    compile_watch,
    eval_run,
    golden_run,
    imported_files,
    loader,
    oom,
    replies,
    save_weights,
    weights_digest,
)
from hotreload.worker.fresh_source import code_roots, compile_from_source, must_reimport
from hotreload.worker.inputs import request_tensors, to_device
from hotreload.worker.loader import LoadError, ModelVersion
from hotreload.worker.pacing import Pacer, no_pause
from hotreload.worker.placement import BuildPlacement
from hotreload.worker.replies import error_header, message_of, return_free_heap, user_traceback
from hotreload.worker.signatures import normalise_output
from hotreload.worker.status_report import worker_status
from hotreload.worker.text_op import op_text

_STOP = object()


class Worker:
    def __init__(self, spec: dict[str, Any], sock: socket.socket) -> None:
        self.spec = spec
        self.sock = sock
        self.max_frame = int(spec.get("max_frame_bytes", 64 * 1024 * 1024)) + 1024 * 1024
        self.send_lock = threading.Lock()
        self.state = "starting"
        self.current: ModelVersion | None = None
        self.staged: ModelVersion | None = None
        self.retired: ModelVersion | None = None
        self.device = loader.pick_device(spec.get("device", "auto"))
        self.load_q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.served = 0
        self.failed = 0
        #: Requests whose deadline passed before their turn: answered, never computed.
        self.skipped = 0
        #: Text requests (streamed or not) running or queued, by id: the flag a CANCEL sets
        #: (the reader thread registers each on arrival; worker/text_op.py drops it at its end).
        self.streams: dict[Any, threading.Event] = {}
        #: Text requests stopped by a CANCEL.
        self.cancelled = 0
        #: Requests whose forward compiled (torch.compile): the warm phase's replay avoids them.
        self.serving_compiles = 0
        compile_watch.use_cache_dir(spec, os.environ)  # the model's compile cache folder
        self.busy_since: float | None = None
        #: Seconds the serving thread has spent on requests (build pacing looks at it).
        self.busy_total = 0.0
        self.process = psutil.Process()
        self.running = True
        #: CPUs builds run on, off the serving ones (None: the model is not pinned).
        self.build_cpus: list[int] | None = spec.get("build_cpus")
        weights_digest.hash_on(self.build_cpus)  # hashing is build work, off serving CPUs

    # ------------------------------------------------------------------ plumbing

    def send(self, header: dict[str, Any], blobs: list[Any] | None = None) -> None:
        pieces = replies.reply_pieces(header, blobs or [], self.max_frame)
        with self.send_lock:
            try:
                send_frame(self.sock, pieces)
            except OSError:
                # The manager is gone; the reader loop will see EOF and exit.
                self.running = False

    def reply_error(self, rid: Any, exc: BaseException, code: str = "model_error") -> None:
        tb = None if isinstance(exc, LoadError) else user_traceback(exc)
        extra = imported_files.failure_fields(exc)  # a failed build: what it tried to import
        kind = type(exc).__name__
        self.send(error_header(rid, code, message_of(exc), traceback=tb, type=kind, **extra))

    def answer(self, rid: Any, reply: Reply) -> None:
        self.send({"id": rid, "ok": True, **reply.wire()})

    def control(self, handler: Callable[[Any, Any], None]) -> Callable[[Frame], None]:
        """A control op's handler (`handler(request, rid)`, which answers `rid`) as a queue
        entry: the header read into the op's request class (protocol/messages.py) first, a
        malformed one answered as a bad request naming the field."""

        def run(frame: Frame) -> None:
            h = frame.header
            try:
                request = OPS[h["op"]].from_wire(h)
            except ProtocolError as exc:
                self.send(error_header(h.get("id"), "bad_request", str(exc)))
                return
            handler(request, h.get("id"))

        return run

    def _thread_loop(self, q: queue.SimpleQueue[Any], name: str) -> None:
        if name == "serve":
            # Forwards only: inference mode once for the thread's life, not per request.
            with torch.inference_mode():
                self._run_queue(q)
        elif name in ("loader", "eval") and self.build_cpus is not None:
            # An eval scores a held-out set (minutes of forwards): build work, kept off the
            # serving CPUs like a load.
            self._run_queue(q, BuildPlacement(self.build_cpus))
        else:
            self._run_queue(q)

    def _run_queue(
        self, q: queue.SimpleQueue[Any], placement: BuildPlacement | None = None
    ) -> None:
        while True:
            item = q.get()
            if item is _STOP:
                return
            fn, frame = item
            rid = frame.header.get("id")
            if placement is not None:
                placement.enter()
            try:
                fn(frame)
            except BaseException as exc:
                self.reply_error(rid, exc)
            finally:
                if placement is not None:
                    placement.leave()

    # ------------------------------------------------------------------ serving

    def admit(self, h: dict[str, Any]) -> ModelVersion | None:
        """The version a request (infer, text) runs on, busy from now; or None once its
        client is told why not: nothing loaded, or past its deadline (its client had
        "timed out": computing it would only hold up those behind it, a drain among them)."""
        mv = self.current
        if mv is None:
            self.send(error_header(h["id"], "worker_unavailable", "no version is loaded yet"))
            return None
        deadline = h.get("deadline")
        if deadline is not None and time.monotonic() > deadline:
            self.skipped += 1
            self.send(error_header(h["id"], "timeout", "timed out in the worker; not computed"))
            return None
        self.busy_since = time.monotonic()
        return mv

    def op_infer(self, frame: Frame) -> None:
        h = frame.header
        mv = self.admit(h)
        if mv is None:
            return
        try:
            t0 = time.perf_counter()
            tensors = request_tensors(h["tensors"], frame.payload)
            # The router checked names, dtypes and shapes; pass them in the example's order.
            if mv.example_form == loader.FORM_SINGLE:
                names = list(tensors)
            else:
                names = [e["name"] for e in mv.input_signature]
            cpu = mv.device.type == "cpu"
            inputs = {k: tensors[k] if cpu else to_device(tensors[k], mv.device) for k in names}
            params = h.get("parameters")
            if params or mv.weights.adapters:
                try:  # `adapter` chooses one of peft's adapters (worker/adapters.py)
                    params = adapters.choose(mv, params)
                    loader.check_parameters(mv, params or {}, inputs)
                except LoadError as exc:  # an adapter left out is unavailable, not bad
                    self.send(error_header(h["id"], getattr(exc, "code", "bad_request"), str(exc)))
                    return
            compiles = compile_watch.compiles_here()
            out = loader.forward(mv, mv.example_form, inputs, params)
            self.serving_compiles += compile_watch.compiles_here() != compiles
            form, outputs, _ = normalise_output(out)
            metas, blobs = encode_tensors(outputs)  # CPU copies of device tensors, as numpy
            compute_ms = (time.perf_counter() - t0) * 1000
        except BaseException:
            self.failed += 1
            raise
        finally:
            self.busy_total += time.monotonic() - self.busy_since
            self.busy_since = None
        self.served += 1
        self.send(
            {
                "id": h["id"],
                "ok": True,
                "version": mv.version,
                "digest": mv.digest,
                "form": form,
                "tensors": metas,
                "compute_ms": compute_ms,
            },
            blobs,
        )

    # ------------------------------------------------------------------ loading

    def op_load(self, h: LoadRequest, rid: Any) -> None:
        old_roots = self._code_roots()
        if h.code:
            # Other code paths (the last good snapshot, or the live files again): imports
            # must no longer find the user's modules under the old paths.
            self.spec.update(h.code)
            new_roots = set(self._code_roots())
            loader.forget_paths([r for r in old_roots if r not in new_roots])
        roots = self._code_roots()
        compile_from_source(roots, (h.code or {}).get("sources") or ())  # its snapshot
        dropped: list[str] = []
        if reimport := must_reimport(h, roots, old_roots):  # or the code loaded is stale
            dropped = loader.drop_user_modules(old_roots + self._code_roots())
        elif not h.code and self.current is not None and "modules" in self.current.made:
            # A push runs the serving version's code, whatever a refused build left imported.
            loader.restore_user_modules(roots, self.current.made["modules"])
        if self.staged is not None:
            loader.release(self.staged)
            self.staged = None
        self.state = "loading" if self.current is None else self.state
        rss_before = self.process.memory_info().rss
        pacer = self._pacer(h.serving_elsewhere)
        # Files (or, `unchanged_files`, the shards) unchanged since the serving version read
        # them (the manager compares): share its tensors, pushes since on top.
        shard_reuse = h.unchanged_files
        reuse = self.current if (h.reuse or shard_reuse) and self.current else None
        with imported_files.tracking(roots, reimported=bool(dropped)):  # and what it tried
            mv = loader.build_version(
                self.spec,
                h.version,
                self.device,
                pacer.step_done,
                current=reuse,
                base=h.base if self.current is None else None,
                overlays=h.overlays,
                digest_now=bool(h.overlays),  # a trainer waits for the proof
                unchanged=shard_reuse if shard_reuse is not None and not h.reuse else None,
                same_code=not reimport,
                restart=h.restart,  # a broken adapter is left out (adapters.py)
            )
        if self.device.type != "cuda":  # no allocator: resident-set growth is the closest
            mv.footprint_bytes = max(0, self.process.memory_info().rss - rss_before)
        mv.made["modules"] = loader.user_modules(roots)
        self.staged = mv
        reply = LoadReply(
            load_s=mv.load_s,
            footprint_bytes=mv.footprint_bytes,
            inputs=mv.input_signature,
            input_form=mv.example_form,
            reimported=len(dropped),
            paused_s=pacer.paused_s,
            digest=mv.digest,
            digest_pending=mv.digest is None and mv.digest_future is not None,
            hashed_bytes=mv.hashed_bytes,
            overlay_leaves=mv.weights.overlay_leaves or None,
            reused=mv.weights.reused,
            mapped=mv.weights.mapped,
            shared=mv.weights.shared.descriptor() if mv.weights.shared else None,
            not_reused=mv.weights.not_reused if reuse is not None else None,
            read_files=mv.weights.read_files,
            copied=mv.copied,
            init_digests=mv.init_digests,
            adapters=mv.weights.adapters.wire() if mv.weights.adapters else None,
            imports=imported_files.imported_files(roots),
            libraries=imported_files.libraries() if reimport else [],
        )
        self.answer(rid, reply)

    def _pacer(self, serving_elsewhere: bool) -> Pacer:
        """Paces a build on the loader thread while this worker's serving thread is busy,
        or, in a standby (nothing serves here), while the manager says another worker of
        this model is serving requests (`serving_elsewhere`): they share the CPU."""
        busy: Callable[[], float] = self._serving_busy_seconds
        if serving_elsewhere and self.current is None:
            busy = time.monotonic  # busy for the whole of every step
        return Pacer(float(self.spec.get("build_pace") or 0.0), busy)

    def _serving_busy_seconds(self) -> float:  # on requests, the one running included
        since = self.busy_since
        return self.busy_total + (time.monotonic() - since if since is not None else 0.0)

    def _code_roots(self) -> list[Any]:
        return code_roots(self.spec)

    def _target(self, name: str) -> ModelVersion:
        mv = {"staged": self.staged, "current": self.current}.get(name)
        if mv is None:
            raise LoadError(f"no {name} version to act on")
        return mv

    def op_warm(self, h: WarmRequest, rid: Any) -> None:
        mv = self._target(h.target)
        if self.current is None:
            self.state = "warming"
        # Re-warming the serving version runs on its own thread, between requests: no pacing.
        pacer = self._pacer(h.serving_elsewhere) if mv is not self.current else None
        iters = h.iters if h.iters is not None else int(self.spec.get("warmup_iters", 3))
        # The version it replaces compiled: a CPU replay is worth it even when this one's
        # example passes hit dynamo's caches and compiled nothing.
        before = self.current if self.current is not mv else None
        loader.warm(
            mv,
            iters,
            pacer.step_done if pacer else no_pause,
            h.shapes,
            h.replay_budget_s,
            compiled_before=before is not None and before.compile is not None,
        )
        reply = WarmReply(mv.warm_s, mv.warm_passes_ms, pacer.paused_s if pacer else 0.0)
        self.answer(rid, compile_watch.warm_reply(reply, mv))

    def op_smoke(self, h: SmokeRequest, rid: Any) -> None:
        mv = self._target(h.target)
        previous = (
            self.current.output_signature if self.current and self.current is not mv else None
        )
        if previous is None and h.previous_outputs:
            previous = h.previous_outputs
        pacer = self._pacer(h.serving_elsewhere)
        example: list[dict[str, Any]] = []  # the smoke test's outputs: no second forward
        sig = loader.smoke(
            mv,
            previous,
            allow_output_change=bool(self.spec.get("allow_output_change")),
            expected=self.spec.get("expected_output"),
            seen=lambda outputs: example.append(golden_run.snapshot(outputs)),
        )
        # The golden inputs, compared engine-side with the serving version's (golden_run.py):
        # their raw bytes are the reply's payload.
        golden, blobs, too_big = golden_run.run(
            mv, self.spec, loader.forward, pacer.step_done, example[0] if example else None
        )
        imports = imported_files.imported_files(self._code_roots())  # forward's own too
        notes = [*mv.notes, *([too_big] if too_big else [])]
        reply = SmokeReply(outputs=sig, notes=notes, imports=imports, golden=golden)
        pacer.step_done()
        reply.paused_s = pacer.paused_s
        self.send({"id": rid, "ok": True, **reply.wire()}, blobs)

    # ------------------------------------------------------------------ control (reader thread)

    def op_swap(self, h: SwapRequest, rid: Any) -> None:
        if self.staged is None:
            raise LoadError("swap asked for but no version is staged")
        sync = None
        if h.inband:
            # In-band swap, on the serving thread: every request sent before it has finished
            # (the drain): only the old version's own and registered streams may still hold
            # work. Polled to the deadline before the new version serves.
            sync = replies.sync_version(self.device, self.current, h.sync_deadline_s)
            if not sync.skipped and not sync.idle:
                busy = ", ".join(sync.busy)
                message = f"stream(s) still busy after the sync deadline: {busy}"
                self.send(error_header(rid, "streams_busy", message, sync=sync.wire()))
                return
        if self.current is not None:
            # Under the resource policy the old version was offloaded to `retired` already.
            if self.retired is not None:
                loader.release(self.retired)
            self.retired = self.current
        self.current, self.staged = self.staged, None
        self.state = "serving"
        self.answer(rid, SwapReply(self.current.version, sync))

    def op_release(self, h: ReleaseRequest, rid: Any) -> None:
        which = h.which
        if which not in ("retired", "staged", "current"):
            raise LoadError(f"release of {which!r}: say retired, staged or current")
        mv = getattr(self, which)
        setattr(self, which, None)
        if which == "current":
            self.state = "unloaded"
        if self.device.type == "cpu":  # no count to report: the reply first, as unmapping
            self.answer(rid, FreedReply(0))  # 1 GiB takes 0.14 s a reload need not wait for
            replies.after_reply(loader.release, mv)
            if mv is not None:
                return_free_heap()  # else RSS steps up with each in-place reload
            return
        before = loader.allocated_bytes(self.device)
        loader.release(mv)
        self.answer(rid, FreedReply(max(0, before - loader.allocated_bytes(self.device))))

    def op_retire(self, h: RetireRequest, rid: Any) -> None:
        """Drop every version and wait idle: this worker, retired after a respawn reload,
        becomes the standby that builds the next version (no fresh process, no torch import).
        The manager sends it only after this worker's streams synced idle."""
        if self.busy_since is not None:
            raise LoadError("retire asked for while a request is running")
        before = loader.allocated_bytes(self.device)
        for mv in (self.current, self.staged, self.retired):
            loader.release(mv)
        self.current = self.staged = self.retired = None
        self.state = "standby"
        freed = max(0, before - loader.allocated_bytes(self.device))
        self.answer(rid, FreedReply(freed))
        if self.device.type == "cpu":
            # After the reply: the reload need not wait. An idle standby should not sit on
            # the old model's memory.
            return_free_heap()

    def op_offload(self, h: OffloadRequest, rid: Any) -> None:
        mv = self._target("current")
        loader.offload(mv)
        self.retired, self.current = mv, None
        self.state = "loading"
        self.answer(rid, Done())

    def op_restore(self, h: RestoreRequest, rid: Any) -> None:
        if self.retired is None:
            raise LoadError("nothing to restore")
        loader.restore(self.retired)
        loader.release(self.staged)  # None: nothing to release
        self.current, self.retired, self.staged = self.retired, None, None
        self.state = "serving"
        self.answer(rid, RestoreReply(self.current.version))

    def op_sync(self, h: SyncRequest, rid: Any) -> None:
        mv = {"retired": self.retired, "current": self.current}.get(h.which)
        self.answer(rid, replies.sync_version(self.device, mv, h.deadline_s))

    def op_save(self, h: SaveRequest, rid: Any) -> None:
        """The serving version's weights into a folder (worker/save_weights.py), on the
        loader thread: a big save never holds up the control ops or the requests."""
        mv = self.current
        if mv is None:
            raise LoadError("no version serves: nothing to save")
        reply = save_weights.save_version(
            mv.model, mv.version, Path(h.folder), name=h.model, digest=h.digest
        )
        self.answer(rid, reply)

    def op_eval(self, h: EvalRequest, rid: Any) -> None:
        """The config's eval on the serving version (worker/eval_run.py), on the eval
        thread: a slow one holds up neither requests nor builds."""
        mv = self.current
        if mv is None or mv.version != h.version:
            serving = f"v{mv.version} serves" if mv is not None else "no version serves"
            raise LoadError(f"eval of v{h.version} not run: {serving} now")
        self.answer(rid, eval_run.run_eval(mv.model, mv.version, self.spec))

    def op_digest(self, h: DigestRequest, rid: Any) -> None:
        """The serving version's digest, answered once its hashing is done (from the
        hashing thread: no worker thread waits for it, and no build thread wakes up)."""
        mv = self.current
        fut = mv.digest_future if mv is not None else None
        if fut is None:
            self.answer(rid, DigestReply(mv.digest if mv else None))
            return

        def answer(done: Any) -> None:
            if done.exception() is not None:
                self.reply_error(rid, done.exception())
            else:
                self.answer(rid, replies.digest_reply(mv, done.result()))

        fut.add_done_callback(answer)

    def op_cancel(self, h: CancelRequest, rid: Any) -> None:
        """On the reader thread, so it lands while the serving thread decodes: the text
        request's decode loop stops at its next token (worker/text_op.py answers it
        `cancelled`)."""
        flag = self.streams.get(h.target)
        if flag is not None:
            flag.set()
        self.answer(rid, Done())

    def op_status(self, h: StatusRequest, rid: Any) -> None:
        if h.collect:
            # A settled figure for leak checks: collect every generation, drop cached blocks.
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        self.answer(rid, StatusReply(**worker_status(self), cancelled=self.cancelled))

    # ------------------------------------------------------------------ main loop

    def run(self) -> int:
        threads = self.spec.get("threads")
        if threads:
            torch.set_num_threads(int(threads["intra_op"]))
            try:
                torch.set_num_interop_threads(int(threads["inter_op"]))
            except RuntimeError:
                pass  # already set by an earlier parallel op; intra-op count still applies
        # A reader (this thread) hands each frame to the thread that owns it: forwards to the
        # serving thread, loads, staged warm-ups and smoke tests to the loader thread, control
        # requests (status, swap, sync, release) to the control thread. So no load ever runs
        # on the serving path, and a forward stuck in a kernel still lets status and a reload
        # through (the manager then decides to kill this process).
        serve_q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        control_q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        eval_q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        queues = {"serve": serve_q, "loader": self.load_q, "control": control_q, "eval": eval_q}
        for name, q in queues.items():
            threading.Thread(
                target=self._thread_loop, args=(q, name), name=f"hotreload-{name}", daemon=True
            ).start()
        # A WorkerOp hashes and compares as its string: a header's plain `op` finds its route.
        routes: dict[WorkerOp, tuple[queue.SimpleQueue[Any], Callable[[Frame], None]]] = {
            WorkerOp.INFER: (serve_q, self.op_infer),
            WorkerOp.TEXT: (serve_q, lambda f: op_text(self, f)),  # completions, tokenizer
            WorkerOp.LOAD: (self.load_q, oom.while_building(self.control(self.op_load))),
            WorkerOp.SMOKE: (self.load_q, self.control(self.op_smoke)),
            WorkerOp.SWAP: (control_q, self.control(self.op_swap)),
            WorkerOp.RELEASE: (control_q, self.control(self.op_release)),
            WorkerOp.OFFLOAD: (control_q, self.control(self.op_offload)),
            WorkerOp.RETIRE: (control_q, self.control(self.op_retire)),
            WorkerOp.RESTORE: (control_q, self.control(self.op_restore)),
            WorkerOp.SYNC: (control_q, self.control(self.op_sync)),
            WorkerOp.STATUS: (control_q, self.control(self.op_status)),
            WorkerOp.DIGEST: (control_q, self.control(self.op_digest)),
            WorkerOp.SAVE: (self.load_q, self.control(self.op_save)),
            WorkerOp.EVAL: (eval_q, self.control(self.op_eval)),
            WorkerOp.PING: (control_q, self.control(lambda h, rid: self.answer(rid, Done()))),
        }
        swap, warm = self.control(self.op_swap), self.control(self.op_warm)
        cancel, text = self.control(self.op_cancel), routes[WorkerOp.TEXT][1]
        self.send(
            {"id": 0, "ok": True, "hello": True, "pid": os.getpid(), "device": str(self.device)}
        )
        # A frame too large to read is answered (by its id) and skipped: answer_bad.
        reader = SocketFrameReader(self.sock, self.max_frame, replies.answer_bad(self.send))
        while self.running:
            try:
                frame = reader.read()
            except (ConnectionError, OSError):
                break
            op = frame.header.get("op")
            if op == WorkerOp.SHUTDOWN:
                self.send({"id": frame.header.get("id"), "ok": True})
                break
            if op == WorkerOp.SWAP and frame.header.get("inband"):
                serve_q.put((swap, frame))
            elif op == WorkerOp.WARM:
                # Re-warming the serving version shares its thread; a staged one, the loader's.
                current = frame.header.get("target") == "current"
                (serve_q if current else self.load_q).put((warm, frame))
            elif op == WorkerOp.CANCEL:
                cancel(frame)
            elif op == WorkerOp.TEXT:
                # Registered before it queues: a CANCEL that comes first still finds it
                # (a stream's client gone, or any text request's deadline passed).
                self.streams[frame.header.get("id")] = threading.Event()
                serve_q.put((text, frame))
            elif op in routes:
                q, fn = routes[op]
                q.put((fn, frame))
            else:
                rid = frame.header.get("id")
                self.send(error_header(rid, "bad_request", f"unknown op {op!r}"))
        for q in queues.values():
            q.put(_STOP)
        return 0


def run_worker(spec: dict[str, Any], fd: int) -> int:
    sock = socket.socket(fileno=fd)
    np.seterr(all="ignore")
    # The loader thread and the serving thread share the GIL: a shorter switch interval lets
    # a request through within ~0.5 ms of arriving during a load, not the default 5 ms.
    sys.setswitchinterval(0.0005)
    try:
        worker = Worker(spec, sock)
    except LoadError as exc:
        send_frame(sock, pack_frame(error_header(0, "model_error", str(exc))))
        return 1
    code = worker.run()
    sys.stdout.flush()
    # Exit without waiting for daemon threads stuck in a forward: the manager decided to stop.
    os._exit(code)
