"""The viewer's web app (Starlette): routes, pages, errors, and what is allowed.

Read-only unless made with ``allow_delete=True``; then a row's page offers a delete that
asks for the row's id typed again. Every page is rendered by Jinja2 with autoescape (a
stored ``<script>`` shows as text), served with a Content-Security-Policy that allows no
inline script and nothing from another origin, and with the templates, CSS and script
shipped in the wheel. Bad input (an unknown buffer, a malformed ``where``, an id that
does not exist, a page too large, a path outside the static folder) gets a page saying
what went wrong with a 4xx status; the server goes on serving.

The app answers only to the host names it is given (``hosts``: the loopback names by
default), so a page of another site that rebinds its own name to this machine's address
(DNS rebinding) gets a 400 and no data. A delete must carry an ``Origin`` (or ``Referer``)
naming the viewer itself; a POST that names none, or that a browser marks as coming from
another site, deletes nothing. Every response, errors and crashes included, carries the
security headers.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from .._optional import require
from ..errors import ExpstoreError, InvalidArgumentError, QueryError, UnsupportedTypeError
from ..model.images import looks_like_image
from ..model.paths import MISSING
from ..model.rows import DataRow
from ..query import Comparison
from . import charts, story
from .media import (
    PngCache,
    array_line,
    decode_data_url,
    images_in,
    is_array,
    preview,
    short_json,
)
from .reads import MAX_ROWS_SHOWN, ArrayRef, Brief, NotFound, Viewer, image_paths

__all__ = ["LOOPBACK_HOSTS", "buffer_segment", "make_app"]

#: The names a browser on this machine reaches a loopback-bound viewer by.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")

HERE = Path(__file__).resolve().parent
#: The stylesheet, written into each page's head (a fresh tab paints nothing before it has
#: its stylesheet: a request of its own cost a 300-step trajectory 150-300 ms of first
#: paint on a busy machine) and allowed by its hash alone.
_STYLE = (HERE / "static" / "ui.css").read_text(encoding="utf-8")
_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode("utf-8")).digest()).decode()
_CSP = (
    f"default-src 'none'; img-src 'self'; style-src 'self' 'sha256-{_STYLE_HASH}'; "
    "script-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'"
)
#: On every response. ``same-origin`` (not ``no-referrer``): a browser then sends the
#: viewer's own form posts with an Origin that names it (``no-referrer`` makes it "null"),
#: and tells no other site anything.
_SECURITY_HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}
_log = logging.getLogger("expstore.ui")


def make_app(
    url: str,
    *,
    buffer: str | None = None,
    allow_delete: bool = False,
    live_every: float = 5.0,
    hosts: Iterable[str] = LOOPBACK_HOSTS,
    port: int | None = None,
) -> Any:
    """The viewer of the database at ``url`` as an ASGI app (serve it with uvicorn).
    ``buffer``: where ``/`` leads (the buffers page without it). ``hosts``: the names
    requests may carry in their ``Host`` header, each ``name`` or ``name:port``; an IPv6
    address bare or in brackets (``[::1]:8765``). A name without a port is allowed on
    ``port`` (None: on any). Any other host gets a 400 (``expstore ui`` passes the names
    of the address it binds and its port)."""
    for module in ("starlette", "jinja2"):
        require(module, "the viewer (expstore ui)")
    from markupsafe import Markup
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles
    from starlette.templating import Jinja2Templates

    allowed = _host_list(hosts, port)
    viewer = Viewer(url, live_every=live_every)
    pngs = PngCache()
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.autoescape = True
    env.trim_blocks = env.lstrip_blocks = True  # no lines of blanks where tags were
    env.globals.update(
        allow_delete=allow_delete,
        database=_shown(url),
        max_rows=MAX_ROWS_SHOWN,
        style=Markup(_STYLE),  # the package's own stylesheet (see _STYLE)
    )
    env.filters["when"] = _when
    env.filters["pretty"] = _pretty
    env.filters["bufferpath"] = buffer_segment
    env.filters["seconds"] = _seconds

    def page(request: Request, name: str, code: int = 200, **context: Any) -> Response:
        return templates.TemplateResponse(request, name, context, status_code=code)

    def streamed(request: Request, name: str, **context: Any) -> Response:
        """A long page sent as it renders (everything it shows read already), so the
        browser paints its top while the server writes the rest."""
        chunks = env.get_template(name).generate({"request": request, **context})
        return StreamingResponse(_gathered(chunks), media_type="text/html; charset=utf-8")

    def home(request: Request) -> Response:
        if buffer is not None and "all" not in request.query_params:
            return RedirectResponse(f"/b/{buffer_segment(buffer)}/rows", status_code=302)
        revision, found = viewer.overview()
        return page(request, "buffers.html", revision=revision, buffers=found)

    def rows_page(request: Request) -> Response:
        name = _buffer_name(request)
        q = request.query_params
        where = q.get("where", "")
        columns = tuple(c.strip() for c in q.get("cols", "").split(",") if c.strip())
        limit = _int(q.get("limit", "50"), "limit")
        try:
            view = viewer.rows(
                name,
                where=where,
                after=q.get("after") or None,
                limit=limit,
                columns=columns,
                order_by=q.get("order", "key"),
            )
        except QueryError as exc:  # the page again, with the caret under the mistake
            viewer.buffer(name)
            return page(
                request,
                "rows.html",
                400,
                buffer=name,
                where=where,
                error=str(exc),
                view=None,
                cols=",".join(columns),
                order=q.get("order", "key"),
                limit=limit,
            )
        cells = [[_cell(name, row, path, where) for path in view.columns] for row in view.rows]
        row_urls = [
            f"/b/{buffer_segment(name)}/row?" + urlencode({"id": row.id}) for row in view.rows
        ]
        keys = [row.key for row in view.rows]
        base = {"where": where, "cols": ",".join(columns), "order": view.order_by}
        base = {k: v for k, v in base.items() if v and not (k == "order" and v == "key")}
        next_url = None
        if view.next is not None:
            next_url = f"/b/{buffer_segment(name)}/rows?" + urlencode(
                {**base, "after": view.next, "limit": view.limit}
            )
        return page(
            request,
            "rows.html",
            buffer=name,
            view=view,
            cells=cells,
            keys=keys,
            row_urls=row_urls,
            where=where,
            error=None,
            cols=",".join(columns),
            order=view.order_by,
            limit=view.limit,
            next_url=next_url,
            first_url=f"/b/{buffer_segment(name)}/rows?" + urlencode({**base, "limit": view.limit}),
        )

    def row_page(request: Request) -> Response:
        name = _buffer_name(request)
        row_id = _required(request, "id")
        row, lineage = viewer.record(name, row_id)
        made = viewer.completions(name, row_id) if lineage and lineage.target is not None else []

        def image_url(rid: str, path: str, thumb: bool) -> str:
            return _image_url(name, rid, path, thumb)

        return page(
            request,
            "row.html",
            buffer=name,
            row=row,
            lineage=lineage,
            fields=_fields(name, row),
            messages=story.turns(row.exp_data.messages, row.id, image_url),
            completions=[
                (f"/b/{buffer_segment(b)}/row?" + urlencode({"id": i}), i, b) for b, i in made
            ],
            prompt_url=(
                f"/b/{buffer_segment(lineage.produced_by.prompt_buffer)}/row?"
                + urlencode({"id": lineage.produced_by.prompt_id})
                if lineage
                and lineage.produced_by
                and lineage.produced_by.prompt_buffer
                and lineage.produced_by.prompt_id
                else None
            ),
        )

    def task_page(request: Request) -> Response:
        name = _buffer_name(request)
        task_id = _required(request, "id")
        where = request.query_params.get("where", "")
        view = viewer.trajectory(name, task_id, where=where)

        def image_url(row_id: str, path: str, thumb: bool) -> str:
            return _image_url(name, row_id, path, thumb)

        def link(task: str | None) -> str | None:
            if task is None:
                return None
            return f"/b/{buffer_segment(name)}/task?" + urlencode(
                {"id": task, **({"where": where} if where else {})}
            )

        return streamed(
            request,
            "trajectory.html",
            buffer=name,
            view=view,
            head=story.header(view.steps, view.matching if where.strip() else None),
            steps=story.steps(view.steps, view.matching, image_url),
            previous_url=link(view.previous),
            next_url=link(view.next),
            tasks_url=f"/b/{buffer_segment(name)}/tasks"
            + ("?" + urlencode({"where": where}) if where else ""),
        )

    def tasks_page(request: Request, groups: bool = False) -> Response:
        name = _buffer_name(request)
        q = request.query_params
        where = q.get("where", "")
        sort = q.get("sort", "first")
        offset = _int(q.get("offset", "0"), "offset")
        limit = _int(q.get("limit", "50"), "limit")
        template = "groups.html" if groups else "tasks.html"
        try:
            view = viewer.tasks(
                name, where=where, sort=sort, offset=offset, limit=limit, claims=groups
            )
        except QueryError as exc:
            viewer.buffer(name)
            return page(request, template, 400, buffer=name, where=where, error=str(exc), view=None)
        here = f"/b/{buffer_segment(name)}/{'groups' if groups else 'tasks'}?"

        def url(**changed: Any) -> str:
            query = {"where": where, "sort": sort, "offset": offset, "limit": limit, **changed}
            defaults = {"where": "", "sort": "first", "offset": 0, "limit": 50}
            return here + urlencode({k: v for k, v in query.items() if v != defaults[k]})

        def sort_url(key: str) -> str:
            return url(sort=key, offset=0)

        prompts = {
            t: story.goal_of(b.payload.get("messages")) or "" for t, b in view.first_rows.items()
        }
        return page(
            request,
            template,
            buffer=name,
            where=where,
            error=None,
            view=view,
            prompts=prompts,
            sort_url=sort_url,
            task_url=lambda t: (
                f"/b/{buffer_segment(name)}/task?"
                + urlencode({"id": t, **({"where": where} if where else {})})
            ),
            group_url=lambda t: f"/b/{buffer_segment(name)}/group?" + urlencode({"key": t}),
            previous_url=url(offset=max(0, offset - limit)) if offset > 0 else None,
            next_url=url(offset=offset + limit) if view.more else None,
        )

    def groups_page(request: Request) -> Response:
        return tasks_page(request, groups=True)

    def group_page(request: Request) -> Response:
        name = _buffer_name(request)
        key = _required(request, "key")
        by = request.query_params.get("by", "exp_meta.task_id")
        view = viewer.group(name, key, group_by=by)

        def image_url(row_id: str, path: str, thumb: bool) -> str:
            return _image_url(name, row_id, path, thumb)

        members = [
            {
                "id": row.id,
                "reward": row.columns["exp_data.reward_t"],
                "version": row.columns["exp_meta.policy_version"],
                "oldest": row.columns["exp_meta.oldest_version"],
                "newest": row.columns["exp_meta.newest_version"],
                "agent": row.columns["exp_meta.agent_id"],
                "advantage": adv,
                "lineage": view.lineage.get(row.id),
                "completion": _completion_text(row),
                "turns": [
                    t
                    for t in story.turns(row.payload.get("messages"), row.id, image_url)
                    if t["role"] not in ("user", "system")
                ],
            }
            for row, adv in zip(view.rows, view.advantages, strict=True)
        ]
        goals = {story.goal_of(row.payload.get("messages")) for row in view.rows}
        prompt_text = goals.pop() if len(goals) == 1 else None
        made = [
            m["lineage"].produced_by for m in members if m["lineage"] and m["lineage"].produced_by
        ]
        prompts = sorted(
            {(p.prompt_buffer, p.prompt_id) for p in made if p.prompt_buffer and p.prompt_id}
        )
        prompt_links = [
            (f"/b/{buffer_segment(b)}/row?" + urlencode({"id": i}), f"{i} ({b})")
            for b, i in prompts
        ]
        return page(
            request,
            "group.html",
            buffer=name,
            view=view,
            members=members,
            prompt=prompt_text,
            prompt_links=prompt_links,
            trajectory_url=f"/b/{buffer_segment(name)}/task?" + urlencode({"id": key}),
        )

    async def image(request: Request) -> Response:
        # async: a PNG in the cache is sent from the event loop (no hop to a worker
        # thread); making one reads the database and encodes, on a worker thread.
        name = _buffer_name(request)
        row_id = _required(request, "id")
        path = _required(request, "path")
        thumb = request.query_params.get("thumb") == "1"

        def read() -> Any:  # only when the PNG is not in the cache yet
            value = viewer.array(name, row_id, path)
            if isinstance(value, str) and value.startswith("data:image/"):
                value = decode_data_url(value, f"{path} of row {row_id!r}")
            if not looks_like_image(value):
                raise InvalidArgumentError(
                    f"{path} of row {row_id!r} is not an image ({array_line(value)})"
                    if is_array(value)
                    else f"{path} of row {row_id!r} is not an image"
                )
            return value

        key = (name, row_id, path, str(thumb))
        data = pngs.peek(key)
        if data is None:
            data = await run_in_threadpool(pngs.get, key, read, thumb)
        headers = {"Cache-Control": "private, max-age=3600"}
        return Response(data, media_type="image/png", headers=headers)

    def live_page(request: Request) -> Response:
        name = _buffer_name(request)
        viewer.buffer(name)
        return page(request, "live.html", buffer=name, every=viewer.live_every)

    def live_json(request: Request) -> Response:
        name = _buffer_name(request)
        snap = viewer.live(name)
        out = dict(snap)
        series = snap["series"]
        versions = snap["by_version"]
        out["charts"] = {
            "rate": charts.line(
                "rows written per second",
                series["rows_per_s"],
                x_label="seconds before the newest row",
                x_text=_ago,
            ),
            "reward_time": charts.line(
                "mean reward over time",
                series["reward"],
                x_label="seconds before the newest row",
                x_text=_ago,
                low=None,
            ),
            "success_time": charts.line(
                "task success over time",
                series["success"],
                x_label="seconds before the newest row (tasks by their last step)",
                x_text=_ago,
            ),
            "staleness": charts.bars(
                "rows by versions behind (newest rows)",
                snap["staleness"],
                x_label="versions behind the current policy",
            ),
            "reward": charts.line(
                "mean reward by policy version",
                [(b["version"], b["reward"]) for b in versions],
                x_label="policy version",
                x_text=_version,
                low=None,
            ),
            "success": charts.line(
                "task success by policy version",
                [(b["version"], b["success"]) for b in versions],
                x_label="policy version (of each task's last step)",
                x_text=_version,
            ),
        }
        return JSONResponse(out, headers={"Cache-Control": "no-store"})

    async def delete_row(request: Request) -> Response:
        name = _buffer_name(request)
        if not allow_delete:
            raise HTTPException(
                403, "this viewer is read-only; start it with --allow-delete to delete rows"
            )
        refused = _cross_site(request)
        if refused is not None:
            raise HTTPException(403, f"{refused}; nothing was deleted")
        form = await request.form()
        row_id, typed = str(form.get("id", "")), str(form.get("confirm", ""))
        if not row_id or typed != row_id:
            raise InvalidArgumentError(
                "to delete a row, type its id again in the confirmation box; nothing was deleted"
            )
        viewer.record(name, row_id)  # NotFound if it is gone
        viewer.buffer(name).delete(Comparison("id", "eq", row_id))
        return RedirectResponse(f"/b/{buffer_segment(name)}/rows", status_code=303)

    def buffer_home(request: Request) -> Response:
        name = _buffer_name(request)
        viewer.buffer(name)
        return RedirectResponse(f"/b/{buffer_segment(name)}/rows", status_code=302)

    async def errors(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException) and exc.status_code == 404 and exc.detail == "Not Found":
            status, message = 404, _no_route(request.url.path)
        elif isinstance(exc, HTTPException):
            status, message = exc.status_code, str(exc.detail)
        elif isinstance(exc, NotFound):
            status, message = 404, str(exc)
        elif isinstance(exc, (InvalidArgumentError, UnsupportedTypeError, QueryError)):
            status, message = 400, str(exc)
        elif isinstance(exc, ExpstoreError):
            status, message = 500, str(exc)
        else:
            status, message = 500, f"{type(exc).__name__}: {exc}"
        if request.url.path.endswith(".json"):
            return JSONResponse({"error": message}, status_code=status)
        return page(request, "error.html", status, status=status, message=message)

    def crashed(scope: Any) -> Response:
        message = "the viewer failed on this page (its log says why); other pages still work"
        return page(Request(scope), "error.html", 500, status=500, message=message)

    routes = [
        Route("/", home),
        Route("/b/{buffer}", buffer_home),
        Route("/b/{buffer}/rows", rows_page),
        Route("/b/{buffer}/row", row_page),
        Route("/b/{buffer}/task", task_page),
        Route("/b/{buffer}/group", group_page),
        Route("/b/{buffer}/tasks", tasks_page),
        Route("/b/{buffer}/groups", groups_page),
        Route("/b/{buffer}/image", image),
        Route("/b/{buffer}/live", live_page),
        Route("/b/{buffer}/live.json", live_json),
        Route("/b/{buffer}/delete", delete_row, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    # ExpstoreError and HTTPException are handled inside the middleware stack (nothing is
    # logged as a crash); the guard outside them checks the host, adds the security
    # headers to every response, and turns anything else into a 500 page that has them.
    handlers: dict[Any, Any] = {ExpstoreError: errors, HTTPException: errors, 404: errors}
    guard = Middleware(_Guard, hosts=allowed, crashed=crashed)
    app = Starlette(routes=routes, exception_handlers=handlers, middleware=[guard])
    app.state.viewer = viewer
    return app


class _Guard:
    """Pure ASGI middleware around the whole app: refuses a ``Host`` not in ``hosts``,
    adds the security headers to every response, and answers an unexpected exception with
    ``crashed``'s page (logged) when no response has started."""

    def __init__(self, app: Any, hosts: frozenset[str], crashed: Callable[[Any], Any]):
        self.app, self.hosts, self.crashed = app, hosts, crashed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.datastructures import Headers, MutableHeaders
        from starlette.responses import PlainTextResponse

        started = False

        async def send_guarded(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                MutableHeaders(scope=message).update(_SECURITY_HEADERS)
            await send(message)

        host = Headers(scope=scope).get("host", "")
        if not _host_allowed(host, self.hosts):
            names = ", ".join(sorted(self.hosts))
            refused = PlainTextResponse(
                f"this viewer answers to {names}, not to the host {host!r}: a page of another "
                "site may be trying to read it through DNS rebinding. To reach it under "
                "another name, start it with --allow-host NAME.",
                status_code=400,
            )
            await refused(scope, receive, send_guarded)
            return
        try:
            await self.app(scope, receive, send_guarded)
        except Exception:
            _log.exception("expstore ui: %s %s failed", scope.get("method"), scope.get("path"))
            if started:
                raise
            await self.crashed(scope)(scope, receive, send_guarded)


def _host_list(hosts: Iterable[str], port: int | None = None) -> frozenset[str]:
    """``hosts`` checked and lower-cased, those without a port on ``port`` (None: on
    any); InvalidArgumentError names a malformed one."""
    out = set()
    for entry in [hosts] if isinstance(hosts, str) else hosts:
        text = entry.strip().lower()
        if text.count(":") > 1 and not text.startswith("["):
            text = f"[{text}]"  # a bare IPv6 address
        name, given = _split_host(text)
        if not name or (given is not None and not given.isdigit()):
            raise InvalidArgumentError(
                f"host {entry!r} is not a host name, an address or NAME:PORT "
                "(an IPv6 address with a port goes in brackets: [::1]:8765)"
            )
        pinned = given if given is not None or port is None else str(port)
        out.add(name if pinned is None else f"{name}:{pinned}")
    if not out:
        raise InvalidArgumentError("the viewer needs at least one host name to answer to")
    return frozenset(out)


def _split_host(text: str) -> tuple[str, str | None]:
    """``(name, port or None)`` of a ``Host`` header's value; IPv6 stays in brackets."""
    if text.startswith("["):
        end = text.find("]")
        rest = text[end + 1 :]
        if end < 0 or (rest and not rest.startswith(":")):
            return "", None
        return text[: end + 1], rest[1:] if rest else None
    name, colon, port = text.partition(":")
    return name, port if colon else None


def _host_allowed(host: str, allowed: frozenset[str]) -> bool:
    name, port = _split_host(host.strip().lower())
    if not name:
        return False
    return name in allowed or (port is not None and f"{name}:{port}" in allowed)


def _cross_site(request: Any) -> str | None:
    """Why a POST may not come from a page of this viewer, or None when it does: a browser
    sends ``Origin`` (or at least ``Referer``) naming the page's own origin, and
    ``Sec-Fetch-Site: same-origin``; a page of another site can make neither name ours,
    and a request naming no origin at all is refused too."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site != "same-origin":
        return f"the browser marks this request as coming from {fetch_site!r}, not this viewer"
    origin = request.headers.get("origin")
    sent = origin if origin and origin != "null" else request.headers.get("referer")
    if not sent:
        return (
            "a delete must come from this viewer's own page (the request names no Origin "
            "or Referer)"
        )
    ours = f"{request.url.scheme}://{request.headers.get('host', '')}"
    theirs = urlsplit(str(sent))
    if f"{theirs.scheme}://{theirs.netloc}" != ours:
        return f"a delete must come from this viewer's own page, not from {sent[:80]!r}"
    return None


# A buffer name as one segment of a URL path. Browsers resolve the segments "." and ".."
# (percent-encoded or not) before sending, and servers decode "%2F" into "/" before
# routing; such names, and names that begin with "~", travel as "~" + base64url.
_ENCODED = "~"


def buffer_segment(name: str) -> str:
    """A buffer name as one segment of a URL path (see :func:`_buffer_name`)."""
    if name in ("", ".", "..") or "/" in name or name.startswith(_ENCODED):
        packed = base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")
        return _ENCODED + packed
    return quote(name, safe="")


def _buffer_name(request: Any) -> str:
    """The buffer a page's path names, as :func:`buffer_segment` wrote it."""
    segment = str(request.path_params["buffer"])
    if not segment.startswith(_ENCODED):
        return segment
    packed = segment[len(_ENCODED) :]
    try:
        padded = packed + "=" * (-len(packed) % 4)
        return base64.b64decode(padded, altchars=b"-_", validate=True).decode()
    except (binascii.Error, ValueError):
        raise InvalidArgumentError(
            f"{segment!r} is not a buffer name this viewer wrote (a name written with "
            f"{_ENCODED!r} is base64url); open the buffer from the buffers page, /?all=1"
        ) from None


def _no_route(path: str) -> str:
    """The 404 message of a path that matches no page."""
    if path.startswith("/b/"):
        return (
            f"no page at {path}: a buffer's pages are /b/NAME/rows, /row, /tasks, /task, "
            "/groups, /group, /live. A name holding '/', or named '.' or '..', cannot be typed "
            "into a path "
            f"(browsers and servers rewrite those); its links are written as {_ENCODED}... "
            "on the buffers page, /?all=1"
        )
    return f"no page at {path}; the buffers are listed at /?all=1"


def _required(request: Any, name: str) -> str:
    value = request.query_params.get(name)
    if not value:
        raise InvalidArgumentError(f"this page needs ?{name}=...")
    return str(value)


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(f"{name} must be a whole number, not {text!r}") from None


def _shown(url: str) -> str:
    """The URL without a password."""
    from ..db.engine import normalise_url

    return normalise_url(url).render_as_string(hide_password=True)


def _when(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _pretty(value: Any) -> str:
    import json

    return json.dumps(preview(value), indent=2, ensure_ascii=False, default=str)


def _gathered(
    chunks: Iterable[str], first: int = len(_STYLE) + 4096, size: int = 32768
) -> Iterator[bytes]:
    """A template's output in pieces of about ``size`` characters, the first of about
    ``first`` (the page's head with its stylesheet, and its top: what the browser paints
    first); Jinja yields each bit of text on its own."""
    held: list[str] = []
    length = 0
    for chunk in chunks:
        held.append(chunk)
        length += len(chunk)
        if length >= first:
            yield "".join(held).encode()
            held, length, first = [], 0, size
    if held:
        yield "".join(held).encode()


def _seconds(value: float | None) -> str:
    """A duration as a person reads it: ``850 ms``, ``4.2 s``, ``3 min 5 s``, ``2 h 4 min``."""
    if value is None:
        return ""
    if value < 0:
        return "−" + _seconds(-value)
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{int(value // 60)} min {int(value % 60)} s"
    return f"{int(value // 3600)} h {int(value % 3600 // 60)} min"


def _ago(seconds: float) -> str:
    return f"{-seconds:.0f}" if seconds else "0"


def _version(value: float) -> str:
    return f"v{value:g}" if value == int(value) else ""


def _image_url(buffer: str, row_id: str, path: str, thumb: bool = True) -> str:
    query = {"id": row_id, "path": path, **({"thumb": "1"} if thumb else {})}
    return f"/b/{buffer_segment(buffer)}/image?" + urlencode(query)


#: A cell's text up to this long stays on one line (a word is never split).
SHORT_CELL = 40


def _cell(buffer: str, row: Brief, path: str, where: str = "") -> dict[str, Any]:
    """What one cell of the rows table shows (arrays by their description; images as a
    thumbnail, read when the browser asks for it); ``kind`` is ``id`` (one line, cut with
    an ellipsis, whole in its tooltip), ``short`` (one line) or ``long`` (wraps)."""
    out = _cell_value(buffer, row, path, where)
    text = out["text"]
    if path == "id" or path in ("exp_meta.task_id", "task_id"):
        out["kind"] = "id"
    else:
        out["kind"] = "short" if len(text) <= SHORT_CELL else "long"
    return out


def _cell_value(buffer: str, row: Brief, path: str, where: str) -> dict[str, Any]:
    value = row.value(path)
    if value is MISSING or value is None:
        return {"text": ""}
    if path == "id":
        return {
            "text": row.id,
            "href": f"/b/{buffer_segment(buffer)}/row?" + urlencode({"id": row.id}),
        }
    if path in ("exp_meta.task_id", "task_id"):
        return {
            "text": str(value),
            "href": f"/b/{buffer_segment(buffer)}/task?"
            + urlencode({"id": value, **({"where": where} if where.strip() else {})}),
        }
    if isinstance(value, ArrayRef):
        shown = [_image_url(buffer, row.id, value.path)] if value.image else []
        return {"text": str(value), "images": shown}
    if isinstance(value, (dict, list)):
        return {
            "text": short_json(value),
            "images": [_image_url(buffer, row.id, p) for p in image_paths(value)[:2]],
        }
    if path in ("exp_meta.execute_time", "execute_time") and isinstance(value, (int, float)):
        return {"text": _when(value)}
    if isinstance(value, float):
        return {"text": f"{value:.6g}"}
    return {"text": str(value)}


def _fields(buffer: str, row: DataRow) -> list[dict[str, Any]]:
    """The payload fields of a row's page: each as pretty JSON, with its images."""
    out = []
    for name in ("state", "actions", "next_state", "ext_info"):
        value = getattr(row.exp_data, name)
        if value in (None, [], {}):
            continue
        path = f"exp_data.{name}"
        images = list(images_in(value, path))[:8]
        out.append(
            {
                "name": name,
                "value": value,
                "images": [(p, _image_url(buffer, row.id, p, thumb=False)) for p in images],
            }
        )
    return out


def _completion_text(row: Brief) -> str:
    """What a GRPO group's page shows of a completion without messages: its actions (or
    state)."""
    return short_json(row.payload.get("actions") or row.payload.get("state"), 1000)
