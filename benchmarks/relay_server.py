"""The bare two-hop floor of the routed path: a relay written the way the manager is (the
same `FrameProtocol` on an asyncio loop, forwarding each frame's header and payload to a
child process over a socketpair and the reply back), and a child written the way the
worker is (a reader thread handing frames to a serving thread over a queue, blocking
sends), with no model, no router, no queue limits, no counters.

    python benchmarks/relay_server.py SOCKET_PATH

`hotreload routed / this relay` is what hotreload's routing adds on top of crossing the
same two process boundaries; `this relay / bare echo` is what the second hop costs.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hotreload.protocol.frame_protocol import FrameProtocol
from hotreload.protocol.framing import Frame, SocketFrameReader, pack_frame, send_frame

MAX = 1 << 26


def backend(fd: int) -> None:
    """The worker-shaped echo: reader thread -> queue -> serving thread -> sendmsg."""
    sock = socket.socket(fileno=fd)
    sys.setswitchinterval(0.0005)  # as the worker sets it
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    send_lock = threading.Lock()

    def serve() -> None:
        while (frame := q.get()) is not None:
            h = frame.header
            header = {"id": h["id"], "ok": True, "version": 1, "form": "single"}
            header["tensors"] = [dict(t, name="output") for t in h.get("tensors", [])]
            with send_lock:
                send_frame(sock, pack_frame(header, [frame.payload]))

    threading.Thread(target=serve, daemon=True).start()
    reader = SocketFrameReader(sock, MAX)
    while True:
        try:
            q.put(reader.read())
        except (ConnectionError, OSError):
            q.put(None)
            return


async def relay(path: str) -> None:
    parent, child = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--backend", str(child.fileno())], pass_fds=(child.fileno(),)
    )
    child.close()
    loop = asyncio.get_running_loop()
    pending: dict[int, tuple[FrameProtocol, Any]] = {}
    ids = itertools.count(1)

    def from_backend(frame: Frame) -> None:
        conn, rid = pending.pop(frame.header["id"])
        frame.header["id"] = rid
        conn.write(pack_frame(frame.header, [frame.payload]))

    _, back = await loop.create_unix_connection(
        lambda: FrameProtocol(MAX, from_backend), sock=parent
    )

    def connection() -> FrameProtocol:
        conn: FrameProtocol

        def on_frame(frame: Frame) -> None:
            bid = next(ids)
            pending[bid] = (conn, frame.header.get("id"))
            frame.header["id"] = bid
            back.write(pack_frame(frame.header, [frame.payload]))

        conn = FrameProtocol(MAX, on_frame)
        return conn

    server = await loop.create_unix_server(connection, path=path)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print("relay ready", flush=True)
    async with server:
        await stop.wait()
    back.close()
    proc.wait(10)


if __name__ == "__main__":
    if sys.argv[1] == "--backend":
        backend(int(sys.argv[2]))
        os._exit(0)
    asyncio.run(relay(sys.argv[1]))
