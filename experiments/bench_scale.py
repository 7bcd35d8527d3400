"""FoCo throughput at the paper's shapes (CC3M, CLIP ViT-L/14, batch 512, K = 3..5 pairs, 3 + 30 epochs), with random
weights: speed depends only on shapes, so no checkpoint has to be downloaded.

    python experiments/bench_scale.py --model tiny --device cpu                                  # smoke, < 1 min
    python experiments/bench_scale.py --model vit-b-16 --device cpu --train-batch 32 --batch 8   # a few minutes
    python experiments/bench_scale.py --model vit-l-14 --device cuda --precision bf16            # the paper's shapes

The backbone. A transformers `CLIPConfig` with the real sizes of the named model (`SHAPES`), built as a
`CLIPModel(config)` with random weights and saved once with `save_pretrained` into a temporary folder (or
`--checkpoint-dir`, reused when it already holds one), together with a `CLIPImageProcessor` (the PIL backend) and a
`CLIPTokenizer`. It is then loaded through `foco.backbones.hf.HFBackbone`, the code path users run (`hf:PATH`).
The real CLIP BPE vocabulary cannot be had offline, so the tokenizer is a CLIP BPE tokenizer built in memory over
the byte-level alphabet plus one chain of merges per word of a small word list (`WORDS`), so that each word is one
token, as a common English word is in CLIP's vocabulary; the model's ``vocab_size`` stays the real 49408 (only the
embedding table's size depends on it, and the ids used are a subset). A caption of n words is therefore n + 2 tokens
(BOS, EOS), and the measured token counts are recorded. Captions are random word sequences: a context of
``--context-tokens`` (20) tokens and a local caption of ``--local-tokens`` (8) tokens.

What is measured, each after warm-up, with `torch.cuda.synchronize` around every timed call on CUDA (medians):

1. Extraction. ``hf``: `HFBackbone.encode_images` on a batch of random 224 x 224 PIL images (the image processor,
   the vision tower, global + all patches projected, the copy back to the host: what `foco features extract` calls)
   and `HFBackbone.encode_texts` on contexts; ``tower``: the same arithmetic on tensors already on the device
   (preprocessed pixels, token ids), no preprocessing and no copy back: the model's share, and what a pipeline with
   data-loader workers approaches. `image_tower` / `text_tower` repeat HFBackbone's CLIP branch line by line; the
   script checks them against `encode_images` / `encode_texts` on two inputs (``backbone.equivalence`` in the JSON).
2. FoCo training steps/s at B = ``--train-batch`` (512 by default on CUDA) and K = 3 and 5, every image with K
   pairs: stage 2 (F_Aggr + F_Comp, L_aggr + L_comp, all B - 1 cross-instance negatives: the paper's setting) and
   stage 1 (F_Aggr alone, for the projection), each one step as `foco.train.loop` runs it: the forward under
   `foco.utils.precision.autocast`, zero_grad, backward, grad-norm clipping, AdamW (`foco.train.foco`'s per-stage
   optimiser) and the losses' ``.item()``. The losses are `foco.train.losses.foco_losses` on a `TrainBatch` of
   D = the backbone's projection_dim and P = ``backbone.num_patches``, negatives planned by `plan_negatives` on
   the host and moved to the device.
   * ``cached``: the batch is gathered by `PairTable.batch` from a host store of random features in the feature
     cache's storage dtypes (fp16 patches and tokens, fp32 globals; 2B images), then copied to the device through
     pinned memory; the gather and the copy are inside the timing (``data_s`` reports them alone).
   * ``online``: the frozen backbone encodes the batch inside the step (B images, B*K local captions, B*K
     contexts: preprocessed pixels and token ids copied from the host, then `image_tower` / `text_tower` under
     no_grad), then the stage-2 step. Decoding and resizing JPEGs is not included.
3. Peak memory: `torch.cuda.max_memory_allocated` per measurement on CUDA; the process's peak RSS so far
   (`resource.getrusage`) on the CPU.

FLOPs are counted with `torch.utils.flop_counter.FlopCounterMode` (matrix products and attention; elementwise work
is not counted) on the meta device at the timed shapes: the losses' forward (F_Aggr + F_Comp) and, measured too,
its backward; the step's model FLOPs are 3 x forward, as is customary (online: plus the backbone's forward, counted
at batch 1 and scaled). MFU = model FLOPs / step time / the stated dense peak (H100/H200 SXM: 989 TFLOP/s bf16,
67 TFLOP/s fp32 without TF32; `--peak-tflops` for another device); on the CPU only the achieved GFLOP/s is given.

Repeats: ``--warmup`` calls, then at least ``--repeats`` timed calls and more while they add up to under
``--min-time`` seconds. CPU defaults are small (B = 64, 1 warm-up, 2 repeats). On a shared CPU, torch's several
OpenMP threads wait on descheduled peers and timings inflate several-fold; the 1-min load average is recorded at the
start and the end, and ``--threads 1`` avoids the stalls.

The PROJECTION (printed with its arithmetic, and in the JSON) prices one CC3M epoch (3.3M images, ceil(3.3M / 512)
steps) and the paper's recipe (3 stage-1 + 30 stage-2 epochs) from the measured costs, on 1 GPU and on 8 (assuming
linear data-parallel scaling), next to the paper's 17 h: extraction once of 3.3M images and 3.3M * 2K texts (K
local + K contextual captions per image) then cached training, or online training (every epoch re-encodes).
When the timed B is not 512 (the CPU), the step at B = 512 is scaled from the timed one by the counted FLOP ratio,
assuming the same achieved FLOP/s: a labelled estimate.

Everything goes to one JSON file (``--out``, default runs/bench_scale_<model>_<device>.json); a markdown table is
printed at the end. ``--save-checkpoint DIR`` only writes the random checkpoint (e.g. for `hf:DIR` elsewhere).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

SHAPES = {
    # CLIP ViT-L/14 (OpenAI), 224 px: 428M parameters
    "vit-l-14": dict(
        vision=dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                    patch_size=14, image_size=224),
        text=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                  max_position_embeddings=77, vocab_size=49408),
        projection_dim=768),
    # CLIP ViT-B/16 (OpenAI), 224 px: 150M parameters
    "vit-b-16": dict(
        vision=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                    patch_size=16, image_size=224),
        text=dict(hidden_size=512, num_hidden_layers=12, num_attention_heads=8, intermediate_size=2048,
                  max_position_embeddings=77, vocab_size=49408),
        projection_dim=512),
    # smoke tests: 224 px inputs like the others, a 7 x 7 patch grid, two layers of width 32
    "tiny": dict(
        vision=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    patch_size=32, image_size=224),
        text=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  max_position_embeddings=77, vocab_size=49408),
        projection_dim=32),
}

CC3M_IMAGES = 3_300_000
PAPER_BATCH = 512
PAPER_STAGE1_EPOCHS, PAPER_STAGE2_EPOCHS = 3, 30
PAPER_HOURS = 17.0  # "With ViT-L/14, FoCo trains 38M parameters in 17h" (hardware not stated)
PAPER_PARAMS = 38e6
DENSE_PEAK = {"bf16": 989e12, "fp32": 67e12}  # H100 / H200 SXM, dense (fp32: no TF32, torch's default for matmul)

WORDS = ("a photo of the man woman dog cat car red blue green small large old young two three on in with at near "
         "street park beach table room white black wooden sitting standing holding next to under over front "
         "city night sunny grass water tree house people child running walking view sky road bike ball").split()


# -- the random checkpoint ----------------------------------------------------------------------------------------

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


def build_tokenizer():
    """A CLIP BPE tokenizer, offline: the byte-level characters, plus a chain of merges making each of `WORDS` one
    token (w1 w2 -> w1w2, w1w2 w3 -> ..., the last character carrying CLIP's "</w>")."""
    from transformers import CLIPTokenizer

    chars = list(_bytes_to_unicode().values())
    vocab_list = chars + [c + "</w>" for c in chars]
    merges: list[tuple[str, str]] = []
    for w in sorted(WORDS, key=len, reverse=True):  # longer words' merges rank first: "woman" is not "wo" + "man"
        pieces = list(w[:-1]) + [w[-1] + "</w>"]
        left = pieces[0]
        for p in pieces[1:]:
            if (left, p) not in merges:
                merges.append((left, p))
            left = left + p
            vocab_list.append(left)
    vocab_list += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(vocab_list))}
    return CLIPTokenizer(vocab=vocab, merges=merges)


def save_checkpoint(model_name: str, path: Path) -> dict:
    """Writes a random-weight CLIP of `model_name`'s shapes, its image processor and tokenizer to `path`."""
    from transformers import CLIPConfig, CLIPModel, CLIPProcessor
    try:
        from transformers import CLIPImageProcessorPil as ImageProcessor
    except ImportError:  # older transformers: the PIL backend is the plain class
        from transformers import CLIPImageProcessor as ImageProcessor

    t0 = time.perf_counter()
    spec = SHAPES[model_name]
    tok = build_tokenizer()
    text = dict(spec["text"], bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id)
    config = CLIPConfig(text_config=text, vision_config=spec["vision"], projection_dim=spec["projection_dim"])
    torch.manual_seed(0)
    model = CLIPModel(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    size = spec["vision"]["image_size"]
    processor = ImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    CLIPProcessor(image_processor=processor, tokenizer=tok).save_pretrained(path)
    return {"path": str(path), "params": sum(p.numel() for p in model.parameters()),
            "saved_s": round(time.perf_counter() - t0, 1)}


# -- the backbone's arithmetic on device tensors (HFBackbone's CLIP branch) ----------------------------------------

def image_tower(bb, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 3, H, W) pixels on the device -> normalised global (B, D) and patches (B, P, D), as HFBackbone."""
    out = bb.model.vision_model(pixel_values=pixels.to(bb.dtype), return_dict=True)
    projected = bb.model.visual_projection(bb.model.vision_model.post_layernorm(out.last_hidden_state))
    return F.normalize(projected[:, 0].float(), dim=-1), projected[:, 1:]


def text_tower(bb, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) ids and mask on the device -> normalised global (B, D) and tokens (B, L, D), as HFBackbone."""
    out = bb.model.text_model(input_ids=ids, attention_mask=mask.long(), return_dict=True)
    tokens = bb.model.text_projection(out.last_hidden_state)
    return F.normalize(bb.model.text_projection(out.pooler_output).float(), dim=-1), tokens


# -- timing helpers --------------------------------------------------------------------------------------------

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


MIN_TIME_S = 0.5  # timed calls go on past `repeats` until they add up to this (--min-time; cheap calls get more)
MAX_REPEATS = 100


def timed(fn, warmup: int, repeats: int, device: torch.device) -> list[float]:
    """Seconds of each timed call of `fn` after `warmup` calls: at least `repeats`, and more while their sum is
    under MIN_TIME_S (at most MAX_REPEATS); synchronised on CUDA."""
    for _ in range(warmup):
        fn()
    sync(device)
    times: list[float] = []
    while len(times) < repeats or (sum(times) < MIN_TIME_S and len(times) < MAX_REPEATS):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return times


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"peak_gpu_mem_gb": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)}
    return {"peak_rss_gb_so_far": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`, through pinned memory and a non-blocking copy on CUDA (as foco.utils.device)."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def batch_to(batch, device: torch.device):
    from foco.train.data import TrainBatch
    return TrainBatch(*(to_device(getattr(batch, f), device) for f in
                        ("image_global", "patches", "local", "local_mask", "ctx_tokens", "ctx_mask")))


_ONE_TOKEN: list[str] = []


def one_token_words(tokenizer) -> list[str]:
    """The words of `WORDS` that `tokenizer` makes one token (BOS + word + EOS)."""
    if not _ONE_TOKEN:
        _ONE_TOKEN.extend(w for w in WORDS if len(tokenizer(w)["input_ids"]) == 3)
    return _ONE_TOKEN


def captions(n: int, tokens: int, rng: np.random.Generator, tokenizer) -> list[str]:
    """n random captions of `tokens` tokens each (BOS + tokens - 2 one-token words + EOS)."""
    words = one_token_words(tokenizer)
    return [" ".join(rng.choice(words, size=max(1, tokens - 2))) for _ in range(n)]


def random_images(n: int, size: int, rng: np.random.Generator):
    from PIL import Image
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(n)]


def tokenize(bb, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    enc = bb.tokenizer(texts, padding=True, truncation=True, max_length=bb._max_text_len,
                       return_attention_mask=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"].bool()


# -- FLOP counts on the meta device ------------------------------------------------------------------------------

def count_flops(fn) -> int:
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as fc:
        fn()
    return int(fc.get_total_flops())


def random_batch(B: int, K: int, D: int, P: int, L: int, device):
    from foco.train.data import TrainBatch
    return TrainBatch(torch.randn(B, D, device=device), torch.randn(B, P, D, device=device),
                      torch.randn(B, K, D, device=device), torch.ones(B, K, dtype=torch.bool, device=device),
                      torch.randn(B, K, L, D, device=device), torch.ones(B, K, L, dtype=torch.bool, device=device))


def foco_flops(B: int, K: int, D: int, P: int, L: int, with_comp: bool) -> dict:
    """Counted FLOPs of the losses' forward and backward at these shapes (meta tensors: shapes only)."""
    from foco.model import ComposedQueryEncoder, FoCoConfig
    from foco.train.losses import NegativePlan, foco_losses
    meta = torch.device("meta")
    with meta:
        model = ComposedQueryEncoder(FoCoConfig(dim=D))
    batch = random_batch(B, K, D, P, L, meta)
    plan = NegativePlan(torch.zeros(B, dtype=torch.long, device=meta), torch.arange(B, device=meta))
    out = {}
    fwd = count_flops(lambda: out.update(foco_losses(model, batch, plan, with_comp)))
    bwd = count_flops(lambda: out["loss"].backward())
    return {"fwd": fwd, "bwd": bwd}


def backbone_flops(config, n_images: int, texts: list[tuple[int, int]]) -> int:
    """Counted forward FLOPs of the image tower on n_images images and the text tower on (count, length) groups,
    counted at batch 1 on the meta device and scaled (the towers' cost is linear in the batch)."""
    from transformers import CLIPModel
    with torch.device("meta"):
        model = CLIPModel(config)
    size = config.vision_config.image_size
    img = count_flops(lambda: model.visual_projection(model.vision_model.post_layernorm(
        model.vision_model(pixel_values=torch.zeros(1, 3, size, size, device="meta")).last_hidden_state)))
    total = img * n_images
    for count, length in texts:
        ids = torch.zeros(1, length, dtype=torch.long, device="meta")
        per = count_flops(lambda: model.text_projection(model.text_model(
            input_ids=ids).last_hidden_state))  # no padding mask (meta tensors cannot be inspected); same FLOPs
        total += per * count
    return total


# -- the measurements --------------------------------------------------------------------------------------------

def bench_extraction(bb, batches: list[int], a, device: torch.device, rng) -> tuple[list[dict], dict]:
    from foco.utils.precision import autocast
    size = bb.model.config.vision_config.image_size
    rows, rates = [], {}
    for n in batches:
        row: dict = {"batch": n}
        images = random_images(n, size, rng)
        ctx = captions(n, a.context_tokens, rng, bb.tokenizer)
        loc = captions(n, a.local_tokens, rng, bb.tokenizer)
        pixels = bb.image_processor(images=images, return_tensors="pt")["pixel_values"].to(device)
        ctx_ids, ctx_mask = (t.to(device) for t in tokenize(bb, ctx))
        loc_ids, loc_mask = (t.to(device) for t in tokenize(bb, loc))
        row["context_tokens"], row["local_tokens"] = int(ctx_ids.shape[1]), int(loc_ids.shape[1])
        reps = max(1, a.repeats // 2)  # the host-side paths are slow on a GPU machine: fewer repeats

        def run_hf_images():
            with autocast(a.precision, str(device)):
                bb.encode_images(images)

        def run_hf_texts():
            with autocast(a.precision, str(device)):
                bb.encode_texts(ctx)

        def run_tower_images():
            with torch.inference_mode(), autocast(a.precision, str(device)):
                image_tower(bb, pixels)

        def run_tower(ids, mask):
            def go():
                with torch.inference_mode(), autocast(a.precision, str(device)):
                    text_tower(bb, ids, mask)
            return go

        reset_peak(device)
        for key, fn, r in (("images_per_s_hf", run_hf_images, reps), ("images_per_s_tower", run_tower_images, a.repeats),
                           ("contexts_per_s_hf", run_hf_texts, reps),
                           ("contexts_per_s_tower", run_tower(ctx_ids, ctx_mask), a.repeats),
                           ("locals_per_s_tower", run_tower(loc_ids, loc_mask), a.repeats)):
            try:
                row[key] = round(n / statistics.median(timed(fn, a.warmup, r, device)), 1)
            except Exception as e:  # noqa: BLE001 - a GPU check records and goes on
                row[key + "_error"] = f"{type(e).__name__}: {e}"
        row.update(peak_memory(device))
        rows.append(row)
        print(json.dumps({"extraction": row}), flush=True)
    best = lambda k: max((r.get(k, 0.0) for r in rows), default=0.0)  # noqa: E731
    for k in ("images_per_s_hf", "images_per_s_tower", "contexts_per_s_hf", "contexts_per_s_tower",
              "locals_per_s_tower"):
        rates[k] = best(k)
    return rows, rates


def equivalence(bb, device, rng) -> dict:
    """Max |difference| of image_tower / text_tower against HFBackbone.encode_images / encode_texts (fp32, 2 inputs
    each), or the error the HFBackbone call raised."""
    size = bb.model.config.vision_config.image_size
    out: dict = {}
    images = random_images(2, size, rng)
    texts = captions(2, 12, rng, bb.tokenizer)
    try:
        ref = bb.encode_images(images)
        pixels = bb.image_processor(images=images, return_tensors="pt")["pixel_values"].to(device)
        with torch.inference_mode():
            g, p = image_tower(bb, pixels)
        out["images_max_abs_diff"] = float(max((ref.global_ - g.cpu()).abs().max(),
                                               (ref.patches - p.float().cpu()).abs().max()))
    except Exception as e:  # noqa: BLE001
        out["images_error"] = f"{type(e).__name__}: {e}"
    try:
        ref_t = bb.encode_texts(texts)
        ids, mask = tokenize(bb, texts)
        with torch.inference_mode():
            tg, tt = text_tower(bb, ids.to(device), mask.to(device))
        out["texts_max_abs_diff"] = float(max((ref_t.global_ - tg.cpu()).abs().max(),
                                              (ref_t.tokens - tt.float().cpu()).abs().max()))
    except Exception as e:  # noqa: BLE001
        out["texts_error"] = f"{type(e).__name__}: {e}"
    return out


def pair_table(N: int, K: int, D: int, P: int, L: int):
    """A host store of N random images with K pairs each, in the feature cache's storage dtypes."""
    from foco.train.data import PairTable
    g = torch.Generator().manual_seed(0)
    Nt = 2 * N * K  # K local + K contextual captions per image
    return PairTable(image_global=F.normalize(torch.randn(N, D, generator=g), dim=-1),
                     patches=torch.randn(N, P, D, generator=g).half(),
                     text_global=F.normalize(torch.randn(Nt, D, generator=g), dim=-1),
                     text_tokens=torch.randn(Nt, L, D, generator=g).half(),
                     text_mask=torch.ones(Nt, L, dtype=torch.bool),
                     local_idx=torch.arange(N * K).view(N, K), context_idx=(N * K + torch.arange(N * K)).view(N, K))


def bench_training(bb, a, device: torch.device, rng) -> list[dict]:
    from foco.model import ComposedQueryEncoder, FoCoConfig
    from foco.train.data import TrainBatch
    from foco.train.foco import FoCoTrainConfig, _optimizer
    from foco.train.losses import NegativePlan, foco_losses, plan_negatives
    from foco.utils.precision import autocast

    D, P, B, L = bb.embed_dim, bb.num_patches, a.train_batch, a.context_tokens
    size = bb.model.config.vision_config.image_size
    rows = []
    cfg = FoCoTrainConfig()
    for K in a.k:
        table = None  # the cached store, made once per K
        for stage, source in ((2, "cached"), (1, "cached"), (2, "online")):
            if source == "online" and a.no_online:
                continue
            with_comp = stage == 2
            row: dict = {"K": K, "B": B, "stage": stage, "source": source, "D": D, "P": P, "L": L}
            reset_peak(device)
            try:
                torch.manual_seed(0)
                model = ComposedQueryEncoder(FoCoConfig(dim=D)).to(device)
                opt = _optimizer(model, cfg, stage)
                params = [p for grp in opt.param_groups for p in grp["params"]]
                gen = torch.Generator().manual_seed(0)
                if source == "cached":
                    if table is None:
                        table = pair_table(2 * B, K, D, P, L)

                    def get_batch():
                        idx = torch.randperm(len(table), generator=gen)[:B]
                        return batch_to(table.batch(idx), device)
                else:
                    images = random_images(min(B, 16), size, rng)  # preprocessed once; tiled to B rows
                    pix = bb.image_processor(images=images, return_tensors="pt")["pixel_values"]
                    pixels = pix.repeat(math.ceil(B / pix.shape[0]), 1, 1, 1)[:B].contiguous()
                    loc_ids, loc_mask = tokenize(bb, captions(B * K, a.local_tokens, rng, bb.tokenizer))
                    ctx_ids, ctx_mask = tokenize(bb, captions(B * K, a.context_tokens, rng, bb.tokenizer))
                    row["local_tokens"], row["context_tokens"] = int(loc_ids.shape[1]), int(ctx_ids.shape[1])

                    def get_batch():
                        with torch.no_grad(), autocast(a.precision, str(device)):
                            vg, vp = image_tower(bb, to_device(pixels, device))
                            lg, _ = text_tower(bb, to_device(loc_ids, device), to_device(loc_mask, device))
                            cm = to_device(ctx_mask, device)
                            _, ct = text_tower(bb, to_device(ctx_ids, device), cm)
                        Lc = ct.shape[1]
                        return TrainBatch(vg, vp.float(), lg.view(B, K, D), torch.ones(B, K, dtype=torch.bool,
                                                                                         device=device),
                                          ct.float().view(B, K, Lc, D), cm.view(B, K, Lc))

                def step():
                    batch = get_batch()
                    plan = plan_negatives(batch.local_mask.cpu(), None, gen)
                    plan = NegativePlan(plan.neg_k.to(device), plan.columns.to(device))
                    with autocast(a.precision, str(device)):
                        losses = foco_losses(model, batch, plan, with_comp)
                    opt.zero_grad(set_to_none=True)
                    losses["loss"].backward()
                    torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                    opt.step()
                    return {k: v.item() for k, v in losses.items()}

                reps = a.repeats if source == "cached" else max(1, a.repeats // 2)
                times = timed(step, a.warmup, reps, device)
                row["step_s"] = round(statistics.median(times), 4)
                row["steps_per_s"] = round(1 / row["step_s"], 3)
                row["repeats"] = len(times)
                if source == "cached":
                    row["data_s"] = round(statistics.median(timed(get_batch, 1, reps, device)), 4)
                row.update(peak_memory(device))
                row["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
                del model, opt
            except Exception as e:  # noqa: BLE001 - recorded, the other measurements go on
                row["error"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
            # FLOPs at the timed shapes and at the paper's B (meta device)
            Lc = row.get("context_tokens", L)
            fl = foco_flops(B, K, D, P, Lc, with_comp)
            row["foco_fwd_flops"], row["foco_bwd_flops_measured"] = fl["fwd"], fl["bwd"]
            row["model_flops"] = 3 * fl["fwd"]
            if source == "online":
                row["backbone_fwd_flops"] = backbone_flops(bb.model.config, B, [(B * K, row["local_tokens"]),
                                                                              (B * K, row["context_tokens"])])
                row["model_flops"] += row["backbone_fwd_flops"]
            if B != PAPER_BATCH:
                fl512 = foco_flops(PAPER_BATCH, K, D, P, Lc, with_comp)
                m512 = 3 * fl512["fwd"]
                if source == "online":
                    m512 += row["backbone_fwd_flops"] * PAPER_BATCH / B
                row["model_flops_at_512"] = m512
            if "step_s" in row:
                row["achieved_tflops"] = round(row["model_flops"] / row["step_s"] / 1e12, 3)
                row["achieved_gflops"] = round(row["model_flops"] / row["step_s"] / 1e9, 1)
                if a.peak is not None:
                    row["mfu"] = round(row["model_flops"] / row["step_s"] / a.peak, 4)
                scale = row.get("model_flops_at_512", row["model_flops"]) / row["model_flops"]
                row["step_s_at_512"] = round(row["step_s"] * scale, 4)
                row["step_s_at_512_basis"] = "measured" if B == PAPER_BATCH else \
                    f"scaled from B={B} by the counted FLOP ratio {scale:.1f} (same achieved FLOP/s assumed)"
            rows.append(row)
            print(json.dumps({"training": row}), flush=True)
    return rows


# -- projection ----------------------------------------------------------------------------------------------------

def hours(s: float) -> float:
    return s / 3600.0


def project(rates: dict, training: list[dict], lines: list[str], unit: str = "GPU") -> dict:
    """The CC3M / paper-recipe projection from the measured costs; appends its arithmetic to `lines`."""
    N = CC3M_IMAGES
    units = unit + ("es" if unit.endswith("s") else "s")
    steps = math.ceil(N / PAPER_BATCH)
    out: dict = {"images": N, "batch": PAPER_BATCH, "steps_per_epoch": steps, "paper_hours": PAPER_HOURS,
                 "unit": unit, "assumptions": [f"8 {units}: linear data-parallel scaling (every term divided by 8)",
                                 "stage 1 epochs at the measured stage-1 step; online: every epoch priced at the "
                                 "stage-2 online step (an upper bound for its 3 stage-1 epochs)",
                                 "texts: K local + K contextual captions per image, each encoded once"]}
    P = lambda s="": lines.append(s)  # noqa: E731
    P("PROJECTION (arithmetic on the measured costs above; not a measurement)")
    P(f"  CC3M: N = {N:,} images; steps per epoch = ceil(N / {PAPER_BATCH}) = {steps:,}; "
      f"recipe {PAPER_STAGE1_EPOCHS} stage-1 + {PAPER_STAGE2_EPOCHS} stage-2 epochs; paper: {PAPER_HOURS:g} h "
      "(hardware not stated)")
    for kind, img_key, ctx_key, loc_key in (("tower", "images_per_s_tower", "contexts_per_s_tower",
                                              "locals_per_s_tower"),
                                             ("hf", "images_per_s_hf", "contexts_per_s_hf", None)):
        if not rates.get(img_key) or not rates.get(ctx_key):
            continue
        for K in sorted({r["K"] for r in training}):
            loc_rate = (rates.get(loc_key) or rates[ctx_key]) if loc_key else rates[ctx_key]
            t = N / rates[img_key] + N * K / loc_rate + N * K / rates[ctx_key]
            out[f"extraction_s_{kind}_K{K}"] = t
            P(f"  extraction ({kind}), K={K}: {N:,}/{rates[img_key]:.1f} img/s + {N * K:,}/{loc_rate:.1f} local/s "
              f"+ {N * K:,}/{rates[ctx_key]:.1f} ctx/s = {t:,.0f} s = {hours(t):.2f} h")
    by = {(r["K"], r["stage"], r["source"]): r for r in training if "step_s_at_512" in r}
    for K in sorted({r["K"] for r in training}):
        s2, s1, on = by.get((K, 2, "cached")), by.get((K, 1, "cached")), by.get((K, 2, "online"))
        if s2:
            ep2 = steps * s2["step_s_at_512"]
            out[f"epoch_s_stage2_cached_K{K}"] = ep2
            P(f"  K={K} cached stage-2 epoch: {steps:,} x {s2['step_s_at_512']:.4f} s ({s2['step_s_at_512_basis']}) "
              f"= {ep2:,.0f} s = {hours(ep2):.2f} h")
            t1 = s1["step_s_at_512"] if s1 else s2["step_s_at_512"]
            train = steps * (PAPER_STAGE1_EPOCHS * t1 + PAPER_STAGE2_EPOCHS * s2["step_s_at_512"])
            ext = out.get(f"extraction_s_tower_K{K}", 0.0)
            total = ext + train
            out[f"recipe_h_cached_K{K}_1gpu"] = hours(total)
            out[f"recipe_h_cached_K{K}_8gpu"] = hours(total) / 8
            P(f"  K={K} cached recipe, 1 {unit}: extraction {ext:,.0f} s + {steps:,} x ({PAPER_STAGE1_EPOCHS} x "
              f"{t1:.4f} + {PAPER_STAGE2_EPOCHS} x {s2['step_s_at_512']:.4f}) s = {total:,.0f} s = "
              f"{hours(total):.2f} h; 8 {units} (linear scaling assumed): {hours(total) / 8:.2f} h  "
              f"[paper: {PAPER_HOURS:g} h]")
        if on:
            total = (PAPER_STAGE1_EPOCHS + PAPER_STAGE2_EPOCHS) * steps * on["step_s_at_512"]
            out[f"epoch_s_online_K{K}"] = steps * on["step_s_at_512"]
            out[f"recipe_h_online_K{K}_1gpu"] = hours(total)
            out[f"recipe_h_online_K{K}_8gpu"] = hours(total) / 8
            P(f"  K={K} online recipe, 1 {unit}: {PAPER_STAGE1_EPOCHS + PAPER_STAGE2_EPOCHS} x {steps:,} x "
              f"{on['step_s_at_512']:.4f} s ({on['step_s_at_512_basis']}) = {total:,.0f} s = {hours(total):.2f} h; "
              f"8 {units} (linear scaling assumed): {hours(total) / 8:.2f} h  [paper: {PAPER_HOURS:g} h]")
    return out


def markdown(res: dict) -> str:
    c = res["config"]
    peak = "n/a (CPU: achieved only)" if res["config"]["peak_flops"] is None else \
        f"{res['config']['peak_flops'] / 1e12:g} TFLOP/s ({c['precision']})"
    out = [f"### bench_scale: {c['model']} on {c['device_name']} ({c['precision']}), MFU peak {peak}", "",
           f"D = {c['embed_dim_D']}, P = {c['num_patches_P']}, torch {c['torch']}, {c['torch_threads']} threads, "
           f"1-min load average at start/end {c.get('load_average_1min_start_end')}, wall {res.get('wall_s')} s", ""]
    out += ["| extraction batch | img/s (HFBackbone) | img/s (tower) | ctx/s (HFBackbone) | ctx/s (tower) | "
            "local/s (tower) | peak mem |", "|---|---|---|---|---|---|---|"]
    for r in res["extraction"]:
        mem = r.get("peak_gpu_mem_gb", r.get("peak_rss_gb_so_far"))
        out.append(f"| {r['batch']} | {r.get('images_per_s_hf', 'err')} | {r.get('images_per_s_tower', 'err')} | "
                   f"{r.get('contexts_per_s_hf', 'err')} | {r.get('contexts_per_s_tower', 'err')} | "
                   f"{r.get('locals_per_s_tower', 'err')} | {mem} GB |")
    cpu = not c["device"].startswith("cuda")
    unit = "GFLOP/s" if cpu else "TFLOP/s"
    out += ["", "| training | K | B | steps/s | step s | data s | fwd GFLOP | model TFLOP/step | achieved " + unit +
            " | MFU | step s at B=512 | peak mem |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["training"]:
        mem = r.get("peak_gpu_mem_gb", r.get("peak_rss_gb_so_far", "-"))
        name = f"stage {r['stage']} {r['source']}"
        if "error" in r:
            out.append(f"| {name} | {r['K']} | {r['B']} | ERROR: {r['error'][:80]} | | | | | | | | |")
            continue
        basis = "" if r["B"] == PAPER_BATCH else " (FLOP-scaled)"
        out.append(f"| {name} | {r['K']} | {r['B']} | {r['steps_per_s']} | {r['step_s']} | {r.get('data_s', '-')} | "
                   f"{r['foco_fwd_flops'] / 1e9:,.1f} | {r['model_flops'] / 1e12:.3f} | "
                   f"{r['achieved_gflops'] if cpu else r['achieved_tflops']} | "
                   f"{r.get('mfu', '-')} | {r['step_s_at_512']}{basis} | {mem} GB |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(SHAPES), default="vit-l-14")
    ap.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda when available)")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--batch", type=int, nargs="+", default=None,
                    help="extraction batch sizes (default: 64 256 on CUDA, 8 on the CPU)")
    ap.add_argument("--train-batch", type=int, default=None, help="B of the training step (default: 512 on CUDA, "
                                                                   "64 on the CPU)")
    ap.add_argument("--k", type=int, nargs="+", default=[3, 5], help="pairs per image")
    ap.add_argument("--context-tokens", type=int, default=20)
    ap.add_argument("--local-tokens", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=None, help="default: 3 on CUDA, 1 on the CPU")
    ap.add_argument("--repeats", type=int, default=None, help="default: 10 on CUDA, 2 on the CPU")
    ap.add_argument("--min-time", type=float, default=None, help="timed calls continue past --repeats until they "
                    "add up to this many seconds (default: 0.5 on CUDA, 0.2 on the CPU)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--no-online", action="store_true", help="skip the online (encode-in-the-step) measurement")
    ap.add_argument("--peak-tflops", type=float, default=None, help="dense peak for MFU (default: H100/H200's)")
    ap.add_argument("--checkpoint-dir", default=None, help="where the random checkpoint is written (reused when it "
                                                           "holds one); default: a temporary folder")
    ap.add_argument("--save-checkpoint", default=None, metavar="DIR", help="only write the checkpoint to DIR")
    ap.add_argument("--out", default=None, help="JSON file (default runs/bench_scale_<model>_<device>.json)")
    a = ap.parse_args()
    t_start = time.perf_counter()
    load_start = round(os.getloadavg()[0], 2)  # other work on the machine makes CPU timings noisy: recorded

    if a.save_checkpoint:
        print(json.dumps(save_checkpoint(a.model, Path(a.save_checkpoint))))
        return

    spec = a.device
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit(f"--device {a.device}: CUDA is not available (torch {torch.__version__})")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    cuda = device.type == "cuda"
    a.batch = a.batch or ([64, 256] if cuda else [8])
    a.train_batch = a.train_batch or (PAPER_BATCH if cuda else 64)
    a.warmup = a.warmup if a.warmup is not None else (3 if cuda else 1)
    a.repeats = a.repeats if a.repeats is not None else (10 if cuda else 2)
    global MIN_TIME_S
    MIN_TIME_S = a.min_time if a.min_time is not None else (0.5 if cuda else 0.2)
    if a.threads:
        torch.set_num_threads(a.threads)
    device_name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine())
    if a.peak_tflops is not None:
        a.peak = a.peak_tflops * 1e12
    elif cuda and any(n in device_name for n in ("H100", "H200")):
        a.peak = DENSE_PEAK[a.precision]
    else:
        a.peak = None
    out_path = Path(a.out or f"runs/bench_scale_{a.model}_{device.type}.json")

    from foco.backbones.hf import HFBackbone
    import transformers

    tmp = None
    if a.checkpoint_dir and (Path(a.checkpoint_dir) / "config.json").exists():
        ckpt = {"path": a.checkpoint_dir, "reused": True}
    else:
        if a.checkpoint_dir is None:
            tmp = tempfile.TemporaryDirectory(prefix=f"foco-bench-{a.model}-")
        ckpt = save_checkpoint(a.model, Path(a.checkpoint_dir or tmp.name))
    print(json.dumps({"checkpoint": ckpt}), flush=True)
    t = time.perf_counter()
    bb = HFBackbone(ckpt["path"], device=device)
    ckpt["load_s"] = round(time.perf_counter() - t, 1)
    ckpt["params"] = sum(p.numel() for p in bb.model.parameters())
    rng = np.random.default_rng(0)

    res: dict = {"config": {
        "model": a.model, "shapes": SHAPES[a.model], "device": str(device), "device_name": device_name,
        "precision": a.precision, "embed_dim_D": bb.embed_dim, "num_patches_P": bb.num_patches,
        "extraction_batches": a.batch, "train_batch_B": a.train_batch, "K": a.k,
        "context_tokens": a.context_tokens, "local_tokens": a.local_tokens, "warmup": a.warmup,
        "repeats": a.repeats, "min_time_s": MIN_TIME_S, "peak_flops": a.peak, "torch": torch.__version__,
        "transformers": transformers.__version__, "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(), "backbone_path": "foco.backbones.hf.HFBackbone (random weights)"},
        "backbone": ckpt}
    res["backbone"]["equivalence"] = equivalence(bb, device, rng)
    print(json.dumps({"equivalence": res["backbone"]["equivalence"]}), flush=True)
    res["extraction"], rates = bench_extraction(bb, a.batch, a, device, rng)
    res["training"] = bench_training(bb, a, device, rng)
    lines: list[str] = []
    res["projection"] = project(rates, res["training"], lines, "GPU" if cuda else "CPU process")
    res["projection"]["lines"] = lines
    params = next((r["trainable_params"] for r in res["training"] if r.get("stage") == 2 and "trainable_params" in r),
                  None)
    res["config"]["foco_trainable_params"] = params
    res["wall_s"] = round(time.perf_counter() - t_start, 1)
    res["config"]["load_average_1min_start_end"] = [load_start, round(os.getloadavg()[0], 2)]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(res, indent=2) + "\n")
    print()
    print(markdown(res))
    print()
    print("\n".join(lines))
    if params:
        print(f"\nFoCo trainable parameters at D={bb.embed_dim}: {params / 1e6:.1f}M (paper, ViT-L/14: "
              f"{PAPER_PARAMS / 1e6:.0f}M)")
    busy = max(res["config"]["load_average_1min_start_end"]) > (os.cpu_count() or 1)
    if not cuda and busy and torch.get_num_threads() > 1:
        print(f"note: the machine was busy (1-min load {res['config']['load_average_1min_start_end']} on "
              f"{os.cpu_count()} CPUs): with several torch threads, OpenMP waits on descheduled threads and CPU "
              "timings inflate; --threads 1 avoids that")
    print(f"wall {res['wall_s']} s; JSON: {out_path}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
