"""ddlrepro: reproduce distributed and elastic deep-learning training figures with Snakemake."""

__version__ = "0.1.0"
