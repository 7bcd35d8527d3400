"""A minimal client for the OpenAI-compatible chat-completions API (vLLM, llama.cpp's server, Ollama, TGI, ...).

Standard library only. `ChatClient.complete` makes one request and classifies failures: a `RetryableError` for
timeouts, connections reset mid-answer, HTTP 429 and 5xx; a `ConfigError` for a refused connection, a host that
does not resolve, a URL that is not http(s), and the other 4xx answers (a wrong URL, model or key fails every
request, so the job stops instead of falling back to the rule decomposer for every caption). `ask_until_valid` is the one
retry loop of every LLM job (the decomposer, the edit writer): ask, parse strictly, back off, ask again.
"""
from __future__ import annotations

import json
import os
import random
import socket
import time
import urllib.error
import urllib.request
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


class ChatClient:
    def __init__(self, cfg: ChatConfig):
        self.cfg = cfg.resolved()
        if not self.cfg.url.startswith(("http://", "https://")):
            raise ConfigError(f"--llm-url {self.cfg.url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")
        endpoint = self.cfg.url
        self.endpoint = endpoint if endpoint.endswith("/chat/completions") else endpoint + "/chat/completions"

    def complete(self, messages: list[dict[str, str]], temperature: float | None = None) -> ChatAnswer:
        body: dict[str, Any] = {"model": self.cfg.model, "messages": messages, "max_tokens": self.cfg.max_tokens,
                                "temperature": self.cfg.temperature if temperature is None else temperature}
        if self.cfg.json_mode:
            body["response_format"] = {"type": "json_object"}
        headers = {"Content-Type": "application/json"}
        if self.cfg.api_key:
            headers["Authorization"] = f"Bearer {self.cfg.api_key}"
        req = urllib.request.Request(self.endpoint, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.cfg.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:200].decode("utf-8", "replace")
            if exc.code == 429 or exc.code >= 500:
                raise RetryableError(f"HTTP {exc.code}: {detail}") from exc
            raise ConfigError(f"{self.endpoint} answered HTTP {exc.code}: {detail}") from exc
        except (socket.timeout, TimeoutError) as exc:
            raise RetryableError(f"timeout after {self.cfg.timeout_s:g}s") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (socket.timeout, TimeoutError)):
                raise RetryableError(f"timeout after {self.cfg.timeout_s:g}s") from exc
            if isinstance(exc.reason, (ConnectionRefusedError, socket.gaierror, str)):
                raise ConfigError(f"cannot reach the LLM server at {self.endpoint} ({exc.reason}): is it running? "
                                  "check --llm-url") from exc
            raise RetryableError(f"cannot reach {self.endpoint}: {exc.reason}") from exc
        except (ConnectionError, OSError) as exc:  # reset or closed mid-answer
            raise RetryableError(f"connection failed: {exc}") from exc
        try:
            data = json.loads(raw)
            choice = data["choices"][0]
            text = choice["message"]["content"] or ""
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise RetryableError(f"the server's reply is not a chat completion: {raw[:120]!r}") from exc
        usage = data.get("usage") or {}
        return ChatAnswer(text, str(choice.get("finish_reason") or ""), int(usage.get("completion_tokens") or 0))


@dataclass
class RetryPolicy:
    max_retries: int = 3
    backoff_s: float = 1.0  # first wait; doubles per retry, capped at backoff_max_s, with jitter
    backoff_max_s: float = 30.0
    retry_temperature: float = 0.7  # retries of an invalid answer sample, so that they can differ


def ask_until_valid(client: "ChatClient", messages: list[dict[str, str]], parse: Callable[[str], T],
                    policy: RetryPolicy, count: Callable[..., None], classify: Callable[[str, bool], str]
                    ) -> tuple[T | None, str]:
    """Asks, parses strictly, and asks again on a timeout, a 5xx/429 or an invalid answer, with backoff:
    (parsed, "") or, after the last retry, (None, the last failure's category). `count(key, n=1)` keeps the
    statistics; `classify(message, invalid)` names a failure. A `ConfigError` (wrong URL, model or key) propagates."""
    reason = ""
    for attempt in range(policy.max_retries + 1):
        if attempt:
            count("retries")
            time.sleep(min(policy.backoff_max_s, policy.backoff_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0))
        count("requests")
        answer = None
        try:
            answer = client.complete(messages, None if attempt == 0 else policy.retry_temperature)
            count("completion_tokens", answer.completion_tokens)
            return parse(answer.text), ""
        except RetryableError as exc:
            reason = classify(str(exc), False)
        except InvalidAnswer as exc:
            reason = "truncated" if answer is not None and answer.finish_reason == "length" else \
                classify(str(exc), True)
        count(f"error:{reason}")
    count("fallback")
    return None, reason
