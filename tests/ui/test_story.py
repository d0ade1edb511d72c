"""The viewer's second round (issue 48), over HTTP on both backends: a trajectory told as a
story (header, agents and hand-offs, pages, times, click positions, unchanged screenshots,
chat as modern agents write it, the filter carried in), the tasks and GRPO groups lists,
prompts and completions linked through lineage, the live page's success counted per task
as ``expstore stats`` counts it, charts whose labels stay off the data, and thumbnails
served from the cache without a read of the database."""

from __future__ import annotations

import base64
import html
import io
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import numpy as np
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer

pytest.importorskip("starlette", reason="the viewer's tests need the ui extra")
from starlette.testclient import TestClient  # noqa: E402

from expstore.ui import make_app  # noqa: E402
from tests.ui.conftest import UiData, screenshot  # noqa: E402
from tests.ui.test_app import BASE, links, viewer  # noqa: E402

SYSTEM = "You are a careful web agent."
LONG = "word " * 300
T0 = 1_800_000_000.0


def png_data_url() -> str:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.full((40, 60, 3), (10, 200, 30), np.uint8)).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def story_rows() -> list[DataRow]:
    """One task of four steps told by two agents, and a task with a very long id."""
    user = {
        "role": "user",
        "content": [
            {"type": "text", "text": "Find the cheapest cable"},
            {"type": "image_url", "image_url": {"url": png_data_url()}},
        ],
    }
    call = {
        "role": "assistant",
        "content": "<think>secret plan</think>Searching now.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "search", "arguments": json.dumps({"q": "cable"})},
            }
        ],
    }
    result = {"role": "tool", "tool_call_id": "c1", "content": "3 results"}
    first, second = screenshot(0, 0), screenshot(0, 1)
    steps: list[tuple[str, str | None, np.ndarray, list[Any], list[Any], float]] = [
        ("planner", None, first, [{"name": "click", "x": 640, "y": 360}], [], 0.1),
        (
            "browser",
            "planner",
            first,  # the click did nothing: the same screenshot
            [{"name": "type", "coordinate": [100, 50], "text": "cable"}],
            [call, result],
            0.0,
        ),
        (
            "browser",
            None,
            second,
            [{"name": "click", "x": 10, "y": 700}],
            [{"role": "assistant", "content": LONG}],
            0.2,
        ),
        ("browser", None, second, [{"name": "stop"}], [], 0.0),
    ]
    rows = []
    history: list[Any] = [{"role": "system", "content": SYSTEM}, user]
    for s, (agent, pre, shot, actions, said, reward) in enumerate(steps):
        history = history + said
        rows.append(
            DataRow(
                id=f"story-{s}",
                exp_meta=ExpMeta(
                    task_id="story-1",
                    agent_id=agent,
                    pre_agent=pre,
                    step=s,
                    execute_time=T0 + 2.5 * s,
                    policy_version=4 + s // 2,
                ),
                exp_data=Experience(
                    state={"url": f"https://shop.example/{s}", "screenshot": shot},
                    actions=actions,
                    reward_t=reward,
                    done=s == 3,
                    messages=history,
                ),
            )
        )
    rows.append(
        DataRow(
            id="r" + "0123456789abcdef" * 8,
            exp_meta=ExpMeta(task_id="t" + "long-task-name-" * 8, agent_id="a", step=0),
            exp_data=Experience(reward_t=1.0, done=True),
        )
    )
    return rows


@pytest.fixture
def story(db_url: str, buffer_name: str) -> str:
    name = buffer_name + "_story"
    with ReplayBuffer(db_url, name=name) as buffer:
        buffer.store_batch(story_rows())
    return name


@pytest.fixture
def client(ui_data: UiData) -> TestClient:
    return viewer(make_app(ui_data.url), raise_server_exceptions=False)


def step_html(page: str, n: int) -> str:
    found = re.search(rf'<li class="step[^"]*" id="step-{n}">(.*?)</li>', page, re.S)
    assert found is not None, f"no step {n}"
    return found.group(1)


def text_of(page: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</', page, re.S)
    assert found is not None, element_id
    return re.sub(r"\s+", " ", found.group(1)).strip()


# -- 1. a trajectory that reads like a story ---------------------------------------------------


def test_a_trajectory_opens_with_goal_agents_outcome_return_length_duration_versions(
    client: TestClient, story: str
) -> None:
    page = client.get(f"/b/{story}/task?id=story-1").text
    assert text_of(page, "goal") == "Find the cheapest cable"  # the first user message's text
    assert text_of(page, "agents") == "planner, browser"
    assert text_of(page, "outcome").startswith("failed (final reward 0)")
    assert text_of(page, "return") == "0.3"
    assert text_of(page, "length") == "4"
    assert text_of(page, "duration") == "7.5 s"
    assert text_of(page, "versions") == "v4–v5 (2)"


def test_each_step_tells_its_agent_hand_off_page_time_and_where_it_clicked(
    client: TestClient, story: str
) -> None:
    page = client.get(f"/b/{story}/task?id=story-1").text
    first, second = step_html(page, 0), step_html(page, 1)
    assert 'class="badge handoff"' not in first and "planner" in first
    assert "planner → browser" in second  # the hand-off at step 1
    assert "https://shop.example/1" in second
    assert "+2.5 s" in second and "+" not in text_of(page, "step-0").split("reward")[0]
    # the click drawn on the screenshot, in the image's own pixels (viewBox 1280x720)
    assert 'viewBox="0 0 1280 720"' in first
    assert re.search(r'<circle cx="640.0" cy="360.0"[^>]*class="mark"', first)
    assert re.search(r'<circle cx="100.0" cy="50.0"[^>]*class="mark"', second)
    assert "<code>cable</code>" in second  # what it typed
    # the screenshot that did not change, told by the buffer's digest
    assert "unchanged" not in first and 'class="badge same"' in second
    assert 'class="badge same"' not in step_html(page, 2)
    # the thumbnail opens the full-size image
    full = re.search(
        r'<a href="([^"]+)" target="_blank"[^>]*><img class="shot" src="([^"]+)"', first
    )
    assert full is not None
    assert "thumb=1" in full.group(2) and "thumb" not in full.group(1)
    image = client.get(full.group(1).replace("&amp;", "&"))
    assert image.status_code == 200 and image.headers["content-type"] == "image/png"


def test_two_agents_at_one_step_are_told_apart_as_a_hand_off(
    client: TestClient, db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(
            [
                DataRow(
                    id=f"h{i}",
                    exp_meta=ExpMeta(task_id="t", agent_id=agent, step=step),
                    exp_data=Experience(reward_t=0.0),
                )
                for i, (agent, step) in enumerate([("planner", 0), ("coder", 0), ("coder", 1)])
            ]
        )
    page = client.get(f"/b/{buffer_name}/task?id=t").text
    assert "planner → coder" in step_html(page, 1)
    assert 'class="badge handoff"' not in step_html(page, 0) + step_html(page, 2)


def test_chat_shows_content_parts_tool_calls_thinking_and_folds_long_and_repeated_texts(
    client: TestClient, story: str
) -> None:
    page = client.get(f"/b/{story}/task?id=story-1").text
    first, second, third = step_html(page, 0), step_html(page, 1), step_html(page, 2)
    assert "Find the cheapest cable" in first and '"type"' not in first  # text, not JSON
    shown = re.search(r'<img class="msg-image" src="([^"]+)"', first)
    assert shown is not None  # the data: URL image, served by the viewer (CSP: self only)
    image = client.get(shown.group(1).replace("&amp;", "&"))
    assert image.status_code == 200 and image.content.startswith(b"\x89PNG")
    assert re.search(
        r'<code class="fn">search</code><pre class="args">\{"q": "cable"\}', html.unescape(second)
    )
    assert re.search(r'<span class="role">tool · search</span>', second)  # the tool's name
    assert re.search(
        r'<details class="think"><summary>thinking[^<]*</summary>'
        r'<div class="text">secret plan</div>',
        second,
    )
    assert "Searching now." in second
    assert re.search(r'<details class="long"><summary>word word', third)
    # the system prompt and the goal, shown at step 0, are folded at the steps after
    assert first.count(SYSTEM) == 1 and 'details class="repeat"' not in first
    folded = re.search(
        r'<p class="repeat">2 messages shown before \(system, user\), at '
        r'<a href="#step-0">step 0</a></p>',
        second,
    )
    assert SYSTEM not in second  # pointed at, not sent again
    assert folded is not None


def test_the_rows_filter_is_carried_into_trajectories_and_marks_the_matching_steps(
    client: TestClient, story: str
) -> None:
    where = "reward_t > 0"
    rows = client.get(f"/b/{story}/rows?" + urlencode({"where": where})).text
    assert (
        f"/b/{story}/task?{urlencode({'id': 'story-1', 'where': where})}".replace("&", "&amp;")
        in rows
    )
    page = client.get(f"/b/{story}/task?" + urlencode({"id": "story-1", "where": where})).text
    marked = re.findall(r'<li class="step( match)?[^"]*" id="step-(\d)">', page)
    assert [int(n) for m, n in marked if m] == [0, 2]
    assert text_of(page, "matching") == "2 of 4 steps match"
    assert 'class="badge match"' in step_html(page, 2)


# -- 2. lists and groups people scan --------------------------------------------------------


def task_table(page: str, table: str = "tasks") -> list[list[str]]:
    body = re.search(rf'<table class="grid" id="{table}">.*?<tbody>(.*?)</tbody>', page, re.S)
    assert body is not None
    return [
        [
            re.sub(r"<[^>]+>|\s+", " ", c).strip()
            for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)
        ]
        for tr in re.findall(r"<tr>(.*?)</tr>", body.group(1), re.S)
    ]


def test_the_tasks_list_has_a_line_per_task_with_return_length_success_agents_versions(
    client: TestClient, ui_data: UiData
) -> None:
    page = client.get(f"/b/{ui_data.web}/tasks").text
    lines = task_table(page)
    assert [line[0] for line in lines] == [f"shop-{t}" for t in range(5)]
    assert lines[0][1:6] == ["4", "1", "✓ yes", "agent0", "v0"]
    assert lines[1][1:6] == ["4", "0", "✗ no", "agent1", "v1"]
    assert "5 tasks, 20 rows" in text_of(page, "summary")
    # each task links to its trajectory
    assert links(page, r'href="(/b/[^/]+/task\?id=shop-0)"')


def test_the_tasks_list_sorts_counts_matches_and_pages(client: TestClient, ui_data: UiData) -> None:
    by_return = task_table(client.get(f"/b/{ui_data.web}/tasks?sort=-return").text)
    assert [line[2] for line in by_return] == ["1", "1", "1", "0", "0"]
    by_task = task_table(client.get(f"/b/{ui_data.web}/tasks?sort=-task").text)
    assert by_task[0][0] == "shop-4"
    where = "step >= 2 and agent_id = 'agent0'"
    page = client.get(f"/b/{ui_data.web}/tasks?" + urlencode({"where": where, "limit": 2})).text
    lines = task_table(page)
    assert [(line[0], line[-1]) for line in lines] == [("shop-0", "2"), ("shop-2", "2")]
    assert "3 tasks with 6 matching rows" in text_of(page, "summary")
    following = links(page, r'id="next" href="([^"]+)"')
    assert following and "previous" not in page.split('id="tasks"')[1].split("</table>")[1][:200]
    second = client.get(following[0]).text
    assert [line[0] for line in task_table(second)] == ["shop-4"]
    assert links(second, r'id="previous" href="([^"]+)"')
    # the trajectory links keep the filter
    assert "where=step" in links(second, r'href="(/b/[^/]+/task\?[^"]+)"')[0]
    bad = client.get(f"/b/{ui_data.web}/tasks?sort=height")
    assert bad.status_code == 400 and "tasks sort by first, task" in bad.text


def test_the_groups_index_shows_prompt_reward_spread_correct_claims_versions(
    client: TestClient, ui_data: UiData
) -> None:
    page = client.get(f"/b/{ui_data.groups}/groups").text
    lines = task_table(page, "groups")
    assert len(lines) == 6
    assert lines[0] == ["prompt0", "What is 0+0?", "4", "0.500", "0.500", "2/4", "4 leased", "v0"]
    assert lines[5][-2:] == ["4 unclaimed", "v2"]
    group = client.get(links(page, r'href="(/b/[^/]+/group\?key=prompt0)"')[0]).text
    assert "The answer is 0." in group and "The answer is 3." in group


def test_prompts_and_their_completions_link_both_ways_through_lineage(
    client: TestClient, db_url: str, buffer_name: str
) -> None:
    with (
        ReplayBuffer(db_url, name=buffer_name + "_p") as prompts,
        ReplayBuffer(db_url, name=buffer_name + "_r") as rollouts,
    ):
        prompts.store_prompts(
            [
                DataRow(
                    id="q1",
                    exp_meta=ExpMeta(task_id="q1", agent_id="data", step=0),
                    exp_data=Experience(messages=[{"role": "user", "content": "2+2?"}]),
                )
            ],
            group_size=2,
        )
        claim = prompts.consumer("actor-0").claim(1)
        made = [
            DataRow(
                id=f"q1/c{c}",
                exp_meta=ExpMeta(task_id="q1", agent_id="actor-0", step=c),
                exp_data=Experience(
                    reward_t=float(c), messages=[{"role": "user", "content": "2+2?"}]
                ),
            )
            for c in range(2)
        ]
        claim.ack(produce={"q1": made}, into=rollouts)
    group = client.get(f"/b/{buffer_name}_r/group?key=q1").text
    assert group.count("2+2?") == 1  # the prompt the completions share, shown once on top
    prompt_url = links(group, r'class="prompt-row" href="([^"]+)"')
    assert prompt_url == [f"/b/{buffer_name}_p/row?id=q1"]
    prompt_page = client.get(prompt_url[0]).text
    assert links(prompt_page, r'<li><a href="([^"]+)">q1/c') == [
        f"/b/{buffer_name}_r/row?id=q1%2Fc0",
        f"/b/{buffer_name}_r/row?id=q1%2Fc1",
    ]
    completion = client.get(f"/b/{buffer_name}_r/row?id=q1%2Fc1").text
    assert links(completion, r'id="prompt-link" href="([^"]+)"') == prompt_url


def test_a_row_opens_from_its_key_whatever_columns_are_shown(
    client: TestClient, ui_data: UiData
) -> None:
    page = client.get(f"/b/{ui_data.web}/rows?cols=reward_t&limit=3").text
    assert links(page, r'class="open" href="(/b/[^/]+/row\?id=[^"]+)"') == [
        f"/b/{ui_data.web}/row?id=web-0-{s}" for s in range(3)
    ]


def test_rows_cells_say_how_they_wrap(client: TestClient, story: str) -> None:
    page = client.get(f"/b/{story}/rows?cols=id,task_id,agent_id,exp_data.messages").text
    assert re.search(r'<td class="id" title="r0123456789abcdef', page)  # cut, whole in the title
    assert '<td class="short">planner</td>' in page
    assert '<td class="long">' in page  # the messages wrap


# -- 3. live page -------------------------------------------------------------------------------


def test_the_live_page_counts_success_per_task_as_expstore_stats_does(
    client: TestClient, ui_data: UiData
) -> None:
    from expstore.cli.stats import compute_stats

    live = client.get(f"/b/{ui_data.web}/live.json").json()
    with ReplayBuffer(ui_data.url, name=ui_data.web) as buffer:
        expected = compute_stats(buffer)["success_rate"]
    assert expected == pytest.approx(0.6)  # 3 of 5 tasks; 3 of 20 rows have a reward
    assert live["success"] == pytest.approx(expected) and live["tasks"] == 5
    assert [b["success"] for b in live["by_version"]] == [1.0, 0.0, 1.0, 0.0, 1.0]
    series = live["series"]
    assert sum(1 for _, v in series["rows_per_s"] if v) >= 1
    assert set(live["charts"]) >= {"rate", "reward_time", "success_time", "reward", "success"}


def plot_area(svg: str) -> tuple[ET.Element, tuple[float, float, float, float]]:
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    rect = next(r for r in root.iter(f"{ns}rect") if r.get("class") == "plot")
    x, y = float(rect.get("x", 0)), float(rect.get("y", 0))
    return root, (x, y, x + float(rect.get("width", 0)), y + float(rect.get("height", 0)))


def test_charts_have_ticks_and_labels_on_both_axes_that_never_sit_on_the_data(
    client: TestClient, ui_data: UiData
) -> None:
    charts = client.get(f"/b/{ui_data.groups}/live.json").json()["charts"]
    ns = "{http://www.w3.org/2000/svg}"
    drawn = 0
    for name, svg in charts.items():
        root, (left, top, right, bottom) = plot_area(svg)
        texts = [t for t in root.iter(f"{ns}text") if t.get("class") in ("tick", "axis-label")]
        if not any(root.iter(f"{ns}circle")) and not any(
            r.get("class") == "bar" for r in root.iter(f"{ns}rect")
        ):
            continue
        drawn += 1
        y_ticks = [t for t in texts if float(t.get("x", 0)) < left]
        x_ticks = [t for t in texts if float(t.get("y", 0)) > bottom]
        assert len(y_ticks) >= 2 and len(x_ticks) >= 1, name
        assert len(y_ticks) + len(x_ticks) == len(texts), f"{name}: a label inside the plot"
        for dot in root.iter(f"{ns}circle"):
            cx, cy = float(dot.get("cx", 0)), float(dot.get("cy", 0))
            assert left <= cx <= right and top <= cy <= bottom, name
        for bar in root.iter(f"{ns}rect"):
            if bar.get("class") == "bar":
                assert top <= float(bar.get("y", 0)) <= bottom, name
    assert drawn >= 4


# -- thumbnails ---------------------------------------------------------------------------------


@pytest.fixture
def statements() -> Iterator[list[str]]:
    seen: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    yield seen
    event.remove(Engine, "before_cursor_execute", count)


def test_a_thumbnail_asked_for_again_is_served_from_the_cache_without_a_read(
    ui_data: UiData, statements: list[str]
) -> None:
    client = TestClient(make_app(ui_data.url), base_url=BASE)
    page = client.get(f"/b/{ui_data.web}/rows?limit=20").text
    thumbs = links(page, r'<img class="thumb" src="([^"]+)"')
    assert len(thumbs) == 20
    for src in thumbs:
        assert client.get(src).status_code == 200
    before = len(statements)
    again = [client.get(src) for src in thumbs]
    assert all(a.status_code == 200 and a.content.startswith(b"\x89PNG") for a in again)
    assert len(statements) == before  # no statement: no row read, no image decoded


def test_an_image_in_a_message_that_is_not_one_is_a_400_not_a_crash(
    client: TestClient, db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        content = [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGEgcG5n"}},
            {"type": "image_url", "image_url": {"url": "data:text/html;base64,PHNjcmlwdD4="}},
        ]
        buffer.store_batch(
            [
                DataRow(
                    id="m",
                    exp_meta=ExpMeta(task_id="t", agent_id="a", step=0),
                    exp_data=Experience(messages=[{"role": "user", "content": content}]),
                )
            ]
        )
    path = "exp_data.messages.0.content.{}.image_url.url"
    broken = client.get(f"/b/{buffer_name}/image?" + urlencode({"id": "m", "path": path.format(0)}))
    assert broken.status_code == 400 and "not a readable image" in broken.text
    html_url = client.get(
        f"/b/{buffer_name}/image?" + urlencode({"id": "m", "path": path.format(1)})
    )
    assert html_url.status_code == 400 and "is not an image" in html_url.text
