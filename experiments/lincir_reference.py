"""foco's LinCIR against the reference code (navervision/lincir), with copied weights (issue 40, item 3).

    git clone https://github.com/navervision/lincir /tmp/lincir-ref      # or any checkout of it
    python experiments/lincir_reference.py --reference /tmp/lincir-ref --world runs/vit-seeds/seed-0/world

Runs the reference's own code, imported from the checkout (nothing of it is copied into foco):
1. phi: the reference's `models.Phi(D, 4D, E, 0.5)` with random weights; its state dict loads into foco's
   `LinCIRPhi` as it is, and the outputs agree (eval mode) on raw embeddings.
2. masking: the reference's `loader.CaptionDataset.__getitem__` on every caption of the world's train split, with
   a recording tokenizer (it keeps the texts the reference tokenizes; "[$]" is the reference's placeholder, the
   token it maps to 259) and the same spaCy model as foco; foco's `mask_caption` must give the same masked text
   ("[$]" read as foco's "*"). The reference draws its fallback word with Python's global `random`, foco with
   its own generator: captions that fall back are compared by their shape (one word replaced), the rest exactly.
3. the objective: train_phi.py's input noise and loss (e + 1.0 * U[0,1) * N(0, I); MSE of the raw embeddings),
   checked term by term against `foco.train.lincir` on one batch of the world's text tower with the same draws.
4. the query: validate.py's "a photo of $ that {}" is foco's template with the placeholder renamed.
Prints a JSON report; exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F


class RecordingTokenizer:
    """Stands in for the reference's CLIP tokenizer in loader.py: keeps every text it is asked to tokenize; ids
    are 49408 for "[$]" (the reference's added special token) and 1000 for any other word."""

    def __init__(self):
        self.texts: list[str] = []

    def encode(self, text, padding=None, return_tensors=None):
        return torch.ones(1, len(text.split()) + 2, dtype=torch.long)

    def __call__(self, text, return_tensors=None, padding=None, truncation=None):
        self.texts.append(text)
        ids = [49408 if w == "[$]" else 1000 for w in re.findall(r"\[\$\]|\S+", text)] or [1000]
        return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}


def _import_reference(root: Path):
    sys.path.insert(0, str(root))
    for missing in ("webdataset", "datasets"):  # imported by loader.py, unused by CaptionDataset
        sys.modules.setdefault(missing, types.ModuleType(missing))
    import loader  # noqa: E402  (the reference's)
    import models  # noqa: E402
    return loader, models


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", required=True, help="a checkout of navervision/lincir")
    ap.add_argument("--world", default="runs/vit-seeds/seed-0/world")
    ap.add_argument("--backbone", default="world:vit")
    a = ap.parse_args()
    loader, models = _import_reference(Path(a.reference))
    from foco import create_backbone
    from foco.decompose.rule import load_spacy
    from foco.methods.lincir import LinCIRConfig, LinCIRPhi
    from foco.train.lincir import LinCIRObjective, clean_caption, keyword_runs, mask_caption
    from foco.world.manifest import load_pairs
    report: dict = {}
    ok = True

    # 1. phi with the reference's weights
    torch.manual_seed(0)
    D, E = 256, 384
    ref_phi = models.Phi(input_dim=D, hidden_dim=4 * D, output_dim=E, dropout=0.5).eval()
    ours = LinCIRPhi(LinCIRConfig(embed_dim=D, token_dim=E)).eval()
    ours.load_state_dict(ref_phi.state_dict())  # the same keys: a reference checkpoint loads as it is
    x = torch.randn(64, D) * 5.0
    with torch.no_grad():
        diff = float((ours(x) - ref_phi(x)).abs().max())
    report["phi max |diff|"] = diff
    ok &= diff < 1e-6

    # 2. masking, caption by caption
    nlp = load_spacy()
    captions = [p.caption for p in load_pairs(a.world, "train")]
    tok = RecordingTokenizer()
    dataset = loader.CaptionDataset(captions, tok, nlp)
    same = fallback_same_shape = differ = 0
    examples = []
    rng = random.Random(0)
    for i, caption in enumerate(captions):
        tok.texts.clear()
        dataset[i]
        ref_masked = tok.texts[-1].replace("[$]", "*")  # the last text it tokenized: the masked caption
        cleaned = clean_caption(caption, "*")
        runs = keyword_runs(nlp, cleaned)
        mine = mask_caption(cleaned, runs, rng, "*")
        fell_back = any(r not in cleaned for r in runs) or not runs
        if mine == ref_masked:
            same += 1
        elif fell_back and mine.count("*") == ref_masked.count("*"):
            fallback_same_shape += 1
        else:
            differ += 1
            if len(examples) < 5:
                examples.append({"caption": caption, "reference": ref_masked, "foco": mine})
    report["masking"] = {"captions": len(captions), "identical": same,
                         "fallback (random word), same shape": fallback_same_shape, "different": differ,
                         "examples": examples}
    ok &= differ == 0

    # 3. the objective on one batch, the reference's formula against foco's objective
    backbone = create_backbone(a.backbone)
    batch = [clean_caption(c, "*") for c in captions[:32]]
    masked = [mask_caption(c, keyword_runs(nlp, c), rng, "*") for c in batch]
    f = backbone.encode_texts(batch)
    e = f.global_ * f.norm[:, None]  # train_phi.py's text_embeds: the raw projection
    g = torch.Generator().manual_seed(0)
    noisy = e.clone() + 1.0 * torch.rand(e.shape[0], generator=g).unsqueeze(-1) * torch.randn(e.shape, generator=g)
    phi = LinCIRPhi(LinCIRConfig(embed_dim=e.shape[1], token_dim=backbone.token_dim)).eval()
    with torch.no_grad():
        mine = LinCIRObjective(phi, backbone)(e, noisy, masked)["loss"]
        t = backbone.encode_texts_with_tokens(masked, phi(noisy), "*")
        ref_loss = F.mse_loss((t.global_ * t.norm[:, None]).float(), e.float(), reduction="mean")
    report["loss |diff|"] = float((mine - ref_loss).abs())
    ok &= report["loss |diff|"] < 1e-6

    # 4. the query template
    validate = (Path(a.reference) / "validate.py").read_text()
    report["template"] = "a photo of $ that {" in validate and LinCIRConfig().query_template == "a photo of * that {}"
    ok &= report["template"]
    report["ok"] = bool(ok)
    print(json.dumps(report, indent=2))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
