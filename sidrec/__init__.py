"""sidrec: generative recommendation with semantic IDs, as a reproducible pipeline."""

__version__ = "0.1.0"
