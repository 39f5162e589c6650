"""Named exit codes shared by every command (docs/troubleshooting.md), and `exit_code_for`,
the one mapping from the error that ended a command to its code."""

from __future__ import annotations

import sys
from pathlib import Path

from hotreload.errors import (
    BadRequestError,
    ClientError,
    ConfigError,
    HotreloadError,
    NoServerError,
)

EXIT_OK = 0
#: A check failed, a reload failed, or the command could not do what was asked.
EXIT_FAILURE = 1
#: The config file or the command line is wrong.
EXIT_USAGE = 2
#: The environment cannot run the command (no session running, missing library, ...).
EXIT_ENVIRONMENT = 3
#: Interrupted by SIGINT before finishing.
EXIT_INTERRUPTED = 130

#: Bring-up phases whose failure is the environment's doing, not the model's: a worker
#: process that could not start (no such device, no CUDA build), as `hotreload check` says.
ENVIRONMENT_PHASES = frozenset({"start"})


def exit_code_for(exc: BaseException) -> int:
    """The exit code of a command that ended with `exc`; every command maps errors here.

    - Ctrl-C: EXIT_INTERRUPTED.
    - A wrong config or command line (ConfigError), or a request the session refused as
      malformed (BadRequestError: an unknown model name): EXIT_USAGE.
    - No session on the socket (NoServerError): EXIT_ENVIRONMENT.
    - The session answered with an error, or did not answer in time: EXIT_FAILURE.
    - A model that could not come up (the engine's PhaseFailed, which names its `phase`):
      EXIT_ENVIRONMENT when its worker process could not start, else EXIT_FAILURE.
    - Any other HotreloadError (the socket is another session's, a lock or state folder is
      not ours): EXIT_ENVIRONMENT. Anything else: EXIT_FAILURE.
    """
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, (ConfigError, BadRequestError)):
        return EXIT_USAGE
    if isinstance(exc, NoServerError):
        return EXIT_ENVIRONMENT
    if isinstance(exc, (ClientError, TimeoutError)):
        return EXIT_FAILURE
    if isinstance(exc, HotreloadError):
        return EXIT_ENVIRONMENT
    # Duck-typed: the engine's PhaseFailed lives above this module's layer.
    phase = getattr(exc, "phase", None)
    if isinstance(phase, str):
        return EXIT_ENVIRONMENT if phase in ENVIRONMENT_PHASES else EXIT_FAILURE
    return EXIT_FAILURE


def error_exit(prog: str, exc: HotreloadError, config_path: Path | None = None) -> int:
    """Print the line that says why `prog` ends with `exc` (on stderr); its exit code.

    A config error names its file, or else `config_path`: a check made against this machine
    at start (`cpus`) has no file of its own to name.
    """
    if isinstance(exc, ConfigError):
        where = f"{config_path}: " if config_path is not None and not exc.path else ""
        message = f"config error: {where}{exc}"
    else:
        message = str(exc)
    print(f"{prog}: {message}", file=sys.stderr)
    return exit_code_for(exc)
