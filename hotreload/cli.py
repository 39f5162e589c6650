"""The `hotreload` command line: parses arguments and calls plain functions returning exit codes.

Commands import their implementation lazily so that, for example, `hotreload check` never
imports textual and `hotreload xid` never imports the engine.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hotreload.errors import HotreloadError
from hotreload.exitcodes import EXIT_USAGE, error_exit


def _add_config_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="hotreload.toml or pyproject.toml to read (default: look in the current directory)",
    )


def _add_http_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="also serve the KServe v2 HTTP API and /metrics (e.g. 127.0.0.1:8000, :8000)",
    )
    parser.add_argument(
        "--metrics-port", type=int, metavar="PORT", help="serve /metrics alone on this port too"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hotreload",
        description="Serve PyTorch models in worker processes and reload them safely on edit.",
    )
    from hotreload import __version__

    parser.add_argument("--version", action="version", version=f"hotreload {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "init",
        help="write a commented starter hotreload.toml",
        description="Write a starter hotreload.toml, every key commented, for one model "
        "(entry, example, weights, device). Typical use: `hotreload init` in your project "
        "folder, edit the entry and example, then `hotreload check`.",
    )
    p.add_argument("path", nargs="?", default="hotreload.toml", help="where to write it")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=_cmd_init)

    p = sub.add_parser(
        "serve",
        help="serve the configured models until SIGINT/SIGTERM",
        description="Serve the config's models on the session's socket (and HTTP with "
        "--http) without watching files: it reloads only when asked (`hotreload reload`). "
        "Ctrl-C or SIGTERM drains the requests and stops. Typical use: "
        "`hotreload serve --http :8000` on a server.",
    )
    _add_config_arg(p)
    _add_http_args(p)
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser(
        "watch",
        help="serve the models and reload them when their files change",
        description="Serve the config's models and reload a model each time its code or "
        "weights change on disk, with the live dashboard (--no-tui: one line per event). "
        "A reload that fails leaves the old version serving. Typical use: `hotreload watch` "
        "while you edit model.py.",
    )
    _add_config_arg(p)
    p.add_argument(
        "--no-tui", action="store_true", help="print one line per event instead of the dashboard"
    )
    _add_http_args(p)
    p.set_defaults(func=_cmd_watch)

    p = sub.add_parser(
        "dashboard",
        help="open the dashboard on a `hotreload watch --no-tui` session running elsewhere",
        description="Attach the live dashboard to a running `hotreload watch` session (for "
        "example one started with --no-tui in another terminal). q detaches; the session "
        "keeps serving. Typical use: `hotreload watch --no-tui` in one terminal, "
        "`hotreload dashboard` in another.",
    )
    _add_config_arg(p)
    p.add_argument(
        "--socket", metavar="PATH", help="the session's socket (default: from the config)"
    )
    # Set by `hotreload watch` for the dashboard it starts: q then stops the session.
    p.add_argument("--owner", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_dashboard)

    p = sub.add_parser(
        "check",
        help="pre-commit smoke check: load, warm, infer, reload; fail on errors, leaks, Xids",
        description="Load and warm each model, answer a request shaped like its example, "
        "reload it N times and watch memory and Xids; say what failed and where to look. "
        "Typical use: `hotreload check` before a commit, or as a pre-commit hook. Exit "
        "codes: 0 all passed; 1 a check failed; 2 the config or the command line is wrong; "
        "3 the environment cannot run the check.",
    )
    _add_config_arg(p)
    p.add_argument("--model", metavar="NAME", help="check only this model")
    p.add_argument(
        "--reloads", type=int, metavar="N", help="reload cycles (default: [check] reloads, 3)"
    )
    p.add_argument(
        "--p99-ms", type=float, metavar="MS", help="fail when p99 over a burst exceeds MS"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument(
        "--openai",
        action="store_true",
        help="instead: run the OpenAI-compatible clients (openai-python, Open WebUI's model "
        "list, lm-eval) against each generator and say which would break and why",
    )
    p.add_argument(
        "--clients",
        metavar="LIST",
        help="with --openai: run only these clients, comma-separated, among completion, chat, "
        "chat-stream, models, lm-eval-completions, lm-eval-chat (default: all)",
    )
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser(
        "status",
        help="show the models of a running session",
        description="Ask the running session (watch or serve) for each model's state, "
        "version, device, memory and latency. Typical use: `hotreload status` from another "
        "terminal, or `hotreload status mlp --json` in a script.",
    )
    p.add_argument("model", nargs="?", help="show only this model (default: every model)")
    _add_config_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser(
        "diff",
        help="compare two kept versions' golden outputs",
        description="Compare two versions of a model on its golden inputs (the example and "
        "the config's `golden`): the largest absolute and relative difference and top-1 "
        "flips per output, a generator's first differing token. Each version's golden "
        "outputs are kept in the session's state folder as it is built (the last 8 "
        "versions of the session), so nothing runs again. Typical use: `hotreload diff "
        "mlp` (the serving version and the one before), `hotreload diff mlp 3 5 --json`.",
    )
    p.add_argument("model", help="the model's name")
    p.add_argument("a", nargs="?", type=int, help="the older version (default: the one before B)")
    p.add_argument("b", nargs="?", type=int, help="the newer version (default: the serving one)")
    _add_config_arg(p)
    p.add_argument(
        "--json", action="store_true", help="print one JSON document (from, to, identical, ...)"
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="the largest absolute difference still the same (default: the model's "
        "`tolerance` in the config, as the expect = \"same\" gate uses; 0: bit-equal)",
    )
    p.set_defaults(func=_cmd_diff)

    p = sub.add_parser(
        "reload",
        help="ask the running session to reload a model and wait",
        description="Ask the running session to reload a model (default: every model), wait "
        "and print the outcome; exit 0 when it served, 1 when it failed (the old version "
        "keeps serving), 3 when no session runs. Typical use: an editor key binding running "
        "`hotreload reload mlp`.",
    )
    p.add_argument("model", nargs="?", help="model name (default: every model)")
    _add_config_arg(p)
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.add_argument(
        "--force", action="store_true", help="build even when nothing changed since the last build"
    )
    p.set_defaults(func=_cmd_reload)

    p = sub.add_parser(
        "rollback",
        help="serve a kept earlier version of a model again",
        description="Serve an earlier version of a model again, under a new version number, "
        "through the same load, warm, smoke and swap as a reload. The session keeps the "
        "last `keep_versions` good versions (default 3): code, weights and pushed weights. "
        "Exit 0 when it serves, 1 when it failed or is not kept (the serving version keeps "
        "serving), 3 when no session runs. Typical use: `hotreload rollback mlp` (the "
        "version before the serving one), `hotreload rollback mlp 2`.",
    )
    p.add_argument("model", nargs="?", help="model name (default: the only model)")
    p.add_argument(
        "version", nargs="?", type=int, help="the kept version (default: the one before)"
    )
    _add_config_arg(p)
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=_cmd_rollback)

    p = sub.add_parser(
        "save",
        help="write the weights a model serves now (pushed ones included) to a folder",
        description="Write the weights a model serves now, pushed ones included, into a "
        "folder: model.safetensors under the model's own names (a Hugging Face model: its "
        "save_pretrained folder, which from_pretrained loads), and hotreload.json with the "
        "version and weights digest. Exit 0 when saved, 1 when not, 3 when no session runs. "
        "Typical use: `hotreload save mlp checkpoints/best`.",
    )
    p.add_argument("model", help="the model's name")
    p.add_argument("folder", help="where to write (created if missing)")
    _add_config_arg(p)
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.add_argument(
        "--force",
        action="store_true",
        help="write into a folder that has files in it (those of the same names are overwritten)",
    )
    p.set_defaults(func=_cmd_save)

    p = sub.add_parser(
        "report",
        help="draw the session's reloads, latency, queue, memory and Xids as one HTML page",
        description="Read .hotreload/events.jsonl and stats.jsonl (written by watch and "
        "serve) and write one self-contained HTML page, a section per session. Typical use: "
        "`hotreload report` after a session, then open .hotreload/report.html.",
    )
    _add_config_arg(p)
    p.add_argument(
        "--html", metavar="OUT", help="where to write it (default: .hotreload/report.html)"
    )
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser(
        "export",
        help="write the models for Triton Inference Server or Ray Serve",
        description="Export the config's models for another server. `hotreload export "
        "triton OUT_DIR` writes OUT_DIR/<model>/config.pbtxt and 1/model.py (python backend) "
        "with the code and weights copied in; start it with `tritonserver --model-repository "
        "OUT_DIR`.",
    )
    targets = p.add_subparsers(dest="target", metavar="TARGET", required=True)
    t = targets.add_parser(
        "triton",
        help="a Triton model repository (python backend)",
        description="Write OUT_DIR/<model>/config.pbtxt and 1/model.py (python backend) with "
        "the code and weights copied in. Typical use: `hotreload export triton models/`, then "
        "`tritonserver --model-repository models/`.",
    )
    t.add_argument("out_dir", metavar="OUT_DIR", help="the model repository folder to write")
    _add_config_arg(t)
    t.add_argument("--model", metavar="NAME", help="export only this model")
    t.set_defaults(func=_cmd_export_triton)
    r = targets.add_parser(
        "ray",
        help="a Ray Serve config (serve_config.yaml) for `serve run` / `serve deploy`",
        description="Write OUT_DIR/serve_config.yaml and the applications' working_dir zip "
        "(code, weights, replica). With --model NAME --weights FILE: name new weights in "
        "NAME's user_config, applied by `serve deploy` without restarting a replica. "
        "Typical use: `hotreload export ray out`, then `serve deploy out/serve_config.yaml`.",
    )
    r.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write")
    _add_config_arg(r)
    r.add_argument("--model", metavar="NAME", help="export (or update) only this model")
    r.add_argument(
        "--weights", metavar="FILE", nargs="+", help="new weights for --model (an update)"
    )
    r.add_argument(
        "--uri-prefix",
        metavar="URI",
        help="where you will upload the zip (s3://bucket/dir) for nodes without OUT_DIR; "
        "default: a file:// URI of OUT_DIR",
    )
    r.set_defaults(func=_cmd_export_ray)

    from hotreload.commands import gpu_tools as gpu_cli

    gpu_cli.register(sub)

    p = sub.add_parser(
        "completion",
        help="print a bash or zsh completion script",
        description="bash: `source <(hotreload completion bash)` (e.g. in ~/.bashrc). "
        "zsh: `hotreload completion zsh > ~/.zfunc/_hotreload` with ~/.zfunc on $fpath, "
        "or `source <(hotreload completion zsh)` after compinit.",
    )
    p.add_argument("shell", nargs="?", choices=["bash", "zsh"], help="the shell to complete in")
    # What the scripts call at each TAB for a model name: the config's names, one a line.
    p.add_argument("--model-names", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.set_defaults(func=lambda args: _cmd_completion(parser, args))
    return parser


def _cmd_completion(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from hotreload.commands.completion import completion_main, model_names

    if args.model_names:
        print("\n".join(model_names(args.config)))
        return 0
    if args.shell is None:
        print(
            "hotreload completion: name the shell: `hotreload completion bash` or `zsh`",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return completion_main(parser, args.shell)


def _cmd_init(args: argparse.Namespace) -> int:
    from hotreload.commands.init import write_starter_config

    return write_starter_config(args.path, force=args.force)


def _cmd_serve(args: argparse.Namespace) -> int:
    from hotreload.commands.serve import serve_main

    return serve_main(args.config, http=args.http, metrics_port=args.metrics_port)


def _cmd_check(args: argparse.Namespace) -> int:
    from hotreload.commands.check import check_main

    return check_main(
        args.config,
        model=args.model,
        reloads=args.reloads,
        as_json=args.json,
        p99_ms=args.p99_ms,
        openai=args.openai,
        clients=args.clients,
    )


def _cmd_watch(args: argparse.Namespace) -> int:
    from hotreload.commands.watch import watch_main

    return watch_main(
        args.config, no_tui=args.no_tui, http=args.http, metrics_port=args.metrics_port
    )


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from hotreload.commands.dashboard import dashboard_main

    return dashboard_main(args.config, args.socket, owner=args.owner)


def _cmd_report(args: argparse.Namespace) -> int:
    from hotreload.commands.report import report_main

    return report_main(args.config, args.html)


def _cmd_export_ray(args: argparse.Namespace) -> int:
    from hotreload.commands.export import export_ray_main

    return export_ray_main(args.out_dir, args.config, args.model, args.weights, args.uri_prefix)


def _cmd_export_triton(args: argparse.Namespace) -> int:
    from hotreload.commands.export import export_triton_main

    return export_triton_main(args.out_dir, args.config, args.model)


def _cmd_diff(args: argparse.Namespace) -> int:
    from hotreload.commands.diff import diff_main

    return diff_main(
        args.config, args.model, args.a, args.b, as_json=args.json, tolerance=args.tolerance
    )


def _cmd_status(args: argparse.Namespace) -> int:
    from hotreload.commands.status import status_main

    return status_main(args.config, as_json=args.json, model=args.model)


def _cmd_reload(args: argparse.Namespace) -> int:
    from hotreload.commands.reload import reload_main

    return reload_main(args.config, args.model, as_json=args.json, force=args.force)


def _cmd_rollback(args: argparse.Namespace) -> int:
    from hotreload.commands.rollback import rollback_main

    return rollback_main(args.config, args.model, args.version, as_json=args.json)


def _cmd_save(args: argparse.Namespace) -> int:
    from hotreload.commands.save import save_main

    return save_main(args.config, args.model, args.folder, as_json=args.json, force=args.force)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except HotreloadError as exc:
        # A command maps the errors it expects itself; one that escapes still ends in its
        # message and its documented code, not a traceback.
        return error_exit("hotreload", exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
