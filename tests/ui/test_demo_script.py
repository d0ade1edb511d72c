"""scripts/ui_demo.py, the database the README's screenshots of the viewer are taken from:
it builds, and its pages are what the screenshots show (the screenshots themselves need
Chromium and are taken by hand: python scripts/ui_demo.py --screenshots docs/ui)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from expstore import ReplayBuffer

pytest.importorskip("starlette", reason="the viewer's tests need the ui extra")
from starlette.testclient import TestClient  # noqa: E402

from expstore.ui import make_app  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ui_demo.py"


def test_the_demo_database_has_web_tasks_a_hand_off_and_grpo_groups(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("ui_demo", SCRIPT)
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    url = demo.build(tmp_path)
    with ReplayBuffer(url, name="web") as web:
        assert len(web.task_ids()) == 30
    client = TestClient(make_app(url), base_url="http://localhost:8765")
    tasks = client.get("/b/web/tasks").text
    assert "30 tasks" in tasks and tasks.count("✓ yes") == 15
    story = client.get("/b/web/task?id=task-03").text
    assert "planner → browser-agent" in story and 'class="badge same"' in story
    groups = client.get("/b/rollouts/groups").text
    assert len(re.findall(r'href="/b/rollouts/group\?key=prompt-\d"', groups)) == 8
    assert "4 leased" in groups
