"""Context-I2W (issue 57): the masked contexts (+AD), the mapper's attention against a head-by-head twin, its gate and
its context, the reference's weight-norm keys, and training from the CLI into `foco eval --methods context-i2w`."""
from __future__ import annotations

import json

import pytest
import torch

from foco.cli import main
from foco.methods.context_i2w import ContextI2WConfig, ContextI2WMapper, _Attention
from foco.train.context_i2w import context_pairs, mask_subject, no_decay

SMALL = ContextI2WConfig(image_dim=24, context_dim=16, token_dim=20, middle_dim=12, vt_depth=2, vt_heads=2,
                         vt_dim_head=6)


def test_the_subjects_noun_is_masked_once_as_a_word():
    cap = "a picture of a large red circle, a small star and a starfish on a beach"
    assert mask_subject(cap, "a large red circle") == "a picture of a large red * , a small star and a starfish on a beach"
    assert mask_subject(cap, "a small star") == "a picture of a large red circle, a small * and a starfish on a beach"
    assert mask_subject(cap, None) == "a photo of *" and mask_subject(cap, "a cube") == "a photo of *"


def test_ad_adds_each_decomposition_pair_rejoined_for_the_same_image(tiny_world):
    from foco.world.manifest import load_pairs
    ids, texts = context_pairs(tiny_world)
    pairs = load_pairs(tiny_world, "train")
    assert ids == [p.id for p in pairs] and all("*" in t for t in texts)
    ad_ids, ad_texts = context_pairs(tiny_world, add_decompositions=True)
    assert ad_texts[:len(texts)] == texts
    assert len(ad_ids) == len(pairs) + sum(len(p.decomposition.pairs) for p in pairs)
    first = pairs[0].decomposition.pairs[0]
    assert ad_ids[len(pairs)] == pairs[0].id and ad_texts[len(pairs)].startswith(first.context)


def test_attention_matches_a_head_by_head_twin():
    torch.manual_seed(0)
    attn = _Attention(dim=24, dim_head=6, heads=2)
    x, lat = torch.randn(3, 10, 24), torch.randn(3, 4, 24)
    got = attn(x, lat)
    xn, ln = attn.norm_media(x), attn.norm_latents(lat)
    q = attn.to_q(ln)
    k, v = attn.to_kv(torch.cat([xn, ln], 1)).chunk(2, -1)
    out = torch.zeros(3, 4, 12)
    for b in range(3):
        for h in range(2):
            s = slice(6 * h, 6 * h + 6)
            w = torch.softmax(q[b, :, s] @ k[b, :, s].T * 6 ** -0.5, dim=-1)  # (4, 14)
            out[b, :, s] = w @ v[b, :, s]
    torch.testing.assert_close(got, attn.to_out(out), atol=1e-5, rtol=0)


def test_the_gate_starts_closed_and_the_context_rotates_the_tokens(tmp_path):
    torch.manual_seed(0)
    m = ContextI2WMapper(SMALL).eval()
    c, x = torch.randn(2, 16), torch.randn(2, 9, 24)
    x2 = x.clone()
    x2[:, 1:] += 1.0  # other patches, the same first token
    with torch.no_grad():
        assert torch.equal(m(c, x), m(c, x2))  # gate 0: the patches' branch is off
        m.local_gate.fill_(0.5)
        assert not torch.allclose(m(c, x), m(c, x2))
        assert not torch.allclose(m(c, x), m(c * 2 + 1, x))
    state = {k.replace("W_R.parametrizations.weight.original0", "W_R.weight_g")
              .replace("W_R.parametrizations.weight.original1", "W_R.weight_v"): v for k, v in m.state_dict().items()}
    twin = ContextI2WMapper(SMALL).eval()
    twin.load_state_dict(ContextI2WMapper.reference_keys({f"module.{k}": v for k, v in state.items()}))
    with torch.no_grad():
        torch.testing.assert_close(twin(c, x), m(c, x), atol=0, rtol=0)
    m.save(tmp_path / "m")
    with torch.no_grad():
        torch.testing.assert_close(ContextI2WMapper.load(tmp_path / "m")(c, x), m(c, x), atol=0, rtol=0)
    assert no_decay("ln_post.weight") and no_decay("fc_out.bias") and not no_decay("VT_Extractor.norm.weight")


def test_the_warm_up_is_exactly_the_steps_asked():
    from foco.train.loop import lr_factor
    for steps in range(1, 400, 7):
        for warm in range(0, steps + 3):
            frac = (warm + 0.5) / steps  # what train_context_i2w gives the loop
            got = next((s for s in range(steps) if lr_factor(s, steps, frac) >= 1.0 - 1e-12), steps)
            assert got == max(1, warm) - 1 or warm > steps, (steps, warm, got)


@pytest.mark.slow
def test_train_from_the_cli_then_eval(tiny_world, small_world, train_features, eval_features, tmp_path,
                                             capsys):
    out, res = tmp_path / "ci", tmp_path / "r.json"
    # the features of another world are refused before any work: the ids would name other images
    assert main(["context-i2w", "train", "--features", str(train_features), "--world", str(small_world), "--out",
                 str(tmp_path / "other")]) == 2
    assert "holds features of world" in capsys.readouterr().err
    assert main(["context-i2w", "train", "--features", str(train_features), "--world", str(tiny_world), "--out",
                 str(out), "--epochs", "1", "--batch-size", "256", "--warmup-steps", "2"]) == 0
    meta = json.loads((out / "context_i2w.json").read_text())
    assert meta["model"] == "context-i2w" and not meta["added_decompositions"] and meta["pairs"] == 600
    from foco.cli import build_parser  # the +AD flag reaches the trainer (its pairs: the test above)
    assert build_parser().parse_args(["context-i2w", "train", "--features", "f", "--world", "w", "--out", "o",
                                      "--add-decompositions"]).add_decompositions
    assert meta["config"]["image_dim"] == meta["config"]["context_dim"]  # the joint space, both
    capsys.readouterr()
    assert main(["eval", "--world", str(tiny_world), "--features", str(eval_features), "--protocols", "single",
                 "--methods", "context-i2w,text", "--context-i2w", str(out), "--out", str(res)]) == 0
    m = json.loads(res.read_text())["methods"]
    assert m["context-i2w"] != m["text"] and 0 <= m["context-i2w"]["R@1"] <= 100
    assert main(["eval", "--world", str(tiny_world), "--features", str(eval_features), "--protocols", "single",
                 "--methods", "context-i2w", "--out", str(res)]) == 2
    assert "--context-i2w" in capsys.readouterr().err
