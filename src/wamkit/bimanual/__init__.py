"""Sim-bimanual action-conditioned world model: the local bundle format, its validator and dataset."""

from wamkit.bimanual.bundle import (
    BundleTransform, BundleWindows, build_bundle_run_data, is_bundle, open_bundle, validate_bundle, validate_main,
    write_synthetic_bundle,
)
from wamkit.bimanual.schema import ACTION_DIM, ACTION_NAMES, PADDED_DIM, SCHEMA_ID

__all__ = [
    "ACTION_DIM", "ACTION_NAMES", "PADDED_DIM", "SCHEMA_ID", "BundleTransform", "BundleWindows", "build_bundle_run_data",
    "is_bundle", "open_bundle", "validate_bundle", "validate_main", "write_synthetic_bundle",
]
