"""Online encoding (`foco train --in 'shards/{...}.tar' --backbone SPEC --online`): for corpora whose features do
not fit on disk, the frozen backbone runs inside the training loop.

`OnlinePairTable` has the interface of the cached tables (`foco.train.data`): `batch(idx)` gives the `TrainBatch`
of images `idx`, so that the losses, the negative plan and the loop are the ones of cached training. What it holds
is an index of the webdataset shards (where each sample's image and caption lie in its tar: four integers a
sample), never features. For each batch, DataLoader workers (`foco.corpora.loader.make_loader`: pinned batches on
CUDA) do all the CPU work, in the epoch's order, ahead of the step (`prefetch`): they read the images (positioned
reads from the tars) and preprocess them into uint8 pixels (the backbone's `image_transform`), look the captions'
decompositions up in the store, and tokenize the local and contextual captions at a fixed length (its
`text_transform`). The training process only copies the tensors to the device (non-blocking) and runs the
backbone: the images (global + patches), the local captions (global), the contextual captions (tokens).

K is fixed (`k`, default 5, the cached tables' cap): the decompositions are read a batch at a time, so the corpus's
largest K is not known up front. A cached table built with the same `k` gives the same batches.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..corpora.webdataset import IMAGE_EXTS, shard_paths, tar_files
from ..utils.device import to_device
from ..utils.progress import Bar
from .data import TrainBatch


class _Samples(torch.utils.data.Dataset):
    """Reads sample i's image and caption from its tar (a worker keeps each tar open) and preprocesses the image:
    ((3, H, W) uint8 pixels, caption)."""

    def __init__(self, paths: list[str], index: np.ndarray, transform):
        self.paths, self.index = paths, index  # index (N, 5): shard, image offset, image size, caption offset, size
        self.transform = transform  # the backbone's image_transform(): PIL -> (3, H, W)
        self._fds: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fds": {}}  # a worker opens its own descriptors

    def _read(self, shard: int, offset: int, size: int) -> bytes:
        fd = self._fds.get(shard)
        if fd is None:
            fd = self._fds[shard] = os.open(self.paths[shard], os.O_RDONLY)
        return os.pread(fd, size, offset)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        shard, io_, isz, co, csz = (int(v) for v in self.index[i])
        data = self._read(shard, io_, isz)
        try:
            with Image.open(io.BytesIO(data)) as im:
                image = im.convert("RGB")
        except Exception as exc:  # noqa: BLE001 - name the sample, whatever PIL raised
            raise ValueError(f"{self.paths[shard]}: sample {i} of the corpus has an unreadable image ({exc})") from None
        return self.transform(image), self._read(shard, co, csz).decode("utf-8", "replace").strip()


class _Collate:
    """A batch of samples -> the tensors the step encodes, made where the batch is made (a worker): pixels
    (B, 3, H, W), the pair mask (B, K), and the n present pairs' local and contextual captions as fixed-length ids
    and masks (n, L) (pairs in image order, then pair order). The decompositions come from the store, which each
    process opens for itself."""

    def __init__(self, store: Path, sid: str, k: int, text_transform):
        self.store, self.sid, self.k, self.text_transform = store, sid, k, text_transform
        self._db, self._pid = None, None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_db": None}  # a sqlite connection stays in the process that opened it

    def __call__(self, items: list[tuple[torch.Tensor, str]]) -> dict:
        from ..decompose.store import DecompositionStore
        if self._db is None or self._pid != os.getpid():  # a forked worker opens its own (never one across a fork)
            self._db, self._pid = DecompositionStore(self.store), os.getpid()
        captions = [c for _, c in items]
        found = self._db.get_many(self.sid, list(dict.fromkeys(captions)))
        missing = [c for c in captions if c not in found]
        if missing:
            raise ValueError(f"the caption {missing[0]!r} has no decomposition in the store: decompose the shards "
                             "first (foco decompose --in the same shards)")
        pairs = [found[c].pairs[:self.k] for c in captions]
        mask = torch.zeros(len(items), self.k, dtype=torch.bool)  # (B, K)
        for b, ps in enumerate(pairs):
            mask[b, :len(ps)] = True
        out = {"pixels": torch.stack([px for px, _ in items]), "mask": mask}  # (B, 3, H, W), (B, K)
        for name, texts in (("local", [p.local for ps in pairs for p in ps]),
                            ("ctx", [p.context for ps in pairs for p in ps])):
            if texts:
                out[f"{name}_ids"], out[f"{name}_mask"] = self.text_transform(texts)  # (n, L), (n, L)
        return out


def index_shards(pattern: str) -> tuple[list[str], np.ndarray]:
    """Where each sample's image and caption lie in the tars of `pattern`: (paths, (N, 5) int64 rows of shard,
    image offset, image size, caption offset, caption size). A sample needs an image and a .txt caption."""
    paths = [str(p) for p in shard_paths(pattern)]
    rows = []
    bar = Bar(len(paths), "indexing shards")
    for s, path in enumerate(paths):
        samples: dict[str, dict] = {}
        for key, ext, m, _ in tar_files(path, ValueError):
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
        from ..backbones.base import has_pixel_path
        from ..decompose.store import DecompositionStore
        if not has_pixel_path(backbone):
            raise ValueError(f"--online needs a backbone that preprocesses apart from encoding (image_transform, "
                             f"encode_pixels, text_transform, encode_tokens); {backbone.spec} does not")
        self.paths, self.index = index_shards(pattern)
        self.backbone, self.k, self.workers, self.device = backbone, k, workers, device
        self.dim = int(backbone.embed_dim)
        self._store = DecompositionStore(store)
        self._sid = self._store.resolve(decomposer)
        self._store_path = Path(store)
        self._data = _Samples(self.paths, self.index, backbone.image_transform())
        self._text_transform = backbone.text_transform()
        self._collator: _Collate | None = None
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

    def _collate(self) -> _Collate:
        """The collate of this K (one store connection in this process; a worker gets a copy without it)."""
        if self._collator is None or self._collator.k != self.k:
            self._collator = _Collate(self._store_path, self._sid, self.k, self._text_transform)
        return self._collator

    def loader(self, batches: list[torch.Tensor]) -> torch.utils.data.DataLoader:
        """The DataLoader of `batches` (each (B,)), in order: `workers` processes read, preprocess, look up and
        tokenize; pinned batches on CUDA."""
        from ..corpora.loader import make_loader
        return make_loader(self._data, device=self.device, workers=self.workers,
                           batch_sampler=[b.tolist() for b in batches], collate_fn=self._collate(), prefetch=2)

    def prefetch(self, batches: list[torch.Tensor]) -> None:
        """Starts DataLoader workers preparing this epoch's `batches` (each (B,)) in order, ahead of the steps that
        ask for them."""
        if self.workers == 0 or not batches:
            return
        it = iter(self.loader(batches))
        self._ahead = [(b, it) for b in batches]

    def _prepared(self, idx: torch.Tensor) -> dict:
        if self._ahead and torch.equal(self._ahead[0][0], idx):
            _, it = self._ahead.pop(0)
            return next(it)
        self._ahead = []
        return self._collate()([self._data[i] for i in idx.tolist()])

    def batch(self, idx: torch.Tensor) -> TrainBatch:
        """Encodes images `idx` (B,) and their pairs with the frozen backbone: a `TrainBatch` on the device."""
        prep = self._prepared(idx)
        mask = prep["mask"]  # (B, K) bool, on the CPU
        B, K, dev, bb = mask.shape[0], self.k, self.device, self.backbone
        n = int(mask.sum())  # the pairs that exist (a CPU count: no device sync)
        present = to_device(mask.reshape(-1).nonzero().flatten(), dev)  # (n,) pinned, copied without waiting
        im = bb.encode_pixels(prep["pixels"], device=dev)  # pixels (B, 3, H, W) uint8
        # out of the backbone's inference mode: tensors the trained modules may save for their backward
        g, patches = F.normalize(im.global_.clone().float(), dim=-1), im.patches.clone().float()
        local = torch.zeros(B * K, self.dim, device=dev)
        L = max(1, int(prep["ctx_mask"].sum(1).max())) if n else 1  # the longest context (CPU mask)
        tokens = torch.zeros(B * K, L, self.dim, device=dev)
        tmask = torch.zeros(B * K, L, dtype=torch.bool, device=dev)
        if n:
            loc = bb.encode_tokens(prep["local_ids"], prep["local_mask"], device=dev)  # (n, L', ...)
            ctx = bb.encode_tokens(prep["ctx_ids"], prep["ctx_mask"], device=dev)
            local[present] = F.normalize(loc.global_.clone().float(), dim=-1)
            tokens[present] = (ctx.tokens.clone().float()[:, :L] * ctx.mask[:, :L, None])
            tmask[present] = ctx.mask[:, :L].clone()
        return TrainBatch(image_global=g, patches=patches, local=local.view(B, K, -1),
                          local_mask=to_device(mask, dev), ctx_tokens=tokens.view(B, K, L, -1),
                          ctx_mask=tmask.view(B, K, L))
