"""`Client.__del__` at interpreter exit, when module globals are gone (issue 30, item 13)."""

from __future__ import annotations

import subprocess
import sys

from tests.support import REPO

SCRIPT = """
import gc
import socket

import hotreload.client as hc
from hotreload.client import Client


class Holder:
    pass


h = Holder()
h.self = h  # a cycle: collected late, as at interpreter exit
h.c = Client(socket_path="/tmp/no-such-hotreload.sock")
h.c._all.append(socket.socket())
for k in list(hc.__dict__):
    if not k.startswith("__"):
        hc.__dict__[k] = None  # as the interpreter does to modules at exit
del h
gc.collect()
print("done")
"""


def test_client_finaliser_is_quiet_when_the_modules_are_gone() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert out.returncode == 0 and "done" in out.stdout, out.stderr
    assert "Exception ignored" not in out.stderr, out.stderr
