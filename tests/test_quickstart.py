"""`foco quickstart --size tiny` end to end: world, backbone, decompositions, FoCo, evaluation, figures."""
import json

from foco.cli import main


def test_quickstart_tiny(tmp_path, capsys):
    out = tmp_path / "qs"
    assert main(["quickstart", "--out", str(out), "--size", "tiny"]) == 0
    printed = capsys.readouterr().out
    assert "| foco |" in printed and "| sum |" in printed
    res = json.loads((out / "results.json").read_text())
    assert res["benchmark"] == "world-tiny/test"
    assert set(res["methods"]) == {"foco", "image", "text", "sum"}
    for m in res["methods"].values():
        assert set(m) == {"R@1", "R@5", "R@10", "R@50", "Rs@1", "Rs@2", "Rs@3", "mAP@5", "mAP@10", "mAP@25", "mAP@50"}
        assert all(0 <= v <= 100 for v in m.values())
        assert m["R@1"] <= m["R@5"] <= m["R@10"] <= m["R@50"] and m["Rs@1"] <= m["Rs@2"] <= m["Rs@3"]
    figs = sorted((out / "attention").glob("*.png"))
    assert len(figs) >= 4
    assert (out / "foco" / "loss_curve.png").is_file() and (out / "backbone" / "metrics.json").is_file()
    # a second run reuses every stage and gives the same numbers
    assert main(["quickstart", "--out", str(out), "--size", "tiny"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["methods"] == res["methods"]
    assert again["timings_s"]["backbone_s"] < 10 and again["timings_s"]["foco_train_s"] < 10
