"""The one engine of every LLM job (`foco decompose --decomposer llm`, `foco edits generate --writer llm`, `foco
edits rewrite --writer llm`): requests in flight across items, retries scheduled rather than slept, results handed
on in groups.

- `concurrency` requests are on the wire at any time, whatever the store's batch: an item (a caption, or a source
  caption with its edits) is opened as soon as a request slot frees, and a slow or retried request delays only its
  own item.
- A request that times out, gets a 5xx/429 or an invalid answer is asked again after a backoff (`RetryPolicy`);
  while it waits it holds no slot, but it counts against the window (twice `concurrency`) that new items open in,
  so an outage or a rate limit slows the job instead of spending every item's tries. After the last retry its answer is `(None, reason)` and the job's `finish`
  writes the fallback.
- Completed items reach `finish` as they complete, in groups of `commit_every` or at least every
  `commit_seconds` (one store transaction each). The stores key rows by content (caption hash and settings), so
  the order of the transactions does not matter and a killed job, rerun, stores every item exactly once.
- A `ConfigError` (a wrong URL, model or key fails every request) stops the job: the items already completed are
  handed to `finish` (those whose last request is still in flight too, once it ends), no new request is sent, and
  the error propagates.
"""
from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, TypeVar

from .client import ChatClient, RetryPolicy, attempt

T = TypeVar("T")
Answer = tuple[Any, str]  # (parsed answer, "") or (None, the last failure's category)


@dataclass
class Ask:
    """One request of an item: the chat messages and the strict parser of the answer."""

    messages: list[dict[str, str]]
    parse: Callable[[str], Any]


@dataclass
class PipelineConfig:
    concurrency: int = 4             # requests on the wire
    commit_every: int = 256          # completed items per `finish` call (one store transaction)
    commit_seconds: float = 5.0      # ... or at least this often while items complete
    policy: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.commit_every < 1 or not self.commit_seconds > 0:
            raise ValueError("concurrency and commit_every must be >= 1 and commit_seconds > 0")


class _Open(Generic[T]):
    """An item whose answers are not all in."""

    __slots__ = ("item", "asks", "answers", "left")

    def __init__(self, item: T, asks: list[Ask]):
        self.item, self.asks = item, asks
        self.answers: list[Answer | None] = [None] * len(asks)
        self.left = len(asks)


def run_pipeline(items: Iterable[T], asks_of: Callable[[T], list[Ask]], client: ChatClient, cfg: PipelineConfig,
                 finish: Callable[[list[tuple[T, list[Answer]]]], None], count: Callable[..., None],
                 classify: Callable[[str, bool], str]) -> None:
    """Asks every item's requests (`asks_of(item)`; an item with none completes at once) and hands each completed
    item with its answers, in the order of its requests, to `finish` (items as they complete; several completing
    together come in any order). `count(key, n=1)` keeps the statistics
    (requests, retries, completion_tokens, error:<category>, fallback); `classify(message, invalid)` names a
    failure."""
    policy = cfg.policy
    pending = iter(items)
    exhausted = False
    ready: deque[tuple[_Open, int, int]] = deque()           # (item, request index, try) to send now
    waiting: list[tuple[float, int, _Open, int, int]] = []   # heap of retries: (due, tie, item, request, try)
    tie = itertools.count()
    running: dict[Future, tuple[_Open, int, int]] = {}
    done: list[tuple[T, list[Answer]]] = []
    last_commit = time.monotonic()
    error: BaseException | None = None
    # Requests are submitted up to twice the slots ahead, so that a worker never waits while the main thread is
    # inside `finish`: the executor's `concurrency` threads cap what is on the wire.
    depth = 2 * cfg.concurrency
    pool = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="foco-llm")
    stop = threading.Event()
    try:
        while True:
            now = time.monotonic()
            while waiting and waiting[0][0] <= now:
                _, _, o, k, n = heapq.heappop(waiting)
                ready.append((o, k, n))
            while error is None and len(running) < depth:
                if not ready:
                    # A new item opens only while the requests sent and the retries waiting fit the window: a
                    # server that fails fast (an outage, a rate limit) slows the job down instead of using up
                    # every item's tries.
                    if exhausted or len(running) + len(waiting) >= depth:
                        break
                    try:
                        item = next(pending)
                    except StopIteration:
                        exhausted = True
                        break
                    asks = asks_of(item)
                    if not asks:
                        done.append((item, []))
                        if len(done) >= cfg.commit_every:
                            break  # a run of items without requests is stored in groups too
                        continue
                    o = _Open(item, asks)
                    ready.extend((o, k, 0) for k in range(len(asks)))
                    continue
                o, k, n = ready.popleft()
                temperature = None if n == 0 else policy.retry_temperature
                fut = pool.submit(_attempt, stop, client, o.asks[k].messages, o.asks[k].parse, temperature,
                                  count, classify)
                running[fut] = (o, k, n)
            over = not running and (error is not None or (exhausted and not ready and not waiting))
            if done and (over or len(done) >= cfg.commit_every
                         or time.monotonic() - last_commit >= cfg.commit_seconds):
                group, done = done, []
                finish(group)
                last_commit = time.monotonic()
            if over:
                break
            timeout = None
            if done and math.isfinite(cfg.commit_seconds):
                timeout = max(0.0, cfg.commit_seconds - (time.monotonic() - last_commit))
            if waiting and error is None:
                due = max(0.0, waiting[0][0] - time.monotonic())
                timeout = due if timeout is None else min(timeout, due)
            if not running:
                time.sleep(timeout or 0.0)  # only retries waiting: sleep until the first is due
                continue
            finished, _ = wait(running, timeout=timeout, return_when=FIRST_COMPLETED)
            for fut in finished:
                o, k, n = running.pop(fut)
                if fut.cancelled():
                    continue
                try:
                    got = fut.result()
                except BaseException as exc:  # a ConfigError, or a bug in a parser: stop the job
                    if error is None:
                        error = exc
                        stop.set()  # nothing more is sent: queued requests are cancelled or skipped
                        for queued in running:
                            queued.cancel()
                    continue
                if got is _SKIPPED:
                    continue
                parsed, reason = got
                if parsed is None and n < policy.max_retries:
                    count("retries")
                    heapq.heappush(waiting, (time.monotonic() + policy.wait_s(n + 1), next(tie), o, k, n + 1))
                    continue
                if parsed is None:
                    count("fallback")
                o.answers[k] = (parsed, reason)
                o.left -= 1
                if o.left == 0:
                    done.append((o.item, o.answers))  # type: ignore[arg-type]
    finally:
        pool.shutdown(wait=error is None, cancel_futures=True)
    if error is not None:
        raise error


_SKIPPED = object()


def _attempt(stop: threading.Event, *args):
    """`client.attempt`, unless the job has stopped since the request was queued."""
    return _SKIPPED if stop.is_set() else attempt(*args)
