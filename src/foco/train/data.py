"""Training data for FoCo: cached backbone features joined with caption decompositions, served as `TrainBatch`es."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..decompose.schema import Decomposition
from ..backbones.base import ImageFeatures, TextFeatures
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
    parts: list[str] = field(default_factory=list)  # a rank's own feature shards (`rank_pair_table`); [] otherwise
    ids: list[str] = field(default_factory=list)  # the N image ids, in row order (`build_pair_table`)

    def __len__(self) -> int:
        return self.image_global.shape[0]

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


def build_pair_table(cache: str | Path, decompositions: dict[str, Decomposition], max_pairs: int = 5,
                     rank: int = 0, world_size: int = 1, k: int | None = None) -> PairTable:
    """Joins the cache's images (by id) with their decompositions; the pairs' texts must be in the cache. `cache`
    is a feature cache, or a corpus folder of per-shard caches (`foco.corpora.extract`), of which rank `rank` of
    `world_size` reads its own parts. K is the most pairs an image has (capped at `max_pairs`), or `k` when given
    (ranks on their own data agree on one)."""
    from ..corpora.extract import is_corpus, read_corpus
    if is_corpus(cache):
        image_ids, g, patches, text_ids, t = read_corpus(cache, rank, world_size)
        images = ImageFeatures(torch.nn.functional.normalize(g.float(), dim=-1), patches)
        texts = TextFeatures(torch.nn.functional.normalize(t["global"].float(), dim=-1), t["tokens"], t["mask"].bool())
    else:
        fc = FeatureCache(cache)
        image_ids, images = fc.images(dtype=None)
        text_ids, texts = fc.texts(dtype=None)
    text_index = {t: i for i, t in enumerate(text_ids)}
    missing_dec = [i for i in image_ids if i not in decompositions]
    if missing_dec:
        raise ValueError(f"{len(missing_dec)} cached images have no decomposition, e.g. {missing_dec[:3]}")
    K = k if k is not None else min(max_pairs, max(len(decompositions[i].pairs) for i in image_ids))
    local_idx = torch.full((len(image_ids), K), -1, dtype=torch.long)
    context_idx = torch.full((len(image_ids), K), -1, dtype=torch.long)
    missing_text = set()
    for n, i in enumerate(image_ids):
        for k, pair in enumerate(decompositions[i].pairs[:K]):
            if pair.local not in text_index or pair.context not in text_index:
                missing_text.update(t for t in (pair.local, pair.context) if t not in text_index)
                continue
            local_idx[n, k], context_idx[n, k] = text_index[pair.local], text_index[pair.context]
    if missing_text:
        raise ValueError(f"{len(missing_text)} local/contextual captions are not in the feature cache {cache}, "
                         f"e.g. {sorted(missing_text)[:2]}; re-extract it with these decompositions")
    empty = int((local_idx < 0).all(1).sum())
    if empty:
        raise ValueError(f"{empty} images have no usable (local, context) pair")
    return PairTable(images.global_, images.patches, texts.global_, texts.tokens, texts.mask, local_idx, context_idx,
                     ids=list(image_ids))


def rank_pair_table(features: str | Path, pattern: str, store: str | Path, decomposer: str | None,
                    max_fallback: float | None, env) -> PairTable:
    """Under torchrun, a feature corpus (`foco.corpora.extract`): this rank's own feature shards (r, r + N, ... of
    the shards `pattern`, the extraction's split) joined with the decompositions in `store` of their captions,
    read from this rank's shards alone. K is agreed over ranks. The table's `parts` names the shards."""
    from ..corpora.extract import corpus_parts
    from ..corpora.webdataset import shard_paths
    from ..decompose.inputs import read_shard_captions
    from ..decompose.store import stored_decompositions
    from .distributed import total_across
    if pattern is None or store is None:
        raise ValueError("a feature corpus under torchrun needs --in (its webdataset shards) and --decompositions")
    parts = corpus_parts(features, env.rank, env.world_size)
    shards = [p for n, p in enumerate(shard_paths(pattern)) if n % env.world_size == env.rank]
    if [p.stem for p in shards] != parts:
        raise ValueError(f"--features {features} was extracted from other shards than --in {pattern} (rank "
                         f"{env.rank} has feature shards {parts[:3]}, --in gives {[p.stem for p in shards][:3]}); "
                         "pass the --in pattern of the extraction")
    records = read_shard_captions(shards)
    decompositions = stored_decompositions([(r.id, r.caption) for r in records], store, decomposer, max_fallback)
    k = total_across(min(5, max((len(d.pairs) for d in decompositions.values()), default=0)), env, "max")
    table = build_pair_table(features, decompositions, rank=env.rank, world_size=env.world_size, k=k)
    return replace(table, parts=parts)
