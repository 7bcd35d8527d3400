"""`foco index build | update` and `foco search`: composed search over your own images (`foco serve`: serve.py)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .rules import SERVED_WEIGHTS, declare
from ..utils.parse import MAX_BOX_BETA, MAX_CHORD
from .common import add_owned_output, add_device_arg, add_unverified_arg, flag_dest, float_in, nonneg_int, positive_int

WORKERS_HELP = ("DataLoader workers that read, decode and preprocess the images while this process encodes "
                "(--images: each file opened, hashed and resized; --in: a shard's samples); 0: all in this process")


def _index_build(a: argparse.Namespace) -> int:
    if a.inp or a.features:
        return _shard_build(a)
    if not a.images:
        raise ValueError("give the images: --images FOLDER, or webdataset shards with --in 'shards/{00000..00099}.tar'")
    from ..search.build import IndexConfig, build_index
    cfg = IndexConfig(images=a.images, backbone=a.backbone, index_type=a.index_type, with_patches=a.with_patches,
                      precision=a.precision, batch_size=a.batch_size, train_size=a.train_size,
                      max_index_memory=a.max_index_memory, ondisk=a.ondisk, refine=a.refine, workers=a.workers)
    _report(build_index(cfg, a.out, device=device(a)), a.out)
    return 0


def _shard_build(a: argparse.Namespace) -> int:
    """Webdataset shards: under torchrun each rank encodes its shards, then rank 0 fills the index."""
    from ..search.shards import ShardIndexConfig, build_from_shards
    from ..train.distributed import env_from_torchrun, init_distributed, shutdown
    if a.images:
        raise ValueError("--images and --in/--features name two collections; give one")
    if a.with_patches:
        raise ValueError("--with-patches: an index of shards stores global vectors only (a reference's patches are "
                         "read back from its tar at query time); leave it out")
    cfg = ShardIndexConfig(shards=a.inp, backbone=a.backbone, features=a.features, index_type=a.index_type,
                           precision=a.precision, batch_size=a.batch_size, train_size=a.train_size,
                           max_index_memory=a.max_index_memory, ondisk=a.ondisk, refine=a.refine, workers=a.workers)
    env = init_distributed(env_from_torchrun(a.device), timeout_s=a.dist_timeout)
    done, stats = build_from_shards(cfg, a.out, env.device, env.rank, env.world_size, wait=lambda: shutdown(env))
    print(f"rank {env.rank}: {done['mine']} of {done['shards']} shards, {done['encoded']} encoded now, "
          f"{done['read']} sample lists read now", flush=True)
    if stats is not None:
        print(f"{a.out}: {stats.indexed} images indexed; {stats.encoded} added now from the shards' features "
              f"({stats.images_per_s}/s), {stats.unchanged} already indexed, {stats.seconds:.1f} s")
    return 0


def _index_update(a: argparse.Namespace) -> int:
    from ..search.build import update_index
    _report(update_index(a.index, device=device(a), retrain=a.retrain, reencode=a.reencode, workers=a.workers),
            a.index)
    return 0


def device(a: argparse.Namespace) -> str:
    from ..utils.device import resolve_device
    return str(resolve_device(a.device))


def _report(stats, out) -> None:
    print(f"{out}: {stats.indexed} images indexed; {stats.encoded} encoded now ({stats.images_per_s}/s), "
          f"{stats.unchanged} unchanged, {stats.touched} touched (same content), {stats.removed} removed, "
          f"{stats.skipped} skipped (listed in {Path(out) / 'skipped.tsv'}), {stats.seconds:.1f} s")
    if stats.unreadable_removed:
        print(f"note: {stats.unreadable_removed} indexed files changed and can no longer be read: removed from the "
              f"index (listed in {Path(out) / 'skipped.tsv'})", file=sys.stderr)
    if stats.growth:
        print(f"note: the vector index has outgrown its training: {stats.growth}", file=sys.stderr)


def _size(value: str) -> str:
    from ..search.vectors import parse_bytes
    try:
        parse_bytes(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _parse_reference(value: str):
    """An indexed id (digits), or the path of an image file."""
    from ..utils.parse import ascii_integer
    try:
        return ascii_integer(value, 0)  # the server's rule: ASCII digits within int64
    except ValueError:
        pass
    from ..search.build import open_image
    path = Path(value)
    if not path.is_file():
        raise FileNotFoundError(f"--reference {value}: neither an indexed id nor an image file")
    try:
        return open_image(path)
    except ValueError as exc:
        raise ValueError(f"--reference {value}: {exc}") from None


def _search(a: argparse.Namespace) -> int:
    from ..search.engine import Limits, Query, SearchEngine
    engine = SearchEngine.open(a.index, limits=Limits(max_k=max(a.k, 100)), box_beta=a.box_beta, device=device(a),
                               **weights(a))
    for reason in engine.refused.values():
        print(f"foco search: refused {reason}", file=sys.stderr)
    box = None
    if a.box:
        from ..utils.parse import parse_box
        try:
            box = parse_box(a.box)  # the server's parser too
        except ValueError as exc:
            raise ValueError(f"--box: {exc}") from None
    answer = engine.search(Query(text=a.text, reference=_parse_reference(a.reference), method=a.method, k=a.k,
                                 box=box, chord=a.chord, keep_reference=a.keep_reference))
    if a.json:
        samples = engine.store.samples([h.id for h in answer.hits])  # a shard-built index: url and caption
        for h in answer.hits:
            url, caption = samples.get(h.id, (0, None, None))[1:]
            print(json.dumps({"id": h.id, "path": h.path, "score": round(h.score, 6),
                              **({"url": url, "caption": caption} if h.id in samples else {})}))
        return 0
    print("| rank | id | score | path |\n|---|---|---|---|")
    for r, h in enumerate(answer.hits, 1):
        cell = h.path.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "\\n").replace("\r", "\\r")
        print(f"| {r} | {h.id} | {h.score:.4f} | {cell} |")  # a file name's | or line break kept in its cell
    return 0


def weights(a: argparse.Namespace) -> dict:
    """The given weights folders of the served methods, by option name (what `SearchEngine.open` takes)."""
    from ..methods import served_weights
    return {**{name: getattr(a, flag_dest(opt.flag)) for name, (opt, _) in served_weights().items()},
            "unverified": a.unverified}


def method_args(p: argparse.ArgumentParser) -> None:
    from ..methods import served_weights
    for opt, owners in served_weights().values():  # each served method's own weights folder
        p.add_argument(opt.flag, default=None, help=f"{opt.help} (enables --method {', '.join(owners)})")
    add_unverified_arg(p)
    p.add_argument("--box-beta", type=float_in(-MAX_BOX_BETA, MAX_BOX_BETA), default=-8.0,
                   help="attention bias inside --box (negative: attend outside the box, as chosen on val)")
    add_device_arg(p)


def register(sub: argparse._SubParsersAction) -> None:
    ix = sub.add_parser("index", help="index a folder of images for search").add_subparsers(dest="action",
                                                                                           required=True)
    b = ix.add_parser("build", help="index a folder (recursive; resumable and incremental)")
    b.add_argument("--images", help="folder of images (jpg, jpeg, png, webp, bmp), walked recursively")
    b.add_argument("--in", dest="inp", default=None, help="webdataset shards instead, e.g. "
                   "'shards/{00000..00099}.tar'; under torchrun rank r encodes shards r, r + N, ... (docs/search.md)")
    b.add_argument("--features", default=None, help="with --in (or alone): the shards' features `foco features "
                   "extract --in` wrote, used instead of encoding")
    b.add_argument("--workers", type=nonneg_int, default=2, help=WORKERS_HELP)
    b.add_argument("--dist-timeout", type=positive_int, default=3600,
                   help="--in under torchrun: seconds a rank waits for the others to finish their shards")
    b.add_argument("--backbone", required=True, help="backbone spec, e.g. world:pretrained or hf:PATH")
    b.add_argument("--out", required=True, help="index folder (created; rerun to resume or to update)")
    add_owned_output(b, kind="search index")
    b.add_argument("--index-type", default="Flat",
                   help="FAISS index-factory string: Flat (exact, default), IVF1024,Flat, HNSW32, IVF1024,PQ64, ...; "
                        "or auto: chosen within --max-index-memory (docs/search.md)")
    b.add_argument("--max-index-memory", default="4GB", type=_size,
                   help="the memory budget of --index-type auto, e.g. 4GB or 512MB")
    b.add_argument("--train-size", type=positive_int, default=None,
                   help="vectors to train an IVF or PQ index on (default: 64 per list, at least 9,984 for PQ)")
    b.add_argument("--refine", type=positive_int, default=None,
                   help="PQ indexes: search refine x k candidates and re-rank them by the exact stored vectors "
                        "(default 30; docs/benchmarks.md gives recall against it)")
    b.add_argument("--ondisk", action="store_true",
                   help="IVF indexes: inverted lists in a file beside the index, memory-mapped (FAISS merge_ondisk)")
    b.add_argument("--with-patches", action="store_true",
                   help="store patch features for FoCo (else a reference's patches are computed at query time)")
    b.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"], help="encoding precision")
    b.add_argument("--batch-size", type=positive_int, default=64, help="images per encoder call")
    add_device_arg(b)
    b.set_defaults(func=_index_build)
    declare(b,
            reads={"images": "images", "inp": "shards or captions", "features": "feature cache",
                   "backbone": "backbone"},
            values=("index_type",))
    u = ix.add_parser("update", help="add new files, drop deleted ones, re-encode changed ones")
    u.add_argument("index", help="index folder (foco index build --out)")
    u.add_argument("--retrain", action="store_true",
                   help="train the vector index again on the whole collection (default: add to it as trained)")
    u.add_argument("--reencode", action="store_true",
                   help="encode every image again (needed when the backbone's weights changed since the build)")
    u.add_argument("--workers", type=nonneg_int, default=2, help=WORKERS_HELP)
    add_device_arg(u)
    u.set_defaults(func=_index_update)
    declare(u, reads={"index": "search index"}, into=("index",))

    _register_search(sub)


def _register_search(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("search", help="a composed query against an index")
    s.add_argument("--index", required=True, help="index folder (foco index build --out)")
    s.add_argument("--reference", required=True, help="an indexed id, or the path of an image file")
    s.add_argument("--text", required=True, help="the modification, e.g. 'make the dress red'")
    from ..methods import METHODS
    served = [n for n in METHODS.names() if METHODS.get(n).served]
    s.add_argument("--method", default="foco", help="one of the served methods whose weights are given: "
                   + ", ".join(served))
    s.add_argument("-k", "--k", type=positive_int, default=10, help="how many results")
    s.add_argument("--box", default=None, help="x0,y0,x1,y1 in pixels of the reference (FoCo's attention)")
    s.add_argument("--chord", type=float_in(0, MAX_CHORD), default=0.0,
                   help=f"Chord lambda, 0-{MAX_CHORD:g} (0: plain cosine)")
    s.add_argument("--keep-reference", action="store_true", help="allow an indexed reference among the results")
    s.add_argument("--json", action="store_true", help="print JSON lines {id, path, score} instead of a table")
    method_args(s)
    s.set_defaults(func=_search)
    declare(s,
            reads={"index": "search index", "reference": "image", **SERVED_WEIGHTS},
            values=("text", "method", "box"))
