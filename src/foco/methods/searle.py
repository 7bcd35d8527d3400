"""SEARLE-XL (Baldrati et al., ICCV 2023, "Zero-Shot Composed Image Retrieval with Textual Inversion"), as its public
code runs it (miccunifi/SEARLE at a9c314b: phi.py, oti_inversion.py, train_phi.py, utils.py, validate.py).

Two stages, both with the backbone frozen:

1. **OTI**, optimisation-based textual inversion (`foco.train.searle.run_oti`): for each image, a free token
   embedding s (E,) is optimised so that the text embedding of a template with * = s matches the image's, and the
   text embedding of a concept phrase with the concept replaced by * matches the phrase's own (the GPT phrases of
   the reference; on the world, `foco.world.phrases`). An exponential moving average of s is kept.
2. **phi**, a textual-inversion network distilled from OTI (`foco.train.searle.train_searle`): phi(v) of the raw
   image embedding v must pick out that image's OTI token among the batch (a symmetric NT-Xent at temperature 0.25),
   with the same phrase regulariser.

At query time SEARLE is LinCIR's query (phi is the same network: Linear(D, 4D), GELU, Dropout(0.5), Linear(4D, 4D),
GELU, Dropout(0.5), Linear(4D, E)): the text embedding of "a photo of * that {modification}" with * = phi(raw v),
validate.py's template with foco's placeholder "*" for the reference's "$". `experiments/searle_reference.py` checks
phi, the losses, the templates and the pseudo-token text path against the reference code.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .base import MethodOption
from .lincir import LinCIRMethod, LinCIRPhi

WEIGHTS, CONFIG = "searle.safetensors", "searle.json"

# The templates of OTI's image term: utils.get_templates(), PALAVRA's 24, formatted with " * " for the reference's
# " $ ".
TEMPLATES: tuple[str, ...] = (
    "This is a photo of a {}", "This photo contains a {}", "A photo of a {}", "This is an illustration of a {}",
    "This illustration contains a {}", "An illustrations of a {}", "This is a sketch of a {}",
    "This sketch contains a {}", "A sketch of a {}", "This is a diagram of a {}", "This diagram contains a {}",
    "A diagram of a {}", "A {}", "We see a {}", "{}", "We see a {} in this photo", "We see a {} in this image",
    "We see a {} in this illustration", "We see a {} photo", "We see a {} image", "We see a {} illustration",
    "{} photo", "{} image", "{} illustration",
)


@dataclass
class SEARLEConfig:
    embed_dim: int = 256  # D, the joint space (set from the backbone)
    token_dim: int = 384  # E, the text tower's token-embedding width (set from the backbone)
    hidden_ratio: int = 4  # phi's hidden width, x D (hubconf.py / train_phi.py: 4 * output_dim)
    dropout: float = 0.5  # --phi-dropout
    query_template: str = "a photo of * that {}"  # validate.py's, with foco's placeholder
    placeholder: str = "*"


class SEARLEPhi(LinCIRPhi):
    """SEARLE's Phi (phi.py), in the reference's layout (`layers.{0,3,6}`), recorded as searle.json."""

    NAME, LABEL, WEIGHTS, CONFIG, TRAIN = "searle", "SEARLE", WEIGHTS, CONFIG, "foco searle train"
    CONFIG_CLASS = SEARLEConfig


PHI = MethodOption("searle", "--searle", "a SEARLE phi folder of `foco searle train`", parse=Path,
                   record="searle.json")


class SEARLEMethod(LinCIRMethod):
    """Composed queries from SEARLE's phi: the text embedding of the template with * = phi(raw v_reference)."""

    options = (PHI,)
    PHI_CLASS = SEARLEPhi
