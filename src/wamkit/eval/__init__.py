"""Evaluation: closed-loop simulator rollouts of a Policy (`sim_eval`) and their reports (`report`)."""

from wamkit.eval.report import evaluate_checkpoints, plot_success_vs_step, write_report
from wamkit.eval.sim_eval import EvalError, EvalResult, eval_sim_main, evaluate, load_policy, wilson_interval

__all__ = ["evaluate_checkpoints", "plot_success_vs_step", "write_report", "EvalError", "EvalResult", "eval_sim_main",
           "evaluate", "load_policy", "wilson_interval"]
