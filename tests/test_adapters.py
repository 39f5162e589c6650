"""peft LoRA adapters as weights, in this process: the `adapters` config key and its errors,
the worker's injection of real adapters that peft saved (outputs equal to peft's own
PeftModel for each adapter, the base alone, the default), sharing an unchanged adapter's
tensors with the serving version, and the three ways a push may name adapter tensors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from safetensors.torch import save_file

from hotreload.config import load_config
from hotreload.errors import ConfigError

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from hotreload.worker.adapter_copy import copied  # noqa: E402
from hotreload.worker.adapter_pushes import peft_form  # noqa: E402
from hotreload.worker.adapters import UnknownAdapter, choose  # noqa: E402
from hotreload.worker.load_error import LoadError  # noqa: E402
from hotreload.worker.weight_sources import PlacedWeights, place_weights  # noqa: E402

X = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def base_net() -> Net:
    torch.manual_seed(1)
    return Net().eval()


def save_adapter(folder: Path, seed: int, targets: list[str] | None = None) -> Path:
    """A LoRA adapter as peft saves it, with non-zero B (init_lora_weights=False)."""
    base = base_net()
    torch.manual_seed(seed)  # after the base's own seed: the LoRA weights follow `seed`
    cfg = peft.LoraConfig(r=2, target_modules=targets or ["up", "down"], init_lora_weights=False)
    peft.get_peft_model(base, cfg).save_pretrained(folder)
    return folder


def peft_output(folders: dict[str, Path], name: str | None) -> torch.Tensor:
    """What peft itself answers: PeftModel with every adapter loaded, `name` active (None:
    the base alone, adapters disabled)."""
    first, *rest = folders.items()
    model = peft.PeftModel.from_pretrained(base_net(), first[1], adapter_name=first[0])
    for n, f in rest:
        model.load_adapter(f, adapter_name=n)
    model.eval()
    with torch.inference_mode():
        if name is None:
            with model.disable_adapter():
                return model(X)
        model.set_adapter(name)
        return model(X)


def served(folders: dict[str, Path], current: Any = None, default: str | None = None) -> Any:
    """A version as the worker builds it: the base's weights file, then the adapters."""
    model = Net().eval()
    specs = [{"name": n, "folder": str(f)} for n, f in folders.items()]
    base = next(iter(folders.values())).parent / "base.safetensors"
    placed = place_weights(
        model, [str(base)], None, root="/", device=torch.device("cpu"), current=current,
        adapters=(specs, default),
    )  # fmt: skip
    return SimpleNamespace(model=model, weights=placed, digest=None, on_host=False)


def answer(mv: Any, adapter: str | None) -> torch.Tensor:
    choose(mv, {"adapter": adapter} if adapter is not None else None)
    with torch.inference_mode():
        return mv.model(X)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    save_file(base_net().state_dict(), str(root / "base.safetensors"))
    return {"a": save_adapter(root / "a", 2), "b": save_adapter(root / "b", 3, ["up"])}


def test_each_adapter_answers_as_peft_does(folders: dict[str, Path]) -> None:
    mv = served(folders)
    for name in ("b", "a", "b"):  # switching back and forth, per request
        torch.testing.assert_close(answer(mv, name), peft_output(folders, name))
    torch.testing.assert_close(answer(mv, None), peft_output(folders, "a"))  # first declared
    torch.testing.assert_close(answer(mv, "base"), peft_output(folders, None))
    assert not torch.allclose(answer(mv, "a"), answer(mv, "b"))
    with pytest.raises(UnknownAdapter, match=r"unknown adapter 'c'; this model serves: a, b, base"):
        answer(mv, "c")
    wire = mv.weights.adapters.wire()
    assert wire["default"] == "a" and set(wire["adapters"]) == {"a", "b"}
    assert wire["adapters"]["a"]["digest"] != wire["adapters"]["b"]["digest"]


def test_the_default_may_be_the_base(folders: dict[str, Path]) -> None:
    mv = served(folders, default="base")
    torch.testing.assert_close(answer(mv, None), peft_output(folders, None))


def test_an_unchanged_adapter_is_shared_and_a_saved_one_read(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    moved = {n: Path(shutil.copytree(f, tmp_path / n)) for n, f in folders.items()}
    shutil.copy(next(iter(folders.values())).parent / "base.safetensors", tmp_path)
    first = served(moved)
    save_adapter(moved["b"], 9, ["up"])  # a new b; a unchanged
    second = served(moved, current=first)
    a_keys = first.weights.adapters.adapters["a"].keys
    old, new = first.model.state_dict(), second.model.state_dict()
    assert all(old[k].data_ptr() == new[k].data_ptr() for k in a_keys)
    src = {n: a.source for n, a in second.weights.adapters.adapters.items()}
    assert src == {"a": "shared", "b": "file"}
    # The base's tensors are the serving version's, not read again.
    assert second.weights.reused > 0
    torch.testing.assert_close(answer(second, "b"), peft_output(moved, "b"))
    torch.testing.assert_close(answer(first, "b"), peft_output(folders, "b"))  # old serves on
    assert not torch.allclose(answer(first, "b"), answer(second, "b"))
    a1, a2 = (v.weights.adapters.adapters["a"].digest for v in (first, second))
    b1, b2 = (v.weights.adapters.adapters["b"].digest for v in (first, second))
    assert a1 == a2 and b1 != b2


def test_an_adapter_save_copies_the_serving_module_and_reads_that_adapter_only(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    moved = {n: Path(shutil.copytree(f, tmp_path / n)) for n, f in folders.items()}
    shutil.copy(next(iter(folders.values())).parent / "base.safetensors", tmp_path)
    first = served(moved)
    save_adapter(moved["b"], 11, ["up"])
    specs = [{"name": n, "folder": str(f)} for n, f in moved.items()]
    got = copied({"adapters": specs}, first, [], torch.device("cpu"))
    assert got is not None
    clone, placed = got
    second = SimpleNamespace(model=clone, weights=placed)
    assert clone is not first.model
    old, new = first.model.state_dict(), clone.state_dict()
    b_keys = set(first.weights.adapters.adapters["b"].keys)
    assert all(old[k].data_ptr() == new[k].data_ptr() for k in old if k not in b_keys)
    assert all(old[k].data_ptr() != new[k].data_ptr() for k in b_keys)
    assert {n: a.source for n, a in placed.adapters.adapters.items()} == {
        "a": "shared",
        "b": "file",
    }
    for name in ("a", "b", "base"):
        want = peft_output(moved, None if name == "base" else name)
        torch.testing.assert_close(answer(second, name), want)
    torch.testing.assert_close(answer(first, "b"), peft_output(folders, "b"))  # old serves on
    # A changed adapter_config.json may change the layers: the ordinary build, not a copy.
    cfg = moved["a"] / "adapter_config.json"
    cfg.write_text(cfg.read_text() + "\n")
    assert copied({"adapters": specs}, first, [], torch.device("cpu")) is None


def test_an_adapter_for_another_base_says_so(tmp_path: Path) -> None:
    folder = save_adapter(tmp_path / "x", 4)
    cfg = json.loads((folder / "adapter_config.json").read_text())
    cfg["target_modules"] = ["q_proj"]
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    save_file(base_net().state_dict(), str(tmp_path / "base.safetensors"))
    with pytest.raises(LoadError, match=r"adapter 'x' .* does not fit the base model: .*q_proj"):
        served({"x": folder})


def test_pushed_names_in_every_form_reach_one_adapter() -> None:
    declared = ["a", "b"]
    want = ("b", "up.lora_A.weight")
    assert peft_form("base_model.model.up.lora_A.b.weight", declared, "a", None) == want
    assert peft_form("up.lora_A.b.weight", declared, "a", None) == want
    assert peft_form("base_model.model.up.lora_A.weight", declared, "b", None) == want
    assert peft_form("base_model.model.up.lora_A.default.weight", declared, "b", None) == want
    assert peft_form("up.weight", declared, "a", None) is None  # a base tensor
    assert peft_form("up.lora_A.b.weight", declared, "a", {"add": "lm."}) == (
        "b",
        "lm.up.lora_A.weight",
    )
    with pytest.raises(LoadError, match="names no adapter"):
        peft_form("up.lora_A.weight", declared, None, None)


def test_a_model_without_adapters_keeps_its_parameters() -> None:
    mv = SimpleNamespace(weights=PlacedWeights())
    assert choose(mv, {"adapter": "x", "t": 1}) == {"adapter": "x", "t": 1}


# ----------------------------------------------------------------------------- config


def write_project(tmp_path: Path, adapters: str, extra: str = "") -> Path:
    (tmp_path / "model.py").write_text("def build():\n    return abs\n\ndef ex():\n    return 0\n")
    config = tmp_path / "hotreload.toml"
    config.write_text(
        '[[models]]\nname = "m"\nentry = "model.py:build"\nexample = "model.py:ex"\n'
        f"adapters = {adapters}\n{extra}"
    )
    return config


def config_error(tmp_path: Path, adapters: str, extra: str = "") -> str:
    with pytest.raises(ConfigError) as failed:
        load_config(write_project(tmp_path, adapters, extra))
    return str(failed.value)


def test_config_declares_adapters_by_name_or_folder(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    table = f'{{ first = "{folders["a"]}", second = "{folders["b"]}" }}'
    m = load_config(write_project(tmp_path, table)).models[0]
    assert [a.name for a in m.adapters] == ["first", "second"] and m.default_adapter == "first"
    assert folders["b"] / "adapter_model.safetensors" in m.weight_files
    listed = load_config(
        write_project(tmp_path, f'["{folders["b"]}"]', 'default_adapter = "base"')
    ).models[0]
    assert [a.name for a in listed.adapters] == ["b"] and listed.default_adapter == "base"


def test_config_errors_say_what_to_fix(folders: dict[str, Path], tmp_path: Path) -> None:
    assert "adapter folder" in config_error(tmp_path, '{ a = "nowhere" }')
    assert "does not exist" in config_error(tmp_path, '{ a = "nowhere" }')
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text("{not json")
    (bad / "adapter_model.safetensors").write_bytes(b"")
    assert "is not valid JSON" in config_error(tmp_path, f'{{ a = "{bad}" }}')
    (bad / "adapter_config.json").write_text('{"peft_type": "IA3", "target_modules": ["x"]}')
    assert "serves LoRA adapters" in config_error(tmp_path, f'{{ a = "{bad}" }}')
    (bad / "adapter_model.safetensors").unlink()
    assert "no adapter_model.safetensors" in config_error(tmp_path, f'{{ a = "{bad}" }}')
    assert "not 'base'" in config_error(tmp_path, f'{{ base = "{folders["a"]}" }}')
    wrong = config_error(tmp_path, f'{{ a = "{folders["a"]}" }}', 'default_adapter = "z"')
    assert "'z' is not a declared adapter; expected one of a or 'base'" in wrong
