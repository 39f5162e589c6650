"""`hotreload xid` and `hotreload doctor` (until the GPU layer lands)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the GPU layer's subcommands to the main parser."""
