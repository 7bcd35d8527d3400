"""`foco quickstart --size tiny` end to end: world, backbone, decompositions, FoCo, edit triplets, foco-edits,
evaluation with slerp's alpha chosen on val, figures."""
import json

import pytest

from foco.cli import main
from foco.train.loop import effective_settings


@pytest.mark.slow
def test_quickstart_tiny(tmp_path, capsys):
    out = tmp_path / "qs"
    assert main(["quickstart", "--out", str(out), "--size", "tiny"]) == 0
    printed = capsys.readouterr().out
    assert "| foco |" in printed and "| sum |" in printed and "| foco-edits |" in printed and "| slerp |" in printed
    assert "not in the FoCo paper" in printed
    res = json.loads((out / "results.json").read_text())
    assert res["benchmark"] == "world-tiny/test"
    assert list(res["methods"]) == ["foco", "foco-edits", "slerp", "image", "text", "sum"]
    assert set(res["chosen_on_val"]) == {"slerp alpha (single)", "slerp alpha (multi)"}
    meta = json.loads((out / "foco-edits" / "foco.json").read_text())
    assert "not in the FoCo paper" in meta["recipe"] and effective_settings(meta)["stage3_epochs"] == 4
    assert meta["train"]["stage3_epochs"] == 0  # the paper run it resumed from: the edit stage is a recorded change
    assert meta["train_changes"][0]["at"] == {"stage": 3, "epoch": 1}
    assert "recipe" not in json.loads((out / "foco" / "foco.json").read_text())  # plain FoCo stays the paper's
    for m in res["methods"].values():
        assert set(m) == {"R@1", "R@5", "R@10", "R@50", "Rs@1", "Rs@2", "Rs@3", "mAP@5", "mAP@10", "mAP@25", "mAP@50"}
        assert all(0 <= v <= 100 for v in m.values())
        assert m["R@1"] <= m["R@5"] <= m["R@10"] <= m["R@50"] and m["Rs@1"] <= m["Rs@2"] <= m["Rs@3"]
    figs = sorted((out / "figures").glob("*.png"))
    assert len(figs) >= 5 and (out / "figures" / "r1_by_edit_type.png").is_file()
    assert (out / "foco" / "loss_curve.png").is_file() and (out / "foco-edits" / "loss_curve.png").is_file()
    assert res["backbone"] == "world:vit" and not (out / "backbone").exists()
    assert res["precision"] in ("fp32", "bf16")
    precision = ["--precision", res["precision"]]
    if res.get("index"):  # foco serve works right after the demo: an index of the test gallery, features reused
        index = json.loads((out / "index" / "index.json").read_text())
        assert index["count"] == res["protocols"]["single"]["gallery"] and index["backbone"] == "world:vit"
        assert index["last_run"]["skipped"] == 0
    # a second run reuses every stage and gives the same numbers
    assert main(["quickstart", "--out", str(out), "--size", "tiny"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["methods"] == res["methods"]
    assert again["timings_s"]["foco_train_s"] < 10
    assert again["timings_s"]["foco_edits_s"] < 10

    # the field side by side on the same cached features: Pic2Word trained on the run's train features, slerp and
    # Chord with their parameters chosen on val
    assert main(["pic2word", "train", "--features", str(out / "features" / "train"), "--out", str(out / "p2w"),
                 "--epochs", "5"]) == 0
    spec = json.loads((out / "foco" / "foco.json").read_text())["backbone"]
    # it learned its task on the trained tiny backbone: held-out image -> "a photo of *" far above chance
    import torch
    from foco import create_backbone
    from foco.features import FeatureCache
    from foco.methods.pic2word import Pic2WordMethod
    held_out = FeatureCache(out / "features" / "test-single").images()[1].global_[:128]  # (N, D)
    mapper, bb = Pic2WordMethod.load(out / "p2w").mapper, create_backbone(spec)
    with torch.no_grad():
        prompts = bb.encode_texts_with_tokens(["a photo of *"] * len(held_out), mapper(held_out)).global_
    hits = (torch.argmax(held_out @ prompts.T, 1) == torch.arange(len(held_out))).float().mean().item()
    assert hits > 10 / len(held_out), hits  # chance is 1 / 128
    for protocol in ("single", "multi"):
        assert main(["features", "extract", "--backbone", spec, "--world", str(out / "world"), "--split",
                     f"val/{protocol}", "--out", str(out / "features" / f"val-{protocol}"), *precision]) == 0
    capsys.readouterr()
    field = ["eval", "--world", str(out / "world"), "--features", str(out / "features"), "--checkpoint",
             str(out / "foco"), "--methods", "foco,pic2word,slerp,sum,image,text", "--pic2word", str(out / "p2w")]
    assert main(field + ["--out", str(out / "field.json")]) == 0
    plain = json.loads((out / "field.json").read_text())
    assert list(plain["methods"]) == ["foco", "pic2word", "slerp", "sum", "image", "text"]
    for name in ("foco", "slerp", "sum", "image", "text"):  # same features, same numbers as the quickstart's table
        assert plain["methods"][name] == res["methods"][name]
    assert "slerp alpha (single)" in plain["chosen"]
    assert main(field + ["--chord", "0", "--out", str(out / "chord0.json")]) == 0
    assert json.loads((out / "chord0.json").read_text())["methods"] == plain["methods"]  # lambda 0 = cosine
    assert main(field + ["--chord", "val", "--out", str(out / "chord.json")]) == 0
    chord = json.loads((out / "chord.json").read_text())
    assert {f"chord lambda {n} (single)" for n in plain["methods"]} <= set(chord["chosen"])
    printed = capsys.readouterr().out
    assert "| pic2word |" in printed and "Chord" in printed

    # the same methods through the official-format path: the world exported as CIRR, read back by `--benchmark cirr`
    assert main(["world", "export", "--world", str(out / "world"), "--format", "cirr", "--split", "val",
                 "--out", str(out / "cirr")]) == 0
    assert main(["eval", "--benchmark", "cirr", "--root", str(out / "cirr"), "--split", "val", "--checkpoint",
                 str(out / "foco"), "--methods", "pic2word,slerp", "--pic2word", str(out / "p2w"), "--slerp-alpha",
                 "0.4", "--cache", str(out / "cache"), "--out", str(out / "cirr.json"), *precision]) == 0
    official = json.loads((out / "cirr.json").read_text())["parts"]["cirr"]["methods"]
    assert main(field[:-4] + ["--split", "val", "--protocols", "single", "--methods", "pic2word,slerp",
                              "--pic2word", str(out / "p2w"), "--slerp-alpha", "0.4", "--out", str(out / "v.json")]) == 0
    direct = json.loads((out / "v.json").read_text())["methods"]
    for name in ("pic2word", "slerp"):
        for k, v in official[name].items():
            assert abs(v - direct[name][k]) < 1e-6, (name, k, v, direct[name][k])

    # Chord through the official path equals Chord on the world benchmark directly, with the same lambda
    assert main(["eval", "--benchmark", "cirr", "--root", str(out / "cirr"), "--split", "val", "--checkpoint",
                 str(out / "foco"), "--methods", "foco,sum", "--chord", "0.3", "--cache", str(out / "cache"),
                 "--out", str(out / "cirr-chord.json"), *precision]) == 0
    official = json.loads((out / "cirr-chord.json").read_text())["parts"]["cirr"]["methods"]
    assert main(field[:-4] + ["--split", "val", "--protocols", "single", "--methods", "foco,sum", "--chord", "0.3",
                              "--out", str(out / "v-chord.json")]) == 0
    direct = json.loads((out / "v-chord.json").read_text())["methods"]
    for name in ("foco", "sum"):
        for k, v in official[name].items():
            assert abs(v - direct[name][k]) < 1e-6, (name, k, v, direct[name][k])

    # the paper's optional inference variant: T_m decomposed (rule), its first local phrase as F_Aggr's anchor
    assert main(field[:-4] + ["--methods", "foco,foco+rule", "--out", str(out / "dtm.json")]) == 0
    dtm = json.loads((out / "dtm.json").read_text())["methods"]
    assert dtm["foco"] == res["methods"]["foco"]
    assert set(dtm["foco+rule"]) == set(res["methods"]["foco"])  # that the anchor is used: test_decompose.py
