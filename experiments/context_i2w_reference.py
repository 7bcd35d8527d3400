"""foco's Context-I2W against the reference code (Pter61/context-i2w), with copied weights (issue 57, item 4).

    git clone https://github.com/Pter61/context-i2w /tmp/context-i2w-ref       # or any checkout of it
    pip install --target /tmp/refdeps einops einops-exts                      # the reference's model.py imports them
    PYTHONPATH=/tmp/refdeps python experiments/context_i2w_reference.py --reference /tmp/context-i2w-ref \
        --out runs/context-i2w-reference.json

Runs the reference's own module, imported from the checkout's model/model.py (nothing of it is copied into foco):
1. the mapper: the reference's `IM2TEXT_OWM_Attn` (its VisualTargetExtractor fixed at 6 layers, 8 heads of 64) with
   every parameter random (N(0, 0.2); `local_gate` 0.7, so the local branch counts), its state dict mapped into
   foco's `ContextI2WMapper` (`reference_keys`: the old weight norm's weight_g / weight_v to torch's
   parametrization), outputs compared in eval mode on c (B, T) and x (B, 1+N, D), at small sizes and at ViT-L/14's
   (T = E = O = 768, D = 1024, middle 512, 257 tokens).
2. the loss: trainer.py's get_loss_img2text_replace_token without the gather (logit_scale * v t^T, cross-entropy
   both ways, halved) against `foco.train.pic2word.pic2word_loss` at temperature 1 / logit_scale.
3. the optimiser's groups: main.py's exclusion by name (bn, ln, bias, logit_scale) over the reference module's
   parameters against the no-decay group of foco's `make_optimizer`, named back in the reference's layout.
Prints and writes a JSON report; exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


def _compare(model_mod, T: int, D: int, O: int, M: int, n_tokens: int, seed: int, perturb: str | None = None
             ) -> float:
    from foco.methods.context_i2w import ContextI2WConfig, ContextI2WMapper
    torch.manual_seed(seed)
    ref = model_mod.IM2TEXT_OWM_Attn(transformer_width=T, vision_width=D, embed_dim=O, middle_dim=M, output_dim=O,
                                     n_layer=2)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if "weight_g" in name or "norm" in name and p.ndim == 1 and
                                                 name.endswith("weight") else 0.0))
        ref.local_gate.fill_(0.7)
    ours = ContextI2WMapper(ContextI2WConfig(image_dim=D, context_dim=T, token_dim=O, middle_dim=M))
    ours.load_state_dict(ContextI2WMapper.reference_keys(ref.state_dict()))
    if perturb is not None:  # the negative control: one weight of the local branch moved by 0.05
        with torch.no_grad():
            dict(ours.named_parameters())[perturb].view(-1)[0] += 0.05
    c, x = torch.randn(4, T) * 2, torch.randn(4, n_tokens, D)
    with torch.no_grad():
        want, got = ref.eval()(c, x), ours.eval()(c, x)
    return (want - got).abs().max().item() / want.abs().max().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", type=Path, required=True, help="a checkout of Pter61/context-i2w")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--commit", default=None, help="the checkout's commit, where it is no git work tree (an archive)")
    a = ap.parse_args()
    sys.path.insert(0, str(a.reference / "model"))
    import model as model_mod
    from foco.train.pic2word import pic2word_loss
    report, ok = {}, True
    head = subprocess.run(["git", "-C", str(a.reference), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    report["reference_commit"] = a.commit or (head if len(head) == 40 else None)

    small = _compare(model_mod, T=32, D=48, O=32, M=40, n_tokens=1 + 16, seed=0)
    large = _compare(model_mod, T=768, D=1024, O=768, M=512, n_tokens=257, seed=1)
    report["mapper_max_rel_diff"] = {"small (T=O=32, D=48, 16 patches)": small,
                                     "ViT-L/14 sizes (T=O=768, D=1024, 256 patches)": large}
    ok &= small < 1e-6 and large < 1e-6
    control = _compare(model_mod, T=32, D=48, O=32, M=40, n_tokens=1 + 16, seed=0,
                       perturb="VT_Extractor.layers.5.0.to_q.weight")
    report["negative_control_rel_diff"] = control  # a check that can fail: one VT weight moved by 0.05
    ok &= control > 1e-5

    scale = torch.tensor(100.0)
    v, t = F.normalize(torch.randn(64, 768), dim=-1), F.normalize(torch.randn(64, 768), dim=-1)
    truth = torch.arange(64)
    logits_per_image = scale * v @ t.t()
    want = ((nn.CrossEntropyLoss()(logits_per_image, truth) + nn.CrossEntropyLoss()(scale * t @ v.t(), truth)) / 2)
    got = pic2word_loss(v, t, 1 / scale.item())
    report["loss"] = {"reference": want.item(), "foco": got.item(), "abs_diff": abs(want.item() - got.item())}
    ok &= abs(want.item() - got.item()) < 1e-4

    ref = model_mod.IM2TEXT_OWM_Attn(transformer_width=32, vision_width=48, embed_dim=32, middle_dim=40,
                                     output_dim=32, n_layer=2)
    exclude = lambda n: "bn" in n or "ln" in n or "bias" in n or "logit_scale" in n  # noqa: E731  (main.py's)
    from foco.methods.context_i2w import ContextI2WConfig, ContextI2WMapper
    from foco.train.context_i2w import ContextI2WTrainConfig, make_optimizer
    ours = ContextI2WMapper(ContextI2WConfig(image_dim=48, context_dim=32, token_dim=32, middle_dim=40))
    ours.load_state_dict(ContextI2WMapper.reference_keys(ref.state_dict()))
    refs = dict(ref.named_parameters())
    want = {n for n in refs if exclude(n)}
    opt = make_optimizer(ours, ContextI2WTrainConfig())
    name_of = {id(p): n for n, p in ours.named_parameters()}
    back = {"W_R.parametrizations.weight.original0": "W_R.weight_g",
            "W_R.parametrizations.weight.original1": "W_R.weight_v"}
    got = {back.get(name_of[id(p)], name_of[id(p)]) for g in opt.param_groups if g["weight_decay"] == 0
           for p in g["params"]}  # foco's optimiser's no-decay group, in the reference's names
    report["no_decay_same"] = got == want and len(want) > 0
    report["no_decay_parameters"] = sorted(want)
    ok &= report["no_decay_same"]

    report["defaults_that_differ"] = [
        "image tokens: foco's feature caches (the raw global as the CLS token, the patches; both in the joint space) "
        "where the reference reads the vision tower's last-block tokens before ln_post",
        "the global branch's first layer reads the token width O (what it receives); the reference declares "
        "embed_dim E, equal to O for CLIP ViT-L/14 and B/32, and fails where they differ",
        "the masked training caption: the first local phrase's noun (the release has no masking script)",
        "the placeholder: '*' with its own token embedding; the reference's '<|replace|>' (CLIP's embedding row 49405)",
        "fp32 (the reference: amp with a GradScaler); one process here (the reference gathers across GPUs)",
        "the world calibration's warm-up: 5 % of the steps (the reference: 10,000 steps)",
    ]
    report["ok"] = bool(ok)
    text = json.dumps(report, indent=2)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
