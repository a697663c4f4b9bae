"""Stages 2 (TF-dCM) and 3 (SF-DMD) of the sim-bimanual chain: few-step chunk-autoregressive students,
one process or N under torchrun (FSDP2)."""

from wamkit.distill.config import DistillConfig, load_distill_recipe
from wamkit.distill.export import export_student
from wamkit.distill.trainer import DistillTrainer


def distill_main(recipe: str, overrides: list[str], device: str = "auto") -> dict:
    cfg, dcfg = load_distill_recipe(recipe, overrides)
    return DistillTrainer(cfg, dcfg, device=device).train()


__all__ = ["DistillConfig", "DistillTrainer", "distill_main", "export_student", "load_distill_recipe"]
