"""Every fenced ```python block of the documentation runs, and shows what it prints.

The pages are README.md and every page under docs/. The conventions (docs/contributing.md
says them for writers):

- A page's ```python blocks run in order, in one namespace, in a fresh temporary
  directory that is the working directory while they run.
- A ```text block that follows a ```python block with nothing but blank lines between is
  the output of that block: what it prints must equal it (trailing spaces aside).
- ``<!-- test-needs: postgres torch ... -->`` anywhere in a page names what its blocks
  need (``postgres``, or a module to import); the page skips without it (with
  ``EXPSTORE_REQUIRE_PG=1`` a missing Postgres fails instead). For ``postgres`` the page
  runs with ``EXPSTORE_URL`` set to a fresh database of its own, which its blocks read.
- ``<!-- test-setup`` ... ``-->`` holds Python that runs before the next block, unseen on
  the site: stand-ins for what a page assumes exists (a ``train_step``), never the point
  of the example.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_SETUP = re.compile(r"<!--\s*test-setup\s*\n(.*?)-->", re.S)
_NEEDS = re.compile(r"<!--\s*test-needs:([^>]*)-->")


@dataclass
class Block:
    line: int
    code: str
    setup: str = ""
    output: str | None = None


def blocks_of(text: str) -> list[Block]:
    """The page's Python blocks in order, each with its hidden setup and shown output."""
    blocks: list[Block] = []
    pending_setup: list[str] = []
    events = sorted(
        [(m.start(), "fence", m) for m in _FENCE.finditer(text)]
        + [(m.start(), "setup", m) for m in _SETUP.finditer(text)]
    )
    last_python_end = None
    for start, kind, match in events:
        if kind == "setup":
            pending_setup.append(match.group(1))
            continue
        lang, body = match.group(1), match.group(2)
        if lang == "python":
            line = text.count("\n", 0, start) + 1
            blocks.append(Block(line, body, "\n".join(pending_setup)))
            pending_setup = []
            last_python_end = match.end()
        elif (
            lang == "text"
            and blocks
            and last_python_end is not None
            and not text[last_python_end:start].strip()
        ):
            blocks[-1].output = body
        if lang != "python":
            last_python_end = None
    return blocks


def needs_of(text: str) -> set[str]:
    return {need for m in _NEEDS.finditer(text) for need in m.group(1).split()}


def _tidy(out: str) -> str:
    return "\n".join(line.rstrip() for line in out.strip("\n").splitlines())


def _pages_with_blocks() -> list[Path]:
    return [page for page in PAGES if blocks_of(page.read_text())]


@pytest.mark.parametrize("page", _pages_with_blocks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_blocks_run_and_print_what_they_show(
    page: Path, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = page.read_text()
    needs = needs_of(text)
    for module in sorted(needs - {"postgres"}):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{page.name} needs {module}, which is not installed")
    if "postgres" in needs:
        monkeypatch.setenv("EXPSTORE_URL", request.getfixturevalue("own_pg_database"))
    else:
        monkeypatch.delenv("EXPSTORE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    try:
        for block in blocks_of(text):
            where = f"{page.relative_to(ROOT)}:{block.line}"
            if block.setup:
                exec(compile(block.setup, f"{where} (setup)", "exec"), namespace)
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(block.code, where, "exec"), namespace)
            if block.output is not None:
                assert _tidy(printed.getvalue()) == _tidy(block.output), (
                    f"{where} printed something else than the page shows"
                )
    finally:
        for value in list(namespace.values()):
            close = getattr(value, "close", None)
            if type(value).__name__ == "ReplayBuffer" and callable(close):
                close()


def test_the_collector_finds_blocks_setup_and_output() -> None:
    page = (
        "<!-- test-needs: postgres torch -->\n"
        "```python\nx = 1\n```\n\n```text\n1\n```\n"
        "<!-- test-setup\ny = 2\n-->\n"
        "```bash\necho no\n```\n```text\nnot an output\n```\n"
        "```python\nprint(x + y)\n```\n"
    )
    found = blocks_of(page)
    assert [(b.code, b.setup, b.output) for b in found] == [
        ("x = 1\n", "", "1\n"),
        ("print(x + y)\n", "y = 2\n", None),
    ]
    assert needs_of(page) == {"postgres", "torch"}


def test_every_documented_python_block_is_collected() -> None:
    """No page hides a Python example in a fence the collector would not run."""
    for page in PAGES:
        for match in _FENCE.finditer(page.read_text()):
            assert match.group(1) not in ("py", "python3", "pycon"), (
                f"{page.name}: use ```python (run by the tests) for Python code"
            )
