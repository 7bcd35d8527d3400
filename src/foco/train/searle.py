"""Training SEARLE (`foco searle oti`, `foco searle train`): optimisation-based textual inversion of cached images,
then phi distilled from it (`foco.methods.searle` describes the method; miccunifi/SEARLE's oti_inversion.py and
train_phi.py are the reference).

**Concepts** (`associate`): each concept's text embedding is the mean of its 24 template embeddings (each normalised,
the mean normalised again: image_concepts_association.py); each image keeps its `ASSOCIATED` most similar concepts
(cosine with its normalised embedding), most similar first. A concept is usable when each of its phrases still holds
the placeholder after its first mention is replaced (`foco.world.phrases.usable_concepts`).

**OTI** (`run_oti`), per batch of `batch_size` images: tokens s (b, E) ~ N(0, 0.02^2), AdamW(lr 2e-2, decay 0.01),
made afresh for each batch, `steps` steps of

    cos = mean(1 - cos(f("<template> * " | * = s), v))         a random one of the 24 templates per image
    gpt = mean(1 - cos(f(phrase with its concept -> * once | * = s), f(phrase)))
    loss = (1 * cos + 0.5 * gpt) / 1.5,     ema = 0.99 ema + 0.01 s

where each image's phrase is drawn from all the phrases of its `top_k` (15) most similar usable concepts. The EMA
tokens are what phi distils. Each batch draws from its own generator (seed, batch), so a run resumed after a kill
(the tokens are saved every `save_every` batches) gives the tokens an uninterrupted run gives.

**phi** (`train_searle`), on foco's one training loop: AdamW(lr 1e-4, decay 0.01), a constant rate without warm-up,
no clipping, batch 256, dropout 0.5 on, and per batch

    est = phi(v_raw);  concept c ~ image's top `top_k` (150) usable concepts;  phrase ~ c's phrases
    distil = NT-Xent(ema_oti, est; tau 0.25)       (`nt_xent`, utils.contrastive_loss: 2B samples, same-view negatives)
    gpt    = mean(1 - cos(f(phrase with every c -> *, the first * = est), f(phrase)))
    loss   = 1 * distil + 0.75 * gpt                                       (not divided by the weights' sum)

Only the first placeholder of a text is the pseudo word (the reference's encode_with_pseudo_tokens); a phrase that
mentions its concept twice keeps a literal "*" for the second mention, as the reference keeps "$".
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from ..backbones.pseudo import PseudoTokenBackbone
from ..methods.searle import TEMPLATES, SEARLEConfig, SEARLEPhi
from ..utils.io import atomic_write_bytes, atomic_write_text
from .distributed import RunContext, context, rank_slice
from .harness import Plan, check_out, train_run
from .loop import Losses, LoopConfig, Phase, recorded_settings, settings_of

OTI_RECORD, OTI_TOKENS, OTI_PHRASES = "oti.json", "oti.safetensors", "phrases.json"
OTI_PARTIAL = "oti.partial.safetensors"  # tokens of the batches done so far (a resumable run)
ASSOCIATED = 250  # concepts kept per image (image_concepts_association.py's top 250)


@dataclass
class OTIConfig:
    steps: int = 350  # --oti-steps
    batch_size: int = 32
    lr: float = 2e-2
    weight_decay: float = 0.01
    top_k: int = 15  # concepts per image whose phrases regularise its token
    lambda_cos: float = 1.0
    lambda_gpt: float = 0.5
    ema_decay: float = 0.99
    init_std: float = 0.02
    images: int | None = None  # invert this many images of the cache (a seeded sample, in cache order); None: all
    phrase_seed: int = 0  # the world's phrases (`foco.world.phrases.concept_phrases`)
    seed: int = 0
    save_every: int = 8  # batches between saves of the partial tokens
    device: str | None = None


@dataclass
class SEARLETrainConfig:
    epochs: int = 100  # --num-epochs
    batch_size: int = 256
    lr: float = 1e-4
    weight_decay: float = 0.01
    temperature: float = 0.25
    lambda_distil: float = 1.0
    lambda_gpt: float = 0.75
    top_k: int = 150  # --top-k-concepts
    max_steps: int | None = None
    seed: int = 0
    device: str | None = None
    allow_changed: tuple[str, ...] = ()
    model: SEARLEConfig = field(default_factory=SEARLEConfig)


def nt_xent(v1: torch.Tensor, v2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's symmetric NT-Xent over 2B samples (SEARLE's utils.contrastive_loss): v1[i] and v2[i] (B, E) are
    positives; every other row of both views is a negative, same-view rows included."""
    z = F.normalize(torch.cat([v1, v2]), dim=-1)  # (2B, E)
    b = v1.shape[0]
    logits = z @ z.t() / temperature  # (2B, 2B)
    logits = logits.masked_fill(torch.eye(2 * b, dtype=torch.bool, device=z.device), float("-inf"))
    positives = torch.cat([torch.arange(b, 2 * b), torch.arange(0, b)]).to(z.device)  # (2B,)
    return F.cross_entropy(logits, positives)


def concept_embeddings(backbone, concepts: Sequence[str], batch: int = 256) -> torch.Tensor:
    """(C, D): each concept's template ensemble, normalised (image_concepts_association.py); the C x 24 texts are
    encoded `batch` at a time."""
    texts = [t.format(f" {c} ") for c in concepts for t in TEMPLATES]
    with torch.no_grad():
        f = torch.cat([backbone.encode_texts(texts[i:i + batch]).global_.float()
                       for i in range(0, len(texts), batch)])  # (C * 24, D), normalised
    return F.normalize(f.view(len(concepts), len(TEMPLATES), -1).mean(1), dim=-1)


def associate(image: torch.Tensor, concept_emb: torch.Tensor, k: int = ASSOCIATED) -> torch.Tensor:
    """(N, K) int64: for each normalised image embedding (N, D), its K most similar concepts, most similar first."""
    k = min(k, concept_emb.shape[0])
    return (image.float() @ concept_emb.to(image.device).t()).topk(k, dim=1).indices.cpu()


class PhraseBank:
    """The phrases of each concept and their text embeddings. Phrases are encoded in fixed chunks of `chunk` (the
    chunk of a concept's phrase list that holds the drawn phrase) the first time one of them is drawn, so each
    embedding depends on its concept's list alone, never on what was drawn before (a resumed run reads the same
    numbers), and a short run encodes only what it draws."""

    def __init__(self, backbone: PseudoTokenBackbone, phrases: dict[str, list[str]], device, chunk: int = 16):
        self.backbone, self.phrases, self.device, self.chunk = backbone, phrases, device, chunk
        self._index = {c: {p: i for i, p in reversed(list(enumerate(ps)))} for c, ps in phrases.items()}
        self._emb: dict[tuple[str, int], torch.Tensor] = {}  # (concept, chunk) -> (chunk, D)

    def embed(self, texts: Sequence[str], concepts: Sequence[str]) -> torch.Tensor:
        """(B, D) normalised text embeddings of `texts`, each a phrase of the concept beside it."""
        out = []
        for t, c in zip(texts, concepts):
            i = self._index[c][t]
            key = (c, i // self.chunk)
            if key not in self._emb:
                part = self.phrases[c][key[1] * self.chunk:(key[1] + 1) * self.chunk]
                with torch.no_grad():
                    self._emb[key] = self.backbone.encode_texts(part).global_.float().to(self.device)
            out.append(self._emb[key][i % self.chunk])
        return torch.stack(out)


def _draw(seq: Sequence, g: torch.Generator):
    return seq[int(torch.randint(len(seq), (1,), generator=g))]


def _cosine_loss(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """nn.CosineEmbeddingLoss with target 1: mean(1 - cos)."""
    return (1 - F.cosine_similarity(a.float(), b.float(), dim=-1)).mean()


def oti_loss(backbone: PseudoTokenBackbone, tokens: torch.Tensor, v: torch.Tensor, templates: list[str],
             oti_phrases: list[str], phrase_emb: torch.Tensor, cfg: OTIConfig, placeholder: str = "*"
             ) -> torch.Tensor:
    """OTI's loss for b tokens (b, E): `templates` and `oti_phrases` (b,) hold the placeholder (its first one reads
    the token); v (b, D) the images' embeddings, phrase_emb (b, D) the phrases' own."""
    f_t = backbone.encode_texts_with_tokens(templates, tokens, placeholder, keep=(1, 0)).global_  # (b, D)
    f_p = backbone.encode_texts_with_tokens(oti_phrases, tokens, placeholder, keep=(1, 0)).global_  # (b, D)
    return (cfg.lambda_cos * _cosine_loss(f_t, v) + cfg.lambda_gpt * _cosine_loss(f_p, phrase_emb)
            ) / (cfg.lambda_cos + cfg.lambda_gpt)


def invert_batch(v: torch.Tensor, choices: list[list[tuple[str, str]]], backbone: PseudoTokenBackbone,
                 bank: PhraseBank, cfg: OTIConfig, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """OTI of b images (module docstring): v (b, D) their embeddings; choices[i] the (phrase, concept) pairs image
    i's phrase is drawn from. Returns (tokens, ema tokens), each (b, E)."""
    b, ph = v.shape[0], "*"
    tokens = torch.nn.Parameter(torch.randn(b, backbone.token_dim, generator=g).mul(cfg.init_std).to(v.device))
    ema = tokens.detach().clone()
    opt = torch.optim.AdamW([tokens], lr=cfg.lr, weight_decay=cfg.weight_decay)
    for _ in range(cfg.steps):
        templates = [_draw(TEMPLATES, g).format(f" {ph} ") for _ in range(b)]
        drawn = [_draw(c, g) for c in choices]  # (phrase, concept) per image
        oti_phrases = [p.replace(c, f" {ph} ", 1) for p, c in drawn]
        target = bank.embed([p for p, _ in drawn], [c for _, c in drawn])  # (b, D)
        loss = oti_loss(backbone, tokens, v, templates, oti_phrases, target, cfg, ph)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            ema.mul_(cfg.ema_decay).add_(tokens.detach(), alpha=1 - cfg.ema_decay)
    return tokens.detach(), ema


def oti_rows(n: int, images: int | None, seed: int) -> torch.Tensor:
    """The cache rows OTI inverts: all N, or a seeded sample of `images` of them, in cache order."""
    if images is None or images >= n:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:images].sort().values


def image_concepts(assoc: torch.Tensor, concepts: Sequence[str], usable: set[str], top_k: int) -> list[list[str]]:
    """Each image's usable concepts among its `top_k` most similar (`assoc` (N, K) concept indices, most similar
    first); an image with none is refused."""
    out = [[concepts[j] for j in row[:top_k] if concepts[j] in usable] for row in assoc.tolist()]
    if any(not kept for kept in out):
        raise ValueError(f"an image has no usable concept among its {top_k} most similar")
    return out


def run_oti(image_global: torch.Tensor, backbone: PseudoTokenBackbone, concepts: Sequence[str],
            phrases: dict[str, list[str]], out: str | Path, cfg: OTIConfig | None = None, resume: bool = False,
            meta: dict | None = None, show_progress: bool = True) -> dict:
    """OTI of N cached images (N, D), normalised. Writes `out`/oti.safetensors (tokens, ema (n, E), rows (n,), the
    inverted cache rows; concepts (n, K), each image's associated concepts), phrases.json and oti.json. Saves the
    tokens every `save_every` batches; `resume=True` continues a killed run (its settings must match). Returns the
    record."""
    from safetensors.torch import save
    from ..utils.progress import Bar
    from ..world.phrases import usable_concepts
    cfg = cfg if cfg is not None else OTIConfig()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(cfg.device or "cpu")
    from ..utils.io import read_json
    settings = {k: v for k, v in asdict(cfg).items() if k not in ("device", "save_every")}
    images_sha = _sha256(image_global)  # what is inverted: a run continued or reused must read the same images
    progress_file = out / ".oti-progress.json"
    if progress_file.exists() or (out / OTI_RECORD).exists():
        if not resume:
            raise FileExistsError(f"{out} holds an OTI run; continue it (rerun the command; --restart starts over) "
                                  "or choose another --out")
        finished = (out / OTI_RECORD).exists()
        saved = read_json(out / OTI_RECORD if finished else progress_file)
        changed = sorted(k for k in settings if saved.get("settings", {}).get(k) != settings[k])
        changed += [k for k, v in (("backbone", backbone.spec), ("images", images_sha))
                    if saved.get("backbone" if k == "backbone" else "images_sha256") != v]
        if changed:
            raise ValueError(f"{out} holds an OTI run of other {', '.join(changed)}; rerun it with what it began "
                             "with (its features, backbone and settings), or --restart")
        if finished:
            return saved
    rows = oti_rows(image_global.shape[0], cfg.images, cfg.seed)  # (n,)
    v = image_global[rows].float()  # (n, D)
    assoc = associate(v, concept_embeddings(backbone, concepts))  # (n, K)
    usable = usable_concepts(phrases, "*")
    choices = [[(p, c) for c in kept for p in phrases[c]]
               for kept in image_concepts(assoc, concepts, usable, cfg.top_k)]  # (phrase, concept) per image
    n, E = len(rows), backbone.token_dim
    tokens, ema, done = torch.zeros(n, E), torch.zeros(n, E), 0
    if resume and (out / OTI_PARTIAL).exists():
        from ..utils.io import load_tensors
        part = load_tensors(out / OTI_PARTIAL, "remove the folder's OTI files, or --restart")
        done = int(read_json(progress_file)["done"])
        tokens[:done], ema[:done] = part["tokens"][:done], part["ema"][:done]
    atomic_write_text(progress_file, json.dumps({"settings": settings, "backbone": backbone.spec, "images_sha256": images_sha,
                                                   "done": done}))
    bank = PhraseBank(backbone, phrases, device)
    B = cfg.batch_size
    batches = list(range(0, n, B))
    with Bar(len(batches), "OTI batches", initial=done // B) if show_progress else _quiet() as bar:
        for i, start in enumerate(batches):
            if start < done:
                continue
            g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + i)
            t, e = invert_batch(v[start:start + B].to(device), choices[start:start + B], backbone, bank, cfg, g)
            tokens[start:start + B], ema[start:start + B] = t.cpu(), e.cpu()
            bar.update(1)
            if (i + 1) % cfg.save_every == 0 or start + B >= n:
                done = min(start + B, n)
                atomic_write_bytes(out / OTI_PARTIAL, save({"tokens": tokens, "ema": ema}))
                atomic_write_text(progress_file, json.dumps({"settings": settings, "backbone": backbone.spec,
                                                              "images_sha256": images_sha, "done": done}))
    atomic_write_bytes(out / OTI_TOKENS, save({"tokens": tokens, "ema": ema, "rows": rows,
                                               "concepts": assoc.to(torch.int64)}))
    atomic_write_text(out / OTI_PHRASES, json.dumps(phrases) + "\n")
    record = {"model": "searle-oti", "backbone": backbone.spec, "images": n, "concepts": list(concepts),
              "settings": settings, "images_sha256": images_sha, **(meta or {})}
    atomic_write_text(out / OTI_RECORD, json.dumps(record, indent=2) + "\n")
    (out / OTI_PARTIAL).unlink(missing_ok=True)
    progress_file.unlink(missing_ok=True)
    return record


def _sha256(t: torch.Tensor) -> str:
    import hashlib
    return hashlib.sha256(t.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()


def _quiet():
    from ..utils.progress import NoBar
    return NoBar()


def read_oti(folder: str | Path) -> tuple[dict, dict[str, torch.Tensor], dict[str, list[str]]]:
    """(record, tensors, phrases) of a finished OTI folder; anything missing is refused by name."""
    from ..utils.io import load_tensors, read_json
    folder = Path(folder)
    for name in (OTI_RECORD, OTI_TOKENS, OTI_PHRASES):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} is missing: --oti takes a finished folder of `foco searle oti`"
                                    " (rerun that command to finish it)")
    from ..records import read
    record = read(OTI_RECORD, folder / OTI_RECORD)
    fix = "run `foco searle oti` again into a new --out"
    tensors = load_tensors(folder / OTI_TOKENS, fix)
    phrases = read_json(folder / OTI_PHRASES)
    if not isinstance(phrases, dict) or not all(isinstance(v, list) and v for v in phrases.values()):
        raise ValueError(f"{folder / OTI_PHRASES} is not a concept -> phrases map; {fix}")
    n = int(record["images"])
    for key, shape in (("tokens", 2), ("ema", 2), ("rows", 1), ("concepts", 2)):
        if key not in tensors or tensors[key].ndim != shape or tensors[key].shape[0] != n:
            raise ValueError(f"{folder / OTI_TOKENS}: {key!r} is missing or not {n} rows; run `foco searle oti` again")
    return record, tensors, phrases


class SEARLEObjective(torch.nn.Module):
    """SEARLE's phi loss as a module's forward: phi is trained, the text tower is frozen and held outside."""

    def __init__(self, phi: SEARLEPhi, backbone: PseudoTokenBackbone, cfg: SEARLETrainConfig):
        super().__init__()
        self.phi, self.cfg = phi, cfg
        self.placeholder = "*"  # the word read as phi's token (the reference check reads "$")
        self.__dict__["backbone"] = backbone

    def forward(self, v_raw: torch.Tensor, target: torch.Tensor, token_phrases: list[str],
                phrase_emb: torch.Tensor) -> Losses:
        """v_raw (b, D) raw image embeddings; target (b, E) their EMA OTI tokens; token_phrases (b,) phrases with
        the concept replaced by *; phrase_emb (b, D) the phrases' own normalised embeddings."""
        est = self.phi(v_raw)  # (b, E)
        distil = nt_xent(target, est, self.cfg.temperature)
        f = self.backbone.encode_texts_with_tokens(token_phrases, est, self.placeholder, keep=(1, 0)).global_  # (b, D)
        gpt = _cosine_loss(f, phrase_emb)
        return {"loss": self.cfg.lambda_distil * distil + self.cfg.lambda_gpt * gpt, "distil": distil, "gpt": gpt}


def train_searle(image_raw: torch.Tensor, oti: tuple[dict, dict, dict], backbone: PseudoTokenBackbone,
                 out: str | Path, cfg: SEARLETrainConfig | None = None, resume: bool = False,
                 meta: dict | None = None, ctx: RunContext | None = None) -> SEARLEPhi:
    """Distils phi from an OTI folder's EMA tokens (`read_oti`): `image_raw` (N, D) the raw embeddings of the cache
    OTI inverted (its `rows` are picked here). Writes `out`/searle.safetensors + searle.json and the training log;
    resumable (`resume=True`). One process (`ctx`: its device)."""
    cfg = cfg if cfg is not None else SEARLETrainConfig()
    record, tensors, phrases = oti
    if record["backbone"] != backbone.spec:
        raise ValueError(f"the OTI tokens are of {record['backbone']}, the backbone is {backbone.spec}: distil phi "
                         "with the backbone OTI ran with (leave --backbone out)")
    cfg = replace(cfg, model=replace(cfg.model, embed_dim=int(backbone.embed_dim),
                                     token_dim=int(backbone.token_dim)))
    ctx = (ctx or context(cfg.device)).for_run(cfg.seed, out)
    if ctx.enabled:
        raise ValueError("foco searle train runs in one process (no torchrun)")
    check_out(ctx, resume)
    from ..world.phrases import usable_concepts
    concepts = record["concepts"]
    usable = usable_concepts(phrases, "*")
    choices = image_concepts(tensors["concepts"], concepts, usable, cfg.top_k)
    rows = tensors["rows"].long()
    if int(rows.max()) >= image_raw.shape[0] or int(rows.min()) < 0:
        raise ValueError(f"the OTI tokens name image row {int(rows.max())} of a cache of {image_raw.shape[0]}: give "
                         "the feature cache OTI inverted")

    def build(env: RunContext) -> Plan:
        g = torch.Generator().manual_seed(cfg.seed)  # concepts and phrases drawn per step; saved on resume
        phi = SEARLEPhi(cfg.model).to(env.device)
        v = image_raw[rows].float().to(env.device)  # (n, D)
        target = tensors["ema"].float().to(env.device)  # (n, E)
        bank = PhraseBank(backbone, phrases, env.device)
        objective = SEARLEObjective(phi, backbone, cfg)

        def step(idx: torch.Tensor) -> Losses:
            mine = rank_slice(idx, env)
            picked = [_draw(choices[i], g) for i in mine.tolist()]  # (b,) concepts
            regs = [_draw(phrases[c], g) for c in picked]
            dev = mine.to(env.device)
            return objective(v[dev], target[dev], [r.replace(c, " * ") for r, c in zip(regs, picked)],
                             bank.embed(regs, picked))

        def optimizer() -> torch.optim.Optimizer:
            return torch.optim.AdamW(phi.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

        n, B = len(rows), min(cfg.batch_size, len(rows))
        loop = LoopConfig(n, B, warmup_frac=0.0, grad_clip=0.0, max_steps=cfg.max_steps, name="SEARLE",
                          schedule="constant", identity={"backbone": backbone.spec,
                                                         "oti_sha256": _sha256(tensors["ema"])}, settings=settings_of(cfg),
                          allow_changed=frozenset(cfg.allow_changed))
        return Plan(phi, [Phase(cfg.epochs, optimizer, step)], loop, lambda history: phi.save(
            env.out, {"backbone": backbone.spec, "images": n, **recorded_settings(history), **(meta or {})}),
            generator=g)
    return train_run(ctx, build, resume).model
