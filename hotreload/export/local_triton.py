"""The `tritonserver` of the nvidia-pytriton wheel, set up to run an exported repository.

The wheel ships a Triton 2.51 binary, its libraries and the python backend's stubs, but not
laid out as a server install: the backend folder is assembled here (libtriton_python.so,
triton_python_backend_utils.py and the stub for this Python), the libraries come from
LD_LIBRARY_PATH, and this environment's `bin` goes first on PATH (the stub ignores
PYTHONPATH and finds its sys.prefix, so torch and numpy, from the `python3` on PATH).
Used by the tests and benchmarks/triton_side_by_side.py; on a real deployment use NVIDIA's
container instead (README: Moving to Triton and KServe).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

PYTRITON_HINT = (
    "install it with `pip install --no-deps nvidia-pytriton==0.7.0` (--no-deps keeps this "
    "environment's torch and numpy)"
)


@dataclass(frozen=True)
class LocalTriton:
    """Paths of the wheel's server."""

    binary: Path
    backend_files: tuple[Path, ...]
    libs: Path

    def backends(self, folder: Path) -> Path:
        """Lay out `<folder>/python/` as Triton's python backend; returns `folder`."""
        python = folder / "python"
        python.mkdir(parents=True, exist_ok=True)
        for f in self.backend_files:
            dest = python / f.name
            if not dest.exists():
                shutil.copy2(f, dest)
        return folder

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The server's environment: wheel libraries, this Python's bin first on PATH."""
        env = dict(os.environ if base is None else base)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(self.libs), env.get("LD_LIBRARY_PATH", "")) if p
        )
        env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
        return env

    def command(
        self,
        repository: Path,
        backends: Path,
        *,
        http_port: int,
        grpc_port: int,
        metrics_port: int,
        extra: tuple[str, ...] = (),
    ) -> list[str]:
        return [
            str(self.binary),
            f"--model-repository={repository}",
            f"--backend-directory={backends}",
            f"--http-port={http_port}",
            f"--grpc-port={grpc_port}",
            f"--metrics-port={metrics_port}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            *extra,
        ]


def find_local_triton() -> LocalTriton | str:
    """The wheel's server, or a sentence saying why there is none here."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return f"the nvidia-pytriton wheel is not installed: {PYTRITON_HINT}"
    pkg = Path(next(iter(spec.submodule_search_locations)))
    server = pkg / "tritonserver"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    files = (
        server / "backends" / "python" / "libtriton_python.so",
        server / "backends" / "python" / "triton_python_backend_utils.py",
        server / "python_backend_stubs" / py / "triton_python_backend_stub",
    )
    binary = server / "bin" / "tritonserver"
    libs = pkg.parent / "nvidia_pytriton.libs"
    missing = [str(p) for p in (binary, libs, *files) if not p.exists()]
    if missing:
        return f"the nvidia-pytriton wheel lacks {', '.join(missing)} (Python {py})"
    return LocalTriton(binary=binary, backend_files=files, libs=libs)
