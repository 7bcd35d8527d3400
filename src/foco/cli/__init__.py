"""The `foco` command line: one subcommand per pipeline stage, one small module per command group.
Each maps its arguments to a typed config and calls the library; errors a user can fix print one line."""
from __future__ import annotations

import argparse
import errno
import logging
import os
import sys

from .bounds import apply_bounds
from . import (ablate, adafocal, backbone, composers, context_i2w, decompose, edits, evaluate, lincir, pic2word,
               quickstart, search, searle, serve, tat, train, world)

GROUPS = (world, backbone, train, pic2word, lincir, searle, context_i2w, tat, adafocal, composers, evaluate, ablate,
          decompose, edits, quickstart, search, serve)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="foco", description="Focus-then-Complete zero-shot composed image retrieval")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = p.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.register(sub)
    apply_bounds(p)  # every count's documented upper bound (bounds.py)
    return p


WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EFBIG, errno.EIO}


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched at run time unless the user says so
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from ..decompose.client import ConfigError
    from ..utils.io import ImageLoadError, ManifestError, WriteError
    from ..train.distributed import RankLost
    from .rules import enforce
    try:
        claimed = enforce(args)  # the command's declared rules, before it writes anything (foco.cli.rules)
        code = 1
        try:
            code = args.func(args)
            return code
        finally:
            if code:
                claimed.undo_empty()
    except (ManifestError, ImageLoadError, ConfigError, FileNotFoundError, FileExistsError, ValueError,
            ImportError, WriteError, PermissionError, RankLost) as exc:
        print(f"foco: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a write that failed below a wrapped one: a full disk, a quota, a folder made read-only
        if exc.errno not in WRITE_ERRNOS:
            raise
        where = f" {exc.filename}" if exc.filename else ""
        print(f"foco: error: cannot write{where}: {exc.strerror}; free space or choose a writable output, then rerun "
              "the same command: it resumes from what was saved", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("foco: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
