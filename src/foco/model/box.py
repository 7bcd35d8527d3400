"""Box anchoring (AdaFocal, OACIR): a bounding box on the reference image steers F_Aggr's attention.

A box (x0, y0, x1, y1) in pixels of the reference image marks the instance the modification is about. It becomes
an additive modulation beta on F_Aggr's attention logits for the patches inside the box (`FAggr(attn_bias=...)`):

    logits_p <- logits_p + beta * [patch p inside the box],

so that attention mass moves into the box as beta grows (beta = 0 is plain FoCo). AdaFocal predicts beta from the
query with its CAAM (`foco.model.caam`, `foco adafocal`); here beta is a fixed scalar chosen on val.

The sign says what the box means. In AdaFocal the box marks the instance to *preserve*: beta > 0. FoCo's F_Aggr
localizes the part that F_Comp then completes with the text (in training: the object the contextual caption leaves
out, which the target keeps), so a box around the object to *change* (the ambiguous world benchmark) calls for
beta < 0, pushing attention onto the rest of the image. On the quickstart world run, beta < 0 raises FoCo's
instance accuracy on that benchmark and beta > 0 lowers it (experiments/field_table.py).

Patches are the backbone's square grid (world: `WorldBackboneConfig.image_size // 8` per side; CLIP/SigLIP:
sqrt(num_patches)), row-major as the towers flatten them. A box is mapped onto the grid of the reference's centre
square (`centre_square_mask`, `query_box_masks`): what CLIP's processor keeps after its resize and centre crop, and
the whole image for square ones (the world's). Evaluation, training and `foco search` / `foco serve` map boxes
through it alike. (SigLIP's processor squashes instead of cropping: its non-square references would need the
box scaled per axis.)
"""
from __future__ import annotations

import math

import torch


def patch_grid(num_patches: int) -> int:
    """The side g of a square g x g patch grid."""
    g = math.isqrt(num_patches)
    if g * g != num_patches:
        raise ValueError(f"{num_patches} patches do not form a square grid")
    return g


def box_cover(boxes: torch.Tensor, image_size: int | tuple[int, int], grid: int) -> torch.Tensor:
    """(B, 4) boxes (x0, y0, x1, y1) in pixels of a W x H image -> (B, g*g) fraction of each patch cell they cover.
    Rows of NaN (no box) cover nothing."""
    W, H = (image_size, image_size) if isinstance(image_size, int) else image_size
    boxes = boxes.float()
    edges_x = torch.linspace(0, W, grid + 1)  # (g+1,)
    edges_y = torch.linspace(0, H, grid + 1)  # (g+1,)
    x0, y0, x1, y1 = (boxes[:, i:i + 1] for i in range(4))  # (B, 1) each
    ox = (torch.minimum(x1, edges_x[1:]) - torch.maximum(x0, edges_x[:-1])).clamp_min(0) / (W / grid)  # (B, g)
    oy = (torch.minimum(y1, edges_y[1:]) - torch.maximum(y0, edges_y[:-1])).clamp_min(0) / (H / grid)  # (B, g)
    cover = oy[:, :, None] * ox[:, None, :]  # (B, g rows, g cols)
    return torch.nan_to_num(cover, nan=0.0).flatten(1)  # (B, g*g), row-major


def box_patch_mask(boxes: torch.Tensor, image_size: int | tuple[int, int], grid: int, min_cover: float = 0.25
                   ) -> torch.Tensor:
    """(B, g*g) bool: patches at least `min_cover` inside the box; a box smaller than that still gets its
    best-covered patch. Rows without a box (NaN) are all False."""
    cover = box_cover(boxes, image_size, grid)  # (B, P)
    mask = cover >= min_cover
    best = cover.argmax(1)  # (B,)
    has_box = cover.amax(1) > 0  # (B,)
    mask[torch.arange(len(mask))[has_box], best[has_box]] = True
    return mask


def box_attention_bias(boxes: torch.Tensor, beta: float, image_size: int | tuple[int, int], grid: int,
                       min_cover: float = 0.25) -> torch.Tensor:
    """(B, g*g) additive attention-logit bias: beta inside the box, 0 elsewhere (and everywhere without a box)."""
    return beta * box_patch_mask(boxes, image_size, grid, min_cover).float()


def attention_mass(attention: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, P) attention (summing to 1 over P) and (B, P) bool mask -> (B,) attention mass inside the mask."""
    return (attention * mask.float()).sum(-1)


def centre_square_mask(boxes: torch.Tensor, sizes: torch.Tensor, num_patches: int, min_cover: float = 0.25
                       ) -> torch.Tensor:
    """(Q, 4) boxes x0, y0, x1, y1 in pixels of references of (Q, 2) sizes W, H (NaN rows: no box) -> (Q, P) bool
    patches inside each box, on the square patch grid of the reference's centre square: what CLIP's processor
    keeps (resize, centre crop); the whole image when it is square (the world's)."""
    boxes, sizes = boxes.float(), sizes.float()  # (Q, 4), (Q, 2)
    side = sizes.amin(1, keepdim=True)  # (Q, 1)
    offset = ((sizes - side) / 2).repeat(1, 2)  # (Q, 4): ox, oy, ox, oy
    unit = ((boxes - offset) / side).clamp(0.0, 1.0)  # (Q, 4) in [0, 1]; NaN stays NaN
    return box_patch_mask(unit, (1, 1), patch_grid(num_patches), min_cover)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(Q, 4) and (Q, 4) boxes x0, y0, x1, y1 -> (Q,) intersection over union, row by row."""
    ix = (torch.minimum(a[:, 2], b[:, 2]) - torch.maximum(a[:, 0], b[:, 0])).clamp_min(0)  # (Q,)
    iy = (torch.minimum(a[:, 3], b[:, 3]) - torch.maximum(a[:, 1], b[:, 1])).clamp_min(0)  # (Q,)
    inter = ix * iy
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    return inter / (area(a) + area(b) - inter)


def perturb_boxes(boxes: torch.Tensor, iou: float, shift: bool, generator: torch.Generator,
                  scale_iou: float = 0.8) -> torch.Tensor:
    """AdaFocal's box robustness (its Table 10): (Q, 4) boxes -> (Q, 4) boxes at IoU `iou` with the originals.

    shift=False ("scale"): each box grows about its centre by 1 / sqrt(iou) per side, so that its IoU is exactly
    `iou`. shift=True ("scale + shift"): it grows to IoU `scale_iou`, then moves in a random direction (drawn from
    `generator`, a CPU generator, whatever the boxes' device) by the distance, found by bisection, at which the IoU falls to `iou`. Boxes are not clipped to the
    image (the patch mask covers what lies inside)."""
    boxes = boxes.float()
    if not 0 < iou <= 1:
        raise ValueError(f"IoU {iou} is outside (0, 1]")
    if shift and not iou < scale_iou <= 1:
        raise ValueError(f"a shift to IoU {iou} starts from a scaled IoU above it, not {scale_iou}")
    s = 1.0 / math.sqrt(scale_iou if shift else iou)
    centre = (boxes[:, :2] + boxes[:, 2:]) / 2  # (Q, 2)
    half = (boxes[:, 2:] - boxes[:, :2]) / 2 * s  # (Q, 2)
    grown = torch.cat([centre - half, centre + half], 1)  # (Q, 4)
    if not shift:
        return grown
    angle = torch.rand(len(boxes), generator=generator).to(boxes.device) * 2 * math.pi  # (Q,), drawn on the CPU
    direction = torch.stack([angle.cos(), angle.sin()], 1)  # (Q, 2)
    lo, hi = torch.zeros(len(boxes), device=boxes.device), 4 * half.norm(dim=1)  # (Q,): beyond any IoU
    for _ in range(60):  # IoU falls monotonically with the distance
        mid = (lo + hi) / 2
        moved = grown + (direction * mid[:, None]).repeat(1, 2)
        above = box_iou(boxes, moved) > iou
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    return grown + (direction * ((lo + hi) / 2)[:, None]).repeat(1, 2)


def query_box_masks(queries, num_patches: int, min_cover: float = 0.25) -> torch.Tensor | None:
    """(Q, P) bool masks of benchmark queries' boxes (`CIRQuery.box` in pixels of an image of `box_size`, OACIR)
    on the reference's centre-square patch grid (`centre_square_mask`); rows of queries without a box are all False.
    None when no query has a box. A box without the size of its image, or one that covers no patch of the centre
    square (outside what the towers see), is refused naming the query: it would otherwise read as "no box"."""
    if not any(q.box is not None for q in queries):
        return None
    unsized = [q.id for q in queries if q.box is not None and q.box_size is None]
    if unsized:
        raise ValueError(f"query {unsized[0]} has a box but not the size of the image it is drawn in "
                         f"({len(unsized)} such queries)")
    nan = (float("nan"),) * 4  # built on the CPU from the queries' metadata; batches carry the masks to the device
    boxes = torch.tensor([q.box if q.box is not None else nan for q in queries], dtype=torch.float32)  # (Q, 4)
    sizes = torch.tensor([q.box_size or (1, 1) for q in queries], dtype=torch.float32)  # (Q, 2)
    masks = centre_square_mask(boxes, sizes, num_patches, min_cover)  # (Q, P)
    empty = [q.id for q, m in zip(queries, masks) if q.box is not None and not bool(m.any())]
    if empty:
        raise ValueError(f"the box of query {empty[0]} lies outside the centre square the backbone sees "
                         f"({len(empty)} such queries): crop or pad the reference so that its box is inside")
    return masks
