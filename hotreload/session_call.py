"""Shared by `hotreload status` and `hotreload reload`: call a running session and turn
every client-side error into a message and a documented exit code."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

from hotreload.client import Client
from hotreload.errors import BadRequestError, ClientError, ConfigError, NoServerError
from hotreload.exitcodes import EXIT_ENVIRONMENT, EXIT_FAILURE, EXIT_USAGE

T = TypeVar("T")


def call_session(
    config: str | None, call: Callable[[Client], T], *, timeout_s: float | None
) -> tuple[T | None, int | None]:
    """(result, None) on success, else (None, exit code) after printing why."""
    problem: tuple[str, int]
    try:
        return call(Client(config, timeout_s=timeout_s)), None
    except ConfigError as exc:
        problem = (f"config error: {exc}", EXIT_USAGE)
    except NoServerError as exc:
        problem = (str(exc), EXIT_ENVIRONMENT)
    except BadRequestError as exc:
        problem = (str(exc), EXIT_USAGE)
    except ClientError as exc:
        problem = (str(exc), EXIT_FAILURE)
    except TimeoutError:
        problem = (f"the session did not answer within {timeout_s:g} s", EXIT_FAILURE)
    print(f"hotreload: {problem[0]}", file=sys.stderr)
    return None, problem[1]
