"""Every registered method composes through the one interface, and the registry itself: lazy, ordered, and clear
about what it does not know."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from foco.backbones.base import ImageFeatures, TextFeatures
from foco.methods import METHODS, MethodOptions, QueryBatch, build_method
from foco.registry import Registry

from test_field import SMALL, world_bb  # noqa: F401  (fixture: a random small world backbone)

NEEDS_SERVER = {"foco+llm"}  # its decomposer talks to an LLM server (test_decompose.py covers it with a fake one)


@pytest.fixture(scope="module")
def options(world_bb, tmp_path_factory):  # noqa: F811
    """A random FoCo checkpoint, Pic2Word mapper and PACT / TSCIR composers on the small world backbone's 32-d space."""
    from foco.methods.pic2word import Pic2WordConfig, Pic2WordMapper
    from foco.model import ComposedQueryEncoder, FoCoConfig
    root = tmp_path_factory.mktemp("methods")
    torch.manual_seed(0)
    ComposedQueryEncoder(FoCoConfig(dim=32, heads=4)).save(root / "foco")
    shutil.copytree(root / "foco", root / "foco-edits")  # as `foco train --edits` records its edit stage
    meta = json.loads((root / "foco-edits" / "foco.json").read_text())
    (root / "foco-edits" / "foco.json").write_text(json.dumps({**meta, "train": {"stage3_epochs": 1}}))
    Pic2WordMapper(Pic2WordConfig(image_dim=32, token_dim=world_bb.token_dim, hidden_dim=16)).save(root / "p2w")
    from foco.methods.lincir import LinCIRConfig, LinCIRPhi
    LinCIRPhi(LinCIRConfig(embed_dim=32, token_dim=world_bb.token_dim, hidden_ratio=1)).save(root / "lincir")
    from foco.methods.searle import SEARLEConfig, SEARLEPhi
    SEARLEPhi(SEARLEConfig(embed_dim=32, token_dim=world_bb.token_dim, hidden_ratio=1)).save(root / "searle")
    from foco.methods.context_i2w import ContextI2WConfig, ContextI2WMapper
    mapper = ContextI2WMapper(ContextI2WConfig(image_dim=32, context_dim=32, token_dim=world_bb.token_dim,
                                               middle_dim=16, vt_depth=1, vt_heads=2, vt_dim_head=8))
    torch.nn.init.constant_(mapper.local_gate, 0.7)  # as trained: the local branch is open
    mapper.save(root / "context-i2w")
    from foco.backbones.tunable import TextTuneConfig
    from foco.train.pact import build_composer
    for method, mapper in (("pact", "pic2word"), ("tscir", "vsi")):
        composer = build_composer(method, mapper, Pic2WordConfig(hidden_dim=16), TextTuneConfig(), world_bb, 32,
                                  patch_dim=32)
        if mapper == "vsi":  # as trained: the injection's output map is no longer its zero start
            torch.nn.init.normal_(composer.mapper.out.weight, std=0.5)
        composer.save(root / method)
    from foco.methods.adafocal import AdaFocalConfig, AdaFocalModel
    from foco.model.caam import CAAMConfig
    AdaFocalModel(AdaFocalConfig(foco=FoCoConfig(dim=32, heads=4), caam=CAAMConfig(dim=32, heads=4))).save(
        root / "adafocal")
    return MethodOptions(checkpoint=root / "foco", foco_edits=root / "foco-edits", pic2word=root / "p2w", slerp_alpha=0.3,
                         pact=root / "pact", tscir=root / "tscir", lincir=root / "lincir", backbone=world_bb,
                         searle=root / "searle", context_i2w=root / "context-i2w",
                         adafocal=root / "adafocal", tat=root / "tat")  # slerp-tat reads no weights itself


def _batch(world_bb, n=5):  # noqa: F811
    g = torch.Generator().manual_seed(1)
    texts = ["make the circle blue", "remove the star", "a cross instead of the heart", "make it bigger",
             "change the background to a beach"][:n]
    tf = world_bb.encode_texts(texts)
    ref = ImageFeatures(torch.nn.functional.normalize(torch.randn(n, 32, generator=g), dim=-1),
                        torch.randn(n, SMALL.image_size // 8 * (SMALL.image_size // 8), 32, generator=g),
                        torch.rand(n, generator=g) + 0.5)  # the raw globals' norms, as caches keep them
    return QueryBatch(ref, TextFeatures(tf.global_, tf.tokens, tf.mask), texts)


@pytest.mark.parametrize("name", [n for n in METHODS.names() if n not in NEEDS_SERVER])
def test_every_registered_method_composes(name, options, world_bb):  # noqa: F811
    method = build_method(name, opts=options)
    batch = _batch(world_bb)
    cq = method.encode(batch)
    assert cq.query.shape == (5, 32) and torch.isfinite(cq.query).all()
    torch.testing.assert_close(cq.query.norm(dim=-1), torch.ones(5), atol=1e-5, rtol=0)
    again = method.encode(QueryBatch(batch.reference, batch.modification, batch.texts))
    torch.testing.assert_close(again.query, cq.query)  # deterministic, no state across calls
    if method.reads_anchor:
        assert cq.attention is not None and cq.attention.shape == (5, batch.reference.patches.shape[1])
    # `reads_patches` is what serving trusts to hand a method the patches: other patches change the query of
    # exactly the methods that say they read them
    other = ImageFeatures(batch.reference.global_, torch.randn_like(batch.reference.patches), batch.reference.norm)
    moved = method.encode(QueryBatch(other, batch.modification, batch.texts)).query
    assert (not torch.allclose(moved, cq.query)) == method.reads_patches, name


def test_methods_that_need_the_text_tower_say_so(options):
    for name in METHODS.names():
        if METHODS.get(name).needs_text_tower and name not in NEEDS_SERVER:
            with pytest.raises(ValueError, match="backbone"):
                build_method(name, opts=options.replace(backbone=None))
    with pytest.raises(ValueError, match="needs --checkpoint"):
        build_method("foco")


def test_registry_is_lazy_ordered_and_clear():
    reg = Registry("widget")
    reg.register("b", "foco.metrics:recall_at_k")
    reg.register("a", len)
    assert reg.names() == ["b", "a"] and "a" in reg and "c" not in reg
    from foco.metrics import recall_at_k
    assert reg.get("b") is recall_at_k and reg.get("a") is len
    with pytest.raises(ValueError, match="unknown widget 'c'; choose from b, a"):
        reg.get("c")
    with pytest.raises(ValueError, match="registered already"):
        reg.register("a", max)
    from foco.backbones import BACKBONES
    from foco.benchmarks import BENCHMARKS
    from foco.decompose import DECOMPOSERS
    assert BACKBONES.names() == ["hf", "world", "tat"] and DECOMPOSERS.names() == ["oracle", "rule", "llm"]
    assert BENCHMARKS.names() == ["fashioniq", "cirr", "circo", "genecis", "world", "oacirr"]
    assert all(callable(BENCHMARKS.get(n).read) for n in BENCHMARKS.names())


def test_a_composer_checkpoint_with_another_methods_mapper_is_refused(options, world_bb, tmp_path):  # noqa: F811
    from foco.backbones.tunable import TextTuneConfig
    from foco.methods.pic2word import Pic2WordConfig
    from foco.train.pact import build_composer
    build_composer("pact", "vsi", Pic2WordConfig(hidden_dim=16), TextTuneConfig(), world_bb, 32,
                   patch_dim=32).save(tmp_path / "pact-vsi")
    with pytest.raises(ValueError, match="retrain it"):  # PACT says it reads no patches; a VSI mapper does
        build_method("pact", opts=options.replace(pact=tmp_path / "pact-vsi"))
