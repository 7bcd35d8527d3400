"""`foco index build | update`, `foco search` and `foco serve`: composed search over your own images."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .common import add_owned_output, add_device_arg, finite_float, flag_dest, nonneg_float, positive_int


def _index_build(a: argparse.Namespace) -> int:
    from ..search.build import IndexConfig, build_index
    cfg = IndexConfig(images=a.images, backbone=a.backbone, index_type=a.index_type, with_patches=a.with_patches,
                      precision=a.precision, batch_size=a.batch_size, train_size=a.train_size,
                      max_index_memory=a.max_index_memory, ondisk=a.ondisk, refine=a.refine)
    _report(build_index(cfg, a.out, device=_device(a)), a.out)
    return 0


def _index_update(a: argparse.Namespace) -> int:
    from ..search.build import update_index
    _report(update_index(a.index, device=_device(a), retrain=a.retrain), a.index)
    return 0


def _device(a: argparse.Namespace) -> str:
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


def _nonnegative_float(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not (v >= 0 and v < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {value!r}")
    return v


def _size(value: str) -> str:
    from ..search.vectors import parse_bytes
    try:
        parse_bytes(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _parse_reference(value: str):
    """An indexed id (digits), or the path of an image file."""
    if value.isdigit():
        return int(value)
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
    engine = SearchEngine.open(a.index, limits=Limits(max_k=max(a.k, 100)), box_beta=a.box_beta, device=_device(a),
                               **_weights(a))
    box = tuple(float(v) for v in a.box.split(",")) if a.box else None
    if box is not None and len(box) != 4:
        raise ValueError(f"--box takes x0,y0,x1,y1, got {a.box!r}")
    answer = engine.search(Query(text=a.text, reference=_parse_reference(a.reference), method=a.method, k=a.k,
                                 box=box, chord=a.chord, keep_reference=a.keep_reference))
    if a.json:
        for h in answer.hits:
            print(json.dumps({"id": h.id, "path": h.path, "score": round(h.score, 6)}))
        return 0
    print("| rank | id | score | path |\n|---|---|---|---|")
    for r, h in enumerate(answer.hits, 1):
        print(f"| {r} | {h.id} | {h.score:.4f} | {h.path} |")
    return 0


def _serve(a: argparse.Namespace) -> int:
    from ..search.engine import Limits, SearchEngine
    from ..serve.app import ServeLimits
    loopback = a.host in ("127.0.0.1", "localhost", "::1")
    if not loopback and not a.allow_remote:
        raise ValueError(f"--host {a.host} would serve this index beyond this machine; add --allow-remote to mean it")
    if not loopback:
        print(f"warning: serving {a.index} on {a.host}:{a.port}, reachable from other machines; there is no "
              "authentication", file=sys.stderr)
    limits = ServeLimits(max_upload_bytes=a.max_upload_mb * 1024 * 1024, max_text_chars=a.max_text, max_k=a.max_k,
                         max_knn=a.max_knn, max_batch=a.max_batch, max_wait_ms=a.max_wait_ms)
    engine_args = {**_weights(a), "box_beta": a.box_beta, "device": _device(a)}
    engine = SearchEngine.open(a.index, limits=Limits(max_k=a.max_k, max_text_chars=a.max_text), **engine_args)
    import uvicorn
    print(f"foco serve: {engine.count()} images, methods {', '.join(engine.available_methods())}; "
          f"{a.workers} worker(s), batches of at most {a.max_batch} within {a.max_wait_ms:g} ms; "
          f"open http://{a.host}:{a.port}/", flush=True)
    if a.workers == 1:
        from ..serve.app import create_app
        uvicorn.run(create_app(engine, limits), host=a.host, port=a.port, log_level="warning")
        return 0
    import os
    import shutil
    import tempfile
    from ..serve.app import ENV, settings_env
    del engine  # each worker opens its own, over the same memory-mapped files
    heatmaps = tempfile.mkdtemp(prefix="foco-serve-heatmaps-")
    os.environ[ENV] = settings_env(str(a.index), engine_args, limits, heatmaps)
    try:
        uvicorn.run("foco.serve.app:app_from_env", factory=True, workers=a.workers, host=a.host, port=a.port,
                    log_level="warning")
    finally:
        shutil.rmtree(heatmaps, ignore_errors=True)
    return 0


def _weights(a: argparse.Namespace) -> dict:
    """The given weights folders of the served methods, by option name (what `SearchEngine.open` takes)."""
    from ..methods import served_weights
    return {name: getattr(a, flag_dest(opt.flag)) for name, (opt, _) in served_weights().items()}


def _method_args(p: argparse.ArgumentParser) -> None:
    from ..methods import served_weights
    for opt, owners in served_weights().values():  # each served method's own weights folder
        p.add_argument(opt.flag, default=None, help=f"{opt.help} (enables --method {', '.join(owners)})")
    p.add_argument("--box-beta", type=finite_float, default=-8.0,
                   help="attention bias inside --box (negative: attend outside the box, as chosen on val)")
    add_device_arg(p)


def register(sub: argparse._SubParsersAction) -> None:
    ix = sub.add_parser("index", help="index a folder of images for search").add_subparsers(dest="action",
                                                                                           required=True)
    b = ix.add_parser("build", help="index a folder (recursive; resumable and incremental)")
    b.add_argument("--images", required=True, help="folder of images (jpg, jpeg, png, webp, bmp), walked recursively")
    b.add_argument("--backbone", required=True, help="backbone spec, e.g. world:pretrained or hf:PATH")
    b.add_argument("--out", required=True, help="index folder (created; rerun to resume or to update)")
    add_owned_output(b, signature=("index.json:format_version",))
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
    u = ix.add_parser("update", help="add new files, drop deleted ones, re-encode changed ones")
    u.add_argument("index", help="index folder (foco index build --out)")
    u.add_argument("--retrain", action="store_true",
                   help="train the vector index again on the whole collection (default: add to it as trained)")
    add_device_arg(u)
    u.set_defaults(func=_index_update)

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
    s.add_argument("--chord", type=nonneg_float, default=0.0, help="Chord lambda (0: plain cosine)")
    s.add_argument("--keep-reference", action="store_true", help="allow an indexed reference among the results")
    s.add_argument("--json", action="store_true", help="print JSON lines {id, path, score} instead of a table")
    _method_args(s)
    s.set_defaults(func=_search)

    _register_serve(sub)


def _register_serve(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("serve", help="HTTP API and web page over an index (loopback by default)")
    v.add_argument("--index", required=True, help="index folder (foco index build --out)")
    v.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    v.add_argument("--port", type=positive_int, default=8000, help="TCP port")
    v.add_argument("--allow-remote", action="store_true", help="required to bind a non-loopback --host")
    v.add_argument("--max-upload-mb", type=positive_int, default=10, help="largest accepted upload, in MiB")
    v.add_argument("--max-text", type=positive_int, default=1000, help="longest accepted text, in characters")
    v.add_argument("--max-k", type=positive_int, default=100, help="most results per composed query")
    v.add_argument("--max-knn", type=positive_int, default=10_000,
                   help="most num_images / num_result_ids of a /knn-service request (clip-retrieval's API)")
    v.add_argument("--workers", type=positive_int, default=1,
                   help="server processes over the same memory-mapped index (uvicorn workers)")
    v.add_argument("--max-batch", type=positive_int, default=32,
                   help="composed queries answered by one forward (1: one at a time)")
    v.add_argument("--max-wait-ms", type=_nonnegative_float, default=5.0,
                   help="how long the first query of a batch waits for others, in milliseconds")
    _method_args(v)
    v.set_defaults(func=_serve)
