"""A generator's golden prompts, continued greedily in a real worker: an edit that changes
its answers shows the first differing token and both texts; `hotreload diff` says it too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.stream_lm import count_lm, count_section
from tests.support import count_events, make_project, read_events, wait_until

GOLDEN = """

def golden():
    return ["abc", "xyz"]
"""


def test_a_generators_edit_names_the_first_differing_token(tmp_path: Path, serve) -> None:
    section = count_section().replace(
        'example = "count_lm.py:example"',
        'example = "count_lm.py:example"\ngolden = "count_lm.py:golden"',
    )
    config = make_project(tmp_path, config=section, files={"count_lm.py": count_lm() + GOLDEN})
    serve(config, "--no-tui", command="watch")
    source = config.parent / "count_lm.py"
    # Past "d" (id 68) each next token skips one: "abc" goes on "de" as before, then "g".
    text = source.read_text()
    edited = "nxt = (input_ids + 1 + (input_ids >= 69).long()) % VOCAB"
    source.write_text(text.replace("nxt = (input_ids + 1) % VOCAB", edited))
    wait_until(lambda: count_events(config, "reload_done"), 60, what="the reload")
    diff = next(e for e in read_events(config) if e["kind"] == "reload_done")["golden"]
    first, second = diff["texts"]
    assert (first["first_token"], first["old"][:4], first["new"][:4]) == (2, "defg", "degi")
    assert second["changed"] and second["first_token"] == 0  # "xyz" is past "d" already
    assert not diff["identical"]
    out = subprocess.run(
        [sys.executable, "-m", "hotreload", "diff", "count", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "prompt 0 'abc': first differing token 2" in out.stdout
    assert "v1: 'defghij" in out.stdout and "v2: 'degikmo" in out.stdout
