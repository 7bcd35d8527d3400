"""foco: Focus-then-Complete zero-shot composed image retrieval.

The public API. `import foco` needs only torch and numpy; heavier pieces load when first used.
"""
from .backbones import Backbone, ImageFeatures, TextFeatures, create_backbone, list_backbones

__version__ = "0.1.0"
__all__ = ["Backbone", "ImageFeatures", "TextFeatures", "create_backbone", "list_backbones", "__version__"]
