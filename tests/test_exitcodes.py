"""`exit_code_for`: the one mapping from the error that ended a command to its exit code."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotreload.engine.model import PhaseFailed
from hotreload.errors import (
    BadRequestError,
    ConfigError,
    HotreloadError,
    ModelError,
    NoServerError,
    ReloadFailedError,
    RequestTimeoutError,
)
from hotreload.exitcodes import (
    EXIT_ENVIRONMENT,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    error_exit,
    exit_code_for,
)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ConfigError("unknown key", path="hotreload.toml", key="models[0].warmup_iter"), 2),
        (BadRequestError("unknown model 'mpl'; this session serves: mlp"), EXIT_USAGE),
        (NoServerError("no session is running"), EXIT_ENVIRONMENT),
        (ReloadFailedError("smoke failed"), EXIT_FAILURE),
        (ModelError("the forward raised"), EXIT_FAILURE),
        (RequestTimeoutError("timed out"), EXIT_FAILURE),
        (TimeoutError(), EXIT_FAILURE),
        (HotreloadError("another session serves on this socket"), EXIT_ENVIRONMENT),
        (PhaseFailed("start", "the worker process could not start"), EXIT_ENVIRONMENT),
        (PhaseFailed("load", "the factory raised"), EXIT_FAILURE),
        (PhaseFailed("warm", "the warm-up pass raised"), EXIT_FAILURE),
        (KeyboardInterrupt(), EXIT_INTERRUPTED),
        (RuntimeError("a bug of ours"), EXIT_FAILURE),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_exit_code_for(exc: BaseException, code: int) -> None:
    assert exit_code_for(exc) == code


def test_the_cli_ends_an_escaped_error_in_its_message_and_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hotreload import cli
    from hotreload.commands import status as status_cmd

    def status_main(config: str | None, *, as_json: bool = False, model: str | None = None) -> int:
        raise HotreloadError("the state folder .hotreload is not yours")

    monkeypatch.setattr(status_cmd, "status_main", status_main)
    assert cli.main(["status"]) == EXIT_ENVIRONMENT
    assert "hotreload: the state folder .hotreload is not yours" in capsys.readouterr().err


def test_error_exit_says_why_and_names_the_config_a_machine_check_has_no_file_of(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "hotreload.toml"
    cpus = ConfigError("CPU 9 is not one this process may use", key="models[0].cpus")
    assert error_exit("hotreload check", cpus, config) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"hotreload check: config error: {config}: models[0].cpus: CPU 9 is not one this "
        "process may use\n"
    )
    own = ConfigError("unknown key", path="other.toml", key="watch.quiet")
    assert error_exit("hotreload", own, config) == EXIT_USAGE
    said = capsys.readouterr().err
    assert said == "hotreload: config error: other.toml: watch.quiet: unknown key\n"
    assert error_exit("hotreload", HotreloadError("the socket is in use")) == EXIT_ENVIRONMENT
    assert capsys.readouterr().err == "hotreload: the socket is in use\n"
