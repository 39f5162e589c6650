"""Events are objects end to end: the bus hands each subscriber the event dataclass itself
(its time on it), consumers match on the class, and the dict form exists only at the edges:
an events.jsonl line and the socket's `events` stream (which the remote dashboard turns back
into the same objects)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from hotreload.commands import dashboard_ops
from hotreload.commands.watch_session import WatchSession
from hotreload.config import load_config
from hotreload.engine.event_kinds import (
    BaseEvent,
    LockWait,
    PhaseEnd,
    Ready,
    ReloadDone,
    SessionLost,
    State,
)
from hotreload.engine.events import EventBus
from hotreload.protocol.framing import Frame
from hotreload.tui.remote import RemoteSource
from tests.support import make_project

PACKAGE = Path(__file__).resolve().parent.parent / "hotreload"
#: The modules where an event is a dict: events.py makes and reads the form, the socket's
#: `events` op sends it, and its readers (the remote dashboard, `hotreload reload`, `hotreload
#: report` reading events.jsonl) turn it back into the dataclass straight away.
EDGES = {
    "engine/events.py",
    "commands/dashboard_ops.py",
    "tui/remote.py",
    "commands/reload.py",
    "commands/report_log.py",
}
DICT_FORM = {"as_dict", "from_dict", "typed"}


def done(version: int, **fields: Any) -> ReloadDone:
    return ReloadDone(
        model="mlp",
        version=version,
        total_s=0.25,
        policy="availability",
        strategy="inplace",
        phases={"load": 0.125},
        trigger="file",
        **fields,
    )


def test_a_subscriber_gets_the_object_the_engine_made(tmp_path: Path) -> None:
    bus = EventBus(tmp_path / "events.jsonl")
    seen: list[BaseEvent] = []
    bus.subscribe(seen.append)
    made = done(2)
    bus.emit(made)
    bus.emit("phase_end", model="mlp", phase="load", duration_s=0.5, ok=True)
    bus.close()
    assert seen[0] is made
    match seen[1]:
        case PhaseEnd(model="mlp", phase="load", duration_s=0.5, ok=True) as p:
            assert isinstance(p.ts, float) and p.ts >= made.ts
        case other:
            raise AssertionError(f"a PhaseEnd, not {other!r}")


def test_an_events_jsonl_line_keeps_its_bytes(tmp_path: Path) -> None:
    """The file's shape is what `hotreload report` and other readers parse: `ts`, `kind`,
    then the fields in declaration order, an optional None left out."""
    bus = EventBus(tmp_path / "events.jsonl")
    bus.emit(Ready(model="mlp", version=2, device="cpu", pid=7, load_s=1.5, warm_s=0.25, ts=12.5))
    bus.emit(done(3, digest="sha256:ab", ts=13.0))
    bus.close()
    assert (tmp_path / "events.jsonl").read_bytes() == (
        b'{"ts": 12.5, "kind": "ready", "model": "mlp", "version": 2, "device": "cpu", '
        b'"pid": 7, "load_s": 1.5, "warm_s": 0.25}\n'
        b'{"ts": 13.0, "kind": "reload_done", "model": "mlp", "version": 3, "total_s": 0.25, '
        b'"policy": "availability", "strategy": "inplace", "phases": {"load": 0.125}, '
        b'"trigger": "file", "digest": "sha256:ab"}\n'
    )


def test_watch_session_leaves_its_failed_start_on_the_reload_done_object(
    tmp_path: Path,
) -> None:
    ws = WatchSession(load_config(make_project(tmp_path)))
    try:
        ws.start_state, ws.start_error = "failed", {"phase": "load", "error": "boom"}
        for host in ws.session.models.values():
            host.record.state = "serving"  # the fix came up
        ws.session.events.emit(State(model="mlp", state="serving"))
        assert ws.start_state == "failed"  # only a reload's outcome says so
        ws.session.events.emit(done(2))
        assert (ws.start_state, ws.start_error) == ("started", None)
    finally:
        ws.session.events.close()


def test_the_socket_stream_sends_the_files_dict_and_the_dashboard_gets_the_objects_back(
    tmp_path: Path,
) -> None:
    """The edge both ways, without a socket: the `events` op's frames carry exactly the
    events.jsonl lines (history marked `replayed`), and RemoteSource turns each back into
    the object the engine emitted, with its time, telling history from live."""
    ws = WatchSession(load_config(make_project(tmp_path)))
    dashboard_ops.register(ws)
    bus = ws.session.events
    try:
        before = bus.emit(done(2))
        frames: list[dict[str, Any]] = []

        def push(header: dict[str, Any]) -> bool:
            frames.append(header)
            return True  # still reading

        stop = ws.session.endpoint.stream_handlers["events"]({"replay": 1}, push)
        live = bus.emit(LockWait(model="mlp", device="cpu", message="waiting for the lock"))
        stop()
        bus.emit(done(3))  # after the subscriber left: not sent
    finally:
        bus.close()
    lines = [json.loads(line) for line in bus.path.read_text().splitlines()]
    assert [f["event"] for f in frames] == lines[-3:-1]
    assert [bool(f.get("replayed")) for f in frames] == [True, False]

    remote = RemoteSource(tmp_path / "no.sock")
    got: list[tuple[BaseEvent, bool]] = []
    remote.subscribe(lambda event, replayed: got.append((event, replayed)))
    for header in frames:
        remote._on_frame(Frame(header, b""))
    remote._on_frame(Frame({"ok": True, "event": {"ts": 1.0, "kind": "from_a_newer_one"}}, b""))
    remote._on_frame(None)  # the session went away
    assert got[:2] == [(before, True), (live, False)]
    assert [e.ts for e, _ in got[:2]] == [before.ts, live.ts]
    ((lost, replayed),) = got[2:]  # the unknown kind is left out
    assert isinstance(lost, SessionLost) and not replayed


def test_the_dict_form_is_used_only_at_the_edges() -> None:
    """A subscriber that rebuilt the object (or read a dict) would import these."""
    users = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module == "hotreload.engine.events"
                and DICT_FORM & {a.name for a in node.names}
            ):
                users.add(str(path.relative_to(PACKAGE)))
    assert users <= EDGES, sorted(users - EDGES)
    assert users == EDGES - {"engine/events.py"}, "an edge no longer reads or writes the dict?"
