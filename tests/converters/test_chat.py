"""ChatConverter: LLaMA-Factory records from messages and the action."""

from __future__ import annotations

import json

import pytest

from expstore.converters import ChatConverter
from tests.helpers import make_row

PROMPT = [
    {"role": "system", "content": "You browse the web."},
    {"role": "user", "content": "Open the login page."},
]


def test_messages_format_appends_the_action_as_the_assistant_turn() -> None:
    row = make_row(messages=PROMPT, action="click(login)")
    (record,) = ChatConverter().to_dataset_row([row])
    assert record == {"messages": [*PROMPT, {"role": "assistant", "content": "click(login)"}]}
    json.dumps(record)  # ready for JSONL


def test_sharegpt_format_uses_from_value_and_a_system_key() -> None:
    row = make_row(messages=PROMPT, action={"action_string": "click(login)", "x": 1})
    (record,) = ChatConverter(format="sharegpt").to_dataset_row([row])
    assert record == {
        "conversations": [
            {"from": "human", "value": "Open the login page."},
            {"from": "gpt", "value": "click(login)"},
        ],
        "system": "You browse the web.",
    }


def test_a_final_assistant_turn_equal_to_the_action_is_not_repeated() -> None:
    messages = [*PROMPT, {"role": "assistant", "content": "click(login)"}]
    (record,) = ChatConverter().to_dataset_row([make_row(messages=messages, action="click(login)")])
    assert record["messages"] == messages


def test_structured_actions_become_text() -> None:
    row = make_row(messages=PROMPT, actions=[{"tool": "browser", "args": {"url": "u"}}])
    (record,) = ChatConverter(action_to_text=lambda a: a[0]["tool"]).to_dataset_row([row])
    assert record["messages"][-1] == {"role": "assistant", "content": "browser"}
    (default,) = ChatConverter().to_dataset_row([row])
    assert json.loads(default["messages"][-1]["content"]) == {
        "args": {"url": "u"},
        "tool": "browser",
    }


def test_rows_without_a_prompt_or_a_response_are_refused() -> None:
    no_messages = make_row(action="x")
    with pytest.raises(
        ValueError, match=f"row {no_messages.id}: ChatConverter needs exp_data.messages"
    ):
        ChatConverter().to_dataset_row([no_messages])
    no_answer = make_row(messages=PROMPT)
    with pytest.raises(ValueError, match="no response to learn"):
        ChatConverter().to_dataset_row([no_answer])


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="'messages' or 'sharegpt'"):
        ChatConverter(format="alpaca")
