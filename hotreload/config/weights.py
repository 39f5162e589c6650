"""The config keys about what a model is loaded from: `weights`, `weights_prefix`, and an
`entry` that names a TorchScript archive instead of a factory.

Kept apart from the other `[[models]]` keys (config/models.py) so that file stays readable;
the checks here use the same `Checker`, so their errors read like every other config error.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hotreload.config.checker import Checker

WEIGHTS_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")
#: What `entry = "model.pt"` may name: an archive written by torch.jit.save.
TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript")


@dataclass(frozen=True)
class WeightsPrefix:
    """How the weights files' keys map onto the module's: `strip` comes off the keys that
    start with it, then `add` goes in front of every key."""

    strip: str = ""
    add: str = ""

    def to_wire(self) -> dict[str, str]:
        return {"strip": self.strip, "add": self.add}


def is_torchscript_archive(path: Path) -> bool:
    """True for a file torch.jit.save wrote (a zip with constants.pkl and a code/ folder),
    read without torch: torch.save's zips have neither."""
    try:
        with zipfile.ZipFile(path) as zf:
            return any(n.endswith("/constants.pkl") or "/code/" in n for n in zf.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def looks_like_torchscript_entry(value: str) -> bool:
    """`entry = "model.pt"`: a file name with a TorchScript suffix and no `:callable`."""
    return ":" not in value and value.endswith(TORCHSCRIPT_SUFFIXES)


def torchscript_entry_file(value: str, *, checker: Checker, key: str, root: Path) -> Path:
    """The archive an `entry` names, checked to be one."""
    where = checker.sub(key)
    file = Path(value).expanduser()
    file = file if file.is_absolute() else root / file
    if not file.is_file():
        checker.fail(where, f"file {file} does not exist (paths are relative to {root})")
    if not is_torchscript_archive(file):
        checker.fail(
            where,
            f"{value!r} is not a TorchScript archive (torch.jit.save); a state dict goes in "
            "`weights`, with an entry 'model.py:build' that builds the module it loads into",
        )
    return file.resolve()


def shards_of_index(index: Path) -> list[Path]:
    """The shard files a sharded checkpoint's index (`model.safetensors.index.json`, as
    `save_pretrained` writes it) names in its `weight_map`, in name order (save_pretrained
    numbers them); ValueError says what is wrong with it."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"{index.name} is not a checkpoint index with a `weight_map` "
            f"({type(exc).__name__}: {exc})"
        ) from None
    shards = [index.parent / str(n) for n in names]
    absent = [s.name for s in shards if not s.is_file()]
    if absent:
        raise ValueError(f"{index.name} names shard(s) that do not exist: {', '.join(absent)}")
    return shards


def parse_weights(m: Checker, root: Path) -> tuple[Path, ...]:
    """`weights`: existing .safetensors, .pt, .pth or .bin files; an `*.index.json` of a
    sharded checkpoint stands for the shards it names (each stamped, and read, on its own:
    a re-saved shard is the only one read again)."""
    weights: list[Path] = []
    for i, item in enumerate(m.str_list("weights")):
        p = Path(item).expanduser()
        p = p if p.is_absolute() else root / p
        if not p.is_file():
            m.fail(f"{m.sub('weights')}[{i}]", f"file {p} does not exist")
        if p.name.endswith(".index.json"):
            try:
                weights.extend(s.resolve() for s in shards_of_index(p))
            except ValueError as exc:
                m.fail(f"{m.sub('weights')}[{i}]", str(exc))
            continue
        if p.suffix not in WEIGHTS_SUFFIXES:
            m.fail(
                f"{m.sub('weights')}[{i}]",
                f"expected a .safetensors, .pt, .pth or .bin file, or a sharded checkpoint's "
                f"*.index.json, got {p.name!r}",
            )
        weights.append(p.resolve())
    return tuple(weights)


def parse_weights_prefix(m: Checker, weights: tuple[Path, ...]) -> WeightsPrefix | None:
    """`weights_prefix = "inner."` (added to every key of the files), or
    `weights_prefix = { strip = "model.", add = "inner." }` (either part optional)."""
    what = 'a prefix such as "inner.", or a table { strip = "model.", add = "inner." }'
    raw = m.get("weights_prefix", (str, dict), None, what)
    if raw is None:
        return None
    where = m.sub("weights_prefix")
    if not weights:
        m.fail(where, "applies to the keys of `weights` files, and no `weights` are declared")
    if isinstance(raw, str):
        prefix = WeightsPrefix(add=raw)
    else:
        t = type(m)(raw, path=m.path, key=where, known=("strip", "add"))
        prefix = WeightsPrefix(
            strip=t.get("strip", str, "", "a key prefix"), add=t.get("add", str, "", "a key prefix")
        )
    if not prefix.strip and not prefix.add:
        m.fail(where, f"expected a non-empty prefix: {what}")
    return prefix


def watch_with_entry(watch: list[Path], entry_file: Path) -> list[Path]:
    """`watch`, covering a TorchScript entry too: saving the archive is the edit that
    reloads such a model, even where `watch` names only the folders of other code."""
    if any(entry_file == w or w in entry_file.parents for w in watch):
        return watch
    return [*watch, entry_file]
