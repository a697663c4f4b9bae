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


def _budget_run(demo_root, tmp_path, name, budget_s, ceiling=100_000):
    args = quick_overrides(demo_root, tmp_path, name, ceiling, ceiling) + [
        "--set", f"trainer.time_budget_s={budget_s}", "--set", "checkpoint.save_fractions=[0.25, 0.5]",
        "--set", "trainer.log_every=5", "--set", "scheduler.warm_up_steps=[5]", "--set", 'scheduler.kind="LambdaLinear"',
        "--set", "scheduler.f_min=[0.05]",
    ]
    return args, train_in_process([str(DEMO_RECIPE), *args])


def test_a_budgeted_run_ends_on_time_with_its_schedule_decayed_and_resumes_to_the_same_step(demo_root, tmp_path, capsys, monkeypatch):
    from wamkit.config import load_experiment
    from wamkit.train.trainer import FITTED_KEY, Trainer

    monkeypatch.setattr(time_budget, "CALIBRATION_STEPS", 4)  # a short window: the CPU steps of a busy box vary anyway
    args, summary = _budget_run(demo_root, tmp_path, "boxed", 24)
    out = capsys.readouterr().out
    assert "trainer.time_budget_s 24 s:" in out and "training to step" in out, out
    run = tmp_path / "boxed"
    last = latest_checkpoint(run / "checkpoints")
    fitted = read_marker(last)[FITTED_KEY]
    steps = time_budget.WARM_STEPS + time_budget.CALIBRATION_STEPS
    assert steps < fitted < 100_000 and summary["step"] == fitted  # the fit, not the ceiling, ended the run
    saved = sorted(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("iter_*"))
    fractions = {round(f * fitted) for f in (0.25, 0.5)}
    assert saved == sorted({s for s in fractions if s > steps} | {fitted})  # (a fraction passed before the fit is gone)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in rows if "lr" in r]
    base_lr = load_experiment(str(DEMO_RECIPE), []).optimizer.lr
    assert rows[-1]["step"] == fitted and lrs[-1] == pytest.approx(base_lr * 0.05)  # the schedule ends with the run
    assert max(lrs) == pytest.approx(base_lr, rel=0.05) and lrs[-2] > lrs[-1]  # (the ceiling's schedule would still be near f_max)

    again = Trainer(load_experiment(str(DEMO_RECIPE), [a for a in args if a != "--set"])).train()  # same command: done
    assert again["step"] == fitted and "nothing to do" in capsys.readouterr().out


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
