"""A push builds its version as a copy of the serving module, with no build() call
(worker/push_copy.py), and the serving version's module and tensors are left as they were.

The first test works on the module level, in this process; the second on a real `hotreload
serve` whose build() counts its calls in a file.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from hotreload import Client
from hotreload.errors import ReloadFailedError
from hotreload.protocol.shared_state import pack_state
from hotreload.worker.push_copy import structure_for_push
from hotreload.worker.weight_sources import PlacedWeights, place_weights
from tests.support import import_file, make_project, read_events


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        self.head = torch.nn.Linear(8, 20, bias=False)
        self.head.weight = self.emb.weight  # tied, as LMs tie embedding and head
        self.register_buffer("scale", torch.full((8,), 2.0))
        self.register_buffer("seen", torch.zeros(1), persistent=False)  # written in forward

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.seen += 1
        return self.head(self.body(self.emb(ids)) * self.scale)


def _serving() -> SimpleNamespace:
    torch.manual_seed(0)
    model = Net().eval()
    keys = set(model.state_dict())
    return SimpleNamespace(model=model, on_host=False, weights=PlacedWeights(keys=keys))


SPEC: dict[str, Any] = {"entry": {"spec": "model.py:build"}}


def test_the_copy_takes_the_push_and_leaves_the_serving_module_as_it_was() -> None:
    current = _serving()
    old = current.model
    before = {k: (v, v.clone()) for k, v in old.state_dict(keep_vars=True).items()}
    ids = torch.arange(6).reshape(1, 6)
    with torch.inference_mode():
        answer = old(ids).clone()
    pushed = {"body.0.weight": torch.randn(8, 8), "emb.weight": torch.randn(20, 8)}
    with pack_state(pushed) as packed:
        overlay = {"id": 1, "state": packed.descriptor, "strict": False}
        clone = structure_for_push(SPEC, current, [overlay], None)
        assert clone is not None and clone is not old and clone.body is not old.body
        placed = place_weights(clone, [], None, root=".", device=torch.device("cpu"),
                               current=current, overlays=[overlay])  # fmt: skip
    assert placed.overlay_ids == (1,) and placed.reused == len(before)
    new = clone.state_dict(keep_vars=True)
    for k, (obj, value) in before.items():
        mine = old.state_dict(keep_vars=True)[k]
        assert mine is obj and torch.equal(mine, value), k  # the serving module: untouched
        if isinstance(obj, torch.nn.Parameter):
            assert new[k] is not obj, k  # a Parameter of the copy's own
    assert torch.equal(new["body.0.weight"], pushed["body.0.weight"])
    assert clone.head.weight is clone.emb.weight  # still tied, to the pushed tensor
    assert torch.equal(clone.head.weight, pushed["emb.weight"])
    # Unchanged tensors share their bytes (no copy), in tensors of the copy's own.
    assert new["body.0.bias"].data_ptr() == before["body.0.bias"][0].data_ptr()
    with torch.inference_mode():
        assert torch.equal(old(ids), answer)
        ref = Net().eval()
        tied = {"head.weight": pushed["emb.weight"]}  # one tensor under both names
        ref.load_state_dict({k: v for k, (_, v) in before.items()} | pushed | tied)
        assert torch.equal(clone(ids), ref(ids))
    # Each version's own buffer: copied at 1 (old had run once), then each ran once more.
    assert clone.seen.data_ptr() != old.seen.data_ptr()
    assert (old.seen.item(), clone.seen.item()) == (2.0, 2.0)
    old.double()  # a `.to()` of one version (the resource policy's offload) ...
    assert all(p.dtype == torch.float32 for p in clone.parameters())  # ... not the other's


def test_no_copy_where_build_must_run() -> None:
    current = _serving()
    overlay = {"id": 1, "state": {}, "strict": False}
    assert structure_for_push(SPEC, current, [overlay], None) is not None
    assert structure_for_push(SPEC, None, [overlay], None) is None  # nothing serves here
    assert structure_for_push(SPEC, current, [], None) is None  # not a push
    assert structure_for_push(SPEC, current, [overlay], [0]) is None  # a shard re-saved
    adapters = SPEC | {"adapters": [{"name": "a"}]}
    assert structure_for_push(adapters, current, [overlay], None) is None
    script = {"entry": {"spec": "m.pt", "torchscript": True}}
    assert structure_for_push(script, current, [overlay], None) is None
    current.on_host = True  # offloaded: its tensors are not where the version serves
    assert structure_for_push(SPEC, current, [overlay], None) is None
    current.on_host = False
    current.weights.overlay_ids = (1,)  # the push is in the serving version already
    assert structure_for_push(SPEC, current, [overlay], None) is None


def _hf(name: str) -> torch.nn.Module:
    import transformers as tf

    small = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
    heads = dict(num_attention_heads=4, num_key_value_heads=2)
    if name == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**small, **heads))
    if name == "mixtral":
        return tf.MixtralForCausalLM(tf.MixtralConfig(**small, **heads, num_local_experts=4))
    if name == "gpt2":
        cfg = tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, bos_token_id=0)
        return tf.GPT2LMHeadModel(cfg)
    # T5 ties its embedding under four names (shared, both embed_tokens, lm_head).
    cfg = tf.T5Config(num_layers=2, d_model=64, num_heads=4, d_ff=128, vocab_size=256, d_kv=16)
    return tf.T5ForConditionalGeneration(cfg)


@pytest.mark.parametrize("arch", ["llama", "mixtral", "gpt2", "t5"])
def test_hugging_face_models_copied_answer_as_built_with_the_push(arch: str) -> None:
    torch.manual_seed(0)
    old = _hf(arch).eval()
    ids = torch.arange(8).reshape(1, 8)
    extra = {"decoder_input_ids": ids} if arch == "t5" else {}

    def logits(m: torch.nn.Module) -> torch.Tensor:
        with torch.inference_mode():
            return m(ids, **extra).logits

    before = logits(old)
    noise: dict[int, torch.Tensor] = {}  # per storage: tied names get the same new value
    state = {
        k: v + noise.setdefault(v.data_ptr(), 0.01 * torch.randn_like(v))
        if v.is_floating_point() else v.clone()
        for k, v in old.state_dict().items()
    }  # fmt: skip
    current = SimpleNamespace(
        model=old, on_host=False, weights=PlacedWeights(keys=set(old.state_dict()))
    )
    with pack_state(state) as packed:
        overlay = {"id": 1, "state": packed.descriptor, "strict": True}
        clone = structure_for_push(SPEC, current, [overlay], None)
        assert clone is not None
        place_weights(clone, [], None, root=".", device=torch.device("cpu"),
                      current=current, overlays=[overlay])  # fmt: skip
    built = _hf(arch).eval()
    built.load_state_dict(state)
    assert torch.equal(logits(clone), logits(built))
    assert torch.equal(logits(old), before)


def test_modules_bound_to_the_serving_ones_are_built_not_copied() -> None:
    def serving(model: torch.nn.Module) -> SimpleNamespace:
        keys = set(model.state_dict())
        return SimpleNamespace(model=model, on_host=False, weights=PlacedWeights(keys=keys))

    overlay = {"id": 1, "state": {}, "strict": False}
    with warnings.catch_warnings():  # importing torch._dynamo warns of torch.jit's end
        warnings.simplefilter("ignore", DeprecationWarning)
        compiled = torch.compile(torch.nn.Linear(4, 4))  # its forward: the original's, bound
    hooked = torch.nn.Linear(4, 4)
    hooked.register_forward_hook(lambda m, i, o: o)
    bound = torch.nn.Linear(4, 4)
    bound.run = bound.forward  # type: ignore[assignment]
    parametrized = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 4))
    for model in (compiled, hooked, bound, torch.nn.Sequential(parametrized)):
        assert structure_for_push(SPEC, serving(model), [overlay], None) is None, model


COUNTING = """
from pathlib import Path
import torch
from model_base import MLP, IN_FEATURES

SCALE = 1.0


def build():
    with open(Path(__file__).with_name("builds.log"), "a") as f:
        f.write("build\\n")
    m = MLP()
    m.scale = SCALE
    return m


def example_input():
    return torch.randn(1, IN_FEATURES, generator=torch.Generator().manual_seed(0))
"""


def _project(tmp_path: Path) -> Path:
    config = make_project(tmp_path)
    proj = config.parent
    base = (proj / "model.py").read_text().replace("* SCALE", "* getattr(self, 'scale', 1.0)")
    (proj / "model_base.py").write_text(base)
    (proj / "model.py").write_text(COUNTING)
    return config


def _in_process(config: Path, state: dict[str, torch.Tensor], x: np.ndarray, scale: float):
    module = import_file(config.parent / "model_base.py", "hr_model_base")
    torch.set_num_threads(1)
    model = module.MLP().eval()
    model.scale = scale
    model.load_state_dict(state)
    with torch.inference_mode():
        return model(torch.from_numpy(x)).numpy()


def _load_details(config: Path) -> list[str]:
    return [
        str(e.get("detail"))
        for e in read_events(config)
        if e.get("kind") == "phase_end" and e.get("phase") == "load"
    ]


def test_pushes_do_not_call_build_and_a_failed_one_leaves_v1_bit_for_bit(
    tmp_path: Path, serve: Any
) -> None:
    import safetensors.torch

    config = _project(tmp_path)
    builds = config.parent / "builds.log"
    serve(config)
    x = np.random.default_rng(3).standard_normal((2, 64), dtype=np.float32)
    state = safetensors.torch.load_file(str(config.parent / "weights.safetensors"))
    with Client(config=config, timeout_s=60) as client:
        for step in range(3):
            g = torch.Generator().manual_seed(step)
            state = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in state.items()}
            reply = client.update_weights("mlp", state)
            result = client.infer("mlp", x, min_version=reply["version"])
            assert result.digest == reply["digest"]
            np.testing.assert_array_equal(result.output, _in_process(config, state, x, 1.0))
        assert builds.read_text().count("build") == 1  # the start's only
        assert sum("the serving module copied" in d for d in _load_details(config)) == 3
        served = client.infer("mlp", x)
        # A push whose answers are not finite fails its smoke test after the copy took it:
        # what serves must be the very bytes it was.
        broken = dict(state, **{"out.bias": torch.full_like(state["out.bias"], float("nan"))})
        with pytest.raises(ReloadFailedError, match="smoke"):
            client.update_weights("mlp", broken)
        after = client.infer("mlp", x)
        assert (after.version, after.digest) == (served.version, served.digest)
        np.testing.assert_array_equal(after.output, served.output)
        # A code edit calls build() again, and the pushed weights stay over the files'.
        model_py = config.parent / "model.py"
        model_py.write_text(model_py.read_text().replace("SCALE = 1.0", "SCALE = 2.0"))
        outcome = client.reload("mlp")["outcomes"][0]
        assert outcome["ok"], json.dumps(outcome)
        edited = client.infer("mlp", x)
        np.testing.assert_array_equal(edited.output, _in_process(config, state, x, 2.0))
    assert builds.read_text().count("build") == 2
    # A copied push skips the warm-up (its module's code and caches are the serving one's,
    # warm already: the smoke test is its first pass); a code edit's build warms as before.
    warms = [
        e for e in read_events(config) if e.get("kind") == "phase_end" and e["phase"] == "warm"
    ]
    skipped = [e.get("skipped") for e in warms][-5:]  # 4 pushes (the NaN one too), the edit
    assert skipped == [True, True, True, True, False], warms
    assert warms[-2]["detail"] == "the serving module copied: warm already", warms
