"""A small MLP for hotreload's example: edit it while `hotreload watch` runs.

Try: change SCALE, or ACTIVATION, save, and watch the version go up in the dashboard; its
golden panel says how far the answers moved (a pure refactor: "outputs identical").
"""

import torch
from torch import nn

IN_FEATURES = 64
HIDDEN = 512
OUT_FEATURES = 10
#: The shared block runs DEPTH times: a few ms per forward on a CPU with small weights.
DEPTH = 12
#: Multiplies the output; an easy edit whose effect shows in every reply.
SCALE = 1.0


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(IN_FEATURES, HIDDEN)
        self.block = nn.Linear(HIDDEN, HIDDEN)
        self.out = nn.Linear(HIDDEN, OUT_FEATURES)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.inp(x))
        for _ in range(DEPTH):
            # Residual and scaled so repeated application stays finite.
            h = h + 0.1 * self.act(self.block(h))
        return self.out(h) * SCALE


def build() -> nn.Module:
    """The factory hotreload calls; weights are loaded afterwards from weights.safetensors."""
    return MLP()


def example_input() -> torch.Tensor:
    """Used for warm-up and the smoke test; clients send the same shape (batch may vary)."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, IN_FEATURES, generator=g)


def golden() -> list[torch.Tensor]:
    """Inputs every new version answers before it serves, beside the example: compared with
    the version it replaces (`golden` in hotreload.toml; `hotreload diff mlp`)."""
    g = torch.Generator().manual_seed(1)
    return [torch.randn(4, IN_FEATURES, generator=g)]
