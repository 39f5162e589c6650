"""`HotreloadPush` and the served model's `eval`: the figures the session scored each pushed
version with land in the Trainer's logs as `hotreload/<name>` once they arrive, the last
push's waited for at the end; they are the session's own (`Client.evals`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hotreload import Client
from tests.support import make_project
from tests.test_training_hf import CONFIG, LLAMA, tiny_llama, train

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

EVALS = """
import torch

IDS = torch.arange(16).reshape(2, 8) % 128


def score(model):
    return {"loss": model(input_ids=IDS, labels=IDS).loss.item()}
"""


def test_a_trainer_logs_the_eval_figures_of_the_versions_it_pushed(tmp_path: Path, serve) -> None:  # type: ignore[no-untyped-def]
    from hotreload.training import HotreloadPush

    torch.set_num_threads(1)  # two cores: the trainer and the served model, one each
    config = make_project(
        tmp_path,
        config=CONFIG + 'eval = "evals.py:score"\n',
        files={"llama.py": LLAMA, "evals.py": EVALS},
    )
    serve(config)
    model = tiny_llama()
    push = HotreloadPush(model="llm", every_n_steps=4, config=config, timeout_s=60)
    trainer = train(model, push, tmp_path / "out", steps=8, rows=16)

    assert push.errors == [] and push.eval_errors == []
    last = push.served[-1][1]
    assert push.evals and push.evals[-1][0] == last  # the final push's, waited for
    with Client(config=config) as client:
        session = {e["version"]: e["figures"] for e in client.evals("llm")["evals"]}
    for version, figures in push.evals:
        assert figures == session[version] and set(figures) == {"loss"}
    logged = [e for e in trainer.state.log_history if "hotreload/loss" in e]
    assert logged and logged[-1]["hotreload_eval_version"] == last
    assert logged[-1]["hotreload/loss"] == session[last]["loss"]
