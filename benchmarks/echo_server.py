"""A bare Unix-socket echo server written the way hotreload's endpoint is: the same
`FrameProtocol` (frames parsed and answered in the loop turn their bytes arrive in), the
same length-prefixed frames and JSON headers. The floor for one hop of the routed path.

    python benchmarks/echo_server.py SOCKET_PATH
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hotreload.protocol.frame_protocol import FrameProtocol
from hotreload.protocol.framing import Frame, pack_frame


def _connection() -> FrameProtocol:
    conn: FrameProtocol

    def on_frame(frame: Frame) -> None:
        h = frame.header
        header = {"id": h.get("id"), "ok": True, "version": 1, "form": "single"}
        header["tensors"] = [dict(t, name="output") for t in h.get("tensors", [])]
        conn.write(pack_frame(header, [frame.payload]))

    conn = FrameProtocol(1 << 26, on_frame)
    return conn


async def main(path: str) -> None:
    server = await asyncio.get_running_loop().create_unix_server(_connection, path=path)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    print("echo ready", flush=True)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
