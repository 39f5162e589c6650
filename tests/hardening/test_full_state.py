"""A full state folder at start: `serve` and `watch` serve anyway and say once that state
cannot be written (issue 30, item 4). Needs a small tmpfs (root); skipped otherwise."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hotreload import Client
from tests.support import make_project


@pytest.fixture
def full_folder(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "full"
    folder.mkdir(mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if os.geteuid() != 0 or mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip() or 'not root'}")
    try:
        fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass  # full
        finally:
            os.close(fd)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


@pytest.mark.parametrize("command", ["serve", "watch"])
def test_a_full_state_folder_at_start_still_serves(
    tmp_path: Path, full_folder: Path, serve, command: str
) -> None:  # type: ignore[no-untyped-def]
    config = make_project(tmp_path)
    config.write_text(f'state_dir = "{full_folder}"\n' + config.read_text())
    server = serve(config, command=command, wait_ready=False)
    server.wait_for("cannot be written", 90)
    server.wait_ready()
    with Client(config=config, timeout_s=30) as client:
        assert client.infer("mlp", np.zeros((1, 64), np.float32)).output.shape == (1, 10)
    assert "Traceback" not in server.output
