"""Bounds every request meets at the router, whichever way it came in.

- The header the router writes for the worker must fit the worker's reader
  (`framing.MAX_HEADER_BYTES`), counted as it is written (`framing.header_bytes`: UTF-8
  through orjson, ASCII-escaped by the stdlib, where a 600 KB header of non-ASCII text is
  1.8 MB), so it is refused at the edge instead of killing the worker.
- Requests parked for a version (`min_version`) count against the queue's bound and hold
  at most `MAX_PARKED_BYTES` in all: they wait as long as a push takes, and 400 parked
  requests of 4 MiB grew the manager from 47 to 1,654 MiB.
"""

from __future__ import annotations

from typing import Any

from hotreload.engine.signature import check_inputs, check_parameters
from hotreload.protocol.framing import MAX_HEADER_BYTES, header_bytes
from hotreload.protocol.tensors import validate_metas

#: What the requests parked for a version may hold in all (payloads and parameters).
MAX_PARKED_BYTES = 256 * 1024 * 1024
#: What the worker's header holds besides the tensors and parameters (op, deadline, id),
#: with room to spare.
_HEADER_OVERHEAD = 256
#: The largest tensors-and-parameters part of a forward header the worker reads.
FORWARD_HEADER_LIMIT = MAX_HEADER_BYTES - _HEADER_OVERHEAD


def forward_problem(
    metas: list[dict[str, Any]], parameters: Any, text: dict[str, Any] | None = None
) -> str | None:
    """Why the header for the worker would be too large, or None. Exact only when it could
    come close: most requests pay a sum of name lengths. `text`: a completion's request
    (its prompt travels in the header)."""
    rough = sum(len(m.get("name", "")) for m in metas) * 6 + 160 * len(metas)
    if not parameters and not text and rough < FORWARD_HEADER_LIMIT // 2:
        return None
    size = header_bytes({"tensors": metas, "parameters": parameters or {}, "text": text})
    if size <= FORWARD_HEADER_LIMIT:
        return None
    return (
        f"the request's tensor descriptions and parameters take {size} bytes as the worker "
        f"reads them (JSON), over the {FORWARD_HEADER_LIMIT}-byte header "
        "limit; send large values as input tensors, not parameters"
    )


def request_bytes(payload: bytes | memoryview, parameters: Any) -> int:
    """What a waiting request holds in memory: its tensor bytes and its parameters."""
    return len(payload) + (header_bytes(parameters) if parameters else 0)


class ParkedRequests:
    """Requests waiting for a version to serve, oldest first, and the bytes they hold.
    Each item is (min_version, bytes, request)."""

    def __init__(self, max_bytes: int = MAX_PARKED_BYTES) -> None:
        self.max_bytes = max_bytes
        self._items: list[tuple[int, int, Any]] = []
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, req: object) -> bool:
        return any(r is req for _, _, r in self._items)

    def refusal(self, size: int, waiting: int, max_count: int) -> str | None:
        """Why one more request of `size` bytes may not wait (`waiting` wait already)."""
        if waiting >= max_count:
            return f"{waiting} requests wait (limit {max_count}, max_queue_size)"
        if self.bytes + size > self.max_bytes:
            return (
                f"requests waiting for a version hold {self.bytes} bytes; this one's {size} "
                f"would pass the {self.max_bytes}-byte limit"
            )
        return None

    def add(self, min_version: int, size: int, req: Any) -> None:
        self._items.append((min_version, size, req))
        self.bytes += size

    def remove(self, req: Any) -> None:
        self._keep(lambda r: r is not req)

    def take_ready(self, version: int) -> list[Any]:
        """The requests `version` answers, taken out, oldest first."""
        ready = [r for v, _, r in self._items if v <= version]
        self._keep(lambda r: all(r is not x for x in ready))
        return ready

    def take_all(self) -> list[Any]:
        out = [r for _, _, r in self._items]
        self._items, self.bytes = [], 0
        return out

    def _keep(self, keep: Any) -> None:
        self._items = [item for item in self._items if keep(item[2])]
        self.bytes = sum(size for _, size, _ in self._items)


def request_problem(
    header: dict[str, Any],
    payload: bytes | memoryview,
    text: dict[str, Any] | None,
    input_form: str,
    input_signature: list[dict[str, Any]],
    tensors_checked: bool = False,
) -> tuple[list[dict[str, Any]], str | None]:
    """The request's tensor descriptions, and what is wrong with it for the router (None:
    nothing): its tensors against the payload, its form, its parameters, its inputs against
    the serving version's, and the size of the header the worker would read.
    `tensors_checked`: the tensors were described from the payload by a parser that checked
    what `validate_metas` checks (KServe's), so they are not checked twice."""
    try:
        if text:
            metas = []
        elif tensors_checked:
            metas = header["tensors"]
        else:
            metas = validate_metas(header.get("tensors"), len(payload), payload)
    except Exception as exc:  # ProtocolError: say what was wrong, keep serving
        return [], str(exc)
    parameters, form = header.get("parameters"), header.get("form")
    if form not in (None, "single", "tuple", "dict"):
        return metas, f"form {form!r} is not one of 'single', 'tuple', 'dict'"
    # A text request carries no tensors: the worker checks it (http/openai_routes.py
    # checked its fields), so it shares the queue, gate and timeouts of a forward.
    if not text:
        problem = check_parameters(parameters) or check_inputs(
            form, metas, input_form, input_signature
        )
        if problem:
            return metas, problem
    return metas, forward_problem(metas, parameters, text)
