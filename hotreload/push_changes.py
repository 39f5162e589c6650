"""Which tensors of a pushed state changed since the push that made the serving weights.

A trainer that freezes most of its model (a LoRA fine-tune, a frozen encoder) pushes a
state of which only a few tensors moved. They are found without reading a byte: a frozen
parameter (an `nn.Parameter` with `requires_grad=False`) whose storage is the one pushed
last time, seen the same way (offset, shape, strides, dtype), with the same in-place
version counter (`t._version`, which `copy_`, `load_state_dict` and other in-place writes
bump), holds the bytes that push sent. The storage is compared by identity (a weak
reference to torch's storage object, which torch keeps for as long as the storage lives)
as well as by address, so memory freed and handed to a new tensor at the same address is
not mistaken for the old one.

Only frozen parameters are ever skipped, because the version counter cannot be trusted for
the others: torch's fused optimizers (`AdamW(fused=True)`, the Hugging Face Trainer's
default `adamw_torch_fused`) write parameters without bumping it (measured on torch 2.13:
`_version` unchanged across `step()`). A parameter that requires grad is trained, so it is
sent. Which tensors are parameters, and frozen, shows only in `state_dict(keep_vars=True)`:
a plain `state_dict()` detaches every tensor, so such a push is sent whole (safe, not
small). Never skipped either: buffers, numpy arrays, inference-mode tensors. A frozen
parameter written through `.data` (`p.data.copy_(x)`: the counter of the temporary `.data`
tensor moves, not the parameter's) needs `full=True`.

The session keeps every push since the weights files last changed and lays them in order
over the files' weights (engine/model/pushes.py), so a push of the changed tensors alone
makes the same weights as the whole state. A delta names the digest of the weights it
goes on top of (`base_digest`); the session refuses it when other weights serve (the files
changed, or the session restarted), and the client's next push sends everything.

No torch import: tensors are read by duck typing, as protocol/shared_state.py does.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Mark:
    """What identifies the bytes of one pushed tensor, as of the push."""

    storage: weakref.ref[Any]
    data_ptr: int
    view: tuple[Any, ...]  # storage offset, shape, strides, dtype, device
    version: int

    def matches(self, value: Any) -> bool:
        """Is `value` the tensor this mark was taken of, unchanged since?"""
        now = mark_of(value)
        if now is None or now.version != self.version or now.data_ptr != self.data_ptr:
            return False
        old = self.storage()
        return old is not None and old is now.storage() and now.view == self.view


def _frozen_parameter(value: Any) -> bool:
    torch = sys.modules.get("torch")
    parameter = getattr(getattr(torch, "nn", None), "Parameter", None)
    return parameter is not None and isinstance(value, parameter) and not value.requires_grad


def mark_of(value: Any) -> Mark | None:
    """The mark of a frozen parameter; None for a value that is sent every time (anything
    else: see the module docstring)."""
    if isinstance(value, np.ndarray) or not _frozen_parameter(value):
        return None
    try:
        version = int(value._version)
        storage = value.untyped_storage()
        ref = weakref.ref(storage)
        view = (
            int(value.storage_offset()),
            tuple(int(d) for d in value.shape),
            tuple(int(s) for s in value.stride()),
            str(value.dtype),
            str(value.device),
        )
        return Mark(ref, int(storage.data_ptr()), view, version)
    except (RuntimeError, TypeError, AttributeError):
        return None  # inference tensors raise on _version; odd subclasses may lack the rest


@dataclass
class Baseline:
    """The state the serving weights hold, as the client's last served push left them."""

    #: name -> mark (None: an array, sent again every time).
    marks: dict[str, Mark | None] = field(default_factory=dict)
    #: The names of the last strict push of the chain: a strict push with exactly these
    #: names may go as a delta (the session checked, for that push, that they are all the
    #: model's). None: no strict push yet.
    strict_names: frozenset[str] | None = None
    #: The serving weights' digest and version after that push.
    digest: str = ""
    version: int = 0


@dataclass
class PushPlan:
    """What one push sends, and what it will hold once it serves."""

    #: The tensors to pack (all of the state, or those that changed).
    send: dict[str, Any] = field(repr=False)
    #: The strict flag on the wire: False for a delta (the base covers the rest).
    strict: bool
    #: The digest the delta goes on top of (None: a whole state, on top of anything).
    base_digest: str | None
    #: The marks of every tensor of the state, taken before packing.
    marks: dict[str, Mark | None] = field(repr=False)
    #: The caller's strict, for the baseline this push makes.
    asked_strict: bool
    skipped: int = 0

    @property
    def delta(self) -> bool:
        return self.base_digest is not None


def plan_push(
    state: Mapping[str, Any], baseline: Baseline | None, *, strict: bool, full: bool
) -> PushPlan:
    """The tensors of `state` to send: all of them when there is no baseline, `full` asks
    so, or a strict push names other tensors than the last strict one; else those whose
    mark changed."""
    marks = {name: mark_of(value) for name, value in state.items()}
    whole = PushPlan(dict(state), strict, None, marks, strict)
    if full or baseline is None or not baseline.digest:
        return whole
    if strict and baseline.strict_names != frozenset(state):
        return whole
    send = {}
    for name, value in state.items():
        old = baseline.marks.get(name)
        if old is None or not old.matches(value):
            send[name] = value
    skipped = len(state) - len(send)
    if not skipped:
        return whole  # nothing to gain: a whole push needs no base and cannot go stale
    return PushPlan(send, False, baseline.digest, marks, strict, skipped)


def after_push(baseline: Baseline | None, plan: PushPlan, version: int, digest: str) -> Baseline:
    """The baseline once `plan`'s push serves as `version` with `digest`. A whole push
    starts the marks afresh: the pushes before it may not be under it (a restarted session
    holds none of them), and only what a digest vouches for may be skipped later."""
    strict_names = baseline.strict_names if baseline is not None else None
    if plan.asked_strict:
        strict_names = frozenset(plan.marks)
    if baseline is None or not plan.delta:
        return Baseline(dict(plan.marks), strict_names, digest, version)
    return Baseline({**baseline.marks, **plan.marks}, strict_names, digest, version)
