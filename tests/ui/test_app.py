"""The viewer over HTTP (Starlette's test client), on both backends: every page, paging
by key, bad input answered with a 4xx page and nothing changed, read-only unless told,
escaping, and the live page's cost."""

from __future__ import annotations

import html
import io
import re
from urllib.parse import urlencode

import numpy as np
import pytest

from expstore import ReplayBuffer

pytest.importorskip("starlette", reason="the viewer's tests need the ui extra")
from starlette.testclient import TestClient  # noqa: E402

from expstore.ui import make_app  # noqa: E402
from tests.helpers import make_row  # noqa: E402
from tests.ui.conftest import XSS, UiData, screenshot  # noqa: E402

#: Where the tests' client says it reaches the viewer (a name the viewer answers to).
BASE = "http://localhost:8765"


def viewer(app: object, *, raise_server_exceptions: bool = True) -> TestClient:
    """A test client that reaches ``app`` as a browser on this machine would."""
    return TestClient(app, base_url=BASE, raise_server_exceptions=raise_server_exceptions)  # type: ignore[arg-type]


@pytest.fixture
def client(ui_data: UiData) -> TestClient:
    return viewer(make_app(ui_data.url), raise_server_exceptions=False)


def links(html: str, pattern: str) -> list[str]:
    return [m.replace("&amp;", "&") for m in re.findall(pattern, html)]


def test_the_buffers_page_lists_each_buffer_with_its_settings(
    client: TestClient, ui_data: UiData
) -> None:
    page = client.get("/?all=1")
    assert page.status_code == 200
    row = re.search(rf"<tr>\s*<td><a href=\"/b/{ui_data.groups}/rows\">.*?</tr>", page.text, re.S)
    assert row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(0), re.S)
    assert cells[1].strip() == "24"  # rows
    assert cells[4].strip() == "3"  # policy version
    assert "2 samples per insert" in cells[6]
    assert "schema revision" in page.text


def test_rows_are_paged_by_key_and_filtered(client: TestClient, ui_data: UiData) -> None:
    seen: list[str] = []
    url = f"/b/{ui_data.web}/rows?limit=7"
    while url:
        page = client.get(url)
        assert page.status_code == 200
        seen += links(page.text, r'class="open" href="/b/[^/]+/row\?id=([^"]+)"')
        nxt = links(page.text, r'id="next" href="([^"]+)"')
        url = nxt[0] if nxt else ""
    assert seen == [f"web-{t}-{s}" for t in range(5) for s in range(4)]
    rewarded = client.get(f"/b/{ui_data.web}/rows?" + urlencode({"where": "reward_t > 0"}))
    assert links(rewarded.text, r'class="open" href="/b/[^/]+/row\?id=([^"]+)"') == [
        "web-0-3",
        "web-2-3",
        "web-4-3",
    ]
    chosen = client.get(
        f"/b/{ui_data.web}/rows?" + urlencode({"cols": "id,exp_data.state.url", "order": "-step"})
    )
    assert "https://shop.example/0/3" in chosen.text and ">agent0<" not in chosen.text
    assert chosen.text.index("web-0-3") < chosen.text.index("web-0-0")  # newest step first
    thumbs = links(client.get(f"/b/{ui_data.web}/rows").text, r'class="thumb" src="([^"]+)"')
    assert len(thumbs) == 20


def test_a_malformed_filter_is_shown_with_its_caret(client: TestClient, ui_data: UiData) -> None:
    page = client.get(f"/b/{ui_data.web}/rows?" + urlencode({"where": "reward_t >> 0"}))
    assert page.status_code == 400
    shown = re.search(r'id="where-error".*?<pre>(.*?)</pre>', page.text, re.S)
    assert shown is not None
    lines = html.unescape(shown.group(1)).splitlines()
    assert "column 11" in lines[0] and lines[1].strip() == "reward_t >> 0"
    assert lines[2].index("^") == lines[1].index(">>") + 1  # under the second '>'
    assert 'value="reward_t &gt;&gt; 0"' in page.text  # the box keeps what was typed


@pytest.mark.parametrize(
    ("path", "status", "words"),
    [
        ("/b/nope/rows", 404, "no buffer named 'nope'"),
        ("/b/{web}/row?id=nope", 404, "no row with id"),
        ("/b/{web}/row", 400, "needs ?id="),
        ("/b/{web}/task?id=nope", 404, "no step of task"),
        ("/b/{groups}/group?key=nope", 404, "no row with exp_meta.task_id"),
        ("/b/{web}/rows?limit=100000", 400, "1 to 500 rows"),
        ("/b/{web}/rows?limit=abc", 400, "whole number"),
        ("/b/{web}/rows?order=payload", 400, "rows sort by"),
        ("/b/{web}/rows?cols=exp_meta.nope", 400, "unknown field"),
        ("/b/{web}/rows?after=garbage", 400, "page cursor"),
        ("/b/{web}/image?id=web-0-0&path=exp_data.state.url", 400, "not an image"),
        ("/b/{web}/image?id=web-0-0&path=../../etc/passwd", 400, "field"),
        ("/static/../../../etc/passwd", 404, "not found"),
        ("/static/%2e%2e/app.py", 404, "not found"),
        ("/nowhere", 404, "not found"),
    ],
)
def test_bad_input_gets_a_page_that_says_what_went_wrong(
    client: TestClient, ui_data: UiData, path: str, status: int, words: str
) -> None:
    before = {
        name: len(ReplayBuffer(ui_data.url, name=name)) for name in (ui_data.web, ui_data.groups)
    }
    page = client.get(path.format(web=ui_data.web, groups=ui_data.groups))
    assert page.status_code == status
    assert words in page.text.replace("&#39;", "'").lower() or words in page.text.replace(
        "&#39;", "'"
    )
    assert client.get(f"/b/{ui_data.web}/rows").status_code == 200  # still serving
    after = {
        name: len(ReplayBuffer(ui_data.url, name=name)) for name in (ui_data.web, ui_data.groups)
    }
    assert after == before


def test_a_row_opens_as_its_full_record_with_text_escaped(
    client: TestClient, ui_data: UiData
) -> None:
    page = client.get(f"/b/{ui_data.web}/row?id={ui_data.xss_row}")
    assert page.status_code == 200
    assert "<script>window.__pwned" not in page.text
    assert "&lt;script&gt;window.__pwned = 1; alert(&#39;xss&#39;)&lt;/script&gt;" in page.text
    assert "<img src=x" not in page.text
    assert "https://shop.example/1/2" in page.text and "uint8 720x1280x3 image" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    claimed = client.get(f"/b/{ui_data.groups}/row?id=g0-1")
    lineage = re.search(r'id="lineage">(.*?)</table>', claimed.text, re.S)
    assert lineage is not None and "leased" in lineage.group(1) and "learner-0" in lineage.group(1)


def test_a_screenshot_is_served_as_the_png_of_its_pixels(
    client: TestClient, ui_data: UiData
) -> None:
    from PIL import Image

    query = urlencode({"id": "web-3-1", "path": "exp_data.state.screenshot"})
    full = client.get(f"/b/{ui_data.web}/image?{query}")
    assert full.status_code == 200 and full.headers["content-type"] == "image/png"
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(full.content))), screenshot(3, 1))
    thumb = client.get(f"/b/{ui_data.web}/image?{query}&thumb=1")
    assert Image.open(io.BytesIO(thumb.content)).size == (320, 180)


def test_a_trajectory_shows_its_steps_and_its_neighbours_within_the_filter(
    client: TestClient, ui_data: UiData
) -> None:
    page = client.get(f"/b/{ui_data.web}/task?id=shop-1")
    assert page.status_code == 200
    assert re.findall(r"<b>step (\d+)</b>", page.text) == ["0", "1", "2", "3"]
    assert len(links(page.text, r'class="shot" src="([^"]+)"')) == 4
    assert links(page.text, r'id="previous" href="([^"]+)"') == [f"/b/{ui_data.web}/task?id=shop-0"]
    assert links(page.text, r'id="next" href="([^"]+)"') == [f"/b/{ui_data.web}/task?id=shop-2"]
    filtered = client.get(
        f"/b/{ui_data.web}/task?" + urlencode({"id": "shop-2", "where": "reward_t > 0"})
    )
    assert links(filtered.text, r'id="previous" href="/b/[^/]+/task\?id=([^&"]+)')[0] == "shop-0"
    assert links(filtered.text, r'id="next" href="/b/[^/]+/task\?id=([^&"]+)')[0] == "shop-4"
    assert "&lt;script&gt;" in page.text and "<script>window" not in page.text


def test_a_group_shows_its_completions_with_advantages_and_claims(
    client: TestClient, ui_data: UiData
) -> None:
    page = client.get(f"/b/{ui_data.groups}/group?key=prompt0")
    assert page.status_code == 200
    advantages = [float(a) for a in re.findall(r"<th>advantage</th><td>([-0-9.]+)</td>", page.text)]
    assert len(advantages) == 4 and abs(sum(advantages)) < 1e-6 and max(advantages) > 0.99
    assert page.text.count("leased by learner-0") == 4
    assert "The answer is 2." in page.text
    free = client.get(f"/b/{ui_data.groups}/group?key=prompt5")
    assert "unclaimed" in free.text and "leased" not in free.text


def test_the_live_numbers_follow_writes_and_cost_three_statements_per_refresh(
    ui_data: UiData,
) -> None:
    app = make_app(ui_data.url, live_every=3600.0)
    client = viewer(app)
    first = client.get(f"/b/{ui_data.groups}/live.json").json()
    assert first["rows"] == 24 and first["policy_version"] == 3
    assert first["claims"] == {"learner-0": {"leased": 4, "expired": 0}}
    assert first["rate_limit"]["samples_per_insert"] == 2.0
    assert dict(first["staleness"]) == {"1": 8, "2": 8, "3": 8}
    assert [b["version"] for b in first["by_version"]] == [0, 1, 2]
    assert "<svg" in first["charts"]["reward"]
    for _ in range(10):  # many tabs, one snapshot: shared while it is fresh
        client.get(f"/b/{ui_data.groups}/live.json")
    assert app.state.viewer.live_statements == 3
    live = make_app(ui_data.url, live_every=0.0)
    client = viewer(live)
    client.get(f"/b/{ui_data.groups}/live.json")
    with ReplayBuffer(ui_data.url, name=ui_data.groups) as buffer:
        buffer.store_batch([buffer.get("g5-0").model_copy(update={"id": "new"})])
    after = client.get(f"/b/{ui_data.groups}/live.json").json()
    assert after["rows"] == 25 and after["rows_per_s"] > 0
    assert live.state.viewer.live_statements == 6


def test_the_viewer_is_read_only_unless_deletes_are_allowed(ui_data: UiData) -> None:
    plain = viewer(make_app(ui_data.url), raise_server_exceptions=False)
    refused = plain.post(f"/b/{ui_data.web}/delete", data={"id": "web-0-0", "confirm": "web-0-0"})
    assert refused.status_code == 403 and "read-only" in refused.text
    assert 'name="confirm"' not in plain.get(f"/b/{ui_data.web}/row?id=web-0-0").text
    allowed = viewer(make_app(ui_data.url, allow_delete=True), raise_server_exceptions=False)
    allowed.headers["Origin"] = BASE  # as a browser posts the row page's form
    assert 'name="confirm"' in allowed.get(f"/b/{ui_data.web}/row?id=web-0-0").text
    wrong = allowed.post(f"/b/{ui_data.web}/delete", data={"id": "web-0-0", "confirm": "web-0"})
    assert wrong.status_code == 400 and "type its id again" in wrong.text
    with ReplayBuffer(ui_data.url, name=ui_data.web) as buffer:
        assert buffer.get("web-0-0") is not None and len(buffer) == 20
    done = allowed.post(
        f"/b/{ui_data.web}/delete",
        data={"id": "web-0-0", "confirm": "web-0-0"},
        headers={"Origin": BASE},
        follow_redirects=False,
    )
    assert done.status_code == 303
    with ReplayBuffer(ui_data.url, name=ui_data.web) as buffer:
        assert buffer.get("web-0-0") is None and len(buffer) == 19


def test_an_unknown_script_in_a_message_never_reaches_the_page_as_markup(
    client: TestClient, ui_data: UiData
) -> None:
    for path in (
        f"/b/{ui_data.web}/rows?cols=id,exp_data.messages",
        f"/b/{ui_data.web}/task?id=shop-1",
        f"/b/{ui_data.web}/row?id={ui_data.xss_row}",
    ):
        text = client.get(path).text
        assert XSS not in text and "onerror=alert" not in text.replace("onerror=alert(1)&gt;", "")


def test_buffer_names_that_need_quoting_work_everywhere(db_url: str, buffer_name: str) -> None:
    name = buffer_name + " a&b?c#d"
    with ReplayBuffer(db_url, name=name) as buffer:
        buffer.store_batch([make_row("t0", step=i) for i in range(3)])
    client = viewer(make_app(db_url), raise_server_exceptions=False)
    home = client.get("/?all=1")
    hrefs = links(home.text, r'href="(/b/[^"]*' + re.escape(buffer_name) + r'[^"]*/rows)"')
    assert hrefs and client.get(hrefs[0]).status_code == 200
    page = client.get(hrefs[0])
    for href in links(page.text, r'href="(/b/[^"]+/(?:row|task)\?[^"]+)"'):
        assert client.get(href).status_code == 200, href


def test_next_trajectory_follows_first_rows_when_tasks_interleave(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        order = ["A", "B", "A", "B", "A", "C", "B", "C"]
        buffer.store_batch([make_row(t, step=i) for i, t in enumerate(order)])
    client = viewer(make_app(db_url))
    seen, task = [], "A"
    while task is not None and len(seen) < 10:
        seen.append(task)
        page = client.get(f"/b/{buffer_name}/task?id={task}")
        nxt = links(page.text, r'id="next" href="/b/[^/]+/task\?id=([^&"]+)"')
        task = nxt[0] if nxt else None
    assert seen == ["A", "B", "C"]
    back = client.get(f"/b/{buffer_name}/task?id=C")
    assert links(back.text, r'id="previous" href="/b/[^/]+/task\?id=([^&"]+)"') == ["B"]


def test_small_uint8_arrays_get_no_thumbnail_and_errors_get_the_headers(
    db_url: str, buffer_name: str
) -> None:
    with ReplayBuffer(db_url, name=buffer_name) as buffer:
        buffer.store_batch(
            [
                make_row(
                    "t",
                    state={
                        "grid": np.zeros((4, 4, 3), np.uint8),
                        "mask": np.ones((1, 900), np.uint8),
                    },
                )
            ]
        )
    client = viewer(make_app(db_url), raise_server_exceptions=False)
    page = client.get(f"/b/{buffer_name}/rows")
    assert "uint8 4x4x3" in page.text and 'class="thumb"' not in page.text
    missing = client.get(f"/b/{buffer_name}/row?id=nope")
    assert missing.status_code == 404
    assert "default-src 'none'" in missing.headers["content-security-policy"]


def test_a_delete_from_another_site_is_refused(ui_data: UiData) -> None:
    client = viewer(make_app(ui_data.url, allow_delete=True), raise_server_exceptions=False)
    forged = client.post(
        f"/b/{ui_data.web}/delete",
        data={"id": "web-0-0", "confirm": "web-0-0"},
        headers={"Origin": "http://evil.example"},
    )
    assert forged.status_code == 403
    with ReplayBuffer(ui_data.url, name=ui_data.web) as buffer:
        assert buffer.get("web-0-0") is not None
    mine = client.post(
        f"/b/{ui_data.web}/delete",
        data={"id": "web-0-0", "confirm": "web-0-0"},
        headers={"Origin": BASE},
        follow_redirects=False,
    )
    assert mine.status_code == 303


def test_the_stylesheet_comes_in_the_page_and_its_policy_allows_it_alone(
    client: TestClient, ui_data: UiData
) -> None:
    """Each page carries the stylesheet in its head (a fresh tab paints without a request
    for it), and the Content-Security-Policy allows that one style element by the hash of
    its text, as a browser computes it, and no other inline style."""
    import base64
    import hashlib

    for path in ("/?all=1", f"/b/{ui_data.web}", f"/b/{ui_data.web}/row?id={ui_data.xss_row}"):
        page = client.get(path)
        assert page.status_code == 200
        styles = re.findall(r"<style>(.*?)</style>", page.text, re.S)
        assert len(styles) == 1 and ".top" in styles[0]
        digest = hashlib.sha256(styles[0].encode()).digest()
        policy = page.headers["content-security-policy"]
        style_src = next(p for p in policy.split(";") if p.strip().startswith("style-src"))
        assert style_src.split() == [
            "style-src",
            "'self'",
            f"'sha256-{base64.b64encode(digest).decode()}'",
        ]
        assert "unsafe-inline" not in policy
