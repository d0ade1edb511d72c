"""The viewer in a real browser: headless Chromium (Debian's package) driven by Playwright,
against a server on a local port, as a person would use it. Each page's screenshot is
taken; with EXPSTORE_UI_SCREENSHOTS=1 they are written to docs/ui/ (the README shows
them).

Skipped, saying why, where Playwright or Chromium is missing; with
EXPSTORE_REQUIRE_BROWSER=1 (as .ci/run sets it) that is a failure instead."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer
from tests.ui.conftest import UiData

ROOT = Path(__file__).resolve().parents[2]
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
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def db_url(tmp_path: Path) -> str:  # one backend is enough here: test_app.py runs both
    return f"sqlite:///{tmp_path / 'ui.db'}"


@pytest.fixture
def server(ui_data: UiData) -> Iterator[str]:
    import uvicorn

    from expstore.ui import make_app

    app = make_app(ui_data.url, live_every=0.5)
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
    yield f"http://127.0.0.1:{port}"
    run.should_exit = True
    thread.join(10)


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
    """A screenshot of the page as it is; into docs/ui/ when asked for."""
    page.wait_for_load_state("networkidle")
    folder = ROOT / "docs" / "ui" if os.environ.get("EXPSTORE_UI_SCREENSHOTS") else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"))
    assert (folder / f"{name}.png").stat().st_size > 10_000  # a page, not a blank


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
    shoot(page, "trajectory", tmp_path)
    page.click("#next")
    page.wait_for_url("**task?id=shop-2")
    assert "shop-2" in page.locator("h1").inner_text()


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
