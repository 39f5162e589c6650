"""A hotreload model's settings as Ray Serve deployment options, and the `[ray]` table.

hotreload's keys map onto Ray's where Ray has the same thing:

    threads          -> ray_actor_options.num_cpus (intra-op) and OMP_NUM_THREADS
    env              -> ray_actor_options.runtime_env.env_vars (set before the process starts)
    device           -> ray_actor_options.num_gpus ("cuda" 1, "cpu" 0; "auto": [ray] decides)
    max_inflight     -> max_ongoing_requests (requests a replica holds at once)
    max_queue_size   -> max_queued_requests (requests a caller queues before 503)
    request_timeout_s -> http_options.request_timeout_s (one for the whole Ray HTTP proxy)
    deadlines.forward_s -> health_check_timeout_s; drain_wait_s -> graceful_shutdown_timeout_s

What only Ray has comes from `[ray]` (every key optional), for every model or, under
`[ray.models.NAME]`, for one:

    [ray]
    num_replicas = 2                      # or [ray.autoscaling] (min/max_replicas, ...)
    max_replicas_per_node = 1
    placement_group_bundles = [{CPU = 1}] # and placement_group_strategy = "PACK"
    host = "127.0.0.1"                    # Ray's HTTP proxy
    port = 8000

What Ray cannot express fails with `NotExpressible`, saying what to change.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from typing import Any

from hotreload.config import Config, ModelConfig
from hotreload.config.checker import Checker
from hotreload.errors import ConfigError

#: Deployment keys `[ray]` and `[ray.models.NAME]` may set.
DEPLOYMENT_KEYS = (
    "num_replicas",
    "autoscaling",
    "max_replicas_per_node",
    "placement_group_bundles",
    "placement_group_strategy",
    "num_cpus",
    "num_gpus",
    "health_check_period_s",
)
TOP_KEYS = (*DEPLOYMENT_KEYS, "host", "port", "app_prefix", "models")
AUTOSCALING_KEYS = (
    "min_replicas",
    "max_replicas",
    "initial_replicas",
    "target_ongoing_requests",
    "upscale_delay_s",
    "downscale_delay_s",
    "metrics_interval_s",
    "look_back_period_s",
)
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


class NotExpressible(Exception):
    """A setting Ray Serve has no equivalent for; the message says what to change."""


@dataclass(frozen=True)
class RayTable:
    """`[ray]`: Ray-only settings, for every model and per model."""

    host: str = "127.0.0.1"
    port: int = 8000
    #: Each model serves as the application `<app_prefix><name>`.
    app_prefix: str = ""
    shared: dict[str, Any] = field(default_factory=dict)
    per_model: dict[str, dict[str, Any]] = field(default_factory=dict)

    def for_model(self, name: str) -> dict[str, Any]:
        return {**self.shared, **self.per_model.get(name, {})}


def _deployment_keys(c: Checker) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "num_replicas" in c.table:
        out["num_replicas"] = c.integer("num_replicas", 1, minimum=1)
    if "autoscaling" in c.table:
        a = c.subtable("autoscaling", AUTOSCALING_KEYS)
        out["autoscaling"] = {
            k: a.number(k, None, minimum=0)
            if "_s" in k or "target" in k
            else a.integer(k, 1, minimum=0)
            for k in a.table
        }
        if "num_replicas" in out:
            c.fail(c.sub("autoscaling"), "set num_replicas or [ray.autoscaling], not both")
    if "max_replicas_per_node" in c.table:
        out["max_replicas_per_node"] = c.integer("max_replicas_per_node", 1, minimum=1)
    if "placement_group_bundles" in c.table:
        bundles = c.get("placement_group_bundles", list, [], "a list of tables ({CPU = 1})")
        if not bundles or not all(
            isinstance(b, dict) and all(isinstance(v, (int, float)) for v in b.values())
            for b in bundles
        ):
            c.fail(
                c.sub("placement_group_bundles"),
                "expected a non-empty list of tables of resource amounts, e.g. [{CPU = 1}]",
            )
        out["placement_group_bundles"] = bundles
    if "placement_group_strategy" in c.table:
        out["placement_group_strategy"] = c.choice("placement_group_strategy", "PACK", STRATEGIES)
    for key in ("num_cpus", "num_gpus"):
        if key in c.table:
            out[key] = c.number(key, None, minimum=0)
    if "health_check_period_s" in c.table:
        out["health_check_period_s"] = c.number("health_check_period_s", None, minimum=0.1)
    return out


def read_ray_table(config: Config) -> RayTable:
    """`[ray]` of the config file (the rest of the file was validated by load_config)."""
    raw = tomllib.loads(config.path.read_text(encoding="utf-8"))
    prefix = ""
    if config.path.name == "pyproject.toml":
        raw, prefix = raw["tool"]["hotreload"], "tool.hotreload."
    c = Checker(raw.get("ray", {}), path=config.path, key=prefix + "ray", known=TOP_KEYS)
    names = [m.name for m in config.models]
    per_model: dict[str, dict[str, Any]] = {}
    models = c.subtable("models", tuple(names))
    for name in models.table:
        per_model[name] = _deployment_keys(models.subtable(name, DEPLOYMENT_KEYS))
    return RayTable(
        host=c.get("host", str, "127.0.0.1", "a host name or address"),
        port=c.integer("port", 8000, minimum=1, maximum=65535),
        app_prefix=c.get("app_prefix", str, "", "a string"),
        shared=_deployment_keys(c),
        per_model=per_model,
    )


def _num_gpus(model: ModelConfig, ray: dict[str, Any]) -> float:
    device = model.device
    if device.startswith("cuda:") and device != "cuda:0":
        raise NotExpressible(
            f"device = {device!r}: Ray picks each replica's GPU itself (CUDA_VISIBLE_DEVICES); "
            'set device = "cuda" and, to keep it off a GPU, Ray resources or placement'
        )
    if device == "cpu":
        if ray.get("num_gpus"):
            raise NotExpressible(
                f'device = "cpu" but [ray] num_gpus = {ray["num_gpus"]}: the replica would '
                "hold a GPU it never uses; drop one of them"
            )
        return 0.0
    if device.startswith("cuda"):
        return float(ray.get("num_gpus", 1.0))
    return float(ray.get("num_gpus", 0.0))  # auto: a GPU only where [ray] asks for one


def deployment_options(model: ModelConfig, ray: dict[str, Any]) -> dict[str, Any]:
    """The deployment's entry of serve_config.yaml, less its name and user_config."""
    if isinstance(model.cpus, tuple):
        raise NotExpressible(
            f"cpus = {list(model.cpus)}: Ray schedules replicas on CPUs by count, not by id; "
            'set cpus = "auto" and threads (the replica reserves that many CPUs)'
        )
    if model.policy == "resource":
        raise NotExpressible(
            'policy = "resource": a Ray replica loads new weights beside the serving ones '
            "(a lightweight update keeps traffic flowing); unloading first would stop "
            'serving. Use policy = "auto" or "availability", or fewer replicas per GPU'
        )
    intra = model.threads.intra_op if model.threads else 0
    env = dict(model.env)
    if intra:
        env.setdefault("OMP_NUM_THREADS", str(intra))
    actor: dict[str, Any] = {
        "num_cpus": float(ray.get("num_cpus", intra or 1)),
        "num_gpus": _num_gpus(model, ray),
    }
    if env:
        actor["runtime_env"] = {"env_vars": env}
    d = model.deadlines
    out: dict[str, Any] = {
        "max_ongoing_requests": model.max_inflight,
        "max_queued_requests": model.max_queue_size,
        # A forward over forward_s means a wedged replica, as for hotreload's worker.
        "health_check_timeout_s": max(d.forward_s, 1.0),
        "health_check_period_s": ray.get("health_check_period_s", 10.0),
        "graceful_shutdown_timeout_s": d.drain_wait_s,
        "graceful_shutdown_wait_loop_s": min(2.0, d.drain_wait_s),
        "ray_actor_options": actor,
    }
    if "autoscaling" in ray:
        out["autoscaling_config"] = ray["autoscaling"]
    else:
        out["num_replicas"] = ray.get("num_replicas", 1)
    for key in ("max_replicas_per_node", "placement_group_bundles", "placement_group_strategy"):
        if key in ray:
            out[key] = ray[key]
    return out


def request_timeout(models: list[ModelConfig]) -> float:
    """Ray's HTTP proxy has one request timeout for every application."""
    timeouts = {m.request_timeout_s for m in models}
    if len(timeouts) > 1:
        listed = ", ".join(f"{m.name} {m.request_timeout_s:g} s" for m in models)
        raise NotExpressible(
            f"request_timeout_s differs between models ({listed}); Ray's HTTP proxy has one "
            "timeout for all: give them one value, or export them to separate clusters "
            "with --model"
        )
    return timeouts.pop()


def check_ray_table(config: Config) -> RayTable:
    """`read_ray_table`, with a config error's message as NotExpressible's."""
    try:
        return read_ray_table(config)
    except ConfigError as exc:
        raise NotExpressible(str(exc)) from None
