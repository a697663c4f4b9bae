"""`trainer.time_budget_s`: a run sized by wall-clock time instead of a step count.

Users with a fixed GPU allocation, and benchmarks that compare methods "with the same GPU time", know
seconds, not steps. A step count guessed from an assumed rate either ends early or runs past the box:
killed mid-schedule, the learning rate never decays and the last checkpoint is an early one. The
budget counts from the launch of `wamkit train` (imports, data, model build, compile and the first
steps included; a Trainer built in a running process counts from its construction). After the
first WARM_STEPS steps (compile), the loop times CALIBRATION_STEPS steps with the GPU synchronised at
both ends, then fixes the run's last step to what fits the rest of the budget (`trainer.max_iter`
stays the ceiling) and rebuilds the learning-rate schedule for it. The rate is timed again at a quarter and at half of the
fitted run (a neighbour on the same GPU compiling during the first window made two 2026-12-03 runs stop
~20% and ~75% early): a new fit that moves the last step by more than REFIT_TOLERANCE replaces the old
one while the schedule is still near its top. The fitted step is kept in the
checkpoint, so a resumed run ends where the first launch planned. Should steps slow down later (a
busier host), or the startup eat the budget before the fit, the first step that starts past the
budget is the run's last, with a save (under several ranks it is asked every trainer.log_every steps,
when the ranks agree on the time)."""

from __future__ import annotations

import torch

WARM_STEPS = 2  # the first steps compile (one graph per layer shape, a second for a later shape)
CALIBRATION_STEPS = 20
SAFETY = 0.97  # logging, saves and the final checkpoint share the budget with the steps
REFIT_AT = (0.25, 0.5)  # fractions of the fitted run where the rate is timed again
REFIT_TOLERANCE = 0.05


def fit_steps(budget_s: float, elapsed_s: float, seconds_per_step: float, done: int, ceiling: int) -> int:
    """The last step of a run that has `done` steps behind it after `elapsed_s` of its budget."""
    remaining = budget_s * SAFETY - elapsed_s
    return max(done + 1, min(ceiling, done + int(remaining / max(seconds_per_step, 1e-9))))


class TimeBudget:
    """Times the step rate (once, then again at REFIT_AT of the fitted run) and says when the budget is spent.

    `clock` is the seconds spent of the budget (since the launch); `agree` turns a
    rank's number into the one every rank uses (the largest), so all ranks stop at the same step."""

    def __init__(self, budget_s: float, ceiling: int, start_step: int, clock, agree, device: torch.device,
                 distributed: bool = False, calibrate: bool = True):
        self.budget_s, self.ceiling, self.clock, self.agree, self.device = float(budget_s), int(ceiling), clock, agree, device
        self.distributed = distributed
        self.planned = self.ceiling
        self.begin = start_step + WARM_STEPS if calibrate else -1  # a resumed run keeps its fit: only the guard
        self.end = self.begin + CALIBRATION_STEPS if calibrate else -1
        self._t0, self._from_step = 0.0, 0
        self._refits: list[int] = []  # steps where the rate is timed again
        self.seconds_per_step, self.elapsed_s = float("nan"), float("nan")  # what the fit saw, for its log line

    def _sync_time(self) -> float:
        if self.device.type == "cuda":  # the queued steps are done: the clock covers their work
            torch.cuda.synchronize(self.device)
        return self.clock()

    def after_step(self, step: int) -> int | None:
        """Call after every step (1-based count done): the fitted last step at the end of the calibration
        window and at a refit that moves it, else None. A run that ends before the window closes keeps its ceiling."""
        if step == self.begin:
            self._t0, self._from_step = self._sync_time(), step
        elif step == self.end or step in self._refits:
            now = self._sync_time()
            self.seconds_per_step = self.agree((now - self._t0) / (step - self._from_step))
            self.elapsed_s = self.agree(self.clock())
            self._t0, self._from_step = now, step
            fitted = fit_steps(self.budget_s, self.elapsed_s, self.seconds_per_step, step, self.ceiling)
            if step == self.end:
                self.planned = fitted
                self._refits = sorted({round(step + f * (fitted - step)) for f in REFIT_AT} - {step, fitted})
                return fitted
            if abs(fitted - self.planned) > REFIT_TOLERANCE * self.planned:
                self.planned = fitted
                return fitted
        return None

    def spent_before(self, step: int, every: int) -> bool:
        """Whether the budget is gone as step `step` starts. One process asks its clock every step (no
        GPU sync); several ranks agree on the time every `every` steps only (a collective)."""
        if self.distributed and step % every:
            return False
        return self.agree(self.clock()) >= self.budget_s
