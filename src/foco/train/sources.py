"""Training data, chosen once: which kind of input a run trains on, and what each kind gives.

Four kinds, registered in `SOURCES` like every other named choice (`foco.registry`):

* `world`: a feature cache (`foco features extract`) of a world split, with the world's decompositions (the one
  way the embedded world enters training data);
* `features`: a feature cache of webdataset shards (`shards`) with a decomposition store (`store`);
* `corpus`: a feature corpus (a folder of per-shard caches with corpus.json, `foco.corpus_features`), with the
  shards it was extracted from and their decompositions; under torchrun each rank reads its own shards;
* `online`: webdataset shards encoded inside the loop by the frozen backbone (`foco.train.online`).

`training_data(...)` looks at what is on disk and picks the kind; it is the one place that asks. Each kind then
gives its pair table (`TrainingPairs`), its backbone, the provenance a checkpoint records of it, and the edit table
of foco-edits (where it can). Typed arguments only; the CLI maps its flags onto `training_data`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..decompose.schema import Decomposition
from ..registry import Registry
from .data import TrainingPairs, build_corpus_pair_table, build_pair_table
from .distributed import RunContext, barrier, total_across

SOURCES = Registry("training data")


class TrainingData(Protocol):
    """One kind of training input (`SOURCES`)."""

    kind: str

    @property
    def backbone_spec(self) -> str:
        """The spec of the frozen backbone the features were (or are) made with."""

    def provenance(self) -> dict:
        """What a checkpoint trained on this data records of it (`foco.json`'s "provenance")."""

    def pair_table(self, ctx: RunContext, max_pairs: int = 5) -> tuple[TrainingPairs, bool]:
        """(table, sharded): `sharded` when the table holds this rank's own images only (under torchrun)."""

    def edit_table(self, backbone, records: list, texts: str | Path, ctx: RunContext = RunContext(),
                   max_negatives: int = 3, precision: str = "fp32"):
        """foco-edits' `EditTable`: `records` joined with these features, their texts encoded once into `texts`."""


class _Features:
    """What both feature kinds share: the backbone and provenance of the cache or corpus, and the edit table."""

    features: str | Path

    def edit_table(self, backbone, records: list, texts: str | Path, ctx: RunContext = RunContext(),
                   max_negatives: int = 3, precision: str = "fp32"):
        """Under torchrun rank 0 encodes the edit texts and the others read what it wrote (resumable)."""
        from ..features import ExtractConfig
        from .edit_data import build_edit_table, encode_edit_texts
        if ctx.is_main:
            encode_edit_texts(backbone, records, texts, max_negatives=max_negatives,
                              cfg=ExtractConfig(precision=precision))
        barrier(ctx)
        return build_edit_table(self.features, texts, records, max_negatives=max_negatives)


class _Cache(_Features):
    """A feature cache (`foco features extract`): its manifest's backbone and fingerprint."""

    @property
    def backbone_spec(self) -> str:
        from ..features import FeatureCache
        return FeatureCache(self.features).manifest["backbone"]

    def provenance(self) -> dict:
        """{"backbone": {"spec", "weights_sha256"}, "features": {"path", "fingerprint", "source"}} ("source": the
        world's fingerprint and split the cache records, which evaluation keeps apart from the trained split)."""
        from ..features import FeatureCache, cache_fingerprint
        fc = FeatureCache(self.features)
        source = fc.manifest.get("source")  # the world and split a model trained on them saw
        return {"backbone": fc.backbone, "features": {"path": str(Path(self.features).resolve()),
                                                      "fingerprint": cache_fingerprint(fc.manifest),
                                                      **({"source": source} if isinstance(source, dict) else {})}}


@dataclass(frozen=True)
class WorldSplit(_Cache):
    """A feature cache of a world split (`world`, `split`), joined with the world's oracle decompositions or
    `store`'s. The one way the embedded world enters training data."""

    features: str | Path
    world: str | Path | None = None
    split: str = "train"
    store: str | Path | None = None
    decomposer: str = "oracle"
    max_fallback: float = 0.01
    kind: str = "world"

    def pair_table(self, ctx: RunContext = RunContext(), max_pairs: int = 5) -> tuple[TrainingPairs, bool]:
        """The whole table on every rank (each takes its slice of one global permutation), once the cache is
        checked to come from this world and split."""
        if self.world is None:
            raise ValueError("foco train needs --world (a world folder) or --in (webdataset shards)")
        from ..features import FeatureCache
        from ..world.decompositions import world_decompositions
        from ..world.generate import world_fingerprint
        decompositions = world_decompositions(self.world, self.split, self.store, self.decomposer, self.max_fallback)
        fc = FeatureCache(self.features)
        fc.check_source("world", world_fingerprint(self.world), f"--world {self.world}",
                        "pass the --world these features were extracted from, or extract this world's")
        fc.check_source("split", self.split, f"--split {self.split}", "pass the --split they were extracted from")
        return build_pair_table(self.features, decompositions, max_pairs), False


@dataclass(frozen=True)
class ShardFeatures(_Cache):
    """A feature cache of webdataset shards (`shards`), joined with their samples' decompositions in `store`."""

    features: str | Path
    shards: str | None = None  # 'shards/{00000..00099}.tar'
    store: str | Path | None = None
    decomposer: str = "oracle"
    max_fallback: float = 0.01
    kind: str = "features"

    def pair_table(self, ctx: RunContext = RunContext(), max_pairs: int = 5) -> tuple[TrainingPairs, bool]:
        """The whole table on every rank (each takes its slice of one global permutation)."""
        if self.store is None:
            raise ValueError("--in needs --decompositions STORE (foco decompose --in the same shards)")
        from ..decompose.inputs import read_captions
        from ..decompose.store import stored_decompositions
        decompositions = stored_decompositions([(r.id, r.caption) for r in read_captions(self.shards)], self.store,
                                               self.decomposer, self.max_fallback)
        return build_pair_table(self.features, decompositions, max_pairs), False


@dataclass(frozen=True)
class FeatureCorpus(_Features):
    """A feature corpus with the webdataset shards it was extracted from (`shards`) and their decompositions
    (`store`). It is joined one shard at a time, so that memory holds no corpus-sized structure."""

    features: str | Path
    shards: str | None = None
    store: str | Path | None = None
    decomposer: str = "oracle"
    max_fallback: float = 0.01
    kind: str = "corpus"

    @property
    def backbone_spec(self) -> str:
        from ..records import read as read_record
        return read_record("corpus.json", Path(self.features) / "corpus.json")["backbone"]

    def provenance(self) -> dict:
        """The backbone of corpus.json, and corpus.json's sha256 as the features' fingerprint."""
        from ..records import read as read_record
        from ..utils.io import sha256_file
        path = Path(self.features).resolve()
        meta = read_record("corpus.json", path / "corpus.json")
        return {"backbone": {"spec": meta["backbone"], "weights_sha256": meta.get("backbone_sha256")},
                "features": {"path": str(path), "fingerprint": sha256_file(path / "corpus.json")[:16]}}

    def pair_table(self, ctx: RunContext = RunContext(), max_pairs: int = 5) -> tuple[TrainingPairs, bool]:
        """One process: the whole corpus. Under torchrun: this rank's own shards (`sharded`), with K agreed over
        the ranks."""
        if self.shards is None or self.store is None:
            raise ValueError("a feature corpus (--features with corpus.json) needs --in (its webdataset shards) and "
                             "--decompositions STORE (foco decompose --in the same shards)")
        lookup = ShardDecompositions(self.shards, self.store, self.decomposer, self.max_fallback)
        if not ctx.enabled:
            lookup.check_parts(self.features, 0, 1)
            table = build_corpus_pair_table(self.features, lookup, max_pairs)
            lookup.finish()
            return table, False
        lookup.check_parts(self.features, ctx.rank, ctx.world_size)
        table = build_corpus_pair_table(self.features, lookup, max_pairs, rank=ctx.rank, world_size=ctx.world_size,
                                        k=max_pairs)
        lookup.finish()
        present = (table.local_idx >= 0).sum(0).nonzero()
        used = int(present.max()) + 1 if len(present) else 1
        return table.with_max_pairs(total_across(min(max_pairs, used), ctx, "max")), True  # K agreed over ranks


@dataclass(frozen=True)
class OnlineShards:
    """Webdataset shards (`shards`) encoded inside the loop by the frozen backbone `backbone` (a spec), with the
    decompositions of `store`. Trains the paper's two stages: no edit table."""

    shards: str | None
    backbone: str | None
    store: str | Path | None
    decomposer: str = "oracle"
    max_fallback: float = 0.01
    workers: int = 2
    kind: str = "online"

    @property
    def backbone_spec(self) -> str:
        if self.backbone is None:
            raise ValueError("--online needs --backbone SPEC (the frozen backbone to run in the loop)")
        return self.backbone

    def provenance(self) -> dict:
        return {"backbone": {"spec": self.backbone_spec}, "online": self.shards}

    def pair_table(self, ctx: RunContext = RunContext(), max_pairs: int = 5) -> tuple[TrainingPairs, bool]:
        from ..backbones import create_backbone
        from ..decompose.store import check_fallback_share
        from .online import OnlinePairTable
        spec = self.backbone_spec  # refused first: without it nothing can be encoded
        if self.shards is None or self.store is None:
            raise ValueError("--online needs --in (webdataset shards) and --decompositions STORE")
        check_fallback_share(self.store, self.decomposer, self.max_fallback)
        return OnlinePairTable(self.shards, create_backbone(spec, ctx.device), self.store,
                               self.decomposer, 5, self.workers, ctx.device), False

    def edit_table(self, *args, **kwargs):
        raise ValueError("--online trains the paper's two stages: --edits needs a feature cache (foco features "
                         "extract, then foco train --features)")


SOURCES.register("world", WorldSplit)
SOURCES.register("features", ShardFeatures)
SOURCES.register("corpus", FeatureCorpus)
SOURCES.register("online", OnlineShards)


def training_data(features: str | Path | None = None, world: str | Path | None = None, split: str = "train",
                  shards: str | None = None, store: str | Path | None = None, decomposer: str = "oracle",
                  max_fallback: float = 0.01, online: bool = False, backbone: str | None = None,
                  workers: int = 2) -> TrainingData:
    """The training data these arguments name, its kind picked once: `online` shards, or the kind of `features`
    on disk (a feature corpus has corpus.json; anything else is a feature cache)."""
    if online:
        return SOURCES.get("online")(shards, backbone, store, decomposer, max_fallback, workers)
    if features is None:
        raise ValueError("foco train needs --features (a feature cache or corpus), or --online with --backbone")
    from ..corpus_features import is_corpus
    if is_corpus(features):
        return SOURCES.get("corpus")(features, shards, store, decomposer, max_fallback)
    if shards is not None:
        return SOURCES.get("features")(features, shards, store, decomposer, max_fallback)
    return SOURCES.get("world")(features, world, split, store, decomposer, max_fallback)


@dataclass(frozen=True)
class DataSpec:
    """`training_data`'s arguments as one typed value (what `foco train` is told about its data)."""
    features: str | None = None
    world: str | None = None
    split: str = "train"
    shards: str | None = None
    store: str | None = None
    decomposer: str = "oracle"
    max_fallback: float = 0.01
    online: bool = False
    backbone: str | None = None
    workers: int = 2


def data_of(spec: DataSpec) -> TrainingData:
    """`training_data` of a `DataSpec`."""
    return training_data(spec.features, spec.world, spec.split, spec.shards, spec.store, spec.decomposer,
                         spec.max_fallback, online=spec.online, backbone=spec.backbone, workers=spec.workers)


class ShardDecompositions:
    """The decompositions of one corpus shard at a time: its captions read from its tar, looked up in the store.
    Rows a fallback wrote are counted over every shard; `finish` refuses more than `max_fallback` of them
    (`foco.decompose.store.stored_decompositions`, whose rule this keeps)."""

    def __init__(self, pattern: str, store: str | Path, decomposer: str, max_fallback: float):
        from ..corpora.webdataset import shard_paths
        if not Path(store).is_file():
            raise FileNotFoundError(f"decomposition store not found: {store} (run `foco decompose --out {store}`)")
        self.pattern, self.store, self.decomposer, self.max_fallback = pattern, Path(store), decomposer, max_fallback
        self.shards = {p.stem: p for p in shard_paths(pattern)}
        self.order = [p.stem for p in shard_paths(pattern)]
        self.seen = self.flagged = 0

    def check_parts(self, features: str | Path, rank: int, world_size: int) -> None:
        """The feature corpus must come from these shards: rank r's parts are shards r, r + N, ... of --in."""
        from ..corpus_features import corpus_parts
        parts = corpus_parts(features, rank, world_size)
        mine = [name for n, name in enumerate(self.order) if n % world_size == rank]
        if mine != parts:
            raise ValueError(f"--features {features} was extracted from other shards than --in {self.pattern} (rank "
                             f"{rank} has feature shards {parts[:3]}, --in gives {mine[:3]}); pass the --in pattern "
                             "of the extraction")

    def __call__(self, part: str, image_ids: list[str]) -> dict[str, Decomposition]:
        from ..decompose.inputs import read_shard_captions
        from ..decompose.store import DecompositionStore
        records = read_shard_captions([self.shards[part]])
        with DecompositionStore(self.store) as s:
            found = s.get_many(s.resolve(self.decomposer), [r.caption for r in records])
        self.seen += len(records)
        self.flagged += sum(1 for r in records if found[r.caption].flag)
        return {r.id: found[r.caption] for r in records}

    def finish(self) -> None:
        import logging
        from ..decompose.store import refuse_fallbacks
        refuse_fallbacks(self.flagged, self.seen, self.store, self.decomposer, self.max_fallback)
        if self.flagged:
            logging.getLogger(__name__).warning("%d of %d captions in %s (%s) were written by a fallback",
                                                self.flagged, self.seen, self.store, self.decomposer)


def edit_records(store: str | Path, settings: str | None = None, world: str | None = None,
                 world_root: str | Path | None = None) -> list:
    """The ITT triplets of an edit store (its one generator setting, or `settings`). With `world` (the fingerprint
    of the world the training features come from; or `world_root`, that world's folder), a store whose runs record
    another world is refused."""
    from ..edits.store import EditStore
    if world is None and world_root is not None:
        from ..world.generate import world_fingerprint
        world = world_fingerprint(world_root)
    with EditStore(store) as s:
        names = list(s.settings())
        if len(names) != 1 and settings not in names:
            raise ValueError(f"{store} holds {len(names)} generator settings {names}: pick one with --edit-settings")
        sid = settings or names[0]
        made_from = {(r.get("source") or {}).get("world") for r in s.runs() if r.get("settings_id") == sid}
        other = sorted(w for w in made_from if w and w != world)
        if world is not None and other:
            raise ValueError(f"--edits {store} was written from another world (fingerprint {other[0]}) than the one "
                             f"training reads (--world, fingerprint {world}): its source ids name other images; run "
                             "`foco edits generate --in WORLD` for this world into a new --out")
        return s.records(sid)
