"""`foco world verify`: read every manifest, check its line count (and its sha256, for worlds that record them)
against world.json, decode every image and check it against the content hash recorded at generation
(images.sha256), failing loudly."""
from __future__ import annotations

from pathlib import Path

from ..utils.io import ImageLoadError, load_image, read_json, sha256_file
from ..utils.progress import progress
from .generate import BENCH_SPLITS, HASHES, PAIR_SPLITS, PROTOCOLS
from .manifest import (OACIR, RESTAGED_RECORD, WorldBenchmark, load_benchmark, load_pairs, oacir_image_hashes,
                       restaged_record)


def verify_world(root: str | Path) -> dict:
    """Returns counts; raises ManifestError or ImageLoadError naming every bad file (all of them, not the first)."""
    root = Path(root)
    summary = read_json(root / "world.json")
    _check_manifests(root, summary)
    images: list[Path] = []
    restaged: dict[str, str] = {}  # relative path -> sha256, from each restaged.json
    oacir: dict[str, str] = {}  # relative path -> sha256, from each oacir.json (and ambiguous.json)
    unhashed: set[str] = set()  # images whose record lists no sha256 (an older foco's): decoded only
    counts = {}
    for split in PAIR_SPLITS:
        pairs = load_pairs(root, split)
        counts[split] = len(pairs)
        images += [p.image for p in pairs]
    for split in BENCH_SPLITS:
        for protocol in PROTOCOLS:
            b = load_benchmark(root, split, protocol)
            counts[f"{split}/{protocol}"] = {"queries": len(b.query_ids), "gallery": len(b.gallery_ids)}
            images += b.gallery_images
        if (root / "benchmarks" / split / "described").exists():  # `foco world describe` wrote one: checked too
            b = load_benchmark(root, split, "described")  # described.json against the world and the files
            counts[f"{split}/described"] = {"queries": len(b.query_ids), "gallery": len(b.gallery_ids)}
        if (root / "benchmarks" / split / "restaged").exists():  # `foco world restage` wrote one: its pictures too
            b = load_benchmark(root, split, "restaged")  # restaged.json against the world and the files
            counts[f"{split}/restaged"] = {"queries": len(b.query_ids), "gallery": len(b.gallery_ids)}
            images += b.gallery_images
            restaged.update(_restaged_hashes(root, split, b))
    for split in BENCH_SPLITS:  # the ambiguous variant (`foco world ambiguous`), where one was written
        part = f"{split}-ambiguous"
        if (root / "benchmarks" / part / "single" / "ambiguous.json").is_file():
            b = load_benchmark(root, part, "single")
            counts[f"{part}/single"] = {"queries": len(b.query_ids), "gallery": len(b.gallery_ids)}
            images += b.gallery_images
            own = _ambiguous_hashes(root / "benchmarks" / part / "single" / "ambiguous.json")
            oacir.update(own)
            if not own:  # a record an older foco wrote: its images are decoded, not hashed
                unhashed.update(p.relative_to(root).as_posix() for p in b.gallery_images if p.is_relative_to(root))
    for split in ("train", *BENCH_SPLITS):  # `foco world oacir` wrote one (train: AdaFocal's): its images too
        if (root / "benchmarks" / split / OACIR).exists():
            b = load_benchmark(root, split, OACIR)  # oacir.json against itself, the world and its files
            counts[f"{split}/oacir"] = {"queries": len(b.query_ids), "gallery": len(b.gallery_ids)}
            images += b.gallery_images
            oacir.update(oacir_image_hashes(root, split))
    world_hashes = _read_hashes(root)
    hashes = None if world_hashes is None and not oacir else {**(world_hashes or {}), **restaged, **oacir}
    bad = []
    for path in progress(images, desc="decoding and hashing images"):
        try:
            load_image(path)
        except ImageLoadError as exc:
            bad.append(str(exc))
            continue
        rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
        if hashes is not None and rel not in unhashed and (world_hashes is not None or rel in hashes):
            want = hashes.get(rel)
            if want is None:
                bad.append(f"{path}: not listed in {root / HASHES} (nor in a restaged.json)")
            elif sha256_file(path) != want:
                where = (path.parent.parent / RESTAGED_RECORD if rel in restaged else
                         "its protocol's record (oacir.json, ambiguous.json)" if rel in oacir else root / HASHES)
                bad.append(f"{path}: content differs from the sha256 recorded in {where} (replaced or damaged "
                           "since it was written)")
    if bad:
        raise ImageLoadError(f"{len(bad)} of {len(images)} images are missing, corrupt or changed:\n  "
                             + "\n  ".join(bad[:20]) + ("\n  ..." if len(bad) > 20 else "")
                             + "\nregenerate the world into a new --out (foco world generate)")
    counts["images"] = len(images)
    counts["content_hashes"] = "checked" if hashes is not None else f"none recorded (no {HASHES}; an older world)"
    return counts


def _check_manifests(root: Path, summary: dict) -> None:
    """Each manifest against world.json: its line count (`counts`) and, where recorded, its sha256. A deleted,
    added or edited line would otherwise pass: the records still parse."""
    from ..utils.io import ManifestError
    bad = []
    hashes = summary.get("manifests_sha256") or {}
    for name, want in sorted((summary.get("counts") or {}).items()):
        path = root / name
        if not path.is_file():
            bad.append(f"{path}: missing (world.json counts {want} records)")
            continue
        with open(path, "rb") as f:
            have = sum(1 for line in f if line.strip())
        if have != want:
            bad.append(f"{path}: {have} records, but world.json counts {want} (lines deleted or added since "
                       "generation)")
        elif name in hashes and sha256_file(path) != hashes[name]:
            bad.append(f"{path}: content differs from the sha256 recorded in world.json (edited since generation)")
    if bad:
        raise ManifestError(f"{len(bad)} manifests of {root} do not match world.json:\n  " + "\n  ".join(bad)
                            + "\nregenerate the world into a new --out (foco world generate)")


def _read_hashes(root: Path) -> dict[str, str] | None:
    path = root / HASHES
    if not path.is_file():
        return None
    hashes = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64:
            raise ValueError(f"{path}:{lineno}: expected '<sha256>  <path>'; regenerate the world into a new --out")
        hashes[rel] = digest
    return hashes


def _restaged_hashes(root: Path, split: str, b: WorldBenchmark) -> dict[str, str]:
    """{relative image path: sha256} of a split's restaged pictures, from its restaged.json (one per gallery id)."""
    from ..utils.io import ManifestError
    base = root / "benchmarks" / split / "restaged"
    recorded = restaged_record(base)["images_sha256"]
    missing = [g for g in b.gallery_ids if g not in recorded]
    if missing:
        raise ManifestError(f"{base / RESTAGED_RECORD} lists no sha256 for {len(missing)} gallery image(s), e.g. "
                            f"{missing[:3]}; regenerate it with `foco world restage --force`")
    return {p.relative_to(root).as_posix(): recorded[g] for g, p in zip(b.gallery_ids, b.gallery_images)}


def _ambiguous_hashes(path: Path) -> dict[str, str]:
    """{relative image path: sha256} of an ambiguous variant, from its ambiguous.json (checked against its own
    record_sha256); {} for a record an older foco wrote without them."""
    from ..utils.io import ManifestError
    from .manifest import record_digest
    rec = read_json(path)
    if not isinstance(rec, dict):
        raise ManifestError(f"{path} is not an ambiguous variant's record; run `foco world ambiguous` again")
    if "record_sha256" in rec and record_digest(rec) != rec["record_sha256"]:
        raise ManifestError(f"{path}: its fields do not match its record_sha256 (edited since it was written); run "
                            "`foco world ambiguous` again into a new --out")
    for name, digest in (rec.get("manifests_sha256") or {}).items():
        if sha256_file(path.parent / name) != digest:
            raise ManifestError(f"{path.parent / name} does not match the sha256 in {path} (edited since it was "
                                "written); run `foco world ambiguous` again into a new --out")
    return dict(rec.get("images_sha256") or {})
