"""The README's commands against the program: every subcommand a `moecore ...` code span names (the
table of commands and the examples in the text) exists (its `--help` succeeds) and takes every
option the span spells out. The README is what users copy from; an option renamed or removed in
src/cli would otherwise leave it describing a program that is gone.

Run: MOECORE_BIN=build/bin/moecore /opt/moecore/venv/bin/python -m pytest -q tests/cli/test_readme_commands.py
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("MOECORE_BIN", str(REPO / "build" / "bin" / "moecore")))


def documented_commands() -> list[tuple[tuple[str, ...], list[str]]]:
    """(subcommand words, options) of every `moecore ...` code span in the README (the table of
    commands and the examples in the text), each distinct pair once."""
    text = (REPO / "README.md").read_text()
    usages = re.findall(r"`(?:build/bin/)?(moecore [^`]*)`", text)
    # The fenced examples: their lines joined where they end in a backslash, comments dropped,
    # from the program's name on (after `mpirun -np 4 build/bin/`, say).
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            found = re.search(r"(?:^|[\s/])(moecore .*)", line.split(" #")[0])
            if found:
                usages.append(found.group(1))
    commands: list[tuple[tuple[str, ...], list[str]]] = []
    for usage in usages:
        words = usage.replace("\\|", "|").split()[1:]
        path: list[str] = []
        for word in words:  # the subcommand words come first: lower case, no brackets
            if not re.fullmatch(r"[a-z][a-z-]*(\|[a-z][a-z-]*)*", word):
                break
            path.append(word)
        if not path:  # prose about the program ("moecore train: ... on cuda"), not a command
            continue
        options = sorted(set(re.findall(r"--[a-z][a-z0-9-]*", usage)))
        # `mx quantize|dequantize|...`: each alternative is a subcommand of its own.
        for alternative in path[-1].split("|"):
            command = (tuple(path[:-1] + [alternative]), options)
            if command not in commands:
                commands.append(command)
    return commands


COMMANDS = documented_commands()


def test_the_table_is_read():
    # A README reorganised so that nothing matches must fail here, not pass every case by none.
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"train", "plan", "bench gemm", "mx quantize", "tokenizer train", "diff"} <= names
    assert len(COMMANDS) >= 30


@pytest.mark.skipif(not BIN.exists(), reason=f"no moecore program at {BIN} (build it first)")
@pytest.mark.parametrize("path,options", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_documented_command_exists_with_its_options(path, options):
    r = subprocess.run([str(BIN), *path, "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"moecore {' '.join(path)} --help: {r.stderr.strip()}"
    # A subcommand's parent answers `moecore mx nosuch --help` with its own help: the usage line
    # must be the subcommand's.
    usage = next((line for line in r.stdout.splitlines() if line.startswith("Usage: ")), "")
    assert re.search(rf"moecore {re.escape(' '.join(path))}( |$)", usage), (path, usage)
    offered = set(re.findall(r"--[a-z][a-z0-9-]*", r.stdout))
    missing = [o for o in options if o not in offered]
    assert not missing, f"README names {missing} for `moecore {' '.join(path)}`; --help offers {sorted(offered)}"
