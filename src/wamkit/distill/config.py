"""The `[distill]` section of the stage-2/3 recipes, read next to the ordinary ExperimentConfig.

A distillation recipe is an ordinary wamkit recipe (the student's model, data, optimizer, schedule,
EMA, checkpoint.load_path = the student's initial weights) plus:

    [distill]
    method = "tf_dcm" | "sf_dmd"
    teacher_path = ...        tf_dcm: FROZEN stage-1 iteration dir (teacher ODE steps)
    reference_path = ...      sf_dmd: FROZEN stage-0 iteration dir (the real score)
    critic_path = ...         sf_dmd: stage-0 iteration dir the critic / fake score starts from
    student_steps = 4         the student's sampling ladder (multistep consistency sampling)
    student_shift = 1.0       shift of that ladder (wamkit.diffusion.sampling.sigma_schedule)
    teacher_steps = 16        tf_dcm: the fine teacher grid the consistency pairs are drawn from
    critic_updates_per_student = 5   sf_dmd: critic updates on 5 of every 6 iterations, student on the 6th
    critic_lr = 0.0           sf_dmd: 0 -> optimizer.lr

`--set distill.x=y` overrides work as for every other section."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from wamkit.config.loader import _apply_override, _merge, read_recipe
from wamkit.config.env import expand_fields
from wamkit.config.schema import ExperimentConfig
from wamkit.errors import ConfigError

METHODS = ("tf_dcm", "sf_dmd")


@dataclass
class DistillConfig:
    method: str = "tf_dcm"
    teacher_path: str = ""
    reference_path: str = ""
    critic_path: str = ""
    student_steps: int = 4
    student_shift: float = 1.0
    teacher_steps: int = 16
    critic_updates_per_student: int = 5
    critic_lr: float = 0.0

    def validate(self, cfg: ExperimentConfig) -> "DistillConfig":
        expand_fields(self, "distill", ("teacher_path", "reference_path", "critic_path"))  # once, at load
        if self.method not in METHODS:
            raise ConfigError("distill.method", f"{self.method!r} is not one of {list(METHODS)}", "use tf_dcm (stage 2) or sf_dmd (stage 3)")
        if self.student_steps < 1:
            raise ConfigError("distill.student_steps", f"is {self.student_steps}", "use 4 (the reference schedule)")
        if self.method == "tf_dcm":
            if not self.teacher_path:
                raise ConfigError("distill.teacher_path", "is empty for tf_dcm", "point it at the completed stage-1 iteration dir")
            if self.teacher_steps < 1:
                raise ConfigError("distill.teacher_steps", f"is {self.teacher_steps}", "use e.g. 16")
        if self.method == "sf_dmd":
            for name in ("reference_path", "critic_path"):
                if not getattr(self, name):
                    raise ConfigError(f"distill.{name}", "is empty for sf_dmd", "point it at the completed stage-0 iteration dir")
            if self.critic_updates_per_student < 0:
                raise ConfigError("distill.critic_updates_per_student", "is negative", "use 5")
        if cfg.diffusion.causal_chunk_frames <= 0:
            raise ConfigError("diffusion.causal_chunk_frames", "is 0 in a distillation recipe", "the student is chunk-autoregressive: use the stage-1 value")
        if cfg.lora.enabled:  # the DistillTrainer builds and saves whole models; adapters would be silently ignored
            raise ConfigError("lora.enabled", "is true in a distillation recipe; `wamkit distill` trains and saves the student's "
                              "full weights (LoRA adapters are not implemented for stages 2 and 3)",
                              "set lora.enabled = false; `wamkit distill --dry-run` says how many GPUs the full models need")
        if cfg.model.mode != "forward_dynamics":
            raise ConfigError("model.mode", f"is {cfg.model.mode!r}", "distillation trains the world model: use forward_dynamics")
        if cfg.diffusion.video_prediction != "velocity":
            raise ConfigError("diffusion.video_prediction", f"is {cfg.diffusion.video_prediction!r}; the teacher steps and "
                              "consistency targets of the chain are written for velocity models",
                              "distill a chain trained with diffusion.video_prediction = 'velocity'")
        return self


def load_distill_recipe(recipe: str | Path, overrides: list[str] = ()) -> tuple[ExperimentConfig, DistillConfig]:
    raw = read_recipe(Path(recipe))  # same TOML reading (and `extends`) as `wamkit train`
    for item in overrides:
        _apply_override(raw, item)
    distill_raw = raw.pop("distill", {})
    cfg = ExperimentConfig()
    _merge(cfg, raw, prefix="", source=str(recipe))
    cfg.validate()
    dcfg = DistillConfig()
    _merge(dcfg, distill_raw, prefix="distill.", source=str(recipe))
    return cfg, dcfg.validate(cfg)


def distill_to_dict(dcfg: DistillConfig) -> dict:
    return dataclasses.asdict(dcfg)
