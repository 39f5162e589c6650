"""Headers of the ops a trainer sends (`update_weights`, `wait_version`) and their replies,
built once for both clients (`client.py`); the session checks the same fields."""

from __future__ import annotations

from typing import Any

from hotreload.errors import ClientError, ProtocolError
from hotreload.protocol.framing import MAX_HEADER_BYTES, Frame, header_bytes
from hotreload.protocol.shared_state import PackedState


def update_weights_header(
    model: str | None, packed: PackedState, strict: bool, timeout_s: float | None
) -> dict[str, Any]:
    """The `update_weights` request: the state travels by its descriptor, no payload."""
    header: dict[str, Any] = {
        "op": "update_weights",
        "model": model,
        "strict": strict,
        "state": packed.descriptor,
    }
    if timeout_s is not None:
        header["timeout_s"] = timeout_s
    # Said here, not as a dropped connection: the session refuses a header this long.
    size = header_bytes(header)
    if size > MAX_HEADER_BYTES - 1024 and "leaves" in packed.descriptor:
        # The digest leaves are a speed-up: without them the worker hashes the push.
        packed.descriptor.pop("leaves")
        size = header_bytes(header)
    if size > MAX_HEADER_BYTES - 1024:
        raise ClientError(
            f"the description of {len(packed.descriptor['tensors'])} tensors takes {size} "
            f"bytes, over the {MAX_HEADER_BYTES}-byte header limit; push fewer tensors per "
            "call (strict=False)"
        )
    return header


def weights_reply(frame: Frame) -> dict[str, Any]:
    version, digest = frame.header.get("version"), frame.header.get("digest")
    if not isinstance(version, int) or not isinstance(digest, str):
        raise ProtocolError("the update_weights reply lacks its version or digest")
    adapters = frame.header.get("adapters")  # peft adapters' digests, when it has some
    return {"version": version, "digest": digest, **({"adapters": adapters} if adapters else {})}


def version_reply(frame: Frame) -> int:
    version = frame.header.get("version")
    if not isinstance(version, int):
        raise ProtocolError("the wait_version reply lacks its version")
    return version


def wait_version_header(model: str | None, version: int, timeout_s: float | None) -> dict[str, Any]:
    header: dict[str, Any] = {"op": "wait_version", "model": model, "version": int(version)}
    if timeout_s is not None:
        header["timeout_s"] = timeout_s
    return header
