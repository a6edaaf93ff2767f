"""Every ``capc``, ``capcctl`` and ``make`` command the docs show parses as written.

Each fenced block of README.md and docs/**/*.md is read line by line; a line that
runs ``capc`` or ``capcctl`` (after a ``$`` prompt, environment assignments such as
``CAPC_URL=...`` and line continuations) is parsed by the real argparse parser, and a
``make`` line must name targets the Makefile has. Usage synopses are read as such:
``[...]`` marks optional words (checked as if given), ``a|b`` alternatives (the first
is checked), ``...`` repetition, and an upper-case word such as ``FILE.npy``, ``N`` or
``ID`` a placeholder that any type or choice accepts.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from services.commands.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients"))
from capc_client.cli import build_parser as capcctl_parser  # noqa: E402

DOCS = sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md")])
FENCE = re.compile(r"^\s*(```|~~~)")
ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_-]*(\.[A-Za-z0-9]+)*$|^<[^>]+>$")
#: Shell words that start another command.
SEPARATOR = {";", "&&", "||", "&"}
#: Shell words that end a command's own words: a pipe or a redirection.
STOP = re.compile(r"^(\||<|\d?>)")


class Command(NamedTuple):
    """One command line of the docs: where it is and its words."""

    where: str
    words: list[str]


def _logical_lines(lines: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each line of a fenced block, continuations joined."""
    start, parts = 0, list[str]()
    for number, line in lines:
        if not parts:
            start = number
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            parts.append(stripped[:-1])
            continue
        parts.append(stripped)
        yield start, " ".join(parts)
        parts = []
    if parts:
        yield start, " ".join(parts)


def _fenced(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, logical line) of every line inside a fenced block of ``path``."""
    block: list[tuple[int, str]] | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            if block is None:
                block = []
            else:
                yield from _logical_lines(block)
                block = None
        elif block is not None:
            block.append((number, line))


def _synopsis(word: str) -> str:
    """A synopsis word as a command word: brackets dropped, the first alternative kept."""
    word = word.replace("...", "").strip("[]")
    if "|" in word and not word.startswith("|"):
        word = word.split("|")[0].strip("[]")
    return word


def _segments(line: str) -> list[list[str]]:
    """The shell words of each command of a docs line (``a; b && c`` is three)."""
    text = re.sub(r";(\s|$)", r" ; ", line.strip().removeprefix("$ "))
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return []
    segments: list[list[str]] = [[]]
    for word in words:
        if word in SEPARATOR:
            segments.append([])
        else:
            segments[-1].append(word)
    return segments


def _words(words: list[str]) -> list[str]:
    """A command's words: environment assignments, pipes and redirections dropped."""
    while words and ENV.match(words[0]):
        words = words[1:]
    out: list[str] = []
    for word in words:
        if STOP.match(word):
            break
        word = _synopsis(word)
        if word:
            out.append(word)
    return out


def commands(program: str) -> list[Command]:
    """Every docs line that runs ``program``."""
    found = []
    for path in DOCS:
        for number, line in _fenced(path):
            for segment in _segments(line):
                words = _words(segment)
                if words and words[0] == program:
                    found.append(Command(f"{path.relative_to(ROOT)}:{number}", words[1:]))
    return found


class DocsError(Exception):
    """An argparse error, raised instead of exiting."""


def _lenient(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` and its subparsers raise on errors and accept placeholders."""
    get_value, check_value = parser._get_value, parser._check_value

    def value(action: argparse.Action, text: str) -> Any:
        return text if PLACEHOLDER.match(text) else get_value(action, text)

    def check(action: argparse.Action, val: Any) -> None:
        if not (isinstance(val, str) and PLACEHOLDER.match(val)):
            check_value(action, val)

    def error(message: str) -> Any:
        raise DocsError(f"{parser.prog}: {message}")

    parser._get_value = value  # type: ignore[method-assign,assignment]
    parser._check_value = check  # type: ignore[method-assign,assignment]
    parser.error = error  # type: ignore[method-assign]
    parser.exit_on_error = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _lenient(child)


def _parser(program: str) -> argparse.ArgumentParser:
    parser = build_parser() if program == "capc" else capcctl_parser()
    _lenient(parser)
    return parser


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M)}


def test_docs_are_found() -> None:
    assert ROOT / "docs" / "usage.md" in DOCS
    assert len(commands("capc")) > 20 and commands("capcctl")


@pytest.mark.parametrize("program", ["capc", "capcctl"])
def test_docs_commands_parse(program: str) -> None:
    parser = _parser(program)
    failures = []
    for command in commands(program):
        try:
            parser.parse_args(command.words)
        except (DocsError, argparse.ArgumentError) as err:
            failures.append(f"{command.where}: {program} {shlex.join(command.words)}\n    {err}")
        except SystemExit:  # --help
            pass
    assert not failures, "docs commands the parser refuses:\n" + "\n".join(failures)


def test_docs_make_targets_exist() -> None:
    targets = _make_targets()
    failures = [
        f"{c.where}: make {' '.join(c.words)}: no target {word!r} in the Makefile"
        for c in commands("make")
        for word in c.words
        if not word.startswith("-") and "=" not in word and word not in targets
    ]
    assert not failures, "\n".join(failures)
