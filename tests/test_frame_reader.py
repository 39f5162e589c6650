"""The worker's frame reader receives into one reused buffer: every frame comes out whole and
in order, and aligned, however the stream is cut (a frame's 8-byte prefix split between two
receives, frames larger than the buffer, frames skipped as too large)."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from hotreload.errors import ProtocolError
from hotreload.protocol.framing import PAYLOAD_ALIGN, SocketFrameReader, pack_frame


def _frames(rng: np.random.Generator) -> list[tuple[dict[str, object], bytes]]:
    out = []
    for i in range(60):
        size = int(rng.choice([0, 1, 7, 63, 64, 65, 300, 5000]))
        out.append(({"id": i, "pad": "p" * int(rng.integers(0, 70))}, rng.bytes(size)))
    return out


@pytest.mark.parametrize("chunk", [8, 9, 13, 64, 1000, 256 * 1024])
def test_every_frame_comes_out_whole_however_the_stream_is_cut(chunk: int) -> None:
    rng = np.random.default_rng(chunk)
    frames = _frames(rng)
    too_large = 1 << 14  # frames past the reader's limit are skipped, the reader reads on
    skipped = {7, 30}
    stream = b"".join(
        b"".join(pack_frame(h, [b"\0" * (too_large + 1) if h["id"] in skipped else p]))
        for h, p in frames
    )
    a, b = socket.socketpair()
    errors: list[ProtocolError] = []
    got = []

    def send() -> None:
        # Pieces of 1 to 20 bytes: prefixes land across receives.
        at = 0
        while at < len(stream):
            step = int(rng.integers(1, 21))
            a.sendall(stream[at : at + step])
            at += step

    with a, b:
        b.settimeout(30)
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        reader = SocketFrameReader(b, too_large, on_bad_frame=errors.append, chunk=chunk)
        for _ in range(len(frames) - len(skipped)):
            got.append(reader.read())
        sender.join(30)
        assert not sender.is_alive()
    want = [(h, p) for h, p in frames if h["id"] not in skipped]
    assert [f.header for f in got] == [h for h, _ in want]
    assert [bytes(f.payload) for f in got] == [p for _, p in want]
    for frame in got:
        if len(frame.payload):
            assert np.frombuffer(frame.payload, np.uint8).ctypes.data % PAYLOAD_ALIGN == 0
    assert len(errors) == len(skipped)
    assert all("exceeds the maximum frame size" in str(e) for e in errors)


def test_a_closed_stream_says_so() -> None:
    a, b = socket.socketpair()
    with b:
        a.sendall(b"".join(pack_frame({"id": 1}, [b"xyz"]))[:6])  # inside the prefix
        a.close()
        reader = SocketFrameReader(b, 1 << 20, chunk=8)
        with pytest.raises(ConnectionError, match="connection closed"):
            reader.read()
