"""Reading cached features by row, a batch at a time, without loading a corpus into memory.

A shard is a safetensors file: an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range, then the raw row-major bytes (https://huggingface.co/docs/safetensors). `ShardFile` opens a
shard once, reads its header, maps it read-only, and copies the rows a batch asks for straight into the batch's
buffer (numpy fancy indexing on the mapping). After each read it hands the pages back (`madvise(MADV_DONTNEED)`):
they stay in the kernel's page cache, shared and reclaimable, but leave the process's resident set, which would
otherwise grow to the whole corpus over an epoch. No corpus-sized buffer exists.

Text shards come in two layouts; both are read:

    ragged (written since issue 22)   global (n, D), tokens (T, D) the texts' tokens one after another,
                                      offsets (n + 1,) int64: text i's tokens are rows offsets[i]:offsets[i + 1]
                                      (a text stored without tokens, e.g. a local caption, has none)
    padded (earlier caches)           global (n, D), tokens (n, L, D), mask (n, L) bool

`Rows` joins the shards of one kind (images or texts) of a cache, or of every part of a feature corpus, into one
row space: global row g lies in the shard whose cumulative count passes g.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
import threading
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

# safetensors dtype -> (numpy dtype of the bytes, torch dtype of the values)
_DTYPES = {"F16": (np.float16, torch.float16), "F32": (np.float32, torch.float32), "BF16": (np.uint16, torch.bfloat16),
           "I64": (np.int64, torch.int64), "I32": (np.int32, torch.int32), "BOOL": (np.bool_, torch.bool),
           "U8": (np.uint8, torch.uint8)}


_WINDOW = 1 << 16  # the kernel's fault-around window (fault_around_bytes), a multiple of the page size
MAX_OPEN = 512  # shards a `Rows` keeps mapped at once (a mapping each; no file descriptor stays open)


class ShardFile:
    """One safetensors shard, opened and mapped once, read by rows. `fix` says how to repair a damaged shard.

    Rows are copied out of a read-only mapping with numpy's fancy indexing; after each read the mapped range is
    handed back (`madvise(MADV_DONTNEED)`), so that the pages a pass touches are not charged to the process: they
    stay in the kernel's page cache, shared and reclaimable, and the resident set holds one batch, not the corpus."""

    def __init__(self, path: str | Path, fix: str = "rerun the `foco features extract` command that made it"):
        self.path, self.fix = Path(path), fix
        self.fd, self.mm = os.open(self.path, os.O_RDONLY), None
        try:
            size = os.fstat(self.fd).st_size
            head = os.pread(self.fd, 8, 0)
            if len(head) < 8:
                raise ValueError("shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100 << 20):
                raise ValueError("its header length is impossible")
            header = json.loads(os.pread(self.fd, n, 8))
            self.tensors: dict[str, tuple[str, tuple[int, ...], int]] = {}
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                start, end = info["data_offsets"]
                if 8 + n + end > size:
                    raise ValueError(f"tensor {name} runs past the end of the file")
                self.tensors[name] = (info["dtype"], tuple(info["shape"]), 8 + n + start)
            self.mm = mmap.mmap(self.fd, 0, prot=mmap.PROT_READ) if size else None
            os.close(self.fd)  # the mapping holds the file; a corpus of many shards must not hold a descriptor each
            self.fd = -1
        except (ValueError, KeyError, UnicodeDecodeError, struct.error) as exc:
            os.close(self.fd)
            self.fd = -1
            raise ValueError(f"{self.path} is not a readable safetensors shard ({exc}); {self.fix}") from None

    def close(self) -> None:
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:  # a reader still holds a view: the mapping goes when it does
                pass
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def has(self, name: str) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensors[name][1]

    def _array(self, name: str) -> np.ndarray:
        dtype, shape, start = self.tensors[name]
        np_dtype = _DTYPES[dtype][0]
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            return np.empty(shape, dtype=np_dtype)
        return np.frombuffer(self.mm, dtype=np_dtype, count=count, offset=start).reshape(shape)

    def _release(self, name: str, rows: np.ndarray | None = None) -> None:
        """Hands the pages of tensor `name` that a read of `rows` can have mapped back to the page cache: they leave
        this process's resident set. The range is widened to the 64 KiB windows around it, because the kernel maps
        the pages around each fault too (fault-around), beyond the rows asked for."""
        if self.mm is None:
            return
        dtype, shape, start = self.tensors[name]
        row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(_DTYPES[dtype][0]).itemsize
        lo, hi = (0, shape[0] if shape else 1) if rows is None or not len(rows) else \
            (int(rows.min()), int(rows.max()) + 1)
        begin = (start + lo * row_bytes) // _WINDOW * _WINDOW
        end = min(len(self.mm), -(-(start + hi * row_bytes) // _WINDOW) * _WINDOW)
        if end > begin:
            self.mm.madvise(mmap.MADV_DONTNEED, begin, end - begin)

    def _torch(self, a: np.ndarray, name: str) -> torch.Tensor:
        t = torch.from_numpy(a)
        return t.view(torch.bfloat16) if _DTYPES[self.tensors[name][0]][1] == torch.bfloat16 else t

    def read(self, name: str) -> torch.Tensor:
        """A whole tensor (small ones: offsets, or a test's shard)."""
        a = np.array(self._array(name))  # a copy: nothing keeps the mapping
        self._release(name)
        return self._torch(a, name)

    def gather_into(self, name: str, idx: np.ndarray, out: np.ndarray, dest) -> None:
        """out[dest] = rows `idx` of tensor `name` (`dest` any numpy index of `out`)."""
        arr = self._array(name)
        if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= arr.shape[0]):
            raise IndexError(f"{self.path}: row {int(idx.max())} of {name} is out of range ({arr.shape[0]} rows)")
        out[dest] = arr[idx]
        del arr
        self._release(name, idx)

    def rows(self, name: str, idx: np.ndarray) -> torch.Tensor:
        """Rows `idx` (n,) of tensor `name` (R, ...) -> (n, ...), in the order of `idx`."""
        arr = self._array(name)
        idx = np.asarray(idx, dtype=np.int64)
        if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= arr.shape[0]):
            raise IndexError(f"{self.path}: row {int(idx.max())} of {name} is out of range ({arr.shape[0]} rows)")
        out = arr[idx]  # a copy of just these rows
        del arr
        self._release(name, idx)
        return self._torch(out, name)


class Rows:
    """One kind of features over several shards, read by global row. Each shard is opened once, when first read."""

    def __init__(self, paths: Sequence[Path], counts: Sequence[int], fix: str):
        self.paths, self.fix = list(paths), fix
        self.counts = np.asarray(counts, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)])  # (S + 1,)
        self._files: dict[int, ShardFile] = {}
        self._offsets: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return int(self.starts[-1])

    def file(self, s: int) -> ShardFile:
        f = self._files.get(s)
        if f is None:
            with self._lock:  # a reader thread (prefetch) and the step may open a shard at once
                return self._open(s)
        return f

    def _open(self, s: int) -> ShardFile:
        f = self._files.get(s)
        if f is None:
            f = ShardFile(self.paths[s], self.fix)
            if f.has("global") and f.shape("global")[0] != self.counts[s]:
                f.close()
                raise ValueError(f"{self.paths[s]}: holds {f.shape('global')[0]} rows where its record lists "
                                 f"{self.counts[s]}; {self.fix}")
            while len(self._files) >= MAX_OPEN:  # the least recently opened shard is closed (reopened if read)
                oldest = next(iter(self._files))
                self._files.pop(oldest).close()
                self._offsets.pop(oldest, None)
            self._files[s] = f
        return f

    def has(self, name: str) -> bool:
        return len(self.paths) > 0 and self.file(0).has(name)

    def _locate(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = np.asarray(idx, dtype=np.int64)
        if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= len(self)):
            raise IndexError(f"row {int(idx.max())} is out of range ({len(self)} rows)")
        shard = np.searchsorted(self.starts, idx, side="right") - 1
        return shard, idx - self.starts[shard]

    def rows(self, name: str, idx) -> torch.Tensor:
        """Rows `idx` (n,) of tensor `name` over every shard -> (n, ...) in the order of `idx`."""
        idx = np.asarray(idx, dtype=np.int64)
        order = np.argsort(idx, kind="stable")  # ascending: each shard's rows are one run of the sorted order
        shard, local = self._locate(idx[order])
        f0 = self.file(int(shard[0]) if len(shard) else 0)
        dtype, shape, _ = f0.tensors[name]
        out = np.empty((len(idx), *shape[1:]), dtype=_DTYPES[dtype][0])
        for s, begin, end in _runs(shard):
            self.file(s).gather_into(name, local[begin:end], out, order[begin:end])
        return f0._torch(out, name)

    def lengths(self, idx) -> np.ndarray:
        """(n,) how many tokens each text `idx` has stored (0: stored without tokens)."""
        idx = np.asarray(idx, dtype=np.int64)
        order = np.argsort(idx, kind="stable")
        shard, local = self._locate(idx[order])
        out = np.zeros(len(idx), dtype=np.int64)
        for s, begin, end in _runs(shard):
            f, rows = self.file(s), local[begin:end]
            if f.has("offsets"):
                off = f.read("offsets").numpy()
                out[order[begin:end]] = off[rows + 1] - off[rows]
            elif f.has("mask"):
                out[order[begin:end]] = f.rows("mask", rows).numpy().sum(1)
        return out

    def tokens(self, idx) -> tuple[torch.Tensor, torch.Tensor]:
        """Token features and mask of texts `idx` (n,) -> (n, L, D), (n, L) bool, L the longest of them,
        zero-padded; ragged and padded shards alike."""
        idx = np.asarray(idx, dtype=np.int64)
        order = np.argsort(idx, kind="stable")
        shard, local = self._locate(idx[order])
        runs = list(_runs(shard))
        lengths = np.zeros(len(idx), dtype=np.int64)  # in the order of idx
        offsets: dict[int, np.ndarray] = {}  # this call's, kept even if the shard is closed meanwhile
        for s, begin, end in runs:
            f, rows = self.file(s), local[begin:end]
            if f.has("offsets"):
                off = self._offsets.get(s)
                if off is None:
                    off = self._offsets[s] = f.read("offsets").numpy()
                offsets[s] = off
                lengths[order[begin:end]] = off[rows + 1] - off[rows]
            elif f.has("tokens"):
                lengths[order[begin:end]] = f.rows("mask", rows).numpy().sum(1)  # masks are right-padded
            else:
                raise ValueError(f"{self.paths[s]} holds no token features; extract the texts with tokens")
        L = int(lengths.max(initial=0))
        mask = np.arange(L)[None, :] < lengths[:, None]  # (n, L)
        f0 = self.file(int(shard[0]) if len(shard) else 0)
        dtype, shape, _ = f0.tensors["tokens"] if f0.has("tokens") else ("F16", (0, 0), 0)
        D = shape[-1]
        out = np.zeros((len(idx), L, D), dtype=_DTYPES[dtype][0])  # assembled on the CPU
        for s, begin, end in runs:
            f, rows, dest = self.file(s), local[begin:end], order[begin:end]
            n = lengths[dest]
            if f.has("offsets"):
                off = offsets[s]
                src = np.repeat(off[rows] - np.cumsum(n) + n, n) + np.arange(int(n.sum()))  # flat token rows
                pos = np.repeat(dest, n), np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
                f.gather_into("tokens", src, out, pos)
            else:
                toks = f.rows("tokens", rows).numpy() if _DTYPES[dtype][1] != torch.bfloat16 else \
                    f.rows("tokens", rows).view(torch.uint16).numpy()
                width = min(L, toks.shape[1])
                out[dest, :width] = toks[:, :width] * mask[dest, :width, None]
        return f0._torch(out, "tokens") if f0.has("tokens") else torch.from_numpy(out), torch.from_numpy(mask)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def _runs(shard: np.ndarray):
    """(shard, begin, end) of each run of equal values in the sorted array `shard`."""
    if len(shard) == 0:
        return
    cuts = np.nonzero(np.diff(shard))[0] + 1
    begins = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [len(shard)]])
    for b, e in zip(begins.tolist(), ends.tolist()):
        yield int(shard[b]), b, e


class RowView:
    """One tensor of a `Rows`, indexed like an in-memory tensor by a 1-D index: `view[idx]` reads just those rows
    (`idx` (n,) long, positions of `index` when one is given) -> (n, ...), cast to `dtype` (None: as stored).
    Training and evaluation hold a `RowView` where they once held a corpus-sized tensor (patches)."""

    def __init__(self, rows: Rows, name: str, dtype: torch.dtype | None = None, index: torch.Tensor | None = None):
        self.rows, self.name, self._dtype = rows, name, dtype
        # (n,) rows of `rows` that positions 0..n-1 stand for (None: every row, in order)
        self.index = None if index is None else torch.as_tensor(index, dtype=torch.long, device="cpu")
        f = rows.file(0)
        dtype_name, shape, _ = f.tensors[name]
        self.dtype = dtype or _DTYPES[dtype_name][1]
        self.shape = torch.Size((len(self), *shape[1:]))

    def __len__(self) -> int:
        return len(self.rows) if self.index is None else int(self.index.shape[0])

    def __getitem__(self, idx) -> torch.Tensor:
        idx = torch.as_tensor(idx, dtype=torch.long, device="cpu").reshape(-1)
        rows = idx if self.index is None else self.index[idx]
        out = self.rows.rows(self.name, rows.numpy())
        return out if self._dtype is None else out.to(self._dtype)


class TokenView:
    """Texts' token features, read a batch at a time: `take(idx)` -> tokens (n, L, D) in `dtype`, mask (n, L), with
    L the longest of those n texts. Over a cache's ragged or padded shards (`TokenView(rows)`), or over padded
    tensors in memory (`TokenView.padded(tokens, mask)`): both give the same batch."""

    def __init__(self, rows: Rows | None, dtype: torch.dtype | None = None, index: torch.Tensor | None = None,
                 padded: tuple[torch.Tensor, torch.Tensor] | None = None):
        self.rows, self._dtype, self._padded = rows, dtype, padded
        self.index = None if index is None else torch.as_tensor(index, dtype=torch.long, device="cpu")

    @classmethod
    def padded(cls, tokens: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype | None = None) -> "TokenView":
        """tokens (N, L, D), mask (N, L) bool held in memory."""
        return cls(None, dtype, padded=(tokens, mask))

    def __len__(self) -> int:
        if self.index is not None:
            return int(self.index.shape[0])
        return len(self.rows) if self.rows is not None else int(self._padded[1].shape[0])

    def subset(self, rows) -> "TokenView":
        """The texts `rows` (m,) of this view, in that order, still read per batch."""
        rows = torch.as_tensor(rows, dtype=torch.long, device="cpu")
        return TokenView(self.rows, self._dtype, rows if self.index is None else self.index[rows], self._padded)

    def take(self, idx) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(idx, dtype=torch.long, device="cpu").reshape(-1)
        rows = idx if self.index is None else self.index[idx]
        if self.rows is not None:
            tokens, mask = self.rows.tokens(rows.numpy())
        else:
            tokens, mask = self._padded[0][rows], self._padded[1][rows]  # (n, L, D), (n, L)
            used = int(mask.any(0).nonzero().max()) + 1 if mask.any() else 0
            tokens, mask = tokens[:, :used], mask[:, :used]
        return (tokens if self._dtype is None else tokens.to(self._dtype)), mask


class StoredTexts:
    """Texts for evaluation and training: (n, D) float32 normalised globals in memory, tokens read per batch."""

    def __init__(self, global_: torch.Tensor, tokens: TokenView):
        self.global_, self.tokens = global_, tokens  # (n, D), n texts

    def __len__(self) -> int:
        return int(self.global_.shape[0])

    def take(self, idx):
        """Texts `idx` (b,) -> `TextFeatures` (b, D), (b, L, D), (b, L), L the longest of the b texts."""
        from .backbones.base import TextFeatures
        idx = torch.as_tensor(idx, dtype=torch.long, device="cpu").reshape(-1)
        tokens, mask = self.tokens.take(idx)
        return TextFeatures(self.global_[idx], tokens, mask)

    def subset(self, rows: torch.Tensor) -> "StoredTexts":
        """Texts `rows` (m,), in that order, still read per batch."""
        rows = torch.as_tensor(rows, dtype=torch.long, device="cpu")
        return StoredTexts(self.global_[rows], self.tokens.subset(rows))
