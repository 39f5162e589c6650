"""The `tritonserver` of the nvidia-pytriton wheel, set up to run an exported repository.

The wheel ships a Triton 2.51 binary, its libraries and the python backend's stubs, but not
laid out as a server install: the backend folder is assembled here (libtriton_python.so,
triton_python_backend_utils.py and the stub for this Python), the libraries come from
LD_LIBRARY_PATH, and this environment's `bin` goes first on PATH (the stub ignores
PYTHONPATH and finds its sys.prefix, so torch and numpy, from the `python3` on PATH).
Used by the tests and benchmarks/triton_side_by_side.py; on a real deployment use NVIDIA's
container instead (docs/exports.md).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

#: The wheel's stub is built against numpy 1.x: under numpy 2 every array it makes or reads
#: has a zero item size (empty outputs, garbled BYTES), so its Python gets numpy 1.26.
STUB_NUMPY = "numpy==1.26.4"
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

    def env(self, python_env: Path, base: dict[str, str] | None = None) -> dict[str, str]:
        """The server's environment: wheel libraries, `python_env`'s bin first on PATH (the
        stub's sys.prefix: see `ensure_python_env`)."""
        env = dict(os.environ if base is None else base)
        # The stub links libpython3.X.so: it must be this Python's own, or the extension
        # modules of this sys.prefix (_ssl, ...) miss symbols of a different patch release.
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        ldlib = sysconfig.get_config_var("LDLIBRARY") or ""
        own = libdir if ldlib.endswith(".so") and Path(libdir, ldlib).exists() else ""
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (own, str(self.libs), env.get("LD_LIBRARY_PATH", "")) if p
        )
        env["PATH"] = os.pathsep.join((str(python_env / "bin"), env.get("PATH", "")))
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


def ensure_python_env(folder: Path | None = None) -> Path:
    """A Python environment for the stub: this environment's packages (torch, safetensors,
    transformers, ...) through a .pth file, with numpy 1.26 in front of them (STUB_NUMPY).
    Made once (a venv and one wheel, seconds); returns its folder."""
    folder = folder or Path(sys.prefix) / "triton-python"
    marker = folder / ".ready"
    if marker.is_file():
        return folder
    base = Path(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([str(base), "-m", "venv", "--clear", str(folder)], check=True, timeout=120)
    py = folder / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", STUB_NUMPY],
        check=True,
        timeout=300,
    )
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    # After the env's own site-packages: its numpy 1.26 wins over this one's numpy 2.
    ours = sysconfig.get_paths()["purelib"]
    Path(site, "zz_hotreload_parent.pth").write_text(ours + "\n", encoding="utf-8")
    marker.write_text(STUB_NUMPY + "\n", encoding="utf-8")
    return folder
