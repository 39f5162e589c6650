"""`hotreload xid` and `hotreload doctor` as a user runs them."""

from __future__ import annotations

import functools
import io
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from hotreload.cli import main
from hotreload.commands.gpu_tools import xid_main
from hotreload.gpu import doctor
from hotreload.gpu.doctor import FAIL, OK, WARN
from hotreload.gpu.kernel_log import KernelLogChoice
from hotreload.gpu.nvml import GpuDevice, GpuSnapshot

FIXTURES = Path("/work/shared/fixtures/xid_lines.txt")
REPO = Path(__file__).resolve().parents[2]
NOISE = [
    "Mar 27 17:40:30 host kernel: usb 1-1: new high-speed USB device number 2",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 47 egress",
]


@pytest.fixture
def saved_log(tmp_path: Path) -> Path:
    lines = FIXTURES.read_text().splitlines()
    path = tmp_path / "kern.log"
    path.write_text("\n".join(NOISE[:1] + lines + NOISE[1:]) + "\n")
    return path


def test_xid_json_from_a_saved_log(saved_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["xid", "--from", str(saved_log), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 17  # one per Xid line; noise and SXid skipped silently
    for row in rows:
        assert isinstance(row["xid"], int)
        assert row["pci"] is None or not row["pci"].startswith("PCI:")
        assert row["pid"] is None or isinstance(row["pid"], int)
        assert {"process", "name", "severity", "action", "text"} <= set(row)
    assert rows[3]["process"] == "chrome"
    assert [r["xid"] for r in rows[-3:]] == [45, 119, 63]


def test_xid_human_output(saved_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["xid", "--from", str(saved_log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 17
    assert "Jan 16 14:04:39" in out[12] and "0000:05:00" in out[12] and "Xid 79" in out[12]
    assert "[hardware]" in out[12] and "pid=1173" in out[12] and "Power-cycle" in out[12]
    # A saved line without a time of its own must not look as if it happened just now.
    assert out[1].startswith("(no time)  0000:01:00  GPU ?  Xid 31: ")
    assert out[0].startswith("24128.828315  0000:01:00")


def test_xid_reads_the_drivers_multi_line_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # As dmesg prints it (NVIDIA/NVSentinel#155): bus id and time on the first line only.
    log = tmp_path / "dmesg.txt"
    log.write_text(
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        "               NVRM: fallen off the bus and is not responding to commands.\n"
        "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).\n"
    )
    assert main(["xid", "--from", str(log)]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("1843.308145  0000:b3:00.0  GPU ?  Xid 79: ")
    assert "Power-cycle" in line


def test_xid_from_stdin() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "hotreload", "xid", "--from", "-", "--json"],
        input="junk\nNVRM: Xid (PCI:0000:01:00): 31, pid=5, name=py, Ch 1\n",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert res.returncode == 0, res.stderr
    (row,) = [json.loads(x) for x in res.stdout.splitlines()]
    assert (row["xid"], row["pci"], row["pid"], row["process"], row["text"]) == (
        31,
        "0000:01:00",
        5,
        "py",
        "Ch 1",
    )


def test_xid_says_when_a_log_has_no_xid_events(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "quiet.log"
    log.write_text("kernel: eth0 up\nNVRM: loading NVIDIA UNIX x86_64 Kernel Module\n")
    assert main(["xid", "--from", str(log)]) == 0
    assert capsys.readouterr().out == f"no Xid events in {log}\n"
    assert main(["xid", "--from", str(log), "--json"]) == 0
    assert capsys.readouterr().out == ""  # JSON lines: one object per event, none here


def test_xid_missing_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["xid", "--from", str(tmp_path / "nope.log")]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "nope.log" in err and "'-' to read stdin" in err


class Lines(io.StringIO):
    """An output stream that sets `done` once it holds `want` lines."""

    def __init__(self, want: int) -> None:
        super().__init__()
        self.want = want
        self.done = threading.Event()

    def write(self, text: str) -> int:
        n = super().write(text)
        if self.getvalue().count("\n") >= self.want:
            self.done.set()
        return n


def test_xid_follows_a_growing_file(tmp_path: Path) -> None:
    path = tmp_path / "live.log"
    path.write_text("NVRM: Xid (PCI:0000:01:00): 13, pid=1, first\n")
    out = Lines(want=1)
    stop = threading.Event()
    rc: list[int] = []
    follower = threading.Thread(
        target=lambda: rc.append(xid_main(str(path), follow=True, as_json=True, out=out, stop=stop))
    )
    follower.start()
    try:
        assert out.done.wait(30), "the existing line was not printed"
        out.want, out.done = 2, threading.Event()
        with path.open("a") as f:  # appended while it follows
            f.write("noise\nNVRM: Xid (PCI:0000:01:00): 43, pid=2, second\n")
        assert out.done.wait(30), f"the appended line was not printed: {out.getvalue()!r}"
    finally:
        stop.set()
        follower.join(30)
    assert rc == [0]
    rows = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [r["xid"] for r in rows] == [13, 43]


def test_xid_reads_the_current_kernel_log(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["xid", "--json"])
    assert rc in (0, 3)  # 3 only where the kernel log is unreadable
    for line in capsys.readouterr().out.splitlines():
        assert isinstance(json.loads(line)["xid"], int)


def test_xid_follow_live_for_a_moment(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["xid", "--follow", "--for", "0.3"])
    err = capsys.readouterr().err
    assert "xid source nvml:" in err and "xid source kmsg:" in err
    assert rc in (0, 3)


# -- doctor ------------------------------------------------------------------------------


def test_doctor_on_this_machine_says_plainly_there_is_no_gpu_in_text_and_json(
    tmp_path: Path, no_nvml_gateway: None, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Both forms as `hotreload doctor` prints them. Nearly all of a run's time is its probe
    of torch (a fresh interpreter importing it): made once here and given to both runs,
    whose other checks each make for themselves."""
    probed: list[dict[str, Any]] = []

    def probe_once() -> dict[str, Any]:
        if not probed:
            probed.append(doctor.probe_python_env())
        return probed[0]

    collect = doctor.collect_checks
    monkeypatch.setattr(doctor, "collect_checks", functools.partial(collect, python_env=probe_once))
    rc = main(["doctor", "--watch", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    json_rc = main(["doctor", "--json", "--watch", str(tmp_path)])
    doc = json.loads(capsys.readouterr().out)
    assert len(probed) == 1
    assert doc["ok"] == (json_rc == 0)
    assert {c["status"] for c in doc["checks"]} <= {OK, WARN, FAIL}
    names = ["GPUs", "NVML", "torch", "cuda-python", "Xid sources", "recent Xids", "GPU reset",
             "PYTORCH_CUDA_ALLOC_CONF", "torch threads", "inotify"]  # fmt: skip
    for name in names:
        assert any(f"  {name}: " in ln for ln in lines), (name, lines)
    for ln in lines[:-1]:
        assert ln.split()[0] in (OK, WARN, FAIL)
    if doctor.take_snapshot().available:
        pytest.skip("this machine has a GPU")
    assert any(ln.startswith("WARN  GPUs: no NVIDIA GPU found") for ln in lines)
    assert rc == (1 if any(ln.startswith("FAIL") for ln in lines) else 0)


def test_doctor_config_must_exist(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["doctor", "--config", str(tmp_path / "missing.toml")]) == 2
    err = capsys.readouterr().err
    assert "config not found" in err and "missing.toml" in err and "--watch DIR" in err


GPU = GpuDevice(0, "NVIDIA Fake", "GPU-1", "00000000:01:00.0", 8, 1, None, 0, 40, 10.0, (), None)
WITH_GPU = GpuSnapshot(0.0, True, None, "550.54.15", "12.4", (GPU,))
NO_GPU = GpuSnapshot(0.0, False, "NVML library not found", None, None, (), "library_not_found")


def test_gpu_and_nvml_checks() -> None:
    assert [c.status for c in doctor.check_gpus(WITH_GPU)] == [OK, OK]
    assert [c.status for c in doctor.check_gpus(NO_GPU)] == [WARN, WARN]
    broken = GpuSnapshot(0.0, False, "versions differ", None, None, (), "version_mismatch")
    _gpus, nvml_check = doctor.check_gpus(broken)
    assert nvml_check.status == FAIL and "reboot" in nvml_check.fix


def test_torch_checks() -> None:
    cpu = {"torch": "2.13.0+cpu", "torch_cuda_build": None, "threads": 2, "interop_threads": 2}
    assert doctor.check_torch(cpu, NO_GPU).status == OK
    assert doctor.check_torch(cpu, WITH_GPU).status == WARN
    blind = {**cpu, "torch_cuda_build": "12.8", "cuda_available": False}
    assert doctor.check_torch(blind, WITH_GPU).status == FAIL
    ok = {**blind, "cuda_available": True, "device_count": 1}
    assert doctor.check_torch(ok, WITH_GPU).status == OK
    assert doctor.check_torch({"torch_error": "ImportError"}, NO_GPU).status == FAIL


def test_cuda_python_must_agree_with_the_driver() -> None:
    env = {"cuda_python": "13.4.4", "cuda_python_runtime": 13040, "cuda_python_driver": 12040}
    c = doctor.check_cuda_python(env, WITH_GPU)
    assert c.status == WARN and "cuda-python<13" in c.fix
    env["cuda_python_driver"] = 13000
    assert doctor.check_cuda_python(env, WITH_GPU).status == OK
    assert doctor.check_cuda_python({"cuda_python_error": "x"}, WITH_GPU).status == WARN


def test_xid_source_and_history_checks() -> None:
    denied = KernelLogChoice(None, "/dev/kmsg: permission denied")
    assert doctor.check_xid_sources(denied, NO_GPU).status == WARN
    assert doctor.check_recent_xids([], "dmesg").status == OK
    app = ["NVRM: Xid (PCI:0000:01:00): 13, pid=1, x"]
    assert doctor.check_recent_xids(app, "dmesg").status == WARN
    lost = [*app, "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus"]
    c = doctor.check_recent_xids(lost, "dmesg")
    assert c.status == FAIL and "power-cycle" in c.fix
    unreadable = doctor.check_recent_xids(None, "dmesg: denied")
    assert unreadable.status == WARN and "hotreload xid --from -" in unreadable.fix


@pytest.mark.parametrize(
    ("value", "status"),
    [
        (None, OK),
        ("expandable_segments:True", OK),
        ("max_split_size_mb:128,garbage_collection_threshold:0.6", OK),
        ("expandable_segment:True", WARN),
        ("expandable_segments", FAIL),
    ],
)
def test_alloc_conf(value: str | None, status: str) -> None:
    assert doctor.check_alloc_conf(value).status == status


def test_thread_counts_against_cores() -> None:
    env = {"threads": 16, "interop_threads": 16}
    assert doctor.check_threads(env, 8).status == WARN
    assert doctor.check_threads(env, 16).status == OK


def test_inotify_limit_against_folders(tmp_path: Path) -> None:
    for d in ("a/b", "c", ".git/objects", "__pycache__", ".venv/lib"):
        (tmp_path / d).mkdir(parents=True)
    assert doctor.count_watch_dirs([tmp_path]) == 4  # root, a, a/b, c
    limit = tmp_path / "max_user_watches"
    limit.write_text("100\n")
    assert doctor.check_inotify(10, str(limit)).status == OK
    assert doctor.check_inotify(60, str(limit)).status == WARN
    c = doctor.check_inotify(100, str(limit))
    assert c.status == FAIL and "max_user_watches" in c.fix
    assert doctor.check_inotify(1, str(tmp_path / "none")).status == WARN


def test_collect_checks_with_a_gpu_and_a_failure(tmp_path: Path) -> None:
    env = {"torch": "2.5.0", "torch_cuda_build": "12.4", "cuda_available": False,
           "threads": 1, "interop_threads": 1}  # fmt: skip
    checks = doctor.collect_checks([tmp_path], snapshot=lambda: WITH_GPU, python_env=lambda: env)
    by_name = {c.name: c for c in checks}
    assert by_name["GPUs"].status == OK and "NVIDIA Fake" in by_name["GPUs"].message
    assert by_name["torch"].status == FAIL
