"""The input pipeline: DataLoader workers read, decode and preprocess, and hand back tensors (issue 43).

A worker turns an image source into pixels with the backbone's picklable `image_transform()` (one PIL image ->
(3, H, W) uint8: resized and cropped, not normalised, so a quarter of fp32's bytes cross between processes) and
texts into fixed-length ids with its `text_transform()`; the process that owns the device only encodes
(`foco.backbones.base.PixelBackbone`). On CUDA the batches come back in pinned memory (`make_loader`), so the
backbone's `.to(device, non_blocking=True)` copies overlap the previous batch's work.

    TarMember      where one image lies in a tar shard (offsets: nothing of the shard is held in memory); `load()`
    index_tar      the samples of one shard: key, image member, caption (.txt, else the .json's "caption")
    Preprocessed   a Dataset: source i -> transform(source i loaded), any source with `load()` or a path
    make_loader    a DataLoader with pinned memory on CUDA, workers, prefetch and (optionally) persistent workers
    AheadBatches   a training loop's batches, prepared by workers in the epoch's order ahead of its steps
    pixel_batches  the preprocessed pixels of given batches of sources, in order, as the loader yields them

Used by `foco.corpus_features` (extraction, batch by batch), `foco.train.online` (online training) and
`foco.train.tat` (SlerpTAT's tuning, through `AheadBatches`).
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from ..utils.io import load_image
from .webdataset import IMAGE_EXTS, tar_files


@dataclass(frozen=True)
class TarMember:
    """One image in a tar shard: the bytes `size` from `offset` of `path`. `str()` is its identity in a feature
    cache (`name`, e.g. "00003.tar#000000042"); `load()` reads and decodes it (in whichever process calls it)."""

    path: str
    offset: int
    size: int
    name: str

    def read(self) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(self.size)
        if len(data) != self.size:
            raise ValueError(f"{self.path}: sample {self.name} is cut short at byte offset {self.offset + len(data)} "
                             f"({len(data)} of {self.size} bytes); fetch the shard again or leave it out of --in")
        return data

    def load(self) -> "Image.Image":  # noqa: F821 - PIL only where images are decoded
        from PIL import Image
        data = self.read()
        try:
            with Image.open(io.BytesIO(data)) as im:
                return im.convert("RGB")
        except Exception as exc:  # noqa: BLE001 - name the sample, whatever PIL raised
            raise ValueError(f"{self.path}: sample {self.name} has an unreadable image ({exc})") from None

    def __str__(self) -> str:
        return self.name


@dataclass
class TarSample:
    key: str
    image: TarMember | None  # None: the sample has no image
    caption: str | None


def index_tar(path: str | Path) -> list[TarSample]:
    """The samples of one tar shard, in order, read in one pass over its headers: each image as a `TarMember`
    (never its bytes), the caption from the .txt (else the .json's "caption"). Raises ValueError naming the shard
    when it is not a readable tar."""
    path = Path(path)
    samples: dict[str, dict[str, Any]] = {}
    for key, ext, m, tar in tar_files(path, ValueError):
        entry = samples.setdefault(key, {})
        if ext in IMAGE_EXTS and "image" not in entry:
            entry["image"] = TarMember(str(path), m.offset_data, m.size, f"{path.name}#{key}")
        elif ext == ".txt":
            entry["caption"] = tar.extractfile(m).read().decode("utf-8", "replace").strip()
        elif ext == ".json":
            try:
                meta = json.loads(tar.extractfile(m).read().decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"{path}: sample {key}: its .json is not valid JSON ({exc})") from None
            if isinstance(meta, dict) and isinstance(meta.get("caption"), str):
                entry["meta_caption"] = meta["caption"]
    return [TarSample(key, e.get("image"), e.get("caption", e.get("meta_caption"))) for key, e in samples.items()]


def load_source(source: Any) -> "Image.Image":  # noqa: F821
    """A source's RGB image: `source.load()` (a `TarMember`, a benchmark's crop) or a path's file."""
    return source.load() if hasattr(source, "load") else load_image(source)


class Preprocessed(torch.utils.data.Dataset):
    """Source i -> `transform(load_source(sources[i]))`, a (3, H, W) tensor: what a worker hands back."""

    def __init__(self, sources: Sequence[Any], transform: Callable[[Any], torch.Tensor]):
        self.sources, self.transform = sources, transform

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.transform(load_source(self.sources[i]))  # (3, H, W)


def stack(items: list[torch.Tensor]) -> torch.Tensor:
    """The collate of `Preprocessed`: (B, 3, H, W)."""
    return torch.stack(items)


def make_loader(dataset: torch.utils.data.Dataset, *, device: str | torch.device = "cpu", workers: int = 0,
                batch_size: int | None = None, batch_sampler: Sequence[Sequence[int]] | None = None,
                collate_fn: Callable | None = None, prefetch: int = 2, persistent: bool = False
                ) -> torch.utils.data.DataLoader:
    """The one DataLoader of foco's input pipeline: `workers` processes (0: in this one), each `prefetch` batches
    ahead; batches in pinned memory when `device` is CUDA (the backbones copy them with `non_blocking=True`);
    `persistent` keeps the workers between epochs. Give `batch_size` (in order) or `batch_sampler` (batches of
    indices, yielded in that order)."""
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    kw: dict[str, Any] = {"num_workers": workers, "collate_fn": collate_fn,
                          "pin_memory": torch.device(device).type == "cuda"}
    if workers > 0:
        kw.update(prefetch_factor=prefetch, persistent_workers=persistent)
    if batch_sampler is not None:
        return torch.utils.data.DataLoader(dataset, batch_sampler=[list(b) for b in batch_sampler], **kw)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size or 1, shuffle=False, **kw)


class AheadBatches:
    """The batches of `dataset` a training loop will ask for, prepared by `workers` DataLoader processes in the
    epoch's order ahead of the steps (`prefetch`, which `foco.train.loop.Phase.prefetch` calls); a step takes its
    batch with `take`. A batch asked out of that order (or with no workers) is collated in the asking process."""

    def __init__(self, dataset: torch.utils.data.Dataset, workers: int, device: str | torch.device = "cpu"):
        self.dataset, self.workers, self.device = dataset, workers, device
        self._ahead: list[tuple[torch.Tensor, Iterator]] = []

    def prefetch(self, batches: list[torch.Tensor], collate: Callable) -> None:
        """Starts the workers on `batches` (each (B,) indices), in order, each collated by `collate`."""
        if self.workers == 0 or not batches:
            return
        it = iter(self.loader(batches, collate))
        self._ahead = [(b, it) for b in batches]

    def loader(self, batches: list[torch.Tensor], collate: Callable) -> torch.utils.data.DataLoader:
        """The DataLoader of `batches` (each (B,)), in order, on the workers; pinned batches on CUDA."""
        return make_loader(self.dataset, device=self.device, workers=self.workers,
                           batch_sampler=[b.tolist() for b in batches], collate_fn=collate, prefetch=2)

    def take(self, idx: torch.Tensor, collate: Callable) -> Any:
        """The batch of indices `idx` (B,): the workers' next one when it is that batch, else collated here."""
        if self._ahead and torch.equal(self._ahead[0][0], idx):
            _, it = self._ahead.pop(0)
            return next(it)
        self._ahead = []
        return collate([self.dataset[i] for i in idx.tolist()])


def pixel_batches(sources: Sequence[Any], transform: Callable[[Any], torch.Tensor], batches: Sequence[Sequence[int]],
                  *, workers: int = 0, device: str | torch.device = "cpu", prefetch: int = 2) -> Iterator[torch.Tensor]:
    """The (b, 3, H, W) pixels of each batch of `batches` (indices into `sources`), in order, as the workers
    finish them: at most `workers * prefetch` batches exist ahead of the consumer, never the whole list."""
    loader = make_loader(Preprocessed(sources, transform), device=device, workers=workers, batch_sampler=batches,
                         collate_fn=stack, prefetch=prefetch)
    yield from loader
