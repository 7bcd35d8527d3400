"""Issue 54, item 3: oracles that say where zero-shot FoCo fails on the world, for trained checkpoints (seeds) on the
`single`, `described` and `restaged` protocols of a split. The world knows each query's ground truth: the reference's
scene (which layout cell holds the object an edit names) and the target's scene (what its own caption and oracle
(local, context) decomposition would be).

* grounding: the share of F_Aggr's attention on the layout cell of the object an anchor names (4 cells: 25 % by
  chance), with training local captions (512 training pairs, their grounding "object:i") and, for each run below,
  on the object edits (remove, replace, size, colour) with that run's anchor ("as trained": T_m);
* F_Comp with oracle inputs, R@1 overall and by edit type:
  - "as trained": FoCo as `foco eval` runs it (T_m is anchor and context);
  - "oracle focus": F_Aggr's attention forced onto the edited object's cell (a -1e4 logit bias outside it; the
    object edits only, the others as trained); the background is then the rest of the picture;
  - "oracle text": the target's own oracle decomposition as the text: its pair for the edited object (the
    background's pair for a background edit; its first pair where the target lacks the object) gives F_Aggr's
    anchor (the local caption) and F_Comp's context (the contextual caption). This is the proxy task posed on the
    test query: the ceiling of what training taught F_Comp to do;
  - "oracle focus + text": both;
  - "pooled text only": F_Comp's context is T_m's pooled global as one token (a probe of the trained model: it never
    saw a context of one token);
  - "T_m decomposed (rule)": the lever of the paper's §3.4, `foco+rule` (F_Aggr's anchor is T_m's first local
    phrase; the context stays T_m);
* the text route's inputs, once per backbone: a linear probe of the backbone's pooled text global against its token
  features (masked mean) for which shapes, colours and backgrounds a caption names (trained on 4,000 training
  captions, scored on 1,000 backbone_val captions: micro-F1 at 0.5).

    python experiments/foco_oracles.py --run runs/quickstart --checkpoints runs/diag/siglip-mod-s{0,1,2} \
        --split test --out runs/diag/oracles-test.json
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from foco.backbones import create_backbone
from foco.backbones.base import ImageFeatures, TextFeatures
from foco.benchmarks.world import load_world_part
from foco.eval.compose import reference_rows
from foco.eval.rank import rank, score, score_by_category
from foco.model import ComposedQueryEncoder
from foco.train.data import build_pair_table
from foco.utils.io import atomic_write_text, read_jsonl
from foco.world.captions import CaptionChoice, caption_scene
from foco.world.manifest import load_pairs
from foco.world.scene import Scene

PROTOCOLS = ("single", "described", "restaged")
OBJECT_EDITS = ("remove", "replace", "size", "colour")
GRID = 8


def cell_mask(cell: int, grid: int = GRID) -> torch.Tensor:
    """(grid*grid,) bool: the patches of layout cell `cell` (the world's 2 x 2 layout)."""
    r, c = divmod(cell, 2)
    m = torch.zeros(grid, grid, dtype=torch.bool)
    m[r * grid // 2:(r + 1) * grid // 2, c * grid // 2:(c + 1) * grid // 2] = True
    return m.flatten()


def scenes(world: Path, split: str, protocol: str) -> dict[str, Scene]:
    """Every gallery image's scene of a protocol (restaged: the redrawn layout)."""
    return {r["id"]: Scene.from_dict(r["scene"]) for r in read_jsonl(world / "benchmarks" / split / protocol /
                                                                       "gallery.jsonl")}


def target_pair(scene: Scene, edit: dict) -> tuple[str, str]:
    """The target's own (local, context) oracle pair for the edit (module docstring); every object named."""
    choice = CaptionChoice(np.random.default_rng(0), scene, partial=False)
    _, dec, grounds = caption_scene(scene, choice)
    want = None  # remove: the object is gone from the target, whose first pair is taken
    if edit["type"] == "background":
        want = "background"
    elif edit["type"] == "add":  # the added object: the target's object in the edit's cell
        want = next((f"object:{i}" for i, o in enumerate(scene.objects) if o.cell == edit["cell"]), None)
    elif edit["type"] != "remove":
        want = f"object:{edit['index']}"
    k = grounds.index(want) if want in grounds else 0
    return dec.pairs[k].local, dec.pairs[k].context


@torch.inference_mode()
def encode(model: ComposedQueryEncoder, refs: ImageFeatures, anchor: torch.Tensor, ctx: TextFeatures,
           bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries (Q, D) and attention (Q, P) in batches of 256."""
    qs, att = [], []
    for s in range(0, anchor.shape[0], 256):
        sl = slice(s, s + 256)
        cq = model.encode(ImageFeatures(refs.global_[sl], refs.patches[sl].float()),
                          TextFeatures(ctx.global_[sl], ctx.tokens[sl].float(), ctx.mask[sl]),
                          attn_bias=None if bias is None else bias[sl], anchor=anchor[sl])
        qs.append(cq.query.float())
        att.append(cq.attention.float())
    return torch.cat(qs), torch.cat(att)


def protocol_oracles(model: ComposedQueryEncoder, world: Path, features: Path, split: str, protocol: str,
                     backbone, text_cache: dict, checkpoint: str | None = None) -> dict:
    bench, feats = load_world_part(world, split, protocol, features / f"{split}-{protocol}")
    sc = scenes(world, split, protocol)
    rows = reference_rows(bench, feats)
    refs = ImageFeatures(feats.references.global_[rows], feats.references.patches[rows])
    pos = {t: i for i, t in enumerate(feats.text_ids)}
    tm = feats.texts.take(torch.tensor([pos[q.texts[0]] for q in bench.queries]))  # T_m
    tm = TextFeatures(tm.global_.float(), tm.tokens.float(), tm.mask)
    P = refs.patches.shape[1]
    raw = {r["id"]: r["edit"] for r in read_jsonl(world / "benchmarks" / split / protocol / "queries.jsonl")}
    edits = [raw[q.id] for q in bench.queries]
    obj = torch.tensor([e["type"] in OBJECT_EDITS for e in edits])  # (Q,)
    masks = torch.stack([cell_mask(sc[q.reference].objects[e["index"]].cell) if e["type"] in OBJECT_EDITS
                         else torch.ones(P, dtype=torch.bool) for q, e in zip(bench.queries, edits)])  # (Q, P)
    bias = torch.where(masks, 0.0, -1e4)  # (Q, P): the oracle focus; all 0 for the other edits
    pairs = [target_pair(sc[q.targets[0]], e) for q, e in zip(bench.queries, edits)]
    todo = [t for p in pairs for t in p if t not in text_cache]
    for s in range(0, len(todo), 256):
        chunk = list(dict.fromkeys(todo[s:s + 256]))
        f = backbone.encode_texts(chunk)
        for i, t in enumerate(chunk):
            text_cache[t] = (f.global_[i].float(), f.tokens[i][f.mask[i]].float())
    loc = torch.stack([text_cache[p[0]][0] for p in pairs])  # (Q, D)
    ctx_list = [text_cache[p[1]][1] for p in pairs]
    L = max(t.shape[0] for t in ctx_list)
    ctx_tokens = torch.stack([F.pad(t, [0, 0, 0, L - t.shape[0]]) for t in ctx_list])  # (Q, L, D)
    ctx_mask = torch.arange(L)[None] < torch.tensor([t.shape[0] for t in ctx_list])[:, None]
    oracle_ctx = TextFeatures(torch.stack([text_cache[p[1]][0] for p in pairs]), ctx_tokens, ctx_mask)
    pooled = TextFeatures(tm.global_, tm.global_[:, None, :], torch.ones(len(edits), 1, dtype=torch.bool))
    runs = {"as trained": (tm.global_, tm, None), "oracle focus": (tm.global_, tm, bias),
            "oracle text": (loc, oracle_ctx, None), "oracle focus + text": (loc, oracle_ctx, bias),
            "pooled text only": (tm.global_, pooled, None)}
    out = {}
    for name, (anchor, ctx, b) in runs.items():
        q, att = encode(model, refs, anchor, ctx, b)
        r = rank(bench, feats.gallery_ids, feats.gallery, q)
        out[name] = {"R@1": round(score(bench, r)["R@1"], 2),
                     "by edit type": {k: round(v, 1) for k, v in score_by_category(bench, r).items()}}
        mass = (att * masks.float()).sum(-1)[obj]  # (Q_obj,): the attention share on the edited object's cell
        out[name]["grounding"] = round(float(mass.mean()) * 100, 1)
    if checkpoint is not None:  # the lever "T_m decomposed at inference" (paper §3.4): its first local phrase as anchor
        from foco.eval.compose import compose
        from foco.methods.foco import FoCoRule
        q = compose(FoCoRule(checkpoint, backbone), bench, feats).query
        r = rank(bench, feats.gallery_ids, feats.gallery, q)
        out["T_m decomposed (rule)"] = {"R@1": round(score(bench, r)["R@1"], 2),
                                        "by edit type": {k: round(v, 1) for k, v in score_by_category(bench, r).items()}}
    return out


@torch.inference_mode()
def training_grounding(model: ComposedQueryEncoder, world: Path, features: Path, n: int = 512) -> float:
    """The attention share on the named object's cell for the local captions of the first `n` training pairs."""
    recs = read_jsonl(world / "pairs" / "train.jsonl")[:n]
    table = build_pair_table(features / "train", {p.id: p.decomposition for p in load_pairs(world, "train")})
    row = {i: k for k, i in enumerate(table.ids)}
    batch = table.batch(torch.tensor([row[r["id"]] for r in recs]))
    _, _, att = model.aggr(batch.local, batch.image_global, batch.patches)  # (n, K, P)
    shares = []
    for i, rec in enumerate(recs):
        scene = Scene.from_dict(rec["scene"])
        for k, g in enumerate(rec["grounding"][:att.shape[1]]):
            if g.startswith("object:") and bool(batch.local_mask[i, k]):
                shares.append(float(att[i, k][cell_mask(scene.objects[int(g.split(':')[1])].cell)].sum()))
    return round(100 * float(np.mean(shares)), 1)


def text_probe(backbone, world: Path) -> dict:
    """Linear probes (module docstring): micro-F1 of the pooled global and of the token mean."""
    from foco.world.vocab import BACKGROUNDS, COLOURS, SHAPES
    words = list(SHAPES) + list(COLOURS)
    bgs = {b: [p.split()[-1] for p in v["phrases"]] for b, v in BACKGROUNDS.items()}

    def labels(recs):
        y = torch.zeros(len(recs), len(words) + len(bgs))
        for i, r in enumerate(recs):
            scene, cap = r["scene"], r["caption"]
            for o in scene["objects"]:
                for w in (o["kind"], o["colour"]):
                    if w in cap:
                        y[i, words.index(w)] = 1
            if any(p in cap for p in bgs[scene["background"]]):
                y[i, len(words) + list(bgs).index(scene["background"])] = 1
        return y

    def feats(recs):
        g, m = [], []
        for s in range(0, len(recs), 256):
            f = backbone.encode_texts([r["caption"] for r in recs[s:s + 256]])
            w = f.mask.float()[..., None]
            g.append(f.global_.float())
            m.append(F.normalize((f.tokens.float() * w).sum(1) / w.sum(1), dim=-1))
        return torch.cat(g), torch.cat(m)

    tr, te = read_jsonl(world / "pairs" / "train.jsonl")[:4000], read_jsonl(world / "pairs" / "backbone_val.jsonl")[:1000]
    ytr, yte = labels(tr), labels(te)
    out = {}
    for name, xtr, xte in zip(("pooled global", "token mean"), feats(tr), feats(te)):
        torch.manual_seed(0)
        lin = torch.nn.Linear(xtr.shape[1], ytr.shape[1])
        opt = torch.optim.Adam(lin.parameters(), lr=1e-2)
        for _ in range(300):
            opt.zero_grad()
            F.binary_cross_entropy_with_logits(lin(xtr), ytr).backward()
            opt.step()
        with torch.no_grad():
            pred = lin(xte) > 0
        tp = (pred & yte.bool()).sum().item()
        f1 = 2 * tp / max(1, pred.sum().item() + yte.sum().item())
        out[name] = round(100 * f1, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True)
    ap.add_argument("--checkpoints", nargs="+", required=True)
    ap.add_argument("--split", default="test")
    ap.add_argument("--protocols", default=",".join(PROTOCOLS))
    ap.add_argument("--backbone", default="world:vit")
    ap.add_argument("--out", required=True)
    ap.add_argument("--markdown", action="store_true", help="print the Markdown tables of an existing --out and exit")
    a = ap.parse_args()
    if a.markdown:  # the tables of the --checkpoints among the output's runs (their mean and sd)
        res = json.loads(Path(a.out).read_text())
        runs = {k: v for k, v in res["runs"].items() if k in a.checkpoints}
        if not runs:
            raise SystemExit(f"none of {a.checkpoints} is among {a.out}'s runs: {list(res['runs'])}")
        print(markdown({**res, "checkpoints": list(runs), "mean": summarize(runs)}))
        return
    run = Path(a.run)
    world, features = run / "world", run / "features"
    backbone = create_backbone(a.backbone)
    cache: dict = {}
    res = {"split": a.split, "checkpoints": a.checkpoints, "text probe": text_probe(backbone, world), "runs": {}}
    for ck in a.checkpoints:
        model = ComposedQueryEncoder.load(ck)
        r = {"grounding with training captions": training_grounding(model, world, features)}
        for p in a.protocols.split(","):
            r[p] = protocol_oracles(model, world, features, a.split, p, backbone, cache, ck)
        res["runs"][ck] = r
        print(json.dumps({ck: r}), flush=True)
    res["mean"] = summarize(res["runs"])
    atomic_write_text(Path(a.out), json.dumps(res, indent=1) + "\n")
    print(json.dumps(res["mean"], indent=1))


RUNS = ("as trained", "oracle focus", "oracle text", "oracle focus + text", "pooled text only",
        "T_m decomposed (rule)")


def markdown(res: dict) -> str:
    """The oracle tables of a finished output: R@1 per protocol and run, the by-edit-type table on each protocol's
    "as trained" and "oracle text", and the grounding shares (mean ± sd over the checkpoints)."""
    m = res["mean"]
    f = lambda k: f"{m[k][0]:.1f} ± {m[k][1]:.1f}" if k in m else ""  # noqa: E731
    prots = [p for p in PROTOCOLS if f"{p}/as trained/R@1" in m]
    out = [f"{len(res['checkpoints'])} checkpoints, {res['split']} split; R@1 mean ± sd", "",
           "| run | " + " | ".join(prots) + " | grounding on the edited object's cell (single) |",
           "|---|" + "---|" * (len(prots) + 1)]
    for r in RUNS:
        out.append(f"| {r} | " + " | ".join(f(f"{p}/{r}/R@1") for p in prots) + f" | {f(f'single/{r}/grounding')} |")
    out += ["", f"grounding with training local captions: {f('grounding with training captions')} (chance 25)",
            f"text probe (micro-F1 of what a caption names): {res['text probe']}", ""]
    types = sorted({k.split("/")[3] for k in m if "/by edit type/" in k})
    out += ["| protocol | run | " + " | ".join(types) + " |", "|---|---|" + "---|" * len(types)]
    for p in prots:
        for r in ("as trained", "oracle text", "T_m decomposed (rule)"):
            out.append(f"| {p} | {r} | " + " | ".join(f(f"{p}/{r}/by edit type/{t}") for t in types) + " |")
    return "\n".join(out)


def summarize(runs: dict) -> dict:
    """Mean and sd over checkpoints of every number."""
    acc: dict = defaultdict(list)

    def walk(prefix, v):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}/{k}" if prefix else k, x)
        else:
            acc[prefix].append(v)
    for r in runs.values():
        walk("", r)
    return {k: [round(float(np.mean(v)), 4), round(float(np.std(v, ddof=1)) if len(v) > 1 else 0.0, 4)]
            for k, v in acc.items()}


if __name__ == "__main__":
    main()
