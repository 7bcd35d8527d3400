"""A method declares what it is built from (`MethodOption`s), weights folder included: a new trained method is one
class plus one registry line, and `foco eval`, the provenance checks and serving take it up without other wiring."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from foco.cli import main
from foco.methods import METHODS, MethodOption, MethodOptions, QueryBatch, QueryMethod, build_method, require
from foco.methods.base import plain_query

# --- the whole of a new trained method: this class and the METHODS line in the fixture below ----------------------

WEIGHTS = MethodOption("toy_weights", "--toy-weights", "a folder of a linear map of the text", parse=Path,
                       record="toy.json")


class LinearText(QueryMethod):
    """q = normalize(W t): a trained linear map of the modification text (W = I is text only)."""

    options = (WEIGHTS,)

    def __init__(self, w: torch.Tensor):
        self.w = w  # (D, D)

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "LinearText":
        folder = require(opts, WEIGHTS, "toy")
        return cls(load_file(str(folder / "toy.safetensors"))["w"])

    def encode(self, batch: QueryBatch):
        return plain_query(batch.modification.global_.float() @ self.w.T)  # (B, D)


def _save(folder: Path, w: torch.Tensor, backbone: str) -> Path:
    folder.mkdir(parents=True)
    save_file({"w": w.contiguous()}, str(folder / "toy.safetensors"))
    (folder / "toy.json").write_text(json.dumps({"backbone": backbone}))
    return folder


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(METHODS._entries, "toy", LinearText)  # METHODS.register("toy", ...), undone after the test
    return "toy"


def _spec(train_features) -> str:
    from foco.features import FeatureCache
    return FeatureCache(train_features).manifest["backbone"]


def _eval(world, feats, *extra) -> list[str]:
    return [str(a) for a in ["eval", "--benchmark", "world", "--root", world, "--split", "test", "--features", feats,
                             "--protocols", "single", *extra]]


def test_eval_offers_a_new_methods_weights_flag_and_scores_it(toy, tiny_world, eval_features, train_features,
                                                               tmp_path, capsys):
    dim = 32
    folder = _save(tmp_path / "toy", torch.eye(dim), _spec(train_features))
    out = tmp_path / "r.json"
    assert main(_eval(tiny_world, eval_features, "--methods", "toy,text", "--toy-weights", folder, "--out", out)) == 0
    res = json.loads(out.read_text())["methods"]
    assert res["toy"] == res["text"]  # W = I is text only, metric for metric
    # another W gives other numbers: the weights are read, not ignored
    turned = _save(tmp_path / "toy2", torch.linalg.qr(torch.randn(dim, dim, generator=torch.Generator()
                                                                  .manual_seed(0)))[0], _spec(train_features))
    assert main(_eval(tiny_world, eval_features, "--methods", "toy", "--toy-weights", turned, "--out", out)) == 0
    assert json.loads(out.read_text())["methods"]["toy"] != res["text"]


def _flags(command: str) -> dict[str, str]:
    """flag -> help of `foco COMMAND`'s parser, as built now (the registry as it stands)."""
    from foco.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return {flag: action.help for action in sub.choices[command]._actions for flag in action.option_strings}


def test_a_new_methods_flag_is_offered_by_eval_search_and_serve(toy):
    assert _flags("eval")["--toy-weights"] == "method toy: a folder of a linear map of the text (its record names " \
        "the default --backbone)"
    for command in ("search", "serve"):
        assert "--toy-weights" in _flags(command) and "enables --method toy" in _flags(command)["--toy-weights"]
        assert "--pact" not in _flags(command) and "--tscir" not in _flags(command)  # not served
        assert "--checkpoint" in _flags(command) and "--pic2word" in _flags(command)


def test_the_default_backbone_is_the_one_a_weights_folder_records(toy, tmp_path):
    from foco.methods.provenance import recorded_spec
    assert recorded_spec(MethodOptions()) is None
    folder = _save(tmp_path / "toy", torch.eye(4), "world:/some/backbone")
    assert recorded_spec(MethodOptions(toy_weights=folder)) == "world:/some/backbone"
    from foco.model import ComposedQueryEncoder, FoCoConfig
    ckpt = tmp_path / "ck"
    ComposedQueryEncoder(FoCoConfig(dim=4, heads=1)).save(ckpt, {"backbone": "world:/the/checkpoints"})
    assert recorded_spec(MethodOptions(toy_weights=folder, checkpoint=ckpt)) == "world:/the/checkpoints"  # first


def test_a_new_methods_weights_are_checked_against_the_features(toy, tiny_world, eval_features, tmp_path, capsys):
    folder = _save(tmp_path / "toy", torch.eye(32), "world:/elsewhere/another-backbone")
    assert main(_eval(tiny_world, eval_features, "--methods", "toy", "--toy-weights", folder)) == 2
    err = capsys.readouterr().err
    assert "backbones differ" in err and "--toy-weights" in err and "another-backbone" in err


def test_a_new_method_without_its_weights_names_the_flag(toy, tiny_world, eval_features, capsys):
    assert main(_eval(tiny_world, eval_features, "--methods", "toy")) == 2
    err = capsys.readouterr().err
    assert "method toy needs --toy-weights" in err and "Traceback" not in err


def test_a_weights_folder_without_its_record_is_refused_by_name(toy, tiny_world, eval_features, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(_eval(tiny_world, eval_features, "--methods", "text", "--toy-weights", tmp_path / "empty")) == 2
    err = capsys.readouterr().err
    assert "--toy-weights" in err and "toy.json" in err


def test_serving_offers_a_new_method_once_its_weights_are_given(toy, four_image_index, tmp_path):
    from foco.search.engine import Query, SearchEngine
    idx = four_image_index
    assert "toy" not in SearchEngine.open(idx).available_methods()
    weights = _save(tmp_path / "toy", torch.eye(256), "world:pretrained")
    engine = SearchEngine.open(idx, toy_weights=weights)
    # served after the training-free ones: it does not read the patches the box steers (FoCo's family comes first)
    assert engine.available_methods() == ["slerp", "image", "text", "sum", "toy"]
    got = engine.search(Query(text="make the circle blue", reference=engine.page(0, 1)[0].id, method="toy", k=3))
    text = engine.search(Query(text="make the circle blue", reference=engine.page(0, 1)[0].id, method="text", k=3))
    assert [h.id for h in got.hits] == [h.id for h in text.hits]
    with pytest.raises(ValueError, match="no served method takes the weights toy_weight"):
        SearchEngine.open(idx, toy_weight=weights)
    other = _save(tmp_path / "toy-other", torch.eye(256), "world:/elsewhere/another-backbone")
    with pytest.raises(ValueError, match="backbones differ.*--toy-weights"):
        SearchEngine.open(idx, toy_weights=other)
    assert SearchEngine.open(idx, toy_weights="").available_methods() == \
        SearchEngine.open(idx).available_methods()  # an empty flag is not given


def test_build_method_refuses_an_option_no_method_declares():
    with pytest.raises(ValueError, match="slerp_alfa"):
        build_method("slerp", slerp_alfa=0.4)
    assert build_method("slerp", slerp_alpha=0.4).alpha == 0.4


def test_one_name_is_one_option(monkeypatch):
    from foco.methods import declared_options

    class Clash(QueryMethod):
        options = (MethodOption("checkpoint", "--other-checkpoint", "another flag for the same name"),)

    monkeypatch.setitem(METHODS._entries, "clash", Clash)
    with pytest.raises(ValueError, match="one name, one option"):
        declared_options()


def test_a_strict_option_of_a_method_not_evaluated_is_refused(tiny_world, eval_features, capsys):
    assert main(_eval(tiny_world, eval_features, "--methods", "text", "--pic2word-template", "pic2word-cirr")) == 2
    assert "--pic2word-template is an option of method pic2word" in capsys.readouterr().err


def test_a_non_strict_option_of_a_method_not_evaluated_is_parsed_and_unused(tiny_world, eval_features, tmp_path,
                                                                            capsys):
    out = tmp_path / "r.json"
    assert main(_eval(tiny_world, eval_features, "--methods", "text", "--slerp-alpha", "0.3", "--out", out)) == 0
    assert list(json.loads(out.read_text())["methods"]) == ["text"]
    assert main(_eval(tiny_world, eval_features, "--methods", "text", "--slerp-alpha", "nan")) == 2
    assert "--slerp-alpha" in capsys.readouterr().err


def test_method_options_are_keyword_only_and_replace_lays_values_over():
    with pytest.raises(TypeError):
        MethodOptions(Path("runs/foco"))  # the old first field was the checkpoint: no silent backbone
    base = MethodOptions(backbone="bb", checkpoint=Path("a"), slerp_alpha=0.2)
    new = base.replace(slerp_alpha=0.7, pic2word=None)
    assert (new.get("checkpoint"), new.get("slerp_alpha"), new.get("pic2word"), new.backbone) == \
        (Path("a"), 0.7, None, "bb")
    assert base.get("slerp_alpha") == 0.2 and base.replace(backbone=None).backbone is None
    assert base.replace(checkpoint=None).get("checkpoint") is None  # None: not given


# --- an option chosen on val: declared with a grid, chosen by evaluation for any method -------------------------

MIX = MethodOption("toy_mix", "--toy-mix", "the text's share of the toy mix, or 'val'", parse=str, strict=False,
                   val_grid=(0.0, 0.5, 1.0))


class Mix(QueryMethod):
    """q = normalize((1 - m) v + m t): the toy's one parameter, chosen on val when given as 'val'."""

    options = (MIX,)

    def __init__(self, m: float):
        self.m = m

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "Mix":
        m = opts.get(MIX.name, 0.5)
        assert m != "val", "evaluation builds a method with the chosen value, never with 'val'"
        return cls(float(m))

    def encode(self, batch: QueryBatch):
        v = F.normalize(batch.reference.global_.float(), dim=-1)
        t = F.normalize(batch.modification.global_.float(), dim=-1)
        return plain_query((1 - self.m) * v + self.m * t)  # (B, D)


def test_any_methods_option_with_a_grid_is_chosen_on_val(monkeypatch, tiny_world, eval_features):
    from foco.benchmarks.world import read_world
    from foco.benchmarks.world import world_cache_features
    from foco.eval.evaluate import EvalConfig, evaluate, val_parts
    monkeypatch.setitem(METHODS._entries, "mix", Mix)
    parts = read_world(tiny_world, "test", ("single",))
    feats = world_cache_features(eval_features)
    val = val_parts(lambda: read_world(tiny_world, "test", ("single",)), feats)  # test stands in for val here

    def run(m):
        return evaluate(parts, feats, EvalConfig(methods=("mix",), options=MethodOptions(toy_mix=m), val=val))
    fixed = {m: run(m)["methods"]["mix"]["R@1"] for m in MIX.val_grid}
    best = max(fixed, key=lambda m: (fixed[m], -m))  # the headline metric, ties to the smaller value
    res = run("val")
    assert res["chosen"] == {"toy mix (single)": best}
    assert res["methods"]["mix"]["R@1"] == fixed[best]
    assert len(set(fixed.values())) > 1  # the grid's values do score differently: the choice is not vacuous
