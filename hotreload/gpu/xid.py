"""Xid events: the kernel-log parser, NVIDIA's Xid catalog, and the live monitor.

The parser accepts every form of `NVRM: Xid` line real logs carry (bare, dmesg uptime,
`dmesg -T`, syslog and journald prefixes in any locale, ISO times, remote-log prefixes,
`PCI:DDDD:BB:DD` / `DDDD:BB:DD` / `BB:DD` / redacted bus ids, with or without pid and
process name). Xid-less "fallen off the bus" lines count as Xid 79; NVSwitch `SXid` lines
are not GPU Xids.

`XidMonitor` watches two optional sources, NVML's event API and the kernel log, each
reported as active or not (and why); the same event seen by both is reported once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from hotreload.gpu import kernel_log
from hotreload.gpu.nvml import (
    RECOVERY_ACTIONS,
    NvmlGateway,
    NvmlUnavailable,
    gateway,
    normalize_bus_id,
)
from hotreload.gpu.nvml_events import NvmlEvent, NvmlEventSet
from hotreload.gpu.xid_events import (
    SEVERITIES,
    XidEvent,
    XidInfo,
    catalog_codes,
    event_to_json,
    format_event,
    lookup,
    new_event,
)
from hotreload.gpu.xid_parse import XidLineParser, parse_line, parse_lines

log = logging.getLogger(__name__)

__all__ = [
    "SEVERITIES",
    "XidEvent",
    "XidInfo",
    "XidLineParser",
    "XidMonitor",
    "XidSourceStatus",
    "catalog_codes",
    "event_to_json",
    "format_event",
    "lookup",
    "parse_line",
    "parse_lines",
]


@dataclass(frozen=True)
class XidSourceStatus:
    """Whether one Xid source is watching, and why (not)."""

    name: str  # "nvml" or "kmsg"
    active: bool
    reason: str | None


def _same_gpu(a: XidEvent, b: XidEvent) -> bool:
    if a.bus is not None and b.bus is not None:
        return a.bus == b.bus
    if a.device_index is not None and b.device_index is not None:
        return a.device_index == b.device_index
    return True  # one side cannot say which GPU: within the window, assume the same


class _Merger:
    """Reports one event once when NVML and the kernel log both see it.

    Kernel-log events carry more (pid, process, text), so they are emitted at once; an NVML
    event waits up to `window_s` for its kernel-log twin and is emitted alone only if none
    comes. An NVML event arriving after its twin is dropped.
    """

    def __init__(
        self, emit: Callable[[XidEvent], None], window_s: float, clock: Callable[[], float]
    ) -> None:
        self._emit = emit
        self._window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: list[tuple[float, XidEvent]] = []
        self._recent_kernel: deque[tuple[float, XidEvent]] = deque(maxlen=64)

    def _prune(self, now: float) -> None:
        while self._recent_kernel and now - self._recent_kernel[0][0] > self._window_s:
            self._recent_kernel.popleft()

    def from_kernel(self, ev: XidEvent) -> None:
        now = self._clock()
        out: XidEvent | None = ev
        with self._lock:
            self._prune(now)
            if ev.inferred and any(
                k.xid == 79 and _same_gpu(k, ev) for _, k in self._recent_kernel
            ):
                out = None  # the driver's own Xid 79 line already reported this loss
            else:
                for i, (_, n) in enumerate(self._pending):
                    if n.xid == ev.xid and _same_gpu(n, ev):
                        del self._pending[i]
                        out = replace(
                            ev,
                            device_index=ev.device_index
                            if ev.device_index is not None
                            else n.device_index,
                            also_from=(*ev.also_from, "nvml"),
                        )
                        break
                self._recent_kernel.append((now, ev))
        if out is not None:
            self._emit(out)

    def from_nvml(self, ev: XidEvent) -> None:
        now = self._clock()
        with self._lock:
            self._prune(now)
            if any(k.xid == ev.xid and _same_gpu(k, ev) for _, k in self._recent_kernel):
                return
            self._pending.append((now + self._window_s, ev))

    def flush(self, force: bool = False) -> None:
        now = self._clock()
        with self._lock:
            due = [e for t, e in self._pending if force or t <= now]
            self._pending = [(t, e) for t, e in self._pending if not (force or t <= now)]
        for e in due:
            self._emit(e)


def _nvml_event_to_xid(ev: NvmlEvent, received_at: float) -> XidEvent | None:
    pci = None
    bus = None
    if ev.pci_bus_id:
        bus = normalize_bus_id(ev.pci_bus_id)
        # Print it the way the kernel does, so the two sources read the same.
        pci = "{:04x}:{:02x}:{:02x}".format(*bus) if bus else ev.pci_bus_id
    action = None
    if ev.kind == "xid":
        code, text = ev.data, "reported by NVML's event API"
    elif ev.kind == "dbe":
        code, text = 48, "double bit ECC error (NVML event)"
    elif ev.kind == "sbe_storm":
        code, text = 92, "single bit ECC error storm (NVML event)"
    elif ev.kind == "recovery_action":
        label = RECOVERY_ACTIONS.get(ev.data, f"0x{ev.data:x}")
        code, text = 154, f"GPU recovery action changed to 0x{ev.data:x} ({label}) (NVML event)"
        action = f"Driver asks: {label}."
    else:
        return None
    return new_event(
        code,
        action=action,
        pci=pci,
        bus=bus,
        device_index=ev.device_index,
        pid=None,
        process=None,
        text=text,
        timestamp=None,
        received_at=received_at,
        source="nvml",
    )


# NVML failures after which retrying cannot help in this process's lifetime.
_PERMANENT_KINDS = frozenset({"not_installed", "library_not_found"})


class XidMonitor:
    """Watches NVML events and the kernel log for Xids; calls `on_event` once per event.

    `on_event` runs on a monitor thread; its exceptions are logged, never raised into it.
    """

    def __init__(
        self,
        on_event: Callable[[XidEvent], None],
        phase_of: Callable[[], str | None] = lambda: None,
        *,
        use_nvml: bool = True,
        use_kernel_log: bool = True,
        nvml: NvmlGateway | None = None,
        kernel_log_method: str | None = None,
        kmsg_path: str = kernel_log.KMSG_PATH,
        wait_timeout_ms: int = 200,
        merge_window_s: float = 1.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        history: int = 200,
    ) -> None:
        self._on_event = on_event
        self._phase_of = phase_of
        self._use_nvml = use_nvml
        self._use_kernel_log = use_kernel_log
        self._gw = nvml
        self._kernel_log_method = kernel_log_method
        self._kmsg_path = kmsg_path
        self._wait_timeout_ms = wait_timeout_ms
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._status_lock = threading.Lock()
        self._status: dict[str, XidSourceStatus] = {
            "nvml": XidSourceStatus("nvml", False, "not started" if use_nvml else "disabled"),
            "kmsg": XidSourceStatus("kmsg", False, "not started" if use_kernel_log else "disabled"),
        }
        self._decided = {"nvml": threading.Event(), "kmsg": threading.Event()}
        self._merger = _Merger(self._deliver, merge_window_s, time.monotonic)
        self._history: deque[XidEvent] = deque(maxlen=history)
        #: How many times the NVML event set was (re)created.
        self.event_set_creations = 0

    # -- public -----------------------------------------------------------------------
    @property
    def sources(self) -> list[XidSourceStatus]:
        with self._status_lock:
            return [self._status["nvml"], self._status["kmsg"]]

    @property
    def events(self) -> tuple[XidEvent, ...]:
        """Events delivered so far (the most recent `history`), oldest first."""
        return tuple(self._history)

    def start(self) -> None:
        if self._threads:
            raise RuntimeError("monitor already started")
        if self._use_nvml:
            self._threads.append(
                threading.Thread(target=self._nvml_loop, name="hotreload-xid-nvml", daemon=True)
            )
        else:
            self._decided["nvml"].set()
        if self._use_kernel_log:
            self._threads.append(
                threading.Thread(target=self._kernel_loop, name="hotreload-xid-kmsg", daemon=True)
            )
        else:
            self._decided["kmsg"].set()
        for t in self._threads:
            t.start()

    def wait_ready(self, timeout: float = 5.0) -> bool:
        """Wait until each enabled source is either watching or known not to work."""
        deadline = time.monotonic() + timeout
        return all(e.wait(max(deadline - time.monotonic(), 0)) for e in self._decided.values())

    def stop(self, timeout: float = 2.0) -> bool:
        """Stop both sources and join their threads; True when all ended in time."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(deadline - time.monotonic(), 0))
        self._merger.flush(force=True)
        return not any(t.is_alive() for t in self._threads)

    # -- plumbing -----------------------------------------------------------------------
    def _gateway(self) -> NvmlGateway:
        return self._gw or gateway()

    def _set_status(self, name: str, active: bool, reason: str | None) -> None:
        with self._status_lock:
            self._status[name] = XidSourceStatus(name, active, reason)
        self._decided[name].set()

    def _phase(self) -> str | None:
        try:
            return self._phase_of()
        except Exception:
            log.exception("phase_of callback failed")
            return None

    def _deliver(self, ev: XidEvent) -> None:
        self._history.append(ev)
        try:
            self._on_event(ev)
        except Exception:
            log.exception("on_event callback failed")

    def _device_for(self, ev: XidEvent) -> XidEvent:
        if ev.bus is None or ev.device_index is not None:
            return ev
        try:
            index = self._gateway().bus_index_map().get(ev.bus)
        except Exception:
            index = None
        return replace(ev, device_index=index) if index is not None else ev

    # -- kernel log ---------------------------------------------------------------------
    def _kernel_loop(self) -> None:
        try:
            method = self._kernel_log_method
            if method is None:
                choice = kernel_log.probe_kernel_log(self._kmsg_path)
                if choice.method is None:
                    self._set_status("kmsg", False, choice.detail)
                    return
                method, detail = choice.method, choice.detail
            else:
                detail = f"following {self._kmsg_path if method == 'kmsg' else method}"
            self._set_status("kmsg", True, detail)
            parser = XidLineParser(source="kmsg")
            for line in kernel_log.follow_kernel_log(self._stop, method, self._kmsg_path):
                ev = parser.feed(line)
                if ev is None:
                    continue
                ev = replace(self._device_for(ev), phase=self._phase())
                self._merger.from_kernel(ev)
            if not self._stop.is_set():
                self._set_status("kmsg", False, f"{detail}: the log reader ended")
        except Exception as exc:
            log.warning("kernel log source stopped: %s", exc)
            self._set_status("kmsg", False, f"kernel log reader failed: {exc}")

    # -- NVML events --------------------------------------------------------------------
    def _nvml_loop(self) -> None:
        gw = self._gateway()
        backoff = self._backoff_initial_s
        while not self._stop.is_set():
            try:
                events = NvmlEventSet(gw)
            except NvmlUnavailable as err:
                if err.kind in _PERMANENT_KINDS:
                    self._set_status("nvml", False, err.reason)
                    return
                self._set_status("nvml", False, f"{err.reason}; retrying in {backoff:g} s")
                if self._stop.wait(backoff):
                    return
                backoff = min(backoff * 2, self._backoff_max_s)
                continue
            self.event_set_creations += 1
            if not events.registered:
                events.free()
                self._set_status(
                    "nvml", False, "no GPU supports Xid events (or no NVIDIA GPU found)"
                )
                if self._stop.wait(self._backoff_max_s):
                    return
                continue
            gpus = ", ".join(str(i) for i in sorted(events.registered))
            self._set_status("nvml", True, f"NVML events on GPU {gpus}")
            backoff = self._backoff_initial_s
            broken = self._wait_events(events)
            events.free()
            if broken is None:
                return
            # A lost GPU or a driver reload invalidates the set: re-create it after a pause.
            # (The gateway already scheduled an NVML re-init if the error called for one.)
            self._set_status("nvml", False, f"{broken}; re-creating the event set")
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, self._backoff_max_s)

    def _wait_events(self, events: NvmlEventSet) -> str | None:
        """Wait for events until stopped (None) or the set breaks (the reason)."""
        while not self._stop.is_set():
            try:
                nev = events.wait(self._wait_timeout_ms)
            except NvmlUnavailable as err:
                return err.reason
            if nev is not None:
                ev = _nvml_event_to_xid(nev, time.time())
                if ev is not None:
                    self._merger.from_nvml(replace(ev, phase=self._phase()))
            self._merger.flush()
        return None
