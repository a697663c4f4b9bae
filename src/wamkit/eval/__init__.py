"""Evaluation: closed-loop simulator rollouts of a Policy in one env (`sim_eval`), in a suite of tasks or over a
run's checkpoints (`suite`), and their reports (`report`)."""

from wamkit.eval.report import plot_success_vs_step, write_checkpoints_report, write_report, write_suite_report
from wamkit.eval.sim_eval import EvalError, EvalResult, evaluate, load_policy, wilson_interval
from wamkit.eval.suite import SuiteResult, eval_sim_main, evaluate_checkpoints, evaluate_envs, evaluate_suite, list_checkpoints

__all__ = ["plot_success_vs_step", "write_checkpoints_report", "write_report", "write_suite_report", "EvalError",
           "EvalResult", "evaluate", "load_policy", "wilson_interval", "SuiteResult", "eval_sim_main",
           "evaluate_checkpoints", "evaluate_envs", "evaluate_suite", "list_checkpoints"]
