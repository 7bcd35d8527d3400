"""Progress bars for long jobs (tqdm when installed, otherwise periodic log lines)."""
from __future__ import annotations

import logging
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")
log = logging.getLogger("foco")


class NoBar:
    """A bar that shows nothing (a quiet job, or a rank other than 0)."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "NoBar":
        return self

    def __exit__(self, *exc) -> None:
        pass


class Bar:
    """A counter with a visible bar: `update(n)` as work finishes, `close()` at the end (or use `with`)."""

    def __init__(self, total: int | None, desc: str = "", initial: int = 0):
        self.total, self.desc, self.n = total, desc, initial
        try:
            from tqdm.auto import tqdm
        except ImportError:  # the core does not require tqdm
            self._tqdm = None
        else:
            self._tqdm = tqdm(total=total, desc=desc, initial=initial, dynamic_ncols=True, mininterval=1.0)

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._tqdm is not None:
            self._tqdm.update(n)
        elif self.total and (self.n == self.total or self.n % max(1, self.total // 10) < n):
            log.info("%s: %d/%d", self.desc, self.n, self.total)

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(items: Iterable[T], total: int | None = None, desc: str = "") -> Iterator[T]:
    """Iterates over `items`, advancing a bar by one per item."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Bar(total, desc) as bar:
        for item in items:
            yield item
            bar.update(1)
