"""What build() set each parameter to, before the weights files replaced it.

The override warning (engine/model/override_check.py) is true only when an edit changed a
value build() gives a parameter that the weights file then replaced: editing `SCALE` in
`nn.Parameter(torch.full((4,), SCALE))` changes nothing that serves. So each version records
a digest per tensor of what build() left, for the tensors the files replaced, and the
manager compares them with the previous version's.

Only what build() computed itself is digested: a tensor an init function was given
(`torch.nn.init`, or transformers' own, `hf_init_skipped`) is left as allocated while a
build with weights runs (fast_build.py) and holds no value build() chose, so it is left out,
by its memory and by the parameter object (transformers pads ModernBERT's tied decoder bias,
`bias.data = pad(bias.data, ...)`: a copy of that uninitialised memory, different on every
build). The other side: a value build() itself puts into such a parameter afterwards is not
seen. The build runs under a fixed seed, on a forked RNG, so `torch.randn` draws the same
for the same code; a parameter made with `torch.empty` and no init at all holds whatever the
allocator had. Cost: one blake2b pass over the few tensors build() computed outside the init
functions (usual layers initialise through them), on the loader thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

#: The seed a build with weights runs under (a forked RNG: the worker's own is untouched).
BUILD_SEED = 0


@contextlib.contextmanager
def seeded_build() -> Iterator[None]:
    """The factory's random draws the same for the same code (CPU generator, restored after)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(BUILD_SEED)
        yield


def _digest(t: torch.Tensor) -> str:
    flat = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    h = hashlib.blake2b(digest_size=12)
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(memoryview(flat.numpy()))
    return h.hexdigest()


class InitGiven:
    """The tensors init functions were given while a build ran: their data pointers, and
    the tensor objects themselves (held weakly: a build keeps none of them alive)."""

    def __init__(self) -> None:
        self.pointers: set[int] = set()
        self._objects: dict[int, weakref.ref[torch.Tensor]] = {}

    def add(self, t: torch.Tensor) -> None:
        if t.numel():
            self.pointers.add(t.data_ptr())
        with contextlib.suppress(TypeError):
            self._objects[id(t)] = weakref.ref(t)

    def holds(self, t: torch.Tensor) -> bool:
        """Was `t`, or the memory under it, given to an init function?"""
        ref = self._objects.get(id(t))
        return (ref is not None and ref() is t) or bool(t.numel() and t.data_ptr() in self.pointers)

    def clear(self) -> None:
        self.pointers.clear()
        self._objects.clear()


def built_values(model: object, skipped: InitGiven) -> dict[str, str]:
    """Each state-dict key of `model` whose value build() computed -> its digest; tensors
    an init function was given (`skipped`) are left out, as are meta tensors."""
    if not isinstance(model, torch.nn.Module):
        return {}
    out: dict[str, str] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if not isinstance(t, torch.Tensor) or t.is_quantized:
            continue  # packed parameters (a dtype, a tuple), quantized after build()'s init
        if t.device.type == "meta" or skipped.holds(t):
            continue
        out[name] = _digest(t)
    return out


@contextlib.contextmanager
def hf_init_skipped(record: Callable[[torch.Tensor], object]) -> Iterator[None]:
    """transformers' init functions call the torch ones it captured at import
    (`TORCH_INIT_FUNCTIONS`), which a patch of `torch.nn.init` does not reach. While the
    block runs they leave a Parameter as allocated (the strict load fills it from the files
    or refuses); a buffer is still initialised (a non-persistent one is in no file).
    `record` is told each tensor given to them. Nothing happens without transformers."""
    module = sys.modules.get("transformers.initialization")
    table = getattr(module, "TORCH_INIT_FUNCTIONS", None)
    if not isinstance(table, dict):
        yield
        return
    saved = dict(table)

    def skipping(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            record(tensor)
            if isinstance(tensor, torch.nn.Parameter):
                return tensor
            return fn(tensor, *args, **kwargs)

        return run

    table.update({name: skipping(fn) for name, fn in saved.items()})
    try:
        yield
    finally:
        table.update(saved)
