"""What the AWorld tests share: whether AWorld 0.3.2 is here, and a fake OpenAI server.

AWorld 0.3.2 is installed by the ``aworld`` extra (in ``test``). Without it the tests skip,
saying what to install (each module calls :func:`require_aworld` first); with
``EXPSTORE_REQUIRE_AWORLD=1`` (as CI sets) they fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

# AWorld writes its log files under the current directory (./logs) unless told otherwise,
# read once, when its logger module is imported.
os.environ.setdefault(
    "AWORLD_LOG_PATH", os.path.join(tempfile.gettempdir(), "expstore-aworld-logs")
)

INSTALL = "pip install -e '.[aworld]'"


def _aworld_03() -> bool:
    try:
        return importlib.util.find_spec("aworld.core.storage.base") is not None
    except ImportError:
        return False


#: Why these tests cannot run here ('' when they can).
MISSING = (
    ""
    if _aworld_03()
    else (f"AWorld 0.3.2 is not installed (no aworld.core.storage); run {INSTALL}")
)


def require_aworld() -> None:
    """Skip the calling test module when AWorld 0.3 is missing (saying what to install);
    fail it under ``EXPSTORE_REQUIRE_AWORLD=1``."""
    if not MISSING:
        return
    if os.environ.get("EXPSTORE_REQUIRE_AWORLD") == "1":
        pytest.fail(f"EXPSTORE_REQUIRE_AWORLD=1 but {MISSING}", pytrace=False)
    pytest.skip(MISSING, allow_module_level=True)


class _Chat(BaseHTTPRequestHandler):
    """OpenAI's chat completions, scripted: with tools offered and no tool result in the
    conversation yet, a call of the first tool (its required arguments all "3"); else the
    final answer."""

    server: FakeOpenAI

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        self.server.requests.append(body)
        tools = body.get("tools") or []
        answered = any(m.get("role") == "tool" for m in body.get("messages", []))
        if tools and not answered:
            function = tools[0]["function"]
            arguments = {k: "3" for k in function.get("parameters", {}).get("required", [])}
            call = {
                "id": f"call_{len(self.server.requests)}",
                "type": "function",
                "function": {"name": function["name"], "arguments": json.dumps(arguments)},
            }
            message: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": ANSWER}, "stop"
        reply = json.dumps(
            {
                "id": f"chatcmpl-{len(self.server.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "fake"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


#: What the fake model finally answers.
ANSWER = "The answer is 9."


class FakeOpenAI(ThreadingHTTPServer):
    """The fake server on 127.0.0.1 (a free port), serving from a daemon thread;
    ``base_url`` is what an OpenAI client is given."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Chat)
        self.requests: list[dict[str, Any]] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}/v1"

    def __enter__(self) -> FakeOpenAI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
