"""The viewer's web app (Starlette): routes, pages, errors, and what is allowed.

Read-only unless made with ``allow_delete=True``; then a row's page offers a delete that
asks for the row's id typed again. Every page is rendered by Jinja2 with autoescape (a
stored ``<script>`` shows as text), served with a Content-Security-Policy that allows no
inline script and nothing from another origin, and with the templates, CSS and script
shipped in the wheel. Bad input (an unknown buffer, a malformed ``where``, an id that
does not exist, a page too large, a path outside the static folder) gets a page saying
what went wrong with a 4xx status; the server goes on serving.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from .._optional import require
from ..errors import ExpstoreError, InvalidArgumentError, QueryError, UnsupportedTypeError
from ..model.images import looks_like_image
from ..model.paths import MISSING
from ..model.rows import DataRow
from ..query import Comparison
from . import charts
from .media import PngCache, array_line, images_in, is_array, preview, short_json
from .reads import MAX_ROWS_SHOWN, ArrayRef, Brief, NotFound, Viewer, image_paths

__all__ = ["make_app"]

HERE = Path(__file__).resolve().parent
_CSP = (
    "default-src 'none'; img-src 'self'; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


def make_app(
    url: str, *, buffer: str | None = None, allow_delete: bool = False, live_every: float = 5.0
) -> Any:
    """The viewer of the database at ``url`` as an ASGI app (serve it with uvicorn).
    ``buffer``: where ``/`` leads (the buffers page without it)."""
    for module in ("starlette", "jinja2"):
        require(module, "the viewer (expstore ui)")
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, RedirectResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles
    from starlette.templating import Jinja2Templates

    viewer = Viewer(url, live_every=live_every)
    pngs = PngCache()
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.autoescape = True
    env.globals.update(allow_delete=allow_delete, database=_shown(url), max_rows=MAX_ROWS_SHOWN)
    env.filters["when"] = _when
    env.filters["pretty"] = _pretty
    env.filters["bufferpath"] = _q

    def page(request: Request, name: str, code: int = 200, **context: Any) -> Response:
        return templates.TemplateResponse(request, name, context, status_code=code)

    def home(request: Request) -> Response:
        if buffer is not None and "all" not in request.query_params:
            return RedirectResponse(f"/b/{_q(buffer)}/rows", status_code=302)
        revision, found = viewer.overview()
        return page(request, "buffers.html", revision=revision, buffers=found)

    def rows_page(request: Request) -> Response:
        name = request.path_params["buffer"]
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
        cells = [[_cell(name, row, path) for path in view.columns] for row in view.rows]
        keys = [row.key for row in view.rows]
        base = {"where": where, "cols": ",".join(columns), "order": view.order_by}
        base = {k: v for k, v in base.items() if v and not (k == "order" and v == "key")}
        next_url = None
        if view.next is not None:
            next_url = f"/b/{_q(name)}/rows?" + urlencode(
                {**base, "after": view.next, "limit": view.limit}
            )
        return page(
            request,
            "rows.html",
            buffer=name,
            view=view,
            cells=cells,
            keys=keys,
            where=where,
            error=None,
            cols=",".join(columns),
            order=view.order_by,
            limit=view.limit,
            next_url=next_url,
            first_url=f"/b/{_q(name)}/rows?" + urlencode({**base, "limit": view.limit}),
        )

    def row_page(request: Request) -> Response:
        name = request.path_params["buffer"]
        row_id = _required(request, "id")
        row, lineage = viewer.record(name, row_id)
        return page(
            request,
            "row.html",
            buffer=name,
            row=row,
            lineage=lineage,
            fields=_fields(name, row),
            messages=_turns(row.exp_data.messages),
        )

    def task_page(request: Request) -> Response:
        name = request.path_params["buffer"]
        task_id = _required(request, "id")
        where = request.query_params.get("where", "")
        view = viewer.trajectory(name, task_id, where=where)
        steps = [
            {
                "id": row.id,
                "step": row.columns["exp_meta.step"],
                "reward": row.columns["exp_data.reward_t"],
                "version": row.columns["exp_meta.policy_version"],
                "done": row.columns["exp_data.done"],
                "images": [_image_url(name, row.id, p) for p in row.images()],
                "actions": short_json(row.payload.get("actions"), 600),
                "messages": _turns(row.payload.get("messages")),
            }
            for row in view.steps
        ]

        def link(task: str | None) -> str | None:
            if task is None:
                return None
            return f"/b/{name}/task?" + urlencode(
                {"id": task, **({"where": where} if where else {})}
            )

        return page(
            request,
            "trajectory.html",
            buffer=name,
            view=view,
            steps=steps,
            previous_url=link(view.previous),
            next_url=link(view.next),
        )

    def group_page(request: Request) -> Response:
        name = request.path_params["buffer"]
        key = _required(request, "key")
        by = request.query_params.get("by", "exp_meta.task_id")
        view = viewer.group(name, key, group_by=by)
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
            }
            for row, adv in zip(view.rows, view.advantages, strict=True)
        ]
        return page(request, "group.html", buffer=name, view=view, members=members)

    def image(request: Request) -> Response:
        name = request.path_params["buffer"]
        row_id = _required(request, "id")
        path = _required(request, "path")
        thumb = request.query_params.get("thumb") == "1"
        value = viewer.array(name, row_id, path)
        if not looks_like_image(value):
            raise InvalidArgumentError(
                f"{path} of row {row_id!r} is not an image ({array_line(value)})"
                if is_array(value)
                else f"{path} of row {row_id!r} is not an image"
            )
        data = pngs.get((name, row_id, path, str(thumb)), value, thumb)
        headers = {"Cache-Control": "private, max-age=3600"}
        return Response(data, media_type="image/png", headers=headers)

    def live_page(request: Request) -> Response:
        name = request.path_params["buffer"]
        viewer.buffer(name)
        return page(request, "live.html", buffer=name, every=viewer.live_every)

    def live_json(request: Request) -> Response:
        name = request.path_params["buffer"]
        snap = viewer.live(name)
        out = dict(snap)
        out["charts"] = {
            "staleness": charts.bars("rows by versions behind (newest rows)", snap["staleness"]),
            "reward": charts.line(
                "mean reward by policy version",
                [(f"v{b['version']}", b["reward"]) for b in snap["by_version"]],
            ),
            "success": charts.line(
                "success (reward > 0) by policy version",
                [(f"v{b['version']}", b["success"]) for b in snap["by_version"]],
            ),
        }
        return JSONResponse(out, headers={"Cache-Control": "no-store"})

    async def delete_row(request: Request) -> Response:
        name = request.path_params["buffer"]
        if not allow_delete:
            raise HTTPException(
                403, "this viewer is read-only; start it with --allow-delete to delete rows"
            )
        if not _same_origin(request):
            raise HTTPException(
                403, "a delete must come from this viewer's own page; nothing was deleted"
            )
        form = await request.form()
        row_id, typed = str(form.get("id", "")), str(form.get("confirm", ""))
        if not row_id or typed != row_id:
            raise InvalidArgumentError(
                "to delete a row, type its id again in the confirmation box; nothing was deleted"
            )
        viewer.record(name, row_id)  # NotFound if it is gone
        viewer.buffer(name).delete(Comparison("id", "eq", row_id))
        return RedirectResponse(f"/b/{_q(name)}/rows", status_code=303)

    def buffer_home(request: Request) -> Response:
        name = request.path_params["buffer"]
        viewer.buffer(name)
        return RedirectResponse(f"/b/{_q(name)}/rows", status_code=302)

    async def errors(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
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

    async def headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = _CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["X-Frame-Options"] = "DENY"
        return response

    routes = [
        Route("/", home),
        Route("/b/{buffer}", buffer_home),
        Route("/b/{buffer}/rows", rows_page),
        Route("/b/{buffer}/row", row_page),
        Route("/b/{buffer}/task", task_page),
        Route("/b/{buffer}/group", group_page),
        Route("/b/{buffer}/image", image),
        Route("/b/{buffer}/live", live_page),
        Route("/b/{buffer}/live.json", live_json),
        Route("/b/{buffer}/delete", delete_row, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    # ExpstoreError and HTTPException are handled inside the middleware stack (their pages
    # get the security headers, and nothing is logged as a crash); anything else is a 500.
    handlers: dict[Any, Any] = {ExpstoreError: errors, HTTPException: errors, 404: errors}
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.add_middleware(BaseHTTPMiddleware, dispatch=headers)
    app.state.viewer = viewer
    return app


def _same_origin(request: Any) -> bool:
    """Whether a POST comes from a page of this viewer: its Origin (or Referer) names this
    host. A browser sends one of them; a page of another site cannot make it ours."""
    sent = request.headers.get("origin") or request.headers.get("referer")
    if not sent:
        return True  # not a browser (curl, a script): no other site's page is involved
    host = str(request.headers.get("host", ""))
    return urlsplit(str(sent)).netloc == host


def _q(name: str) -> str:
    """A buffer name as one segment of a URL path."""
    return quote(name, safe="")


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


def _image_url(buffer: str, row_id: str, path: str, thumb: bool = True) -> str:
    query = {"id": row_id, "path": path, **({"thumb": "1"} if thumb else {})}
    return f"/b/{_q(buffer)}/image?" + urlencode(query)


def _cell(buffer: str, row: Brief, path: str) -> dict[str, Any]:
    """What one cell of the rows table shows (arrays by their description; images as a
    thumbnail, read when the browser asks for it)."""
    value = row.value(path)
    if value is MISSING or value is None:
        return {"text": ""}
    if path == "id":
        return {"text": row.id, "href": f"/b/{_q(buffer)}/row?" + urlencode({"id": row.id})}
    if path in ("exp_meta.task_id", "task_id"):
        return {"text": str(value), "href": f"/b/{_q(buffer)}/task?" + urlencode({"id": value})}
    if isinstance(value, ArrayRef):
        shown = [_image_url(buffer, row.id, value.path)] if value.image else []
        return {"text": str(value), "images": shown}
    if isinstance(value, (dict, list)):
        return {
            "text": short_json(value),
            "images": [_image_url(buffer, row.id, p) for p in image_paths(value)[:2]],
        }
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


def _turns(messages: Any) -> list[dict[str, str]]:
    """Chat messages as turns (role, text)."""
    out = []
    for m in messages if isinstance(messages, list) else []:
        if not isinstance(m, dict):
            continue
        content = m.get("content", "")
        if not isinstance(content, str):
            content = short_json(content, 2000)
        out.append({"role": str(m.get("role", "?")), "content": content})
    return out


def _completion_text(row: Brief) -> str:
    """What a GRPO group's page shows of one completion: its last assistant message, or
    its actions (or state)."""
    mine = [t["content"] for t in _turns(row.payload.get("messages")) if t["role"] == "assistant"]
    if mine:
        return mine[-1]
    return short_json(row.payload.get("actions") or row.payload.get("state"), 1000)
