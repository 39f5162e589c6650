"""File watching: editor saves in, one reload request per affected model out.

Folders are watched recursively (editors replace files, so a watch on a file is lost after
the first save). A burst of events is coalesced by a quiet window and capped by a maximum
window, like watchfiles' 50 ms step and 1.6 s cap. Content hashes decide whether anything
changed: a touch, or a save that writes the same bytes, reloads nothing (files of 32 MiB
and more are compared by inode, size and times instead: see HASH_BELOW_BYTES).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from hotreload.config import Config, ModelConfig
from hotreload.engine.event_kinds import (
    BaseEvent,
    ChangeDetected,
    FileUnused,
    WatchError,
    Watching,
    WatchPaused,
    WatchResumed,
    WatchWaiting,
)
from hotreload.engine.events import EventBus
from hotreload.engine.file_stamp import FileStamp
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.used_files import under, watch_roots
from hotreload.engine.watch_routes import Change, Routes, UsesOf

INOTIFY_ADVICE = (
    "raise the limit (sudo sysctl fs.inotify.max_user_watches=524288; add it to "
    "/etc/sysctl.conf to keep it), narrow the models' `watch` paths, or set "
    "`[watch] poll = true`; falling back to polling now"
)


OnChange = Callable[[Change], Awaitable[Any]]


@dataclass(frozen=True)
class _Fingerprint:
    #: A save changes it (file_stamp.py); while it holds, the content is not read again.
    stamp: FileStamp
    digest: str


#: Files above this are compared by their stat, not their content: hashing a 1 GiB
#: checkpoint on every save cost ~0.5 s of the reload (benchmarks/scale.py). A save of the
#: same bytes into such a file reloads once, which costs less than hashing every save.
HASH_BELOW_BYTES = 32 * 2**20


def _fingerprint(path: Path) -> _Fingerprint | None:
    try:
        st = path.stat()
        if not path.is_file():
            return None
        if st.st_size >= HASH_BELOW_BYTES:
            digest = f"stat:{FileStamp.of_stat(st)}"
        else:
            with path.open("rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None
    return _Fingerprint(FileStamp.of_stat(st), digest)


class _Handler(FileSystemEventHandler):
    def __init__(self, loop: asyncio.AbstractEventLoop, sink: Callable[[str], None]) -> None:
        self.loop = loop
        self.sink = sink

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return
        paths = [event.src_path]
        if event.event_type == "moved":
            # The destination is the edit (an atomic save renames a temp file over it).
            paths.append(event.dest_path)
        for p in paths:
            text = os.fsdecode(p)
            try:
                self.loop.call_soon_threadsafe(self.sink, text)
            except RuntimeError:
                return  # the loop is closed: shutting down


class FileWatcher:
    def __init__(
        self,
        config: Config,
        on_change: OnChange,
        events: EventBus,
        *,
        rules_for: Callable[[ModelConfig], IgnoreRules],
        quiet_s: float | None = None,
        max_wait_s: float | None = None,
        poll: bool | None = None,
        uses: UsesOf | None = None,
    ) -> None:
        """`uses`: the files a model's serving version uses (used_files.files_used); None
        (a watcher without a session) reloads a model on every file in its watch paths."""
        self.config = config
        self.on_change = on_change
        #: Called when the config file's content changed; returns the models it built anew
        #: (a settings edit that rebuilds them), which read every file as it is now.
        self.on_config_change: Callable[[], Awaitable[frozenset[str]]] | None = None
        self.events = events
        self.quiet_s = config.watch.quiet_ms / 1000 if quiet_s is None else quiet_s
        self.max_wait_s = config.watch.max_wait_ms / 1000 if max_wait_s is None else max_wait_s
        self.poll = config.watch.poll if poll is None else poll
        self._rules_for = rules_for
        self.rules = {m.name: rules_for(m) for m in config.models}
        self.routes = Routes(config, self.rules, uses)
        #: model -> its reload this watcher asked for and that has not finished.
        self._reloading: dict[str, asyncio.Future[Any]] = {}
        self.paused = False
        self._observer: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[Path] = set()
        self._first_at: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._baseline: dict[Path, _Fingerprint | None] = {}
        #: True once `prime` took the baseline of the files the models are about to load.
        self._primed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        #: root -> its watch (to schedule it again after the folder is deleted and back).
        self._watches: dict[Path, Any] = {}
        self._gone: set[Path] = set()
        self._handler: _Handler | None = None
        self.flushes = 0
        #: While paused: the files whose content differs from what is loaded (applied on
        #: resume; the dashboard shows how many).
        self.waiting: set[Path] = set()

    # ------------------------------------------------------------------ what to watch

    def roots(self) -> list[Path]:
        """Folders to watch recursively: model watch paths, plus folders of outside weights."""
        folders: set[Path] = set()
        for m in self.config.models:
            folders.update(p if p.is_dir() else p.parent for p in watch_roots(m))
            folders.update(w.parent for w in m.weight_files)
        # A folder inside another watched one is covered already.
        return sorted(f for f in folders if not any(o != f and o in f.parents for o in folders))

    def _tracked_files(self) -> Iterable[Path]:
        return self.routes.tracked_files(self._walk_error)

    def _walk_error(self, exc: OSError) -> None:
        self._emit_threadsafe(
            WatchError(
                error=f"cannot read folder {exc.filename}: {exc.strerror}; fix its permissions "
                "or remove it from the model's `watch` paths"
            )
        )

    def _emit_threadsafe(self, event: BaseEvent) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(lambda: self.events.emit(event))
        else:
            self.events.emit(event)

    def _take_baseline(self) -> dict[Path, _Fingerprint | None]:
        return {p: _fingerprint(p) for p in set(self._tracked_files())}

    # ------------------------------------------------------------------ lifecycle

    async def prime(self) -> None:
        """Fingerprint the files before the models load them. `start` (after the load)
        then reloads whatever was saved in between: a long load must not lose an edit."""
        self._baseline = await asyncio.to_thread(self._take_baseline)
        self._primed = True

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if not self._primed:
            self._baseline = await asyncio.to_thread(self._take_baseline)
        handler = self._handler = _Handler(self._loop, self._on_event)
        roots = [r for r in self.roots() if self._readable(r)]
        if not self.poll:
            try:
                self._observer = self._start_observer(Observer(), handler, roots)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EMFILE):
                    self.events.emit(
                        WatchError(error=f"inotify watch limit reached ({exc}); {INOTIFY_ADVICE}")
                    )
                else:
                    self.events.emit(
                        WatchError(error=f"cannot watch with inotify ({exc}); polling instead")
                    )
                self.poll = True
        if self.poll:
            interval = self.config.watch.poll_interval_ms / 1000
            self._observer = self._start_observer(PollingObserver(timeout=interval), handler, roots)
        # Emitters set up their watches on their own threads: wait for them, or a save right
        # after start-up would go unseen.
        await asyncio.to_thread(_wait_for_emitters, self._observer, 5.0)
        self._say_watching(roots)
        if self._primed:
            self._primed = False
            self._spawn(self._dispatch_all())  # what was saved while the models loaded

    def _say_watching(self, roots: list[Path]) -> None:
        self.events.emit(
            Watching(
                paths=[str(r) for r in roots],
                files=len(self._baseline),
                quiet_ms=round(self.quiet_s * 1000),
                max_wait_ms=round(self.max_wait_s * 1000),
                mode="polling" if self.poll else "inotify",
            )
        )

    async def _dispatch_all(self) -> None:
        """Compare every known and tracked file with the baseline; reload what changed."""
        paths = await asyncio.to_thread(lambda: set(self._tracked_files()) | set(self._baseline))
        await self._dispatch(paths)

    def _readable(self, root: Path) -> bool:
        if os.access(root, os.R_OK | os.X_OK):
            return True
        self.events.emit(
            WatchError(
                error=f"cannot read folder {root}: permission denied; fix its permissions or "
                "remove it from the model's `watch` paths (it is not watched)"
            )
        )
        return False

    def _start_observer(self, observer: Any, handler: _Handler, roots: list[Path]) -> Any:
        try:
            for root in roots:
                self._watches[root] = observer.schedule(handler, str(root), recursive=True)
            if not under(self.config.path.parent, roots):  # the config's folder, watched flat
                observer.schedule(handler, str(self.config.path.parent), recursive=False)
            observer.start()
        except BaseException:
            with contextlib.suppress(Exception):
                observer.stop()
            raise
        return observer

    async def use_config(self, config: Config) -> None:
        """The config a model serves with after an edit of its section: routes and ignore
        rules from it, the files it adds fingerprinted, and a folder it adds (a weights file
        elsewhere, a `watch` path) watched from now on."""
        self.config = config
        self.rules = {m.name: self._rules_for(m) for m in config.models}
        self.routes = Routes(config, self.rules, self.routes.uses)
        known = set(self._baseline)  # only the files it adds are read (the rest were)
        added = await asyncio.to_thread(lambda: set(self._tracked_files()) - known)
        self._baseline.update(await asyncio.to_thread(lambda: {p: _fingerprint(p) for p in added}))
        if self._observer is None or self._handler is None:
            return
        for root in self.roots():
            if not under(root, self._watches) and self._readable(root):
                watch = self._observer.schedule(self._handler, str(root), recursive=True)
                self._watches[root] = watch

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._observer is not None:
            observer, self._observer = self._observer, None
            observer.stop()
            await asyncio.to_thread(observer.join, 5.0)
        for task in list(self._tasks):
            task.cancel()

    def pause(self) -> None:
        self.paused = True
        self._pending.clear()
        self.waiting.clear()
        self.events.emit(WatchPaused())

    async def resume(self) -> None:
        """Reload what was edited while paused (compared with what is loaded)."""
        self.paused = False
        waiting, self.waiting = len(self.waiting), set()
        self.events.emit(WatchResumed(waiting=waiting))
        self._spawn(self._dispatch_all())

    # ------------------------------------------------------------------ coalescing

    def _on_event(self, text: str) -> None:
        if self._loop is None:
            return
        path = Path(text)
        if path in self._watches and path not in self._gone and not path.is_dir():
            self._root_gone(path)
        if path != self.config.path and not self.routes.watched(path):
            return
        if self.paused:
            self._spawn(self._count_waiting(path))
            return
        now = time.monotonic()
        if self._first_at is None:
            self._first_at = now
            # Marks the start of the debounce window (benchmarks split detect / debounce).
            self.events.emit(ChangeDetected(path=text))
        self._pending.add(path)
        if self._timer is not None:
            self._timer.cancel()
        due = min(now + self.quiet_s, self._first_at + self.max_wait_s)
        self._timer = self._loop.call_at(self._loop.time() + (due - now), self._flush)

    def _root_gone(self, root: Path) -> None:
        """A watched folder was deleted: its inotify watch went with it, so say so, and
        watch it again once it is back (an editor's or a git checkout's re-creation)."""
        self._gone.add(root)
        self.events.emit(
            WatchError(
                error=f"the watched folder {root} was deleted: edits in it are not seen until it "
                "is back; watching it again once it is re-created"
            )
        )
        self._spawn(self._rewatch(root))

    async def _rewatch(self, root: Path, interval_s: float = 0.2) -> None:
        while self._observer is not None and not root.is_dir():
            await asyncio.sleep(interval_s)
        observer = self._observer
        if observer is None or self._handler is None:
            return
        old = self._watches.pop(root, None)
        if old is not None:
            # Its emitter may have stopped when the folder went.
            with contextlib.suppress(KeyError, OSError, RuntimeError):
                observer.unschedule(old)
        try:
            self._watches[root] = observer.schedule(self._handler, str(root), recursive=True)
        except OSError as exc:
            self.events.emit(WatchError(error=f"cannot watch {root} again ({exc})"))
            return
        finally:
            self._gone.discard(root)
        await asyncio.to_thread(_wait_for_emitters, observer, 5.0)
        self._say_watching([root])
        await self._dispatch_all()  # what changed while it was gone (or came back changed)

    def _flush(self) -> None:
        paths, self._pending = self._pending, set()
        self._first_at, self._timer = None, None
        if paths:
            self._spawn(self._dispatch(paths))

    def _expand(self, paths: set[Path]) -> set[Path]:
        """Add the files known under a folder event's path: a folder moved out of the tree
        (or deleted by a rename) gets one event for itself and none for the files in it."""
        out = set(paths)
        for p in paths:
            if p in self._baseline and not p.is_dir():
                continue  # a file we know: the common case, no scan
            out.update(q for q in list(self._baseline) if p in q.parents)
        return out

    async def _count_waiting(self, path: Path) -> None:
        """Paused: note whether `path` now differs from what is loaded (off the loop), and
        say so when the count changes. Nothing reloads until resume."""

        def differs() -> dict[Path, bool]:
            found = self._expand({path}) - {self.config.path}
            return {p: self._compare(p)[0] for p in found if self.routes.models_for(p)}

        found = await asyncio.to_thread(differs)
        before = len(self.waiting)
        for p, changed in found.items():
            if changed and self.paused:
                self.waiting.add(p)
            else:
                self.waiting.discard(p)
        if len(self.waiting) != before and self.paused:
            self.events.emit(WatchWaiting(waiting=len(self.waiting)))

    def _spawn(self, coro: Awaitable[Any]) -> None:
        """Run `coro` in the background; `stop` cancels it."""
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _compare(self, p: Path) -> tuple[bool, _Fingerprint | None, bool]:
        """(content differs from the baseline, new fingerprint, stat unchanged so the
        fingerprint was not read)."""
        old = self._baseline.get(p)
        stamp = FileStamp.of(p)
        same_stat = old is not None and stamp is not None and old.stamp == stamp
        if same_stat:
            return False, old, True
        new = _fingerprint(p)
        return (old and old.digest) != (new and new.digest), new, False

    def _diff(self, paths: set[Path]) -> list[Path]:
        """Paths whose content differs from the last seen (deleted counts as changed)."""
        changed = []
        for p in sorted(self._expand(paths)):
            differs, new, unread = self._compare(p)
            if unread:
                continue
            self._baseline[p] = new
            if differs:
                changed.append(p)
        return changed

    async def _dispatch(self, paths: set[Path]) -> None:
        changed = await asyncio.to_thread(self._diff, paths)
        self.flushes += 1
        if not changed:
            return
        rebuilt: frozenset[str] = frozenset()
        if self.config.path in changed and self.on_config_change is not None:
            rebuilt = await self.on_config_change()
        per_model, unused = self.routes.split([p for p in changed if p != self.config.path])
        # A model the config edit built anew read this flush's files: a weights file saved
        # with the edit that names it would otherwise build the same version twice.
        per_model = {m: c for m, c in per_model.items() if m not in rebuilt}
        # Reloads asked for before this flush may import a file this flush found unused.
        earlier = {m: f for m, f in self._reloading.items() if m not in per_model}
        await asyncio.gather(*(self._reload(c) for c in per_model.values()))
        if unused:
            await self._unused(unused, earlier)

    async def _reload(self, change: Change) -> None:
        done = asyncio.get_running_loop().create_future()
        self._reloading[change.model] = done
        try:
            await self.on_change(change)
        finally:
            done.set_result(None)
            if self._reloading.get(change.model) is done:
                del self._reloading[change.model]

    async def _unused(self, paths: list[Path], earlier: dict[str, asyncio.Future[Any]]) -> None:
        """Files no model used when they changed. Once the reloads running meanwhile are
        done (this flush's read them as saved): one that a reload asked for before this
        edit made used reloads its model again (it may have read the file before the
        edit); the rest are said once each, as used by no model."""
        await asyncio.gather(*earlier.values())
        again, unused = self.routes.split(paths, only=set(earlier))
        for p in self.routes.newly_unused(unused):
            self.events.emit(FileUnused(path=str(p)))
        await asyncio.gather(*(self._reload(c) for c in again.values()))


def _wait_for_emitters(observer: Any, timeout_s: float) -> None:
    """Until every emitter has its inotify watch (or first polling snapshot) in place."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(_emitter_ready(e) for e in list(getattr(observer, "emitters", ()))):
            return
        time.sleep(0.005)


def _emitter_ready(emitter: Any) -> bool:
    if hasattr(emitter, "_inotify"):
        return emitter._inotify is not None
    if hasattr(emitter, "_snapshot"):  # polling: the first real snapshot replaces the empty one
        return type(emitter._snapshot).__name__ != "EmptyDirectorySnapshot"
    return True
