"""A `transformers.TrainerCallback` that pushes the model being trained to a hotreload
session every N steps, without waiting, and writes what serves into the trainer's logs.

    from hotreload.training import HotreloadPush
    trainer = Trainer(..., callbacks=[HotreloadPush(model="llm", every_n_steps=50)])

Needs transformers (`pip install 'hotreload[examples]'`). Each push packs the state on
the training thread (the hand-over, then training goes on) and only the tensors changed
since the last push that served travel: a LoRA run pushes its adapter. Once a push serves,
the next log line of the trainer (and `state.log_history`) carries `hotreload_version`
and `hotreload_digest`; the session answers evals from that version on with
`Client.infer(..., min_version=version)`. At the end of training the final weights are
pushed and waited for (`at_end`), so an eval after `train()` sees them.

When the served model has an `eval` (its config's `eval = "evals.py:score"`), the figures
the session scored a pushed version with go into the next log line as `hotreload/<name>`
(with `hotreload_eval_version`), once they arrive; at the end of training the last push's
are waited for (up to `eval_wait_s`).
"""

from __future__ import annotations

import os
import time
from typing import Any

from hotreload.client import Client
from hotreload.errors import ClientError, PushSupersededError
from hotreload.push_lane import PushHandle

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - said once, at import
    raise ImportError(
        "hotreload.training.HotreloadPush needs transformers: pip install 'hotreload[examples]'"
    ) from exc


class HotreloadPush(TrainerCallback):  # type: ignore[misc]
    """Push `model.state_dict()` to the session's model `model` every `every_n_steps`
    optimizer steps (`wait=False`). `strict`, `full`, `timeout_s` as for
    `Client.update_weights`; `state_fn(model)` picks what to push (default: the whole
    state dict, `keep_vars=True`: frozen parameters unchanged since the last push are
    not sent; an adapter's tensors with `strict=False`). `served` lists
    `(step, version, digest)` of each push that served, in order; `errors` what failed."""

    def __init__(
        self,
        model: str | None = None,
        *,
        every_n_steps: int = 50,
        config: str | os.PathLike[str] | None = None,
        socket_path: str | os.PathLike[str] | None = None,
        client: Client | None = None,
        strict: bool = True,
        full: bool = False,
        timeout_s: float | None = None,
        at_end: bool = True,
        state_fn: Any = None,
        eval_wait_s: float = 60.0,
    ) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be 1 or more, got {every_n_steps}")
        self.model = model
        self.every_n_steps = every_n_steps
        self._client = client
        self._own_client = client is None
        self._where = (config, socket_path)
        self.strict, self.full, self.timeout_s, self.at_end = strict, full, timeout_s, at_end
        self.state_fn = state_fn or (lambda m: m.state_dict(keep_vars=True))
        self.served: list[tuple[int, int, str]] = []
        self.errors: list[tuple[int, str]] = []
        #: Seconds each push held the training loop (the hand-over: pack and send).
        self.handover_s: list[float] = []
        self._handles: list[tuple[int, PushHandle]] = []
        self._unlogged: dict[str, Any] = {}
        #: (version, figures) the session's eval gave each pushed version, in order, and
        #: (version, why) for those whose eval failed.
        self.evals: list[tuple[int, dict[str, float]]] = []
        self.eval_errors: list[tuple[int, str]] = []
        self.eval_wait_s = eval_wait_s
        #: Pushed versions whose eval has not been read yet; False once the session says
        #: the model has no eval (then it is never asked again).
        self._unscored: set[int] = set()
        self._scored_model: bool | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            config, socket_path = self._where
            self._client = Client(config, socket_path=socket_path, timeout_s=self.timeout_s)
        return self._client

    # ------------------------------------------------------------------ trainer events

    def on_step_end(
        self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any
    ) -> None:
        self._collect()
        if model is not None and state.global_step % self.every_n_steps == 0:
            self._push(model, state.global_step, wait=False)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        """The latest served push's version and digest, into this log line (callbacks after
        this one see them) and the trainer's log history (trainer_state.json)."""
        self._collect()
        self._collect_evals()
        if not self._unlogged or logs is None:
            return
        logs.update(self._unlogged)
        if state.log_history:
            state.log_history[-1].update(self._unlogged)
        self._unlogged = {}

    def on_train_end(
        self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any
    ) -> None:
        try:
            if self.at_end and model is not None:
                pushed = [step for step, _ in self._handles] + [s for s, _, _ in self.served]
                if state.global_step not in pushed:  # else that push is waited for below
                    self._push(model, state.global_step, wait=True)
            for _, handle in self._handles:
                try:
                    handle.result(self.timeout_s)
                except Exception:
                    pass  # recorded by _collect
            self._collect()
            deadline = time.monotonic() + self.eval_wait_s
            self._collect_evals()
            while self._unscored and self._scored_model and time.monotonic() < deadline:
                time.sleep(0.1)  # the last push's eval runs once it serves
                self._collect_evals()
            if self._unlogged:
                state.log_history.append({**self._unlogged, "step": state.global_step})
                self._unlogged = {}
        finally:
            if self._own_client and self._client is not None:
                self._client.close()
                self._client = None

    # ------------------------------------------------------------------ pushes

    def _push(self, model: Any, step: int, *, wait: bool) -> None:
        t0 = time.perf_counter()
        try:
            handle = self.client.update_weights(
                self.model,
                self.state_fn(model),
                strict=self.strict,
                full=self.full,
                timeout_s=self.timeout_s,
                wait=False,
            )
        except ClientError as exc:
            self.errors.append((step, str(exc)))
            return
        self.handover_s.append(time.perf_counter() - t0)
        self._handles.append((step, handle))
        if wait:
            try:
                handle.result(self.timeout_s)
            except Exception:
                pass  # recorded by _collect

    def _collect(self) -> None:
        """Move the pushes that ended from `_handles` to `served` / `errors`."""
        still = []
        for step, handle in self._handles:
            if not handle.done():
                still.append((step, handle))
                continue
            try:
                reply = handle.result(0)
            except PushSupersededError:
                continue  # a later push carries its tensors: nothing failed
            except Exception as exc:
                self.errors.append((step, str(exc)))
                continue
            self.served.append((step, reply["version"], reply["digest"]))
            if self._scored_model is not False:
                self._unscored.add(reply["version"])
            self._unlogged = {
                "hotreload_version": reply["version"],
                "hotreload_digest": reply["digest"],
                "hotreload_step": step,
            }
        self._handles = still

    def _collect_evals(self) -> None:
        """The eval figures of pushed versions that have them now, into the next log line
        (the newest version's); asked only while some pushed version has none yet."""
        if not self._unscored or self._scored_model is False:
            return
        try:
            reply = self.client.evals(self.model, since=min(self._unscored))
        except ClientError as exc:
            self.eval_errors.append((min(self._unscored), str(exc)))
            self._unscored.clear()
            return
        self._scored_model = bool(reply.get("configured"))
        if not self._scored_model:
            self._unscored.clear()
            return
        for result in reply.get("evals", []):
            version = result.get("version")
            if version not in self._unscored:
                continue
            self._unscored.discard(version)
            if result.get("error"):
                self.eval_errors.append((version, result["error"]))
                continue
            figures = dict(result.get("figures") or {})
            self.evals.append((version, figures))
            self._unlogged.update({f"hotreload/{k}": v for k, v in figures.items()})
            self._unlogged["hotreload_eval_version"] = version
