"""Learning-rate multipliers of the seed recipes (imaginaire's LambdaLinear / LambdaCosine).

Each cycle warms up linearly from f_start to f_max over warm_up_steps, then decays to f_min at the
cycle's end, linearly or along a half cosine. After the last cycle the multiplier stays at f_min.

`cycle_lengths = []` means one cycle of trainer.max_iter steps; a warm-up that does not fit a run that
short (a smoke test: `--set trainer.max_iter=20` on a recipe with a 20-step warm-up) is shortened to
max_iter - 1 steps with a one-line note. Cycle lengths given explicitly are the recipe's word: a
warm-up that does not fit one of them is an error."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from wamkit.errors import ConfigError


@dataclass
class LambdaSchedule:
    kind: str
    warm_up_steps: list[int]
    cycle_lengths: list[int]
    f_start: list[float]
    f_max: list[float]
    f_min: list[float]

    def __post_init__(self):
        n = len(self.cycle_lengths)
        for name in ("warm_up_steps", "f_start", "f_max", "f_min"):
            values = getattr(self, name)
            if len(values) == 1 and n > 1:
                setattr(self, name, values * n)
            elif len(values) != n:
                raise ConfigError(f"scheduler.{name}", f"has {len(values)} entries for {n} cycles ({self.cycle_lengths})",
                                  f"give one value for every cycle, e.g. {name} = [{values[0] if values else _DEFAULTS[name]}], "
                                  f"or {n} values, one per cycle")
        for i, (warm, length) in enumerate(zip(self.warm_up_steps, self.cycle_lengths)):
            if length <= 0:
                raise ConfigError("scheduler.cycle_lengths", f"cycle {i} has length {length}",
                                  "give positive lengths, or cycle_lengths = [] for one cycle of trainer.max_iter steps")
            if warm < 0:
                raise ConfigError("scheduler.warm_up_steps", f"cycle {i}: {warm} is negative", "use 0 (no warm-up) or N >= 1 steps")
            if warm >= length:
                raise ConfigError(
                    "scheduler.warm_up_steps", f"cycle {i}: warm_up_steps {warm} must be shorter than the cycle's length {length} "
                    f"(scheduler.cycle_lengths)",
                    f"--set scheduler.warm_up_steps=[{_short_warm_up(length)}], or lengthen scheduler.cycle_lengths[{i}] "
                    f"beyond {warm}, or cycle_lengths = [] for one cycle of trainer.max_iter steps",
                )

    def __call__(self, step: int) -> float:
        if self.kind == "constant":
            return 1.0
        start = 0
        for i, length in enumerate(self.cycle_lengths):
            if step < start + length:
                return self._in_cycle(i, step - start)
            start += length
        return self.f_min[-1]

    def _in_cycle(self, i: int, n: int) -> float:
        warm, length = self.warm_up_steps[i], self.cycle_lengths[i]
        f_start, f_max, f_min = self.f_start[i], self.f_max[i], self.f_min[i]
        if n < warm:
            return f_start + (f_max - f_start) * n / warm
        progress = (n - warm) / (length - warm)
        if self.kind == "LambdaLinear":
            return f_min + (f_max - f_min) * (1.0 - progress)
        return f_min + 0.5 * (f_max - f_min) * (1.0 + math.cos(math.pi * progress))


_DEFAULTS = {"warm_up_steps": 0, "f_start": 1e-6, "f_max": 1.0, "f_min": 0.0}


def _short_warm_up(length: int) -> int:
    """A warm-up that fits a cycle of `length` steps: a tenth of it."""
    return max(0, min(length - 1, length // 10))


def fit_warm_up(cfg, max_iter: int) -> tuple[list[int], str]:
    """scheduler.warm_up_steps as the run uses it, and a note when it was shortened: with
    cycle_lengths = [] (one cycle of max_iter steps) a warm-up of max_iter steps or more is clamped to
    max_iter - 1, so a short smoke run of a long recipe trains instead of failing."""
    warm = list(cfg.warm_up_steps)
    if cfg.cycle_lengths or len(warm) != 1 or warm[0] < max_iter:
        return warm, ""
    fitted = max(max_iter - 1, 0)
    note = (f"scheduler.warm_up_steps {warm[0]} does not fit trainer.max_iter {max_iter} (cycle_lengths = [] -> [{max_iter}]): "
            f"warm-up shortened to {fitted} steps; set scheduler.warm_up_steps below {max_iter} to choose it")
    return [fitted], note


_NOTED: set[str] = set()


def build_schedule(cfg, max_iter: int) -> LambdaSchedule:
    warm, note = fit_warm_up(cfg, max_iter)
    if note and note not in _NOTED and os.environ.get("RANK", "0") == "0":  # once per process, on rank 0
        _NOTED.add(note)
        print(f"[wamkit] note: {note}", flush=True)
    return LambdaSchedule(
        kind=cfg.kind, warm_up_steps=warm, cycle_lengths=list(cfg.cycle_lengths or [max_iter]),
        f_start=list(cfg.f_start), f_max=list(cfg.f_max), f_min=list(cfg.f_min),
    )


def check_schedule(cfg, max_iter: int) -> None:
    """Raise the ConfigError build_schedule would, at recipe load (before any data or model is built)."""
    warm, _ = fit_warm_up(cfg, max_iter)
    LambdaSchedule(kind=cfg.kind, warm_up_steps=warm, cycle_lengths=list(cfg.cycle_lengths or [max_iter]),
                   f_start=list(cfg.f_start), f_max=list(cfg.f_max), f_min=list(cfg.f_min))
