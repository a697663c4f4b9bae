"""trainer.time_budget_s: a run sized by wall time fits its last step and its learning-rate schedule to
the budget, saves at fractions of the fitted run, keeps the fit across a resume, and stops with a save
when the steps slow down past the budget."""

import json
import math

import pytest
import torch

from tests.helpers import DEMO_RECIPE, quick_overrides, train_in_process
from wamkit.train import time_budget
from wamkit.train.checkpoint import latest_checkpoint, read_marker
from wamkit.train.disk import fraction_step


def test_fit_steps_fills_the_rest_of_the_budget_within_the_ceiling():
    # 100 s budget, 40 s gone, 0.5 s a step: 97 - 40 = 57 s -> 114 more steps after the 22 done
    assert time_budget.fit_steps(100, 40, 0.5, 22, 10_000) == 22 + 114
    assert time_budget.fit_steps(100, 40, 0.5, 22, 50) == 50  # max_iter is the ceiling
    assert time_budget.fit_steps(100, 120, 0.5, 22, 10_000) == 23  # over budget already: one more step, then stop


def test_the_rate_is_timed_once_after_the_warm_steps_and_every_rank_uses_the_largest():
    clock = {"now": 0.0}
    agree = lambda v: 2 * v  # noqa: E731  (as if another rank were twice as slow)
    budget = time_budget.TimeBudget(300.0, 10_000, start_step=5, clock=lambda: clock["now"], agree=agree,
                                    device=torch.device("cpu"))
    fits = {}
    for step in range(6, 40):  # 10 s of startup, then 0.25 s a step
        clock["now"] = 10.0 + 0.25 * (step - 5)
        fits[step] = budget.after_step(step)
    end = 5 + time_budget.WARM_STEPS + time_budget.CALIBRATION_STEPS
    assert [s for s, f in fits.items() if f is not None] == [end]
    assert budget.seconds_per_step == pytest.approx(0.5) and budget.elapsed_s == pytest.approx(2 * (10.0 + 0.25 * (end - 5)))
    assert fits[end] == time_budget.fit_steps(300.0, budget.elapsed_s, 0.5, end, 10_000)
    clock["now"] = 149.0
    assert not budget.spent_before(41, every=5)  # 298 < 300
    clock["now"] = 151.0
    assert budget.spent_before(41, every=5)
    budget.distributed = True  # several ranks agree on the time on logged steps only
    assert not budget.spent_before(41, every=5) and budget.spent_before(45, every=5)


def test_a_rate_that_changes_after_the_first_window_refits_the_run_at_a_quarter_of_it():
    """The first window can be timed while a neighbour on the GPU compiles (2026-12-03: a world model fitted
    266 of the ~1000 steps its box held): the rate is timed again at a quarter and half of the run."""
    clock = {"now": 0.0}
    budget = time_budget.TimeBudget(300.0, 100_000, start_step=0, clock=lambda: clock["now"], agree=lambda v: v,
                                    device=torch.device("cpu"))
    fits, t = {}, 10.0
    for step in range(1, 400):
        t += 1.0 if step <= time_budget.WARM_STEPS + time_budget.CALIBRATION_STEPS else 0.25  # slow while timed, then 4x faster
        clock["now"] = t
        fit = budget.after_step(step)
        if fit is not None:
            fits[step] = fit
    first, *later = sorted(fits)
    assert first == time_budget.WARM_STEPS + time_budget.CALIBRATION_STEPS
    assert later and fits[later[0]] > 2 * fits[first]  # stretched to the faster rate
    end = fits[later[-1]]
    assert abs(t_at(end, first, t0=10.0 + first) - 300 * time_budget.SAFETY) < 300 * 0.05


def t_at(step: int, fast_from: int, t0: float) -> float:
    """The clock at `step` in the test above (0.25 s a step after `fast_from`)."""
    return t0 + 0.25 * (step - fast_from)


def _budget_run(demo_root, tmp_path, name, budget_s, ceiling=100_000):
    args = quick_overrides(demo_root, tmp_path, name, ceiling, ceiling) + [
        "--set", f"trainer.time_budget_s={budget_s}", "--set", "checkpoint.save_fractions=[0.25, 0.5]",
        "--set", "trainer.log_every=5", "--set", "scheduler.warm_up_steps=[5]", "--set", 'scheduler.kind="LambdaLinear"',
        "--set", "scheduler.f_min=[0.05]",
    ]
    return args, train_in_process([str(DEMO_RECIPE), *args])


def test_a_budgeted_run_ends_on_time_with_its_schedule_decayed_and_resumes_to_the_same_step(demo_root, tmp_path, capsys, monkeypatch):
    """The CPU box's step times wander, so the run may also end by the budget's guard a little before the fitted step:
    either way it ends inside the budget with its last step saved, the fit in the checkpoint, and nothing left to resume."""
    from wamkit.config import load_experiment
    from wamkit.train.trainer import FITTED_KEY, Trainer

    monkeypatch.setattr(time_budget, "CALIBRATION_STEPS", 8)
    args, summary = _budget_run(demo_root, tmp_path, "boxed", 24)
    out = capsys.readouterr().out
    assert "trainer.time_budget_s 24 s:" in out and "training to step" in out, out
    run = tmp_path / "boxed"
    last = latest_checkpoint(run / "checkpoints")
    fitted = read_marker(last)[FITTED_KEY]
    steps = time_budget.WARM_STEPS + time_budget.CALIBRATION_STEPS
    assert steps < fitted < 100_000 and int(last.name.split("_")[1]) == summary["step"]  # the fit, not the ceiling, ended it
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in rows if "lr" in r]
    base_lr = load_experiment(str(DEMO_RECIPE), []).optimizer.lr
    saved = {int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("iter_*")}
    if summary["step"] == fitted:
        assert lrs[-1] == pytest.approx(base_lr * 0.05)  # the schedule ends with the run
        assert len(saved) >= 2  # a fraction of the fitted run, and the last step
    else:  # the guard: steps slowed after the fit (how far it got measures the box's load, not the code)
        assert "spent at step" in out and "saved and stopped" in out
    if summary["step"] > steps:  # a step logged after the fit: the fitted schedule decays; the ceiling's 100,000-step
        assert lrs[-1] < 0.99 * base_lr  # one would still be at its top (> 0.999 of the peak)
    assert summary["step"] in saved

    again = Trainer(load_experiment(str(DEMO_RECIPE), [a for a in args if a != "--set"])).train()  # same command
    assert again["step"] == fitted  # resumes to the first launch's fit (done already, unless the guard stopped it)
    # however early a loaded box's guard stopped the first launch (at the fit step itself, its last logged rate was
    # still the ceiling schedule's), the resumed run keeps the fit and ends with the schedule decayed to its floor
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == fitted and last["lr"] == pytest.approx(base_lr * 0.05)


def test_steps_that_slow_down_past_the_budget_stop_with_a_save(demo_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(time_budget, "fit_steps", lambda *a: 100_000)  # as if the rate had been timed far too fast
    _, summary = _budget_run(demo_root, tmp_path, "slowed", 12)
    out = capsys.readouterr().out
    assert "spent at step" in out and "saved and stopped" in out
    last = latest_checkpoint(tmp_path / "slowed" / "checkpoints")
    assert int(last.name.split("_")[1]) == summary["step"] < 100_000
    rows = [json.loads(line) for line in (tmp_path / "slowed" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == summary["step"] and math.isfinite(rows[-1]["loss"])  # logged (and checked) like any save


def test_a_negative_budget_or_a_fraction_outside_the_run_is_refused():
    from wamkit.config.loader import load_experiment
    from wamkit.errors import ConfigError

    with pytest.raises(ConfigError, match="trainer.time_budget_s"):
        load_experiment(str(DEMO_RECIPE), ["trainer.time_budget_s=-5"])
    with pytest.raises(ConfigError, match="checkpoint.save_fractions"):
        load_experiment(str(DEMO_RECIPE), ["checkpoint.save_fractions=[0.5, 1.5]"])


def test_a_fraction_that_a_shortening_refit_moves_behind_the_run_is_saved_at_the_next_step(demo_root, tmp_path, monkeypatch):
    """2026-12-04: a run fitted to 995 steps, refitted to 611 at step 463, never saved its 0.5 checkpoint (step 497,
    then 306): the curve and the judge lost a policy. The fit here: 60 steps, then 40 at the first refit."""
    fits = iter([60])
    monkeypatch.setattr(time_budget, "fit_steps", lambda *a: next(fits, 40))
    args = quick_overrides(demo_root, tmp_path, "shortened", 100_000, 100_000) + [
        "--set", "trainer.time_budget_s=600", "--set", "checkpoint.save_fractions=[0.6, 0.9]", "--set", "trainer.log_every=5"]
    summary = train_in_process([str(DEMO_RECIPE), *args])
    begin = time_budget.WARM_STEPS + time_budget.CALIBRATION_STEPS
    refit_at = round(begin + time_budget.REFIT_AT[0] * (60 - begin))
    assert fraction_step(0.6, 40) < refit_at < fraction_step(0.6, 60)  # the case: its step passed unsaved
    saved = {int(p.name.split("_")[1]) for p in (tmp_path / "shortened" / "checkpoints").glob("iter_*")}
    assert summary["step"] == 40
    assert saved == {refit_at + 1, fraction_step(0.9, 40), 40}
