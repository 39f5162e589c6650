"""lm-evaluation-harness scores a live `hotreload serve` exactly as it scores the same
weights in-process: `local-completions` (with lm-eval's own tokenizer, and with its remote
tokenizer over /tokenize) against `hf`, on a loglikelihood multiple-choice task and a
`generate_until` task shipped under tests/evalharness/tasks (no download); and
`local-chat-completions` against `hf` with the same chat template, on the generation task.

A server that gets `echo` or `logprobs` wrong does not fail under lm-eval: it scores near
chance without an error. So this compares every request's loglikelihood (within 1e-4), its
is-greedy flag, every generation and every metric, not only the final accuracy.

All five runs go through one lm-eval process (its import costs seconds), against the
sessions tests/http/conftest.py shares: `lm_server` (one generator, as the remote tokenizer
needs: it names no model) and `chat_server` ("chat", a tokenizer with a chat template).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.http.support_http import skip_unless_installed
from tests.support import REPO

# lm-eval runs in a subprocess, the models in the sessions' workers: neither imports here.
skip_unless_installed("lm_eval", "transformers")


LOGLIKELIHOOD_TOL = 1e-4


def offline_env(tmp: Path) -> dict[str, str]:
    """lm-eval, datasets and transformers with no network and caches of their own."""
    return dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(tmp / "hf_home"),
        TOKENIZERS_PARALLELISM="false",
        OPENAI_API_KEY="unused",
        PYTHONWARNINGS="ignore",
    )


def run_lmeval(runs: list[dict[str, Any]], tmp: Path, timeout_s: float = 200) -> list[Any]:
    spec, out = tmp / "runs.json", tmp / "results.json"
    spec.write_text(json.dumps(runs))
    done = subprocess.run(
        [sys.executable, "-m", "tests.evalharness.run_lmeval", str(spec), str(out)],
        cwd=REPO,
        env=offline_env(tmp),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def served_runs(url: str, folder: Path) -> list[dict[str, Any]]:
    base = {"model": "lm", "base_url": f"{url}/v1/completions", "max_retries": 1}
    return [
        {
            "label": "hf",
            "model": "hf",
            "model_args": {"pretrained": str(folder), "dtype": "float32", "device": "cpu"},
        },
        {
            "label": "served, lm-eval's tokenizer",
            "model": "local-completions",
            "model_args": {**base, "tokenizer_backend": "huggingface", "tokenizer": str(folder)},
        },
        {
            "label": "served, remote tokenizer",
            "model": "local-completions",
            "model_args": {**base, "tokenizer_backend": "remote"},
        },
    ]


def assert_same_scores(ref: dict[str, Any], got: dict[str, Any]) -> None:
    label = got["label"]
    assert got["metrics"] == ref["metrics"], label
    for task, ref_rows in ref["samples"].items():
        rows = got["samples"][task]
        assert [r["doc_id"] for r in rows] == [r["doc_id"] for r in ref_rows], (label, task)
        for ref_row, row in zip(ref_rows, rows, strict=True):
            for want, have in zip(ref_row["resps"], row["resps"], strict=True):
                if isinstance(want[0], str):  # generate_until: the text, exactly
                    assert have == want, (label, task, row["doc_id"])
                else:  # loglikelihood: (sum of logprobs, is_greedy)
                    (w_ll, w_greedy), (h_ll, h_greedy) = want[0], have[0]
                    assert abs(h_ll - w_ll) <= LOGLIKELIHOOD_TOL, (label, task, row, ref_row)
                    assert h_greedy == w_greedy, (label, task, row["doc_id"])


def chat_runs(url: str, folder: Path) -> list[dict[str, Any]]:
    """`hf` and the served "chat" generator, each rendering the folder's chat template, on
    the generation task only (a chat has no loglikelihoods to score)."""
    return [
        {
            "label": "hf, chat template",
            "model": "hf",
            "model_args": {"pretrained": str(folder), "dtype": "float32", "device": "cpu"},
            "apply_chat_template": True,
            "tasks": ["hr_tiny_gen"],
        },
        {
            "label": "served, local-chat-completions",
            "model": "local-chat-completions",
            "model_args": {
                "model": "chat",
                "base_url": f"{url}/v1/chat/completions",
                "max_retries": 1,
            },
            "apply_chat_template": True,
            "tasks": ["hr_tiny_gen"],
        },
    ]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_lm_eval_scores_served_completions_and_chats_as_in_process(
    tmp_path: Path, lm_server: Any, chat_server: Any
) -> None:
    completions = served_runs(lm_server.url, lm_server.config.parent / "lm")
    chats = chat_runs(chat_server.url, chat_server.config.parent / "chat_lm")
    results = run_lmeval(completions + chats, tmp_path, timeout_s=360)
    ref = results[0]
    # The tasks are scored at all: every document has an answer.
    assert len(ref["samples"]["hr_tiny_mc"]) == 8 and len(ref["samples"]["hr_tiny_gen"]) == 6
    assert any(r["resps"][0][0] for r in ref["samples"]["hr_tiny_gen"]), "no text generated"
    for got in results[1 : len(completions)]:
        assert_same_scores(ref, got)

    chat_ref, chat_got = results[len(completions) :]
    rows, ref_rows = chat_got["samples"]["hr_tiny_gen"], chat_ref["samples"]["hr_tiny_gen"]
    assert len(ref_rows) == 6 and any(r["resps"][0][0] for r in ref_rows), "no text generated"
    # Every generation, exactly, and so every metric.
    assert [r["resps"] for r in rows] == [r["resps"] for r in ref_rows]
    assert chat_got["metrics"] == chat_ref["metrics"]
