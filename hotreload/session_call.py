"""Shared by `hotreload status` and `hotreload reload`: call a running session and turn
every client-side error into a message and a documented exit code."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

from hotreload.client import Client
from hotreload.errors import ClientError, ConfigError
from hotreload.exitcodes import error_exit, exit_code_for

T = TypeVar("T")


def call_session(
    config: str | None, call: Callable[[Client], T], *, timeout_s: float | None
) -> tuple[T | None, int | None]:
    """(result, None) on success, else (None, exit code) after printing why."""
    try:
        return call(Client(config, timeout_s=timeout_s)), None
    except (ConfigError, ClientError) as exc:
        return None, error_exit("hotreload", exc)
    except TimeoutError as exc:
        print(f"hotreload: the session did not answer within {timeout_s:g} s", file=sys.stderr)
        return None, exit_code_for(exc)
