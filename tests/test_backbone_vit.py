"""The world's ViT backbone (issue 39): transformers' own CLIP vision tower, read exactly as foco reads CLIP ViT."""
import pytest
import torch

from foco import create_backbone
from foco.backbones.hf import clip_vit_read
from foco.backbones.world import WorldBackboneConfig, WorldCLIP, save_world_checkpoint
from foco.utils.io import load_image
from foco.world import load_pairs

VIT = WorldBackboneConfig(image_tower="vit", vit_width=32, vit_layers=2, vit_heads=4, embed_dim=32, text_width=32,
                          text_layers=1, text_heads=2)


def test_vit_tower_is_transformers_clip_read_as_hf_reads_it():
    from transformers import CLIPVisionModelWithProjection
    torch.manual_seed(0)
    model = WorldCLIP(VIT).eval()
    assert isinstance(model.image.clip, CLIPVisionModelWithProjection)
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        global_, patches = model.image(x)  # (3, 32), (3, 64, 32)
        out = model.image.clip(pixel_values=x)
        h = out.last_hidden_state  # (3, 65, 32)
        proj = model.image.clip.visual_projection
        # the global is transformers' own image embedding (what get_image_features returns)
        assert torch.allclose(global_, out.image_embeds, atol=1e-6)
        # the patches are the last layer's patch tokens through the same final norm and projection
        want = proj(model.image.clip.vision_model.post_layernorm(h[:, 1:]))
        assert torch.allclose(patches, want, atol=1e-6)
        # the shared reading, as HFBackbone calls it
        g2, p2 = clip_vit_read(model.image.clip.vision_model, proj, h)
        assert torch.equal(g2, global_) and torch.equal(p2, patches)
    assert VIT.num_patches == 64


def test_vit_checkpoint_loads_through_registry(tmp_path, tiny_world):
    torch.manual_seed(0)
    save_world_checkpoint(WorldCLIP(VIT), tmp_path)
    bb = create_backbone(f"world:{tmp_path}")
    assert bb.cfg.image_tower == "vit" and bb.embed_dim == 32 and bb.num_patches == 64
    pairs = load_pairs(tiny_world, "train")[:3]
    ims = [load_image(p.image) for p in pairs]
    im = bb.encode_images(ims)
    assert im.global_.shape == (3, 32) and im.patches.shape == (3, 64, 32)
    assert torch.allclose(im.global_.norm(dim=-1), torch.ones(3), atol=1e-5)
    one = bb.encode_images(ims[:1])  # batching does not change an image's features
    assert torch.allclose(one.patches[0], im.patches[0], atol=1e-5)


def test_old_config_without_tower_is_a_cnn():
    cfg = WorldBackboneConfig(widths=(8, 16, 32), embed_dim=32)
    assert cfg.image_tower == "cnn" and cfg.num_patches == 64
    with pytest.raises(ValueError, match="image_tower"):
        WorldBackboneConfig(image_tower="resnet")
    with pytest.raises(ValueError, match="patch_size"):
        WorldBackboneConfig(image_tower="vit", patch_size=7)


def test_shipped_vit_loads_with_its_sha256():
    bb = create_backbone("world:vit")
    assert bb.spec == "world:vit" and bb.cfg.image_tower == "vit"
    assert bb.weights_sha256 and len(bb.weights_sha256) == 64
    cnn = create_backbone("world:pretrained")
    assert cnn.cfg.image_tower == "cnn" and cnn.weights_sha256 != bb.weights_sha256
