"""peft LoRA adapters over a model's base weights, built once and chosen per request.

A build fills the base module's weights first (weight_sources.py), then injects each
declared adapter with peft's `inject_adapter_in_model` and loads its tensors with
`set_peft_model_state_dict`, which maps the names `save_pretrained` writes onto the
module's. An adapter whose two files are unchanged since the serving version loaded them
takes that version's tensors as they are: an adapter save costs its own bytes, whatever the
base weighs.

Per request the serving thread switches the active adapter (peft's `set_adapter`, or the
adapters disabled for "base") only when it differs from the last request's: about 1 ms for
a 7B model's 64 LoRA layers, on the thread that runs one request at a time, so a switch
never races a forward.

A restart (the worker died) comes back without an adapter whose files cannot be read (a
save cut short): the rest serve, and a request for that one says why
(`AdapterSet.unavailable`) until a readable save reloads it. Any other build fails instead.

Digests: an adapter's is the content digest of its tensors as peft saves them; the
version's is the sha256 of the base's digest and every adapter's name and digest, so an
adapter save re-hashes the adapter alone.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hotreload.worker.adapter_pushes import file_state
from hotreload.worker.load_error import LoadError
from hotreload.worker.weights_digest import digest_later, state_digest

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
#: Names the base alone (config/adapters.py).
BASE = "base"


class UnknownAdapter(LoadError):
    """A request named an adapter the model does not serve (a bad request, not a bug)."""


class AdapterUnavailable(LoadError):
    """A request named an adapter left out of this version: its files could not be read when
    the worker restarted. Not the request's fault: the worker answers it as unavailable."""

    #: The error code of the worker's reply (the client's WorkerUnavailableError, HTTP 503).
    code = "worker_unavailable"


def config_text(folder: Path) -> str:
    """adapter_config.json's text ("" when it cannot be read)."""
    try:
        return (folder / CONFIG_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def _stamp(folder: Path) -> tuple[Any, ...]:
    """Device, inode, size and modification time of both files: any save changes it."""
    out: list[Any] = []
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        try:
            st = os.stat(folder / name)
        except OSError:
            out.append(None)
            continue
        out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


@dataclass
class ServedAdapter:
    """One adapter as a version holds it."""

    name: str
    folder: str
    stamp: tuple[Any, ...]
    #: The module's names of its tensors (`...lora_A.<name>.weight`).
    keys: list[str]
    digest: str = ""
    #: "file" (read now), "shared" (the serving version's tensors), plus "+push".
    source: str = "file"
    #: adapter_config.json as read (peft rewrites it with every save: its text decides
    #: whether the layers may have changed, not its stamp).
    config: str = ""

    def wire(self) -> dict[str, Any]:
        return {"digest": self.digest, "source": self.source, "folder": self.folder}


@dataclass(frozen=True)
class LeftOut:
    """An adapter a restart left out: its files as they were then, and why."""

    stamp: tuple[Any, ...]
    why: str


@dataclass
class AdapterSet:
    """The adapters of one version, the base tensors they sit on, and which one is active."""

    adapters: dict[str, ServedAdapter]
    #: What a request naming no adapter gets (an adapter's name, or "base").
    default: str
    #: The base's tensors by the base module's names (before injection renamed them to
    #: `...base_layer.weight`): the next build shares these.
    base_state: dict[str, torch.Tensor] = field(default_factory=dict)
    base_digest: str | None = None
    #: peft's LoRA layers of the module, found once.
    layers: list[Any] = field(default_factory=list)
    active: str | None = None
    #: Declared adapters a restart left out, by name (their files could not be read).
    unavailable: dict[str, LeftOut] = field(default_factory=dict)

    def wire(self) -> dict[str, Any]:
        """What replies and status show: each adapter's digest, the base's, the default,
        and why each adapter left out is."""
        out = {
            "default": self.default,
            "base_digest": self.base_digest,
            "adapters": {n: a.wire() for n, a in self.adapters.items()},
        }
        if self.unavailable:
            out["unavailable"] = {n: u.why for n, u in self.unavailable.items()}
        return out

    def select(self, name: str | None) -> str:
        """Make `name` (None: the default) the active adapter; returns the one chosen."""
        chosen = self.default if name is None else str(name)
        if chosen in self.unavailable:
            raise AdapterUnavailable(
                f"adapter {chosen!r} is not served {self.unavailable[chosen].why}"
            )
        if chosen != BASE and chosen not in self.adapters:
            known = ", ".join([*self.adapters, BASE])
            raise UnknownAdapter(f"unknown adapter {chosen!r}; this model serves: {known}")
        if chosen != self.active:
            for layer in self.layers:
                layer.enable_adapters(chosen != BASE)
                if chosen != BASE:
                    layer.set_adapter(chosen, inference_mode=True)
            self.active = chosen
        return chosen

    def whole_digest(self) -> str | None:
        if self.base_digest is None:
            return None
        h = hashlib.sha256(b"hotreload-adapters-v1\0" + self.base_digest.encode())
        for name in sorted(self.adapters):
            h.update(f"\0{name}\0{self.adapters[name].digest}".encode())
        return "sha256:" + h.hexdigest()[:32]

    def digest_into(self, mv: Any, current: Any, digest_now: bool) -> None:
        """Set `mv.digest` (or `mv.digest_future`): the base's digest is the serving
        version's when its tensors are shared, else hashed (beside the warm-up unless
        `digest_now`)."""
        held = getattr(getattr(current, "weights", None), "adapters", None)
        if mv.weights.reused and current is not None:
            self.base_digest = held.base_digest if held is not None else current.digest
        if self.base_digest is None and digest_now:
            self.base_digest = state_digest(self.base_state)
        if self.base_digest is not None:
            mv.digest = self.whole_digest()
            return
        base_future = digest_later(self.base_state)
        whole: Future[str] = Future()

        def done(f: Future[str]) -> None:
            if f.exception() is not None:
                whole.set_exception(f.exception())  # type: ignore[arg-type]
                return
            self.base_digest = f.result()
            digest = self.whole_digest()
            mv.digest = digest
            whole.set_result(digest or "")

        base_future.add_done_callback(done)
        mv.digest_future = whole


def _adapter_params(layers: Sequence[tuple[str, Any]], name: str) -> dict[str, torch.Tensor]:
    """The module's tensors of adapter `name`, by their state-dict names, from peft's own
    layer structure (`adapter_layer_names`: lora_A, lora_B, lora_embedding_A, ...)."""
    out: dict[str, torch.Tensor] = {}
    for path, layer in layers:
        for attr in layer.adapter_layer_names:
            holder = getattr(layer, attr, None)
            if holder is None or name not in holder:
                continue
            part = holder[name]
            if isinstance(part, torch.nn.Module):
                for sub, t in part.state_dict(keep_vars=True).items():
                    out[f"{path}.{attr}.{name}.{sub}"] = t
            else:
                out[f"{path}.{attr}.{name}"] = part
    return out


def _peft_config(folder: Path, name: str) -> Any:
    from peft import PeftConfig

    try:
        config = PeftConfig.from_pretrained(str(folder))
    except Exception as exc:
        raise LoadError(f"adapter {name!r}: cannot read {folder / CONFIG_FILE}: {exc}") from None
    config.inference_mode = True
    return config


def _inject(model: torch.nn.Module, config: Any, name: str, folder: Path) -> None:
    from peft import inject_adapter_in_model

    try:
        with warnings.catch_warnings():
            # A second adapter over the first: peft warns that it is adding one; that is
            # what is asked for.
            warnings.simplefilter("ignore")
            inject_adapter_in_model(config, model, adapter_name=name, low_cpu_mem_usage=True)
    except ValueError as exc:
        raise LoadError(
            f"adapter {name!r} ({folder}) does not fit the base model: {exc}; was it trained "
            "on this base?"
        ) from None


def lay_pushes(
    model: torch.nn.Module,
    pushes: Sequence[tuple[int, Mapping[str, Mapping[str, torch.Tensor]]]],
    served: Mapping[str, Any],
    seen: set[int] | frozenset[int] = frozenset(),
    left_out: Mapping[str, LeftOut] | None = None,
    restart: bool = False,
) -> None:
    """Pushed adapter tensors (push id, adapter -> state) over `model`, each adapter marked
    "+push"; a push in `seen` is skipped (the serving version's tensors hold it already, or
    a newer file won). An adapter `left_out` goes without its pushes on a `restart`; a new
    push to it is refused (nothing to lay it over)."""
    for push_id, groups in pushes:
        if push_id in seen:
            continue
        for name, state in groups.items():
            out = (left_out or {}).get(name)
            if out is not None:
                if restart:
                    continue
                raise LoadError(
                    f"pushed tensors for adapter {name!r}, which is not served {out.why}"
                )
            _load(model, state, name, "the push")
            if not served[name].source.endswith("+push"):
                served[name].source += "+push"


def _load(
    model: torch.nn.Module,
    state: Mapping[str, torch.Tensor],
    name: str,
    what: str,
) -> Any:
    """peft's own load of a state as peft saves it: names mapped, tensors assigned (never
    copied into the serving version's, which may share them)."""
    from peft import set_peft_model_state_dict

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = set_peft_model_state_dict(
            model, dict(state), adapter_name=name, low_cpu_mem_usage=True
        )
    unexpected = list(result.unexpected_keys)
    if unexpected:
        shown = ", ".join(unexpected[:5]) + (" ..." if len(unexpected) > 5 else "")
        raise LoadError(
            f"adapter {name!r}: {what} holds {len(unexpected)} tensor(s) its LoRA layers do "
            f"not have: {shown}"
        )
    return result


def lora_layers(model: torch.nn.Module) -> list[tuple[str, Any]]:
    """peft's tuner layers of `model`, by module path."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [(p, m) for p, m in model.named_modules() if isinstance(m, BaseTunerLayer)]


def adapter_digest(model: torch.nn.Module, name: str) -> str:
    """The content digest of adapter `name`'s tensors as peft saves them."""
    from peft.utils import get_peft_model_state_dict

    # save_embedding_layers=False: "auto" would look up the base's config on the Hub.
    state = get_peft_model_state_dict(model, adapter_name=name, save_embedding_layers=False)
    return state_digest(state)


def attach(
    model: torch.nn.Module,
    specs: Sequence[Mapping[str, Any]],
    default: str | None,
    *,
    current: Any,
    pushes: Sequence[tuple[int, dict[str, dict[str, torch.Tensor]]]],
    device: torch.device,
    prefix: Mapping[str, str] | None = None,
    restart: bool = False,
) -> AdapterSet:
    """Inject every declared adapter into `model` (its base weights in place) and load its
    tensors: the serving version's when its files are unchanged, else the files'; then the
    pushes of adapter tensors (id, adapter -> state as peft saves it) in order. On a
    `restart` an adapter whose files cannot be read is left out (`AdapterSet.unavailable`);
    one the serving version left out stays out while its files stay as they were."""
    from peft import PeftConfig

    base_state = dict(model.state_dict(keep_vars=True))
    held = getattr(getattr(current, "weights", None), "adapters", None)
    held_model = getattr(current, "model", None)
    configs: dict[str, PeftConfig] = {}
    served: dict[str, ServedAdapter] = {}
    left_out: dict[str, LeftOut] = {}
    for spec in specs:
        name, folder = str(spec["name"]), Path(str(spec["folder"]))
        stamp = _stamp(folder)
        was_out = held.unavailable.get(name) if held is not None else None
        if was_out is not None and was_out.stamp == stamp:
            left_out[name] = was_out  # the same files, still unreadable
            continue
        old = held.adapters.get(name) if held is not None else None
        shared = old is not None and old.stamp == stamp and held_model is not None
        try:
            # Both files read before anything is injected: one that cannot be read on a
            # restart leaves the module as if the adapter were not declared.
            configs[name] = _peft_config(folder, name)
            state = None if shared else file_state(_read(folder / WEIGHTS_FILE, name), prefix)
        except LoadError as exc:
            if not restart:
                raise
            detail = str(exc).removeprefix(f"adapter {name!r}: ")
            mend = "save it again (a complete file) to serve it"
            left_out[name] = LeftOut(stamp, f"since the worker restarted: {detail}; {mend}")
            continue
        _inject(model, configs[name], name, folder)
        keys = list(_adapter_params(lora_layers(model), name))
        if shared and old is not None and old.keys == keys:
            mine = held_model.state_dict(keep_vars=True)
            model.load_state_dict({k: mine[k].detach() for k in keys}, strict=False, assign=True)
            source = "shared"
        else:
            if state is None:  # unchanged files, but the layers changed: read them
                state = file_state(_read(folder / WEIGHTS_FILE, name), prefix)
            _load(model, state, name, WEIGHTS_FILE)
            source = "file"
        served[name] = ServedAdapter(
            name, str(folder), stamp, keys, source=source, config=config_text(folder)
        )
    model.peft_config = configs  # every adapter's, for peft's functions below
    seen = set(getattr(getattr(current, "weights", None), "overlay_ids", ()))
    lay_pushes(model, pushes, served, seen, left_out, restart)
    layers = lora_layers(model)
    for name, adapter in served.items():
        params = _adapter_params(layers, name)
        left = sorted(k for k, t in params.items() if t.device.type == "meta")
        if left:
            raise LoadError(
                f"adapter {name!r}: {WEIGHTS_FILE} in {adapter.folder} misses {len(left)} of "
                f"its tensor(s): {', '.join(left[:5])}; save the adapter with peft again"
            )
        adapter.digest = adapter_digest(model, name)
    for _, layer in layers:
        layer.to(device)
    # The first declared when none is named: not another one when that is left out.
    chosen = default or (str(specs[0]["name"]) if specs else BASE)
    aset = AdapterSet(served, chosen, base_state, layers=[m for _, m in layers])
    aset.unavailable = left_out
    # The warm-up and the smoke test run the default, or the base when it is left out.
    aset.select(BASE if chosen in left_out else chosen)
    return aset


def _read(path: Path, name: str) -> dict[str, torch.Tensor]:
    """The adapter file's tensors, read with pread(2) into memory of this process's own:
    a mapping of the file (safetensors' `load_file`) would die with SIGBUS at the next
    request once a save in place truncates it. A file cut short fails here, whole."""
    from safetensors.torch import load, load_file

    try:
        try:
            return load_file(str(path), device="cpu", backend="pread")
        except TypeError:  # safetensors before 0.8 has no `backend`: the bytes, read whole
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.frombuffer over read-only bytes: cloned
                return {k: t.clone() for k, t in load(path.read_bytes()).items()}
    except Exception as exc:
        raise LoadError(f"adapter {name!r}: cannot read {path}: {exc}") from None


def choose(mv: Any, params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A request's parameters without `adapter`, that adapter made active on `mv`'s model
    (UnknownAdapter names the ones served). A model without adapters gets its parameters
    as they are: one whose own call takes `adapter` keeps it."""
    aset = getattr(getattr(mv, "weights", None), "adapters", None)
    if aset is None:
        return dict(params) if params else None
    name = (params or {}).get("adapter")
    aset.select(None if name is None else str(name))
    rest = {k: v for k, v in (params or {}).items() if k != "adapter"}
    return rest or None
