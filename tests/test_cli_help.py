"""`--help` of every command and subcommand of `unicron` works and shows its help as written.

Typer renders help with rich markup: a help text holding something that looks like a tag
(`[/prefix]` in an etcd URL) crashed `unicron coordinator --help` with a traceback, and one like
`[node]` would silently vanish from the page. The command tree is walked, not listed, so that a
command added later is covered without touching this file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from rich.text import Text
from typer.testing import CliRunner

from unicron.cli.main import app

Path_ = tuple[str, ...]


def walk(command: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """Every command under ``command`` (itself included) with the words that invoke it. (Typer
    carries its own copy of click: a group is known by its subcommands, not by click's class.)"""
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from walk(sub, (*path, name))


TREE = dict(walk(typer.main.get_command(app)))


def test_the_tree_holds_the_commands_a_user_reads_about() -> None:
    """The walk reaches nested commands (a walk that found nothing would pass every test)."""
    names = {" ".join(path) for path in TREE}
    assert {"", "coordinator", "agent", "token", "token create", "node drain", "slurm run"} <= names


@pytest.mark.parametrize("path", sorted(TREE), ids=lambda p: " ".join(p) or "unicron")
def test_help_of_every_command_prints_and_exits_0(path: Path_) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=100)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert "Usage:" in result.output and (not path or path[-1] in result.output), result.output
    assert len(result.output.strip().splitlines()) > 3, result.output


def help_texts(command: Any) -> Iterator[tuple[str, str]]:
    """(where, text) for the command's own help and each of its parameters'."""
    for where, text in (("help", command.help), ("short help", command.short_help)):
        if text:
            yield where, text
    for param in command.params:
        text = getattr(param, "help", None)  # an option's, or a typer argument's
        if text:
            yield f"{param.name}'s help", text


@pytest.mark.parametrize("path", sorted(TREE), ids=lambda p: " ".join(p) or "unicron")
def test_every_help_text_reads_as_written(path: Path_) -> None:
    """Rich markup must change nothing but escapes (``\\[``): no tag is taken from a help text."""
    for where, text in help_texts(TREE[path]):
        meant = re.sub(r"\\\[", "[", text)
        try:
            shown = Text.from_markup(text).plain
        except Exception as exc:  # rich's MarkupError: the crash this test was written for
            pytest.fail(f"unicron {' '.join(path)}: {where} is not valid rich markup ({exc}): {text!r}")
        assert shown == meant, f"unicron {' '.join(path)}: {where} is shown as {shown!r}, not {meant!r}"
