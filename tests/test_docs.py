"""Every command the docs show parses: each `worker-bridge ...` and `worker-bridge-mcp ...` line in
a fenced sh/bash/console block of README.md, compose/README.md and docs/*.md goes through the
real parser, so no doc names a command or flag that does not exist. No Docker, no state root:
parsing only. Placeholders (TASK_ID, JOB_ID, ...) stand for values the parser takes."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from bridge.cli import build_parser
from bridge.listener.flags import add_arguments as add_mcp_arguments

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "compose/README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = {"sh", "bash", "console", "shell"}
FENCE = re.compile(r"^ {0,3}```(\S*)\s*$")  # four spaces in: an indented code block
# A command begins a line, after a `$ ` prompt, `NAME=value` assignments, or `var=$(`.
START = re.compile(r"^(?:\$\s+)?(?:[A-Za-z_]\w*=(?!\$\()\S*\s+)*(?P<sub>[A-Za-z_]\w*=\$\()?")
# Shell operators end the command on its line.
OPERATORS = {"&&", "||", "|", ";", ">", ">>", "2>&1"}
# Placeholders the docs use where a value goes, and a value the parser takes there.
PLACEHOLDERS = {
    "TASK_ID": "029f3317ef08",
    "JOB_ID": "job-1a2b3c4d",
    "REQUEST_ID": "r1a2b3c4",
    "PATH": "/tmp/x",
    "NAME": "codex",
    "N": "2",
    "S": "600",
}


def shell_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, logical line) of each fenced shell block, continuations joined."""
    out: list[tuple[int, str]] = []
    in_block, is_shell = False, False
    pending, start = "", 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            in_block, is_shell = not in_block, fence.group(1) in SHELLS
            continue
        if not (in_block and is_shell):
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def commands(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, program, argv) of each worker-bridge command in the file's shell blocks."""
    found = []
    for number, line in shell_lines(path):
        line = line.strip()
        opened = START.match(line)
        words = shlex.split(line[opened.end() :], comments=True)
        if not words or words[0] not in ("worker-bridge", "worker-bridge-mcp"):
            continue
        argv: list[str] = []
        for word in words[1:]:
            if word in OPERATORS:
                break
            if opened.group("sub") and word.endswith(")"):  # the `)` closing `$(`
                argv.append(word[:-1])
                break
            argv.append(PLACEHOLDERS.get(word, word))
        found.append((number, words[0], argv))
    return found


ALL = [
    pytest.param(program, argv, id=f"{path.relative_to(ROOT)}:{number}")
    for path in DOCS
    for number, program, argv in commands(path)
]


def test_the_docs_show_commands() -> None:
    """The collection itself works: the README and the CLI's page show many commands."""
    assert sum(p.id.startswith("README.md:") for p in ALL) >= 5
    assert sum(p.id.startswith("docs/cli.md:") for p in ALL) >= 20


@pytest.mark.parametrize(("program", "argv"), ALL)
def test_command_parses(program: str, argv: list[str]) -> None:
    """The parser takes it: a refusal exits 2 with the reason on stderr."""
    if program == "worker-bridge-mcp":
        parser = argparse.ArgumentParser(prog=program)
        add_mcp_arguments(parser)
    else:
        parser = build_parser(argv)
    try:
        parser.parse_args(argv)
    except SystemExit as exc:  # --help exits 0
        assert exc.code == 0, f"{program} {shlex.join(argv)} does not parse"
