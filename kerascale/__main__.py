"""`python -m kerascale ...` is the `kerascale` console script."""

import sys

from kerascale.cli import main

if __name__ == "__main__":  # not when imported (the docs build inspects it)
    sys.exit(main())
