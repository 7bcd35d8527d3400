"""The embedded world's benchmarks in the common form: `single` with CIRR's protocol, `multi` with CIRCO's.

    ROOT = a world folder (`foco world generate`); parts "world/single" and "world/multi" of the chosen split.

Their features come either from the usual per-part caches (`foco.benchmarks.cache`, encoded on first use) or from
caches that `foco features extract --split SPLIT/PROTOCOL` wrote already (`world_features`; `world_cache_features`
is the feature source evaluation takes for a folder of them, so that evaluation itself knows nothing of the world).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from ..features import FeatureCache
from ..world.generate import world_fingerprint
from ..world.manifest import described_record, load_benchmark, pictures_fingerprint, restaged_record
from .base import BenchmarkReader, CIRBenchmark, CIRQuery, EvalProtocol, ImageRef, ReaderOption
from .cache import PartFeatures
from .circo import PROTOCOL as CIRCO
from .cirr import PROTOCOL as CIRR

_OWN = {"submission": None, "parts_averaged": False}  # no test server; each protocol is reported on its own
PROTOCOLS = {"single": replace(CIRR, **_OWN), "multi": replace(CIRCO, **_OWN),
             "described": replace(CIRR, **_OWN),  # `single` with described text (`foco.world.described`)
             "restaged": replace(CIRR, **_OWN),  # `described` over a redrawn gallery (`foco.world.restaged`)
             # OACIR (`foco.world.oacir`): a box anchors the instance to keep; OACIRR's metrics and their average
             "oacir": EvalProtocol(remove_reference=True, recall_ks=(1, 5), instance_ks=(1,),
                                   average=("R_ID@1", "R@1", "R@5"), **_OWN)}


def read_world(root: str | Path, split: str = "test", protocols: tuple[str, ...] = ("single", "multi")
               ) -> list[CIRBenchmark]:
    parts = []
    unknown = [p for p in protocols if p not in PROTOCOLS]
    if unknown or not protocols:
        raise ValueError(f"--protocols {','.join(protocols)}: {', '.join(map(repr, unknown)) or 'none given'}; "
                         f"choose from {', '.join(PROTOCOLS)}")
    fingerprint = world_fingerprint(root)
    for protocol in protocols:
        b = load_benchmark(root, split, protocol)  # a described or restaged part's record is checked here
        source = {"world": fingerprint}
        base = Path(root) / "benchmarks" / split / protocol
        if protocol == "described":  # what the text says is part of what the numbers mean
            source["described_share"] = described_record(base)["share"]
        elif protocol == "restaged":  # and how far the pictures were redrawn
            rec = restaged_record(base)
            source.update(described_share=rec["share"], restaged_strength=rec["strength"],
                          pictures=pictures_fingerprint(root, split, protocol))
        queries = [CIRQuery(id=qid, reference=ref, texts=(mod,), targets=list(targets), subset=list(subset),
                            category=edit or None)
                   for qid, ref, mod, targets, subset, edit in zip(b.query_ids, b.references, b.modifications,
                                                                   b.targets, b.subsets, b.edit_types)]
        instances: dict[str, tuple[str, ...]] = {}
        if protocol == "oacir":  # the box on each reference and the instances each image shows
            from ..world.oacir import load_oacir
            ann = load_oacir(root, split)
            size = (ann.image_size, ann.image_size)
            queries = [replace(q, instance=inst, box=tuple(float(v) for v in box), box_size=size)
                       for q, inst, box in zip(queries, ann.instances, ann.boxes.tolist())]
            instances = {g: tuple(ann.gallery_instances.get(g, ())) for g in b.gallery_ids}
        parts.append(CIRBenchmark(name=f"world/{protocol}", split=split,
                                  images={g: ImageRef(p) for g, p in zip(b.gallery_ids, b.gallery_images)},
                                  gallery=list(b.gallery_ids), queries=queries, protocol=PROTOCOLS[protocol],
                                  source=source, instances=instances))
    return parts


def world_features(bench: CIRBenchmark, cache: str | Path) -> PartFeatures:
    """A world part's features from a `foco features extract --split SPLIT/PROTOCOL` cache: the gallery's globals
    in memory, and the references' patches (every reference is a gallery image) and the query texts' tokens read
    from the cache's shards a batch at a time."""
    fc = FeatureCache(cache)
    protocol = bench.name.split("/")[-1]
    fc.check_source("world", bench.source.get("world"), "the benchmark's --root",
                    f"pass the --root these features were extracted from, or extract this world's with `foco "
                    f"features extract --split {bench.split}/{protocol}`")
    spec = fc.manifest.get("backbone") or "SPEC"  # the spec the cache was made with
    here = f"{bench.split}/{protocol}"
    extract = (f"move {cache} aside and run `foco features extract --world ROOT --backbone {spec} --split {here} "
               f"--out {cache}`")
    recorded = (fc.manifest.get("source") or {}).get("split")
    if isinstance(recorded, str) and "/" in recorded and recorded != here:
        raise ValueError(f"feature cache {cache} holds the features of {recorded}, not of {here}; check the folder "
                         f"under --features (evaluation reads <features>/{bench.split}-{protocol}), or {extract}")
    if protocol == "restaged":
        have = (fc.manifest.get("source") or {}).get("pictures")
        if have is None:
            raise ValueError(f"feature cache {cache} records no fingerprint of the restaged pictures (extracted "
                             f"before foco recorded one), so nothing says they are the pictures now in {here}; "
                             f"{extract}")
        fc.check_source("pictures", bench.source.get("pictures"), f"the restaging now in {here}",
                        f"the restaged protocol was written again since these features were extracted; {extract}")
    ids, gallery = fc.stored_images()
    if ids != bench.gallery_ids():
        raise ValueError(f"feature cache {cache} does not hold the gallery of {bench.split}/{protocol}; extract it "
                         f"with `foco features extract --split {bench.split}/{protocol} --out {cache}`")
    text_ids, texts = fc.stored_texts()
    tpos = {t: i for i, t in enumerate(text_ids)}
    wanted = bench.texts()
    missing = [t for t in wanted if t not in tpos]
    if missing:
        raise ValueError(f"{len(missing)} modification texts are missing from {cache}")
    rows = torch.tensor([tpos[t] for t in wanted], dtype=torch.long)  # (T,)
    return PartFeatures(gallery_ids=ids, gallery=gallery.global_, reference_ids=ids, references=gallery,
                        text_ids=wanted, texts=texts.subset(rows), backbone=fc.backbone)


READER = BenchmarkReader(read_world, (
    ReaderOption("protocols", "--protocols", "world protocols, comma-separated", default="single,multi",
                 parse=lambda v: tuple(p.strip() for p in v.split(","))),
))


def load_world_part(world: str | Path, split: str, protocol: str, cache: str | Path
                    ) -> tuple[CIRBenchmark, PartFeatures]:
    """One world part and its features from an extracted cache: `(bench, feats)` for `foco.eval`."""
    bench = read_world(world, split, (protocol,))[0]
    return bench, world_features(bench, cache)


def world_cache_features(features: str | Path) -> Callable[[CIRBenchmark], PartFeatures]:
    """World parts' features from `features`/<split>-<protocol>, as `foco features extract` and the quickstart
    write them."""
    def source(bench: CIRBenchmark) -> PartFeatures:
        protocol = bench.name.rsplit("/", 1)[-1]
        cache = Path(features) / f"{bench.split}-{protocol}"
        if not (cache / "manifest.json").is_file():
            raise ValueError(f"no features for {bench.name} {bench.split} in {cache}: `foco features extract "
                             f"--split {bench.split}/{protocol} --out {cache} ...`")
        return world_features(bench, cache)
    return source


def world_features_backbone(features: str | Path, split: str, protocols: tuple[str, ...] | None = None
                            ) -> str | None:
    """The backbone spec recorded by the world caches of `split` under `features` (of `protocols` when given: the
    first found), or None."""
    from ..utils.io import read_json
    names = [f"{split}-{p}" for p in protocols] if protocols else None
    for manifest in sorted(Path(features).glob(f"{split}-*/manifest.json")):
        if names is None or manifest.parent.name in names:
            return read_json(manifest).get("backbone")
    return None
