"""Typed events (engine/event_kinds.py): a kind or a field nobody declared fails at the
call, subscribers get the event object itself, every event goes through events.jsonl and
comes back the same (its time too), and every `emit` in the source names a declared kind
with declared fields (so the two cannot drift apart)."""

from __future__ import annotations

import ast
import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hotreload.engine.event_kinds import EVENT_TYPES, RESERVED, BaseEvent, ModelEvent, Ready
from hotreload.engine.events import EventBus, as_dict, build, from_dict

PACKAGE = Path(__file__).resolve().parent.parent / "hotreload"
#: Calls whose first argument is an event kind (or an event), and whose keywords its fields.
EMITTERS = {"emit", "emit_once", "_emit_threadsafe"}
CLASSES = {cls.__name__: cls for cls in EVENT_TYPES.values()}

#: A JSON value for each field type the kinds use (a kind with a new type adds one here).
VALUES: dict[str, Any] = {
    "str": "text",
    "int": 3,
    "float": 0.25,
    "bool": True,
    "list[str]": ["a", "b"],
    "list[int]": [0, 1],
    "list[float]": [1.5, 2.0],
    "dict[str, float]": {"load": 0.5, "warm": 0.125},
    "dict[str, list[int]]": {"mlp": [0, 1]},
    "dict[str, Any]": {"compiles": 2, "seconds": 1.5, "hits": 1, "misses": 1, "reasons": []},
    "list[dict[str, Any]]": [{"name": "kmsg", "active": False, "reason": "no access"}],
}


def sample(cls: type[BaseEvent], *, optional: bool) -> BaseEvent:
    """An event of `cls`: every field set, or (`optional` False) only the required ones."""
    fields = {}
    for f in own_fields(cls):
        if optional or f.name in cls.required_fields:
            kind = str(f.type).removesuffix(" | None")
            assert kind in VALUES, f"{cls.kind}.{f.name}: add a sample value for {kind!r}"
            fields[f.name] = VALUES[kind]
    return cls(**fields)


def own_fields(cls: type[BaseEvent]) -> list[dataclasses.Field[Any]]:
    """The kind's fields: all but BaseEvent's `ts`, which every event has."""
    return [f for f in dataclasses.fields(cls) if f.name in cls.field_names]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------------- the registry


def test_each_kind_is_a_frozen_keyword_only_dataclass_with_json_fields() -> None:
    assert len(EVENT_TYPES) >= 40
    for kind, cls in EVENT_TYPES.items():
        assert cls.kind == kind and dataclasses.is_dataclass(cls)
        params = cls.__dataclass_params__  # type: ignore[attr-defined]
        assert params.frozen, kind
        # Every field but the time every event carries (BaseEvent's, not the kind's).
        assert [f.name for f in dataclasses.fields(cls) if f.name not in cls.field_names] == ["ts"]
        for f in own_fields(cls):
            assert f.name not in RESERVED, f"{kind}.{f.name}"
            assert f.kw_only, f"{kind}.{f.name}"
            # Optional means "may be None, then left out of the line": default None, always.
            may_be_none = str(f.type).endswith("| None")
            if may_be_none:
                assert f.default is None, f"{kind}.{f.name}: a `X | None` field defaults to None"
            else:
                assert f.name in cls.required_fields, f"{kind}.{f.name}: required, or X | None"
        sample(cls, optional=True)  # every field's type has a JSON value


def test_a_model_event_names_its_model() -> None:
    assert issubclass(Ready, ModelEvent) and Ready.field_names[0] == "model"
    with pytest.raises(dataclasses.FrozenInstanceError):
        Ready(model="mlp", version=1, load_s=0.1, warm_s=0.1).version = 2  # type: ignore[misc]


def test_an_xid_event_as_the_telemetry_emits_it(tmp_path: Path) -> None:
    from hotreload.gpu.xid import event_to_json, parse_line

    lost = parse_line("NVRM: Xid (PCI:0000:65:00): 79, pid=1, GPU has fallen off the bus.")
    assert lost is not None
    bus = EventBus(tmp_path / "events.jsonl")
    sent = bus.emit("xid", **event_to_json(lost))  # engine/telemetry.py's call
    bus.close()
    assert set(event_to_json(lost)) == set(EVENT_TYPES["xid"].field_names)
    (line,) = lines(bus.path)
    assert line == as_dict(sent) and from_dict(line) == sent == build("xid", event_to_json(lost))
    assert line["xid"] == 79 and line["pci"] == "0000:65:00" and "device" not in line


# ---------------------------------------------------------------------- emit


def test_an_unknown_kind_or_field_fails_at_the_call(tmp_path: Path) -> None:
    bus = EventBus(tmp_path / "events.jsonl")
    seen: list[BaseEvent] = []
    bus.subscribe(seen.append)
    with pytest.raises(TypeError, match="unknown event kind 'reload_dnoe'"):
        bus.emit("reload_dnoe", model="mlp")
    with pytest.raises(TypeError, match="event 'watch_error' has no field 'eror'"):
        bus.emit("watch_error", eror="typo")
    with pytest.raises(TypeError, match="event 'watch_error' needs the field 'error'"):
        bus.emit("watch_error")
    with pytest.raises(TypeError, match="event 'model_note' has no field 'text'"):
        bus.emit_once("model_note", model="mlp", text="typo")
    with pytest.raises(TypeError, match="takes no more fields"):
        bus.emit(Ready(model="mlp", version=1, load_s=0.1, warm_s=0.1), pid=3)
    assert seen == [] and bus.recent == type(bus.recent)() and lines(bus.path) == []
    bus.close()


def test_a_subscriber_gets_the_event_object_and_the_file_its_dict(tmp_path: Path) -> None:
    bus = EventBus(tmp_path / "events.jsonl")
    seen: list[BaseEvent] = []
    bus.subscribe(seen.append)
    before = time.time()
    by_kind = bus.emit("ready", model="mlp", version=2, device="cpu", pid=7, load_s=1.0, warm_s=0.5)
    made = Ready(model="mlp", version=2, device="cpu", pid=7, load_s=1.0, warm_s=0.5)
    by_event = bus.emit(made)
    bus.close()
    # The objects themselves, nothing rebuilt: a consumer matches on the class.
    assert seen == [by_kind, by_event] == list(bus.recent)
    assert seen[1] is made and isinstance(seen[0], Ready) and by_kind == made
    assert before <= by_kind.ts <= made.ts <= time.time()
    # The dict only at the edge: one line each, in declaration order, inputs None left out.
    got = lines(bus.path)
    assert got == [as_dict(by_kind), as_dict(made)]
    assert list(got[0]) == ["ts", "kind", "model", "version", "device", "pid", "load_s", "warm_s"]
    assert got[0]["ts"] == by_kind.ts and got[0]["kind"] == "ready"
    back = from_dict(got[1])
    assert back == made and back.ts == made.ts


def test_emit_once_says_a_note_once_however_it_is_given(tmp_path: Path) -> None:
    bus = EventBus(None)
    note = build("model_note", {"model": "mlp", "message": "output aux left out"})
    assert bus.emit_once("model_note", model="mlp", message="output aux left out") is not None
    assert bus.emit_once(note) is None
    assert bus.emit_once("model_note", model="other", message="output aux left out") is not None
    assert [e.model for e in bus.recent if isinstance(e, ModelEvent)] == ["mlp", "other"]


def test_every_kind_goes_through_events_jsonl_and_comes_back(tmp_path: Path) -> None:
    path = tmp_path / ".hotreload" / "events.jsonl"
    bus = EventBus(path)
    seen: list[BaseEvent] = []
    bus.subscribe(seen.append)
    sent = [sample(cls, optional=o) for cls in EVENT_TYPES.values() for o in (True, False)]
    for event in sent:
        bus.emit(event)
    bus.close()
    got = lines(path)
    assert all(a is b for a, b in zip(seen, sent, strict=True))  # the subscribers' objects
    assert got == [as_dict(e) for e in sent]
    back = [from_dict(line) for line in got]
    assert back == sent and [e.ts for e in back] == [e.ts for e in sent]
    for line, event in zip(got, sent, strict=True):
        assert list(line)[:2] == ["ts", "kind"] and line["kind"] == event.kind
        # Declared order; an optional field that is None is left out, a required one stays.
        kept = [
            n
            for n in event.field_names
            if n in event.required_fields or getattr(event, n) is not None
        ]
        assert list(line)[2:] == kept


def test_a_required_field_stays_in_the_line_even_when_none() -> None:
    line = as_dict(Ready(model="mlp", version=None, load_s=0.1, warm_s=0.1, ts=1.0))  # type: ignore[arg-type]
    assert line == {"ts": 1.0, "kind": "ready", "model": "mlp", "version": None,
                    "load_s": 0.1, "warm_s": 0.1}  # fmt: skip


def test_from_dict_is_strict_unless_told_otherwise() -> None:
    line = {"ts": 1.0, "kind": "watch_paused", "replayed": True}
    with pytest.raises(TypeError, match="has no field 'replayed'"):
        from_dict(line)
    assert from_dict(line, strict=False) == EVENT_TYPES["watch_paused"]()
    assert from_dict(line, strict=False).ts == 1.0  # the line's time, not the reading's
    with pytest.raises(TypeError, match="unknown event kind 'stats'"):
        from_dict({"kind": "stats", "count": 3}, strict=False)


# ---------------------------------------------------------------------- the call sites


@dataclasses.dataclass
class Site:
    where: str
    kinds: list[str]
    keywords: set[str]
    #: `**fields` passed on: the required ones cannot be checked here.
    splat: bool


def _literal_kinds(node: ast.expr) -> list[str]:
    """`"ready"`, or both kinds of `"reload_done" if ok else "reload_failed"`; else []."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        body, orelse = _literal_kinds(node.body), _literal_kinds(node.orelse)
        return body + orelse if body and orelse else []
    return []


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def _site(where: str, kinds: list[str], call: ast.Call) -> Site:
    keywords = {k.arg for k in call.keywords if k.arg is not None}
    return Site(where, kinds, keywords, any(k.arg is None for k in call.keywords))


def sites() -> Iterator[Site]:
    """Every place in hotreload/ that emits an event of a kind written in the source."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.Call):
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            name = _name(node.func)
            if name == "set_state":  # ModelHost.set_state(state, **fields): a `state` event
                site = _site(where, ["state"], node)
                yield Site(where, ["state"], site.keywords | {"model", "state"}, True)
            elif name in EMITTERS and node.args:
                first = node.args[0]
                if kinds := _literal_kinds(first):
                    yield _site(where, kinds, node)
                elif isinstance(first, ast.Call) and _name(first.func) in CLASSES:
                    yield _site(where, [CLASSES[str(_name(first.func))].kind], first)


def test_every_emit_in_the_source_names_a_declared_kind_and_fields() -> None:
    found = list(sites())
    assert len(found) >= 60, f"the scan found only {len(found)} call sites: is it broken?"
    problems = []
    for site in found:
        for kind in site.kinds:
            cls = EVENT_TYPES.get(kind)
            if cls is None:
                problems.append(f"{site.where}: unknown kind {kind!r}")
                continue
            unknown = site.keywords - set(cls.field_names)
            if unknown:
                problems.append(f"{site.where}: {kind!r} has no field(s) {sorted(unknown)}")
            missing = cls.required_fields - site.keywords
            if missing and not site.splat:
                problems.append(f"{site.where}: {kind!r} needs {sorted(missing)}")
    assert problems == [], "\n".join(problems)


def _kinds_made_anywhere() -> set[str]:
    """Kinds the source emits, constructs (`EventsFileError(...)`) or writes as a dict."""
    kinds = {k for site in sites() for k in site.kinds}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Call) and _name(node.func) in CLASSES:
                kinds.add(CLASSES[str(_name(node.func))].kind)
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "kind":
                        kinds.update(_literal_kinds(value))
    return kinds


def test_every_declared_kind_is_made_somewhere() -> None:
    unused = set(EVENT_TYPES) - _kinds_made_anywhere()
    assert unused == set(), f"declared but never emitted (remove them?): {sorted(unused)}"
