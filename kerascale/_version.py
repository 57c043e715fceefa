"""kerascale's version, in a module of its own so that any stage can read it
without importing the package's front doors."""

__version__ = "0.1.0"
