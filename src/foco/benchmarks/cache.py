"""Feature caches of a benchmark part, written with `foco.features` (resumable shards, progress bars).

Layout, one folder per part (`<cache>/<part name with / as ->/`)::

    gallery/             global features of the gallery images only: no patches (CIRCO's gallery is ~123K images)
    references/          global + patch features of the reference images (FoCo's F_Aggr reads the patches)
    texts-<hash>/        global + token features of the query texts; <hash> names the text list, so that another
                         caption join (FashionIQ) gets its own folder instead of being refused

Each folder is a `foco.features` cache, whose manifest refuses features of another backbone or item list.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..backbones.base import Backbone, ImageFeatures
from ..feature_store import StoredTexts
from ..features import ExtractConfig, FeatureCache, extract_images, extract_texts
from .base import CIRBenchmark


@dataclass
class PartFeatures:
    """Cached features of one benchmark part, each with its ids in cache order."""

    gallery_ids: list[str]
    gallery: torch.Tensor  # (N, D) normalised globals
    reference_ids: list[str]
    references: ImageFeatures  # (R, D) in memory; (R, P, D) patches a RowView, read per batch
    text_ids: list[str]  # the texts themselves
    texts: StoredTexts  # (T, D) in memory; tokens read per batch (`texts.take(rows)` -> TextFeatures)
    backbone: dict | None = None  # what the features were made with: {"spec", "weights_sha256"}; checked


def backbone_slug(spec: str) -> str:
    """A folder name for a backbone spec: readable, and unique through a short hash."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", spec).strip("_")[-48:]
    return f"{readable}-{hashlib.sha256(spec.encode()).hexdigest()[:8]}"


def part_folder(cache: Path, bench: CIRBenchmark) -> Path:
    return Path(cache) / bench.name.replace("/", "-")


def _texts_folder(folder: Path, texts: list[str]) -> Path:
    h = hashlib.sha256("\0".join(texts).encode("utf-8")).hexdigest()[:12]
    return folder / f"texts-{h}"


def cache_part(backbone: Backbone, bench: CIRBenchmark, folder: Path, cfg: ExtractConfig = ExtractConfig()
               ) -> dict[str, dict]:
    """Encodes what is not cached yet; returns extraction stats per kind."""
    gallery = [(i, bench.images[i]) for i in bench.gallery_ids()]
    refs = [(i, bench.images[i]) for i in bench.reference_ids()]
    texts = bench.texts()
    return {
        "gallery": extract_images(backbone, gallery, folder / "gallery", replace(cfg, patches=False)),
        "references": extract_images(backbone, refs, folder / "references", replace(cfg, patches=True)),
        "texts": extract_texts(backbone, [(t, t) for t in texts], _texts_folder(folder, texts), cfg),
    }


def load_part(bench: CIRBenchmark, folder: Path) -> PartFeatures:
    """The part's gallery globals in memory; reference patches and text tokens are read a batch at a time."""
    caches = [FeatureCache(folder / "gallery"), FeatureCache(folder / "references"),
              FeatureCache(_texts_folder(folder, bench.texts()))]
    from ..backbones import check_same_backbone
    for other in caches[1:]:
        check_same_backbone(other.backbone, str(other.path), caches[0].backbone, str(caches[0].path),
                            f"delete {folder} and evaluate again to encode it anew")
    gallery_ids, gallery = caches[0].stored_images()
    reference_ids, references = caches[1].stored_images()
    text_ids, texts = caches[2].stored_texts()
    return PartFeatures(gallery_ids, gallery.global_, reference_ids, references, text_ids, texts,
                        backbone=caches[0].backbone)
