"""A scripted OpenAI-compatible chat-completions server on loopback, for fault injection.

It answers a caption "x and y and z" with the pairs (x | y and z), (y | x and z), ...; `script[caption]` lists
behaviours used one per request before falling back to a valid answer: "timeout", "500", "bad_json",
"truncated", "too_many", "ungrounded", "401". `answer(user_message) -> content`, when given, replaces the
decomposition answer (other jobs, e.g. the edit writer).
"""
from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def valid_pairs(caption: str) -> list[dict[str, str]]:
    parts = caption.split(" and ")
    return [{"local": p, "context": " and ".join(parts[:i] + parts[i + 1:]) or "nothing else"}
            for i, p in enumerate(parts)]


class FakeLLM:
    def __init__(self, script: dict[str, list[str]] | None = None, delay_s: float = 0.0, hang_s: float = 3.0,
                 answer=None):
        self.answer = answer
        self.script = defaultdict(list, {k: list(v) for k, v in (script or {}).items()})
        self.delay_s, self.hang_s = delay_s, hang_s
        self.requests: Counter = Counter()
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                caption = body["messages"][-1]["content"].removeprefix("Caption: ")
                with fake.lock:
                    fake.requests[caption] += 1
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                    behaviour = fake.script[caption].pop(0) if fake.script[caption] else "ok"
                try:
                    fake.respond(self, caption, behaviour)
                finally:
                    with fake.lock:
                        fake.in_flight -= 1

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def respond(self, h: BaseHTTPRequestHandler, caption: str, behaviour: str) -> None:
        time.sleep(self.delay_s)
        if behaviour == "timeout":
            time.sleep(self.hang_s)
        if behaviour in ("500", "401"):
            h.send_response(int(behaviour))
            h.end_headers()
            h.wfile.write(b'{"error": "scripted"}')
            return
        content = self.answer(caption) if self.answer else json.dumps({"pairs": valid_pairs(caption)})
        finish = "stop"
        if behaviour == "bad_json":
            content = "Sure! Here are the pairs: local = " + caption
        elif behaviour == "truncated":
            content, finish = content[: len(content) // 2], "length"
        elif behaviour == "too_many":
            content = json.dumps({"pairs": valid_pairs(caption) * 6})
        elif behaviour == "ungrounded":
            content = json.dumps({"pairs": [{"local": "a purple elephant", "context": caption}]})
        reply = {"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": finish}],
                 "usage": {"completion_tokens": len(content) // 4}}
        data = json.dumps(reply).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def __enter__(self) -> "FakeLLM":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
