"""The report's Evals table: each version's eval figures, or why it has none."""

from __future__ import annotations

import json
from pathlib import Path

from hotreload.commands.report import render_html
from hotreload.commands.report_log import read_log
from tests.test_report import T0, write_logs


def test_the_report_lists_each_versions_eval(tmp_path: Path) -> None:
    write_logs(tmp_path)
    evals = [
        {"ts": T0 + 2, "kind": "eval_done", "model": "mlp", "version": 1,
         "figures": {"loss": 0.41237}, "eval_s": 0.5},
        {"ts": T0 + 11, "kind": "eval_done", "model": "mlp", "version": 2,
         "error": "eval: evals.py:score raised ValueError: boom"},
    ]  # fmt: skip
    with (tmp_path / "events.jsonl").open("a") as f:
        f.write("".join(json.dumps(e) + "\n" for e in evals))
    log = read_log(tmp_path)
    assert [e["version"] for e in log.evals] == [1, 2]
    assert [e["version"] for e in log.sessions[0].evals] == [1, 2]
    page = render_html(log, "proj/hotreload.toml")
    assert "Evals" in page and "loss 0.4124 (0.50 s)" in page
    assert "FAILED: eval: evals.py:score raised ValueError: boom" in page


def test_a_report_without_evals_says_how_to_have_them(tmp_path: Path) -> None:
    write_logs(tmp_path)
    page = render_html(read_log(tmp_path), "proj/hotreload.toml")
    assert "no eval (set eval = &quot;evals.py:score&quot;" in page or "no eval (set eval" in page
