"""The per-image features of an index, on disk: append-only arrays, read by row.

    INDEX/vectors/shard-00000.f32    global features: raw little-endian float32, (rows, D) row-major
    INDEX/patches/shard-00000.f16    with --with-patches: FoCo's patch features, raw float16, (rows, P, D)

Image row `slot` s lies in shard s // SHARD_ROWS at row s % SHARD_ROWS; the SQLite store (`store.py`) records
each image's slot and the next free one. A batch is written and flushed (fsync) before the transaction that
records its slots commits, so a killed build leaves at most rows past the committed end, which `truncate` cuts
back when the index is next opened for writing. Slots of removed images are never reused (their rows are dead
bytes until the index is rebuilt into a new folder). Readers copy out only the rows asked for, with positioned
reads (pread) of one descriptor per shard: nothing is loaded whole or mapped, and the pages stay in the kernel's page
cache, shared by every server process over the same index.
"""
from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import numpy as np

SHARD_ROWS = 1 << 20  # rows per shard file: 3 GB of 768-d float32 vectors, 403 GB of ViT-L/14 fp16 patches at most


class FeatureArrays:
    """Rows of shape `row_shape` in `dtype` under `folder`, addressed by slot."""

    def __init__(self, folder: str | Path, row_shape: tuple[int, ...], dtype: str, shard_rows: int = SHARD_ROWS):
        self.folder, self.row_shape, self.dtype = Path(folder), tuple(int(v) for v in row_shape), np.dtype(dtype)
        self.shard_rows = shard_rows
        self.row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize
        self.suffix = {np.dtype("float32"): ".f32", np.dtype("float16"): ".f16"}[self.dtype]
        self._fds: dict[int, int] = {}  # shard -> a read-only descriptor
        self._lock = threading.Lock()

    def _path(self, shard: int) -> Path:
        return self.folder / f"shard-{shard:05d}{self.suffix}"

    # --- writing ----------------------------------------------------------------------------------------------
    def write(self, first_slot: int, rows: np.ndarray) -> None:
        """Writes `rows` (n, *row_shape) at slots first_slot .. first_slot + n - 1 and flushes them to disk."""
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        if rows.shape[1:] != self.row_shape:
            raise ValueError(f"rows of shape {rows.shape[1:]} for an array of {self.row_shape}")
        self.folder.mkdir(parents=True, exist_ok=True)
        s, done = first_slot, 0
        while done < len(rows):
            shard, at = divmod(s, self.shard_rows)
            n = min(len(rows) - done, self.shard_rows - at)
            path = self._path(shard)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    data, offset = memoryview(rows[done:done + n].tobytes()), at * self.row_bytes
                    while data:  # pwrite may write less (a call's 2 GiB cap, a full disk): write the rest, or fail
                        written = os.pwrite(fd, data, offset)
                        if written <= 0:
                            raise OSError(errno.ENOSPC, "no space written")
                        data, offset = data[written:], offset + written
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:  # the store commits only rows written here: the rerun writes these again
                from ..utils.io import _write_failed
                raise _write_failed(path, exc) from None
            s, done = s + n, done + n

    def truncate(self, n_slots: int) -> None:
        """Cuts every shard back to the rows below slot `n_slots` (what the store committed)."""
        if not self.folder.is_dir():
            return
        for path in sorted(self.folder.glob(f"shard-*{self.suffix}")):
            shard = int(path.stem.split("-")[1])
            keep = min(max(n_slots - shard * self.shard_rows, 0), self.shard_rows) * self.row_bytes
            if keep == 0:
                path.unlink()
            elif path.stat().st_size > keep:
                os.truncate(path, keep)

    # --- reading ----------------------------------------------------------------------------------------------
    def _fd(self, shard: int) -> int:
        fd = self._fds.get(shard)
        if fd is None:
            with self._lock:  # server threads may open a shard at once: one descriptor each
                fd = self._fds.get(shard)
                if fd is None:
                    path = self._path(shard)
                    if not path.is_file():
                        raise FileNotFoundError(f"{path} is missing: rebuild the index with `foco index build` into "
                                                "a new --out")
                    fd = self._fds[shard] = os.open(path, os.O_RDONLY)
        return fd

    def read(self, slots) -> np.ndarray:
        """Rows at `slots` (n,) -> (n, *row_shape), in the order of `slots`. Each run of consecutive slots is one
        positioned read (pread) into the output: the rows come from the kernel's page cache, shared by every
        process reading the index, and nothing of the file is mapped into this process (a build that reads every
        row once does not end up holding them all in its resident set)."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        out = np.empty((len(slots), *self.row_shape), dtype=self.dtype)
        if not len(slots):
            return out
        order = np.argsort(slots, kind="stable")
        s = slots[order]
        flat = out.reshape(len(slots), -1).view(np.uint8).reshape(len(slots), self.row_bytes)
        cuts = np.nonzero((np.diff(s) != 1) | (np.diff(s // self.shard_rows) != 0))[0] + 1
        for lo, hi in zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [len(s)]]).tolist()):
            shard, at = divmod(int(s[lo]), self.shard_rows)
            want = (hi - lo) * self.row_bytes
            data = os.pread(self._fd(shard), want, at * self.row_bytes)
            if len(data) != want:
                raise ValueError(f"{self._path(shard)} ends before slot {int(s[hi - 1])}: the index is damaged; "
                                 "rebuild it with `foco index build` into a new --out")
            rows = np.frombuffer(data, dtype=np.uint8).reshape(hi - lo, self.row_bytes)
            dest = order[lo:hi]
            if hi - lo == 1 or np.all(np.diff(dest) == 1):
                flat[dest[0]:dest[0] + hi - lo] = rows
            else:
                flat[dest] = rows
        return out

    def nbytes(self) -> int:
        return sum(p.stat().st_size for p in self.folder.glob(f"shard-*{self.suffix}")) if self.folder.is_dir() else 0

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
