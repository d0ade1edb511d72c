"""Every command explains itself, ending its help with an example."""

from __future__ import annotations

import pytest
import typer

from expstore.cli import app
from tests.cli.conftest import Invoke

COMMANDS = list(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_the_commands_are_the_ones_the_readme_describes() -> None:
    assert COMMANDS == [
        "demo",
        "init",
        "upgrade",
        "version",
        "buffers",
        "stats",
        "query",
        "sample",
        "delete",
        "retention",
        "summary",
        "export",
        "import",
        "ui",
    ]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(invoke: Invoke, command: str) -> None:
    result = invoke(command, "--help")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"Usage: expstore {command} ")
    example = result.stdout.split("Example:\n", 1)
    assert len(example) == 2, f"{command} --help has no example"
    assert example[1].lstrip().startswith(f"expstore {command}")


def test_top_level_help_lists_every_command_and_where_the_database_comes_from(
    invoke: Invoke,
) -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for command in COMMANDS:
        assert f"\n  {command} " in result.stdout
    assert "EXPSTORE_URL" in result.stdout
    assert invoke().exit_code in (0, 2)  # no command: the help, not a traceback


def test_database_options_show_the_environment_variable(invoke: Invoke) -> None:
    text = " ".join(invoke("stats", "--help").stdout.split())
    assert "[env var: EXPSTORE_URL; default: sqlite:///expstore.db]" in text
