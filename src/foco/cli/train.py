"""`foco features extract` and `foco train`: encode a world split once, then train FoCo on the cached features."""
from __future__ import annotations

import argparse

from .rules import declare
from .common import (add_decomposition_args, add_device_arg, add_distributed_args, add_owned_output,
                     add_precision_arg, learning_rate, loss_weight, nonneg_int, positive_int, seed_int)
from .resume import add_allow_changed, add_resume_args


def _features_extract(a: argparse.Namespace) -> int:
    from ..backbones import create_backbone
    from ..features import ExtractConfig
    from ..world.splits import extract_world_split
    cfg = ExtractConfig(shard_size=a.shard_size, batch_size=a.batch_size, dtype=a.dtype, patches=not a.no_patches,
                        precision=a.precision)
    if a.inp is not None:
        return _corpus_extract(a, cfg)
    if a.world is None or a.split is None:
        raise ValueError("foco features extract needs --world and --split, or --in 'shards/{00000..00099}.tar'")
    decs = None
    if a.decompositions is not None:
        from ..world.decompositions import world_decompositions
        decs = world_decompositions(a.world, a.split, a.decompositions, a.decomposer, a.max_fallback)
    from ..utils.device import resolve_device
    stats = extract_world_split(create_backbone(a.backbone, device=str(resolve_device(a.device))), a.world, a.split, a.out, cfg, decompositions=decs)
    for kind, s in stats.items():
        rate = f"{s['encoded'] / s['seconds']:.1f}/s" if s["encoded"] else "all cached"
        repaired = f", {s['repaired']} damaged shard(s) encoded again" if s["repaired"] else ""
        print(f"{kind}: {s['items']} items, {s['encoded']} encoded now ({rate}{repaired})")
    print(f"features in {a.out}")
    return 0


def _corpus_extract(a: argparse.Namespace, cfg) -> int:
    """Webdataset shards, one feature cache per shard; under torchrun the ranks split the shards."""
    from ..backbones import create_backbone
    from ..corpus_features import extract_corpus
    from ..train.distributed import env_from_torchrun
    decs = corpus_decompositions(a) if a.decompositions is not None else None
    env = env_from_torchrun(a.device)  # under torchrun with CUDA: each rank on cuda:$LOCAL_RANK
    s = extract_corpus(create_backbone(a.backbone, device=env.device), a.inp, a.out, cfg, decs, include_captions=a.with_captions,
                       workers=a.workers, rank=env.rank, world_size=env.world_size)
    print(f"rank {env.rank}: {s['done_now']} shards encoded now, {s['skipped_done']} already done, of {s['shards']}; "
          f"features in {a.out}/parts")
    return 0


def corpus_decompositions(a: argparse.Namespace):
    """A function of one shard's captions -> their Decompositions in --decompositions (asked shard by shard, so
    that no corpus-sized map is held); --max-fallback is checked once, over the store's counts."""
    from ..decompose.store import check_fallback_share, stored_decompositions
    check_fallback_share(a.decompositions, a.decomposer, a.max_fallback)

    def lookup(captions: list[str]) -> dict:
        return stored_decompositions([(c, c) for c in captions], a.decompositions, a.decomposer, 1.0)
    return lookup


def _features_verify(a: argparse.Namespace) -> int:
    from ..features import verify_cache
    report = verify_cache(a.cache)
    bad = [m for r in report.values() for m in r["bad"]]
    for kind, r in report.items():
        print(f"{kind}: {r['shards']} shards, {len(r['bad'])} bad")
    if bad:
        print("\n".join(bad))
        print("rerun the `foco features extract` command that made this cache to encode the bad shards again")
        return 1
    print(f"{a.cache}: every shard matches its recorded sha256")
    return 0


def _train(a: argparse.Namespace) -> int:
    """A thin map of the flags onto `foco.train.job.FoCoJob`; the library runs it."""
    import sys
    from ..model import FoCoConfig
    from ..model.encoder import SHAPES
    from ..train.foco import FoCoTrainConfig
    from ..train.job import EditStage, FoCoJob, run_foco_job
    from ..train.sources import DataSpec
    from .common import launch
    from .resume import check_resume, resume_flags
    check_resume(a)  # the deprecated flags noted, --resume with no run refused, before anything runs
    job = FoCoJob(
        out=a.out,
        train=FoCoTrainConfig(
            stage1_epochs=a.stage1_epochs, stage2_epochs=a.stage2_epochs, batch_size=a.batch_size,
            lr_stage1=a.lr_stage1, lr_aggr=a.lr_aggr, lr_comp=a.lr_comp, max_negatives=a.max_negatives, seed=a.seed,
            max_pairs=a.max_pairs, min_pairs=a.min_pairs, param_groups=a.param_groups,
            lr_temperature=a.lr_temperature, negative_groups=a.negative_groups,
            focus_in_context=a.focus_in_context,
            model=FoCoConfig(learn_bias=a.learn_bias, background_dropout=a.background_dropout, background=a.background, **SHAPES[a.shape]),
            stage3_epochs=a.stage3_epochs, lr_edit_aggr=a.lr_edit, lr_edit_comp=a.lr_edit,
            preserve_weight=a.preserve_weight, edit_negatives=not a.no_edit_negatives, image_weight=a.image_weight,
            precision=a.precision, compile=a.compile, sync_every=a.sync_every, allow_changed=tuple(a.allow_changed)),
        data=DataSpec(a.features, a.world, a.split, a.inp, a.decompositions, a.decomposer, a.max_fallback,
                      a.online, a.backbone, a.workers),
        launch=launch(a), resume=resume_flags(a),
        edits=EditStage(a.edits, a.edit_settings, a.edit_features, a.target_threshold) if a.edits else None)
    if run_foco_job(job, report=lambda line: print(line, flush=True),
                    note=lambda line: print(line, file=sys.stderr, flush=True)):
        print(f"FoCo checkpoint in {a.out} (foco.safetensors + foco.json); log {a.out}/train_log.jsonl, "
              f"curve {a.out}/loss_curve.png")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    _register_features(sub)
    _register_train(sub)


def _register_features(sub: argparse._SubParsersAction) -> None:
    feats = sub.add_parser("features", help="the feature cache").add_subparsers(dest="action", required=True)
    x = feats.add_parser("extract", help="encode a world split once into resumable shards")
    x.add_argument("--backbone", required=True, help="backbone spec, e.g. world:pretrained or hf:PATH")
    x.add_argument("--world", default=None, help="world folder (foco world generate --out)")
    x.add_argument("--in", dest="inp", default=None,
                   help="instead of --world: webdataset shards, e.g. 'shards/{00000..00099}.tar' (img2dataset layout)")
    x.add_argument("--workers", type=nonneg_int, default=2,
                   help="with --in: DataLoader workers reading, decoding and preprocessing images")
    x.add_argument("--with-captions", action="store_true", help="with --in: encode the full captions too")
    x.add_argument("--split", default=None,
                   help="a pairs split (pretrain, train, backbone_val) or a benchmark (val/single, test/multi, ...)")
    x.add_argument("--out", required=True, help="output folder (created; rerun the same command to resume)")
    add_owned_output(x, kind="feature cache")
    x.add_argument("--shard-size", type=positive_int, default=2048,
                   help="items per safetensors shard (the unit of resume)")
    x.add_argument("--batch-size", type=positive_int, default=128, help="examples per step")
    x.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"],
                   help="storage dtype of patch and token features")
    x.add_argument("--no-patches", action="store_true", help="store only global image features")
    add_precision_arg(x)
    add_device_arg(x)
    add_decomposition_args(x)
    x.set_defaults(func=_features_extract)
    declare(x,
            reads={"backbone": "backbone", "world": "world", "inp": "shards or captions",
                   "decompositions": "decomposition store"},
            values=("split", "decomposer"))
    v = feats.add_parser("verify", help="check every shard of a cache against its recorded sha256")
    v.add_argument("--cache", required=True, help="a feature cache folder (foco features extract --out)")
    v.set_defaults(func=_features_verify)
    declare(v, reads={"cache": "feature cache"})


def _register_train(sub: argparse._SubParsersAction) -> None:
    tr = sub.add_parser("train", help="train FoCo (stage 1: F_Aggr; stage 2: F_Aggr + F_Comp) on cached features")
    tr.add_argument("--features", default=None, help="feature cache of the training split (or a feature corpus)")
    tr.add_argument("--world", default=None, help="world folder (its pairs; oracle decompositions by default)")
    tr.add_argument("--in", dest="inp", default=None,
                    help="instead of --world: the webdataset shards the --features were extracted from")
    tr.add_argument("--split", default="train", help="which split to read")
    tr.add_argument("--online", action="store_true",
                    help="with --in and --backbone: encode the shards' images and captions inside the loop (no "
                         "feature cache; for corpora whose features do not fit on disk)")
    tr.add_argument("--backbone", default=None, help="with --online: the frozen backbone, e.g. hf:PATH")
    tr.add_argument("--workers", type=nonneg_int, default=2,
                    help="with --online: DataLoader workers reading, preprocessing and tokenizing")
    add_decomposition_args(tr)
    tr.add_argument("--out", required=True, help="output folder (created; rerun the same command to resume)")
    add_owned_output(tr, signature=("train_state", "train_log.jsonl"), kind="FoCo checkpoint")
    tr.add_argument("--stage1-epochs", type=nonneg_int, default=3, help="epochs of the first stage")
    tr.add_argument("--stage2-epochs", type=nonneg_int, default=30, help="epochs of the second stage")
    tr.add_argument("--batch-size", type=positive_int, default=512, help="examples per step")
    tr.add_argument("--lr-stage1", type=learning_rate, default=5e-4, help="learning rate of the first stage")
    tr.add_argument("--lr-aggr", type=learning_rate, default=5e-5, help="F_Aggr's learning rate in stage 2")
    tr.add_argument("--lr-comp", type=learning_rate, default=3e-5, help="F_Comp's learning rate in stage 2")
    tr.add_argument("--max-negatives", type=nonneg_int, default=None, help="cap on cross-instance negatives per anchor")
    tr.add_argument("--max-pairs", type=positive_int, default=5,
                    help="K: the decomposition pairs used per image, each image's first ones (the paper's K = 4 "
                         "peak, Fig. 3; 1 is ablation 3b). A store holds at most what it was decomposed with: "
                         "`foco decompose --max-pairs`")
    tr.add_argument("--min-pairs", type=positive_int, default=1,
                    help="leave out images with fewer decomposition pairs than this (the count is printed); "
                         "--min-pairs K --max-pairs K trains every image on exactly K pairs")
    tr.add_argument("--learn-bias", action="store_true", help="learnable logit bias (off = paper-exact)")
    _add_loss_and_lever_args(tr)
    from ..model.aggr import AGGR_BACKGROUNDS
    tr.add_argument("--background", default="complement", choices=AGGR_BACKGROUNDS,
                    help="how F_Aggr's inverse attention weighs the patches for the background feature "
                         "(src/foco/model/aggr.py gives each reading's formula)")
    tr.add_argument("--shape", default="paper", choices=("paper", "compact"),
                    help="F_Aggr's and F_Comp's module shapes: paper (38.4M trainable parameters at D = 768, the "
                         "paper's 38M) or compact (23.0M at D = 768, foco's shape before issue 39); "
                         "docs/architecture.md gives both")
    tr.add_argument("--seed", type=seed_int, default=0, help="random seed (same seed, same result)")
    tr.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                    help="torch.compile the training step (default backend inductor; for GPUs: compiling takes a "
                         "while on the first steps)")
    add_distributed_args(tr)
    add_precision_arg(tr)
    add_device_arg(tr)
    add_resume_args(tr)
    add_allow_changed(tr)
    _add_edit_args(tr)
    add_owned_output(tr, dest="edit_features", kind="feature cache")
    tr.set_defaults(func=_train)
    declare(tr,
            reads={"features": "feature cache", "world": "world", "inp": "shards or captions", "backbone": "backbone",
                   "decompositions": "decomposition store", "edits": "edit store"},
            values=("split", "decomposer", "compile", "edit_settings", "target_threshold"))


def _add_loss_and_lever_args(tr: argparse.ArgumentParser) -> None:
    """How the loss's temperature and bias train (issue 54, item 1), and issue 54's levers."""
    from ..train.foco import PARAM_GROUPS
    tr.add_argument("--param-groups", default="siglip", choices=PARAM_GROUPS,
                    help="siglip (default): the loss's temperatures and biases in their own optimiser group "
                         "(--lr-temperature) and no weight decay on them, on norms, biases and learned tokens "
                         "(open_clip's rule), as SigLIP trains them (stages 1 and 2; the edit stage as before); legacy: foco before issue 54 (tau and b in "
                         "their stage's module group, weight decay on every parameter)")
    tr.add_argument("--lr-temperature", type=learning_rate, default=None,
                    help="with --param-groups siglip: the temperatures' and biases' learning rate (default: their "
                         "stage's module rate, --lr-stage1 then --lr-comp)")
    from .numbers import float_in
    lev = tr.add_argument_group("levers of issue 54 (NOT in the FoCo paper; off by default)")
    lev.add_argument("--background-dropout", type=float_in(0.0, 0.99), default=0.0,
                     help="in training, zero F_Comp's background input per query with this probability, so that "
                          "the context must carry the rest of the scene (0: never, the paper)")
    lev.add_argument("--negative-groups", type=nonneg_int, default=0,
                     help="harder negatives: make each batch of groups of this many images that are one another's "
                          "nearest neighbours by global feature (0: uniform batches, the paper; 2 to --batch-size; not "
                          "with --sharded)")
    lev.add_argument("--focus-in-context", type=float_in(0.0, 1.0), default=0.0,
                     help="this share of the (local, context) pairs gets the local caption as its context, so that "
                          "F_Comp also reads the focused object from the text (0: the paper's contexts, which never "
                          "name it)")


def _add_edit_args(tr: argparse.ArgumentParser) -> None:
    ed = tr.add_argument_group("foco-edits: a third stage on edit triplets (NOT in the FoCo paper)")
    ed.add_argument("--edits", default=None, help="SQLite store of `foco edits generate` (off: the paper's recipe)")
    ed.add_argument("--edit-settings", default=None, help="which generator settings of the store (if several)")
    ed.add_argument("--edit-features", default=None, help="cache of the edit texts (default OUT/edit-features)")
    ed.add_argument("--stage3-epochs", type=nonneg_int, default=2, help="epochs of the edit stage (with --edits)")
    ed.add_argument("--lr-edit", type=learning_rate, default=1e-4, help="F_Aggr's and F_Comp's rate in the edit stage")
    ed.add_argument("--preserve-weight", type=loss_weight, default=0.3, help="weight of L_preserve (the source image)")
    ed.add_argument("--no-edit-negatives", action="store_true", help="no negative captions as hard negatives")
    ed.add_argument("--image-weight", type=loss_weight, default=0.0,
                    help="weight of the retrieved target image's InfoNCE (0: captions only; see --target-threshold)")
    ed.add_argument("--target-threshold", default="auto",
                    help="target images retrieved from the corpus: a cosine, or 'auto' (the corpus's median "
                         "caption-image cosine)")
