"""Micro-batching for `foco serve`: the composed queries that arrive within `max_wait_ms` of each other (at most
`max_batch`) are answered by one `SearchEngine.search_many` call, in a thread of the batcher's own, never on the
event loop and never in the thread pool that serves images and thumbnails.

    batcher = MicroBatcher(engine.search_many, max_batch=32, max_wait_ms=5)
    answer = await batcher.submit(query)      # in a request handler

The first query of a batch waits at most `max_wait_ms` for company; a batch runs while the next one gathers.
`max_batch=1` answers one query at a time, as a server without batching does (the load benchmark's baseline).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import ctypes.util
import time
from typing import Any, Callable


def _trimmer() -> Callable[[], None]:
    """glibc's malloc_trim(0), which hands the heap's free pages back to the system (a batch's tensors would
    otherwise stay in the process's resident set after they are freed); a no-op elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    return lambda: trim(0)


_TRIM = _trimmer()


def freeze_heap() -> None:
    """Moves every object alive now (the model, the index, the libraries) out of the garbage collector's reach
    (`gc.freeze`): a full collection then walks only what requests allocate, instead of pausing every thread for
    the whole heap, which shows as a latency spike on /healthz."""
    import gc
    gc.collect()
    gc.freeze()
TRIM_EVERY_S = 1.0  # under load, at most once a second after a batch; and whenever the batcher goes idle


class MicroBatcher:
    def __init__(self, run: Callable[[list], list], max_batch: int = 32, max_wait_ms: float = 5.0):
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError("--max-batch must be >= 1 and --max-wait-ms >= 0")
        self.run, self.max_batch, self.max_wait = run, max_batch, max_wait_ms / 1000
        self._trimmed = 0.0
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="foco-batch")
        self.batches = 0  # how many batches ran, and how many queries they held (for /metrics)
        self.queries = 0

    async def submit(self, item: Any) -> Any:
        """The answer to `item`; an exception the engine returned for it is raised here."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._task is None or self._task.done():  # first use, or a new event loop
            self._loop, self._queue = loop, asyncio.Queue()
            self._task = loop.create_task(self._serve())
        fut = loop.create_future()
        await self._queue.put((item, fut))
        out = await fut
        if isinstance(out, BaseException):
            raise out
        return out

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = time.monotonic() + self.max_wait
            while len(batch) < self.max_batch:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), left))
                except asyncio.TimeoutError:
                    break
            items = [item for item, _ in batch]
            try:
                answers = await loop.run_in_executor(self._pool, self._run, items)
            except Exception as exc:  # the engine failed as a whole: every query of the batch gets the error
                answers = [exc] * len(items)
            self.batches += 1
            self.queries += len(items)
            for (_, fut), answer in zip(batch, answers):
                if not fut.done():
                    fut.set_result(answer)
            if self._queue.empty():  # idle: the batches' freed memory goes back to the system now
                await loop.run_in_executor(self._pool, self._trim)

    def _run(self, items: list) -> list:
        answers = self.run(items)
        if not self.batches:  # the first batch loaded the methods: their objects join the startup's, frozen
            freeze_heap()
        if time.monotonic() - self._trimmed > TRIM_EVERY_S:  # under load: at most once a second
            self._trim()
        return answers

    def _trim(self) -> None:
        _TRIM()
        self._trimmed = time.monotonic()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
