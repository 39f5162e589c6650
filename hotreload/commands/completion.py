"""`hotreload completion bash|zsh`: shell completion scripts generated from the argparse
parser itself, so a new command or option completes without anyone editing a script.

No dependency: it reads the parser's actions (argparse keeps them in `_actions`, stable
since Python 3.2) and writes plain shell. Options that take a path complete file names.
Arguments that take a model name (`reload MODEL`, `status MODEL`, `--model NAME`) complete
the names the config declares: the script asks `hotreload completion --model-names`, which
reads the hotreload.toml of the current folder (or the `--config` already typed) at each
TAB, so a model added a minute ago completes too.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

#: Options whose value is a file or folder: the shell completes file names after them.
_PATH_METAVARS = frozenset({"PATH", "FILE|-", "DIR", "OUT"})


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The visible options of `parser` (hidden ones, `help=SUPPRESS`, stay hidden)."""
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]


def _takes_path(action: argparse.Action) -> bool:
    return action.nargs != 0 and str(action.metavar) in _PATH_METAVARS


def _takes_model(action: argparse.Action) -> bool:
    """An argument whose value is one of the config's model names."""
    return action.dest == "model" and action.nargs != 0


def model_names(config: str | None = None, cwd: Path | None = None) -> list[str]:
    """The model names of the config a command here would read; [] when there is none or it
    does not parse. Never raises and never prints: it runs on every TAB."""
    here = cwd or Path.cwd()
    candidates: list[Path]
    if config:
        path = Path(config).expanduser()
        path = path if path.is_absolute() else here / path
        candidates = [path / "hotreload.toml", path / "pyproject.toml"] if path.is_dir() else [path]
    else:
        candidates = [here / "hotreload.toml", here / "pyproject.toml"]
    for path in candidates:
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        if path.name == "pyproject.toml":
            tool = raw.get("tool")
            raw = tool.get("hotreload", {}) if isinstance(tool, dict) else {}
        models = raw.get("models") if isinstance(raw, dict) else None
        if not isinstance(models, list):
            continue
        return [
            m["name"]
            for m in models
            if isinstance(m, dict) and isinstance(m.get("name"), str) and m["name"].strip()
        ]
    return []


def _choices(action: argparse.Action) -> list[str]:
    return [str(c) for c in action.choices] if action.choices else []


def _flattened(sub: argparse.ArgumentParser) -> tuple[list[argparse.Action], list[str]]:
    """`sub`'s actions with those of its own subcommands (`export triton|ray`), and those
    subcommands' names: one level of nesting completes without a case of its own."""
    nested = _subcommands(sub)
    actions = [a for a in sub._actions if not isinstance(a, argparse._SubParsersAction)]
    for child in nested.values():
        actions += [a for a in child._actions if a.option_strings and a not in actions]
    seen: set[str] = set()
    unique = []
    for a in actions:
        key = ",".join(a.option_strings) or a.dest
        if key not in seen:
            seen.add(key)
            unique.append(a)
    return unique, list(nested)


def _visible(actions: list[argparse.Action]) -> list[argparse.Action]:
    return [a for a in actions if a.option_strings and a.help != argparse.SUPPRESS]


def bash_script(parser: argparse.ArgumentParser) -> str:
    """A bash completion script: `source <(hotreload completion bash)`."""
    prog = parser.prog
    subs = _subcommands(parser)
    top = [o for a in _options(parser) for o in a.option_strings]
    models_func = f"_{prog}_models"
    cases = []
    for name, sub in subs.items():
        actions, nested = _flattened(sub)
        shown = _visible(actions)
        opts = [o for a in shown for o in a.option_strings]
        paths = sorted({o for a in shown if _takes_path(a) for o in a.option_strings})
        models = sorted({o for a in shown if _takes_model(a) for o in a.option_strings})
        choice_cases = "".join(
            f"        {'|'.join(a.option_strings)}) COMPREPLY=($(compgen -W "
            f"'{' '.join(_choices(a))}' -- \"$cur\")); return;;\n"
            for a in actions
            if a.option_strings and _choices(a)
        )
        positional = [a for a in actions if not a.option_strings and _choices(a)]
        words = " ".join(opts + nested + [c for a in positional for c in _choices(a)])
        path_case = (
            f'        {"|".join(paths)}) COMPREPLY=($(compgen -f -- "$cur")); return;;\n'
            if paths
            else ""
        )
        model_case = f"        {'|'.join(models)}) {models_func}; return;;\n" if models else ""
        # A positional model name: offered until the user types a dash for an option.
        model_positional = (
            f'      if [[ "$cur" != -* ]]; then {models_func}; return; fi\n'
            if any(_takes_model(a) for a in actions if not a.option_strings)
            else ""
        )
        cases.append(
            f"    {name})\n"
            f'      case "$prev" in\n{path_case}{model_case}{choice_cases}      esac\n'
            f"{model_positional}"
            f"      COMPREPLY=($(compgen -W '{words}' -- \"$cur\"));;\n"
        )
    func = f"_{prog}_complete"
    return (
        f"# bash completion for {prog}, generated by `{prog} completion bash`\n"
        f"# Model names come from the config at each TAB: the one --config names, else the\n"
        f"# hotreload.toml (or pyproject.toml) of the current folder.\n"
        f"{models_func}() {{\n"
        "  local i cfg=()\n"
        "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
        '    if [ "${COMP_WORDS[i]}" = --config ]; then\n'
        '      if [ "${COMP_WORDS[i+1]}" = = ]; then cfg=(--config "${COMP_WORDS[i+2]}")\n'
        '      else cfg=(--config "${COMP_WORDS[i+1]}"); fi\n'
        "    fi\n"
        "  done\n"
        '  COMPREPLY=($(compgen -W "$("${COMP_WORDS[0]}" completion --model-names "${cfg[@]}" '
        '2>/dev/null)" -- "$cur"))\n'
        "}\n"
        f"{func}() {{\n"
        '  local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"\n'
        '  local cmd="" i\n'
        "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
        '    case "${COMP_WORDS[i]}" in -*) ;; *) cmd="${COMP_WORDS[i]}"; break;; esac\n'
        "  done\n"
        '  if [ -z "$cmd" ]; then\n'
        f"    COMPREPLY=($(compgen -W '{' '.join([*subs, *top])}' -- \"$cur\")); return\n"
        "  fi\n"
        '  case "$cmd" in\n' + "".join(cases) + "  esac\n"
        "}\n"
        f"complete -o default -F {func} {prog}\n"
    )


def _zsh_quote(text: str) -> str:
    return text.replace("'", "'\\''").replace("[", "\\[").replace("]", "\\]").replace(":", "\\:")


def _zsh_spec(action: argparse.Action, models_func: str) -> str:
    """One `_arguments` spec: `(-a --all)'{-a,--all}'[help]:value:_files'`."""
    help_text = _zsh_quote(str(action.help or "").split("(")[0].strip())
    names = action.option_strings
    value = ""
    if action.nargs != 0:
        if _takes_model(action):
            value = f":{action.dest}:{models_func}"
        elif _choices(action):
            value = f":{action.dest}:({' '.join(_choices(action))})"
        else:
            value = f":{action.dest}:{'_files' if _takes_path(action) else ' '}"
    if len(names) == 1:
        return f"'{names[0]}[{help_text}]{value}'"
    exclusive = " ".join(names)
    return f"'({exclusive})'{{{','.join(names)}}}'[{help_text}]{value}'"


def zsh_script(parser: argparse.ArgumentParser) -> str:
    """A zsh completion script: save as `_hotreload` on `$fpath`, or `source <(...)`."""
    prog = parser.prog
    subs = _subcommands(parser)
    described = "\n".join(
        f"    '{name}:{_zsh_quote(str(_help_of(parser, name)))}'" for name in subs
    )
    models_func = f"_{prog}_models"
    cases = []
    for name, sub in subs.items():
        actions, nested = _flattened(sub)
        specs = [_zsh_spec(a, models_func) for a in _visible(actions)]
        positional = [a for a in actions if not a.option_strings and _choices(a)]
        specs += [f"'1:{a.dest}:({' '.join(_choices(a))})'" for a in positional]
        if nested:
            specs.append(f"'1:command:({' '.join(nested)})'")
        if any(_takes_model(a) for a in actions if not a.option_strings):
            specs.append(f"'1::model:{models_func}'")
        body = " \\\n        ".join(specs)
        cases.append(f"    {name})\n      _arguments \\\n        {body};;\n")
    return (
        f"#compdef {prog}\n"
        f"# zsh completion for {prog}, generated by `{prog} completion zsh`\n"
        f"# Model names come from the config at each TAB: the one --config names, else the\n"
        f"# hotreload.toml (or pyproject.toml) of the current folder.\n"
        f"{models_func}() {{\n"
        "  local -a cfg names\n"
        "  local i=${words[(I)--config]}\n"
        '  (( i )) && cfg=(--config "${words[i+1]}")\n'
        f'  names=(${{(f)"$($_{prog}_prog completion --model-names $cfg 2>/dev/null)"}})\n'
        "  compadd -a names\n"
        "}\n"
        f"_{prog}() {{\n"
        f"  local _{prog}_prog=${{words[1]}}\n"
        "  local -a commands\n"
        f"  commands=(\n{described}\n  )\n"
        "  if (( CURRENT == 2 )); then\n"
        f"    _describe -t commands '{prog} command' commands; return\n"
        "  fi\n"
        "  local cmd=${words[2]}\n"
        "  shift words; (( CURRENT-- ))\n"
        "  case $cmd in\n" + "".join(cases) + "  esac\n"
        "}\n"
        f'if [ "$funcstack[1]" = "_{prog}" ]; then _{prog} "$@"; '
        f"else compdef _{prog} {prog}; fi\n"
    )


def _help_of(parser: argparse.ArgumentParser, name: str) -> str:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.dest == name:
                    return str(choice.help or "")
    return ""


def completion_main(parser: argparse.ArgumentParser, shell: str) -> int:
    print(bash_script(parser) if shell == "bash" else zsh_script(parser), end="")
    return 0
