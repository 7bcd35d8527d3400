"""foco's SEARLE against the reference code (miccunifi/SEARLE), with copied weights (issue 57, item 4).

    git clone https://github.com/miccunifi/SEARLE /tmp/searle-ref      # or any checkout of it
    python experiments/searle_reference.py --reference /tmp/searle-ref --out runs/searle-reference.json

Runs the reference's own functions, imported from the checkout's src/ (nothing of it is copied into foco; its
`clip` and `data_utils` imports, unused by these functions, are stubbed):
1. phi: the reference's `phi.Phi(D, 4D, E, 0.5)` with random weights (N(0, 0.3)); its state dict loads into foco's
   `SEARLEPhi` as it is, and the outputs agree in eval mode on raw embeddings, at SEARLE-XL's sizes (768, 3072, 768).
2. the distillation loss: `utils.contrastive_loss` against `foco.train.searle.nt_xent` on one batch of 256.
3. the templates: `utils.get_templates()` is `foco.methods.searle.TEMPLATES`.
4. the text path: `encode_with_pseudo_tokens.encode_with_pseudo_tokens` on a tiny random transformers CLIP,
   presented in OpenAI's layout (token_embedding, positional_embedding, a transformer on (L, N, D), ln_final,
   text_projection), against foco's `hf:` backbone of the same folder (`encode_texts_with_tokens`, first
   placeholder only). The byte-level tokenizer puts "$</w>" at id 259, as CLIP's does. Texts with one and with two
   "$": only the first is the pseudo word in both.
5. the losses on one batch: OTI's (train: `foco.train.searle.oti_loss`) and phi's (`SEARLEObjective`) against the
   same terms built from the reference's functions and `nn.CosineEmbeddingLoss`, with the weights of
   oti_inversion.py ((1 cos + 0.5 gpt) / 1.5) and train_phi.py (1 distil + 0.75 gpt).
Prints and writes a JSON report; exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch
import torch.nn as nn


def _import_reference(root: Path):
    src = root / "src"
    sys.path.insert(0, str(src))
    clip = types.ModuleType("clip")
    clip_model = types.ModuleType("clip.model")
    clip_model.CLIP = object
    clip.model = clip_model
    data_utils = types.ModuleType("data_utils")
    data_utils.collate_fn = None
    sys.modules.update({"clip": clip, "clip.model": clip_model, "data_utils": data_utils})
    import encode_with_pseudo_tokens as ewpt
    import phi as phi_mod
    import utils
    return phi_mod, utils, ewpt


def _tiny_clip(folder: Path) -> None:
    """A random transformers CLIP with a byte-level CLIP tokenizer ("$</w>" is id 259; EOT the largest id)."""
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPProcessor, CLIPTokenizer
    from bench_scale import _bytes_to_unicode  # CLIP's byte-level alphabet (experiments/bench_scale.py)
    chars = list(_bytes_to_unicode().values())
    vocab = {t: i for i, t in enumerate(dict.fromkeys(chars + [c + "</w>" for c in chars] +
                                                      ["<|startoftext|>", "<|endoftext|>"]))}
    tok = CLIPTokenizer(vocab=vocab, merges=[])
    text = dict(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=77, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=dict(image_size=32, patch_size=8, hidden_size=32,
                                                                      intermediate_size=64, num_hidden_layers=1,
                                                                      num_attention_heads=2), projection_dim=40))
    model.save_pretrained(folder)
    proc = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    CLIPProcessor(image_processor=proc, tokenizer=tok).save_pretrained(folder)


class OpenAILayout(nn.Module):
    """A transformers CLIP's text tower as the attributes the reference's encode_with_pseudo_tokens reads."""

    def __init__(self, model):
        super().__init__()
        tm = model.text_model
        self.token_embedding = tm.embeddings.token_embedding
        self.positional_embedding = tm.embeddings.position_embedding.weight  # (77, W)
        self.encoder, self.ln_final = tm.encoder, tm.final_layer_norm
        self.text_projection = model.text_projection.weight.t()  # (W, D)
        self.dtype = torch.float32

    def transformer(self, x: torch.Tensor) -> torch.Tensor:  # (L, N, W) -> (L, N, W), CLIP's causal mask
        x = x.permute(1, 0, 2)
        L = x.shape[1]
        mask = torch.full((L, L), float("-inf")).triu(1)[None, None].expand(x.shape[0], 1, L, L)
        return self.encoder(inputs_embeds=x, attention_mask=mask).last_hidden_state.permute(1, 0, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", type=Path, required=True, help="a checkout of miccunifi/SEARLE")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--commit", default=None, help="the checkout's commit, where it is no git work tree (an archive)")
    a = ap.parse_args()
    phi_mod, utils, ewpt = _import_reference(a.reference)
    from foco.methods.searle import TEMPLATES, SEARLEConfig, SEARLEPhi
    from foco.train.searle import SEARLEObjective, SEARLETrainConfig, nt_xent, oti_loss, OTIConfig
    report, ok = {}, True
    commit = subprocess.run(["git", "-C", str(a.reference), "rev-parse", "HEAD"], capture_output=True, text=True)
    head = commit.stdout.strip()
    report["reference_commit"] = a.commit or (head if len(head) == 40 else None)

    # 1. phi
    torch.manual_seed(1)
    ref = phi_mod.Phi(768, 3072, 768, 0.5)
    for p in ref.parameters():
        nn.init.normal_(p, std=0.3)
    ours = SEARLEPhi(SEARLEConfig(embed_dim=768, token_dim=768))
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(64, 768) * 3
    with torch.no_grad():
        d = (ref.eval()(x) - ours.eval()(x)).abs().max().item()
    report["phi_max_abs_diff"] = d
    with torch.no_grad():  # the negative control: one weight of ours moved by 0.05, the check must see it
        ours.layers[3].weight[0, 0] += 0.05
        report["phi_negative_control"] = (ref(x) - ours(x)).abs().max().item()
    ok &= d < 1e-4 and report["phi_negative_control"] > 1e-3

    # 2. the distillation loss
    v1, v2 = torch.randn(256, 768), torch.randn(256, 768) * 2
    lr, lo = utils.contrastive_loss(v1, v2, 0.25).item(), nt_xent(v1, v2, 0.25).item()
    report["contrastive_loss"] = {"reference": lr, "foco": lo, "abs_diff": abs(lr - lo)}
    ok &= abs(lr - lo) < 1e-4

    # 3. templates
    report["templates_equal"] = list(utils.get_templates()) == list(TEMPLATES)
    ok &= report["templates_equal"]

    # 4. the text path, and 5. the losses on one batch
    from foco import create_backbone
    from transformers import CLIPModel
    with tempfile.TemporaryDirectory() as tmp:
        _tiny_clip(Path(tmp))
        bb = create_backbone(f"hf:{tmp}")
        model = CLIPModel.from_pretrained(tmp, attn_implementation="eager").eval()
        layout = OpenAILayout(model)
        tok = bb.tokenizer
        texts = ["a photo of $ that is red", "This is a photo of a  $ ", "a photo of $ that sits next to $ too",
                 "$ on a beach"]
        ids = tok(texts, padding="max_length", max_length=77, return_tensors="pt")["input_ids"]
        report["dollar_id"] = tok.convert_tokens_to_ids("$</w>")
        ok &= report["dollar_id"] == 259
        pseudo = torch.randn(len(texts), 48) * 0.5
        with torch.no_grad():
            want = ewpt.encode_with_pseudo_tokens(layout, ids, pseudo)  # (B, D), raw
            f = bb.encode_texts_with_tokens(texts, pseudo, "$", keep=(1, 0))
            got = f.global_ * f.norm[:, None]
            plain = ewpt.encode_with_pseudo_tokens(layout, ids, layout.token_embedding(ids)[
                torch.arange(len(texts)), (ids == 259).int().argmax(1)])  # each first $ by its own embedding
            own = bb.encode_texts(texts)
        report["text_path_max_abs_diff"] = (want - got).abs().max().item()
        report["text_path_layout_vs_tower"] = (plain - own.global_ * own.norm[:, None]).abs().max().item()
        report["text_path_scale"] = want.abs().max().item()
        ok &= report["text_path_max_abs_diff"] < 1e-4 and report["text_path_layout_vs_tower"] < 1e-4

        # 5. losses: OTI's and phi's, each against the reference's terms
        cos = nn.CosineEmbeddingLoss()
        one = torch.ones(4)
        tmpl = [t.format(" $ ") for t in TEMPLATES[:4]]
        phrases = ["a photo of red circle that is on a beach", "a photo of star that is small",
                   "a photo of beach that shows a small blue heart", "a photo of grey cross that is near a star"]
        concepts = ["red circle", "star", "beach", "grey cross"]
        oti_phrases = [p.replace(c, " $ ", 1) for p, c in zip(phrases, concepts)]
        v = torch.randn(4, 40)
        with torch.no_grad():
            reg = bb.encode_texts(phrases)
            reg_raw = reg.global_ * reg.norm[:, None]
            t_ids = tok(tmpl, padding="max_length", max_length=77, return_tensors="pt")["input_ids"]
            p_ids = tok(oti_phrases, padding="max_length", max_length=77, return_tensors="pt")["input_ids"]
            cos_loss = cos(ewpt.encode_with_pseudo_tokens(layout, t_ids, pseudo), v, one)
            gpt_loss = cos(ewpt.encode_with_pseudo_tokens(layout, p_ids, pseudo), reg_raw, one)
            want_oti = ((1 * cos_loss + 0.5 * gpt_loss) / 1.5).item()
            got_oti = oti_loss(bb, pseudo, v, tmpl, oti_phrases, reg.global_, OTIConfig(), "$").item()
        report["oti_loss"] = {"reference": want_oti, "foco": got_oti, "abs_diff": abs(want_oti - got_oti)}
        ok &= abs(want_oti - got_oti) < 1e-5

        phi = SEARLEPhi(SEARLEConfig(embed_dim=40, token_dim=48, dropout=0.0))
        ref_phi = phi_mod.Phi(40, 160, 48, 0.0)
        ref_phi.load_state_dict(phi.state_dict())
        target = torch.randn(4, 48)
        tok_phrases = [p.replace(c, " $ ") for p, c in zip(phrases, concepts)]
        with torch.no_grad():
            est = ref_phi(v)
            q_ids = tok(tok_phrases, padding="max_length", max_length=77, return_tensors="pt")["input_ids"]
            want_phi = (1.0 * utils.contrastive_loss(target, est, 0.25) + 0.75 * cos(
                reg_raw, ewpt.encode_with_pseudo_tokens(layout, q_ids, est), one)).item()
            obj = SEARLEObjective(phi, bb, SEARLETrainConfig())
            obj.placeholder = "$"
            got_phi = obj(v, target, tok_phrases, reg.global_)["loss"].item()
        report["phi_loss"] = {"reference": want_phi, "foco": got_phi, "abs_diff": abs(want_phi - got_phi)}
        ok &= abs(want_phi - got_phi) < 1e-5

    report["defaults_that_differ"] = [
        "the placeholder: foco's pseudo-token backbones read '*'; the reference's CLIP tokenizer reads '$' (id 259)",
        "concepts and phrases: the world's (foco.world.phrases) in place of Open Images' classes and GPT-Neo 2.7B's",
        "OTI and phi run in fp32 on the CPU (the reference: fp16 autocast with a GradScaler on a GPU)",
        "the seed: foco's 0; the reference's 42",
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
