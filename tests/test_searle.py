"""SEARLE (issue 57): the distillation loss against a sample-by-sample twin, phi's layout and record, the world's
concepts and phrases, OTI (it inverts, and a killed run resumes to the uninterrupted tokens), and both stages from
the CLI into `foco eval --methods searle`."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from foco.cli import main
from foco.methods.searle import TEMPLATES, SEARLEConfig, SEARLEPhi
from foco.train.searle import OTIConfig, nt_xent, run_oti
from foco.world.phrases import concept_phrases, usable_concepts, world_concepts


def test_nt_xent_matches_a_sample_by_sample_twin():
    g = torch.Generator().manual_seed(0)
    v1, v2 = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g) * 3
    z = [F.normalize(x, dim=0) for x in torch.cat([v1, v2])]  # 2B samples; i's positive is i +- B
    terms = []
    for j in range(10):
        pos = math.exp(float(z[j] @ z[(j + 5) % 10]) / 0.25)
        den = sum(math.exp(float(z[j] @ z[k]) / 0.25) for k in range(10) if k != j)
        terms.append(-math.log(pos / den))
    assert abs(float(nt_xent(v1, v2, 0.25)) - sum(terms) / 10) < 1e-5


def test_phi_is_the_reference_layout_and_its_record_is_its_own(tmp_path):
    from foco.methods.lincir import LinCIRConfig, LinCIRPhi
    phi = SEARLEPhi(SEARLEConfig(embed_dim=16, token_dim=12)).eval()
    assert [k for k in phi.state_dict()] == [f"layers.{i}.{w}" for i in (0, 3, 6) for w in ("weight", "bias")]
    assert phi.layers[0].out_features == 64 and phi.layers[2].p == 0.5  # hidden 4 x D, dropout 0.5
    phi.save(tmp_path / "s")
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(SEARLEPhi.load(tmp_path / "s")(x), phi(x), atol=0, rtol=0)
    LinCIRPhi(LinCIRConfig(embed_dim=16, token_dim=12)).save(tmp_path / "l")
    with pytest.raises(ValueError, match="searle.json"):
        SEARLEPhi.load(tmp_path / "l")  # a LinCIR folder is no SEARLE folder
    (tmp_path / "s" / "searle.json").write_text(json.dumps({"model": "lincir", "config": {}}))
    with pytest.raises(ValueError, match="not a SEARLE checkpoint"):
        SEARLEPhi.load(tmp_path / "s")
    assert len(TEMPLATES) == 24 and all(t.count("{}") == 1 for t in TEMPLATES)


def test_the_worlds_phrases_name_their_concept_and_the_filter_drops_one_that_does_not():
    concepts = world_concepts()
    assert len(concepts) == len(set(concepts)) == 138 and "red circle" in concepts and "beach" in concepts
    phrases = concept_phrases(concepts, per_concept=16, seed=3)
    assert phrases == concept_phrases(concepts, per_concept=16, seed=3) != concept_phrases(concepts, 16, seed=4)
    assert all(len(ps) == 16 and all(p.startswith(f"a photo of {c} that ") for p in ps) for c, ps in phrases.items())
    assert usable_concepts(phrases, "*") == set(concepts)
    assert usable_concepts({"dog": ["a photo of dog that runs", "a photo that sleeps"]}, "*") == set()


def _images(n: int, d: int = 32) -> torch.Tensor:
    return F.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(1)), dim=-1)


def _cos(backbone, tokens, images):
    f = backbone.encode_texts_with_tokens(["A photo of a  *  "] * len(tokens), tokens, "*", keep=(1, 0)).global_
    return F.cosine_similarity(f, images, dim=-1).mean().item()


def test_oti_inverts_and_a_killed_run_resumes_to_the_same_tokens(train_features, tmp_path, monkeypatch):
    from foco import create_backbone
    from foco.features import FeatureCache
    from foco.train import searle
    backbone = create_backbone(FeatureCache(train_features).manifest["backbone"])
    images = FeatureCache(train_features).images(patches=False)[1].global_[:5]  # (5, D)
    concepts = ("circle", "red circle", "star", "beach")
    phrases = concept_phrases(concepts, per_concept=8)
    cfg = OTIConfig(steps=12, batch_size=4, top_k=2, save_every=1)
    rec = run_oti(images, backbone, concepts, phrases, tmp_path / "a", cfg, show_progress=False)
    assert rec["images"] == 5 and rec["backbone"] == backbone.spec
    done = searle.read_oti(tmp_path / "a")[1]
    assert done["rows"].tolist() == list(range(5)) and done["concepts"].shape == (5, 4)
    init = torch.randn(5, backbone.token_dim, generator=torch.Generator().manual_seed(9)) * 0.02
    with torch.no_grad():
        assert _cos(backbone, done["tokens"], images) > _cos(backbone, init, images) + 0.05
    real, calls = searle.invert_batch, []

    def dies_on_the_second(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)
    monkeypatch.setattr(searle, "invert_batch", dies_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        run_oti(images, backbone, concepts, phrases, tmp_path / "b", cfg, show_progress=False)
    with pytest.raises(FileExistsError, match="holds an OTI run"):
        run_oti(images, backbone, concepts, phrases, tmp_path / "b", cfg, show_progress=False)
    with pytest.raises(ValueError, match="steps"):
        run_oti(images, backbone, concepts, phrases, tmp_path / "b", OTIConfig(steps=5, batch_size=4, top_k=2),
                resume=True, show_progress=False)
    monkeypatch.setattr(searle, "invert_batch", real)
    run_oti(images, backbone, concepts, phrases, tmp_path / "b", cfg, resume=True, show_progress=False)
    again = searle.read_oti(tmp_path / "b")[1]
    for key in ("tokens", "ema", "rows", "concepts"):
        assert torch.equal(again[key], done[key]), key
    assert not (tmp_path / "b" / ".oti-progress.json").exists()
    # a finished folder is reused only for the same images, backbone and settings; a killed run likewise resumes
    # only on the images it began with (else two sets of images would mix)
    with pytest.raises(ValueError, match="other images"):
        run_oti(images.flip(0), backbone, concepts, phrases, tmp_path / "b", cfg, resume=True, show_progress=False)
    with pytest.raises(ValueError, match="steps"):
        run_oti(images, backbone, concepts, phrases, tmp_path / "b", OTIConfig(steps=5, batch_size=4, top_k=2),
                resume=True, show_progress=False)
    monkeypatch.setattr(searle, "invert_batch", dies_on_the_second)
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        run_oti(images, backbone, concepts, phrases, tmp_path / "c", cfg, show_progress=False)
    monkeypatch.setattr(searle, "invert_batch", real)
    with pytest.raises(ValueError, match="other images"):
        run_oti(images.flip(0), backbone, concepts, phrases, tmp_path / "c", cfg, resume=True, show_progress=False)
    (tmp_path / "b" / "oti.safetensors").write_bytes(b"not tensors")
    with pytest.raises(ValueError, match="oti.safetensors"):
        searle.read_oti(tmp_path / "b")


@pytest.mark.slow
def test_both_stages_from_the_cli_then_eval(tiny_world, train_features, eval_features, tmp_path, capsys):
    oti, phi, res = tmp_path / "oti", tmp_path / "phi", tmp_path / "r.json"
    assert main(["searle", "oti", "--features", str(train_features), "--out", str(oti), "--images", "4",
                 "--oti-steps", "2", "--batch-size", "4"]) == 0
    rec = json.loads((oti / "oti.json").read_text())
    assert rec["images"] == 4 and len(rec["concepts"]) == 138 and rec["settings"]["steps"] == 2
    assert main(["searle", "train", "--features", str(train_features), "--oti", str(oti), "--out", str(phi),
                 "--epochs", "2", "--batch-size", "4"]) == 0
    meta = json.loads((phi / "searle.json").read_text())
    assert meta["model"] == "searle" and meta["images"] == 4 and meta["train"]["temperature"] == 0.25
    log = [json.loads(line) for line in (phi / "train_log.jsonl").read_text().splitlines()]
    assert {"loss", "distil", "gpt"} <= set(log[-1])
    capsys.readouterr()
    assert main(["eval", "--world", str(tiny_world), "--features", str(eval_features), "--protocols", "single",
                 "--methods", "searle,text", "--searle", str(phi), "--out", str(res)]) == 0
    m = json.loads(res.read_text())["methods"]
    assert m["searle"] != m["text"] and 0 <= m["searle"]["R@1"] <= 100
    assert main(["eval", "--world", str(tiny_world), "--features", str(eval_features), "--protocols", "single",
                 "--methods", "searle", "--out", str(res)]) == 2  # no --searle: its flag is named
    assert "--searle" in capsys.readouterr().err
    # phi distilled from an unfinished OTI folder is refused, naming the missing file
    (tmp_path / "half").mkdir()
    assert main(["searle", "train", "--features", str(train_features), "--oti", str(tmp_path / "half"), "--out",
                 str(tmp_path / "p2")]) == 2
    assert "oti.json is missing" in capsys.readouterr().err
