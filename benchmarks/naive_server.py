"""The naive baseline: one process, one serving thread, and a reload that re-imports and
loads the model ON that serving thread (what a hand-rolled Flask/FastAPI hot reload does).

    python benchmarks/naive_server.py SOCKET_PATH PROJECT_DIR
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch

from hotreload.protocol.framing import pack_frame, read_frame
from hotreload.protocol.tensors import decode_tensors, encode_tensors


def main(path: str, project: str) -> None:
    torch.set_num_threads(1)
    sys.path.insert(0, project)
    state: dict[str, object] = {"version": 0}

    def load() -> None:
        import model  # type: ignore[import-not-found]
        from safetensors.torch import load_file

        importlib.reload(model)
        m = model.build()
        m.load_state_dict(load_file(str(Path(project) / "weights.safetensors")))
        m.eval()
        with torch.inference_mode():
            for _ in range(3):
                m(model.example_input())
        state["model"] = m
        state["version"] = int(state["version"]) + 1  # type: ignore[call-overload]

    def infer(metas: list, payload: bytes) -> tuple[dict, list]:  # type: ignore[type-arg]
        x = decode_tensors(metas, payload, writable=True)
        with torch.inference_mode():
            out = state["model"](torch.from_numpy(next(iter(x.values()))))  # type: ignore[operator]
        m, b = encode_tensors({"output": out.numpy()})
        return {"ok": True, "version": state["version"], "form": "single", "tensors": m}, b

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)  # the one serving thread
    load()

    async def serve() -> None:
        loop = asyncio.get_running_loop()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            async def one(frame) -> None:  # type: ignore[no-untyped-def]
                h = frame.header
                if h.get("op") == "reload":
                    await loop.run_in_executor(pool, load)
                    header, blobs = {"ok": True, "version": state["version"]}, []
                else:
                    header, blobs = await loop.run_in_executor(
                        pool, infer, h["tensors"], bytes(frame.payload)
                    )
                header["id"] = h.get("id")
                writer.writelines(pack_frame(header, blobs))

            try:
                while (frame := await read_frame(reader, 1 << 26)) is not None:
                    asyncio.create_task(one(frame))  # noqa: RUF006
            except ConnectionError:
                pass

        server = await asyncio.start_unix_server(handle, path=path)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGINT, stop.set)
        print("naive ready", flush=True)
        async with server:
            await stop.wait()

    np.seterr(all="ignore")
    asyncio.run(serve())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
