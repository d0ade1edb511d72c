"""The documentation site builds with `mkdocs build --strict` (a broken link, a missing
page or a docstring mkdocstrings cannot read fails it), and its search finds the page
for each topic a new user looks for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: What a new user searches for, and the page that must answer it.
TOPICS = {
    "claims": "concepts/claims/",
    "fencing": "concepts/claims/",
    "GRPO groups": "guides/async-grpo/",
    "changed()": "concepts/tracking/",
    "compression": "concepts/compression/",
    "row cache": "concepts/cache/",
    "viewer": "viewer/",
    "Postgres replicas": "guides/postgres/",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_site_builds_strictly(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "reference" / "index.html").read_text().count("ReplayBuffer") > 5


@pytest.mark.parametrize("topic", sorted(TOPICS))
def test_search_finds_the_page_for(site: Path, topic: str) -> None:
    index = json.loads((site / "search" / "search_index.json").read_text())
    page = TOPICS[topic]
    words = topic.lower().replace("()", "").split()
    titles = {
        doc["location"].split("#")[0]
        for doc in index["docs"]
        if all(w in (doc["title"] + " " + doc["text"]).lower() for w in words)
    }
    assert page in titles, f"searching {topic!r} finds {sorted(titles)[:10]}, not {page}"
    heading = next(d["title"] for d in index["docs"] if d["location"] == page)
    assert any(w in heading.lower() for w in words), (page, heading)
