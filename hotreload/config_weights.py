"""The config keys about what a model is loaded from: `weights`, `weights_prefix`, and an
`entry` that names a TorchScript archive instead of a factory.

Kept out of config.py (which reads every other key) so that file stays readable; the
checks here use config.py's checker, so their errors read like every other config error.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hotreload.config import _Checker

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


def torchscript_entry_file(value: str, *, checker: _Checker, key: str, root: Path) -> Path:
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


def parse_weights(m: _Checker, root: Path) -> tuple[Path, ...]:
    """`weights`: existing .safetensors, .pt, .pth or .bin files."""
    weights: list[Path] = []
    for i, item in enumerate(m.str_list("weights")):
        p = Path(item).expanduser()
        p = p if p.is_absolute() else root / p
        if not p.is_file():
            m.fail(f"{m.sub('weights')}[{i}]", f"file {p} does not exist")
        if p.suffix not in WEIGHTS_SUFFIXES:
            m.fail(
                f"{m.sub('weights')}[{i}]",
                f"expected a .safetensors, .pt, .pth or .bin file, got {p.name!r}",
            )
        weights.append(p.resolve())
    return tuple(weights)


def parse_weights_prefix(m: _Checker, weights: tuple[Path, ...]) -> WeightsPrefix | None:
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
