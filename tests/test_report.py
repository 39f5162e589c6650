"""`hotreload report`: the HTML page from a session's logs, drawn by a real headless Chromium."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from hotreload.commands.report import (
    MEMORY_DOT,
    PHASE_COLOURS,
    RELOAD_WINDOW,
    XID_MARK,
    read_log,
    render_html,
)
from tests.support import make_project, read_events, wait_until

T0 = 1_796_000_000.0


def write_logs(state_dir: Path) -> None:
    """A session's two logs as `hotreload watch` writes them: a reload at +10 s, an Xid."""
    state_dir.mkdir(parents=True, exist_ok=True)
    events = [
        {"ts": T0, "kind": "session_started"},
        {"ts": T0 + 1, "kind": "ready", "model": "mlp", "version": 1},
    ]
    t = T0 + 10.0
    for phase, dur in (("load", 0.12), ("warm", 0.05), ("smoke", 0.01), ("swap", 0.002)):
        events.append(
            {
                "ts": t + dur,
                "kind": "phase_end",
                "model": "mlp",
                "phase": phase,
                "duration_s": dur,
                "ok": True,
            }
        )
        t += dur
    events.append(
        {
            "ts": t,
            "kind": "reload_done",
            "model": "mlp",
            "version": 2,
            "total_s": t - (T0 + 10.0),
            "trigger": "file",
            "phases": {},
        }
    )
    events.append(
        {
            "ts": T0 + 14,
            "kind": "xid",
            "xid": 79,
            "name": "GPU has fallen off the bus",
            "severity": "hardware",
            "phase": None,
        }
    )
    stats = [
        {
            "ts": T0 + i,
            "kind": "stats",
            "model": "mlp",
            "count": 100,
            "p50_ms": 2.0,
            "p99_ms": 9.0 if i == 10 else 3.0,
            "queue_depth": i % 4,
            "inflight": 1,
        }
        for i in range(1, 21)
    ]
    stats += [
        {"ts": T0 + 1.3, "kind": "memory", "model": "mlp", "version": 1, "rss_bytes": 250 * 2**20},
        {"ts": t + 0.3, "kind": "memory", "model": "mlp", "version": 2, "rss_bytes": 252 * 2**20},
    ]
    (state_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (state_dir / "stats.jsonl").write_text("".join(json.dumps(s) + "\n" for s in stats))


def test_the_page_is_self_contained_and_holds_every_section(tmp_path: Path) -> None:
    write_logs(tmp_path)
    log = read_log(tmp_path)
    (reload,) = log.reloads
    assert [p for p, *_ in reload.phases] == ["load", "warm", "smoke", "swap"]
    assert reload.phases[1][1] == pytest.approx(0.12)  # warm starts where load ended
    page = render_html(log, "proj/hotreload.toml")
    for heading in ("Reload phases", "Request latency", "Queue depth", "Memory after", "Xid"):
        assert heading in page
    assert "GPU has fallen off the bus" in page and "v2" in page
    # Nothing to fetch: it opens offline and travels as one attachment.
    assert "<script" not in page and 'src="http' not in page and "<link" not in page


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def png_pixels(data: bytes) -> tuple[int, int, np.ndarray]:
    """(width, height, RGB array) of an 8-bit RGB or RGBA PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    out = np.zeros((height, stride), dtype=np.int32)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        if ftype == 0:
            cur = line
        elif ftype == 2:
            cur = (line + prev) & 0xFF
        else:  # Sub, Average, Paeth depend on the pixel to the left: byte by byte
            cur = np.zeros(stride, dtype=np.int32)
            for i in range(stride):
                a = cur[i - channels] if i >= channels else 0
                b, c = prev[i], prev[i - channels] if i >= channels else 0
                if ftype == 1:
                    pred = a
                elif ftype == 3:
                    pred = (a + b) // 2
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                cur[i] = (line[i] + pred) & 0xFF
        out[y], prev = cur, cur
    return width, height, out.reshape(height, width, channels)[:, :, :3]


def has_colour(pixels: np.ndarray, hex_colour: str, at_least: int = 20) -> bool:
    rgb = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
    close = np.abs(pixels - rgb).max(axis=2) <= 3
    return int(close.sum()) >= at_least


@pytest.mark.skipif(
    _chromium() is None, reason="chromium is not installed (scripts/setup-chromium.sh does it)"
)
def test_chromium_draws_the_waterfall_the_reload_window_the_xid_and_memory(
    tmp_path: Path,
) -> None:
    write_logs(tmp_path)
    page = tmp_path / "report.html"
    page.write_text(render_html(read_log(tmp_path), "proj/hotreload.toml"))
    shot = tmp_path / "report.png"
    res = subprocess.run(
        [
            _chromium() or "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            "--window-size=1100,1500",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert shot.is_file(), res.stderr
    width, height, pixels = png_pixels(shot.read_bytes())
    assert (width, height) == (1100, 1500)
    # The picture, not just the markup: each thing drawn is on screen in its colour.
    for what, colour in (
        ("the load bar of the waterfall", PHASE_COLOURS["load"]),
        ("the warm bar", PHASE_COLOURS["warm"]),
        ("the shaded reload window", RELOAD_WINDOW),
        ("the Xid marker", XID_MARK),
        ("the memory points", MEMORY_DOT),
    ):
        assert has_colour(pixels, colour), f"{what} ({colour}) is not in the screenshot"


def test_report_command_on_a_real_session(tmp_path: Path, serve) -> None:
    from hotreload.client import Client

    config = make_project(tmp_path)
    serve(config)
    state_dir = config.parent / ".hotreload"
    with Client(config=config) as client:
        for _ in range(20):
            client.infer("mlp", np.zeros((1, 64), np.float32))
        assert client.call({"op": "reload", "model": "mlp", "force": True}).header["ok"]

    def figures(kind: str) -> list[dict]:
        path = state_dir / "stats.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [r for r in map(json.loads, lines) if r["kind"] == kind]

    wait_until(lambda: any(m["version"] == 2 for m in figures("memory")), 30, what="memory")
    wait_until(lambda: figures("stats"), 30, what="a request figure")
    assert any(e["kind"] == "reload_done" for e in read_events(config))
    out = tmp_path / "r.html"
    res = subprocess.run(
        [sys.executable, "-m", "hotreload", "report", "--config", str(config), "--html", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"wrote {out}: 1 reload(s) (0 failed)")
    page = out.read_text()
    assert "v2 ok" in page and "worker RSS after each version" in page
    # Private like the rest of .hotreload/: it holds tracebacks and code paths.
    assert out.stat().st_mode & 0o777 == 0o600


def test_report_without_a_log_says_what_to_run(tmp_path: Path) -> None:
    config = make_project(tmp_path)
    res = subprocess.run(
        [sys.executable, "-m", "hotreload", "report", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 3 and "run `hotreload watch`" in res.stderr
