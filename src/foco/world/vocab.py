"""The vocabulary of the embedded world: object kinds, colours, sizes and backgrounds.

Everything a caption or a modification text can say about a scene is listed here, so that the generator, the
captioner and the edit writer agree on one set of words.
"""
from __future__ import annotations

# Procedural shapes, drawn with PIL by `render.py`. Ten kinds: at least 8 are required.
SHAPES: tuple[str, ...] = (
    "circle", "square", "triangle", "star", "heart", "diamond", "hexagon", "cross", "crescent", "arrow",
)

# Colour name -> RGB. Twelve colours, chosen to stay distinguishable at 64 px.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 40),
    "blue": (30, 70, 230),
    "yellow": (245, 220, 20),
    "orange": (250, 140, 0),
    "purple": (140, 40, 190),
    "pink": (255, 120, 200),
    "white": (250, 250, 250),
    "black": (15, 15, 15),
    "brown": (130, 75, 25),
    "grey": (135, 135, 135),
    "cyan": (20, 215, 230),
}

# Size word -> object side as a fraction of one layout cell (the image is a 2 x 2 grid of cells).
SIZES: dict[str, float] = {"small": 0.45, "large": 0.82}
SIZE_COMPARATIVE = {"small": "smaller", "large": "bigger"}

# Backgrounds: name -> (how captions place a scene there, how an instruction names it, render recipe).
BACKGROUNDS: dict[str, dict] = {
    "beach": {"phrases": ["on a beach", "at the beach"], "noun": "a beach",
              "top": (135, 200, 250), "bottom": (238, 214, 160), "pattern": "horizon"},
    "forest": {"phrases": ["in a forest", "among the trees of a forest"], "noun": "a forest",
               "top": (20, 90, 35), "bottom": (60, 120, 40), "pattern": "trunks"},
    "night sky": {"phrases": ["under a night sky", "against the night sky"], "noun": "a night sky",
                  "top": (10, 15, 50), "bottom": (30, 30, 80), "pattern": "dots"},
    "snow": {"phrases": ["in the snow", "on a snowy field"], "noun": "snow",
             "top": (215, 225, 240), "bottom": (245, 248, 255), "pattern": "flakes"},
    "desert": {"phrases": ["in a desert", "on desert sand"], "noun": "a desert",
               "top": (250, 200, 120), "bottom": (210, 150, 80), "pattern": "dunes"},
    "grass": {"phrases": ["on green grass", "on a lawn"], "noun": "grass",
              "top": (110, 190, 70), "bottom": (80, 160, 50), "pattern": "blades"},
    "brick wall": {"phrases": ["in front of a brick wall", "before a brick wall"], "noun": "a brick wall",
                   "top": (160, 70, 50), "bottom": (150, 60, 45), "pattern": "bricks"},
    "ocean": {"phrases": ["under the ocean", "underwater"], "noun": "the ocean",
              "top": (20, 110, 170), "bottom": (10, 50, 110), "pattern": "waves"},
}

# Instance marks: small patterns drawn inside a procedural shape in its outline colour, so that two objects of one
# kind, colour and size are told apart (the OACIR protocol, `oacir.py`). Benchmark texts and FoCo's training captions
# never name them; a share of the pretraining captions may (`WorldConfig.mark_captions`, issue 56), as alt-text
# sometimes names a detail, with the phrases of `MARK_PHRASES` ("a red circle with a ring").
MARKS: tuple[str, ...] = ("dot", "ring", "bar", "slash", "two dots", "corner")
MARK_PHRASES: dict[str, str] = {"dot": "a dot", "ring": "a ring", "bar": "a bar", "slash": "a slash",
                                "two dots": "two dots", "corner": "a corner"}

IMAGE_SIZE = 64  # rendered side in pixels
GRID = 2  # layout is a GRID x GRID array of cells; one object per cell
MAX_OBJECTS = GRID * GRID
