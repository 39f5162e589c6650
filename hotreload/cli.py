"""The `hotreload` command line: parses arguments and calls plain functions returning exit codes.

Commands import their implementation lazily so that, for example, `hotreload check` never
imports textual and `hotreload xid` never imports the engine.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hotreload.exitcodes import EXIT_USAGE


def _add_config_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="hotreload.toml or pyproject.toml to read (default: look in the current directory)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hotreload",
        description="Serve PyTorch models in worker processes and reload them safely on edit.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("init", help="write a commented starter hotreload.toml")
    p.add_argument("path", nargs="?", default="hotreload.toml", help="where to write it")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=_cmd_init)

    p = sub.add_parser("serve", help="serve the configured models until SIGINT/SIGTERM")
    _add_config_arg(p)
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("watch", help="serve the models and reload them when their files change")
    _add_config_arg(p)
    p.add_argument(
        "--no-tui", action="store_true", help="print one line per event instead of the dashboard"
    )
    p.set_defaults(func=_cmd_watch)

    p = sub.add_parser("status", help="show the models of a running session")
    _add_config_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("reload", help="ask the running session to reload a model and wait")
    p.add_argument("model", nargs="?", help="model name (default: every model)")
    _add_config_arg(p)
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=_cmd_reload)

    from hotreload.gpu import cli as gpu_cli

    gpu_cli.register(sub)
    return parser


def _cmd_init(args: argparse.Namespace) -> int:
    from hotreload.config_template import write_starter_config

    return write_starter_config(args.path, force=args.force)


def _cmd_serve(args: argparse.Namespace) -> int:
    from hotreload.engine.serve import serve_main

    return serve_main(args.config)


def _cmd_watch(args: argparse.Namespace) -> int:
    from hotreload.engine.watch import watch_main

    return watch_main(args.config, no_tui=args.no_tui)


def _cmd_status(args: argparse.Namespace) -> int:
    from hotreload.status_cmd import status_main

    return status_main(args.config, as_json=args.json)


def _cmd_reload(args: argparse.Namespace) -> int:
    from hotreload.reload_cmd import reload_main

    return reload_main(args.config, args.model, as_json=args.json)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
