"""Training data for FoCo: cached backbone features joined with caption decompositions, served as `TrainBatch`es."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from typing import Callable, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from ..decompose.schema import Decomposition
from ..feature_store import Rows
from ..features import FeatureCache

log = logging.getLogger(__name__)


@dataclass
class TrainBatch:
    """Cached features of B images with up to K (local, context) pairs each."""

    image_global: torch.Tensor  # (B, D) v_g, normalised
    patches: torch.Tensor  # (B, P, D)
    local: torch.Tensor  # (B, K, D) c_ik, normalised text globals of the local captions
    local_mask: torch.Tensor  # (B, K) bool, True where pair k exists
    ctx_tokens: torch.Tensor  # (B, K, L, D) token features of X_ik
    ctx_mask: torch.Tensor  # (B, K, L) bool

    def on(self, device: torch.device | str) -> "TrainBatch":
        """The batch on `device` for the step: copied without blocking (from pinned memory on CUDA) and cast to
        float32 there, so that features stored in fp16 cross the bus in fp16 (`StreamingPairTable.for_device`)."""
        from ..utils.device import move
        moved = move(self, device)
        return replace(moved, **{f: getattr(moved, f).float() for f in ("image_global", "patches", "local",
                                                                         "ctx_tokens")
                                 if getattr(moved, f).dtype != torch.float32})


class TrainingPairs(Protocol):
    """What FoCo's trainer reads from a table of training pairs, whichever source made it (`foco.train.sources`):
    a cache read whole (`PairTable`), read a batch at a time (`StreamingPairTable`), or encoded online
    (`foco.train.online.OnlinePairTable`)."""

    dim: int  # D
    parts: list[str]  # a rank's own feature shards when the table holds only those

    def __len__(self) -> int: ...

    @property
    def ids(self) -> list[str]: ...

    def with_max_pairs(self, k: int) -> "TrainingPairs": ...

    def subset(self, keep: set[str]) -> "TrainingPairs": ...

    def pairs_per_image(self) -> torch.Tensor | None:
        """(N,) long, each image's pair count; None where the table cannot know it before reading (online)."""

    def prefetch(self, batches: list[torch.Tensor]) -> None:
        """Told each epoch's batches (each (B,)) before its steps: a table may start reading them."""

    def batch(self, idx: torch.Tensor) -> "TrainBatch": ...


@dataclass
class PairTable:
    """N training images with up to K decomposition pairs each, as indices into the cached text features."""

    image_global: torch.Tensor  # (N, D) float32
    patches: torch.Tensor  # (N, P, D) storage dtype
    text_global: torch.Tensor  # (Nt, D) float32
    text_tokens: torch.Tensor  # (Nt, L, D) storage dtype
    text_mask: torch.Tensor  # (Nt, L) bool
    local_idx: torch.Tensor  # (N, K) long, -1 where image i has fewer than K pairs
    context_idx: torch.Tensor  # (N, K) long
    parts: list[str] = field(default_factory=list)  # a rank's own feature shards (`train.sources`)
    ids: list[str] = field(default_factory=list)  # the N image ids, in row order

    def __len__(self) -> int:
        return self.image_global.shape[0]

    @property
    def dim(self) -> int:
        return int(self.image_global.shape[1])

    def pairs_per_image(self) -> torch.Tensor:
        return (self.local_idx >= 0).sum(1)  # (N,)

    def pair_mask(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, K) bool on the CPU, which pairs images `idx` (B,) have, without reading a feature: every rank can
        draw the global batch's negative plan from it (`foco.train.foco.distributed_step`)."""
        return self.local_idx[idx] >= 0

    @property
    def token_length(self) -> int:
        """The longest context any batch of this table holds (the fixed length of the data-parallel gather)."""
        return max(1, int(self.text_tokens.shape[1]))

    def prefetch(self, batches: list[torch.Tensor]) -> None:
        """Nothing to read ahead: the table is in memory."""

    def subset(self, keep: set[str]) -> "PairTable":
        """The images whose id is in `keep`, in row order (the text features stay whole)."""
        rows = torch.tensor([n for n, i in enumerate(self.ids) if i in keep], dtype=torch.long)
        return replace(self, image_global=self.image_global[rows], patches=self.patches[rows],
                       local_idx=self.local_idx[rows], context_idx=self.context_idx[rows],
                       ids=[self.ids[n] for n in rows.tolist()])

    def with_max_pairs(self, k: int) -> "PairTable":
        """The table with at most `k` pairs per image, each image's first ones (K = 1 is ablation 3b)."""
        if k >= self.local_idx.shape[1]:
            return self
        return replace(self, local_idx=self.local_idx[:, :k], context_idx=self.context_idx[:, :k])

    def batch(self, idx: torch.Tensor) -> TrainBatch:
        """Gathers a batch of images `idx` (B,) into float32 tensors."""
        li, ci = self.local_idx[idx], self.context_idx[idx]  # (B, K)
        mask = li >= 0  # (B, K)
        li, ci = li.clamp_min(0), ci.clamp_min(0)
        ctx_mask = self.text_mask[ci] & mask[..., None]  # (B, K, L)
        used = int(ctx_mask.any(0).any(0).nonzero().max()) + 1 if ctx_mask.any() else 1
        return TrainBatch(image_global=self.image_global[idx], patches=self.patches[idx].float(),
                          local=self.text_global[li], local_mask=mask,
                          ctx_tokens=self.text_tokens[ci][:, :, :used].float(), ctx_mask=ctx_mask[:, :, :used])


class StreamingPairTable:
    """N training images with up to K decomposition pairs each, as rows of the cached features, read a batch at a
    time from the shards (`foco.feature_store`): memory holds the pair indices, never the features of the corpus.
    `batch` gives what `PairTable.batch` gives for the same rows, bit for bit."""

    def __init__(self, images: Rows, texts: Rows, local_idx: torch.Tensor, context_idx: torch.Tensor, dim: int,
                 ids: list[str] | Callable[[], list[str]], parts: list[str] | None = None):
        self.images, self.texts = images, texts  # (N rows: global, patches), (Nt rows: global, tokens)
        self.local_idx, self.context_idx = local_idx, context_idx  # (N, K) long, -1 where image i has fewer pairs
        self.dim = dim  # D
        self._ids = ids
        self.parts = parts or []

    def __len__(self) -> int:
        return self.local_idx.shape[0]

    @property
    def ids(self) -> list[str]:
        """The N image ids in row order (a corpus's are read from its shard records when first asked for)."""
        if callable(self._ids):
            self._ids = self._ids()
        return self._ids

    def with_max_pairs(self, k: int) -> "StreamingPairTable":
        if k >= self.local_idx.shape[1]:
            return self
        return StreamingPairTable(self.images, self.texts, self.local_idx[:, :k], self.context_idx[:, :k], self.dim,
                                  self._ids, self.parts)

    def subset(self, keep: set[str]) -> "StreamingPairTable":
        """The images whose id is in `keep`, in row order (a view: the same shards, fewer rows)."""
        rows = torch.tensor([n for n, i in enumerate(self.ids) if i in keep], dtype=torch.long, device="cpu")
        return _Subset(self, rows)

    def image_rows(self, idx: torch.Tensor) -> torch.Tensor:
        return idx

    def pairs_per_image(self) -> torch.Tensor:
        return (self.local_idx >= 0).sum(1)  # (N,)

    def pair_mask(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, K) bool on the CPU, which pairs images `idx` (B,) have, without reading a feature."""
        return self.local_idx[idx] >= 0

    @property
    def token_length(self) -> int:
        """The longest context of this table's pairs (read once from the shards' token offsets): the fixed
        length of the data-parallel gather."""
        if getattr(self, "_token_length", None) is None:
            used = torch.unique(self.context_idx[self.local_idx >= 0]).numpy()
            self._token_length = max(1, int(self.texts.lengths(used).max(initial=0))) if len(used) else 1
        return self._token_length

    def for_device(self, device: torch.device | str) -> "StreamingPairTable":
        """Batches for a step on `device`: on CUDA, `read` keeps the stored fp16 patches and tokens (half the bytes
        to copy) and pins them in the reader thread, so that the training thread neither casts nor pins;
        `TrainBatch.on` copies them without blocking and casts on the GPU. On the CPU, float32 as before."""
        self._wire = torch.device(device).type == "cuda"
        return self

    def prefetch(self, batches: list[torch.Tensor], depth: int = 2) -> None:
        """Reads this epoch's `batches` (each (B,)) in a background thread, `depth` ahead of the steps that ask for
        them, so that reading overlaps the step's compute (`batch` returns what it would have read itself)."""
        self._pool = _reader()
        self._queue = list(batches)
        self._ahead = [(b, self._pool.submit(self.read, b)) for b in self._queue[:depth]]
        self._queue = self._queue[depth:]

    def batch(self, idx: torch.Tensor) -> TrainBatch:
        """The batch of images `idx` (B,): read ahead by `prefetch`, or read now (`read`)."""
        ahead = getattr(self, "_ahead", None)
        if ahead and torch.equal(ahead[0][0], idx):
            _, future = ahead.pop(0)
            if self._queue:
                nxt = self._queue.pop(0)
                ahead.append((nxt, self._pool.submit(self.read, nxt)))
            return future.result()
        self._ahead = []
        return self.read(idx)

    def read(self, idx: torch.Tensor) -> TrainBatch:
        """Reads a batch of images `idx` (B,) into float32 CPU tensors; for a GPU (`for_device`), pinned, with the
        patches and tokens in their stored dtype."""
        wire = getattr(self, "_wire", False)
        rows = self.image_rows(idx).cpu().numpy()
        li, ci = self.local_idx[idx], self.context_idx[idx]  # (B, K)
        mask = li >= 0  # (B, K)
        li, ci = li.clamp_min(0), ci.clamp_min(0)
        B, K = li.shape
        g = F.normalize(self.images.rows("global", rows).float(), dim=-1)  # (B, D)
        patches = self.images.rows("patches", rows)  # (B, P, D)
        patches = patches if wire else patches.float()
        local = F.normalize(self.texts.rows("global", li.reshape(-1).numpy()).float(), dim=-1).view(B, K, -1)
        present = mask.reshape(-1).nonzero().flatten()  # the pairs that exist: only their tokens are read
        tokens, tmask = self.texts.tokens(ci.reshape(-1)[present].numpy())  # (n, L, D), (n, L)
        L = max(1, tokens.shape[1])
        ctx = torch.zeros(B * K, L, self.dim, dtype=tokens.dtype if wire else torch.float32, device="cpu")
        ctx_mask = torch.zeros(B * K, L, dtype=torch.bool, device="cpu")
        if len(present) and tokens.shape[1]:
            ctx[present] = tokens.to(ctx.dtype)
            ctx_mask[present] = tmask
        batch = TrainBatch(image_global=g, patches=patches, local=local, local_mask=mask,
                           ctx_tokens=ctx.view(B, K, L, -1), ctx_mask=ctx_mask.view(B, K, L))
        if wire:  # here, in the reader thread when read ahead
            batch = TrainBatch(*(t.pin_memory() for t in (batch.image_global, batch.patches, batch.local,
                                                         batch.local_mask, batch.ctx_tokens, batch.ctx_mask)))
        return batch

    def materialise(self) -> PairTable:
        """Every row in memory (`PairTable`): for small tables only (tests, experiments)."""
        every = range(len(self.images))
        texts = range(len(self.texts))
        tokens, mask = self.texts.tokens(texts)
        return PairTable(F.normalize(self.images.rows("global", every).float(), dim=-1),
                         self.images.rows("patches", every),
                         F.normalize(self.texts.rows("global", texts).float(), dim=-1), tokens, mask,
                         self.local_idx, self.context_idx, list(self.parts), list(self.ids))

    @property
    def image_global(self) -> torch.Tensor:
        """(N, D) every image's normalised global feature (read whole: N x D floats)."""
        return F.normalize(self.images.rows("global", range(len(self.images))).float(), dim=-1)


class _Subset(StreamingPairTable):
    """Some rows of a streaming table."""

    def __init__(self, table: StreamingPairTable, rows: torch.Tensor):
        super().__init__(table.images, table.texts, table.local_idx[rows], table.context_idx[rows], table.dim,
                         [table.ids[n] for n in rows.tolist()], table.parts)
        self._rows = rows

    def image_rows(self, idx: torch.Tensor) -> torch.Tensor:
        return self._rows[idx]

    def subset(self, keep: set[str]) -> "StreamingPairTable":
        rows = torch.tensor([n for n, i in enumerate(self.ids) if i in keep], dtype=torch.long, device="cpu")
        table = _Subset(self, rows)
        table._rows = self._rows[rows]  # rows of the shards, not of this subset
        return table

    def materialise(self) -> PairTable:
        raise NotImplementedError("materialise a table, then take its subset (PairTable.subset)")

    def with_max_pairs(self, k: int) -> "StreamingPairTable":
        if k >= self.local_idx.shape[1]:
            return self
        out = _Subset.__new__(_Subset)
        StreamingPairTable.__init__(out, self.images, self.texts, self.local_idx[:, :k], self.context_idx[:, :k],
                                    self.dim, self._ids, self.parts)
        out._rows = self._rows
        return out

    @property
    def image_global(self) -> torch.Tensor:
        return F.normalize(self.images.rows("global", self._rows.numpy()).float(), dim=-1)


_READER: list = []


def _reader():
    """The one background thread that reads batches ahead (`StreamingPairTable.prefetch`), shared by every table."""
    if not _READER:
        from concurrent.futures import ThreadPoolExecutor
        _READER.append(ThreadPoolExecutor(1, thread_name_prefix="foco-read"))
    return _READER[0]


Lookup = Callable[[str, list[str]], dict[str, Decomposition]]  # (part name, its image ids) -> {id: Decomposition}


def build_pair_table(cache: str | Path, decompositions: dict[str, Decomposition], max_pairs: int = 5,
                     k: int | None = None) -> StreamingPairTable:
    """Joins a feature cache's images (by id) with their decompositions; the pairs' texts must be in the cache. K
    is the most pairs an image has (capped at `max_pairs`), or `k` when given. Nothing but the pair indices is held
    in memory."""
    return _join([Path(cache)], [""], lambda name, ids: decompositions, max_pairs, k, ids_known=True, parts=[])


def build_corpus_pair_table(corpus: str | Path, lookup: Lookup, max_pairs: int = 5, rank: int = 0,
                            world_size: int = 1, k: int | None = None) -> StreamingPairTable:
    """The same for a corpus folder of per-shard caches (`foco.corpus_features`): rank `rank` of `world_size` reads
    its own parts, one part at a time, each joined with `lookup(part, its image ids)`'s decompositions; K is agreed
    by the caller when ranks hold their own data (`k`)."""
    from ..corpus_features import corpus_parts
    caches = [Path(corpus) / "parts" / name for name in corpus_parts(corpus, rank, world_size)]
    names = [c.name for c in caches]
    return _join(caches, names, lookup, max_pairs, k, ids_known=False, parts=names)


def _join(caches: list[Path], names: list[str], decompositions_of: Lookup, max_pairs: int, k: int | None,
          ids_known: bool, parts: list[str]) -> StreamingPairTable:
    width = max(max_pairs, k or 0)
    image_paths, image_counts, text_paths, text_counts, locals_, contexts = [], [], [], [], [], []
    ids_of_parts = []
    text_base = 0
    for part, name in zip(caches, names):
        _check_part(part)
        fc = FeatureCache(part)
        image_ids, images = fc.rows("images")
        text_ids, texts = fc.rows("texts")
        decs = decompositions_of(name, image_ids)
        li, ci = _pair_indices(image_ids, text_ids, decs, width, text_base, part)
        _check_context_tokens(texts, ci, text_base, text_ids, part)
        locals_.append(li)
        contexts.append(ci)
        image_paths += images.paths
        image_counts += images.counts.tolist()
        text_paths += texts.paths
        text_counts += texts.counts.tolist()
        text_base += len(texts)
        if ids_known:  # a corpus keeps no corpus-sized list of ids
            ids_of_parts.append(image_ids)
        dim = int(images.file(0).shape("global")[1])
    local_idx, context_idx = torch.cat(locals_), torch.cat(contexts)
    used = int((local_idx >= 0).sum(0).nonzero().max()) + 1 if (local_idx >= 0).any() else 1
    K = k if k is not None else min(max_pairs, used)
    local_idx, context_idx = local_idx[:, :K].contiguous(), context_idx[:, :K].contiguous()
    empty = int((local_idx < 0).all(1).sum())
    if empty:
        raise ValueError(f"{empty} images have no usable (local, context) pair")
    fix = "rerun the `foco features extract` command that made this cache: it encodes damaged shards again"
    if ids_known:
        ids = [i for part in ids_of_parts for i in part]
    else:  # a corpus's ids are read from its shard records when first asked for
        ids = lambda: [i for c in caches for i in FeatureCache(c).ids("images")]  # noqa: E731
    return StreamingPairTable(Rows(image_paths, image_counts, fix), Rows(text_paths, text_counts, fix), local_idx,
                              context_idx, dim, ids, parts)


def _check_context_tokens(texts: Rows, context_idx: torch.Tensor, text_base: int, text_ids: list[str],
                          where: Path) -> None:
    """Every contextual caption the pairs use must have its tokens stored: a training split stores tokens only for
    the contexts of the decompositions it was extracted with, and F_Comp would silently read none."""
    rows = np.unique(context_idx[context_idx >= 0].numpy() - text_base)
    empty = rows[texts.lengths(rows) == 0]
    if len(empty):
        raise ValueError(f"{len(empty)} contextual captions have no token features in {where}, e.g. "
                         f"{text_ids[int(empty[0])]!r}: it was extracted with other decompositions; extract it again "
                         "with these (foco features extract ... --decompositions STORE --decomposer NAME) into a new "
                         "--out")


def _check_part(part: Path) -> None:
    if part.parent.name == "parts" and not (part / "done.json").is_file():
        raise FileNotFoundError(f"{part} is not finished: rerun `foco features extract --in ...` (it resumes)")


def _pair_indices(image_ids: list[str], text_ids: list[str], decompositions: dict[str, Decomposition], width: int,
                  text_base: int, where: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, width) local and context text rows (offset by `text_base`) of each image's pairs, -1 where none."""
    text_index = {t: n for n, t in enumerate(text_ids)}
    missing_dec = [i for i in image_ids if i not in decompositions]
    if missing_dec:
        raise ValueError(f"{len(missing_dec)} cached images have no decomposition, e.g. {missing_dec[:3]}")
    local_idx = torch.full((len(image_ids), width), -1, dtype=torch.long, device="cpu")  # index tables: CPU
    context_idx = torch.full((len(image_ids), width), -1, dtype=torch.long, device="cpu")
    missing_text = set()
    for n, i in enumerate(image_ids):
        for kk, pair in enumerate(decompositions[i].pairs[:width]):
            if pair.local not in text_index or pair.context not in text_index:
                missing_text.update(t for t in (pair.local, pair.context) if t not in text_index)
                continue
            local_idx[n, kk], context_idx[n, kk] = text_index[pair.local] + text_base, text_index[pair.context] + text_base
    if missing_text:
        raise ValueError(f"{len(missing_text)} local/contextual captions are not in the feature cache {where}, "
                         f"e.g. {sorted(missing_text)[:2]}; re-extract it with these decompositions")
    return local_idx, context_idx
