"""Weights updates under load: hotreload vs Ray Serve (hotreload export ray) vs a plain
blocking `reconfigure`, side by side in one run.

    .venv/bin/python benchmarks/ray_side_by_side.py [--clients 16] [--seconds 20]
        [--updates 3] [--every 4] [--hidden 1024]

The same model in all three: the example MLP, widened to `--hidden` (bigger weights, so a
load takes long enough to show), served on CPU, 16 closed-loop KServe JSON clients:

- hotreload: `hotreload watch --http`; an update writes a new weights file over the one
  the config names (renamed into place), the watcher reloads it;
- ray-hotreload: `hotreload export ray`, 2 replicas on a local `ray start --head`; an update
  is `hotreload export ray --weights FILE` + `serve deploy` (a lightweight update: the
  replica loads, warms and smoke-tests beside the serving version, then swaps);
- ray-blocking: the same cluster and export, but the replica's `reconfigure` is what a Ray
  user writes today (ray_blocking_replica.py): `load_state_dict` in place, synchronously,
  on the replica's event loop, so requests wait while it loads.

Each system runs once without updates (`--seconds`: steady p99) and once with `--updates`
updates, each `--every` s after the last one's command returned.
Reported: answered, failed; steady p99; p99 of requests overlapping an update window
([update sent, first answer with the new digest + 0.5 s]); update -> first new answer.
Figures, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import REPO, Server, percentile

sys.path.insert(0, str(REPO))
from tests.ray.support_ray import BIN, RayCluster, free_port

BODY = json.dumps(
    {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.1] * 64}]}
).encode()


@dataclass
class Run:
    system: str
    updates: bool
    #: (send wall time, latency ms, digest) per answer.
    samples: list[tuple[float, float, str]] = field(default_factory=list)
    failed: int = 0
    #: wall time each update was sent.
    sent_at: list[float] = field(default_factory=list)


async def _clients(url: str, clients: int, stop: asyncio.Event, run: Run) -> None:
    import aiohttp

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=60)
    ) as http:

        async def one() -> None:
            while not stop.is_set():
                t_wall, t0 = time.time(), time.perf_counter()
                try:
                    async with http.post(url + "/v2/models/mlp/infer", data=BODY) as r:
                        doc = await r.json(content_type=None)
                        if r.status != 200:
                            raise RuntimeError(doc)
                except Exception:
                    run.failed += 1
                    await asyncio.sleep(0.001)
                    continue
                digest = str(doc.get("parameters", {}).get("weights_digest"))
                run.samples.append((t_wall, (time.perf_counter() - t0) * 1000, digest))

        await asyncio.gather(*(one() for _ in range(clients)))


def _project(tmp: Path, hidden: int, port: int) -> Path:
    proj = tmp / "proj"
    shutil.copytree(REPO / "examples" / "mlp", proj, ignore=shutil.ignore_patterns(".hotreload"))
    model_py = proj / "model.py"
    model_py.write_text(model_py.read_text().replace("HIDDEN = 512", f"HIDDEN = {hidden}"))
    config = (proj / "hotreload.toml").read_text().replace('device = "auto"', 'device = "cpu"')
    (proj / "hotreload.toml").write_text(config + f"\n[ray]\nnum_replicas = 2\nport = {port}\n")
    _weights(proj, proj / "weights.safetensors", 1.0)
    return proj


def _weights(proj: Path, path: Path, scale: float) -> None:
    """The model's weights times `scale`, written to `path` (renamed into place)."""
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(proj))
    import model  # the project's model.py

    torch.manual_seed(0)
    state = {k: v * scale for k, v in model.build().state_dict().items()}
    tmp = path.with_suffix(".part")
    save_file(state, str(tmp))
    tmp.replace(path)


def run_hotreload(proj: Path, args: argparse.Namespace, updates: bool) -> Run:
    port = free_port()
    cmd = [sys.executable, "-m", "hotreload", "watch", "--no-tui", "--config"]
    server = Server(
        [*cmd, str(proj / "hotreload.toml"), "--http", f"127.0.0.1:{port}"],
        "serving",
        proj,
        timeout_s=300,
    )
    try:
        time.sleep(2)
        return _measure("hotreload", f"http://127.0.0.1:{port}", args, updates, lambda k: (
            _weights(proj, proj / "weights.safetensors", 1.0 + 0.1 * k)
        ))  # fmt: skip
    finally:
        server.stop()


def _ray_update(cluster: RayCluster, out: Path, tmp: Path, proj: Path, k: int) -> float:
    """Write update k's weights and name them in user_config, then `serve deploy`: the
    update counts from the deploy (the CLI's own start-up, seconds here, included)."""
    new = tmp / f"update_{k}.safetensors"
    _weights(proj, new, 1.0 + 0.1 * k)
    subprocess.run(
        [sys.executable, "-m", "hotreload", "export", "ray", str(out), "--model", "mlp",
         "--weights", str(new)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    sent = time.time()
    cluster.deploy(out / "serve_config.yaml")
    return sent


def _measure(system: str, url: str, args: argparse.Namespace, updates: bool, update: Any) -> Run:
    run = Run(system, updates)

    async def go() -> None:
        stop = asyncio.Event()
        load = asyncio.create_task(_clients(url, args.clients, stop, run))
        await asyncio.sleep(args.every)
        if updates:
            # One update after another (each once the last one's command returned), then
            # `every` s more, so the last one's first new answer falls inside the run.
            for k in range(1, args.updates + 1):
                t = time.time()
                sent = await asyncio.to_thread(update, k)
                run.sent_at.append(sent if isinstance(sent, float) else t)
                await asyncio.sleep(args.every)
        else:
            await asyncio.sleep(args.seconds)
        stop.set()
        await load

    asyncio.run(go())
    return run


def _blocking_export(out: Path) -> Path:
    """The export's config with the blocking replica: ray_blocking_replica.py in the zip."""
    from hotreload.export.ray import STATE_FILE, _zip, write_config

    app = out / "app" / "mlp"
    shutil.copyfile(Path(__file__).with_name("ray_blocking_replica.py"), app / "blocking.py")
    archive = _zip(app, out, "mlp")
    state = json.loads((out / STATE_FILE).read_text())
    state["models"]["mlp"]["working_dir"] = archive.parent.as_uri() + "/" + archive.name
    state["import_path"] = "blocking:app"  # kept by later `--weights` writes
    return write_config(out, state)


def run_ray(proj: Path, tmp: Path, args: argparse.Namespace, cluster: RayCluster) -> list[Run]:
    runs = []
    for system in ("ray-hotreload", "ray-blocking"):
        out = tmp / system
        subprocess.run(
            [sys.executable, "-m", "hotreload", "export", "ray", str(out), "--config",
             str(proj / "hotreload.toml")],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        if system == "ray-blocking":
            _blocking_export(out)
        for updates in (False, True):
            cluster.deploy(out / "serve_config.yaml")
            cluster.wait_running(["mlp"])
            time.sleep(2)
            url = f"http://127.0.0.1:{cluster.http_port}"
            runs.append(
                _measure(
                    system,
                    url,
                    args,
                    updates,
                    lambda k, out=out: _ray_update(cluster, out, tmp, proj, k),
                )
            )
    return runs


def report(runs: list[Run]) -> None:
    steady = {r.system: r for r in runs if not r.updates}
    print(f"{'system':<15} {'answered':>9} {'failed':>7} {'steady p99':>11} "
          f"{'update p99':>11} {'ratio':>6} {'update->new answer':>19}")  # fmt: skip
    for r in runs:
        if not r.updates:
            continue
        s = steady[r.system]
        p99_steady = percentile([x[1] for x in s.samples], 99)
        firsts: list[float] = []
        window: list[float] = []
        for t in r.sent_at:
            before = {d for (tw, _, d) in r.samples if tw < t}
            new = sorted(tw for (tw, _, d) in r.samples if tw >= t and d not in before)
            if new:
                firsts.append(new[0] - t)
                window += [lat for (tw, lat, _) in r.samples if t <= tw <= new[0] + 0.5]
        p99_up = percentile(window, 99)
        first = f"{percentile(firsts, 50):.2f} s med ({len(firsts)}/{len(r.sent_at)})"
        print(f"{r.system:<15} {len(r.samples) + len(s.samples):>9} "
              f"{r.failed + s.failed:>7} {p99_steady:>9.1f}ms {p99_up:>9.1f}ms "
              f"{p99_up / p99_steady:>6.1f} {first:>19}")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--every", type=float, default=4.0)
    p.add_argument("--updates", type=int, default=3)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--systems", nargs="+", default=["hotreload", "ray"])
    args = p.parse_args()
    if not (BIN / "serve").exists() and "ray" in args.systems:
        raise SystemExit("needs Ray Serve: pip install -e '.[ray]'")
    tmp = Path(tempfile.mkdtemp(prefix="hr-ray-bench-"))
    runs: list[Run] = []
    cluster = None
    try:
        if "ray" in args.systems:
            cluster = RayCluster()
        port = cluster.http_port if cluster else free_port()
        proj = _project(tmp, args.hidden, port)
        if "hotreload" in args.systems:
            runs += [run_hotreload(proj, args, u) for u in (False, True)]
            _weights(proj, proj / "weights.safetensors", 1.0)
        if cluster is not None:
            runs += run_ray(proj, tmp, args, cluster)
    finally:
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(cluster.temp_dir, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{args.clients} closed-loop clients; steady run {args.seconds:g} s; "
          f"{args.updates} updates, {args.every:g} s apart; MLP hidden {args.hidden}")  # fmt: skip
    report(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
