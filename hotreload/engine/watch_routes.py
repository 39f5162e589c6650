"""Which models a changed file reloads (the watcher asks; engine/used_files.py says what a
model uses), and the files no model uses, said once each."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hotreload.config import Config, ModelConfig
from hotreload.engine.ignore import IgnoreRules
from hotreload.engine.used_files import always_used, under, used_folders, watch_roots

#: A model's used files (used_files.files_used), or None: no version loaded yet, so every
#: file under its watch paths reloads it.
UsesOf = Callable[[ModelConfig], "frozenset[Path] | None"]


@dataclass
class Change:
    """What one flush found for one model."""

    model: str
    paths: list[Path] = field(default_factory=list)
    #: True when every changed file is one of the model's weights files.
    weights_only: bool = True


class Routes:
    """Routes a changed file to the models it reloads: a weights file to its models as a
    weights reload; a file under a model's watch paths (not ignored) to it when the model
    uses it (used_files.py)."""

    def __init__(
        self,
        config: Config,
        rules: dict[str, IgnoreRules],
        uses: UsesOf | None = None,
    ) -> None:
        self.config, self.rules, self.uses = config, rules, uses
        self._declared = {m.name: set(m.weight_files) for m in config.models}
        self._always = {m.name: {p.resolve() for p in always_used(m)} for m in config.models}
        self._roots = {m.name: watch_roots(m) for m in config.models}
        self._folders = {m.name: tuple(p.resolve() for p in used_folders(m)) for m in config.models}
        #: Files said once as used by no model.
        self._said: set[Path] = set()

    def _root_of(self, m: ModelConfig, path: Path) -> Path | None:
        for root in self._roots[m.name]:
            if under(path, [root]) and not self.rules[m.name].ignored(path, root):
                return root
        return None

    def watched(self, path: Path) -> bool:
        """The file is one a model could use: declared, or in a model's watch paths."""
        return any(
            path in self._declared[m.name] or self._root_of(m, path) is not None
            for m in self.config.models
        )

    def uses_now(self, m: ModelConfig, path: Path) -> bool:
        """`m` uses `path` now (it is in `m`'s watch paths; declared files aside)."""
        used = self.uses(m) if self.uses is not None else None
        return (
            used is None
            or path in used
            or path in self._always[m.name]
            or under(path, self._folders[m.name])
        )

    def models_for(self, path: Path) -> list[tuple[ModelConfig, bool]]:
        """(model, is_weights) for each model an edit of `path` reloads."""
        hits = []
        for m in self.config.models:
            if path in self._declared[m.name]:
                hits.append((m, True))
            elif self._root_of(m, path) is not None and self.uses_now(m, path):
                hits.append((m, False))
        return hits

    def split(
        self, paths: Iterable[Path], only: Collection[str] | None = None
    ) -> tuple[dict[str, Change], list[Path]]:
        """The reload each model gets for `paths` (only the models named in `only`, when
        given), and the paths that reload no model at all."""
        per_model: dict[str, Change] = {}
        unused: list[Path] = []
        for p in paths:
            hits = self.models_for(p)
            if not hits:
                unused.append(p)
            for model, is_weights in hits:
                if only is not None and model.name not in only:
                    continue
                change = per_model.setdefault(model.name, Change(model.name))
                change.paths.append(p)
                change.weights_only = change.weights_only and is_weights
        return per_model, unused

    def newly_unused(self, paths: Iterable[Path]) -> list[Path]:
        """Of `paths` (which reloaded nothing), those not said before; now they are."""
        out = sorted(p for p in set(paths) if p not in self._said and p.is_file())
        self._said.update(out)
        return out

    def tracked_files(self, walk_error: Callable[[OSError], None]) -> Iterator[Path]:
        """Every file the watcher keeps a fingerprint of: the config, declared files, and
        the files in the watch paths (used by a model now or not: one may import it next)."""
        yield self.config.path
        for m in self.config.models:
            yield from m.weight_files
            for root in self._roots[m.name]:
                if root.is_file():
                    yield root
                else:
                    yield from self.rules[m.name].files_under(root, walk_error)
