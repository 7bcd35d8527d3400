"""FoCo's two learnable modules and the composed-query encoder shared by training, evaluation and serving."""
from .aggr import FAggr
from .comp import FComp
from .encoder import ComposedQueryEncoder, FoCoConfig

__all__ = ["FAggr", "FComp", "ComposedQueryEncoder", "FoCoConfig"]
