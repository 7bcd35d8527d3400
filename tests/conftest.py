import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    """The `tiny` world, generated once per test session through the CLI."""
    from foco.cli import main
    out = tmp_path_factory.mktemp("world") / "tiny"
    assert main(["world", "generate", "--out", str(out), "--size", "tiny"]) == 0
    return out


@pytest.fixture(scope="session")
def train_features(tiny_world, tmp_path_factory):
    """The tiny world's training split encoded once per session by a small random world backbone, at precision
    auto (bf16 where the CPU has it natively: half the frozen text encoder's time)."""
    import torch
    from foco import create_backbone
    from foco.backbones.world import WorldCLIP, save_world_checkpoint
    from foco.features import ExtractConfig
    from foco.world.splits import extract_world_split
    from test_train import SMALL
    root = tmp_path_factory.mktemp("train-feats")
    torch.manual_seed(0)
    save_world_checkpoint(WorldCLIP(SMALL), root / "bb")
    extract_world_split(create_backbone(f"world:{root / 'bb'}"), tiny_world, "train", root / "f",
                        ExtractConfig(precision="auto"), include_captions=False)
    return root / "f"


@pytest.fixture(scope="session")
def edit_table(tiny_world, train_features, tmp_path_factory):
    from foco import create_backbone
    from foco.decompose.inputs import read_captions
    from foco.edits.rule import RuleWriter
    from foco.edits.run import GenerateConfig, run_generate
    from foco.edits.store import EditStore
    from foco.features import ExtractConfig, FeatureCache
    from foco.train.edit_data import build_edit_table, encode_edit_texts
    root = tmp_path_factory.mktemp("edits")
    sources = [(r.id, r.truth) for r in read_captions(tiny_world, split="train")]
    stats = run_generate(sources, RuleWriter(), root / "e.sqlite", GenerateConfig(per_caption=2))
    with EditStore(root / "e.sqlite") as store:
        records = store.records(stats.settings_id)
    backbone = create_backbone(FeatureCache(train_features).manifest["backbone"])
    encode_edit_texts(backbone, records, root / "texts", cfg=ExtractConfig(precision="auto"))
    return build_edit_table(train_features, root / "texts", records)


@pytest.fixture(scope="session")
def eval_features(tiny_world, train_features, tmp_path_factory):
    """test/single and test/multi of the tiny world, encoded with the training features' backbone."""
    from foco import create_backbone
    from foco.features import FeatureCache
    from foco.world.splits import extract_world_split
    root = tmp_path_factory.mktemp("eval-feats")
    backbone = create_backbone(FeatureCache(train_features).manifest["backbone"])
    for protocol in ("single", "multi"):
        extract_world_split(backbone, tiny_world, f"test/{protocol}", root / f"test-{protocol}")
    return root


@pytest.fixture(scope="session")
def four_image_index(tiny_world, tmp_path_factory):
    """An index of 4 of the tiny world's images with world:pretrained, built once per session; open it read-only."""
    import shutil
    from foco.search.build import IndexConfig, build_index
    root = tmp_path_factory.mktemp("four-image-index")
    (root / "imgs").mkdir()
    for p in sorted((tiny_world / "images").rglob("*.png"))[:4]:
        shutil.copy(p, root / "imgs" / p.name)
    build_index(IndexConfig(images=str(root / "imgs"), backbone="world:pretrained"), root / "idx")
    return root / "idx"
