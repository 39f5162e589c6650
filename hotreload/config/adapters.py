"""The `adapters` key of a `[[models]]` table: peft adapter folders served over the base.

    adapters = { a = "adapters/a", b = "adapters/b" }   # names of your choosing
    adapters = ["adapters/a"]                             # named after their folders
    default_adapter = "base"                              # optional: no adapter by default

Each folder is what peft's `save_pretrained` writes: `adapter_config.json` and
`adapter_model.safetensors`. The checks here read JSON only (no torch, no peft: the config
layer is the engine's); whether the target modules exist in the base is the worker's check,
made when it injects the adapter.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hotreload.config.checker import Checker

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
#: `default_adapter = "base"` (and `parameters={"adapter": "base"}`): the base alone.
BASE = "base"
_ADAPTER_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class Adapter:
    """One declared peft adapter folder."""

    #: What requests name it by (`parameters={"adapter": name}`).
    name: str
    #: The folder holding adapter_config.json and adapter_model.safetensors.
    folder: Path

    @property
    def config_file(self) -> Path:
        return self.folder / CONFIG_FILE

    @property
    def weights_file(self) -> Path:
        return self.folder / WEIGHTS_FILE

    @property
    def files(self) -> tuple[Path, Path]:
        """The files whose save reloads this adapter (and only it)."""
        return (self.config_file, self.weights_file)

    def to_wire(self) -> dict[str, str]:
        return {"name": self.name, "folder": str(self.folder)}


def _check_folder(m: Checker, where: str, folder: Path) -> None:
    if not folder.is_dir():
        m.fail(where, f"adapter folder {folder} does not exist")
    config = folder / CONFIG_FILE
    if not config.is_file():
        m.fail(
            where,
            f"{folder} has no {CONFIG_FILE}; an adapter folder is what peft's "
            "`save_pretrained` writes (adapter_config.json and adapter_model.safetensors)",
        )
    if not (folder / WEIGHTS_FILE).is_file():
        m.fail(where, f"{folder} has no {WEIGHTS_FILE} (peft's save_pretrained writes it)")
    try:
        doc = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        m.fail(where, f"{config} is not valid JSON: {exc}")
    if not isinstance(doc, dict) or not isinstance(doc.get("peft_type"), str):
        m.fail(where, f"{config} names no peft_type; is it a peft adapter_config.json?")
    if doc["peft_type"] != "LORA":
        m.fail(
            where,
            f"{config} is a {doc['peft_type']} adapter; hotreload serves LoRA adapters "
            '(peft_type "LORA")',
        )
    if not doc.get("target_modules"):
        m.fail(where, f"{config} names no target_modules; save the adapter with peft again")


def parse_adapters(m: Checker, root: Path) -> tuple[Adapter, ...]:
    """`adapters`: a table of name -> folder, or a list of folders (named after them)."""
    what = 'a table of name = "folder" or a list of folders'
    raw = m.get("adapters", (dict, list), None, what)
    if raw is None:
        return ()
    key = m.sub("adapters")
    if isinstance(raw, list):
        items = []
        for i, item in enumerate(raw):
            if not isinstance(item, str):
                m.fail(f"{key}[{i}]", f"expected a folder path, got {item!r}")
            items.append((Path(item).name, item, f"{key}[{i}]"))
    else:
        items = [(name, item, f"{key}.{name}") for name, item in raw.items()]
    if not items:
        m.fail(key, f"expected at least one adapter folder: {what}")
    adapters: list[Adapter] = []
    for name, item, where in items:
        if not isinstance(item, str):
            m.fail(where, f"expected a folder path, got {item!r}")
        if not _ADAPTER_NAME_RE.match(name) or name == BASE:
            m.fail(
                where,
                f"adapter name {name!r}: expected letters, digits, '_', '-' (at most 64, not "
                f"starting with a digit or '-'), and not {BASE!r} (that names the base alone)",
            )
        if any(a.name == name for a in adapters):
            m.fail(where, f"two adapters are named {name!r}; name them in a table instead")
        folder = Path(item).expanduser()
        folder = folder if folder.is_absolute() else root / folder
        _check_folder(m, where, folder)
        adapters.append(Adapter(name, folder.resolve()))
    return tuple(adapters)


def parse_default_adapter(m: Checker, adapters: tuple[Adapter, ...]) -> str | None:
    """`default_adapter`: what a request naming no adapter gets (the first declared, or
    "base" for the base alone)."""
    raw = m.get("default_adapter", str, None, f'an adapter name or "{BASE}"')
    if raw is None:
        return adapters[0].name if adapters else None
    names = [a.name for a in adapters]
    if not adapters:
        m.fail(m.sub("default_adapter"), "no `adapters` are declared")
    if raw != BASE and raw not in names:
        m.fail(
            m.sub("default_adapter"),
            f"{raw!r} is not a declared adapter; expected one of {', '.join(names)} or {BASE!r}",
        )
    return raw
