"""The baseline of benchmarks/ray_side_by_side.py: a Ray Serve replica whose `reconfigure`
is what a Ray user writes today, loading the new weights in place while it holds the
replica's event loop (ray-project/ray#54509: requests wait until it returns).

Copied into the export's working_dir as `blocking.py` next to `hotreload_ray_app.py`; the
same model, request parsing and first build as the hotreload replica, only the update
differs: no second version beside the serving one, no warm-up, no smoke test.
"""

from __future__ import annotations

from typing import Any

from hotreload_ray_app import HotreloadModel
from ray import serve
from safetensors.torch import load_file

Base: Any = HotreloadModel.func_or_class


class BlockingReconfigure(Base):  # type: ignore[misc]
    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        files, digest, version = self._wanted(user_config)
        if self.serving is None:
            self.serving = self._build(files, digest, version)
            return
        state: dict[str, Any] = {}
        for f in files:
            state.update(load_file(str(self._path(f))))
        # In place, on the event loop: every request of this replica waits meanwhile.
        self.serving.model.load_state_dict(state)
        self.serving.digest, self.serving.version = digest, version


def app(args: dict[str, str]) -> Any:
    return serve.deployment(BlockingReconfigure).options(name=args["model"]).bind(args["model"])
