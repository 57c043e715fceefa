"""`python -m kerascale ...` is the `kerascale` console script."""

import sys

from kerascale.cli import main

sys.exit(main())
