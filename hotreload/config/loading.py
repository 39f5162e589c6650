"""`Config`, the whole validated config, and finding, reading and parsing the file.

`parse_config` reads the top-level table and hands each table to its module (`models`,
`watch`, `gpu_check`, `http`); every one reads through a `Checker`, so every error names the
file, the key and what was expected.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):  # noqa: UP036 - tomli kept for a 3.10 backport
    import tomllib
else:  # pragma: no cover - the project requires 3.11, kept for forks on 3.10
    import tomli as tomllib

from hotreload.config.checker import Checker
from hotreload.config.gpu_check import CheckConfig, GpuConfig, parse_check, parse_gpu
from hotreload.config.http import HttpConfig, parse_http, parse_http_address
from hotreload.config.models import ModelConfig, parse_model
from hotreload.config.watch import WatchConfig, parse_watch
from hotreload.errors import ConfigError

CONFIG_FILENAME = "hotreload.toml"
PYPROJECT = "pyproject.toml"


@dataclass(frozen=True)
class Config:
    """The whole validated config."""

    path: Path
    root: Path
    #: One `[[models]]` table per model.
    models: tuple[ModelConfig, ...]
    #: Where the session keeps `events.jsonl`, `stats.jsonl`, `session.json` and the check
    #: record (0700, with its own `.gitignore`), relative to the config file.
    state_dir: Path
    #: Where the session's socket, locks and CPU claims live. Unset:
    #: `$XDG_RUNTIME_DIR/hotreload` when that folder is yours, else `hotreload-<uid>` in the temp
    #: folder.
    socket_dir: Path | None = None
    #: The largest request or reply, in MiB; larger frames are refused.
    max_frame_mib: int = 64
    #: How file events become reloads: the `[watch]` table.
    watch: WatchConfig = field(default_factory=WatchConfig)
    #: GPU reset and sampling: the `[gpu]` table.
    gpu: GpuConfig = field(default_factory=GpuConfig)
    #: `hotreload check`: the `[check]` table.
    check: CheckConfig = field(default_factory=CheckConfig)
    #: The KServe v2 HTTP endpoint: the `[http]` table.
    http: HttpConfig = field(default_factory=HttpConfig)

    def model(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.name == name:
                return m
        known = ", ".join(m.name for m in self.models)
        raise ConfigError(
            f"no model named {name!r}; the config declares: {known}", path=str(self.path)
        )

    @property
    def max_frame_bytes(self) -> int:
        return self.max_frame_mib * 1024 * 1024


def find_config(explicit: str | os.PathLike[str] | None = None, cwd: Path | None = None) -> Path:
    """The config file to use: `--config`, else ./hotreload.toml, else ./pyproject.toml."""
    if explicit is not None:
        path = Path(explicit).expanduser()
        if path.is_dir():
            for name in (CONFIG_FILENAME, PYPROJECT):
                if (path / name).is_file():
                    return _warn_if_shadowed(path / name)
            raise ConfigError(f"folder has no {CONFIG_FILENAME} or {PYPROJECT}", path=str(path))
        if not path.is_file():
            raise ConfigError("file not found (check the --config path)", path=str(path))
        return path
    here = cwd or Path.cwd()
    if (here / CONFIG_FILENAME).is_file():
        return _warn_if_shadowed(here / CONFIG_FILENAME)
    if (here / PYPROJECT).is_file():
        return here / PYPROJECT
    raise ConfigError(
        f"no {CONFIG_FILENAME} or {PYPROJECT} in {here}; run `hotreload init` to write one "
        "or pass --config PATH"
    )


def _warn_if_shadowed(path: Path) -> Path:
    from hotreload.config.shadow import warn_if_shadowed

    if path.name == CONFIG_FILENAME:
        warn_if_shadowed(path.resolve())
    return path


def load_config(explicit: str | os.PathLike[str] | None = None, cwd: Path | None = None) -> Config:
    """Find, parse and validate the config. Raises ConfigError with a precise message."""
    path = find_config(explicit, cwd).resolve()
    raw, prefix = read_table(path)
    return parse_config(raw, path=path, prefix=prefix)


def read_table(path: Path) -> tuple[Mapping[str, Any], str]:
    """The hotreload table of a config file, and its key prefix (`tool.hotreload.` in a
    pyproject.toml); ConfigError for a file that is not TOML or has no such table."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", path=str(path)) from None
    prefix = ""
    if path.name == PYPROJECT:
        tool = raw.get("tool", {})
        if not isinstance(tool, dict) or "hotreload" not in tool:
            raise ConfigError(
                "has no [tool.hotreload] table; add one or use a hotreload.toml", path=str(path)
            )
        raw = tool["hotreload"]
        prefix = "tool.hotreload."
    return raw, prefix


#: `ray` is read by `hotreload export ray` alone (hotreload/export/ray_options.py).
_TOP_KEYS = (
    "models",
    "state_dir",
    "socket_dir",
    "max_frame_mib",
    "watch",
    "gpu",
    "check",
    "http",
    "ray",
)


def parse_config(raw: Mapping[str, Any], *, path: Path, prefix: str = "") -> Config:
    """Validate a parsed TOML mapping. `prefix` is `tool.hotreload.` for pyproject files."""
    root = path.parent
    top = Checker(dict(raw), path=path, key=prefix.rstrip("."), known=_TOP_KEYS)
    models_raw = top.get("models", list, None, "a list of [[models]] tables")
    if not models_raw:
        top.fail(
            top.sub("models"),
            "no models declared; add a [[models]] table with at least name, entry and example",
        )
    models: list[ModelConfig] = []
    seen: set[str] = set()
    for i, table in enumerate(models_raw):
        model = parse_model(table, path=path, key=f"{top.sub('models')}[{i}]", root=root)
        if model.name in seen:
            top.fail(f"{top.sub('models')}[{i}].name", f"duplicate model name {model.name!r}")
        seen.add(model.name)
        models.append(model)

    state_dir, socket_dir = folders(top, root)
    max_frame_mib = top.integer("max_frame_mib", 64, minimum=1, maximum=4096)

    return Config(
        path=path,
        root=root,
        models=tuple(models),
        state_dir=state_dir,
        socket_dir=socket_dir,
        max_frame_mib=max_frame_mib,
        watch=parse_watch(top),
        gpu=parse_gpu(top),
        check=parse_check(top),
        http=parse_http(top),
    )


def folders(top: Checker, root: Path) -> tuple[Path, Path | None]:
    """`state_dir` (relative to the config's folder) and `socket_dir` (None: the default)."""
    state_dir = Path(top.get("state_dir", str, ".hotreload", "a folder path"))
    socket_dir = top.get("socket_dir", str, None, "a folder path")
    return (
        state_dir if state_dir.is_absolute() else root / state_dir,
        Path(socket_dir).expanduser() if socket_dir else None,
    )


@dataclass(frozen=True)
class Locations:
    """Where a config's session lives: enough to reach it, nothing about its models."""

    path: Path
    state_dir: Path
    socket_dir: Path | None


def load_locations(
    explicit: str | os.PathLike[str] | None = None, cwd: Path | None = None
) -> Locations:
    """The config's session folders, without validating its models: a client finds a live
    session by its socket even while the entry file is missing or broken."""
    path = find_config(explicit, cwd).resolve()
    raw, prefix = read_table(path)
    top = Checker(dict(raw), path=path, key=prefix.rstrip("."), known=tuple(raw))
    state_dir, socket_dir = folders(top, path.parent)
    return Locations(path, state_dir, socket_dir)


ConfigLoader = Callable[[], Config]


def with_cli_overrides(
    config: Config, *, http: str | None = None, metrics_port: int | None = None
) -> Config:
    """The config with command-line overrides applied (`--http`, `--metrics-port`)."""
    if http is None and metrics_port is None:
        return config
    h = config.http
    if http is not None:
        try:
            host, port = parse_http_address(http)
        except ValueError as exc:
            raise ConfigError(f"--http: {exc}") from None
        h = replace(h, enabled=True, host=host, port=port)
    if metrics_port is not None:
        if not 0 <= metrics_port <= 65535:
            raise ConfigError(f"--metrics-port: expected 0..65535, got {metrics_port}")
        h = replace(h, enabled=True, metrics_port=metrics_port)
    return replace(config, http=h)
