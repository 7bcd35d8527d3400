"""A stub OpenAI-compatible chat-completions server on 127.0.0.1, for measuring the LLM client: its own overhead, how
many requests it keeps in flight, and what it does under faults. It is not a stand-in for a real model (the real
server check is experiments/llm_server.sh).

Each POST .../chat/completions is answered after `--delay` seconds with a valid answer to foco's prompts:
- a decomposition (the caption's words cut into the number of pairs the system prompt asks for, each local phrase a
  run of the caption's words, each context the rest), or
- an edit instruction ("please <kind> <the new phrase, word or the removed phrase>", and a target caption when
  the prompt asks for one).
A share of requests (`--fail-500`, `--fail-429`) is answered with that status, and a share (`--invalid`) with an
answer that is not JSON, drawn from a seeded generator. HTTP/1.1 with kept-alive connections; asyncio, one thread.
GET /stats gives the counts (requests, connections opened, most requests in flight, outcomes); POST /stats/reset
zeroes them.

    python experiments/llm_stub.py --port 8800 --delay 1.0 [--fail-500 0.1 --invalid 0.05 --seed 0]
    # in Python: with StubServer(delay_s=0.05) as stub: ... stub.url, stub.stats()
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import threading
from collections import Counter

_RANGE = re.compile(r"between (\d+) and (\d+) pairs")


def decomposition(caption: str, system: str) -> str:
    """A valid answer for foco's decomposition prompt: k pairs, k the most the prompt allows that the caption's
    words can give (at least the fewest it asks for), each local a distinct run of words of the caption."""
    m = _RANGE.search(system)
    lo, hi = (int(m.group(1)), int(m.group(2))) if m else (1, 5)
    words = caption.split()
    k = max(lo, min(hi, 3, len(words)))
    size = max(1, len(words) // k)
    runs = [" ".join(words[i * size:(i + 1) * size if i < k - 1 else len(words)]) for i in range(k)]
    pairs = [{"local": r, "context": " ".join(x for j, x in enumerate(runs) if j != i) or "the rest of the scene"}
             for i, r in enumerate(runs)]
    return json.dumps({"pairs": pairs})


def instruction(fields: dict, system: str) -> str:
    """A valid answer for foco's edit-writer prompt."""
    words = fields.get("new") or fields.get("phrase") or "it"
    answer = {"instruction": f"please {fields.get('kind', 'change')} {words}"}
    if '"target"' in system:
        answer["target"] = f"{fields.get('caption', '')} with {words}"
    return json.dumps(answer)


class Stub:
    def __init__(self, delay_s: float = 1.0, fail_500: float = 0.0, fail_429: float = 0.0, invalid: float = 0.0,
                 seed: int = 0, keep_captions: bool = False):
        self.delay_s, self.fail_500, self.fail_429, self.invalid = delay_s, fail_500, fail_429, invalid
        self.rng = random.Random(seed)
        self.keep_captions = keep_captions  # count requests per caption (tests: nothing asked twice)
        self.reset()

    def reset(self) -> None:
        self.counts: Counter = Counter()
        self.by_caption: Counter = Counter()
        self.in_flight = self.max_in_flight = 0

    def stats(self) -> dict:
        return {**self.counts, "max_in_flight": self.max_in_flight}

    def outcome(self) -> str:
        x = self.rng.random()
        if x < self.fail_500:
            return "500"
        if x < self.fail_500 + self.fail_429:
            return "429"
        if x < self.fail_500 + self.fail_429 + self.invalid:
            return "invalid"
        return "ok"

    async def answer(self, body: bytes) -> tuple[int, bytes]:
        self.counts["requests"] += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            req = json.loads(body)
            messages = req["messages"]
            system, user = messages[0]["content"], messages[-1]["content"]
            outcome = self.outcome()
            self.counts[outcome] += 1
            if self.keep_captions:
                self.by_caption[user] += 1
            await asyncio.sleep(self.delay_s)
            if outcome in ("500", "429"):
                return int(outcome), b'{"error": "stub"}'
            if outcome == "invalid":
                content = "Sure! Here is what you asked for."
            elif user.startswith("Caption: "):
                content = decomposition(user[len("Caption: "):], system)
            else:
                content = instruction(json.loads(user), system)
            reply = {"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                     "usage": {"completion_tokens": max(1, len(content) // 4)}}
            return 200, json.dumps(reply).encode()
        finally:
            self.in_flight -= 1

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counts["connections"] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, version = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if method == "POST" and path.endswith("/chat/completions"):
                    status, data = await self.answer(body)
                elif path == "/stats":
                    if method == "POST":
                        self.reset()
                    status, data = 200, json.dumps(self.stats()).encode()
                else:
                    status, data = 404, b'{"error": "not found"}'
                close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
                writer.write(f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\nContent-Type: "
                             f"application/json\r\nContent-Length: {len(data)}\r\n"
                             f"{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n".encode() + data)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()


class StubServer:
    """The stub on a thread of its own (its own event loop), for tests: `with StubServer(...) as s: s.url`."""

    def __init__(self, port: int = 0, **kw):
        self.stub = Stub(**kw)
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self.stub.handle, "127.0.0.1", self.port, backlog=1024))
        self.port = self._server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stats(self) -> dict:
        return self.stub.stats()

    def __enter__(self) -> "StubServer":
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        async def shutdown() -> None:
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=8800)
    p.add_argument("--delay", type=float, default=1.0, help="seconds before each answer")
    p.add_argument("--fail-500", type=float, default=0.0, help="share of requests answered HTTP 500")
    p.add_argument("--fail-429", type=float, default=0.0, help="share of requests answered HTTP 429")
    p.add_argument("--invalid", type=float, default=0.0, help="share of requests answered with invalid JSON")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    stub = Stub(a.delay, a.fail_500, a.fail_429, a.invalid, a.seed)

    async def serve() -> None:
        server = await asyncio.start_server(stub.handle, "127.0.0.1", a.port, backlog=1024)
        print(f"llm stub on http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1 (delay {a.delay:g}s)",
              flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
