"""A client for the OpenAI-compatible chat-completions API (vLLM, llama.cpp's server, Ollama, TGI, ...).

Standard library only. `ChatClient.complete` makes one request over a kept-alive HTTP/1.1 connection: a pool per
server, at most `connections` open to each, on `http.client`, whose cost per request stays flat at hundreds of
requests in flight (httpx's pool was measured at about 40x the CPU: docs/benchmarks.md). It classifies failures:
a `RetryableError` for timeouts, connections reset mid-answer, HTTP 429 and 5xx; a `ConfigError` for a refused
connection, a host that does not resolve, a URL that is not http(s), and the other 4xx answers (a wrong URL, model
or key fails every request, so the job stops instead of falling back to the rule decomposer for every caption).
`attempt` is one try of one request (ask, parse strictly); the retry, backoff and fallback rules around it live in
`decompose.pipeline`, the one engine of every LLM job.
"""
from __future__ import annotations

import http.client
import json
import os
import random
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class RetryableError(RuntimeError):
    pass


class ConfigError(RuntimeError):
    pass


class InvalidAnswer(ValueError):
    """The model answered, but not with something the caller's parser accepts (the reason says why)."""


@dataclass
class ChatConfig:
    url: str = ""           # base URL, e.g. http://127.0.0.1:8000/v1 (env FOCO_LLM_URL or OPENAI_BASE_URL)
    model: str = ""         # env FOCO_LLM_MODEL; llama.cpp's server accepts any name
    api_key: str = ""       # env FOCO_LLM_API_KEY or OPENAI_API_KEY; sent as a Bearer token when set
    timeout_s: float = 60.0
    max_tokens: int = 400
    temperature: float = 0.0
    json_mode: bool = False  # ask for response_format json_object (llama.cpp, vLLM and Ollama support it)

    def resolved(self) -> "ChatConfig":
        url = self.url or os.environ.get("FOCO_LLM_URL") or os.environ.get("OPENAI_BASE_URL") or ""
        if not url:
            raise ConfigError("no LLM server URL: pass --llm-url or set FOCO_LLM_URL (e.g. http://127.0.0.1:8000/v1)")
        return ChatConfig(url=url.rstrip("/"), model=self.model or os.environ.get("FOCO_LLM_MODEL", "default"),
                          api_key=self.api_key or os.environ.get("FOCO_LLM_API_KEY")
                          or os.environ.get("OPENAI_API_KEY", ""),
                          timeout_s=self.timeout_s, max_tokens=self.max_tokens, temperature=self.temperature,
                          json_mode=self.json_mode)


@dataclass
class ChatAnswer:
    text: str
    finish_reason: str
    completion_tokens: int


class Unreachable(ConfigError):
    """A refused connection, a DNS failure: the server is not there (a configuration error with one server)."""


class ChatClient:
    """Chat completions from one server, or several (`--llm-url A,B,...`) taken round-robin with per-server health:
    a server that refuses, times out or answers 5xx/429 rests for `cooldown_s` (doubling while it keeps failing)
    and requests go to the others; only when every server refuses is the job stopped as misconfigured."""

    cooldown_s: float = 5.0

    def __init__(self, cfg: ChatConfig, connections: int = 4):
        self.cfg = cfg.resolved()
        urls = [u.strip().rstrip("/") for u in self.cfg.url.split(",") if u.strip()]
        for u in urls:
            if not u.startswith(("http://", "https://")):
                raise ConfigError(f"--llm-url {u!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")
        self.endpoints = [u if u.endswith("/chat/completions") else u + "/chat/completions" for u in urls]
        self.endpoint = self.endpoints[0]
        self._lock = threading.Lock()
        self._next = 0
        self._down_until = [0.0] * len(self.endpoints)
        self._failures = [0] * len(self.endpoints)
        self.server_stats = {e: {"requests": 0, "failures": 0} for e in self.endpoints}
        # One pool per server: up to `connections` kept-alive connections each (a job's requests in flight may all
        # go to one server while the others rest).
        self._pools = [ConnectionPool(e, connections, self.cfg.timeout_s) for e in self.endpoints]

    def close(self) -> None:
        for pool in self._pools:
            pool.close()

    def _pick(self, exclude: set[int]) -> int:
        with self._lock:
            now = time.monotonic()
            n = len(self.endpoints)
            order = [(self._next + k) % n for k in range(n)]
            healthy = [i for i in order if i not in exclude and self._down_until[i] <= now]
            pool = healthy or sorted((i for i in order if i not in exclude), key=lambda i: self._down_until[i])
            i = pool[0]
            self._next = (i + 1) % n
            self.server_stats[self.endpoints[i]]["requests"] += 1
            return i

    def _mark(self, i: int, ok: bool) -> None:
        with self._lock:
            if ok:
                self._failures[i] = 0
                self._down_until[i] = 0.0
                return
            self._failures[i] += 1
            self.server_stats[self.endpoints[i]]["failures"] += 1
            self._down_until[i] = time.monotonic() + self.cooldown_s * 2 ** min(self._failures[i] - 1, 6)

    def complete(self, messages: list[dict[str, str]], temperature: float | None = None) -> ChatAnswer:
        """One answer; a refused server hands the request to the next one at once (retryable failures are left
        to the caller's retry policy, whose next try goes to another server)."""
        refused: set[int] = set()
        while True:
            i = self._pick(refused)
            try:
                answer = self._complete_at(i, messages, temperature)
            except Unreachable:
                self._mark(i, False)
                refused.add(i)
                if len(refused) == len(self.endpoints):
                    raise
                continue
            except RetryableError:
                self._mark(i, False)
                raise
            self._mark(i, True)
            return answer

    def _complete_at(self, i: int, messages: list[dict[str, str]], temperature: float | None) -> ChatAnswer:
        endpoint = self.endpoints[i]
        body: dict[str, Any] = {"model": self.cfg.model, "messages": messages, "max_tokens": self.cfg.max_tokens,
                                "temperature": self.cfg.temperature if temperature is None else temperature}
        if self.cfg.json_mode:
            body["response_format"] = {"type": "json_object"}
        headers = {"Content-Type": "application/json"}
        if self.cfg.api_key:
            headers["Authorization"] = f"Bearer {self.cfg.api_key}"
        status, raw = self._pools[i].post(json.dumps(body).encode(), headers)
        if status != 200:
            detail = raw[:200].decode("utf-8", "replace")
            if status == 429 or status >= 500:
                raise RetryableError(f"HTTP {status}: {detail}")
            raise ConfigError(f"{endpoint} answered HTTP {status}: {detail}")
        try:
            data = json.loads(raw)
            choice = data["choices"][0]
            text = choice["message"]["content"] or ""
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise RetryableError(f"the server's reply is not a chat completion: {raw[:120]!r}") from exc
        usage = data.get("usage") or {}
        return ChatAnswer(text, str(choice.get("finish_reason") or ""), int(usage.get("completion_tokens") or 0))


class ConnectionPool:
    """Kept-alive HTTP/1.1 connections to one endpoint, at most `limit` open, shared by the job's threads.

    A connection goes back to the pool after a complete answer the server did not mark `Connection: close`, and is
    closed after any failure. A request that fails on a reused connection before its status line came (the server
    closed it while idle, over TLS too) is sent once more on a new connection; a failure while the answer arrives
    is a retryable failure like any other. Proxies (HTTP(S)_PROXY) are not used: give the server's own URL."""

    def __init__(self, endpoint: str, limit: int, timeout_s: float):
        parts = urllib.parse.urlsplit(endpoint)
        self.endpoint, self.timeout_s = endpoint, timeout_s
        self.host, self.port = parts.hostname or "", parts.port
        self.https = parts.scheme == "https"
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._slots = threading.BoundedSemaphore(limit)
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _new(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout_s)

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """(status, body) of one POST; raises `Unreachable` or `RetryableError`."""
        if not self._slots.acquire(timeout=self.timeout_s):
            raise RetryableError(f"timeout after {self.timeout_s:g}s waiting for a connection to {self.endpoint}")
        try:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            reused = conn is not None
            while True:
                conn = conn or self._new()
                try:
                    conn.request("POST", self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                except (socket.timeout, TimeoutError) as exc:
                    conn.close()
                    raise RetryableError(f"timeout after {self.timeout_s:g}s") from exc
                except (ConnectionRefusedError, socket.gaierror) as exc:
                    conn.close()
                    raise Unreachable(f"cannot reach the LLM server at {self.endpoint} ({exc}): is it running? "
                                      "check --llm-url") from exc
                except (http.client.HTTPException, OSError) as exc:  # ssl.SSLError included
                    conn.close()
                    if reused:  # no answer came on a kept-alive connection the server closed: once more, anew
                        conn, reused = None, False
                        continue
                    raise RetryableError(f"connection failed: {exc!r}") from exc
                try:
                    raw = resp.read()
                except (socket.timeout, TimeoutError) as exc:
                    conn.close()
                    raise RetryableError(f"timeout after {self.timeout_s:g}s") from exc
                except (http.client.HTTPException, OSError) as exc:  # reset mid-answer: the server worked on it
                    conn.close()
                    raise RetryableError(f"connection failed: {exc!r}") from exc
                if resp.will_close:
                    conn.close()
                else:
                    with self._lock:
                        self._idle.append(conn)
                return resp.status, raw
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


@dataclass
class RetryPolicy:
    max_retries: int = 3
    backoff_s: float = 1.0  # first wait; doubles per retry, capped at backoff_max_s, with jitter
    backoff_max_s: float = 30.0
    retry_temperature: float = 0.7  # retries of an invalid answer sample, so that they can differ


    def wait_s(self, retry: int) -> float:
        """The wait before retry number `retry` (1, 2, ...): doubling from backoff_s, capped, with jitter."""
        return min(self.backoff_max_s, self.backoff_s * 2 ** (retry - 1)) * random.uniform(0.5, 1.0)


def attempt(client: "ChatClient", messages: list[dict[str, str]], parse: Callable[[str], T],
            temperature: float | None, count: Callable[..., None], classify: Callable[[str, bool], str]
            ) -> tuple[T | None, str]:
    """One try: ask, parse strictly. (parsed, "") or (None, the failure's category) after a timeout, a 5xx/429 or
    an invalid answer. `count(key, n=1)` keeps the statistics; `classify(message, invalid)` names a failure. A
    `ConfigError` (wrong URL, model or key) propagates."""
    count("requests")
    answer = None
    try:
        answer = client.complete(messages, temperature)
        count("completion_tokens", answer.completion_tokens)
        return parse(answer.text), ""
    except RetryableError as exc:
        reason = classify(str(exc), False)
    except InvalidAnswer as exc:
        reason = "truncated" if answer is not None and answer.finish_reason == "length" else classify(str(exc), True)
    count(f"error:{reason}")
    return None, reason
