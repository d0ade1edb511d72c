"""Progress bars appear on a terminal and stay away from pipes."""

from __future__ import annotations

import io
import sys

import pytest

from expstore.cli._common import progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_is_drawn_when_stderr_is_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress(10, "exporting") as advance:
        for _ in range(10):
            advance(1)
    assert "exporting" in terminal.getvalue()


def test_nothing_is_drawn_when_stderr_is_piped(monkeypatch: pytest.MonkeyPatch) -> None:
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    with progress(10, "exporting") as advance:
        advance(10)
    assert piped.getvalue() == ""
