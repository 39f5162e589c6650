"""The HTTP endpoint is manager side: importing it loads neither torch, textual nor pynvml."""

from __future__ import annotations

import subprocess
import sys


def test_http_package_imports_no_heavy_module() -> None:
    code = (
        "import sys, hotreload.http, hotreload.http.server, hotreload.http.metrics\n"
        "print(','.join(m for m in ('torch', 'textual', 'pynvml') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"hotreload.http pulled in: {out.stdout.strip()}"
