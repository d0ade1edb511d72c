"""A trajectory as a person reads it: a header (goal, agents, outcome, return, length,
duration, versions), and per step the agent and the hand-off, the page it was on, the time
since the step before, where it clicked or typed, whether the screenshot changed; and chat
as modern agents write it (OpenAI-style content parts, tool calls and their results,
``<think>`` blocks, long texts and repeated prompts folded).

Plain data for the templates (no HTTP, no HTML: the templates escape every text).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .media import short_json
from .reads import ArrayRef, Brief

__all__ = ["Header", "Step", "folded", "goal_of", "header", "marks", "steps", "turns"]

#: A text longer than this (characters or lines) is shown folded, its first line visible.
LONG_CHARS, LONG_LINES = 700, 12
_THINK = re.compile(r"<think>(.*?)(?:</think>|\Z)", re.DOTALL)

#: Makes the URL of an image at a path of a row: (row id, path, thumbnail?) -> URL.
ImageUrl = Callable[[str, str, bool], str]


def _text_parts(text: str) -> list[dict[str, Any]]:
    """A message's text split into plain parts and ``<think>`` parts (folded)."""
    out: list[dict[str, Any]] = []
    at = 0
    for found in _THINK.finditer(text):
        if found.start() > at:
            out.append(_plain(text[at : found.start()]))
        out.append({"kind": "think", "text": found.group(1).strip()})
        at = found.end()
    if at < len(text):
        out.append(_plain(text[at:]))
    return [p for p in out if p["text"].strip() or p["kind"] == "think"]


def _plain(text: str) -> dict[str, Any]:
    text = text.strip("\n")
    long = len(text) > LONG_CHARS or text.count("\n") >= LONG_LINES
    first = text.strip().split("\n", 1)[0][:120]
    return {"kind": "text", "text": text, "long": long, "summary": first, "chars": len(text)}


def _arguments(value: Any) -> str:
    """A tool call's arguments, pretty: OpenAI sends them as a JSON string."""
    if isinstance(value, str):
        text: str = value
        try:
            value = json.loads(text)
        except ValueError:
            return text
    shown = json.dumps(value, ensure_ascii=False, default=str)
    if len(shown) <= 160:
        return shown
    return json.dumps(value, indent=1, ensure_ascii=False, default=str)


def _image_part(value: Any, path: str, row_id: str, image_url: ImageUrl) -> dict[str, Any]:
    """An image content part: stored (an array, or a data: URL the viewer decodes) shown;
    a web address only linked (the page loads nothing from another origin)."""
    if isinstance(value, dict):  # {"url": ..., "detail": ...}
        path, value = f"{path}.url", value.get("url")
    if isinstance(value, ArrayRef) or type(value).__name__ in ("ndarray", "Tensor"):
        return {"kind": "image", "src": image_url(row_id, path, True)}
    if isinstance(value, str) and value.startswith("data:image/"):
        return {"kind": "image", "src": image_url(row_id, path, True)}
    if isinstance(value, str):
        return {"kind": "link", "url": value}
    return {"kind": "text", **_plain(short_json(value, 400))}


def _content(content: Any, path: str, row_id: str, image_url: ImageUrl) -> list[dict[str, Any]]:
    """A message's content as parts: a string, or a list of typed parts (OpenAI's
    ``text``/``image_url``, Anthropic's ``text``/``image``/``tool_use``/``tool_result``)."""
    if content is None:
        return []
    if isinstance(content, str):
        return _text_parts(content)
    if not isinstance(content, list):
        return [_plain(short_json(content, 2000))]
    out: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{path}.{j}"
        if isinstance(part, str):
            out += _text_parts(part)
        elif not isinstance(part, dict):
            out.append(_plain(short_json(part, 2000)))
        elif part.get("type") in ("text", "input_text", "output_text") or (
            "text" in part and "type" not in part
        ):
            out += _text_parts(str(part.get("text", "")))
        elif part.get("type") in ("image_url", "input_image", "image"):
            key = next((k for k in ("image_url", "image", "source", "url") if k in part), None)
            if key is None:
                out.append(_plain(short_json(part, 400)))
            else:
                out.append(_image_part(part[key], f"{at}.{key}", row_id, image_url))
        elif part.get("type") == "tool_use":
            out.append(
                {
                    "kind": "call",
                    "name": str(part.get("name", "?")),
                    "args": _arguments(part.get("input")),
                }
            )
        elif part.get("type") == "tool_result":
            out += _content(part.get("content"), f"{at}.content", row_id, image_url)
        else:
            out.append(_plain(short_json(part, 2000)))
    return out


def turns(
    messages: Any,
    row_id: str,
    image_url: ImageUrl,
    *,
    path: str = "exp_data.messages",
    seen: dict[str, tuple[int, Any]] | None = None,
    at: tuple[int, Any] = (0, None),
) -> list[dict[str, Any]]:
    """Chat messages as turns: ``role``, ``name`` (a tool's, for its result), ``parts``
    (text, think, image, link, call) and ``repeat``: with ``seen`` shared across a
    trajectory's steps, the (position, step) of the step that first showed the same
    message (``at`` is this one's); a repeated message is not rendered again (agents
    resend their whole history at every step), only pointed at."""
    out: list[dict[str, Any]] = []
    calls: dict[str, str] = {}
    for i, m in enumerate(messages if isinstance(messages, list) else []):
        if not isinstance(m, dict):
            continue
        role = str(m.get("role", "?"))
        for call in m.get("tool_calls") or []:
            if isinstance(call, dict):
                inner = call.get("function")
                function: dict[str, Any] = inner if isinstance(inner, dict) else call
                calls[str(call.get("id", ""))] = str(function.get("name", "?"))
        name = m.get("name") or calls.get(str(m.get("tool_call_id", "")))
        repeat = None
        if seen is not None:
            repeat = seen.setdefault(repr(m), at)
            if repeat == at:
                repeat = None
        parts = []
        if repeat is None:
            parts = _content(m.get("content"), f"{path}.{i}.content", row_id, image_url)
            for call in m.get("tool_calls") or []:
                if isinstance(call, dict):
                    inner = call.get("function")
                    function = inner if isinstance(inner, dict) else call
                    parts.append(
                        {
                            "kind": "call",
                            "name": str(function.get("name", "?")),
                            "args": _arguments(function.get("arguments")),
                        }
                    )
        out.append({"role": role, "name": name, "parts": parts, "repeat": repeat})
    return out


def folded(shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Turns with each run of repeated ones as one block, ``{"turns": [...], "refs":
    [(position, step), ...]}`` (the steps that showed them first); other turns as they
    are."""
    out: list[dict[str, Any]] = []
    for turn in shown:
        if turn["repeat"] is None:
            out.append(turn)
        elif out and "turns" in out[-1]:
            out[-1]["turns"].append(turn)
            if turn["repeat"] not in out[-1]["refs"]:
                out[-1]["refs"].append(turn["repeat"])
        else:
            out.append({"turns": [turn], "refs": [turn["repeat"]]})
    return out


def goal_of(messages: Any) -> str | None:
    """The first user message's text (its text parts), or None."""
    for m in messages if isinstance(messages, list) else []:
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                content = " ".join(
                    str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
                )
            if isinstance(content, str) and content.strip():
                return _THINK.sub("", content).strip()
    return None


@dataclass(frozen=True)
class Header:
    """What a trajectory is, told at its top."""

    goal: str
    agents: list[str]
    outcome: str
    total: float | None
    length: int
    duration: float
    versions: list[int]
    matching: int | None


@dataclass
class Step:
    """One step as the trajectory page shows it."""

    id: str
    key: int
    step: Any
    reward: Any
    version: Any
    done: Any
    agent: str
    pre_agent: str | None
    handoff: bool
    page: str | None
    since: float | None
    images: list[dict[str, Any]] = field(default_factory=list)
    actions: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    match: bool = False


def header(rows: Sequence[Brief], matching: frozenset[int] | None) -> Header:
    """The trajectory's header from its steps (in order)."""
    first, last = rows[0], rows[-1]
    goal = (
        goal_of(first.payload.get("messages"))
        or first.columns.get("exp_meta.task_name")
        or first.columns["exp_meta.task_id"]
    )
    agents: list[str] = []
    for r in rows:
        for who in (r.columns.get("exp_meta.pre_agent"), r.columns["exp_meta.agent_id"]):
            if who and who not in agents:
                agents.append(str(who))
    rewards = [
        r.columns["exp_data.reward_t"] for r in rows if r.columns["exp_data.reward_t"] is not None
    ]
    final = last.columns["exp_data.reward_t"]
    if final is None:
        outcome = "no final reward"
    else:
        outcome = f"{'succeeded' if final > 0 else 'failed'} (final reward {final:g})"
    if not last.columns["exp_data.done"]:
        outcome += ", not done"
    times = [float(r.columns["exp_meta.execute_time"]) for r in rows]
    versions = sorted(
        {int(v) for r in rows if (v := r.columns["exp_meta.policy_version"]) is not None}
    )
    return Header(
        str(goal)[:400],
        agents,
        outcome,
        sum(rewards) if rewards else None,
        len(rows),
        max(times) - min(times),
        versions,
        None if matching is None else sum(r.key in matching for r in rows),
    )


def _page_of(state: Any) -> str | None:
    if not isinstance(state, dict):
        return None
    for name in ("url", "page_url", "title", "page_title"):
        value = state.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def marks(actions: Any) -> list[dict[str, Any]]:
    """Where a step's actions point on its screenshot: ``x``/``y`` (or ``coordinate``,
    ``coords``, ``point`` as [x, y]), in an action or its ``args``/``arguments``/
    ``params``; with the action's name and, for typing, its text."""
    out = []
    for action in actions if isinstance(actions, list) else [actions]:
        if not isinstance(action, dict):
            continue
        places = [action] + [
            action[k]
            for k in ("args", "arguments", "params", "input")
            if isinstance(action.get(k), dict)
        ]
        for place in places:
            x, y = _number(place.get("x")), _number(place.get("y"))
            if x is None or y is None:
                pair = next(
                    (
                        place[k]
                        for k in ("coordinate", "coords", "point", "position")
                        if isinstance(place.get(k), list)
                    ),
                    None,
                )
                if pair is not None and len(pair) == 2:
                    x, y = _number(pair[0]), _number(pair[1])
            if x is not None and y is not None:
                name = str(action.get("name") or action.get("type") or action.get("action") or "")
                text = place.get("text") or action.get("text")
                out.append(
                    {"x": x, "y": y, "name": name, "text": None if text is None else str(text)[:60]}
                )
                break
    return out


def steps(
    rows: Sequence[Brief],
    matching: frozenset[int],
    image_url: ImageUrl,
) -> Iterator[Step]:
    """The steps of a trajectory (in order) for its page, made as the page is written
    (a long trajectory's top goes out before its last steps are made)."""
    seen: dict[str, tuple[int, Any]] = {}
    before: dict[str, str | None] = {}  # image path -> digest at the step before
    previous_time: float | None = None
    previous: tuple[Any, str] | None = None  # (step, agent) of the row before
    for position, r in enumerate(rows):
        c = r.columns
        state = r.payload.get("state")
        when = float(c["exp_meta.execute_time"])
        agent, pre = str(c["exp_meta.agent_id"]), c.get("exp_meta.pre_agent")
        if pre is None and previous is not None and previous[0] == c["exp_meta.step"]:
            pre = previous[1]  # two agents at one step: the second took over from the first
        previous = (c["exp_meta.step"], agent)
        step = Step(
            id=r.id,
            key=r.key,
            step=c["exp_meta.step"],
            reward=c["exp_data.reward_t"],
            version=c["exp_meta.policy_version"],
            done=c["exp_data.done"],
            agent=agent,
            pre_agent=None if pre is None else str(pre),
            handoff=pre is not None and pre != agent,
            page=_page_of(state),
            since=None if previous_time is None else when - previous_time,
            actions=short_json(r.payload.get("actions"), 600),
            messages=folded(
                turns(
                    r.payload.get("messages"),
                    r.id,
                    image_url,
                    seen=seen,
                    at=(position, c["exp_meta.step"]),
                )
            ),
            match=r.key in matching,
        )
        previous_time = when
        pointed = marks(r.payload.get("actions"))
        for n, path in enumerate(r.images()):
            ref = r.value(path)
            digest = ref.digest if isinstance(ref, ArrayRef) else None
            height, width = ref.shape[:2] if isinstance(ref, ArrayRef) else (0, 0)
            unchanged = digest is not None and before.get(path) == digest
            before[path] = digest
            shown = []
            if n == 0 and width and height:
                for m in pointed:
                    x, y = m["x"], m["y"]
                    if 0 <= x <= 1 and 0 <= y <= 1 and not (x == int(x) and y == int(y)):
                        x, y = x * width, y * height  # relative coordinates
                    if 0 <= x <= width and 0 <= y <= height:
                        shown.append({**m, "x": x, "y": y, "r": max(width, height) / 45})
            step.images.append(
                {
                    "path": path,
                    "thumb": image_url(r.id, path, True),
                    "full": image_url(r.id, path, False),
                    "width": width,
                    "height": height,
                    "unchanged": unchanged,
                    "marks": shown,
                }
            )
        yield step
