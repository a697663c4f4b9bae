"""Export a trained run to a self-describing diffusers-format directory."""

from wamkit.export.export import ExportError, export_run, fixed_packed_input, verify_same_outputs

__all__ = ["ExportError", "export_run", "fixed_packed_input", "verify_same_outputs"]
