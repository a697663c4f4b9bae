"""wamkit: post-train Cosmos3 into robot action policies and action-conditioned world models."""

__version__ = "0.1.0"
