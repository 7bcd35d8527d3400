"""The cross-instance sigmoid objectives of FoCo (paper §3.3, eqs. 2-4), computed batched over the B x B grid.

    phi±(u, v) = log sigmoid(±(sim(u, v) / tau + b))       (b = 0 unless the learnable bias is switched on)

    L_aggr_i = -[ Σ_k phi+(v_loc(i | c_ik), c_ik) + Σ_{j≠i} phi-(v_loc(i | c_jk'), c_jk') ]
    L_comp_i = -[ Σ_k phi+(h(i | c_ik, X_ik), v_g_i) + Σ_{j≠i} phi-(h(i | c_jk', X_jk'), v_g_j) ]

k' is one local caption sampled per image j and step. The negatives pair image i with image j's anchor *and* score
against j's own text (L_aggr) or j's own image (L_comp), so that neither the text alone nor the image alone can
tell a positive from a negative. Losses are averaged over the B anchors. No Python loop runs over pairs: the grid
is a batch of F_Aggr queries (images x texts) and a batch of F_Comp queries (contexts x images).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..model.encoder import ComposedQueryEncoder
from .data import TrainBatch

if TYPE_CHECKING:
    from .edit_data import EditBatch


@dataclass
class NegativePlan:
    """Which negatives one step uses: the sampled k' of every image, and the columns j of the grid."""

    neg_k: torch.Tensor  # (B,) long, index of the sampled local caption of each image j
    columns: torch.Tensor  # (M,) long, images j whose anchors are used as negatives (all B unless capped)


def plan_negatives(local_mask: torch.Tensor, max_negatives: int | None = None,
                   generator: torch.Generator | None = None) -> NegativePlan:
    """Samples k' uniformly among each image's existing pairs; caps the grid at `max_negatives` + 1 columns."""
    B, K = local_mask.shape
    weights = local_mask.float()
    neg_k = torch.multinomial(weights, 1, generator=generator)[:, 0]  # (B,)
    return NegativePlan(neg_k, plan_columns(B, max_negatives, generator, local_mask.device))


def plan_columns(B: int, max_negatives: int | None, generator: torch.Generator | None = None,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """(M,) long, the images j of a batch of B whose anchors are the grid's columns: all B, or `max_negatives` + 1
    of them drawn from `generator`."""
    if max_negatives is None or max_negatives >= B - 1:
        return torch.arange(B, device=device)
    return torch.randperm(B, generator=generator, device=device)[: max_negatives + 1].sort().values


def plan_on(plan: NegativePlan, device: torch.device) -> NegativePlan:
    """The plan (drawn on the CPU from the CPU generator, so that every device draws the same negatives) on
    `device`."""
    from ..utils.device import to_device  # pinned, then a copy that does not wait for the GPU's queue
    return NegativePlan(to_device(plan.neg_k, device), to_device(plan.columns, device))


def _phi(logits: torch.Tensor, sign: float) -> torch.Tensor:
    return F.logsigmoid(sign * logits)


def _scale(log_scale: torch.Tensor) -> torch.Tensor:
    return log_scale.exp().clamp(max=100.0)


@dataclass
class Columns:
    """What each image j of the (global) batch brings to the grid as a negative column."""

    anchor: torch.Tensor  # (B, D) c_jk', its sampled local caption
    ctx_tokens: torch.Tensor | None  # (B, L, D) X_jk', the matching contextual caption (stage 2)
    ctx_mask: torch.Tensor | None  # (B, L) bool
    image_global: torch.Tensor  # (B, D) v_g_j


def local_columns(batch: TrainBatch, neg_k: torch.Tensor, with_comp: bool) -> Columns:
    """The columns this batch's images contribute, with each image's sampled k' `neg_k` (b,)."""
    rows = torch.arange(batch.local.shape[0], device=batch.local.device)
    return Columns(batch.local[rows, neg_k],
                   batch.ctx_tokens[rows, neg_k] if with_comp else None,
                   batch.ctx_mask[rows, neg_k] if with_comp else None,
                   batch.image_global)


LOSSES = ("sigmoid", "infonce")
NEGATIVES = ("cross-instance", "naive-aggr", "naive-comp", "naive")  # naive: 2b and 2c at once


def _objective(pos: torch.Tensor, neg: torch.Tensor, pos_mask: torch.Tensor, neg_valid: torch.Tensor,
               loss: str) -> torch.Tensor:
    """The loss of the positive logits pos (b, K) and negative logits neg (b, M), averaged over the b rows.

    sigmoid (the paper's, eqs. 2-3): -[Σ_k phi+(pos_ik) + Σ_j phi-(neg_ij)].
    infonce (ablation 2a): every positive against its row's negatives, -Σ_k log softmax([pos_ik, neg_i.])_0."""
    if loss == "sigmoid":
        return -((_phi(pos, 1) * pos_mask).sum(1) + (_phi(neg, -1) * neg_valid).sum(1)).mean()
    negs = neg.masked_fill(~neg_valid, float("-inf"))[:, None, :].expand(-1, pos.shape[1], -1)  # (b, K, M)
    lse = torch.logsumexp(torch.cat([pos[..., None], negs], -1), -1)  # (b, K)
    return -((pos - lse) * pos_mask).sum(1).mean()


def foco_losses(model: ComposedQueryEncoder, batch: TrainBatch, plan: NegativePlan, with_comp: bool,
                columns: Columns | None = None, row_offset: int = 0, loss: str = "sigmoid",
                negatives: str = "cross-instance") -> dict[str, torch.Tensor]:
    """L_aggr (always) and L_comp (stage 2), averaged over the batch's rows. Returns {"loss", "aggr", "comp"}.

    Ablations (paper Table 2; the defaults are the paper's): `loss` "infonce" (2a, `_objective`); `negatives`
    "naive-aggr" (2b): L_aggr's negative, image i conditioned on image j's anchor c_jk', is scored against image i's
    own sampled anchor c_ik' instead of c_jk' (the paper's §3.3 example: told apart by the texts alone);
    "naive-comp" (2c): L_comp's negative, image i's localised feature completed with j's context, is scored
    against image i's own v_g instead of j's; "naive": both at once (foco's merged 2b/2c before issue 40).

    One process: `batch` is the whole batch and the columns come from it. Data-parallel
    (`foco.train.distributed`): `batch` holds this rank's b rows, which are rows `row_offset`.. of the global
    batch; `columns` and `plan` cover the global batch, so each rank computes its rows of the global grid."""
    b, K, D = batch.local.shape
    rows = torch.arange(b, device=batch.local.device)
    if columns is None:
        columns = local_columns(batch, plan.neg_k, with_comp)
    J = plan.columns
    kv = model.aggr.keys_values(batch.patches)
    # positives: every local caption of its own image
    v_pos, bg_pos, _ = model.aggr(batch.local, batch.image_global, batch.patches, kv)  # (b, K, D) x2
    # negatives: image i anchored by the sampled caption of image j
    anchors = columns.anchor[J]  # (M, D)
    v_neg, bg_neg, _ = model.aggr(anchors[None].expand(b, -1, -1), batch.image_global, batch.patches, kv)  # (b, M, D)
    valid = J[None, :] != (rows + row_offset)[:, None]  # (b, M), j ≠ i

    naive_aggr, naive_comp = negatives in ("naive", "naive-aggr"), negatives in ("naive", "naive-comp")
    s_a, b_a = _scale(model.log_scale_aggr), model.bias_aggr
    pos = s_a * F.cosine_similarity(v_pos, batch.local, dim=-1) + b_a  # (b, K)
    own = batch.local[rows, plan.neg_k[rows + row_offset]][:, None] if naive_aggr else anchors[None]  # (b|1, ., D)
    neg = s_a * F.cosine_similarity(v_neg, own, dim=-1) + b_a  # (b, M): vs c_jk' (naive: vs i's own c_ik')
    # no F_Aggr (ablations 1a, 1c: `FixedFocus`): L_aggr has nothing to train and is left out
    out = {"aggr": _objective(pos, neg, batch.local_mask, valid, loss) if model.aggr.trainable else pos.new_zeros(())}
    if with_comp:
        L = batch.ctx_tokens.shape[2]
        h_pos = model.comp(v_pos.reshape(b * K, 1, D), bg_pos.reshape(b * K, 1, D),
                           batch.ctx_tokens.reshape(b * K, L, D), batch.ctx_mask.reshape(b * K, L))  # (b*K, 1, D)
        h_pos = h_pos.view(b, K, D)
        x_neg, x_neg_mask = columns.ctx_tokens[J], columns.ctx_mask[J]  # (M, L', D), (M, L')
        h_neg = model.comp(v_neg.transpose(0, 1), bg_neg.transpose(0, 1), x_neg, x_neg_mask)  # (M, b, D)
        h_neg = h_neg.transpose(0, 1)  # (b, M, D)
        s_c, b_c = _scale(model.log_scale_comp), model.bias_comp
        pos_c = s_c * (h_pos * batch.image_global[:, None, :]).sum(-1) + b_c  # (b, K)
        target = batch.image_global[:, None, :] if naive_comp else columns.image_global[J][None]  # (b|1, ., D)
        neg_c = s_c * (h_neg * target).sum(-1) + b_c  # (b, M): vs v_g of j (naive: vs i's own v_g)
        out["comp"] = _objective(pos_c, neg_c, batch.local_mask, valid, loss)
    out["loss"] = out["aggr"] + out.get("comp", 0.0)
    return out


def edit_losses(model: ComposedQueryEncoder, batch: "EditBatch", temperature: float, preserve_weight: float,
                use_negatives: bool, image_weight: float = 0.0, env=None) -> dict[str, torch.Tensor]:
    """FoCo's edit stage (foco-edits; not in the FoCo paper, after PACT's preserve-and-compose objectives):

        h_b = h(source_b | instruction_b as anchor and context),  t_b = target caption, v_b = source image
        L_compose  = [CE(h T^T / tau ++ h.negatives_b / tau, b) + CE(T h^T / tau, b)] / 2
        L_preserve = CE(h V^T / tau, b)
        L_image    = CE(h_r I^T / tau, r) over the triplets r with a retrieved target image I_r (`image_weight`)
        loss = L_compose + preserve_weight * L_preserve + image_weight * L_image

    The negative captions (the edit not applied, applied to the wrong phrase) join each query's candidates as hard
    negatives when `use_negatives`. Returns {"compose", "preserve", "loss"}.

    Data-parallel (`env` of `foco.train.distributed`, under torchrun): `batch` is this rank's rows. Targets, source
    images and target images are cached features, gathered without gradient; the queries come out of the trained
    model and are gathered with it (the T h^T direction needs every rank's queries). Each term is this rank's rows'
    share of the global batch's mean, so that DDP's average over ranks is the one-process gradient."""
    h = model.encode(batch.reference, batch.instruction).query  # (b, D), normalised
    compose = compose_loss(h, batch.target, batch.negatives if use_negatives else None, batch.negative_mask,
                           temperature, env)
    preserve = info_nce(h, F.normalize(batch.reference.global_, dim=-1), temperature, env)
    out = {"compose": compose, "preserve": preserve, "loss": compose + preserve_weight * preserve}
    if image_weight > 0:
        term = _target_image_loss(h, batch, temperature, env)
        if term is not None:
            out["target_image"] = term
            out["loss"] = out["loss"] + image_weight * term
    return out


def _target_image_loss(h: torch.Tensor, batch: "EditBatch", temperature: float, env) -> torch.Tensor | None:
    """L_image over the triplets with a retrieved target image; None when the (global) batch has none."""
    from .distributed import DistEnv
    env = env or DistEnv()
    if not env.enabled:
        if not bool(batch.has_target_image.any()):
            return None
        rows = batch.has_target_image.nonzero().flatten()  # triplets with a retrieved target image
        return info_nce(h[rows], batch.target_image[rows], temperature)
    from .distributed import gather_rows
    has = gather_rows(batch.has_target_image.to(torch.uint8), env).bool()  # (B,)
    total = int(has.sum())
    if total == 0:
        return None
    images = gather_rows(batch.target_image, env)[has]  # (R, D), the candidates, in global row order
    b = h.shape[0]
    mine = has[env.rank * b:(env.rank + 1) * b]  # (b,)
    position = torch.cumsum(has.long(), 0) - 1  # global row -> its index among the candidates
    labels = position[env.rank * b:(env.rank + 1) * b][mine]
    if not bool(mine.any()):
        return (h.sum() * 0.0)  # this rank has none: it adds nothing, but joins the gradient's all-reduce
    ce = F.cross_entropy(h[mine] @ images.t() / temperature, labels, reduction="sum")
    return ce * env.world_size / total  # this rank's share of the global mean, as DDP averages over ranks


def info_nce(query: torch.Tensor, keys: torch.Tensor, temperature: float, env=None) -> torch.Tensor:
    """CE(query keys^T / tau, b): query b's positive is key b; both (B, D) normalised.

    Data-parallel (`env`), the rows are this rank's and the keys, cached features, are gathered without gradient;
    the result is this rank's share of the global mean (`foco.train.distributed`)."""
    if env is None or not env.enabled:
        return F.cross_entropy(query @ keys.t() / temperature, torch.arange(query.shape[0], device=query.device))
    from .distributed import gather_rows, row_offset
    labels = torch.arange(query.shape[0], device=query.device) + row_offset(query.shape[0], env)
    return F.cross_entropy(query @ gather_rows(keys, env).t() / temperature, labels)


def compose_loss(query: torch.Tensor, target: torch.Tensor, negatives: torch.Tensor | None,
                 negative_mask: torch.Tensor | None, temperature: float, env=None) -> torch.Tensor:
    """Symmetric InfoNCE of B queries (B, D) against their targets (B, D); with `negatives` (B, Kn, D)
    (valid where `negative_mask` (B, Kn)), each query's own negative captions join its candidates:

        [CE(q T^T / tau ++ q.negatives_b / tau, b) + CE(T q^T / tau, b)] / 2

    Data-parallel (`env`), the rows are this rank's b of the global B: the targets (cached features) are gathered
    without gradient, the queries (the trained model's output) with it, because the T q^T direction scores this
    rank's targets against every rank's queries. Each rank returns its rows' mean; with equal b per rank, DDP's
    average over ranks is the one-process gradient."""
    b = query.shape[0]
    if env is None or not env.enabled:
        labels = torch.arange(b, device=query.device)
        targets, queries = target, None
    else:
        from .distributed import gather_rows, gather_with_grad, row_offset
        labels = torch.arange(b, device=query.device) + row_offset(b, env)
        targets, queries = gather_rows(target, env), gather_with_grad(query, env)  # (B, D), (B, D) with grad
    to_targets = query @ targets.t() / temperature  # (b, B)
    candidates = to_targets
    if negatives is not None:
        neg = torch.einsum("bd,bkd->bk", query, negatives) / temperature  # (b, Kn)
        candidates = torch.cat([to_targets, neg.masked_fill(~negative_mask, float("-inf"))], 1)  # (b, B + Kn)
    reverse = to_targets.t() if queries is None else target @ queries.t() / temperature  # (b, B)
    return 0.5 * (F.cross_entropy(candidates, labels) + F.cross_entropy(reverse, labels))
