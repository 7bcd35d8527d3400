"""`python -m foco` is `foco`."""
import sys

from .cli import main

sys.exit(main())
