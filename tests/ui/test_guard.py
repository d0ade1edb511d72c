"""The viewer closed to other hosts and origins, on both backends: a Host header that is
not one of the viewer's names gets a 400 and no data on every route (DNS rebinding); a
delete that names no origin, or that a browser marks as cross-site, deletes nothing; a
cursor nested thousands deep is a 400; every error page, a crash's included, carries the
security headers; buffer names that can't be path segments ("..", "a/b") are linked in a
form that opens them, and a path that names no page says why."""

from __future__ import annotations

import base64
import html
import re

import pytest

from expstore import ReplayBuffer

pytest.importorskip("starlette", reason="the viewer's tests need the ui extra")
from starlette.testclient import TestClient  # noqa: E402

from expstore.errors import InvalidArgumentError  # noqa: E402
from expstore.ui import buffer_segment, make_app  # noqa: E402
from tests.helpers import make_row  # noqa: E402
from tests.ui.conftest import UiData  # noqa: E402

BASE = "http://localhost:8765"
FOREIGN = "attacker.example:8765"


def client_of(app: object, base: str = BASE) -> TestClient:
    return TestClient(app, base_url=base, raise_server_exceptions=False)  # type: ignore[arg-type]


def routes(data: UiData) -> list[str]:
    """A URL of every kind of page the viewer serves."""
    image = "exp_data.state.screenshot"
    return [
        "/",
        "/?all=1",
        f"/b/{data.web}",
        f"/b/{data.web}/rows",
        f"/b/{data.web}/row?id=web-0-0",
        f"/b/{data.web}/task?id=shop-0",
        f"/b/{data.groups}/group?key=prompt0",
        f"/b/{data.web}/image?id=web-0-0&path={image}",
        f"/b/{data.web}/image?id=web-0-0&path={image}&thumb=1",
        f"/b/{data.groups}/live",
        f"/b/{data.groups}/live.json",
        "/static/ui.css",
        "/nowhere",
    ]


def assert_guarded(response: object) -> None:
    headers = response.headers  # type: ignore[attr-defined]
    assert "default-src 'none'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"


def test_every_route_refuses_a_host_that_is_not_the_viewers(ui_data: UiData) -> None:
    client = client_of(make_app(ui_data.url, allow_delete=True))
    for path in routes(ui_data):
        mine = client.get(path)
        assert mine.status_code in (200, 404), (path, mine.status_code)
        foreign = client.get(path, headers={"Host": FOREIGN})
        assert foreign.status_code == 400, path
        assert "DNS rebinding" in foreign.text and "web-0-0" not in foreign.text
        assert not foreign.content.startswith(b"\x89PNG")
        assert_guarded(foreign)
    # the delete form, with an Origin that matches the forged Host as a rebinding page's would
    forged = client.post(
        f"/b/{ui_data.web}/delete",
        data={"id": "web-0-0", "confirm": "web-0-0"},
        headers={"Host": FOREIGN, "Origin": f"http://{FOREIGN}"},
    )
    assert forged.status_code == 400
    for host in ("", "attacker.example", "localhost.attacker.example:8765", "[::1", "127.0.0.2"):
        assert client.get("/?all=1", headers={"Host": host}).status_code == 400, host
    with ReplayBuffer(ui_data.url, name=ui_data.web) as buffer:
        assert buffer.get("web-0-0") is not None and len(buffer) == 20


def test_the_names_a_viewer_answers_to_can_be_pinned_to_a_port(ui_data: UiData) -> None:
    app = make_app(ui_data.url, hosts=["localhost:8765", "[::1]:8765", "gpu-box"])
    client = client_of(app)
    for host in ("localhost:8765", "LOCALHOST:8765", "[::1]:8765", "gpu-box", "gpu-box:9000"):
        assert client.get("/?all=1", headers={"Host": host}).status_code == 200, host
    for host in ("localhost:8766", "localhost", "[::1]:80", "127.0.0.1:8765", "evil:8765"):
        assert client.get("/?all=1", headers={"Host": host}).status_code == 400, host
    pinned = client_of(make_app(ui_data.url, hosts=["localhost", "::1", "gpu-box:9000"], port=8765))
    for host in ("localhost:8765", "[::1]:8765", "gpu-box:9000"):
        assert pinned.get("/?all=1", headers={"Host": host}).status_code == 200, host
    for host in ("localhost:8766", "localhost", "[::1]:9000", "gpu-box:8765"):
        assert pinned.get("/?all=1", headers={"Host": host}).status_code == 400, host
    for bad in (["localhost:port"], ["[::1"], [":8765"], []):
        with pytest.raises(InvalidArgumentError, match="host"):
            make_app(ui_data.url, hosts=bad)


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ({}, "names no Origin or Referer"),
        ({"Sec-Fetch-Site": "cross-site"}, "'cross-site'"),
        ({"Sec-Fetch-Site": "same-site", "Origin": BASE}, "'same-site'"),
        ({"Origin": "null"}, "names no Origin or Referer"),
        ({"Origin": "http://evil.example"}, "evil.example"),
        ({"Origin": "http://localhost:8766"}, "localhost:8766"),
        ({"Origin": "https://localhost:8765"}, "https://localhost:8765"),
        ({"Referer": "http://evil.example/b/x/row?id=web-0-0"}, "evil.example"),
    ],
)
def test_a_delete_that_does_not_come_from_the_viewers_page_deletes_nothing(
    ui_data: UiData, headers: dict[str, str], why: str
) -> None:
    client = client_of(make_app(ui_data.url, allow_delete=True))
    refused = client.post(
        f"/b/{ui_data.web}/delete", data={"id": "web-0-0", "confirm": "web-0-0"}, headers=headers
    )
    assert refused.status_code == 403
    text = html.unescape(refused.text)
    assert why in text and "nothing was deleted" in text
    assert_guarded(refused)
    with ReplayBuffer(ui_data.url, name=ui_data.web) as buffer:
        assert buffer.get("web-0-0") is not None and len(buffer) == 20


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": BASE, "Sec-Fetch-Site": "same-origin"},
        {"Origin": "null", "Referer": f"{BASE}/b/x/row?id=web-0-1"},
        {"Referer": f"{BASE}/b/x/row?id=web-0-1"},
    ],
)
def test_a_delete_from_the_viewers_own_page_goes_through(
    ui_data: UiData, headers: dict[str, str]
) -> None:
    client = client_of(make_app(ui_data.url, allow_delete=True))
    done = client.post(
        f"/b/{ui_data.web}/delete",
        data={"id": "web-0-1", "confirm": "web-0-1"},
        headers=headers,
        follow_redirects=False,
    )
    assert done.status_code == 303
    with ReplayBuffer(ui_data.url, name=ui_data.web) as buffer:
        assert buffer.get("web-0-1") is None and len(buffer) == 19


def test_a_cursor_nested_deep_is_a_400_and_a_crash_a_500_both_with_the_headers(
    ui_data: UiData,
) -> None:
    app = make_app(ui_data.url)
    client = client_of(app)
    deep = base64.urlsafe_b64encode(b"[" * 3000 + b"]" * 3000).decode().rstrip("=")
    for cursor in (deep, "A" * 20_000):
        page = client.get(f"/b/{ui_data.web}/rows", params={"after": cursor})
        assert page.status_code == 400 and "page cursor" in html.unescape(page.text)
        assert_guarded(page)
    assert client.get(f"/b/{ui_data.web}/rows").status_code == 200

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in a page")

    app.state.viewer.rows = broken
    crashed = client.get(f"/b/{ui_data.web}/rows")
    assert crashed.status_code == 500 and "the viewer failed on this page" in crashed.text
    assert "a bug in a page" not in crashed.text  # the log has it, not the page
    assert_guarded(crashed)
    assert client.get(f"/b/{ui_data.web}/row?id=web-0-0").status_code == 200  # still serving


def test_names_that_cannot_be_path_segments_are_linked_so_they_open(
    db_url: str, buffer_name: str
) -> None:
    # (a name holding "%2e" is tried in a browser: the test client decodes paths twice)
    names = ["..", ".", buffer_name + "/a/b", "~" + buffer_name]
    for name in names:
        with ReplayBuffer(db_url, name=name) as buffer:
            buffer.store_batch([make_row(f"{buffer_name}-task", step=i) for i in range(2)])
    client = client_of(make_app(db_url))
    home = client.get("/?all=1").text
    for name in names:
        segment = buffer_segment(name)
        assert "/" not in segment and segment not in (".", "..")
        assert f'href="/b/{segment}/rows"' in home, name
        rows = client.get(f"/b/{segment}/rows")
        assert rows.status_code == 200, name
        assert f"<b>{html.escape(name, quote=False)}</b>" in rows.text
        for href in re.findall(r'href="(/b/[^"]+/(?:row|task|live)(?:\?[^"]*)?)"', rows.text):
            assert href.startswith(f"/b/{segment}/"), href
            assert client.get(html.unescape(href)).status_code == 200, href
    typed = client.get(f"/b/{buffer_name}/a/b/rows")
    assert typed.status_code == 404
    assert "cannot be typed into a path" in html.unescape(typed.text)
    assert_guarded(typed)
    garbage = client.get("/b/~%21%21/rows")
    assert garbage.status_code == 400 and "not a buffer name" in html.unescape(garbage.text)


def test_the_first_page_of_a_name_that_needs_encoding_redirects_to_it(
    db_url: str, buffer_name: str
) -> None:
    name = buffer_name + "/x"
    with ReplayBuffer(db_url, name=name) as buffer:
        buffer.store_batch([make_row("t", step=0)])
    client = client_of(make_app(db_url, buffer=name))
    first = client.get("/", follow_redirects=False)
    assert first.headers["location"] == f"/b/{buffer_segment(name)}/rows"
    assert client.get("/").status_code == 200
