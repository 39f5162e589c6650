"""Read and validate `hotreload.toml` (or `[tool.hotreload]` in `pyproject.toml`).

Every error names the file, the key and what was expected; unknown keys are rejected with
the closest known key suggested, because a misspelt `warmup_iter` silently ignored would
cost a user an afternoon.

One module per table, each reading through `checker.Checker`:

- `loading`: `Config`, finding the file, the top-level table, `--http` overrides;
- `models`: `[[models]]` (with `weights` for what a model is loaded from, `shapes`);
- `watch`, `gpu_check` (`[gpu]`, `[check]`), `http`: the other tables;
- `shadow`: the warning when a hotreload.toml hides a `[tool.hotreload]` table.

Everything the rest of the code uses is importable from here.
"""

from __future__ import annotations

from hotreload.config.checker import Checker
from hotreload.config.gpu_check import RESET_MODES, CheckConfig, GpuConfig
from hotreload.config.http import HttpConfig, parse_http_address
from hotreload.config.loading import (
    CONFIG_FILENAME,
    PYPROJECT,
    Config,
    ConfigLoader,
    Locations,
    find_config,
    load_config,
    load_locations,
    parse_config,
    with_cli_overrides,
)
from hotreload.config.models import (
    DEVICE_ENV,
    MAX_CPU_ID,
    POLICIES,
    STRATEGIES,
    Deadlines,
    EntryPoint,
    ModelConfig,
    Threads,
    with_overrides,
)
from hotreload.config.watch import WatchConfig

__all__ = [
    "CONFIG_FILENAME",
    "DEVICE_ENV",
    "MAX_CPU_ID",
    "POLICIES",
    "PYPROJECT",
    "RESET_MODES",
    "STRATEGIES",
    "CheckConfig",
    "Checker",
    "Config",
    "ConfigLoader",
    "Deadlines",
    "EntryPoint",
    "GpuConfig",
    "HttpConfig",
    "Locations",
    "ModelConfig",
    "Threads",
    "WatchConfig",
    "find_config",
    "load_config",
    "load_locations",
    "parse_config",
    "parse_http_address",
    "with_cli_overrides",
    "with_overrides",
]
