"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1 for the
framework checks that need a model (verifiers, HUD): no network LLM, the same answers
every run.

``MockModel(policy).start()`` serves ``POST /v1/chat/completions`` (and ``/chat/completions``)
and ``GET /v1/models``; ``policy(messages, tools) -> dict`` returns either
``{"tool": name, "args": {...}}`` (one tool call) or ``{"text": "..."}`` (the final
answer). ``requests`` records every request body.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

Policy = Callable[[list[dict[str, Any]], list[dict[str, Any]]], dict[str, Any]]


class MockModel:
    def __init__(self, policy: Policy, model: str = "mock-model") -> None:
        self.policy = policy
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(body)
        step = self.policy(body.get("messages") or [], body.get("tools") or [])
        msg: dict[str, Any] = {"role": "assistant", "content": None}
        if "tool" in step:
            msg["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": step["tool"], "arguments": json.dumps(step.get("args") or {})},
                }
            ]
            finish = "tool_calls"
        else:
            msg["content"] = step.get("text", "")
            finish = "stop"
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [{"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }

    def start(self) -> "MockModel":
        mock = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": mock.model, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                if self.path.rstrip("/").endswith("/chat/completions"):
                    try:
                        self._send(200, mock._completion(body))
                    except Exception as e:  # noqa: BLE001 - the client sees the error
                        self._send(500, {"error": {"message": f"mock policy failed: {e!r}"}})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
