"""`python -m foco.cli` is `foco` too."""
import sys

from . import main

sys.exit(main())
