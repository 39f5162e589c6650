"""Weights saved the usual ways: tied tensors stored once, a factory that wraps the model
(`weights_prefix`), TorchScript archives, pickled modules, and weights that override an
edit of build(). Real worker processes, real files."""

from __future__ import annotations

import os
import runpy
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_model
from torch import nn

from hotreload import Client
from hotreload.config import load_config
from hotreload.errors import ConfigError
from tests.support import count_events, wait_until

SESSION = """
[[models]]
name = "{name}"
entry = "{entry}"
example = "{example}"
device = "cpu"
threads = 1
warmup_iters = 1
"""


def project(tmp_path: Path, config: str, files: dict[str, str] | None = None) -> Path:
    """A project folder holding `files` and `config`; returns the config's path."""
    proj = tmp_path / "proj"
    proj.mkdir(exist_ok=True)
    for name, text in (files or {}).items():
        (proj / name).write_text(textwrap.dedent(text))
    (proj / "hotreload.toml").write_text(textwrap.dedent(config))
    return proj / "hotreload.toml"


def session_config(name: str, *extra: str, entry: str = "model.py:build") -> str:
    head = SESSION.format(name=name, entry=entry, example="model.py:example_input")
    return head + "".join(line + "\n" for line in extra)


def in_process(path: Path) -> dict[str, Any]:
    """The namespace of a project's model file, run in this process."""
    return runpy.run_path(str(path))


def infer(config: Path, model: str, x: np.ndarray) -> tuple[np.ndarray, int]:
    out, version, _ = Client(config=config, timeout_s=60).infer(model, x)
    return out, version


# ----------------------------------------------------------------------------- tied weights

CAUSAL_LM = """
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

CONFIG = Qwen2Config(
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    tie_word_embeddings=True,
)


class CausalLM(Qwen2ForCausalLM):
    def forward(self, input_ids):
        return super().forward(input_ids=input_ids, use_cache=False).logits


def build():
    return CausalLM(CONFIG)


def example_input():
    return torch.randint(0, 96, (1, 8), generator=torch.Generator().manual_seed(0))
"""


def test_tied_embeddings_saved_once_by_save_pretrained_load_and_answer_as_in_process(
    tmp_path: Path, serve
) -> None:
    pytest.importorskip("transformers")
    config = project(
        tmp_path, session_config("lm", 'weights = ["model.safetensors"]'), {"model.py": CAUSAL_LM}
    )
    torch.manual_seed(1)
    reference = in_process(config.parent / "model.py")["build"]().eval()
    reference.save_pretrained(config.parent)
    stored = load_file(str(config.parent / "model.safetensors"))
    assert "lm_head.weight" not in stored, "save_pretrained stores the tied tensor once"

    serve(config)
    ids = np.random.default_rng(0).integers(0, 96, (2, 8)).astype(np.int64)
    out, version = infer(config, "lm", ids)
    with torch.inference_mode():
        expected = reference(torch.from_numpy(ids)).numpy()
    assert version == 1
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- weights_prefix

WRAPPED = """
import torch
from torch import nn


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight  # tied: save_model stores one of the two


    def forward(self, ids):
        return self.head(torch.tanh(self.embed(ids)))


class Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Tied()

    def forward(self, ids):
        return self.inner(ids) * 2


def build():
    return Wrapper()


def example_input():
    return torch.zeros(1, 5, dtype=torch.long)
"""


def test_a_wrapping_factory_is_told_its_weights_prefix_and_loads_with_it(
    tmp_path: Path, serve
) -> None:
    weights = 'weights = ["inner.safetensors"]'
    config = project(tmp_path, session_config("wrapped", weights), {"model.py": WRAPPED})
    code = in_process(config.parent / "model.py")
    torch.manual_seed(2)
    reference = code["build"]().eval()
    save_model(reference.inner, str(config.parent / "inner.safetensors"))  # keys: embed.weight

    refused = serve(config, wait_ready=False)
    refused.wait_for("wrapped: failed to start")
    assert 'the keys differ by a prefix only: add `weights_prefix = "inner."`' in refused.output
    assert refused.proc.wait(60) != 0

    config.write_text(config.read_text() + 'weights_prefix = "inner."\n')
    serve(config)
    ids = np.array([[1, 4, 9, 15, 0]], dtype=np.int64)
    out, _ = infer(config, "wrapped", ids)
    with torch.inference_mode():
        np.testing.assert_allclose(out, reference(torch.from_numpy(ids)).numpy(), rtol=1e-6)


def config_with(tmp_path: Path, extra: str) -> Path:
    (tmp_path / "model.py").write_text("def build():\n    return abs\n")
    (tmp_path / "w.safetensors").write_bytes(b"")
    path = tmp_path / "hotreload.toml"
    path.write_text(session_config("m", extra))
    return path


@pytest.mark.parametrize(
    ("text", "strip", "add"),
    [
        ('weights_prefix = "inner."', "", "inner."),
        ('weights_prefix = { strip = "model." }', "model.", ""),
        ('weights_prefix = { strip = "model.", add = "inner." }', "model.", "inner."),
    ],
)
def test_weights_prefix_adds_or_strips(tmp_path: Path, text: str, strip: str, add: str) -> None:
    m = load_config(config_with(tmp_path, 'weights = ["w.safetensors"]\n' + text)).models[0]
    assert m.weights_prefix is not None
    assert (m.weights_prefix.strip, m.weights_prefix.add) == (strip, add)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('weights_prefix = "inner."', "no `weights` are declared"),
        ('weights = ["w.safetensors"]\nweights_prefix = ""', "expected a non-empty prefix"),
        ('weights = ["w.safetensors"]\nweights_prefix = 3', 'a prefix such as "inner."'),
        (
            'weights = ["w.safetensors"]\nweights_prefix = { remove = "a." }',
            "models[0].weights_prefix.remove: unknown key",
        ),
    ],
)
def test_a_bad_weights_prefix_says_what_to_write(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match="weights_prefix") as info:
        load_config(config_with(tmp_path, text))
    assert expected in str(info.value)


# ----------------------------------------------------------------------------- TorchScript


class Scaled(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def save_script(module: nn.Module, path: Path) -> None:
    """torch.jit.save to a temporary file renamed over `path`: an atomic save."""
    tmp = path.with_name(path.name + ".partial")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript
        torch.jit.save(torch.jit.script(module), str(tmp))
    os.replace(tmp, path)


EXAMPLE = """
import torch


def example_input():
    return torch.zeros(1, 4)
"""


def test_a_torchscript_entry_is_served_and_reloaded_when_the_archive_is_saved(
    tmp_path: Path, serve
) -> None:
    text = SESSION.format(name="ts", entry="model.pt", example="example.py:example_input")
    config = project(tmp_path, text, {"example.py": EXAMPLE})
    torch.manual_seed(3)
    first = Scaled(1.0).eval()
    save_script(first, config.parent / "model.pt")
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)

    serve(config, "--no-tui", command="watch")
    out, version = infer(config, "ts", x)
    with torch.inference_mode():
        np.testing.assert_allclose(out, first(torch.from_numpy(x)).numpy(), rtol=1e-6)
    assert version == 1

    second = Scaled(3.0).eval()
    second.lin.load_state_dict(first.lin.state_dict())
    save_script(second, config.parent / "model.pt")
    wait_until(lambda: infer(config, "ts", x)[1] >= 2, 60, what="v2 serving")
    out, _ = infer(config, "ts", x)
    with torch.inference_mode():
        np.testing.assert_allclose(out, second(torch.from_numpy(x)).numpy(), rtol=1e-6)


def test_a_torchscript_entry_is_watched_even_where_watch_names_other_folders(
    tmp_path: Path,
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "example.py").write_text(EXAMPLE)
    save_script(Scaled(1.0), tmp_path / "model.pt")
    path = tmp_path / "hotreload.toml"
    text = SESSION.format(name="m", entry="model.pt", example="src/example.py:example_input")
    path.write_text(text + 'watch = ["src"]\n')
    m = load_config(path).models[0]
    assert m.entry.torchscript and m.entry.file == (tmp_path / "model.pt").resolve()
    assert m.watch == ((tmp_path / "src").resolve(), (tmp_path / "model.pt").resolve())


def test_an_entry_naming_a_state_dict_file_is_refused_at_config_time(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("def example_input():\n    return 0\n")
    torch.save(Scaled(1.0).state_dict(), tmp_path / "model.pt")
    path = tmp_path / "hotreload.toml"
    path.write_text(SESSION.format(name="m", entry="model.pt", example="model.py:example_input"))
    with pytest.raises(ConfigError, match=r"models\[0\]\.entry") as info:
        load_config(path)
    assert "not a TorchScript archive (torch.jit.save)" in str(info.value)


# ----------------------------------------------------------------------------- wrong files

NET = """
import torch
from torch import nn


def build():
    return nn.Linear(4, 3)


def example_input():
    return torch.zeros(1, 4)
"""


@pytest.mark.parametrize(
    ("save", "sentence"),
    [
        (
            lambda path: torch.save(nn.Linear(4, 3), path),
            "weights file model.pt holds a pickled whole module (torch.save(model)), which a "
            "safe load refuses; save its weights instead: "
            "torch.save(model.state_dict(), 'model.pt')",
        ),
        (
            lambda path: save_script(nn.Linear(4, 3), path),
            "weights file model.pt is a TorchScript archive (torch.jit.save), not a state dict; "
            'serve it as the model instead: entry = "model.pt", and take it out of `weights`',
        ),
    ],
    ids=["pickled module", "TorchScript archive"],
)
def test_a_file_that_is_no_state_dict_gets_one_sentence(
    tmp_path: Path, serve, save: Any, sentence: str
) -> None:
    config = project(tmp_path, session_config("net", 'weights = ["model.pt"]'), {"model.py": NET})
    save(config.parent / "model.pt")
    session = serve(config, wait_ready=False)
    session.wait_for("net: failed to start")
    assert session.proc.wait(60) != 0
    (line,) = [line for line in session.lines if "failed to start" in line]
    assert line.endswith(sentence)
    assert "weights_only" not in session.output, "no torch advice about weights_only"


# ----------------------------------------------------------------------------- override warning

GAIN = """
import torch
from torch import nn

SCALE = 1.0


class Gain(nn.Module):
    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.full((4,), SCALE))

    def forward(self, x):
        return x * self.gain


def build():
    return Gain()


def example_input():
    return torch.ones(1, 4)
"""


def warned_once(config: Path, session: Any, x: np.ndarray, before: np.ndarray) -> None:
    """Two code edits that each set `gain` to a new value: the output stays what the weights
    file sets, and the override is warned about once, for the first."""
    model_py = config.parent / "model.py"
    base = Client(config=config, timeout_s=60).status()["models"][0]["version"]
    for version, scale in ((base + 1, "2.0"), (base + 2, "3.0")):
        model_py.write_text(GAIN.replace("SCALE = 1.0", f"SCALE = {scale}"))
        wait_until(
            lambda v=version: count_events(config, "reload_done", model="gain", version=v),
            60,
            what=f"v{version}",
        )
        out, served = infer(config, "gain", x)
        assert served == version
        np.testing.assert_array_equal(out, before)  # the weights file set `gain` again

    session.wait_for(f"gain: warning: v{base + 1}'s build() sets gain to a new value")
    assert count_events(config, "weights_override") == 1, "warned once per tensor and session"
    (line,) = [line for line in session.lines if f"v{base + 1}'s build() sets" in line]
    assert "gain.safetensors is loaded after build() and replaces it" in line


def test_a_code_edit_the_weights_override_is_warned_about_once_under_respawn(
    tmp_path: Path, serve
) -> None:
    # The new version is built in another process, so its output is compared there.
    extra = ('weights = ["gain.safetensors"]', 'strategy = "respawn"')
    config = project(tmp_path, session_config("gain", *extra), {"model.py": GAIN})
    model_py = config.parent / "model.py"
    save_model(in_process(model_py)["build"](), str(config.parent / "gain.safetensors"))
    session = serve(config, "--no-tui", command="watch")
    x = np.ones((1, 4), np.float32)
    before, _ = infer(config, "gain", x)
    warned_once(config, session, x, before)


def test_no_override_warning_where_no_build_value_changed_and_one_where_it_did(
    tmp_path: Path, serve
) -> None:
    """The three false alarms of issue 28: a second model in the folder whose code did not
    change, a broken edit fixed back to the code that serves, and an edit of forward(). Then
    code edits that do set a new value (`inplace`): warned about, once."""
    extra = 'weights = ["gain.safetensors"]'
    twin = '[[models]]\nname = "twin"\nentry = "twin.py:build"\nexample = "twin.py:example_input"\n'
    twin += 'weights = ["twin.safetensors"]\ndevice = "cpu"\nthreads = 1\nwarmup_iters = 1\n'
    config = project(
        tmp_path, session_config("gain", extra) + twin, {"model.py": GAIN, "twin.py": GAIN}
    )
    model_py = config.parent / "model.py"
    for name in ("gain", "twin"):
        save_model(in_process(model_py)["build"](), str(config.parent / f"{name}.safetensors"))
    session = serve(config, "--no-tui", command="watch")
    x = np.ones((1, 4), np.float32)
    before, _ = infer(config, "gain", x)

    def reloaded(times: int) -> None:
        wait_until(
            lambda: count_events(config, "reload_done", model="gain", error=None) >= times,
            60,
            what=f"gain's reload {times}",
        )

    body = "        return x * self.gain"
    slow = "import time\n" + GAIN.replace(body, "        time.sleep(0.001)\n" + body)
    model_py.write_text(slow)  # an edit of forward(); twin's code is unchanged
    reloaded(1)
    model_py.write_text(slow + "\ndef broken(:\n")
    wait_until(lambda: count_events(config, "reload_failed", model="gain"), 60, what="failure")
    model_py.write_text(slow)  # fixed back to the code that serves
    reloaded(2)
    assert count_events(config, "weights_override") == 0, session.output

    warned_once(config, session, x, before)
