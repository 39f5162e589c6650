"""`eval = "evals.py:score"` end to end on the example MLP in a real worker: each new
version (the start, an edit, a push) is scored once it serves, the figures equal the same
function called in this process on the same model, and `status` shows them; an eval that
raises, or runs past `eval_timeout_s`, is reported while the version serves on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hotreload import Client
from hotreload.commands.status import format_status
from tests.support import count_events, import_file, read_events, wait_until

EVALS = """
import torch

SCORE_INPUT = torch.linspace(-1, 1, 2 * 64).reshape(2, 64)


def score(model):
    out = model(SCORE_INPUT)
    return {"mean": out.mean().item(), "max": out.max()}


def broken(model):
    raise ValueError("the eval set is missing")


def slow(model):
    import time

    time.sleep(3)
    return {"mean": 0.0}
"""


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The worker runs torch on one thread; so does the model here (bit-equal sums)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def with_eval(config: Path, line: str) -> None:
    (config.parent / "evals.py").write_text(EVALS)
    text = config.read_text().replace(
        'golden = "model.py:golden"', f'golden = "model.py:golden"\n{line}', 1
    )
    config.write_text(text)


def evals(config: Path, n: int) -> list[dict]:
    wait_until(lambda: count_events(config, "eval_done") >= n, 60, what=f"{n} eval(s)")
    return [e for e in read_events(config) if e["kind"] == "eval_done"]


def scored_here(config: Path, tag: str, state: dict | None = None) -> dict[str, float]:
    """`score` of model.py as it is on disk now, with the weights file (and `state` over
    it), called in this process."""
    import torch
    from safetensors.torch import load_file

    module = import_file(config.parent / "model.py", f"eval_twin_{tag}")
    model = module.build().eval()
    weights = load_file(str(config.parent / "weights.safetensors"))
    weights.update({k: torch.from_numpy(v) for k, v in (state or {}).items()})
    model.load_state_dict(weights)
    score = import_file(config.parent / "evals.py", f"eval_fn_{tag}").score
    with torch.inference_mode():
        return {k: float(v) for k, v in score(model).items()}


def test_every_version_is_scored_as_the_function_scores_it_here(
    project: Path, serve, one_thread: None
) -> None:
    with_eval(project, 'eval = "evals.py:score"')
    serve(project)
    client = Client(config=project)
    (first,) = evals(project, 1)
    assert first["version"] == 1 and first["figures"] == scored_here(project, "v1")
    model_py = project.parent / "model.py"
    model_py.write_text(model_py.read_text().replace("SCALE = 1.0", "SCALE = 2.0", 1))
    assert client.reload("mlp")["outcomes"][0]["version"] == 2
    second = evals(project, 2)[-1]
    assert second["version"] == 2 and second["figures"] == scored_here(project, "v2")
    assert second["figures"]["mean"] != first["figures"]["mean"]
    pushed = {"out.bias": np.full(10, 0.5, dtype=np.float32)}
    assert client.update_weights("mlp", pushed, strict=False)["version"] == 3
    third = evals(project, 3)[-1]
    assert third["version"] == 3 and third["figures"] == scored_here(project, "v3", pushed)
    status = client.status()["models"][0]
    assert status["eval"]["version"] == 3 and status["eval"]["figures"] == third["figures"]
    shown = format_status(client.status())
    assert f"eval v3: mean {third['figures']['mean']:.4g}, max " in shown
    assert "kept for rollback: v1, v2, v3" in shown


def test_an_eval_that_raises_or_runs_late_is_reported_and_the_version_serves(
    project: Path, serve
) -> None:
    with_eval(project, 'eval = "evals.py:broken"')
    serve(project, "--no-tui", command="watch")  # the config edit below reloads
    client = Client(config=project)
    (failed,) = evals(project, 1)
    assert "ValueError: the eval set is missing" in failed["error"]
    assert client.infer("mlp", np.zeros((1, 64), np.float32)).version == 1
    config = project.read_text().replace(
        '"evals.py:broken"', '"evals.py:slow"\neval_timeout_s = 0.5'
    )
    project.write_text(config)
    late = evals(project, 2)[-1]
    assert "did not finish within eval_timeout_s = 0.5 s" in late["error"]
    assert client.infer("mlp", np.zeros((1, 64), np.float32)).version == 2
