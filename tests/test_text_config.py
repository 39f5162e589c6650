"""`generator` and `tokenizer` in a model's table: read, and refused with what to fix."""

from __future__ import annotations

from pathlib import Path

from hotreload.config import load_config
from tests.test_config import GOOD_MODEL, error_for, write


def test_a_generator_with_its_tokenizer_folder(tmp_path: Path) -> None:
    (tmp_path / "tok").mkdir()
    cfg = load_config(write(tmp_path, GOOD_MODEL + 'generator = true\ntokenizer = "tok"\n'))
    m = cfg.models[0]
    assert (m.generator, m.tokenizer) == (True, (tmp_path / "tok").resolve())
    plain = load_config(write(tmp_path, GOOD_MODEL)).models[0]
    assert (plain.generator, plain.tokenizer) == (False, None)


def test_tokenizer_mistakes_say_what_to_fix(tmp_path: Path) -> None:
    (tmp_path / "tok").mkdir()
    msg = error_for(tmp_path, GOOD_MODEL + 'tokenizer = "tok"\n')
    assert "set generator = true" in msg
    msg = error_for(tmp_path, GOOD_MODEL + 'generator = true\ntokenizer = "nope"\n')
    assert "does not exist" in msg and "save_pretrained" in msg
    assert "true or false" in error_for(tmp_path, GOOD_MODEL + 'generator = "yes"\n')
