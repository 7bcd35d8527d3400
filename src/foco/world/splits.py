"""What the feature cache encodes for each world split."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..backbones.base import Backbone
from ..decompose.schema import Decomposition
from ..features import ExtractConfig, extract_images, extract_texts
from .manifest import load_benchmark, load_pairs, pictures_fingerprint


def split_items(world: str | Path, split: str, include_captions: bool = True,
                decompositions: dict[str, Decomposition] | None = None
                ) -> tuple[list[tuple[str, Path]], list[tuple[str, str]]]:
    """(image id, path) and (text id, text) items of a split.

    Pairs splits ("pretrain", "train", "backbone_val"): every image; every caption, local caption and contextual
    caption once (the text is its own id); the pairs are the world's oracle decompositions unless `decompositions`
    (image id -> Decomposition) gives others. Benchmarks ("val/single", "test/multi", ...): the gallery images and
    the modification texts.
    """
    world = Path(world)
    if "/" in split:
        bench_split, protocol = split.split("/", 1)
        b = load_benchmark(world, bench_split, protocol)
        texts = list(dict.fromkeys(b.modifications))
        return list(zip(b.gallery_ids, b.gallery_images)), [(t, t) for t in texts]
    pairs = load_pairs(world, split)
    texts: dict[str, None] = {}
    for p in pairs:
        if include_captions:
            texts[p.caption] = None
        dec = p.decomposition if decompositions is None else decompositions[p.id]
        for pair in dec.pairs:
            texts[pair.local] = None
            texts[pair.context] = None
    return [(p.id, p.image) for p in pairs], [(t, t) for t in texts]


def extract_world_split(backbone: Backbone, world: str | Path, split: str, out: str | Path,
                        cfg: ExtractConfig = ExtractConfig(), include_captions: bool = True,
                        decompositions: dict[str, Decomposition] | None = None) -> dict[str, dict]:
    """Encodes a split's images and texts into `out`. FoCo training needs only the local and contextual captions;
    `include_captions=False` skips the full captions. A pairs split stores token features for its contextual
    captions only (F_Comp reads them token by token; everything else is read by its global vector), unless
    `cfg.tokens_for` says otherwise."""
    images, texts = split_items(world, split, include_captions, decompositions)
    check_image_hashes(Path(world), [path for _, path in images], split)
    from .generate import world_fingerprint
    source = {"world": world_fingerprint(world), "split": split}
    if "/" in split and pictures_fingerprint(world, *split.split("/", 1)) is not None:
        source["pictures"] = pictures_fingerprint(world, *split.split("/", 1))  # a restaging's own images
    cfg = replace(cfg, source=source)
    if "/" not in split and cfg.tokens and cfg.tokens_for is None:
        cfg = replace(cfg, tokens_for=context_texts(world, split, decompositions))
    return {"images": extract_images(backbone, images, out, cfg), "texts": extract_texts(backbone, texts, out, cfg)}


def check_image_hashes(world: Path, paths: list[Path], split: str = "") -> None:
    """The split's images are the ones generation hashed (images.sha256; an OACIR protocol's own images against
    its oacir.json; a restaging's own pictures are checked by `foco world verify` against its restaged.json): a
    replaced or swapped picture is refused before it is encoded."""
    from ..utils.io import ImageLoadError, sha256_file
    from .manifest import OACIR, OACIR_RECORD, oacir_image_hashes
    from .verify import _read_hashes
    part, _, protocol = split.partition("/")
    if protocol == OACIR:
        own = oacir_image_hashes(world, part)
        record = world / "benchmarks" / part / OACIR / OACIR_RECORD
        for path in paths:
            rel = path.relative_to(world).as_posix() if path.is_relative_to(world) else str(path)
            if rel not in own:
                raise ImageLoadError(f"{path}: not listed in {record}; regenerate the protocol with `foco world "
                                     f"oacir --world {world} --splits {part}`")
            if sha256_file(path) != own[rel]:
                raise ImageLoadError(f"{path}: content differs from the sha256 recorded in {record} (replaced or "
                                     f"swapped since it was written); regenerate the protocol, or see every changed "
                                     f"file with `foco world verify {world}`")
        return
    hashes = _read_hashes(world)
    if hashes is None:
        return
    for path in paths:
        rel = path.relative_to(world).as_posix() if path.is_relative_to(world) else None
        if rel in hashes and path.is_file() and sha256_file(path) != hashes[rel]:
            raise ImageLoadError(f"{path}: content differs from the sha256 recorded in {world / 'images.sha256'} "
                                 "(replaced or swapped since generation); regenerate the world, or see every changed "
                                 f"file with `foco world verify {world}`")


def context_texts(world: str | Path, split: str, decompositions: dict[str, Decomposition] | None = None
                  ) -> frozenset[str]:
    """The contextual captions of a pairs split's decompositions (the world's oracle ones unless given)."""
    return frozenset(pair.context for p in load_pairs(world, split)
                     for pair in (p.decomposition if decompositions is None else decompositions[p.id]).pairs)
