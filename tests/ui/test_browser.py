"""The viewer in a real browser: headless Chromium (Debian's package) driven by Playwright,
against a server on a local port, as a person would use it. Each page's screenshot is
taken (into the test's folder: the README's screenshots in docs/ui/ come from
scripts/ui_demo.py, over a database it builds).

Skipped, saying why, where Playwright or Chromium is missing; with
EXPSTORE_REQUIRE_BROWSER=1 (as .ci/run sets it) that is a failure instead."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from tests.helpers import make_row
from tests.ui.conftest import UiData, screenshot

ROOT = Path(__file__).resolve().parents[2]
ATTACKER = "attacker.example"
CHROMIUM = next(
    (
        p
        for p in (
            os.environ.get("EXPSTORE_CHROMIUM"),
            "/usr/bin/chromium",
            shutil.which("chromium"),
        )
        if p and Path(p).exists()
    ),
    None,
)


def _why_not() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        return f"the browser tests need playwright and uvicorn ({exc.name} is missing)"
    if CHROMIUM is None:
        return "no Chromium found (apt-get install chromium, or set EXPSTORE_CHROMIUM)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    why = _why_not()
    if why is not None:
        if os.environ.get("EXPSTORE_REQUIRE_BROWSER"):
            pytest.fail(f"EXPSTORE_REQUIRE_BROWSER is set but {why}")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # attacker.example resolves to this machine, as a DNS-rebinding site makes its name do
        rules = f"--host-resolver-rules=MAP {ATTACKER} 127.0.0.1"
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", rules])
        yield launched
        launched.close()


@pytest.fixture
def db_url(tmp_path: Path) -> str:  # one backend is enough here: test_app.py runs both
    return f"sqlite:///{tmp_path / 'ui.db'}"


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn on a free loopback port, for the length of the block."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=run.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not run.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        run.should_exit = True
        thread.join(10)


@pytest.fixture
def server(ui_data: UiData) -> Iterator[str]:
    from expstore.ui import make_app

    with serve(make_app(ui_data.url, live_every=0.5)) as url:
        yield url


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[Any]:
    # The page's Content-Security-Policy would refuse the test's own probes (eval); without
    # it, the XSS test checks that escaping alone keeps a stored script inert.
    context = browser.new_context(viewport={"width": 1280, "height": 860}, bypass_csp=True)
    opened = context.new_page()
    opened.dialogs = []  # type: ignore[attr-defined]
    opened.on("dialog", lambda d: (opened.dialogs.append(d.message), d.dismiss()))
    yield opened
    context.close()


def shoot(page: Any, name: str, tmp_path: Path) -> None:
    """A screenshot of the page as it is, into the test's folder."""
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(tmp_path / f"{name}.png"))
    assert (tmp_path / f"{name}.png").stat().st_size > 10_000  # a page, not a blank


def test_the_buffers_page(page: Any, server: str, ui_data: UiData, tmp_path: Path) -> None:
    page.goto(server + "/?all=1")
    names = page.locator("#buffers tbody tr td:first-child a").all_inner_texts()
    assert names == [ui_data.web, ui_data.groups]
    page.get_by_role("link", name=ui_data.web).click()
    page.wait_for_url(f"**/b/{ui_data.web}/rows")
    page.go_back()
    shoot(page, "buffers", tmp_path)


def test_a_filtered_rows_page_and_its_next_page(
    page: Any, server: str, ui_data: UiData, tmp_path: Path
) -> None:
    page.goto(f"{server}/b/{ui_data.web}/rows")
    page.fill("input[name=where]", "step >= 2")
    page.fill("input[name=limit]", "4")
    page.click("button[type=submit]")
    page.wait_for_selector("#rows tbody tr")
    first = page.locator("#rows tbody tr td:nth-child(2)").all_inner_texts()
    assert first == ["web-0-2", "web-0-3", "web-1-2", "web-1-3"]
    thumbs = page.locator("#rows img.thumb")
    assert thumbs.count() == 4
    page.wait_for_function(
        "[...document.querySelectorAll('#rows img.thumb')]"
        ".every(i => i.complete && i.naturalWidth > 0)"
    )
    shoot(page, "rows", tmp_path)
    page.click("#next")
    page.wait_for_selector("#rows tbody tr")
    assert page.locator("#rows tbody tr td:nth-child(2)").all_inner_texts() == [
        "web-2-2",
        "web-2-3",
        "web-3-2",
        "web-3-3",
    ]
    assert page.input_value("input[name=where]") == "step >= 2"


def test_a_syntax_error_is_shown_with_its_caret(
    page: Any, server: str, ui_data: UiData, tmp_path: Path
) -> None:
    page.goto(f"{server}/b/{ui_data.web}/rows")
    page.fill("input[name=where]", "reward_t >> 0")
    page.click("button[type=submit]")
    shown = page.locator("#where-error pre").inner_text().splitlines()
    assert shown[1].strip() == "reward_t >> 0"
    assert shown[2].index("^") == shown[1].index(">>") + 1
    shoot(page, "where-error", tmp_path)


def test_a_trajectory_with_its_screenshots(
    page: Any, server: str, ui_data: UiData, tmp_path: Path
) -> None:
    page.goto(f"{server}/b/{ui_data.web}/rows")
    page.get_by_role("link", name="shop-1").first.click()
    page.wait_for_selector("#steps")
    assert page.locator("#steps .step").count() == 4
    page.wait_for_function(
        "[...document.querySelectorAll('#steps img.shot')]"
        ".every(i => i.complete && i.naturalWidth === 320)"
    )
    assert "<script>" in page.locator("#steps").inner_text()  # the agent's text, as text
    # each click drawn where it landed: (100 + step, 200) of 1280x720, on a 320-wide shot
    for step in range(4):
        shot = page.locator(f"#step-{step} img.shot").bounding_box()
        mark = page.locator(f"#step-{step} circle.mark-dot").bounding_box()
        assert shot is not None and mark is not None
        middle = (mark["x"] + mark["width"] / 2, mark["y"] + mark["height"] / 2)
        assert middle[0] == pytest.approx(shot["x"] + 1 + (100 + step) / 4, abs=1.5)
        assert middle[1] == pytest.approx(shot["y"] + 1 + 200 / 4, abs=1.5)
    shoot(page, "trajectory", tmp_path)
    page.click("#next")
    page.wait_for_url("**task?id=shop-2")
    assert "shop-2" in page.locator("h1").inner_text()


def test_rows_keep_headers_and_short_values_whole_and_long_ids_inside(
    page: Any, server: str, ui_data: UiData
) -> None:
    """Headers and short values are never split mid-word, and a long id neither splits
    nor pushes the table out of the page: it is cut with an ellipsis (whole in its
    tooltip), and the row still opens from its key."""
    name = ui_data.web + "_wide"
    long_id = "run-2026-11-28/" + "0123456789abcdef" * 6
    with ReplayBuffer(ui_data.url, name=name) as buffer:
        buffer.store_batch(
            [
                DataRow(
                    id=long_id if i == 0 else f"r{i}",
                    exp_meta=ExpMeta(
                        task_id=f"shopping-task-{i}", agent_id="browser-agent", step=i
                    ),
                    exp_data=Experience(
                        state={"url": "https://shop.example/" + "a/" * 60},
                        reward_t=0.25,
                    ),
                )
                for i in range(3)
            ]
        )
    page.set_viewport_size({"width": 900, "height": 700})
    cols = "id,task_id,agent_id,step,reward_t,policy_version,execute_time,done,exp_data.state"
    page.goto(f"{server}/b/{name}/rows?cols={cols}")
    layout = page.evaluate(
        """() => {
          const lines = el => { const r = document.createRange(); r.selectNodeContents(el);
            return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size; };
          const table = document.querySelector('#rows').getBoundingClientRect();
          const main = document.querySelector('main');
          return {
            headers: [...document.querySelectorAll('#rows th')].map(lines),
            short: [...document.querySelectorAll('#rows td.short')].map(lines),
            ids: [...document.querySelectorAll('#rows td.id')].map(td => ({
              lines: lines(td), right: td.getBoundingClientRect().right })),
            tableRight: table.right,
            overflow: main.scrollWidth - main.clientWidth,
          };
        }"""
    )
    assert set(layout["headers"]) == {1}
    assert layout["short"] and max(layout["short"]) == 1  # (an empty cell has none)
    assert {i["lines"] for i in layout["ids"]} == {1}
    assert max(i["right"] for i in layout["ids"]) <= layout["tableRight"] + 0.5
    assert layout["overflow"] <= 0  # nothing sticks out of the page
    assert page.locator("#rows td.id").first.get_attribute("title") == long_id
    page.locator("#rows a.open").first.click()
    page.wait_for_url("**/row?id=**")
    assert long_id in page.locator("h1").inner_text()


def test_a_50_row_page_of_thumbnails_loads_within_a_second_or_so_warm(
    browser: Any, ui_data: UiData
) -> None:
    """50 rows of 720p screenshots, thumbnails and all, in a fresh tab (no browser cache)
    once the server has made them: the thumbnails come from its cache (the target is 1 s;
    the bound here leaves room for a busy CI machine)."""
    from expstore.ui import make_app

    name = ui_data.web + "_fifty"
    with ReplayBuffer(ui_data.url, name=name) as buffer:
        buffer.store_batch(
            [
                DataRow(
                    id=f"f{i}",
                    exp_meta=ExpMeta(task_id=f"t{i // 5}", agent_id="a", step=i % 5),
                    exp_data=Experience(state={"screenshot": screenshot(i % 10, i // 10)}),
                )
                for i in range(50)
            ]
        )
    app = make_app(ui_data.url)
    loaded = (
        "document.querySelectorAll('img.thumb').length === 50 && "
        "[...document.querySelectorAll('img.thumb')].every(i => i.complete && i.naturalWidth)"
    )
    with serve(app) as viewer:
        times = []
        for _ in range(3):  # cold, then warm twice
            context = browser.new_context(bypass_csp=True)
            tab = context.new_page()
            t0 = time.perf_counter()
            tab.goto(f"{viewer}/b/{name}/rows?limit=50", wait_until="commit")
            tab.wait_for_function(loaded, polling=10)
            times.append(time.perf_counter() - t0)
            context.close()
    assert min(times[1:]) < 2.5, times


def test_a_grpo_group(page: Any, server: str, ui_data: UiData, tmp_path: Path) -> None:
    page.goto(f"{server}/b/{ui_data.groups}/group?key=prompt0")
    cards = page.locator("#group .completion")
    assert cards.count() == 4
    assert page.locator("#group .completion.won").count() == 2  # reward above the mean
    assert "leased by learner-0" in cards.first.inner_text()
    shoot(page, "group", tmp_path)


def test_the_live_page_updates_after_a_write(
    page: Any, server: str, ui_data: UiData, tmp_path: Path
) -> None:
    page.goto(f"{server}/b/{ui_data.groups}/live")
    page.wait_for_function("document.getElementById('rows').textContent === '24'")
    assert page.locator("#claims tbody tr").first.inner_text().split() == ["learner-0", "4", "0"]
    assert page.locator("#chart-reward svg").count() == 1
    shoot(page, "live", tmp_path)
    with ReplayBuffer(ui_data.url, name=ui_data.groups) as buffer:
        buffer.store_batch(
            [
                DataRow(
                    exp_meta=ExpMeta(task_id="later", agent_id="c0", step=i, policy_version=3),
                    exp_data=Experience(reward_t=1.0),
                )
                for i in range(6)
            ]
        )
    page.wait_for_function("document.getElementById('rows').textContent === '30'", timeout=15_000)
    assert page.url.endswith("/live")  # no reload: the same page


def test_an_xss_attempt_is_inert(page: Any, server: str, ui_data: UiData) -> None:
    for path in (
        f"/b/{ui_data.web}/row?id={ui_data.xss_row}",
        f"/b/{ui_data.web}/task?id=shop-1",
        f"/b/{ui_data.web}/rows?cols=id,exp_data.messages",
    ):
        page.goto(server + path)
        page.wait_for_load_state("networkidle")
        assert page.evaluate("window.__pwned") is None
        assert page.locator("img[src=x]").count() == 0
        assert "window.__pwned = 1" in page.locator("main").inner_text()
    assert page.dialogs == []


def test_a_rebinding_site_reads_nothing_and_deletes_nothing(browser: Any, ui_data: UiData) -> None:
    """A page of another site whose name resolves to this machine (DNS rebinding) is
    answered 400 on every route; its form posted to the viewer deletes nothing; the
    viewer's own delete form, in the same browser, works."""
    from expstore.ui import make_app

    context = browser.new_context()
    page = context.new_page()
    with serve(make_app(ui_data.url, allow_delete=True)) as viewer:
        port = viewer.rsplit(":", 1)[1]
        rebound = f"http://{ATTACKER}:{port}"
        for path in ("/?all=1", f"/b/{ui_data.web}/rows", f"/b/{ui_data.groups}/live.json"):
            answer = page.goto(rebound + path)
            assert answer is not None and answer.status == 400, path
            assert "DNS rebinding" in page.content() and "web-0-0" not in page.content()
        read = page.evaluate(
            "url => fetch(url).then(r => r.status)", f"{rebound}/b/{ui_data.web}/rows"
        )
        assert read == 400
        # another site's page posts the delete form to the viewer's real address
        forged = (
            f'<form id="f" method="post" action="{viewer}/b/{ui_data.web}/delete">'
            '<input name="id" value="web-0-0"><input name="confirm" value="web-0-0"></form>'
            "<script>document.getElementById('f').submit()</script>"
        )
        page.route(
            f"http://{ATTACKER}/**",
            lambda route: route.fulfill(body=forged, content_type="text/html"),
        )
        with page.expect_navigation(url=f"**/b/{ui_data.web}/delete"):
            page.goto(f"http://{ATTACKER}/win-a-prize")
        assert "nothing was deleted" in page.content()
        with ReplayBuffer(ui_data.url, name=ui_data.web) as buffer:
            assert buffer.get("web-0-0") is not None
        # the viewer's own form: the browser sends its Origin, and the row goes
        page.goto(f"{viewer}/b/{ui_data.web}/row?id=web-0-0")
        page.fill("input[name=confirm]", "web-0-0")
        page.click("form.danger button")
        page.wait_for_url(f"**/b/{ui_data.web}/rows")
        with ReplayBuffer(ui_data.url, name=ui_data.web) as buffer:
            assert buffer.get("web-0-0") is None and len(buffer) == 19
    context.close()


def test_buffer_names_a_browser_would_rewrite_open_from_their_links(
    page: Any, server: str, ui_data: UiData
) -> None:
    """'..' and '.' (which browsers resolve away, encoded or not), a name with '/' (which
    servers decode before routing) and one holding '%2e%2e' each open their own rows."""
    names = ["..", ".", "runs/web/2026", "x %2e%2e"]
    for i, name in enumerate(names):
        with ReplayBuffer(ui_data.url, name=name) as buffer:
            buffer.store_batch([make_row(f"task-of-{i}", step=s) for s in range(2)])
    for name in names:
        page.goto(server + "/?all=1")
        page.get_by_role("link", name=name, exact=True).click()
        page.wait_for_url("**/rows")
        assert page.locator("header nav b").inner_text() == name
        assert f"task-of-{names.index(name)}" in page.locator("main").inner_text()
        page.locator("a", has_text=f"task-of-{names.index(name)}").first.click()
        page.wait_for_url("**/task?**")
        assert page.locator("header nav b").inner_text() == name
