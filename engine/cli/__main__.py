"""`python -m engine.cli ...`: the same as the `orchard` console script."""

import sys

from engine.cli import main

sys.exit(main())
