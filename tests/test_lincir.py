"""LinCIR (issue 40): the reference's masking, phi's layout, the objective against a per-caption twin, training
from the CLI on a world's captions (with and without the +AD control) and evaluation as a registered method."""
from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from foco.cli import main
from foco.methods.lincir import LinCIRConfig, LinCIRPhi
from foco.train.lincir import LinCIRObjective, clean_caption, mask_caption, rejoin


def test_masking_follows_the_reference_loop():
    rng = random.Random(0)
    caption = "a picture of a large red circle and a small star on a beach"
    runs = ["a picture", "a large red circle", "a small star", "a beach"]
    assert mask_caption(caption, runs, rng) == "* of * and * on *"
    # a run missing from the caption: one random word is replaced instead, and the loop stops there
    # (the word is replaced as a substring, every occurrence, as the reference's str.replace does)
    out = mask_caption(caption, ["a picture", "blue square", "a beach"], random.Random(3))
    words = caption.split(" ")
    assert out.startswith("* of ") and out.count("*") >= 2
    assert any(out == "* of " + caption[len("a picture of "):].replace(w, "*") for w in words)
    assert mask_caption("", [], rng) == "*"  # "".split(" ") is [""]: the empty word is replaced, as the reference
    assert mask_caption("run fast", ["slowly"], random.Random(1)) in ("* fast", "run *")
    assert clean_caption("  A *Star* ") == "a star"
    assert rejoin("a large red circle", "a picture of a small star on a beach") == \
        "a picture of a small star on a beach with a large red circle"


class SearlePhi(nn.Module):
    """The reference's phi (SEARLE's), written from its description: `layers` = Linear, GELU, Dropout, Linear,
    GELU, Dropout, Linear."""

    def __init__(self, d, h, e, p):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Dropout(p), nn.Linear(h, h), nn.GELU(),
                                    nn.Dropout(p), nn.Linear(h, e))

    def forward(self, x):
        return self.layers(x)


def test_a_reference_phi_loads_as_it_is_and_round_trips(tmp_path):
    torch.manual_seed(0)
    ref = SearlePhi(16, 64, 12, 0.5).eval()
    phi = LinCIRPhi(LinCIRConfig(embed_dim=16, token_dim=12)).eval()
    phi.load_state_dict(ref.state_dict())
    x = torch.randn(5, 16) * 4
    with torch.no_grad():
        torch.testing.assert_close(phi(x), ref(x), atol=1e-6, rtol=0)
        phi.save(tmp_path / "lc")
        torch.testing.assert_close(LinCIRPhi.load(tmp_path / "lc")(x), ref(x), atol=1e-6, rtol=0)
    (tmp_path / "lc" / "lincir.json").write_text(json.dumps({"model": "pic2word", "config": {}}))
    with pytest.raises(ValueError, match="not a LinCIR checkpoint"):
        LinCIRPhi.load(tmp_path / "lc")


def test_the_objective_matches_a_caption_by_caption_twin(tiny_world):
    from foco import create_backbone
    backbone = create_backbone("world:pretrained")
    texts = ["a large red circle on a beach", "a small blue star in the snow", "a photo showing a green heart"]
    masked = ["* on *", "* in *", "* showing *"]
    f = backbone.encode_texts(texts)
    e = f.global_ * f.norm[:, None]
    noisy = e + 0.3 * torch.randn(e.shape, generator=torch.Generator().manual_seed(0))
    phi = LinCIRPhi(LinCIRConfig(embed_dim=e.shape[1], token_dim=backbone.token_dim)).eval()
    with torch.no_grad():
        loss = LinCIRObjective(phi, backbone)(e, noisy, masked)["loss"]
        errs = []
        for i in range(3):  # one caption at a time: every placeholder reads phi of its caption's noisy embedding
            t = backbone.encode_texts_with_tokens([masked[i]], phi(noisy[i:i + 1]), "*")
            errs.append(((t.global_ * t.norm[:, None])[0] - e[i]).pow(2))
        twin = torch.stack(errs).mean()
    assert abs(float(loss) - float(twin)) < 1e-5
    # the raw norm the objective regresses on is the global's own length
    assert torch.allclose(F.normalize(e, dim=-1), f.global_, atol=1e-6)


@pytest.mark.slow
def test_train_and_evaluate_from_the_cli(tiny_world, small_world, trainer_runs, eval_features, tmp_path, capsys):
    import shutil
    from foco.features import FeatureCache
    from foco.train.lincir import lincir_captions
    from foco.world.manifest import load_pairs
    spec = FeatureCache(eval_features / "test-single").manifest["backbone"]  # the features' own backbone
    out = tmp_path / "lc"
    # `foco lincir train --world tiny --backbone <spec> --epochs 1 --batch-size 64`, run once for the whole suite
    # (tests/trainer_runs.py; the goldens test hashes it); copied, since this test continues it
    shutil.copytree(trainer_runs / "lincir", out)
    meta = json.loads((out / "lincir.json").read_text())
    assert meta["captions"] == 600 and meta["backbone"] == spec and not meta["added_decompositions"]
    # +AD: the decomposition pairs, rejoined, join the captions: `foco lincir train --world <the small world>
    # --add-decompositions --seed 1`, also run once for the suite (tests/trainer_runs.py)
    meta_ad = json.loads((trainer_runs / "lincir-ad" / "lincir.json").read_text())
    plain = len(load_pairs(small_world, "train"))
    assert meta_ad["captions"] == len(lincir_captions(small_world, "train", True)) > plain == 192
    assert meta_ad["added_decompositions"] and meta_ad["backbone"] == spec
    # a phi written into another backbone's text tower (world:pretrained), for the refusal below
    from foco import create_backbone
    from foco.train.lincir import LinCIRTrainConfig, train_lincir
    other = tmp_path / "lc-other"
    captions = [f"a {c} star on a beach" for c in ("red", "blue", "green", "pink")]
    train_lincir(captions, create_backbone("world:pretrained"), other,
                 LinCIRTrainConfig(epochs=1, batch_size=4, model=LinCIRConfig(hidden_ratio=1)), nlp=_NoRunNLP())
    assert main(["lincir", "train", "--world", str(tiny_world), "--backbone", spec, "--out", str(out),
                 "--epochs", "1"]) == 2  # a finished run is continued, and another batch size is refused
    assert "--restart" in capsys.readouterr().err
    res = tmp_path / "r.json"
    assert main(["eval", "--world", str(tiny_world), "--features", str(eval_features), "--protocols", "single",
                 "--methods", "lincir,text", "--lincir", str(out), "--out", str(res)]) == 0
    m = json.loads(res.read_text())["methods"]
    assert m["lincir"] != m["text"] and 0 <= m["lincir"]["R@1"] <= 100
    capsys.readouterr()
    assert main(["eval", "--world", str(tiny_world), "--features", str(eval_features), "--protocols", "single",
                 "--methods", "lincir", "--out", str(res)]) == 2  # no --lincir: its flag is named
    assert "--lincir" in capsys.readouterr().err
    assert main(["eval", "--world", str(tiny_world), "--features", str(eval_features), "--protocols", "single",
                 "--methods", "lincir", "--lincir", str(other), "--out", str(res)]) == 2  # another backbone's phi
    assert "backbones differ" in capsys.readouterr().err


class _NoRunNLP:
    """A spaCy stand-in whose one keyword run never occurs in the caption: every read falls back to a random word."""

    def __call__(self, text):
        from types import SimpleNamespace
        return [SimpleNamespace(text="zzz", pos_="NOUN")]


def test_a_killed_run_resumes_to_the_uninterrupted_weights(monkeypatch, tmp_path):
    """The noise, the fallback words (every read here) and phi's dropout continue their streams on --resume."""
    from foco import create_backbone
    from foco.train import harness
    from foco.train.lincir import LinCIRTrainConfig, train_lincir
    from foco.train.loop import run as loop_run
    backbone = create_backbone("world:pretrained")
    captions = [f"a {c} {s} on a {b}" for c in ("red", "blue", "green") for s in ("circle", "star", "heart")
                for b in ("beach", "road")]  # 18 captions
    cfg = LinCIRTrainConfig(epochs=3, batch_size=6, seed=5, model=LinCIRConfig(hidden_ratio=1))
    straight = train_lincir(captions, backbone, tmp_path / "straight", cfg, nlp=_NoRunNLP())

    class Killed(Exception):
        pass

    def killed_after_one_epoch(*args, **kwargs):
        def on_epoch(rec):
            raise Killed
        return loop_run(*args, on_epoch=on_epoch, **kwargs)
    monkeypatch.setattr(harness, "run", killed_after_one_epoch)
    with pytest.raises(Killed):
        train_lincir(captions, backbone, tmp_path / "killed", cfg, nlp=_NoRunNLP())
    monkeypatch.setattr(harness, "run", loop_run)
    resumed = train_lincir(captions, backbone, tmp_path / "killed", cfg, resume=True, nlp=_NoRunNLP())
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    # and the fallback word does matter: another seed's stream gives other weights
    other = train_lincir(captions, backbone, tmp_path / "other", LinCIRTrainConfig(
        epochs=3, batch_size=6, seed=6, model=LinCIRConfig(hidden_ratio=1)), nlp=_NoRunNLP())
    assert not torch.equal(other.state_dict()["layers.0.weight"], straight.state_dict()["layers.0.weight"])


def test_batched_keyword_runs_are_the_one_caption_runs(tiny_world):
    """The trainer parses its captions in batches without the parser (`keyword_runs_all`); its slow twin parses one
    caption at a time with the whole pipeline."""
    from foco.decompose.rule import load_spacy
    from foco.train.lincir import keyword_runs, keyword_runs_all, lincir_captions
    nlp = load_spacy()
    before = (list(nlp.pipe_names), list(nlp.disabled))
    captions = [clean_caption(c) for c in lincir_captions(tiny_world, "train", add_decompositions=True)[::7]]
    captions += ["", "the old man's dog, and a very big red ball!", "Paris in the spring"]
    assert keyword_runs_all(nlp, captions, batch_size=16) == [keyword_runs(nlp, c) for c in captions]
    assert (list(nlp.pipe_names), list(nlp.disabled)) == before  # the caller's pipeline is left as it was
