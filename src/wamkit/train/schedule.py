"""Learning-rate multipliers of the seed recipes (imaginaire's LambdaLinear / LambdaCosine).

Each cycle warms up linearly from f_start to f_max over warm_up_steps, then decays to f_min at the
cycle's end, linearly or along a half cosine. After the last cycle the multiplier stays at f_min."""

from __future__ import annotations

import math
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
                raise ConfigError(f"scheduler.{name}", f"has {len(values)} entries for {n} cycles", "give one value, or one per cycle")
        for i, (warm, length) in enumerate(zip(self.warm_up_steps, self.cycle_lengths)):
            if length <= 0 or warm >= length:
                raise ConfigError("scheduler.cycle_lengths", f"cycle {i}: length {length} must exceed warm_up_steps {warm}", "")

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


def build_schedule(cfg, max_iter: int) -> LambdaSchedule:
    return LambdaSchedule(
        kind=cfg.kind, warm_up_steps=list(cfg.warm_up_steps), cycle_lengths=list(cfg.cycle_lengths or [max_iter]),
        f_start=list(cfg.f_start), f_max=list(cfg.f_max), f_min=list(cfg.f_min),
    )
