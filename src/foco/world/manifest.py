"""Reading a generated world back, with validation: a malformed manifest raises an error naming the file and line."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..decompose.schema import Decomposition
from ..utils.io import ManifestError, read_jsonl


@dataclass
class WorldPair:
    id: str
    image: Path  # absolute path
    caption: str
    decomposition: Decomposition


@dataclass
class WorldBenchmark:
    """A benchmark split in one protocol. `targets[q]` lists the ground-truth gallery ids of query q."""

    protocol: str
    gallery_ids: list[str]
    gallery_images: list[Path]
    query_ids: list[str]
    references: list[str]
    modifications: list[str]
    targets: list[list[str]]
    subsets: list[list[str]]  # "single" only: the 6 subset members, reference included
    edit_types: list[str]


def load_pairs(root: str | Path, split: str) -> list[WorldPair]:
    root = Path(root)
    path = root / "pairs" / f"{split}.jsonl"
    out = []
    for lineno, r in enumerate(read_jsonl(path, required=("id", "image", "caption", "decomposition")), 1):
        try:
            dec = Decomposition.from_dict(r["decomposition"])
        except ValueError as exc:
            raise ManifestError(f"{path}:{lineno}: bad decomposition: {exc}") from exc
        out.append(WorldPair(str(r["id"]), root / r["image"], str(r["caption"]), dec))
    _check_unique(path, [p.id for p in out])
    return out


def load_benchmark(root: str | Path, split: str, protocol: str) -> WorldBenchmark:
    root = Path(root)
    base = root / "benchmarks" / split / protocol
    gallery = read_jsonl(base / "gallery.jsonl", required=("id", "image"))
    gids = [str(g["id"]) for g in gallery]
    _check_unique(base / "gallery.jsonl", gids)
    known = set(gids)
    qpath = base / "queries.jsonl"
    target_key = "target" if protocol == "single" else "targets"
    queries = read_jsonl(qpath, required=("id", "reference", "modification", target_key))
    bench = WorldBenchmark(protocol, gids, [root / g["image"] for g in gallery], [], [], [], [], [], [])
    for lineno, q in enumerate(queries, 1):
        targets = [q["target"]] if protocol == "single" else list(q["targets"])
        subset = list(q.get("subset", []))
        unknown = [x for x in [q["reference"], *targets, *subset] if x not in known]
        if unknown:
            raise ManifestError(f"{qpath}:{lineno}: {len(unknown)} id(s) not in the gallery: {unknown[:3]}")
        if not targets:
            raise ManifestError(f"{qpath}:{lineno}: query has no target")
        bench.query_ids.append(str(q["id"]))
        bench.references.append(q["reference"])
        bench.modifications.append(str(q["modification"]))
        bench.targets.append(targets)
        bench.subsets.append(subset)
        bench.edit_types.append(str(q.get("edit", {}).get("type", "")))
    _check_unique(qpath, bench.query_ids)
    return bench


def _check_unique(path: Path, ids: list[str]) -> None:
    if len(set(ids)) != len(ids):
        seen, dups = set(), []
        for i in ids:
            if i in seen:
                dups.append(i)
            seen.add(i)
        raise ManifestError(f"{path}: {len(dups)} duplicate id(s), e.g. {dups[:3]}")
