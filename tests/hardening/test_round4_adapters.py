"""Adapter files saved in place, broken, and pushed with NaN (issue 38, items 1 and 3).

Real worker processes in an in-process session (no watcher: each reload is asked for), a
tiny base and two LoRA adapters as peft saves them (tests/test_adapters.py's):

- an adapter file written in place in two halves, seconds apart, is waited for; the
  serving worker, whose adapter tensors came from that file, answers on meanwhile (its
  tensors were read into memory of its own, never left over a mapping of the file, which
  the truncation pulled from under it: SIGBUS, the whole worker);
- a worker that dies while an adapter file is broken comes back with the base, the other
  adapter and that adapter's last good version (the last good snapshot holds it), or, when
  nothing of it is left to load, without that adapter, which then says why;
- a push of NaN into an adapter that is not the default is refused by the smoke test.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from hotreload.config import load_config
from hotreload.config.models import Deadlines
from hotreload.engine import snapshots
from hotreload.engine.event_kinds import BaseEvent
from hotreload.engine.session import Session
from hotreload.errors import ReloadFailedError, WorkerUnavailableError

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from safetensors.torch import save_file  # noqa: E402

from hotreload.protocol.shared_state import pack_state  # noqa: E402
from hotreload.protocol.tensors import decode_tensors, encode_tensors  # noqa: E402
from tests.test_adapters import base_net, save_adapter  # noqa: E402

X = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)

MODEL = """
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def build():
    return Net()


def example():
    return torch.zeros(3, 8)
"""

CONFIG = """
[[models]]
name = "m"
entry = "model.py:build"
example = "model.py:example"
weights = ["base.safetensors"]
adapters = { a = "adapters/a", b = "adapters/b" }
device = "cpu"
warmup_iters = 1
threads = 1
"""


def save_wide_adapter(folder: Path, seed: int) -> Path:
    """Adapter "a": rank 512, so its file spans pages (about 90 KiB): a truncation leaves
    some of a mapping's pages past the end of the file, where a read faults (SIGBUS)."""
    base = base_net()
    torch.manual_seed(seed)
    cfg = peft.LoraConfig(r=512, target_modules=["up", "down"], init_lora_weights=False)
    peft.get_peft_model(base, cfg).save_pretrained(folder)
    return folder


def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "model.py").write_text(MODEL)
    save_file(base_net().state_dict(), str(root / "base.safetensors"))
    save_wide_adapter(root / "adapters" / "a", 2)
    save_adapter(root / "adapters" / "b", 3, ["up"])
    (root / "hotreload.toml").write_text(CONFIG)
    return root / "hotreload.toml"


def adapter_file(config: Path, name: str) -> Path:
    return config.parent / "adapters" / name / "adapter_model.safetensors"


async def infer(sup: Any, adapter: str | None) -> np.ndarray:
    """One request to the model, with `adapter` (None: the default); raises what it got."""
    metas, blobs = encode_tensors({"x": X})
    header: dict[str, Any] = {"tensors": metas}
    if adapter is not None:
        header["parameters"] = {"adapter": adapter}
    frame = await sup.router.submit_future(header, b"".join(bytes(b) for b in blobs))
    return next(iter(decode_tensors(frame.header["tensors"], frame.payload).values()))


async def answers(sup: Any) -> dict[str, np.ndarray]:
    return {n: await infer(sup, n) for n in ("a", "b", "base")}


def run_session(
    config_path: Path,
    scenario: Callable[[Session, Any, list[BaseEvent]], Awaitable[None]],
    **deadlines: float,
) -> list[BaseEvent]:
    """`scenario(session, supervisor, events)` on a started session, stopped after it."""
    config = load_config(config_path)
    model = dataclasses.replace(config.models[0], deadlines=Deadlines(**deadlines))
    config = dataclasses.replace(config, models=(model,))

    async def main() -> list[BaseEvent]:
        session = Session(config, endpoint=False, telemetry=False)
        seen: list[BaseEvent] = []
        session.events.subscribe(seen.append)
        try:
            await session.start()
            await scenario(session, session.models[model.name], seen)
        finally:
            await session.stop()
        return seen

    return asyncio.run(asyncio.wait_for(main(), 240))


async def wait_for(predicate: Callable[[], object], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


def kinds(seen: list[BaseEvent]) -> list[str]:
    return [e.kind for e in seen]


# ----------------------------------------------------------------------------- items 1 and 3


def kill_serving(sup: Any) -> int:
    pid = sup.record.serving.pid
    os.kill(pid, signal.SIGKILL)
    return pid


async def restarted(sup: Any, old_pid: int, seen: list[BaseEvent]) -> None:
    def done() -> bool:
        w = sup.record.serving
        back = w is not None and w.pid != old_pid and w.alive and sup.record.state == "serving"
        return back or sup.record.state == "failed"

    await wait_for(done, "the restart (or its failure)", 120)


async def in_place_save_then_nan(
    session: Session, sup: Any, config: Path, tmp_path: Path, got: dict[str, Any]
) -> None:
    """Item 1, then item 3 on the version it built: an adapter file written in place in two
    halves, a push of NaN into b (not the default), then the same NaN saved as b's file."""
    from safetensors.torch import load_file

    target = adapter_file(config, "a")
    new = tmp_path / "new_a"
    save_wide_adapter(new, 7)
    data = (new / "adapter_model.safetensors").read_bytes()
    saved = load_file(str(adapter_file(config, "b")))
    nan = {k.replace(".weight", ".b.weight"): np.full(tuple(v.shape), np.nan, np.float32)
           for k, v in saved.items()}  # fmt: skip

    before = await answers(sup)
    pid = sup.record.serving.pid
    # The repro: half the bytes in place, the rest 2 s later (1 s here).
    with open(target, "wb") as f:
        f.write(data[: len(data) // 2])
        f.flush()
        during = [await answers(sup) for _ in range(3)]  # old version answers on
        reload = asyncio.ensure_future(session.reload_model("m", trigger="file"))
        await asyncio.sleep(1.0)
        during.append(await answers(sup))
        f.write(data[len(data) // 2 :])
    outcome = await reload
    got.update(before=before, during=during, outcome=outcome, pid=pid)
    got["after"] = await answers(sup)
    got["pid_after"] = sup.record.serving.pid
    # Item 3: over the version just built.
    with pack_state(nan) as packed, pytest.raises(ReloadFailedError) as failed:
        await sup.push(packed.descriptor, strict=False)
    got["error"] = str(failed.value)
    got["after_push"] = await answers(sup)
    # The same NaN saved as b's file: the reload smoke-tests b as well.
    nan_file = tmp_path / "nan.safetensors"
    save_file({k: torch.full_like(v, float("nan")) for k, v in saved.items()}, str(nan_file))
    nan_file.replace(adapter_file(config, "b"))
    got["reload"] = await session.reload_model("m", trigger="file")
    got["last"] = await answers(sup)
    got["version"] = sup.record.version


async def restart_with_no_good_copy(
    session: Session, sup: Any, config: Path, good_b: bytes, got: dict[str, Any]
) -> None:
    """No snapshot at all: the restart reads the files on disk, where b's is cut short; the
    save that mends it (`good_b`, the b that serves) reloads b."""
    target = adapter_file(config, "b")
    got["before"] = await answers(sup)
    target.write_bytes(good_b[: len(good_b) // 2])
    await restarted(sup, kill_serving(sup), [])
    got["state"] = sup.record.state
    got["a"], got["base"] = await infer(sup, "a"), await infer(sup, "base")
    with pytest.raises(WorkerUnavailableError) as failed:
        await infer(sup, "b")
    got["b_error"] = failed.value
    got["status"] = sup.record.current.adapters
    target.write_bytes(good_b)
    got["reload"] = await session.reload_model("m", trigger="file")
    got["b"] = await infer(sup, "b")


def test_in_place_saves_and_nan_pushes_spare_the_worker_and_a_restart_serves_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One session, in two acts (a session with its workers costs more than either act).

    1. Items 1 and 3: an adapter file written in place is waited for while the same worker
       answers on; a push of NaN into an adapter that is not the default, then the same NaN
       saved as its file, are refused.
    2. A restart with no good copy of an adapter (no snapshot at all: a project whose folders
       hold more than MAX_COPY_BYTES of small files skips it, so the restart reads the files
       on disk, and b's is broken) serves the rest and says why b is left out.

    Act 1 runs as a user's session does, a snapshot taken before every build (the build
    reads from it). Between the acts the snapshots stop (MAX_COPY_BYTES 0), b's good file is
    saved back and the code saved again unchanged (a snapshot links the files unchanged
    since the last one, copying nothing, so a file must change for the limit to bite), and
    that reload builds a version with no snapshot, the one act 2 restarts."""
    config = project(tmp_path)
    good_b = adapter_file(config, "b").read_bytes()
    first: dict[str, Any] = {}
    second: dict[str, Any] = {}
    act_one_events = 0

    async def scenario(session: Session, sup: Any, seen: list[BaseEvent]) -> None:
        nonlocal act_one_events
        await in_place_save_then_nan(session, sup, config, tmp_path, first)
        act_one_events = len(seen)
        first["snapshot"] = sup.record.good_snapshot
        monkeypatch.setattr(snapshots, "MAX_COPY_BYTES", 0)
        adapter_file(config, "b").write_bytes(good_b)  # over act 1's NaN
        code = config.parent / "model.py"
        code.write_text(code.read_text())
        second["unsnapshotted"] = await session.reload_model("m", trigger="file")
        second["snapshot"] = sup.record.good_snapshot
        await restart_with_no_good_copy(session, sup, config, good_b, second)

    seen = run_session(config, scenario, checkpoint_s=30)

    got, act_one = first, seen[:act_one_events]
    assert got["snapshot"] is not None  # act 1 built from snapshots, as by default
    assert "worker_died" not in kinds(act_one), [e for e in act_one if e.kind == "worker_died"]
    assert got["pid_after"] == got["pid"]  # the same worker throughout
    for each in got["during"]:
        for name in ("a", "b", "base"):
            np.testing.assert_array_equal(each[name], got["before"][name])
    outcome = got["outcome"]
    assert outcome.ok and outcome.version == 2, outcome
    assert not np.allclose(got["after"]["a"], got["before"]["a"])  # the new a serves
    np.testing.assert_array_equal(got["after"]["b"], got["before"]["b"])

    assert "non-finite" in got["error"] and "adapter 'b'" in got["error"], got["error"]
    reload = got["reload"]
    assert not reload.ok and reload.phase == "smoke", reload
    assert "non-finite" in (reload.error or "") and "adapter 'b'" in (reload.error or "")
    assert got["version"] == 2  # the version item 1 built serves on
    for name in ("a", "b", "base"):
        np.testing.assert_array_equal(got["after_push"][name], got["after"][name])
        np.testing.assert_array_equal(got["last"][name], got["after"][name])

    got = second
    assert got["unsnapshotted"].ok and got["snapshot"] is None, got["unsnapshotted"]
    assert "restart_failed" not in kinds(seen), [e for e in seen if e.kind == "restart_failed"]
    assert got["state"] == "serving"
    np.testing.assert_array_equal(got["a"], got["before"]["a"])
    np.testing.assert_array_equal(got["base"], got["before"]["base"])
    err = str(got["b_error"])
    assert "adapter 'b' is not served" in err and "adapter_model.safetensors" in err, err
    assert "save it again" in err, err
    assert set(got["status"]["unavailable"]) == {"b"}, got["status"]
    assert got["reload"].ok, got["reload"]
    np.testing.assert_array_equal(got["b"], got["before"]["b"])


# ----------------------------------------------------------------------------- item 1: restarts


def test_a_worker_that_dies_while_adapter_files_are_truncated_comes_back_with_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last good snapshot holds each adapter's last good version, whatever its size:
    files over LINK_ABOVE_BYTES are hard-linked into the snapshot (weights), and a save in
    place rewrites a link too; adapter files are copied (real LoRA files are 10-300 MB), so a
    restart comes back with the last good ones. Adapter a is cut short by a save left half
    written (its reload waits in vain, v1 serves on), b truncated in place."""
    monkeypatch.setattr(snapshots, "LINK_ABOVE_BYTES", 0)  # every file "large"
    config = project(tmp_path)
    target_a, target_b = adapter_file(config, "a"), adapter_file(config, "b")
    got: dict[str, Any] = {}

    async def scenario(session: Session, sup: Any, seen: list[BaseEvent]) -> None:
        got["before"] = await answers(sup)
        data = target_a.read_bytes()
        with open(target_a, "wb") as f:  # truncated, and left so
            f.write(data[: len(data) // 2])
        # The save's reload waits for the file, in vain: v1 serves on.
        outcome = await session.reload_model("m", trigger="file")
        got["reload"] = outcome
        data_b = target_b.read_bytes()
        with open(target_b, "r+b") as fh:  # in place: the inode (and any link to it) too
            fh.truncate(len(data_b) // 2)
        await restarted(sup, kill_serving(sup), seen)
        got["state"] = sup.record.state
        got["after"] = await answers(sup)
        target_b.write_bytes(data_b)

    seen = run_session(config, scenario, checkpoint_s=0.5)
    assert not got["reload"].ok and got["reload"].phase == "checkpoint", got["reload"]
    assert "restart_failed" not in kinds(seen), [e for e in seen if e.kind == "restart_failed"]
    assert got["state"] == "serving"
    for name in ("a", "b", "base"):  # a and b: their last good versions, from the snapshot
        np.testing.assert_array_equal(got["after"][name], got["before"][name])


# ----------------------------------------------------------------------------- in process


def built(folders: dict[str, Path], current: Any = None, restart: bool = False) -> Any:
    """A version as the worker builds it (tests/test_adapters.py's `served`), `restart` or not."""
    from hotreload.worker.weight_sources import place_weights
    from tests.test_adapters import Net

    model = Net().eval()
    specs = [{"name": n, "folder": str(f)} for n, f in folders.items()]
    placed = place_weights(
        model, [str(next(iter(folders.values())).parent / "base.safetensors")], None,
        root="/", device=torch.device("cpu"), current=current, adapters=(specs, None),
        restart=restart,
    )  # fmt: skip
    return SimpleNamespace(model=model, weights=placed, digest=None, on_host=False)


def test_a_restart_leaves_out_a_broken_default_adapter_and_keeps_it_out_until_mended(
    tmp_path: Path,
) -> None:
    from hotreload.worker.adapters import AdapterUnavailable, choose
    from hotreload.worker.load_error import LoadError

    root = tmp_path / "adapters"
    root.mkdir()
    save_file(base_net().state_dict(), str(root / "base.safetensors"))
    folders = {"a": save_adapter(root / "a", 2), "b": save_adapter(root / "b", 3, ["up"])}
    target = folders["a"] / "adapter_model.safetensors"
    good = target.read_bytes()
    target.write_bytes(good[:100])  # "a", the default, cut short
    with pytest.raises(LoadError, match="adapter 'a': cannot read"):
        built(folders)  # any build but a restart fails: the serving version keeps serving
    mv = built(folders, restart=True)
    for name in ("b", "base"):
        choose(mv, {"adapter": name})
    with pytest.raises(AdapterUnavailable, match=r"adapter 'a' is not served since the worker"):
        choose(mv, None)  # the default is "a": said, not the base's answer instead
    assert set(mv.weights.adapters.wire()["unavailable"]) == {"a"}
    # A later build (a code edit) keeps it out while its file is the same broken one.
    again = built(folders, current=mv)
    assert set(again.weights.adapters.unavailable) == {"a"}
    target.write_bytes(good)  # mended: the next build serves it
    mended = built(folders, current=again)
    assert not mended.weights.adapters.unavailable
    choose(mended, None)


def test_a_left_out_adapter_on_a_text_route_is_unavailable_not_a_model_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The text op answers an adapter left out at a restart with its own code (HTTP 503),
    not as a failure of the model (500): the request is not at fault, nor is the model."""
    from hotreload.protocol.framing import Frame
    from hotreload.worker import text_op
    from hotreload.worker.adapters import AdapterUnavailable

    def left_out(*args: Any) -> dict[str, Any]:
        raise AdapterUnavailable("adapter 'b' is not served since the worker restarted")

    monkeypatch.setattr(text_op, "run_text", left_out)
    sent: list[dict[str, Any]] = []
    worker = SimpleNamespace(
        spec={}, served=0, failed=0, skipped=0, busy_since=time.monotonic(), busy_total=0.0,
        streams={},
        admit=lambda header: SimpleNamespace(), send=lambda header, blobs=None: sent.append(header),
    )  # fmt: skip
    text_op.op_text(worker, Frame({"id": 7, "op": "text", "text": {}}, b""))  # type: ignore[arg-type]
    assert sent and sent[0]["error"]["code"] == "worker_unavailable", sent
    assert "not served since the worker restarted" in sent[0]["error"]["message"]
