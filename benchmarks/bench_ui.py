"""Benchmark: the viewer (``expstore ui``) on a 10M-row buffer (issue: the trajectory viewer).

On the scale data set (``scale_data.py``: 10M small rows, built once into ``--scratch``) plus
a buffer of web-agent trajectories of 30 steps, each step with a 720p screenshot (the real
page screenshots in ``--screens`` if there are any, else drawn ones), it serves the viewer
in this process (uvicorn on a local port) and measures:

- **rows page server time**: the time the server takes for ``/b/scale/rows`` with a filter
  (on an indexed column, and on a JSON path), on the first page and 200 pages in (by the
  cursors the pages give), sorted by key and by step; median of ``--repeat`` requests;
- **trajectory first paint**: headless Chromium opens a 30-step trajectory with its
  screenshots; the browser's first-contentful-paint, and when every screenshot in view has
  loaded;
- **live page cost**: one tab open on the live page for ``--live-s`` seconds; the statements
  the server ran against the database, per second (every statement on the viewer's
  engines is counted);
- **a 50-row page with thumbnails** (issue 48: ≤ 1 s warm on SQLite): a fresh Chromium
  tab (no browser cache) opens ``/rows?limit=50`` of 720p screenshot rows, until every
  thumbnail has loaded; cold (the server's first time) and warm (its thumbnail cache
  filled), median of 5;
- **a 300-step trajectory** (≤ 300 ms to first paint): a fresh tab opens a 300-step
  trajectory of screenshot steps with chat; first contentful paint, and the HTML's size.

Usage::

    python benchmarks/bench_ui.py                       # 10M rows, SQLite
    python benchmarks/bench_ui.py --rows 1000000
    python benchmarks/bench_ui.py --pages-only          # the two browser figures alone
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import numpy as np
from sqlalchemy import event
from sqlalchemy.engine import Engine

from expstore import DataRow, Experience, ExpMeta, ReplayBuffer

STEPS = 30


def screenshots(folder: Path, n: int) -> list[np.ndarray]:
    """``n`` 720p screenshots: the real ones in ``folder`` if any, else drawn pages."""
    found = sorted(folder.glob("*.png")) if folder.is_dir() else []
    if found:
        from PIL import Image

        shots = [np.asarray(Image.open(p).convert("RGB"))[:720, :1280] for p in found[:n]]
        return [shots[i % len(shots)] for i in range(n)]
    out = []
    for i in range(n):
        image = np.full((720, 1280, 3), 245, np.uint8)
        image[:60] = (36, 88, 179)
        image[100 + 15 * i : 140 + 15 * i, 100:900] = (200, 210, 220)
        out.append(image)
    return out


def web_buffer(url: str, screens: Path) -> str:
    with ReplayBuffer(url, name="web") as web:
        if len(web) >= STEPS:
            return "web"
        shots = screenshots(screens, STEPS)
        web.store_batch(
            [
                DataRow(
                    id=f"traj-{s}",
                    exp_meta=ExpMeta(task_id="traj", agent_id="browser-agent", step=s),
                    exp_data=Experience(
                        state={"url": f"https://docs.python.org/{s}", "screenshot": shots[s]},
                        actions=[{"name": "click", "x": 10 * s, "y": 300}],
                        reward_t=float(s == STEPS - 1),
                        messages=[
                            {"role": "user", "content": "Find the tutorial on classes"},
                            {"role": "assistant", "content": f"step {s}: click the link"},
                        ],
                    ),
                )
                for s in range(STEPS)
            ]
        )
    return "web"


LONG = 300


def pages_buffer(url: str) -> None:
    """``shots``: 60 rows of distinct 720p screenshots (for the 50-row page); ``long``: a
    300-step trajectory of screenshots with a growing chat."""
    with ReplayBuffer(url, name="shots") as shots:
        if not len(shots):
            drawn = screenshots(Path("/nonexistent"), 60)
            for i, image in enumerate(drawn):
                image[300:340, 10 * i : 10 * i + 300] = (60, 160, 90)
            shots.store_batch(
                [
                    DataRow(
                        id=f"shot-{i}",
                        exp_meta=ExpMeta(task_id=f"t{i // 6}", agent_id="agent", step=i % 6),
                        exp_data=Experience(
                            state={"url": f"https://shop.example/{i}", "screenshot": drawn[i]},
                            reward_t=float(i % 6 == 5),
                        ),
                    )
                    for i in range(60)
                ]
            )
    with ReplayBuffer(url, name="long") as long:
        if not len(long):
            drawn = screenshots(Path("/nonexistent"), 30)
            said: list[dict[str, Any]] = [
                {"role": "system", "content": "You are a web agent."},
                {"role": "user", "content": "Find the tutorial on classes"},
            ]
            rows = []
            for s in range(LONG):
                said = said + [{"role": "assistant", "content": f"<think>step {s}</think>click"}]
                rows.append(
                    DataRow(
                        id=f"long-{s}",
                        exp_meta=ExpMeta(task_id="long", agent_id="agent", step=s),
                        exp_data=Experience(
                            state={"url": f"https://docs/{s}", "screenshot": drawn[s % 30]},
                            actions=[{"name": "click", "x": 10 + s, "y": 300}],
                            reward_t=float(s == LONG - 1),
                            messages=said[-8:],
                        ),
                    )
                )
            long.store_batch(rows)


def rows_page_load(base: str, repeat: int = 5) -> str:
    """A fresh tab per load (no browser cache): the 50-row page until every thumbnail has
    loaded; the first load is the server's cold one."""
    from playwright.sync_api import sync_playwright

    path = base + "/b/shots/rows?limit=50"
    times = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        for _ in range(repeat + 1):
            context = browser.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=True)
            tab = context.new_page()
            t0 = time.perf_counter()
            tab.goto(path, wait_until="commit")
            tab.wait_for_function(
                "document.querySelectorAll('img.thumb').length === 50 && "
                "[...document.querySelectorAll('img.thumb')]"
                ".every(i => i.complete && i.naturalWidth > 0)",
                polling=5,
            )
            times.append((time.perf_counter() - t0) * 1000)
            context.close()
        browser.close()
    return (
        f"  50-row page, 50 thumbnails of 720p screenshots, fresh tab: cold {times[0]:.0f} ms, "
        f"warm {statistics.median(times[1:]):.0f} ms (median of {repeat}; target ≤ 1000 ms)"
    )


def first_paints(
    base: str, path: str, repeat: int, after: str | None = None
) -> tuple[list[float], list[float]]:
    """First contentful paint and load event (ms) of ``path``, each in a fresh tab (that
    opened ``after`` first, when given: the stylesheet is then in its cache)."""
    from playwright.sync_api import sync_playwright

    paints, loads = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        for _ in range(repeat):
            context = browser.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=True)
            tab = context.new_page()
            if after is not None:
                tab.goto(base + after)
            t0 = time.perf_counter()
            tab.goto(base + path, wait_until="commit")
            tab.wait_for_function(
                "performance.getEntriesByName('first-contentful-paint').length > 0", polling=5
            )
            paints.append(
                tab.evaluate("performance.getEntriesByName('first-contentful-paint')[0].startTime")
            )
            tab.wait_for_load_state("load")
            loads.append((time.perf_counter() - t0) * 1000)
            context.close()
        browser.close()
    return paints, loads


def long_trajectory_paint(base: str, repeat: int = 7) -> str:
    """The 300-step trajectory's first paint, beside the buffers page's (a 1 KiB page: the
    floor the browser and the machine set), and the server's time for the whole page."""
    import urllib.request

    path = "/b/long/task?id=long"
    size = len(urllib.request.urlopen(base + path).read())  # also warms the server
    server = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        urllib.request.urlopen(base + path).read()
        server.append((time.perf_counter() - t0) * 1000)
    paints, loads = first_paints(base, path, repeat)
    floor, _ = first_paints(base, "/?all=1", repeat)
    warm, _ = first_paints(base, path, repeat, after="/b/long/tasks")
    return (
        f"  trajectory of {LONG} steps (screenshots, chat), {size / 1024:.0f} KiB of HTML, "
        f"streamed: first contentful paint {statistics.median(paints):.0f} ms in a fresh tab "
        f"(target ≤ 300 ms; the 1 KiB buffers page: {statistics.median(floor):.0f} ms), "
        f"{statistics.median(warm):.0f} ms opened from the tasks page (stylesheet cached), "
        "load event "
        f"{statistics.median(loads):.0f} ms, whole page read by a client "
        f"{statistics.median(server):.0f} ms (medians of {repeat}, fresh tabs)"
    )


def pages_only(scratch: Path) -> None:
    from expstore.ui import make_app

    scratch.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{scratch / 'ui_pages.db'}"
    t0 = time.perf_counter()
    pages_buffer(url)
    print(
        f"sqlite, 60 screenshot rows + a {LONG}-step trajectory (built in "
        f"{time.perf_counter() - t0:.1f} s):",
        flush=True,
    )
    server, base = serve(make_app(url))
    try:
        print(f"  (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
        print(rows_page_load(base), flush=True)
        print(long_trajectory_paint(base), flush=True)
    finally:
        server.should_exit = True


class Counter:
    """Counts the statements every engine of this process runs."""

    def __init__(self) -> None:
        self.n = 0
        event.listen(Engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        self.n += 1


def serve(app: Any) -> tuple[Any, str]:
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    return server, f"http://127.0.0.1:{port}"


def timed(client: Any, path: str, repeat: int) -> tuple[float, Any]:
    """Median server time (ms) of ``repeat`` GETs of ``path`` (after one warm-up)."""
    last = client.get(path)
    assert last.status_code == 200, (path, last.status_code, last.text[:500])
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        last = client.get(path)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000, last


def rows_pages(client: Any, repeat: int) -> list[str]:
    import re

    out = []
    cases = [
        ("indexed filter, by key", {"where": "agent_id = 'agent3'"}),
        ("JSON filter, by key", {"where": "exp_data.state.difficulty = 3"}),
        (
            "two filters, by step (sorts every match)",
            {"where": "agent_id = 'agent3' and step >= 4", "order": "step"},
        ),
        ("no filter, newest first", {"order": "-key"}),
    ]
    for name, query in cases:
        first, page = timed(client, "/b/scale/rows?" + urlencode(query), repeat)
        cursor = None
        for _ in range(200):  # 200 pages in, by the pages' own cursors
            nxt = re.search(r'id="next" href="([^"]+)"', page.text)
            assert nxt is not None
            page = client.get(nxt.group(1).replace("&amp;", "&"))
            cursor = nxt.group(1).replace("&amp;", "&")
        assert cursor is not None
        deep, _ = timed(client, cursor, repeat)
        out.append(f"  rows page, {name}: first page {first:.1f} ms, page 201 {deep:.1f} ms")
    return out


def first_paint(base: str) -> str:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900}, bypass_csp=True)
        page.goto(base + "/b/web/task?id=traj")  # warm: the server's caches
        paints, loaded = [], []
        for _ in range(3):
            fresh = browser.new_page(viewport={"width": 1280, "height": 900}, bypass_csp=True)
            t0 = time.perf_counter()
            fresh.goto(base + "/b/web/task?id=traj", wait_until="commit")
            fresh.wait_for_function(
                "performance.getEntriesByName('first-contentful-paint').length > 0"
            )
            paints.append(
                fresh.evaluate(
                    "performance.getEntriesByName('first-contentful-paint')[0].startTime"
                )
            )
            fresh.wait_for_function(
                "[...document.querySelectorAll('img.shot')].filter(i => {"
                " const r = i.getBoundingClientRect(); return r.top < innerHeight; })"
                ".every(i => i.complete && i.naturalWidth > 0)"
            )
            loaded.append((time.perf_counter() - t0) * 1000)
            fresh.close()
        browser.close()
    return (
        f"  trajectory of {STEPS} steps with 720p screenshots: first contentful paint "
        f"{statistics.median(paints):.0f} ms, screenshots in view loaded "
        f"{statistics.median(loaded):.0f} ms (median of 3, server warm)"
    )


def live_cost(base: str, counter: Counter, seconds: float, every: float) -> str:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(bypass_csp=True)  # the probes evaluate strings
        page.goto(base + "/b/scale/live")
        page.wait_for_function("document.getElementById('rows').textContent !== '…'")
        before, t0 = counter.n, time.monotonic()
        time.sleep(seconds)
        spent, n = time.monotonic() - t0, counter.n - before
        second = browser.new_page(bypass_csp=True)  # a second tab shares the snapshots
        second.goto(base + "/b/scale/live")
        before2, t1 = counter.n, time.monotonic()
        time.sleep(seconds)
        spent2, n2 = time.monotonic() - t1, counter.n - before2
        browser.close()
    return (
        f"  live page (refresh every {every:g} s): one tab {n / spent:.2f} statements/s, "
        f"two tabs {n2 / spent2:.2f} statements/s ({n} and {n2} in {seconds:g} s each)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--scratch", type=Path, default=Path("/work/scratch/bench"))
    parser.add_argument("--screens", type=Path, default=Path("/work/scratch/screens"))
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--live-s", type=float, default=30.0)
    parser.add_argument("--live-every", type=float, default=5.0)
    parser.add_argument("--pages-only", action="store_true")
    args = parser.parse_args()
    if args.pages_only:
        pages_only(args.scratch)
        return
    from scale_data import built, dataset_url
    from starlette.testclient import TestClient

    from expstore.ui import make_app

    url = built(dataset_url("sqlite", args.rows, args.scratch, ""), args.rows)
    web_buffer(url, args.screens)
    counter = Counter()
    app = make_app(url, live_every=args.live_every)
    print(f"sqlite, {args.rows:,} rows (buffer 'scale') + {STEPS} screenshot steps ('web'):")
    client = TestClient(app)
    for line in rows_pages(client, args.repeat):
        print(line, flush=True)
    server, base = serve(app)
    try:
        print(first_paint(base), flush=True)
        print(live_cost(base, counter, args.live_s, args.live_every), flush=True)
    finally:
        server.should_exit = True


if __name__ == "__main__":
    main()
