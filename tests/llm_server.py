"""A local OpenAI-compatible endpoint for the LLM tests: it replays a script of replies in order and
records every request, so a test drives the real `openai` client over real HTTP."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Status:
    """Answer one request with this HTTP status (429 carries Retry-After: 0, so the client's backoff is short)."""

    code: int


@dataclass(frozen=True)
class Slow:
    """Answer after `seconds` (past the client's timeout, the client gives up first)."""

    seconds: float
    text: str


Step = str | Status | Slow


class ScriptedEndpoint:
    """`with ScriptedEndpoint([...]) as llm:` serves at `llm.url`; `llm.requests` are the chat bodies."""

    def __init__(self, script: list[Step], models: tuple[str, ...] = ("scripted",)) -> None:
        self.script = list(script)
        self.models = models
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                endpoint._send(self, 200, {"object": "list", "data": [
                    {"id": m, "object": "model", "created": 0, "owned_by": "test"} for m in endpoint.models]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if body.get("model") not in endpoint.models:
                    endpoint._send(self, 404, {"error": {"message": f"model {body.get('model')!r} not found",
                                                         "type": "invalid_request_error"}})
                    return
                with endpoint._lock:
                    endpoint.requests.append(body)
                    step = endpoint.script.pop(0) if endpoint.script else Status(500)
                if isinstance(step, Status):
                    endpoint._send(self, step.code, {"error": {"message": f"scripted {step.code}"}})
                    return
                if isinstance(step, Slow):
                    time.sleep(step.seconds)
                    step = step.text
                prompt_chars = sum(len(str(m.get("content", ""))) for m in body["messages"])
                endpoint._send(self, 200, {
                    "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": step}}],
                    "usage": {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(step) // 4,
                              "total_tokens": prompt_chars // 4 + len(step) // 4}})

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, code: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        try:
            handler.send_response(code)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            if code == 429:
                handler.send_header("Retry-After", "0")
            handler.end_headers()
            handler.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
            pass

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/v1"

    def __enter__(self) -> ScriptedEndpoint:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def asked(self, i: int) -> str:
        """The last user message of request i (what the loop asked)."""
        return self.requests[i]["messages"][-1]["content"]


def module(code: str) -> str:
    """A reply as a model writes one: prose around one fenced module."""
    return f"Here is the rewritten kernel.\n\n```python\n{code.rstrip()}\n```\n\nIt keeps the wrapper's signature."


def main() -> None:
    """Serve replies from files until killed (scripts/device_llm_demo.sh): each --reply file's text,
    fenced as a model writes it, answers one request in turn; the URL is written to --url-file."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--reply", action="append", required=True, type=Path)
    parser.add_argument("--url-file", required=True, type=Path)
    args = parser.parse_args()
    endpoint = ScriptedEndpoint([module(path.read_text()) for path in args.reply])
    args.url_file.write_text(endpoint.url)
    print(f"serving {len(args.reply)} scripted replies at {endpoint.url}", flush=True)
    endpoint.server.serve_forever()


if __name__ == "__main__":
    main()
