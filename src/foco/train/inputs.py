"""The one place that assembles training inputs from what a user has on disk, for `foco train`, the quickstart,
`foco ablate`, and PACT and TSCIR: which pair table (a world split's cache, a feature corpus read whole, or under
torchrun each rank's own shards), the decompositions it is joined with, the backbone the features were made with,
and the edit table of foco-edits. Typed arguments only; the CLI maps its flags onto these.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..decompose.schema import Decomposition
from .data import StreamingPairTable, build_pair_table
from .distributed import DistEnv, barrier, total_across


@dataclass(frozen=True)
class PairSource:
    """Where training pairs come from: the features, and either a world (`world`, `split`) or the webdataset
    shards they were extracted from (`shards`), with the decompositions of `store` (None: the world's oracle)."""

    features: str | Path
    world: str | Path | None = None
    split: str = "train"
    shards: str | None = None  # 'shards/{00000..00099}.tar'
    store: str | Path | None = None
    decomposer: str = "oracle"
    max_fallback: float = 0.01


def features_backbone(features: str | Path) -> str:
    """The backbone spec a feature cache or corpus was made with."""
    from ..corpus_features import is_corpus
    from ..features import FeatureCache
    from ..utils.io import read_json
    if is_corpus(features):
        return read_json(Path(features) / "corpus.json")["backbone"]
    return FeatureCache(features).manifest["backbone"]


def features_provenance(features: str | Path) -> dict:
    """What a checkpoint trained on `features` records of them: {"backbone": {"spec", "weights_sha256"},
    "features": {"path", "fingerprint"}} (a feature corpus: its corpus.json's sha256)."""
    from ..corpus_features import is_corpus
    from ..features import FeatureCache, cache_fingerprint
    from ..utils.io import read_json, sha256_file
    path = Path(features).resolve()
    if is_corpus(features):
        meta = read_json(path / "corpus.json")
        return {"backbone": {"spec": meta["backbone"], "weights_sha256": meta.get("backbone_sha256")},
                "features": {"path": str(path), "fingerprint": sha256_file(path / "corpus.json")[:16]}}
    fc = FeatureCache(features)
    return {"backbone": fc.backbone, "features": {"path": str(path), "fingerprint": cache_fingerprint(fc.manifest)}}


def pair_table(src: PairSource, env: DistEnv = DistEnv(), max_pairs: int = 5) -> tuple[StreamingPairTable, bool]:
    """(table, sharded): under torchrun with a feature corpus, this rank's own shards (`sharded`); otherwise the
    whole table. A corpus is joined one shard at a time with the decompositions of that shard's captions, so that
    memory holds no corpus-sized structure."""
    from ..corpus_features import is_corpus
    if not is_corpus(src.features):
        decompositions = cache_decompositions(src)
        if src.world is not None and src.shards is None:
            from ..features import FeatureCache
            from ..world.generate import world_fingerprint
            fc = FeatureCache(src.features)
            fc.check_source("world", world_fingerprint(src.world), f"--world {src.world}",
                            "pass the --world these features were extracted from, or extract this world's")
            fc.check_source("split", src.split, f"--split {src.split}", "pass the --split they were extracted from")
        return build_pair_table(src.features, decompositions, max_pairs), False
    if src.shards is None or src.store is None:
        raise ValueError("a feature corpus (--features with corpus.json) needs --in (its webdataset shards) and "
                         "--decompositions STORE (foco decompose --in the same shards)")
    lookup = ShardDecompositions(src.shards, src.store, src.decomposer, src.max_fallback)
    if not env.enabled:
        lookup.check_parts(src.features, 0, 1)
        table = build_pair_table(src.features, lookup, max_pairs)
        lookup.finish()
        return table, False
    lookup.check_parts(src.features, env.rank, env.world_size)
    table = build_pair_table(src.features, lookup, max_pairs, rank=env.rank, world_size=env.world_size, k=max_pairs)
    lookup.finish()
    present = (table.local_idx >= 0).sum(0).nonzero()
    used = int(present.max()) + 1 if len(present) else 1
    return table.with_max_pairs(total_across(min(max_pairs, used), env, "max")), True  # K agreed over ranks


def cache_decompositions(src: PairSource) -> dict[str, Decomposition]:
    """image id -> Decomposition for a feature cache: the world split's (--world), or the shards' samples by key
    (--in, with --decompositions)."""
    if src.shards is None:
        return world_decompositions(src)
    if src.store is None:
        raise ValueError("--in needs --decompositions STORE (foco decompose --in the same shards)")
    from ..decompose.inputs import read_captions
    from ..decompose.store import stored_decompositions
    return stored_decompositions([(r.id, r.caption) for r in read_captions(src.shards)], src.store, src.decomposer,
                                 src.max_fallback)


def online_table(shards: str, backbone_spec: str, store: str | Path, decomposer: str = "oracle",
                 device: str = "cpu", workers: int = 2, k: int = 5):
    """`foco train --online`: the shards' images encoded inside the loop by the frozen backbone on `device`
    (`foco.train.online`)."""
    from ..backbones import create_backbone
    from .online import OnlinePairTable
    if shards is None or store is None:
        raise ValueError("--online needs --in (webdataset shards) and --decompositions STORE")
    return OnlinePairTable(shards, create_backbone(backbone_spec, device), store, decomposer, k, workers, device)


def world_decompositions(src: PairSource) -> dict[str, Decomposition]:
    """image id -> Decomposition of a world split (--world): the oracle's, or a store's."""
    if src.world is None:
        raise ValueError("foco train needs --world (a world folder) or --in (webdataset shards)")
    from ..world.decompositions import world_decompositions as read
    return read(src.world, src.split, src.store, src.decomposer, src.max_fallback)


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


def edit_records(store: str | Path, settings: str | None = None) -> list:
    """The ITT triplets of an edit store (its one generator setting, or `settings`)."""
    from ..edits.store import EditStore
    with EditStore(store) as s:
        names = list(s.settings())
        if len(names) != 1 and settings not in names:
            raise ValueError(f"{store} holds {len(names)} generator settings {names}: pick one with --edit-settings")
        return s.records(settings or names[0])


def edit_table(features: str | Path, backbone, records: list, texts: str | Path, env: DistEnv = DistEnv(),
               max_negatives: int = 3, precision: str = "fp32"):
    """`records` joined with the training `features`; their texts encoded once into `texts` (resumable). Under
    torchrun rank 0 encodes and the others read what it wrote."""
    from ..features import ExtractConfig
    from .edit_data import build_edit_table, encode_edit_texts
    if env.is_main:
        encode_edit_texts(backbone, records, texts, max_negatives=max_negatives, cfg=ExtractConfig(precision=precision))
    barrier(env)
    return build_edit_table(features, texts, records, max_negatives=max_negatives)
