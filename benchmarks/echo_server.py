"""A bare Unix-socket echo server written the way hotreload's endpoint is: asyncio streams,
the same length-prefixed frames, one task per request. The floor for the routed path.

    python benchmarks/echo_server.py SOCKET_PATH
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hotreload.protocol.framing import pack_frame, read_frame


async def main(path: str) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def reply(frame) -> None:  # type: ignore[no-untyped-def]
            h = frame.header
            header = {"id": h.get("id"), "ok": True, "version": 1, "form": "single"}
            header["tensors"] = [dict(t, name="output") for t in h.get("tensors", [])]
            writer.writelines(pack_frame(header, [frame.payload]))
            await writer.drain()

        try:
            while (frame := await read_frame(reader, 1 << 26)) is not None:
                asyncio.create_task(reply(frame))  # noqa: RUF006 - short-lived
        except ConnectionError:
            pass
        writer.close()

    server = await asyncio.start_unix_server(handle, path=path)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    print("echo ready", flush=True)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
