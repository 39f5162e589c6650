"""One session process shared by the tests of a module: started once (a session and its
workers importing torch cost seconds each), its pid in `tests.support.SHARED` so the
suite's leftover-children check leaves it to this helper, and always stopped, then its
process groups killed, when the module's fixture ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from tests.http.conftest import HttpServeProcess
from tests.support import SHARED, ServeProcess

P = TypeVar("P", bound=ServeProcess)


def unpinned(config: Path) -> Path:
    """`config` with `cpus = "off"` in every model's table. For a session a fixture keeps
    for a whole xdist worker's life: pinned, it would hold its CPU claim (engine/cpus.py)
    all that time, and every later session on that worker would find no CPU to claim, failing
    the tests that prove the pinning (tests/test_cpus.py, the dashboard's)."""
    text = config.read_text().replace("[[models]]\n", '[[models]]\ncpus = "off"\n')
    config.write_text(text)
    return config


@contextmanager
def shared_server(
    config: Path,
    *args: str,
    process_cls: type[P] = HttpServeProcess,  # type: ignore[assignment]
    command: str = "serve",
    ready_s: float = 180.0,
) -> Iterator[P]:
    """`hotreload <command> --config CONFIG ARGS` (with `--http 127.0.0.1:0` for the
    default HttpServeProcess), ready within `ready_s`, stopped on leaving."""
    server = process_cls(config, *args, command=command)
    SHARED.add(server.proc.pid)
    try:
        server.wait_ready(ready_s)
        yield server
    finally:
        SHARED.discard(server.proc.pid)
        server.close()
