"""ChatConverter: supervised fine-tuning records for LLMs from ``messages`` and the action."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import InvalidArgumentError
from ..model.rows import DataRow
from .base import Converter

__all__ = ["ChatConverter"]

_SHAREGPT_ROLES = {
    "user": "human",
    "human": "human",
    "assistant": "gpt",
    "gpt": "gpt",
    "tool": "observation",
    "observation": "observation",
    "function": "observation",
    "function_call": "function_call",
}
_ACTION_TEXT_KEYS = ("content", "action_string", "text", "policy_info", "action")


def action_text(action: Any) -> str | None:
    """The text of a row's action(s): a string as is; a dict's ``content``,
    ``action_string``, ``text``, ``policy_info`` or ``action`` (the first that is a string),
    else its JSON; several actions joined by newlines; None for no action."""
    if action is None:
        return None
    if isinstance(action, str):
        return action
    if isinstance(action, (list, tuple)):
        parts = [t for t in (action_text(a) for a in action) if t is not None]
        return "\n".join(parts) if parts else None
    if isinstance(action, dict):
        for key in _ACTION_TEXT_KEYS:
            if isinstance(action.get(key), str):
                return str(action[key])
        return json.dumps(action, sort_keys=True, default=str)
    return str(action)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI-style parts: keep the text ones
        texts = [p.get("text") for p in content if isinstance(p, dict) and "text" in p]
        if texts and all(isinstance(t, str) for t in texts):
            return "".join(str(t) for t in texts)
    return json.dumps(content, sort_keys=True, default=str)


class ChatConverter(Converter[list[dict[str, Any]]]):
    """One fine-tuning record per row, in a format LLaMA-Factory reads.

    ``ChatConverter(format="messages", *, action_to_text=None)``

    The row's ``exp_data.messages`` (``[{"role": ..., "content": ...}, ...]``, the prompt) is
    followed by an assistant turn holding the action (``exp_data.actions``, turned into text
    by ``action_to_text``, by default :func:`action_text`), unless the messages already end
    with that very assistant turn.

    - ``format="messages"``: ``{"messages": [{"role": "system"|"user"|"assistant"|"tool",
      "content": ...}, ...]}`` (LLaMA-Factory's sharegpt formatting with tags
      ``role``/``content``/``user``/``assistant``/``system``; also the OpenAI layout).
    - ``format="sharegpt"``: ``{"conversations": [{"from": "human"|"gpt"|"observation"|
      "function_call", "value": str}, ...], "system": str}`` (LLaMA-Factory's default
      sharegpt tags); system messages go to ``"system"``.

    Returns a list of dicts, ready for ``json.dumps`` into a JSONL file. A row without
    messages, or with neither an action nor a final assistant turn, raises ValueError
    naming the row.

    >>> ChatConverter().to_dataset_row([])
    []
    """

    def __init__(
        self,
        format: str = "messages",
        *,
        action_to_text: Callable[[Any], str | None] | None = None,
    ) -> None:
        if format not in ("messages", "sharegpt"):
            raise InvalidArgumentError(f"format must be 'messages' or 'sharegpt', got {format!r}")
        self.format = format
        self.action_to_text = action_to_text or action_text

    def to_dataset_row(self, rows: Sequence[DataRow]) -> list[dict[str, Any]]:
        return [self.record(row) for row in rows]

    def record(self, row: DataRow) -> dict[str, Any]:
        """The fine-tuning record for one row."""
        messages = row.exp_data.messages
        if not messages:
            raise InvalidArgumentError(
                f"row {row.id}: ChatConverter needs exp_data.messages (the prompt as "
                "[{'role': ..., 'content': ...}]), but the row has none"
            )
        turns: list[dict[str, Any]] = [
            {"role": str(m.get("role", "user")), "content": m.get("content")} for m in messages
        ]
        answer = self.action_to_text(row.exp_data.actions)
        last = turns[-1]
        if answer is not None and not (last["role"] == "assistant" and last["content"] == answer):
            turns.append({"role": "assistant", "content": answer})
        elif answer is None and last["role"] != "assistant":
            raise InvalidArgumentError(
                f"row {row.id}: no action and no final assistant message, so the record would "
                "have no response to learn; store the response as the action"
            )
        if self.format == "messages":
            return {"messages": turns}
        system = [_text(t["content"]) for t in turns if t["role"] == "system"]
        conversations = [
            {"from": _SHAREGPT_ROLES.get(t["role"], "human"), "value": _text(t["content"])}
            for t in turns
            if t["role"] != "system"
        ]
        out: dict[str, Any] = {"conversations": conversations}
        if system:
            out["system"] = "\n".join(system)
        return out
