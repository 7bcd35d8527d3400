"""`foco serve`: the HTTP API and web page over one or more named indexes (loopback by default)."""
from __future__ import annotations

import argparse
import sys

from .rules import SERVED_WEIGHTS, declare
from .common import float_in, positive_int
from .search import device, method_args, weights

MAX_WAIT_MS = 1000.0  # a batch never waits longer than this for company


def _port(value: str) -> int:
    port = positive_int(value)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return port


def _serve(a: argparse.Namespace) -> int:
    from ..search.named import named_indexes
    from ..serve.app import ServeLimits, open_engines
    loopback = a.host in ("127.0.0.1", "localhost", "::1")
    if not loopback and not a.allow_remote:
        raise ValueError(f"--host {a.host} would serve these indexes beyond this machine; add --allow-remote to mean "
                         "it")
    indexes = named_indexes(a.index)
    if not loopback:
        print(f"warning: serving {', '.join(map(str, indexes.values()))} on {a.host}:{a.port}, reachable from other "
              "machines; there is no authentication", file=sys.stderr)
    limits = ServeLimits(max_upload_bytes=a.max_upload_mb * 1024 * 1024, max_text_chars=a.max_text, max_k=a.max_k,
                         max_knn=a.max_knn, max_batch=a.max_batch, max_wait_ms=a.max_wait_ms)
    engine_args = {**weights(a), "box_beta": a.box_beta, "device": device(a)}
    engines = open_engines(indexes, **engine_args)  # every index checked before the server starts
    import uvicorn
    for n, e in engines.items():
        for reason in e.refused.values():
            print(f"foco serve: index {n}: refused {reason}", file=sys.stderr)
    listing = "; ".join(f"{n}: {e.count()} images, methods {', '.join(e.available_methods())}"
                        for n, e in engines.items())
    print(f"foco serve: {listing}; {a.workers} worker(s), batches of at most {a.max_batch} within "
          f"{a.max_wait_ms:g} ms; open http://{a.host}:{a.port}/", flush=True)
    if a.workers == 1:
        from ..serve.app import create_app
        uvicorn.run(create_app(engines, limits), host=a.host, port=a.port, log_level="warning")
        return 0
    import os
    import shutil
    import tempfile
    from ..serve.app import ENV, settings_env
    del engines  # each worker opens its own, over the same memory-mapped files
    heatmaps = tempfile.mkdtemp(prefix="foco-serve-heatmaps-")
    os.environ[ENV] = settings_env(indexes, engine_args, limits, heatmaps)
    try:
        uvicorn.run("foco.serve.app:app_from_env", factory=True, workers=a.workers, host=a.host, port=a.port,
                    log_level="warning")
    finally:
        shutil.rmtree(heatmaps, ignore_errors=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("serve", help="HTTP API and web page over one or more indexes (loopback by default)")
    v.add_argument("--index", required=True, action="append", metavar="[NAME=]FOLDER",
                   help="an index folder (foco index build --out), served under NAME, or under the folder's own name; "
                        "repeat it to serve several (clip-retrieval's indice_name picks one; the first is the "
                        "default)")
    v.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    v.add_argument("--port", type=_port, default=8000, help="TCP port (1-65535)")
    v.add_argument("--allow-remote", action="store_true", help="required to bind a non-loopback --host")
    v.add_argument("--max-upload-mb", type=positive_int, default=10, help="largest accepted upload, in MiB")
    v.add_argument("--max-text", type=positive_int, default=1000, help="longest accepted text, in characters")
    v.add_argument("--max-k", type=positive_int, default=100, help="most results per composed query")
    v.add_argument("--max-knn", type=positive_int, default=10_000,
                   help="most num_images / num_result_ids of a /knn-service request (clip-retrieval's API)")
    v.add_argument("--workers", type=positive_int, default=1,
                   help="server processes over the same memory-mapped indexes (uvicorn workers)")
    v.add_argument("--max-batch", type=positive_int, default=32,
                   help="queries (composed and /knn-service) answered by one forward (1: one at a time)")
    v.add_argument("--max-wait-ms", type=float_in(0, MAX_WAIT_MS, " ms"), default=5.0,
                   help=f"how long the first query of a batch waits for others, in milliseconds (0-{MAX_WAIT_MS:g})")
    method_args(v)
    v.set_defaults(func=_serve)
    declare(v,
            reads={"index": "search index", **SERVED_WEIGHTS},
            values=("host",))

