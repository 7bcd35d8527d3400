"""Reading a generated world back, with validation: a malformed manifest raises an error naming the file and line."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..decompose.schema import Decomposition
from ..utils.io import ManifestError, read_json, read_jsonl, sha256_file


SINGLE_LIKE = ("single", "described", "restaged")  # one target per query, a 6-image subset: CIRR's protocol
OACIR_RECORD, OACIR_FILES = "oacir.json", ("gallery.jsonl", "queries.jsonl")
OACIR = "oacir"  # one target per query too, with a larger subset (`foco.world.oacir`)


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
    return _hashed(root, [f"pairs/{split}.jsonl"], lambda: _load_pairs(root, split))


def _hashed(root: Path, rels: list[str], parse):
    """`parse()` of manifests whose bytes match world.json's sha256. A manifest that does not match is refused,
    by the line-level error parsing it finds where it finds one (the more precise message), else by its hash:
    nothing read from a changed manifest is returned, and parsing it can fail no other way."""
    problem = next((p for rel in rels if (p := _hash_problem(root, rel))), None)
    if problem is None:
        return parse()
    try:
        parse()
    except ManifestError:
        raise
    except Exception:  # noqa: BLE001  (a damaged file: the hash says what is wrong)
        pass
    raise ManifestError(problem)


def _load_pairs(root: Path, split: str) -> list[WorldPair]:
    path = root / "pairs" / f"{split}.jsonl"
    out = []
    for lineno, r in enumerate(read_jsonl(path, required=("id", "image", "caption", "decomposition")), 1):
        _check_types(path, lineno, r, {"id": str, "image": str, "caption": str})
        try:
            dec = Decomposition.from_dict(r["decomposition"])
        except ValueError as exc:
            raise ManifestError(f"{path}:{lineno}: bad decomposition: {exc}") from exc
        _check_text(path, lineno, "caption", r["caption"])
        out.append(WorldPair(str(r["id"]), root / r["image"], str(r["caption"]), dec))
    _check_unique(path, [p.id for p in out])
    _check_count(root, f"pairs/{split}.jsonl", len(out))
    return out


def load_benchmark(root: str | Path, split: str, protocol: str) -> WorldBenchmark:
    root = Path(root)
    rels = [f"benchmarks/{split}/{protocol}/{name}" for name in ("gallery.jsonl", "queries.jsonl")]
    return _hashed(root, rels, lambda: _load_benchmark(root, split, protocol))


def _load_benchmark(root: Path, split: str, protocol: str) -> WorldBenchmark:
    base = root / "benchmarks" / split / protocol
    if protocol == "described":  # single's queries with described text: checked against the world it came from
        check_described(root, split)
    elif protocol == "restaged":  # the same, over a redrawn gallery: checked likewise
        check_restaged(root, split)
    gallery = read_jsonl(base / "gallery.jsonl", required=("id", "image"))
    for lineno, g in enumerate(gallery, 1):
        _check_types(base / "gallery.jsonl", lineno, g, {"id": str, "image": str})
    gids = [str(g["id"]) for g in gallery]
    _check_unique(base / "gallery.jsonl", gids)
    known = set(gids)
    qpath = base / "queries.jsonl"
    target_key = "target" if protocol in SINGLE_LIKE or protocol == OACIR else "targets"
    queries = read_jsonl(qpath, required=("id", "reference", "modification", target_key))
    bench = WorldBenchmark(protocol, gids, [root / g["image"] for g in gallery], [], [], [], [], [], [])
    for lineno, q in enumerate(queries, 1):
        _check_types(qpath, lineno, q, {"id": str, "reference": str, "modification": str, "target": str,
                                        "targets": list, "subset": list, "edit": dict})
        targets = [q["target"]] if target_key == "target" else list(q["targets"])
        subset = list(q.get("subset", []))
        unknown = [x for x in [q["reference"], *targets, *subset] if x not in known]
        if unknown:
            raise ManifestError(f"{qpath}:{lineno}: {len(unknown)} id(s) not in the gallery: {unknown[:3]}")
        if not targets:
            raise ManifestError(f"{qpath}:{lineno}: query has no target")
        _check_text(qpath, lineno, "modification", q["modification"])
        bench.query_ids.append(str(q["id"]))
        bench.references.append(q["reference"])
        bench.modifications.append(str(q["modification"]))
        bench.targets.append(targets)
        bench.subsets.append(subset)
        edit = q.get("edit") or {}
        if not isinstance(edit, dict):
            raise ManifestError(f"{qpath}:{lineno}: the edit is not an object")
        bench.edit_types.append(str(edit.get("type", "")))
    _check_unique(qpath, bench.query_ids)
    if protocol == OACIR:  # its record's sha256, once the lines parsed (a damaged line is named by its number)
        check_oacir(root, split)
    _check_count(root, f"benchmarks/{split}/{protocol}/gallery.jsonl", len(gids))
    _check_count(root, f"benchmarks/{split}/{protocol}/queries.jsonl", len(queries))
    return bench


def _check_types(path: Path, lineno: int, rec: dict, types: dict) -> None:
    """The fields of a manifest line that readers use hold their type (a list: of strings), where present."""
    for key, kind in types.items():
        if key not in rec:
            continue
        value = rec[key]
        ok = isinstance(value, kind) and (kind is not list or all(isinstance(v, str) for v in value))
        if not ok:
            what = "a list of strings" if kind is list else {str: "a string", dict: "an object"}[kind]
            raise ManifestError(f"{path}:{lineno}: field {key} should be {what}, not {value!r:.40}; fix the line or "
                                "regenerate the world")


def _check_text(path: Path, lineno: int, field: str, value) -> None:
    from ..utils.text import text_problem
    problem = text_problem(value)
    if problem:
        raise ManifestError(f"{path}:{lineno}: the {field} {problem}; fix the line or regenerate the world")


def _check_count(root: Path, rel: str, n: int) -> None:
    """A manifest holds as many records as world.json counts for it (its bytes were checked against world.json's
    sha256 before it was parsed, `_hashed`): a deleted or added line is refused by every reader (training,
    extraction, evaluation), not only by `foco world verify`. A world without world.json is a user's folder of
    manifests: nothing to compare with."""
    from ..records import read
    summary = root / "world.json"
    if not summary.is_file():
        return
    record = read("world.json", summary)
    want = record["counts"].get(rel)
    if want is not None and want != n:
        raise ManifestError(f"{root / rel}: {n} records, but {summary} counts {want} (lines deleted or added since "
                            "generation); regenerate the world, or check it with `foco world verify`")


def _hash_problem(root: Path, rel: str) -> str | None:
    """What is wrong with a manifest's bytes against the sha256 world.json recorded at generation, or None (also
    for a folder of manifests without world.json, a user's)."""
    from ..records import read
    summary = root / "world.json"
    if summary.exists() and not summary.is_file():
        raise ManifestError(f"{summary} is not a file: the world's record is damaged; regenerate the world")
    if not summary.is_file():
        return None
    record = read("world.json", summary)
    digest = (record.get("manifests_sha256") or {}).get(rel)
    if digest is not None and (root / rel).is_file() and sha256_file(root / rel) != digest:
        return (f"{root / rel} does not match the sha256 {summary} recorded at generation (lines edited, swapped or "
                "reordered since); regenerate the world, or see what changed with `foco world verify`")
    return None


def _check_unique(path: Path, ids: list[str]) -> None:
    if len(set(ids)) != len(ids):
        seen, dups = set(), []
        for i in ids:
            if i in seen:
                dups.append(i)
            seen.add(i)
        raise ManifestError(f"{path}: {len(dups)} duplicate id(s), e.g. {dups[:3]}")


# The described protocol's record (`foco.world.described` writes it; every reader of the protocol checks it here)
DESCRIBED_RECORD = "described.json"
DESCRIBED_FILES = ("gallery.jsonl", "queries.jsonl")


def described_record(base: Path) -> dict | None:
    """described.json of a folder, or None when there is none; a damaged one is refused by name."""
    path = base / DESCRIBED_RECORD
    if not path.is_file():
        return None
    rec = read_json(path)
    if not isinstance(rec, dict) or not isinstance(rec.get("share"), (int, float)):
        raise ValueError(f"{path} is not a described protocol's record (no share); remove {base} and run `foco "
                         "world describe` again")
    return rec


def check_described(root: str | Path, split: str) -> dict:
    """described.json of `split`, checked: made from this world, from its current `single` files, and its own two
    files unchanged since. Raises a ValueError (FileNotFoundError when there is none) naming the file and the fix."""
    root = Path(root)
    base = root / "benchmarks" / split / "described"
    rec = described_record(base)
    if rec is None:
        raise FileNotFoundError(f"{base / DESCRIBED_RECORD} is missing: the described protocol of {split} is written "
                                f"by `foco world describe --world {root} --share S` (docs/benchmarks.md gives S)")
    fix = f"regenerate it with `foco world describe --world {root} --share {rec['share']} --force`"
    return _check_derived(root, split, base, rec, DESCRIBED_RECORD, fix)


def _check_derived(root: Path, split: str, base: Path, rec: dict, record: str, fix: str) -> dict:
    """A protocol derived from `single` (described, restaged): its record names this world, the current `single`
    files and its own two files' sha256."""
    from ..utils.io import sha256_file as _sha256
    from .generate import world_fingerprint
    if rec.get("world") != world_fingerprint(root):
        raise ValueError(f"{base} was made from another world (fingerprint {rec.get('world')}, this one "
                         f"{world_fingerprint(root)}); {fix}")
    for f in DESCRIBED_FILES:
        single, own = root / "benchmarks" / split / "single" / f, base / f
        if not own.is_file():
            raise FileNotFoundError(f"{own} is missing; {fix}")
        if not single.is_file() or _sha256(single) != (rec.get("single_sha256") or {}).get(f):
            raise ValueError(f"{single} changed since {base} was made from it; {fix}")
        if _sha256(own) != (rec.get("manifests_sha256") or {}).get(f):
            raise ValueError(f"{own} does not match the sha256 in {base / record} (edited since); {fix}")
    return rec


# The restaged protocol's record (`foco.world.restaged` writes it)
RESTAGED_RECORD = "restaged.json"
RESTAGED_FILES = DESCRIBED_FILES


def restaged_record(base: Path) -> dict | None:
    """restaged.json of a folder, or None when there is none; a damaged one is refused by name."""
    from ..utils.io import read_json
    path = base / RESTAGED_RECORD
    if not path.is_file():
        return None
    rec = read_json(path)
    ok = isinstance(rec, dict) and all(isinstance(rec.get(k), (int, float)) and not isinstance(rec.get(k), bool)
                                       and 0.0 <= rec[k] <= 1.0 for k in ("strength", "share"))
    if not ok or not isinstance(rec.get("images_sha256"), dict):
        raise ValueError(f"{path} is not a restaged protocol's record (strength, share in [0, 1] and the images' "
                         "sha256); remove it and run `foco world restage` again")
    return rec


def check_restaged(root: str | Path, split: str) -> dict:
    """restaged.json of `split`, checked: made from this world, from its current `single` files, its own two files
    unchanged since (`foco world verify` also hashes every image against it). Raises a ValueError
    (FileNotFoundError when there is none) naming the file and the fix."""
    root = Path(root)
    base = root / "benchmarks" / split / "restaged"
    rec = restaged_record(base)
    if rec is None:
        raise FileNotFoundError(f"{base / RESTAGED_RECORD} is missing: the restaged protocol of {split} is written "
                                f"by `foco world restage --world {root} --strength S --share P` (docs/benchmarks.md "
                                "gives S and P); an interrupted one is finished by running it again")
    fix = (f"regenerate it with `foco world restage --world {root} --strength {rec['strength']} --share "
           f"{rec['share']} --force`")
    return _check_derived(root, split, base, rec, RESTAGED_RECORD, fix)


def pictures_fingerprint(root: str | Path, split: str, protocol: str) -> str | None:
    """What a protocol's own pictures are, for the feature caches made from them: the sha256 of the restaged
    images' hashes (None for protocols that draw the world's own images). A cache of another restaging of the same
    world (same ids, other pictures) is refused by it."""
    if protocol != "restaged":
        return None
    import hashlib
    import json
    rec = restaged_record(Path(root) / "benchmarks" / split / "restaged") or {}
    blob = json.dumps(rec.get("images_sha256") or {}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def record_digest(record: dict) -> str:
    """The sha256 of a record's own fields (all but "record_sha256"), in canonical JSON: an edited field is
    refused by the reader that recomputes it."""
    import hashlib
    import json
    body = {k: v for k, v in record.items() if k != "record_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def check_oacir(root: str | Path, split: str) -> dict:
    """oacir.json of `split`, checked: its own fields against `record_sha256`, its two files against theirs, and
    that it records every image's sha256 (`oacir_image_hashes` checks the images where they are read). Raises
    FileNotFoundError (no record) or ValueError (a damaged record, or files changed since), naming the file and the
    fix."""
    base = Path(root) / "benchmarks" / split / OACIR
    path = base / OACIR_RECORD
    fix = f"regenerate it with `foco world oacir --world {root} --splits {split}`"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the OACIR protocol of {split} is written by `foco world oacir "
                                f"--world {root}`; an interrupted one is finished by running it again")
    rec = read_json(path)
    if not isinstance(rec, dict) or not isinstance(rec.get("manifests_sha256"), dict):
        raise ValueError(f"{path} is not an OACIR record (no manifests_sha256); {fix}")
    if not isinstance(rec.get("images_sha256"), dict) or not isinstance(rec.get("record_sha256"), str):
        raise ValueError(f"{path} records no sha256 of its images or of itself (an older foco wrote it); {fix}")
    if record_digest(rec) != rec["record_sha256"]:
        raise ValueError(f"{path}: its fields do not match its record_sha256 (edited since it was written); {fix}")
    if rec.get("world") is not None and _world_fp(root) not in (None, rec["world"]):
        raise ValueError(f"{path} was written from another world ({rec['world']}) than {root} "
                         f"({_world_fp(root)}); {fix}")
    for f in OACIR_FILES:
        if sha256_file(base / f) != rec["manifests_sha256"].get(f):
            raise ValueError(f"{base / f} does not match the sha256 in {path} (edited since); {fix}")
    return rec


def _world_fp(root: str | Path) -> str | None:
    from .generate import world_fingerprint
    return world_fingerprint(root)


def oacir_image_hashes(root: str | Path, split: str) -> dict[str, str]:
    """{image path relative to `root`: sha256} of the OACIR protocol of `split`, from its checked record."""
    return dict(check_oacir(root, split)["images_sha256"])
