"""SlerpTAT (issue 57): text-anchored tuning of the image tower (LoRA, the text tower frozen), its backbone
`tat:PATH` with the adapters merged, and its features kept apart from the untuned base's."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from foco import create_backbone
from foco.backbones.world import WorldBackboneConfig, WorldCLIP, save_world_checkpoint
from foco.utils.io import load_image
from foco.world import load_pairs

VIT = WorldBackboneConfig(image_tower="vit", vit_width=32, vit_layers=2, vit_heads=4, embed_dim=32, text_width=32,
                          text_layers=1, text_heads=2)


@pytest.fixture(scope="module")
def tuned(tiny_world, tmp_path_factory):
    """A tiny ViT world backbone and a TAT run of 2 steps on 32 of the tiny world's training pairs."""
    pytest.importorskip("peft")
    from foco.train.tat import TATTrainConfig, train_tat
    root = tmp_path_factory.mktemp("tat")
    torch.manual_seed(0)
    save_world_checkpoint(WorldCLIP(VIT), root / "base")
    pairs = load_pairs(tiny_world, "train")[:32]
    rec = train_tat(f"world:{root / 'base'}", [p.image for p in pairs], [p.caption for p in pairs], root / "tat",
                    TATTrainConfig(epochs=1, batch_size=16, lr=5e-2, rank=8, alpha=32.0), resume=False)  # scale 4
    return root, rec, [load_image(p.image) for p in pairs[:6]]


def test_tat_loss_is_the_sum_of_both_directions():
    from foco.train.tat import tat_loss
    torch.manual_seed(0)
    v, t = F.normalize(torch.randn(5, 8), dim=-1), F.normalize(torch.randn(5, 8), dim=-1)
    s, want = 14.0, 0.0
    for i in range(5):  # the obvious twin: each row's image -> texts and text -> images softmax
        want -= torch.log_softmax(s * v[i] @ t.t(), 0)[i] / 5
        want -= torch.log_softmax(s * t[i] @ v.t(), 0)[i] / 5
    assert torch.allclose(tat_loss(v, t, s), want, atol=1e-6)


def test_the_tuned_backbone_merges_the_adapters_as_peft_applies_them(tuned):
    from peft import LoraConfig, inject_adapter_in_model
    from safetensors.torch import load_file
    root, rec, images = tuned
    tat = create_backbone(f"tat:{root / 'tat'}")
    base = create_backbone(f"world:{root / 'base'}")
    # the slow twin: the untouched base with peft's adapters injected and the saved A, B loaded into them
    vision = base.model.image.clip.vision_model
    inject_adapter_in_model(LoraConfig(r=8, lora_alpha=32.0, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]),
                            vision)
    state = load_file(str(root / "tat" / "tat.safetensors"))
    modules = dict(vision.named_modules())
    assert len(state) == 2 * 2 * VIT.vit_layers  # q and v of each layer, A and B each
    with torch.no_grad():
        for key, value in state.items():
            name, part = key.rsplit(".", 1)
            getattr(modules[name], part)["default"].weight.copy_(value)
    base.model.eval()
    merged, peft_out = tat.encode_images(images), base.encode_images(images)
    assert torch.allclose(merged.global_, peft_out.global_, atol=1e-5)
    assert torch.allclose(merged.patches, peft_out.patches, atol=1e-5)
    assert rec["lora"]["parameters"] == sum(v.numel() for v in state.values())


def test_tuning_moves_the_images_and_leaves_the_text_tower(tuned):
    root, rec, images = tuned
    tat = create_backbone(f"tat:{root / 'tat'}")
    base = create_backbone(f"world:{root / 'base'}")
    texts = ["a photo showing a red star", "a blue circle"]
    assert torch.equal(tat.encode_texts(texts).global_, base.encode_texts(texts).global_)
    assert (tat.encode_images(images).global_ - base.encode_images(images).global_).abs().max() > 1e-3
    assert tat.spec == f"tat:{(root / 'tat').resolve()}" and tat.weights_sha256 != base.weights_sha256
    assert rec["backbone"] == {"spec": tat.spec, "weights_sha256": tat.weights_sha256}
    assert rec["base"] == {"spec": base.spec, "weights_sha256": base.weights_sha256}


def test_tuned_and_untuned_features_are_refused_together_naming_both(tuned):
    from foco.backbones import backbone_record, check_same_backbone
    from foco.methods import MethodOptions
    from foco.methods.provenance import check_trained_on
    root, _, _ = tuned
    tat_dir = root / "tat"
    base = create_backbone(f"world:{root / 'base'}")
    tat = create_backbone(f"tat:{tat_dir}")
    # slerp-tat's folder beside the untuned base's features
    with pytest.raises(ValueError, match=r"--tat .*tat:.*world:"):
        check_trained_on(MethodOptions(tat=tat_dir), base, "the untuned features", "extract them with tat:")
    check_trained_on(MethodOptions(tat=tat_dir), tat, "the tuned features", "")  # its own features pass
    # the reverse: tuned features where the base's are wanted (a cache, index or weights recording the base)
    with pytest.raises(ValueError, match=r"backbones differ: the tuned features is of tat:.*world:"):
        check_same_backbone(backbone_record(tat), "the tuned features", backbone_record(base), "the base", "")


def test_slerp_tat_needs_its_folder_and_composes_as_slerp(tuned):
    from foco.methods import build_method
    from foco.methods.base import QueryBatch
    from foco.backbones.base import ImageFeatures, TextFeatures
    root, _, _ = tuned
    with pytest.raises(ValueError, match="slerp-tat needs --tat"):
        build_method("slerp-tat", slerp_alpha=0.5)
    torch.manual_seed(0)
    v, t = F.normalize(torch.randn(3, 8), dim=-1), F.normalize(torch.randn(3, 8), dim=-1)
    batch = QueryBatch(ImageFeatures(v, torch.zeros(3, 1, 8)), TextFeatures(t, torch.zeros(3, 1, 8),
                                                                             torch.ones(3, 1, dtype=torch.bool)), [""] * 3)
    a = build_method("slerp-tat", tat=root / "tat", slerp_alpha=0.3).encode(batch).query
    b = build_method("slerp", slerp_alpha=0.3).encode(batch).query
    assert torch.equal(a, b)


def test_changed_adapters_or_base_are_refused(tuned, tmp_path):
    import shutil
    root, _, _ = tuned
    bad = tmp_path / "bad"
    shutil.copytree(root / "tat", bad)
    data = bytearray((bad / "tat.safetensors").read_bytes())
    data[-1] ^= 1
    (bad / "tat.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="tat.safetensors: sha256 .* differs"):
        create_backbone(f"tat:{bad}")
    shutil.copy(root / "tat" / "tat.safetensors", bad / "tat.safetensors")
    rec = json.loads((bad / "tat.json").read_text())
    rec["base"]["weights_sha256"] = "0" * 64
    (bad / "tat.json").write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="other weights"):
        create_backbone(f"tat:{bad}")
    rec = json.loads((root / "tat" / "tat.json").read_text())
    rec["lora"]["alpha"] = 320.0  # an edited scale would give other features under the same sha256: refused
    (bad / "tat.json").write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="record was edited"):
        create_backbone(f"tat:{bad}")
    rec["base"] = {"spec": f"tat:{root / 'tat'}"}
    (bad / "tat.json").write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="itself a tuned backbone"):
        create_backbone(f"tat:{bad}")
    with pytest.raises(FileNotFoundError, match="foco tat train"):
        create_backbone(f"tat:{tmp_path / 'none'}")


def test_a_moved_tat_folder_is_the_backbone_of_its_own_features(tuned, tmp_path):
    import shutil
    from foco.methods import MethodOptions
    from foco.methods.provenance import check_trained_on, recorded_spec
    root, _, _ = tuned
    moved = tmp_path / "moved"
    shutil.copytree(root / "tat", moved)
    assert recorded_spec(MethodOptions(tat=moved)) == f"tat:{moved.resolve()}"  # not the folder it was trained in
    check_trained_on(MethodOptions(tat=moved), create_backbone(f"tat:{moved}"), "its features", "")


def test_a_cnn_backbone_is_refused_with_the_vit_named():
    from foco.backbones.tat import vision_tower
    with pytest.raises(ValueError, match="world:vit"):
        vision_tower(create_backbone("world:pretrained"))
