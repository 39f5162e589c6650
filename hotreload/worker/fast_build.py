"""Building a module whose parameters a weights file is about to replace, without paying for
their random initialization.

`reset_parameters()` of torch's layers and Hugging Face's `_init_weights` fill every
parameter through `torch.nn.init`: for a 1 GiB model, seconds of random numbers the file
overwrites at once. While the factory runs for such a build, those functions leave the
tensor as allocated (as Hugging Face's `no_init_weights` does for `from_pretrained`), and
the weights then take the parameters' place (`load_state_dict(assign=True)`). Buffers the
module computes itself (a rotary `inv_freq`) are computed as usual. What build() did compute
is digested per tensor on the way (init_values.py).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from hotreload.worker.init_values import InitGiven, built_values, hf_init_skipped, seeded_build
from hotreload.worker.shared_weights import SharedBlock, copy_into_block

#: The in-place `torch.nn.init` functions layers initialise their parameters with (all of
#: them: `uniform_`, `kaiming_normal_`, `zeros_`, ...).
_INIT_NAMES = tuple(n for n in dir(torch.nn.init) if n.endswith("_") and not n.startswith("_"))
_LOCK = threading.Lock()
#: The tensors an init function filled, or left, in the build running now.
_TOUCHED = InitGiven()


def _leave(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    if isinstance(tensor, torch.Tensor):
        _TOUCHED.add(tensor)
    return tensor


@contextlib.contextmanager
def skipped_init() -> Iterator[InitGiven]:
    """`torch.nn.init` leaves tensors as they are while the block runs (one build at a time;
    inference never calls these, so the serving thread is unaffected), nor do transformers'
    own for parameters (init_values.hf_init_skipped). Yields the tensors an init function
    was given."""
    with _LOCK:
        _TOUCHED.clear()
        saved = {n: getattr(torch.nn.init, n) for n in _INIT_NAMES}
        for name in saved:
            setattr(torch.nn.init, name, _leave)
        try:
            with hf_init_skipped(_leave):
                yield _TOUCHED
        finally:
            for name, fn in saved.items():
                setattr(torch.nn.init, name, fn)
            _TOUCHED.clear()


def build_without_init(
    factory: Callable[[], Any],
    note: Callable[[str], None],
    set_by_build: dict[str, str] | None = None,
) -> Any:
    """`factory()` with initialization skipped; when the factory cannot run that way, an
    ordinary build, and `note` says why (once per version). `set_by_build` is filled with
    a digest of each tensor build() computed itself (not left by init): init_values.py."""
    try:
        with seeded_build(), skipped_init() as touched:
            model = factory()
            if set_by_build is not None:
                set_by_build.update(built_values(model, touched))
            return model
    except Exception as exc:
        model = factory()  # raises the user's own error when that is what it was
        note(
            f"build() failed with parameter initialization skipped ({type(exc).__name__}: "
            f"{exc}); built it with initialization, as without weights (slower for large "
            "models)"
        )
        return model


def _owner(model: torch.nn.Module, key: str) -> tuple[torch.nn.Module, str]:
    path, _, attr = key.rpartition(".")
    return (model.get_submodule(path) if path else model), attr


def retie(model: torch.nn.Module, ties: Mapping[str, frozenset[str]], loaded: set[str]) -> None:
    """After an assigning load, every name of a tied group is one parameter again (the one
    the file held): assigning gave the loaded names new tensors and left the rest behind."""
    done: set[frozenset[str]] = set()
    for group in ties.values():
        if group in done:
            continue
        done.add(group)
        source = sorted(group & loaded)
        if not source:
            continue
        module, attr = _owner(model, source[0])
        shared = module._parameters.get(attr)
        if shared is None:
            shared = module._buffers[attr]
        for key in group - {source[0]}:
            owner, name = _owner(model, key)
            if name in owner._parameters:
                owner._parameters[name] = shared  # type: ignore[assignment]
            else:
                owner._buffers[name] = shared


def owned_tensors(
    model: torch.nn.Module,
    state: dict[str, torch.Tensor],
    *,
    shared: bool = False,
    fresh: set[str] = frozenset(),  # type: ignore[assignment]
) -> tuple[dict[str, torch.Tensor], SharedBlock | None]:
    """The file's tensors as memory of this process's own, in the module's dtypes, ready to
    become its parameters; on the CPU with `shared`, in one block (shared_weights.py) a
    respawn worker can map (shared memory faults in slower than private: only then).

    A copy, on purpose: safetensors maps the file, and a parameter over the mapping would
    kill the serving worker with SIGBUS when the file is rewritten in place
    (`open(path, "wb")`, as many save functions do). `fresh`: keys whose tensors are this
    process's memory already (experts stacked by transformers' conversion)."""
    own = model.state_dict(keep_vars=True)
    out: dict[str, torch.Tensor] = {}
    host: dict[str, torch.Tensor] = {}
    for key, t in state.items():
        mine = own.get(key)
        converted = t.to(mine.dtype) if mine is not None and mine.dtype != t.dtype else None
        if t.device.type == "cpu":
            # Still over the file's mapping unless converted (a conversion is a copy).
            host[key] = t if converted is None else converted
            if converted is None and not shared and key not in fresh:
                host[key] = t.clone()
        else:
            out[key] = t if converted is None else converted  # device memory of its own
    block = None
    if host and shared:
        host, block = copy_into_block(host)
    out.update(host)
    return out, block
