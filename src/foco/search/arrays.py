"""The per-image features of an index, on disk: append-only arrays read through read-only memory maps.

    INDEX/vectors/shard-00000.f32    global features: raw little-endian float32, (rows, D) row-major
    INDEX/patches/shard-00000.f16    with --with-patches: FoCo's patch features, raw float16, (rows, P, D)

Image row `slot` s lies in shard s // SHARD_ROWS at row s % SHARD_ROWS; the SQLite store (`store.py`) records
each image's slot and the next free one. A batch is written and flushed (fsync) before the transaction that
records its slots commits, so a killed build leaves at most rows past the committed end, which `truncate` cuts
back when the index is next opened for writing. Slots of removed images are never reused (their rows are dead
bytes until the index is rebuilt into a new folder). Readers map each shard once (numpy memmap) and copy out only
the rows asked for: nothing is loaded whole, and the pages stay in the kernel's page cache, shared by every
server process over the same index.
"""
from __future__ import annotations

import os
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
        self._maps: dict[int, np.memmap] = {}

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
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.pwrite(fd, rows[done:done + n].tobytes(), at * self.row_bytes)
                os.fsync(fd)
            finally:
                os.close(fd)
            self._maps.pop(shard, None)  # a map of the old length must not be read past its end
            s, done = s + n, done + n

    def truncate(self, n_slots: int) -> None:
        """Cuts every shard back to the rows below slot `n_slots` (what the store committed)."""
        if not self.folder.is_dir():
            return
        self._maps.clear()
        for path in sorted(self.folder.glob(f"shard-*{self.suffix}")):
            shard = int(path.stem.split("-")[1])
            keep = min(max(n_slots - shard * self.shard_rows, 0), self.shard_rows) * self.row_bytes
            if keep == 0:
                path.unlink()
            elif path.stat().st_size > keep:
                os.truncate(path, keep)

    # --- reading ----------------------------------------------------------------------------------------------
    def _map(self, shard: int) -> np.memmap:
        m = self._maps.get(shard)
        if m is None:
            path = self._path(shard)
            if not path.is_file():
                raise FileNotFoundError(f"{path} is missing: rebuild the index with `foco index build` into a new "
                                        "--out")
            rows = path.stat().st_size // self.row_bytes
            m = self._maps[shard] = np.memmap(path, dtype=self.dtype, mode="r", shape=(rows, *self.row_shape))
        return m

    def read(self, slots) -> np.ndarray:
        """Rows at `slots` (n,) -> (n, *row_shape), in the order of `slots`."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        out = np.empty((len(slots), *self.row_shape), dtype=self.dtype)
        shard = slots // self.shard_rows
        for s in np.unique(shard).tolist():
            sel = np.nonzero(shard == s)[0]
            local = slots[sel] - s * self.shard_rows
            m = self._map(int(s))
            if len(local) and int(local.max()) >= m.shape[0]:
                raise ValueError(f"{self._path(int(s))} holds {m.shape[0]} rows, slot {int(slots[sel].max())} is "
                                 "past its end: the index is damaged; rebuild it with `foco index build` into a new "
                                 "--out")
            out[sel] = m[local]
        return out

    def nbytes(self) -> int:
        return sum(p.stat().st_size for p in self.folder.glob(f"shard-*{self.suffix}")) if self.folder.is_dir() else 0

    def close(self) -> None:
        self._maps.clear()
