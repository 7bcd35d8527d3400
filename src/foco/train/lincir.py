"""Training LinCIR's phi (`foco lincir train`): captions alone, the frozen text tower, self-masking projection
(`foco.methods.lincir` gives the objective; navervision/lincir's train_phi.py and loader.py are the reference).

The reference's recipe, kept: AdamW (torch's betas, weight decay 0.01), lr 1e-4, a constant schedule after no
warm-up, noise scale 1.0, phi's dropout 0.5, MSE on the raw projected embeddings. Its budget (20,000 steps of 512
captions of CC3M, SBU and others) is sized for millions of captions; here the budget is epochs over the given
captions (`epochs`).

Masking (`mask_caption`, loader.py's CaptionDataset): the caption is lower-cased with the placeholder character
removed; its keyword runs are maximal runs of spaCy NOUN, PROPN, ADJ and DET tokens, joined by spaces. Each run
that occurs in the caption is replaced (as a substring, every occurrence) by the placeholder, in order; at the first
run that does not occur, one random word of the caption is replaced instead and the loop stops (no words: "a photo
of * that {caption}"). A caption left without a placeholder becomes "a photo of *". The reference draws the random
word anew each time it reads a caption; so does this trainer, from the torch generator that also draws the noise
(saved with the training state, so that a resumed run continues the same stream).

Under DDP every rank draws the noise and the fallback words of the whole global batch from that generator (the same
stream on every rank) and keeps its own rows, so the inputs are those one process would train on (checked on 2
gloo ranks with dropout 0: weights within 2.3e-7 of one process). phi's dropout masks are not: each rank draws them
from its own (equally seeded) generator for its own rows.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from ..backbones.pseudo import PseudoTokenBackbone
from ..methods.lincir import LinCIRConfig, LinCIRPhi
from .distributed import DistEnv, RunContext, context, ddp, rank_slice
from .harness import Plan, check_out, train_run
from .loop import Losses, LoopConfig, Phase, recorded_settings, settings_of

KEYWORD_POS = frozenset({"NOUN", "PROPN", "ADJ", "DET"})  # loader.py's extract_keywords_spacy


@dataclass
class LinCIRTrainConfig:
    epochs: int = 20
    batch_size: int = 256  # the reference's single-GPU advice: 256 or 512
    lr: float = 1e-4
    weight_decay: float = 0.01
    grad_clip: float = 0.0  # the reference's --max_grad_norm None: no clipping
    max_steps: int | None = None
    seed: int = 0
    device: str | None = None
    allow_changed: tuple[str, ...] = ()
    model: LinCIRConfig = field(default_factory=LinCIRConfig)


def keyword_runs(nlp, caption: str) -> list[str]:
    """The maximal runs of NOUN/PROPN/ADJ/DET tokens of `caption`, each joined by spaces, in order."""
    return _runs(nlp(caption))


def keyword_runs_all(nlp, captions: Sequence[str], batch_size: int = 256) -> list[list[str]]:
    """`keyword_runs` of every caption, parsed in batches (`nlp.pipe`) without the dependency parser, which the
    part-of-speech tags do not read: the same runs, about 2.8x faster than one caption at a time (2,000 world
    captions: 2.3 s against 6.4 s on one core)."""
    disable = [p for p in ("parser",) if p in getattr(nlp, "pipe_names", ())]
    if not hasattr(nlp, "pipe"):  # a stand-in pipeline (tests): one caption at a time
        return [keyword_runs(nlp, c) for c in captions]
    with nlp.select_pipes(disable=disable):
        return [_runs(doc) for doc in nlp.pipe(captions, batch_size=batch_size)]


def _runs(doc) -> list[str]:
    runs, current_run = [], []
    for token in doc:
        if token.pos_ in KEYWORD_POS:
            current_run.append(token.text)
        elif current_run:
            runs.append(" ".join(current_run))
            current_run = []
    if current_run:
        runs.append(" ".join(current_run))
    return runs


def clean_caption(caption: str, placeholder: str = "*") -> str:
    return caption.lower().replace(placeholder, "").strip()


class _Chooser:
    """`random.Random.choice`'s interface over a torch generator (one draw per call)."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def choice(self, seq: Sequence[str]) -> str:
        return seq[int(torch.randint(len(seq), (1,), generator=self.generator))]


def mask_caption(caption: str, runs: Sequence[str], rng: random.Random | _Chooser, placeholder: str = "*") -> str:
    """The masked caption of a cleaned `caption` with its keyword `runs` (module docstring)."""
    masked = caption
    for run_ in list(runs) or [""]:
        if run_ != "" and run_ in caption:
            masked = masked.replace(run_, placeholder)
            continue
        words = caption.split(" ")
        if words:
            masked = masked.replace(rng.choice(words), placeholder)
        else:
            masked = f"a photo of {placeholder} that {caption}"
        break
    if placeholder not in masked:  # (the tokenizers foco's pseudo-token backbones use split "*" off a word)
        masked = f"a photo of {placeholder}"
    return masked


def rejoin(local: str, context: str) -> str:
    """A decomposition pair as one sentence (the +AD control's extra captions): the context, then the local part."""
    return f"{context} with {local}"


class LinCIRObjective(torch.nn.Module):
    """LinCIR's loss as a module's forward (for DDP): phi is trained, the text tower is frozen and held outside."""

    def __init__(self, phi: LinCIRPhi, backbone: PseudoTokenBackbone):
        super().__init__()
        self.phi = phi
        self.__dict__["backbone"] = backbone

    def forward(self, target: torch.Tensor, noisy: torch.Tensor, masked: list[str]) -> Losses:
        """target (b, D) raw embeddings of the captions; noisy (b, D) the same with noise; masked (b,) texts."""
        text = self.backbone.encode_texts_with_tokens(masked, self.phi(noisy), self.phi.cfg.placeholder)
        replaced = text.global_ * text.norm[:, None]  # (b, D), raw
        return {"loss": F.mse_loss(replaced.float(), target.float())}


def lincir_captions(world: str | Path, split: str = "train", add_decompositions: bool = False) -> list[str]:
    """The captions LinCIR trains on: the `split` pairs' captions of a world, and with `add_decompositions` (the
    +AD control) every pair of each caption's oracle decomposition rejoined as one more sentence (`rejoin`)."""
    from ..world.manifest import load_pairs
    pairs = load_pairs(world, split)
    captions = [p.caption for p in pairs]
    if add_decompositions:
        captions += [rejoin(pair.local, pair.context) for p in pairs for pair in p.decomposition.pairs]
    return captions


def encode_raw(backbone, texts: Sequence[str], batch: int = 256) -> torch.Tensor:
    """(N, D) raw (unnormalised) text embeddings of `texts`, a batch at a time."""
    out = []
    for i in range(0, len(texts), batch):
        f = backbone.encode_texts(list(texts[i:i + batch]))
        if f.norm is None:
            raise ValueError(f"backbone {backbone.spec} gives no raw text norms, which LinCIR regresses on")
        out.append(f.global_ * f.norm[:, None])
    return torch.cat(out)


def train_lincir(captions: Sequence[str], backbone: PseudoTokenBackbone, out: str | Path,
                 cfg: LinCIRTrainConfig | None = None, resume: bool = False, meta: dict | None = None,
                 nlp=None, ctx: RunContext | None = None) -> LinCIRPhi:
    """Trains phi on `captions` (text only) with the frozen `backbone`; writes `out`/lincir.safetensors + lincir.json
    and the training log. Resumable (`resume=True`). `nlp`: a spaCy pipeline (default: foco's rule decomposer's).
    `ctx`: the run's ranks and device (None: this process on `cfg.device`)."""
    cfg = cfg if cfg is not None else LinCIRTrainConfig()
    if not captions:
        raise ValueError("LinCIR trains on captions: none were given")
    cfg = replace(cfg, model=replace(cfg.model, embed_dim=int(backbone.embed_dim), token_dim=int(backbone.token_dim)))
    ctx = (ctx or context(cfg.device)).for_run(cfg.seed, out)
    check_out(ctx, resume)  # before parsing every caption
    if nlp is None:
        from ..decompose.rule import load_spacy
        nlp = load_spacy()
    ph = cfg.model.placeholder
    cleaned = [clean_caption(c, ph) for c in captions]
    runs = keyword_runs_all(nlp, cleaned)

    def build(env: RunContext) -> Plan:
        noise_gen = torch.Generator().manual_seed(cfg.seed)  # the noise and the fallback words; saved on resume
        words = _Chooser(noise_gen)
        phi = LinCIRPhi(cfg.model).to(env.device)
        with torch.no_grad():
            targets = encode_raw(backbone, cleaned).float()  # (N, D), fixed: the tower is frozen
        objective = LinCIRObjective(phi, backbone)
        if env.enabled:
            objective = ddp(objective, env, find_unused=False)

        def step(idx: torch.Tensor) -> Losses:  # idx (B,) the global batch; each rank takes its rows
            # on the CPU, where `targets` and the saved noise generator live; this rank's rows move to the device
            mine = rank_slice(torch.arange(idx.shape[0], device="cpu"), env)  # (b,) this rank's positions
            e_all = targets[idx]  # (B, D)
            scale = torch.rand(e_all.shape[0], 1, generator=noise_gen, device="cpu")  # (B, 1), U[0, 1)
            noisy = e_all + cfg.model.noise * scale * torch.randn(e_all.shape, generator=noise_gen,
                                                                  device="cpu")  # (B, D)
            masked = [mask_caption(cleaned[i], runs[i], words, ph) for i in idx.tolist()]  # (B,), same per rank
            return objective(e_all[mine].to(env.device), noisy[mine].to(env.device),
                             [masked[j] for j in mine.tolist()])

        def optimizer() -> torch.optim.Optimizer:
            return torch.optim.AdamW(phi.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

        n, B = len(cleaned), min(cfg.batch_size, len(cleaned))
        loop = LoopConfig(n, B, warmup_frac=0.0, grad_clip=cfg.grad_clip, max_steps=cfg.max_steps, name="LinCIR",
                          schedule="constant", identity={"backbone": backbone.spec}, settings=settings_of(cfg),
                          allow_changed=frozenset(cfg.allow_changed))
        return Plan(phi, [Phase(cfg.epochs, optimizer, step)], loop, lambda history: phi.save(
            env.out, {"backbone": backbone.spec, "captions": n, **recorded_settings(history), **(meta or {})}),
            generator=noise_gen)
    return train_run(ctx, build, resume).model
