"""`foco world generate | ambiguous | oacir | verify | describe | restage | export`: the embedded synthetic world."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .rules import declare
from .common import add_owned_output, positive_int, seed_int, unit_float

MAX_SPLIT_PAIRS = 1_000_000  # pairs per split: ids have six digits, and a million rendered images is about 5 GB (5 KB each)


def split_pairs(v: str) -> int:
    """argparse type: a split's pair count, 1 to MAX_SPLIT_PAIRS."""
    from ..utils.parse import ascii_integer
    try:
        return ascii_integer(v, 1, MAX_SPLIT_PAIRS)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a pair count from 1 to {MAX_SPLIT_PAIRS:,}") from None


def _generate(a: argparse.Namespace) -> int:
    from ..world.generate import generate_world, world_config
    counts = {k: v for k, v in (("pretrain", a.pretrain_pairs), ("train", a.train_pairs)) if v is not None}
    cfg = world_config(a.size, seed=a.seed, stamps_dir=a.stamps, partial_captions=not a.exhaustive_captions,
                       pretrain_marks=a.pretrain_marks, mark_captions=a.mark_captions, **counts)
    out = Path(a.out)
    t0 = time.time()
    summary = generate_world(out, cfg)
    print(f"world written to {out} in {time.time() - t0:.1f}s")
    for name, n in summary["counts"].items():
        print(f"  {name}: {n}")
    return 0


def _verify(a: argparse.Namespace) -> int:
    from ..world.verify import verify_world
    print(json.dumps(verify_world(a.world), indent=2))
    return 0


def _ambiguous(a: argparse.Namespace) -> int:
    from ..world.ambiguous import generate_ambiguous_split, split_name
    summary = generate_ambiguous_split(a.world, a.split, n_queries=a.queries, out=a.out)
    print(f"ambiguous benchmark {split_name(a.split)}/single written under {a.out or a.world}: "
          f"{summary['queries']} queries, {summary['gallery']} gallery images, boxes as {summary['box_format']}")
    return 0


def _oacir(a: argparse.Namespace) -> int:
    from ..world.oacir import generate_oacir, oacir_statistics
    splits = tuple(s.strip() for s in a.splits.split(",") if s.strip())
    root = Path(a.out or a.world)
    for split, s in generate_oacir(a.world, splits, n_queries=a.queries, out=a.out).items():
        st = oacir_statistics(root, split)
        edits = ", ".join(f"{k} {v}" for k, v in st["edit_types"].items())
        print(f"OACIR protocol of {split} written under {root}/benchmarks/{split}/oacir: {s['queries']} quadruples "
              f"({s['queries_dropped']} of the {s['queries_asked']} drafted left out: another gallery image also "
              "satisfied the target), "
              f"{s['gallery']} gallery images, boxes as {s['box_format']}; per query "
              f"{st['instance_distractors_mean']:.2f} instance distractors (min {st['instance_distractors_min']}), "
              f"{st['context_distractors_mean']:.2f} context distractors; edits: {edits}")
    return 0


def _describe(a: argparse.Namespace) -> int:
    from ..world.described import generate_described
    splits = tuple(s.strip() for s in a.split.split(","))
    for split, s in generate_described(a.world, a.share, splits, force=a.force).items():
        print(f"described protocol of {split} written under {a.world}/benchmarks/{split}/described: {s['queries']} "
              f"queries at share {s['share']} ({100 * s['components_named']:.1f} % of the targets' components "
              f"named, {s['instruction_only']} instructions left as they were); extract its features with "
              f"`foco features extract --split {split}/described`, evaluate with `foco eval --protocols described`")
    return 0


def _restage(a: argparse.Namespace) -> int:
    from ..world.restaged import generate_restaged
    splits = tuple(s.strip() for s in a.split.split(","))
    for split, s in generate_restaged(a.world, a.strength, a.share, splits, force=a.force).items():
        print(f"restaged protocol of {split} written under {a.world}/benchmarks/{split}/restaged: {s['gallery']} "
              f"pictures redrawn at strength {s['strength']} ({100 * s['objects_moved']:.1f} % of the objects moved), "
              f"{s['queries']} queries described at share {s['share']}; extract its features with `foco features "
              f"extract --split {split}/restaged`, evaluate with `foco eval --protocols restaged`")
    return 0


def _export(a: argparse.Namespace) -> int:
    if a.format == "webdataset":
        if a.protocol is not None:
            raise ValueError("--protocol names a benchmark protocol; --format webdataset exports a pairs split, "
                             "so leave --protocol out")
        from ..world.webdataset import export_world_pairs
        split = a.split if a.split in ("pretrain", "train", "backbone_val") else "train"
        if a.split not in (None, split):
            raise ValueError(f"--format webdataset exports a pairs split (pretrain, train, backbone_val), "
                             f"not {a.split}")
        s = export_world_pairs(a.world, split, a.out, a.shard_size)
        print(f"world {split} pairs written to {a.out}: {s['samples']} samples in {s['shards']} shards; read them "
              f"with --in '{s['pattern']}'")
        return 0
    if a.format == "oacirr":  # the OACIR protocol in OACIRR's layout (foco.benchmarks.export_oacirr)
        from ..benchmarks.export_oacirr import export_oacirr
        s = export_oacirr(a.world, a.out, (a.split,) if a.split else ("train", "val", "test"), force=a.force)
        print(f"world OACIR written to {a.out} in the oacirr layout: " + ", ".join(
            f"{k} -> {v['domain']} {v['file_split']} ({v['queries']} quadruples)" for k, v in s["splits"].items()))
        return 0
    from ..benchmarks.export import export_world
    split = a.split or "val"
    summary = export_world(a.world, a.format, split, a.out, force=a.force, protocol=a.protocol)
    print(f"world {split} ({summary['protocol']}) written to {a.out} in the {a.format} layout: "
          f"{summary['queries']} queries, {summary['gallery']} gallery images")
    print(f"evaluate it with: foco eval --benchmark {a.format} --root {a.out} --split "
          f"{'val' if a.format == 'genecis' else split} --backbone ... --checkpoint ...")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    world = sub.add_parser("world", help="the embedded synthetic world").add_subparsers(dest="action", required=True)
    g = world.add_parser("generate", help="generate images, caption pairs and CIR benchmarks")
    g.add_argument("--out", required=True, help="output folder")
    add_owned_output(g, kind="world")
    g.add_argument("--size", default="default", choices=["tiny", "default"],
                   help="world size: tiny (a smoke run) or default")
    g.add_argument("--seed", type=seed_int, default=0, help="random seed (same seed, same result)")
    g.add_argument("--stamps", default=None,
                   help="folder of captioned cutout PNGs (tuxpaint-stamps layout) to use as extra objects")
    g.add_argument("--pretrain-pairs", type=split_pairs, default=None,
                   help="backbone-pretraining pairs (default: the size's; 10,000 for default). Every other split "
                        "stays the size's, scene for scene: extra pairs are drawn after them, fewer keep the first")
    g.add_argument("--train-pairs", type=split_pairs, default=None,
                   help="FoCo-training pairs (default: the size's; 10,000 for default); the other splits stay the "
                        "size's, so a data-scale curve compares training sets on one val and test")
    g.add_argument("--exhaustive-captions", action="store_true",
                   help="every training caption names every object and the background (default: some are partial)")
    g.add_argument("--pretrain-marks", type=unit_float, default=0.0,
                   help="share of the pretraining split's shapes that carry an instance mark, drawn as OACIR draws "
                        "them (default 0: none). Only the pretraining split changes; world.json records the share")
    g.add_argument("--mark-captions", type=unit_float, default=0.0,
                   help="share of the pretraining captions that mention a marked shape which become detail "
                        "captions: that one shape with its mark and nothing else ('a photo showing a small red star "
                        "with a dot'; default 0). Needs --pretrain-marks above 0")
    g.set_defaults(func=_generate)
    declare(g, reads={"stamps": "images"})
    _register_variants(world)
    _register_protocols(world)
    ex = world.add_parser("export", help="write a world benchmark in an official layout (CIRR, CIRCO, ...), or its "
                                         "pairs as webdataset shards")
    ex.add_argument("--world", required=True, help="world folder (foco world generate --out)")
    ex.add_argument("--format", required=True,
                    choices=["cirr", "circo", "fashioniq", "genecis", "oacirr", "webdataset"],
        help="the official layout to write; webdataset: image-caption pairs as img2dataset-style tar shards")
    ex.add_argument("--split", default=None, choices=["val", "test", "pretrain", "train", "backbone_val"],
                    help="benchmarks: val (default) or test, whose files carry no targets as the official ones "
                         "(GeneCIS keeps them); webdataset: a pairs split (default train)")
    ex.add_argument("--protocol", default=None, choices=["single", "multi", "described", "restaged"],
                    help="benchmarks: the world protocol to export (default: multi for circo, single for the others; "
                         "described and restaged, written by `foco world describe` and `foco world restage`, in the "
                         "cirr layout)")
    ex.add_argument("--shard-size", type=positive_int, default=1000, help="webdataset: samples per tar shard")
    ex.add_argument("--out", required=True, help="output folder")
    add_owned_output(ex, kind="world export")
    ex.set_defaults(func=_export)
    declare(ex, reads={"world": "world"})


def _register_variants(world: argparse._SubParsersAction) -> None:
    """`foco world ambiguous`, `foco world oacir` and `foco world verify`."""
    am = world.add_parser("ambiguous", help="the ambiguous-reference variant (two same-kind objects, a box)")
    am.add_argument("--world", required=True, help="world folder (foco world generate --out)")
    am.add_argument("--split", default="test", choices=["val", "test"], help="benchmark split of the ambiguous variant")
    am.add_argument("--queries", type=positive_int, default=None, help="how many queries to write")
    am.add_argument("--out", default=None, help="root to write under (default: the world folder)")
    add_owned_output(am, kind="world")
    am.set_defaults(func=_ambiguous)
    declare(am, reads={"world": "world"}, into=("world",))
    oa = world.add_parser("oacir", help="the OACIR protocol: marked shape instances, a box that anchors one, and a "
                                        "text that changes its context")
    oa.add_argument("--world", required=True, help="world folder (foco world generate --out)")
    oa.add_argument("--splits", default="train,val,test",
                    help="splits to write, comma-separated, from train, val, test (default all three)")
    oa.add_argument("--queries", type=positive_int, default=None,
                    help="queries per split (default: the world's val_single / test_single, train 4 x test_single)")
    oa.add_argument("--out", default=None, help="root to write under (default: the world folder)")
    add_owned_output(oa, kind="world")
    oa.set_defaults(func=_oacir)
    declare(oa, reads={"world": "world"}, into=("world",), values=("splits",))
    v = world.add_parser("verify", help="check every manifest and image of a world folder")
    v.add_argument("world")
    v.set_defaults(func=_verify)
    declare(v, reads={"world": "world"})


def _register_protocols(world: argparse._SubParsersAction) -> None:
    """`foco world describe` and `foco world restage`: protocols derived from `single`."""
    d = world.add_parser("describe", help="the described protocol: single's queries, each instruction followed by a "
                                          "partial description of the target (as CIRR's annotators write)")
    d.add_argument("--world", required=True, help="world folder (foco world generate --out); written into")
    d.add_argument("--share", type=unit_float, required=True,
                   help="probability that each target object and the background is named (0: the instruction "
                        "alone, 1: everything); 0.85 is the value calibrated on val against CIRR on world:vit (0.8 "
                        "on the CNN), docs/benchmarks.md")
    d.add_argument("--split", default="val,test", help="benchmark splits, comma-separated (default val,test)")
    d.add_argument("--force", action="store_true",
                   help="replace a described protocol made at another share, and write beside (or over) files in "
                        "benchmarks/SPLIT/described that foco did not write")
    d.set_defaults(func=_describe)
    declare(d, reads={"world": "world"}, into=("world",), values=("split",))
    r = world.add_parser("restage", help="the restaged protocol: described's queries over a gallery in which every "
                                         "image is another picture of its scene (as CIRR's targets are other photos)")
    r.add_argument("--world", required=True, help="world folder (foco world generate --out); written into")
    r.add_argument("--strength", type=unit_float, required=True,
                   help="how far each picture is redrawn, 0 (the world's own pixels) to 1 (layout, sizes within "
                        "their class, background shade and texture, rotation and tint all resampled in full); the "
                        "value calibrated on val against CIRR is in docs/benchmarks.md")
    r.add_argument("--share", type=unit_float, required=True,
                   help="the described text's share (as `foco world describe --share`): probability that each target "
                        "object and the background is named after the instruction")
    r.add_argument("--split", default="val,test", help="benchmark splits, comma-separated (default val,test)")
    r.add_argument("--force", action="store_true",
                   help="replace a restaged protocol made at another strength or share, and write beside (or over) "
                        "files in benchmarks/SPLIT/restaged that foco did not write")
    r.set_defaults(func=_restage)
    declare(r, reads={"world": "world"}, into=("world",), values=("split",))
