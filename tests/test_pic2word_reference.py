"""Pic2Word as its reference code runs it (issue 26): a mapper in IM2TEXT's state-dict layout gives the reference
mapper's outputs, the reference's query templates are there by name, the reference's optimiser is the default, and
the query template is the method's own option of `foco eval`."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from foco.methods.pic2word import TEMPLATES, Pic2WordConfig, Pic2WordMapper, Pic2WordMethod, resolve_template
from foco.train.pic2word import Pic2WordTrainConfig, make_optimizer


class ReferenceIM2TEXT(nn.Module):
    """The reference's layout, written here from its description: `layers` holds n_layer blocks of (Linear,
    Dropout, ReLU), then `fc_out`; forward runs the blocks in order and projects."""

    def __init__(self, embed_dim: int, middle_dim: int, output_dim: int, n_layer: int = 2, dropout: float = 0.1):
        super().__init__()
        self.fc_out = nn.Linear(middle_dim, output_dim)
        blocks, dim = [], embed_dim
        for _ in range(n_layer):
            blocks.append(nn.Sequential(nn.Linear(dim, middle_dim), nn.Dropout(dropout), nn.ReLU()))
            dim = middle_dim
        self.layers = nn.Sequential(*blocks)

    def forward(self, x):
        for block in self.layers:
            x = block(x)
        return self.fc_out(x)


@pytest.mark.parametrize("prefix", ["", "module."])
def test_an_im2text_state_dict_gives_the_reference_outputs(tmp_path, prefix):
    from safetensors.torch import load_file, save_file
    torch.manual_seed(0)
    ref = ReferenceIM2TEXT(48, 40, 24).eval()
    for p in ref.parameters():  # random weights, not the default init
        nn.init.normal_(p, std=0.3)
    save_file({prefix + k: v.contiguous() for k, v in ref.state_dict().items()}, tmp_path / "im2text.safetensors")
    mapper = Pic2WordMapper.from_im2text(load_file(tmp_path / "im2text.safetensors")).eval()
    assert (mapper.cfg.image_dim, mapper.cfg.hidden_dim, mapper.cfg.token_dim) == (48, 40, 24)
    x = torch.randn(7, 48) * 3.0  # raw (unnormalised) embeddings, as the reference feeds them
    with torch.no_grad():
        torch.testing.assert_close(mapper(x), ref(x), atol=1e-6, rtol=0)
    mapper.save(tmp_path / "p2w")  # and it round-trips as a foco checkpoint
    with torch.no_grad():
        torch.testing.assert_close(Pic2WordMapper.load(tmp_path / "p2w")(x), ref(x), atol=1e-6, rtol=0)


def test_another_layout_is_refused_by_its_keys():
    ref = ReferenceIM2TEXT(8, 8, 8, n_layer=3)
    with pytest.raises(ValueError, match=r"layers\.2\.0\.weight"):
        Pic2WordMapper.from_im2text(ref.state_dict())
    with pytest.raises(ValueError, match="missing"):
        Pic2WordMapper.from_im2text({k: v for k, v in ReferenceIM2TEXT(8, 8, 8).state_dict().items()
                                     if not k.startswith("fc_out")})


def test_templates_by_name_or_text():
    assert resolve_template("pic2word-cirr") == "a photo of * , {}"
    assert resolve_template("searle") == "a photo of * that {}" == Pic2WordConfig().query_template
    assert resolve_template("a sketch of * , {}") == "a sketch of * , {}"
    for bad in ("cirr", "a photo of *", "a photo of *{}", "a photo that {}"):
        with pytest.raises(ValueError, match="--pic2word-template"):
            resolve_template(bad)
    method = Pic2WordMethod(Pic2WordMapper(Pic2WordConfig(image_dim=8, token_dim=8, hidden_dim=8)),
                            query_template="pic2word-cirr")
    assert method.prompts(["make it red"]) == ["a photo of * , make it red"]
    assert set(TEMPLATES) == {"searle", "pic2word-cirr"}


def test_the_reference_optimiser_is_the_default():
    mapper = Pic2WordMapper(Pic2WordConfig(image_dim=8, token_dim=8, hidden_dim=8))
    cfg = Pic2WordTrainConfig()
    assert cfg.optimizer == "reference"
    opt = make_optimizer(mapper, cfg)
    assert isinstance(opt, torch.optim.AdamW)
    no_decay, decay = opt.param_groups
    names = {id(p): n for n, p in mapper.named_parameters()}
    assert sorted(names[id(p)] for p in no_decay["params"]) == ["net.0.bias", "net.3.bias", "net.6.bias"]
    assert sorted(names[id(p)] for p in decay["params"]) == ["net.0.weight", "net.3.weight", "net.6.weight"]
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == cfg.weight_decay
    for g in opt.param_groups:
        assert g["betas"] == (0.9, 0.98) and g["eps"] == 1e-6 and g["lr"] == cfg.lr
    old = make_optimizer(mapper, Pic2WordTrainConfig(optimizer="adamw")).param_groups
    assert len(old) == 1 and old[0]["betas"] == (0.9, 0.999) and old[0]["eps"] == 1e-8
    assert old[0]["weight_decay"] == cfg.weight_decay
    with pytest.raises(ValueError, match="--optimizer"):
        make_optimizer(mapper, Pic2WordTrainConfig(optimizer="sgd"))


def test_the_template_is_the_methods_own_option_of_foco_eval(tiny_world, capsys):
    from foco.cli import main
    from foco.methods import METHODS
    assert [o.flag for o in METHODS.get("pic2word").options] == ["--pic2word", "--pic2word-template"]
    args = ["eval", "--benchmark", "world", "--root", str(tiny_world), "--backbone", "world:pretrained"]
    assert main([*args, "--methods", "image", "--pic2word-template", "pic2word-cirr"]) == 2
    err = capsys.readouterr().err
    assert "--pic2word-template" in err and "pic2word" in err and "Traceback" not in err


def test_the_declared_template_reaches_the_method(tmp_path):
    from foco.methods import MethodOptions, build_method
    Pic2WordMapper(Pic2WordConfig(image_dim=8, token_dim=8, hidden_dim=8)).save(tmp_path / "p2w")
    opts = MethodOptions(pic2word=tmp_path / "p2w", backbone=object())
    assert build_method("pic2word", opts=opts).template == "a photo of * that {}"  # the mapper's recorded one
    chosen = build_method("pic2word", opts=MethodOptions(pic2word=tmp_path / "p2w", backbone=object(),
                                                         query_template="pic2word-cirr"))
    assert chosen.template == "a photo of * , {}"


def test_the_mapper_reads_the_raw_embedding_by_default_and_old_checkpoints_stay_normalized(tmp_path):
    import json
    from foco.backbones.base import ImageFeatures, TextFeatures
    from foco.methods import QueryBatch

    class Tower:  # records what the text tower is given
        def encode_texts_with_tokens(self, texts, embeddings, placeholder="*", keep=None):
            self.tokens = embeddings
            return TextFeatures(torch.nn.functional.normalize(embeddings, dim=-1), embeddings[:, None], None)

    torch.manual_seed(0)
    mapper = Pic2WordMapper(Pic2WordConfig(image_dim=8, token_dim=8, hidden_dim=8)).eval()
    assert mapper.cfg.mapper_input == "raw"
    g = torch.nn.functional.normalize(torch.randn(3, 8), dim=-1)
    norm = torch.tensor([2.0, 5.0, 0.5])
    tower = Tower()
    method = Pic2WordMethod(mapper, tower)
    method.encode(QueryBatch(ImageFeatures(g, torch.empty(3, 0, 8), norm), None, ["a", "b", "c"]))
    with torch.no_grad():
        torch.testing.assert_close(tower.tokens, mapper(g * norm[:, None]))
    with pytest.raises(ValueError, match="--mapper-input normalized"):  # a cache without norms is refused
        method.encode(QueryBatch(ImageFeatures(g, torch.empty(3, 0, 8)), None, ["a", "b", "c"]))
    # a checkpoint written before the option (no mapper_input in its config) read normalised globals
    mapper.save(tmp_path / "old")
    meta = json.loads((tmp_path / "old" / "pic2word.json").read_text())
    del meta["config"]["mapper_input"]
    (tmp_path / "old" / "pic2word.json").write_text(json.dumps(meta))
    old = Pic2WordMethod.load(tmp_path / "old", tower)
    assert old.mapper.cfg.mapper_input == "normalized"
    old.encode(QueryBatch(ImageFeatures(g, torch.empty(3, 0, 8)), None, ["a", "b", "c"]))
    with torch.no_grad():
        torch.testing.assert_close(tower.tokens, mapper(g))


def test_pic2word_train_keeps_the_norms_path_from_cache_to_mapper(train_features, tmp_path, capsys):
    import json
    from foco.cli import main
    assert main(["pic2word", "train", "--features", str(train_features), "--out", str(tmp_path / "p2w"),
                 "--epochs", "1", "--batch-size", "64"]) == 0
    meta = json.loads((tmp_path / "p2w" / "pic2word.json").read_text())
    assert meta["config"]["mapper_input"] == "raw"
    recorded = json.dumps(meta)
    assert '"optimizer": "reference"' in recorded
