"""Every flag that README.md, docs/*.md, benchmarks/README.md and the
benchmark subcommands' --help examples pass to a command exists in that
command's --help.

A command line is found in fenced code blocks (backslash continuations
joined) and in inline code spans: `kt-<name> ...`, its script form
`python training/<name>.py ...`, `bash scripts/demo.sh ...` (kt-demo's
flags), `bash scripts/multi30k.sh ...` (extra kt-train flags) and
`python -m benchmarks <subcommand> ...`. Its flags are the `--words` after
the command, up to a shell separator (| ; & > < or a # comment). The
parsers are built in this process: the kt-* commands' `build_parser()`, and
the benchmarks' parsers caught when their `main` parses."""

import argparse
import glob
import importlib
import os
import re
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = ["README.md", *sorted(glob.glob(os.path.join("docs", "*.md"))),
             os.path.join("benchmarks", "README.md")]

COMMANDS = {  # kt-<name> -> module under keras_transformer.cli
    "train": "train", "evaluate": "evaluate", "translate": "translate", "export": "export",
    "average": "average", "visualize": "visualize", "demo": "demo", "serve": "serve",
}
SCRIPTS = {  # training/<name>.py -> kt-<name>
    "train": "train", "evaluate": "evaluate", "translate": "translate", "export": "export",
    "average_checkpoints": "average", "visualize": "visualize", "demo": "demo",
    "serve": "serve",
}
SHELL_SCRIPTS = {"demo": "demo", "multi30k": "train"}  # scripts/<name>.sh -> kt-<name>

_COMMAND = re.compile(
    r"(?<![\w/.-])(?:kt-(?P<kt>[a-z]+)(?![\w.-])"
    r"|python3? +training/(?P<script>\w+)\.py"
    r"|bash +scripts/(?P<shell>demo|multi30k)\.sh"
    r"|python3? +-m +benchmarks +(?P<bench>[a-z][\w-]*))")
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_SEPARATOR = re.compile(r"\||;|&|>|<|(?:^|\s)#")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_INLINE = re.compile(r"`([^`]+)`")


def command_lines(text):
    """`(command, flags)` for each command line in Markdown `text`, where
    `command` is `("kt", name)` or `("benchmarks", subcommand)`."""
    snippets = []
    for block in _FENCE.findall(text):
        body = block.split("\n", 1)[1].rsplit("```", 1)[0]
        snippets += re.sub(r"\\\n", " ", body).splitlines()
    prose = _FENCE.sub("", text)
    for paragraph in re.split(r"\n\s*\n", prose):
        snippets += [" ".join(span.split()) for span in _INLINE.findall(paragraph)]
    found = []
    for snippet in snippets:
        matches = list(_COMMAND.finditer(snippet))
        for i, match in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(snippet)
            rest = snippet[match.end():end]
            stop = _SEPARATOR.search(rest)
            rest = rest[:stop.start()] if stop else rest
            if match.group("kt"):
                command = ("kt", match.group("kt"))
            elif match.group("script"):
                command = ("kt", SCRIPTS.get(match.group("script"), match.group("script")))
            elif match.group("shell"):
                command = ("kt", SHELL_SCRIPTS[match.group("shell")])
            else:
                command = ("benchmarks", match.group("bench"))
            found.append((command, _FLAG.findall(rest)))
    return found


def kt_flags(name):
    module = importlib.import_module(f"keras_transformer.cli.{COMMANDS[name]}")
    return option_strings(module.build_parser())


def option_strings(parser):
    """The options of `parser` and of its subcommands' parsers, if any."""
    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                found |= option_strings(subparser)
    return found


class _Parsed(Exception):
    def __init__(self, parser):
        self.parser = parser


def benchmark_flags(subcommand, monkeypatch):
    """The options of `python -m benchmarks <subcommand>`: its module's
    `main` runs until it parses its arguments, where the parser is caught."""
    from benchmarks.__main__ import SUBCOMMANDS

    module = importlib.import_module(f"benchmarks.{SUBCOMMANDS[subcommand][0]}")

    def catch(parser, *args, **kwargs):
        raise _Parsed(parser)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", catch)
        patch.setattr(argparse.ArgumentParser, "parse_known_args", catch)
        try:
            module.main([])
        except _Parsed as parsed:
            return option_strings(parsed.parser)
    raise AssertionError(f"benchmarks.{module.__name__}.main returned without parsing")


def test_the_scanner_finds_commands_and_their_flags():
    text = """Run `kt-train --run-dir r --data builtin` or, with options,
`KT_VERBOSE=1 kt-demo --seed 2 [--precision
mixed_bfloat16]`; `kt-average` alone. See kt-train in prose (no flags read).

```bash
echo "x" | kt-translate --saved-model m --input - > out  # --not-a-flag
python training/average_checkpoints.py --run-dir r \\
    --num 5
python -m benchmarks speed --what train --rounds 3
MINUTES=5 bash scripts/multi30k.sh --batch-tokens 4096
```
"""
    assert command_lines(text) == [
        (("kt", "translate"), ["--saved-model", "--input"]),
        (("kt", "average"), ["--run-dir", "--num"]),
        (("benchmarks", "speed"), ["--what", "--rounds"]),
        (("kt", "train"), ["--batch-tokens"]),
        (("kt", "train"), ["--run-dir", "--data"]),
        (("kt", "demo"), ["--seed", "--precision"]),
        (("kt", "average"), []),
    ]


def test_every_documented_flag_exists(monkeypatch):
    monkeypatch.chdir(ROOT)
    used = {}
    for path in DOCUMENTS:
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            for command, flags in command_lines(f.read()):
                used.setdefault(command, {}).setdefault(path, set()).update(flags)
    for path, doc in benchmark_docstrings():  # each subcommand's --help examples
        for command, flags in docstring_commands(doc):
            used.setdefault(command, {}).setdefault(path, set()).update(flags)
    problems = []
    for (kind, name), places in sorted(used.items()):
        if kind == "kt":
            if name not in COMMANDS:
                problems.append(f"kt-{name}: no such command ({', '.join(sorted(places))})")
                continue
            known = kt_flags(name)
        else:
            from benchmarks.__main__ import SUBCOMMANDS

            if name not in SUBCOMMANDS:
                problems.append(f"python -m benchmarks {name}: no such subcommand "
                                f"({', '.join(sorted(places))})")
                continue
            try:
                known = benchmark_flags(name, monkeypatch)
            except ImportError as e:  # e.g. jax, installed only in .venv-jax
                warnings.warn(f"python -m benchmarks {name}: flags not checked, cannot "
                              f"import it here ({e})")
                continue
        for path, flags in sorted(places.items()):
            for flag in sorted(flags - known):
                label = f"kt-{name}" if kind == "kt" else f"python -m benchmarks {name}"
                problems.append(f"{path}: {label} {flag} is not in its --help")
    assert not problems, "\n".join(problems)


def docstring_commands(doc):
    """`command_lines` of a module docstring's indented example lines, with
    their backslash continuations joined."""
    lines = [line for line in re.sub(r"\\\n", " ", doc).splitlines() if line.startswith("    ")]
    return command_lines("```\n" + "\n".join(lines) + "\n```")


def benchmark_docstrings():
    """`(path, docstring)` of each benchmark subcommand's module, whose
    docstring is its --help; a module that cannot be imported here is
    skipped with a warning."""
    from benchmarks.__main__ import SUBCOMMANDS

    for module_name, _ in SUBCOMMANDS.values():
        try:
            module = importlib.import_module(f"benchmarks.{module_name}")
        except ImportError as e:  # e.g. jax, installed only in .venv-jax
            warnings.warn(f"benchmarks.{module_name}: examples not checked ({e})", stacklevel=2)
            continue
        yield os.path.join("benchmarks", f"{module_name}.py"), module.__doc__ or ""


def test_benchmark_help_examples_keep_their_line_breaks():
    """A lone backslash at a line's end in a docstring joins that example
    line with the next, spaces and all, in --help (their flags are checked
    with the documents' above)."""
    problems = [f"{path}: a lost line break in {line!r}"
                for path, doc in benchmark_docstrings() for line in doc.splitlines()
                if "python -m benchmarks" in line and re.search(r"\S {3,}--", line)]
    assert not problems, "\n".join(problems)
