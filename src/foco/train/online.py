"""Online encoding (`foco train --in 'shards/{...}.tar' --backbone SPEC --online`): for corpora whose features do
not fit on disk, the frozen backbone runs inside the training loop.

`OnlinePairTable` has the interface of the cached tables (`foco.train.data`): `batch(idx)` gives the `TrainBatch`
of images `idx`, so that the losses, the negative plan and the loop are the ones of cached training. What it holds
is an index of the webdataset shards (where each sample's image and caption lie in its tar: four integers a
sample), never features. For each batch, DataLoader workers read and decode the images (positioned reads from
the tars, in the epoch's order, ahead of the step: `prefetch`), the captions' decompositions are looked up in the
store, and the backbone encodes the images (global + patches), the local captions (global) and the contextual
captions (tokens) on the training device.

K is fixed (`k`, default 5, the cached tables' cap): the decompositions are read a batch at a time, so the corpus's
largest K is not known up front. A cached table built with the same `k` gives the same batches.
"""
from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..corpora.webdataset import IMAGE_EXTS, shard_paths
from ..utils.progress import Bar
from .data import TrainBatch


class _Samples(torch.utils.data.Dataset):
    """Reads and decodes sample i's image and caption from its tar (a worker keeps each tar open)."""

    def __init__(self, paths: list[str], index: np.ndarray):
        self.paths, self.index = paths, index  # index (N, 5): shard, image offset, image size, caption offset, size
        self._fds: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.index)

    def _read(self, shard: int, offset: int, size: int) -> bytes:
        fd = self._fds.get(shard)
        if fd is None:
            fd = self._fds[shard] = os.open(self.paths[shard], os.O_RDONLY)
        return os.pread(fd, size, offset)

    def __getitem__(self, i: int) -> tuple[Image.Image, str]:
        shard, io_, isz, co, csz = (int(v) for v in self.index[i])
        data = self._read(shard, io_, isz)
        try:
            with Image.open(io.BytesIO(data)) as im:
                image = im.convert("RGB")
        except Exception as exc:  # noqa: BLE001 - name the sample, whatever PIL raised
            raise ValueError(f"{self.paths[shard]}: sample {i} of the corpus has an unreadable image ({exc})") from None
        return image, self._read(shard, co, csz).decode("utf-8", "replace").strip()


def _collate(items):
    return [im for im, _ in items], [c for _, c in items]


def index_shards(pattern: str) -> tuple[list[str], np.ndarray]:
    """Where each sample's image and caption lie in the tars of `pattern`: (paths, (N, 5) int64 rows of shard,
    image offset, image size, caption offset, caption size). A sample needs an image and a .txt caption."""
    paths = [str(p) for p in shard_paths(pattern)]
    rows = []
    bar = Bar(len(paths), "indexing shards")
    for s, path in enumerate(paths):
        try:
            tar = tarfile.open(path, "r")
        except (tarfile.TarError, OSError) as exc:
            raise ValueError(f"{path}: not a readable tar shard ({exc})") from None
        with tar:
            samples: dict[str, dict] = {}
            for m in tar:
                if not m.isfile():
                    continue
                key, _, ext = Path(m.name).name.partition(".")
                ext = "." + ext.lower()
                entry = samples.setdefault(key, {})
                if ext in IMAGE_EXTS:
                    entry["image"] = (m.offset_data, m.size)
                elif ext == ".txt":
                    entry["caption"] = (m.offset_data, m.size)
        for key, entry in samples.items():
            if "image" not in entry or "caption" not in entry:
                raise ValueError(f"{path}: sample {key} needs an image and a .txt caption for --online")
            rows.append((s, *entry["image"], *entry["caption"]))
        bar.update(1)
    bar.close()
    return paths, np.asarray(rows, dtype=np.int64).reshape(-1, 5)


class OnlinePairTable:
    """Training images of webdataset shards with their decompositions, encoded a batch at a time."""

    def __init__(self, pattern: str, backbone, store: str | Path, decomposer: str = "oracle", k: int = 5,
                 workers: int = 2, device: str = "cpu"):
        from ..decompose.store import DecompositionStore
        self.paths, self.index = index_shards(pattern)
        self.backbone, self.k, self.workers, self.device = backbone, k, workers, device
        self.dim = int(backbone.embed_dim)
        self._store = DecompositionStore(store)
        self._sid = self._store.resolve(decomposer)
        self._data = _Samples(self.paths, self.index)
        self._ahead: list[tuple[torch.Tensor, object]] = []
        self.parts: list[str] = []

    def __len__(self) -> int:
        return len(self.index)

    @property
    def ids(self) -> list[str]:
        return [str(i) for i in range(len(self))]

    def with_max_pairs(self, k: int) -> "OnlinePairTable":
        self.k = min(self.k, k)
        return self

    def pairs_per_image(self) -> None:
        """Unknown before the shards are read: the pairs are looked up a batch at a time."""
        return None

    def subset(self, keep: set[str]) -> "OnlinePairTable":
        raise ValueError("an --online table trains on every image of its shards; leaving images out needs a feature "
                         "cache (foco features extract, then foco train --features)")

    def prefetch(self, batches: list[torch.Tensor]) -> None:
        """Starts DataLoader workers reading and decoding this epoch's `batches` (each (B,)) in order, ahead of the
        steps that ask for them."""
        if self.workers == 0 or not batches:
            return
        loader = torch.utils.data.DataLoader(self._data, batch_sampler=[b.tolist() for b in batches],
                                             num_workers=self.workers, collate_fn=_collate, prefetch_factor=2)
        it = iter(loader)
        self._ahead = [(b, it) for b in batches]

    def _samples(self, idx: torch.Tensor) -> tuple[list[Image.Image], list[str]]:
        if self._ahead and torch.equal(self._ahead[0][0], idx):
            _, it = self._ahead.pop(0)
            return next(it)
        self._ahead = []
        return _collate([self._data[i] for i in idx.tolist()])

    def batch(self, idx: torch.Tensor) -> TrainBatch:
        """Encodes images `idx` (B,) and their pairs with the frozen backbone: a `TrainBatch` on the device."""
        images, captions = self._samples(idx)
        found = self._store.get_many(self._sid, list(dict.fromkeys(captions)))
        missing = [c for c in captions if c not in found]
        if missing:
            raise ValueError(f"the caption {missing[0]!r} has no decomposition in the store: decompose the shards "
                             "first (foco decompose --in the same shards)")
        B, K, dev = len(captions), self.k, self.device
        pairs = [found[c].pairs[:K] for c in captions]
        mask = torch.zeros(B, K, dtype=torch.bool, device="cpu")
        for b, ps in enumerate(pairs):
            mask[b, :len(ps)] = True
        locals_ = [p.local for ps in pairs for p in ps]
        contexts = [p.context for ps in pairs for p in ps]
        present = mask.reshape(-1).nonzero().flatten().to(dev)  # (n,) the pairs that exist
        im = self.backbone.encode_images(images, device=dev)
        loc = self.backbone.encode_texts(locals_, device=dev)
        ctx = self.backbone.encode_texts(contexts, device=dev)
        # out of the backbone's inference mode: tensors the trained modules may save for their backward
        g, patches = F.normalize(im.global_.clone().float(), dim=-1), im.patches.clone().float()
        L = max(1, int(ctx.mask.sum(1).max())) if len(contexts) else 1
        local = torch.zeros(B * K, self.dim, device=dev)
        local[present] = F.normalize(loc.global_.clone().float(), dim=-1)
        tokens = torch.zeros(B * K, L, self.dim, device=dev)
        tmask = torch.zeros(B * K, L, dtype=torch.bool, device=dev)
        tokens[present] = (ctx.tokens.clone().float()[:, :L] * ctx.mask[:, :L, None])
        tmask[present] = ctx.mask[:, :L].clone()
        return TrainBatch(image_global=g, patches=patches, local=local.view(B, K, -1), local_mask=mask.to(dev),
                          ctx_tokens=tokens.view(B, K, L, -1), ctx_mask=tmask.view(B, K, L))
