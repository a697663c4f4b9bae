"""Evaluation reports: results.json + report.md per evaluation (one env, or a suite of tasks with their
average), and a success-vs-training-step plot over checkpoints (PNG with matplotlib; without it, an SVG
drawn by hand and a note in the report). Rendering only: the evaluations are run by sim_eval and suite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence


def _sampler(result) -> str:
    """The sampler a result was measured with: its denoising steps, and the noise scale when not the trained one."""
    from wamkit.policy.policy import sampler_text

    return sampler_text(result.num_steps, getattr(result, "noise_scale", 1.0))


def _fmt_len(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def _fmt_reward(mean: float, se: float | None) -> str:
    """A mean best reward with its standard error (none from a single episode)."""
    return f"{mean:.2f}" if se is None else f"{mean:.2f} ± {se:.2f}"


REWARD_NOTE = ("Best reward: each episode's highest dense reward from the simulator (Meta-World's shaped reward, 0-10; "
               "its value at success differs by task), averaged over the episodes: graded where success is not, so it "
               "compares policies on the same task, not tasks with each other.")


def _reward_line(result) -> list[str]:
    """The report's best-reward line, where the sim gives a dense reward."""
    if getattr(result, "mean_best_reward", None) is None:
        return []
    return [f"- best reward: {_fmt_reward(result.mean_best_reward, result.best_reward_se)}, the mean (± its s.e.) over episodes "
            f"of each one's highest dense reward (Meta-World's shaped reward, 0-10): how close failures came"]


def write_report(result, out_dir: str | Path) -> Path:
    """results.json and report.md for one EvalResult; returns the report path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result.to_json(), indent=2))
    src = result.policy_source
    lines = [
        f"# Closed-loop evaluation: {result.env_name}", "",
        f"- task: \"{result.task}\"",
        f"- policy: `{src.get('checkpoint') or src.get('export') or src}` (step {result.training_step}, "
        f"weights {src.get('weights', '?')})",
        f"- **success rate: {result.successes}/{result.episodes} = {result.success_rate:.3f}** "
        f"(95% Wilson interval {result.ci95[0]:.3f} – {result.ci95[1]:.3f})",
        f"- mean episode length: {result.mean_episode_length:.1f} steps (successful episodes: "
        f"{_fmt_len(result.mean_success_length)}); budget {result.max_episode_steps} steps",
        *_reward_line(result),
        f"- re-planning: chunks of {result.chunk_length}, executing {result.execute_horizon} actions open-loop; "
        f"{_sampler(result)} per chunk",
        f"- frames {result.resolution}x{result.resolution} px; episode seeds from seed {result.seed}; "
        f"{result.seconds:.1f} s wall",
        f"- inference delay {result.inference_delay} control steps, mode {result.mode}; mean squared action change "
        f"at chunk seams {_fmt_jerk(result.seam_jerk)} ({result.seams} seams), over all steps {_fmt_jerk(result.step_jerk)}",
    ]
    agreement = getattr(result, "expert_agreement", None)
    if agreement:
        from wamkit.eval.expert_agreement import agreement_line

        lines.append(f"- against the scripted expert in the policy's own states (share of the expert's firm moves "
                     f"followed in direction, mean |difference| in half ranges): {agreement_line(agreement)}")
    lines += ["", "| episode | seed | success | length | chunks | video |", "| --- | --- | --- | --- | --- | --- |"]
    for e in result.per_episode:
        video = f"[{e.video}]({e.video})" if e.video else ""
        lines.append(f"| {e.index} | {e.seed} | {'yes' if e.success else 'no'} | {e.length} | {e.replans} | {video} |")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _fmt_jerk(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def write_realtime_table(results, out_dir: str | Path) -> Path:
    """realtime.md (and realtime.json): success and seam jerk per (inference delay, mode)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [{"inference_delay": r.inference_delay, "mode": r.mode, "successes": r.successes, "episodes": r.episodes,
             "ci95": list(r.ci95), "seam_jerk": r.seam_jerk, "step_jerk": r.step_jerk, "seams": r.seams,
             "mean_ticks": sum(e.ticks or 0 for e in r.per_episode) / len(r.per_episode),
             "mean_env_steps": r.mean_episode_length} for r in results]
    (out / "realtime.json").write_text(json.dumps(rows, indent=2))
    first = results[0]
    lines = [f"# Inference delay: {first.env_name}", "",
             f"chunks of {first.chunk_length}, {first.execute_horizon} actions executed per chunk, "
             f"{_sampler(first)}; budget {first.max_episode_steps} control steps (pauses count); episode seeds from {first.seed}", "",
             "| delay (steps) | mode | success | 95% CI | seam jerk | step jerk | seams | control steps | steps moving |",
             "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        lines.append(f"| {row['inference_delay']} | {row['mode']} | {row['successes']}/{row['episodes']} | "
                     f"{row['ci95'][0]:.2f}-{row['ci95'][1]:.2f} | {_fmt_jerk(row['seam_jerk'])} | "
                     f"{_fmt_jerk(row['step_jerk'])} | {row['seams']} | {row['mean_ticks']:.1f} | {row['mean_env_steps']:.1f} |")
    path = out / "realtime.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def plot_success_vs_step(points: Sequence[tuple[int, float, float, float]], path: str | Path, title: str = "",
                         per_task: dict[str, Sequence[tuple[int, float]]] | None = None) -> Path:
    """points: (step, success_rate, ci_low, ci_high); per_task: optional thin lines {task: [(step, rate)]} beside
    them (a suite's tasks around its average). Writes `path` (.png) with matplotlib, else an .svg next to it
    (same stem, the main line only) and returns the path actually written."""
    path = Path(path)
    points = sorted(points)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return _svg_plot(points, path.with_suffix(".svg"), title)
    fig, ax = plt.subplots(figsize=(7.5 if per_task else 5, 3.2), dpi=120)
    steps = [p[0] for p in points]
    rates = [p[1] for p in points]
    ax.fill_between(steps, [p[2] for p in points], [p[3] for p in points], alpha=0.25, label="95% Wilson CI")
    for task, series in (per_task or {}).items():
        series = sorted(series)
        ax.plot([p[0] for p in series], [p[1] for p in series], lw=0.9, alpha=0.7, marker=".", label=task)
    ax.plot(steps, rates, marker="o", color="black", lw=2, label="average" if per_task else "success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("training step")
    ax.set_ylabel("success rate")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if per_task:  # many lines: the legend goes beside the axes
        ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    else:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _svg_plot(points, path: Path, title: str) -> Path:
    """A dependency-free line plot (used when matplotlib is not installed)."""
    w, h, m = 480, 300, 40
    steps = [p[0] for p in points]
    lo, hi = min(steps), max(steps)
    span = (hi - lo) or 1

    def xy(step, rate):
        return m + (step - lo) / span * (w - 2 * m), h - m - rate * (h - 2 * m)

    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(s, r) for s, r, _, _ in points))
    band = [xy(s, a) for s, _, a, _ in points] + [xy(s, b) for s, _, _, b in reversed(points)]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<polygon points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in band)}" fill="#9ecae1" opacity="0.5"/>',
             f'<polyline points="{line}" fill="none" stroke="#08519c" stroke-width="2"/>',
             f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
             f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
             f'<text x="{w / 2}" y="{h - 8}" text-anchor="middle" font-size="12">training step ({lo}–{hi})</text>',
             f'<text x="12" y="{h / 2}" font-size="12" transform="rotate(-90 12 {h / 2})">success rate (0–1)</text>',
             f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="12">{title}</text>', "</svg>"]
    path.write_text("\n".join(parts))
    return path


def _video_link(result, success: bool) -> str:
    """Markdown link to a task's first rollout video of the given outcome, relative to the suite directory."""
    sub = Path(result.out_dir).name if result.out_dir else ""
    for e in result.per_episode:
        if e.video and e.success == success:
            return f"[{e.video}]({sub}/{e.video})"
    return "-"


def write_suite_report(suite, out_dir: str | Path) -> Path:
    """results.json and report.md of a SuiteResult: one row per task (rate, 95% interval, mean length, a success
    and a failure video, the task's own report) and the average; returns the report path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(suite.to_json(), indent=2))
    first = suite.tasks[0]
    src = first.policy_source
    lo, hi = suite.ci95
    lines = [
        f"# Closed-loop evaluation: {len(suite.tasks)} tasks", "",
        f"- policy: `{src.get('checkpoint') or src.get('export') or src}` (step {suite.training_step}, "
        f"weights {src.get('weights', '?')})",
        f"- **average success: {suite.success_rate:.3f}** over {len(suite.tasks)} tasks "
        f"({suite.successes}/{suite.episodes} episodes; 95% Wilson interval of the pooled episodes "
        f"{lo:.3f} – {hi:.3f}, which is the average's own since every task has {first.episodes} episodes)",
        f"- episode seeds from seed {first.seed} in every task; chunks of {first.chunk_length}, executing "
        f"{first.execute_horizon} open-loop; {_sampler(first)}; {first.resolution}x{first.resolution} px; "
        f"{suite.seconds:.1f} s wall", "",
        "| task | success | 95% CI | best reward | mean length | success video | failure video | report |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in suite.tasks:
        sub = Path(r.out_dir).name
        reward = "-" if r.mean_best_reward is None else _fmt_reward(r.mean_best_reward, r.best_reward_se)
        lines.append(f"| {r.env_name} | {r.successes}/{r.episodes} = {r.success_rate:.3f} | {r.ci95[0]:.3f} – "
                     f"{r.ci95[1]:.3f} | {reward} | {r.mean_episode_length:.1f} | {_video_link(r, True)} | "
                     f"{_video_link(r, False)} | [{sub}/report.md]({sub}/report.md) |")
    reward = "-" if suite.mean_best_reward is None else f"{suite.mean_best_reward:.2f}"
    lines.append(f"| **average** | {suite.successes}/{suite.episodes} = {suite.success_rate:.3f} | {lo:.3f} – {hi:.3f} | "
                 f"{reward} | {suite.mean_episode_length:.1f} | | | |")
    if suite.mean_best_reward is not None:
        lines += ["", REWARD_NOTE]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_checkpoints_report(results: Sequence, out_dir: str | Path, title: str) -> Path:
    """report.md, results.json and success_vs_step.png over one evaluation per checkpoint (EvalResults, or
    SuiteResults whose tasks become extra columns and thin lines around the average); returns the plot path."""
    out = Path(out_dir)
    points = [(r.training_step if r.training_step is not None else i, r.success_rate, *r.ci95)
              for i, r in enumerate(results)]
    task_names = [t.env_name for t in getattr(results[0], "tasks", [])]
    per_task = {name: [(p[0], r.tasks[k].success_rate) for p, r in zip(points, results)]
                for k, name in enumerate(task_names)}
    plot = plot_success_vs_step(points, out / "success_vs_step.png", title, per_task=per_task or None)
    (out / "results.json").write_text(json.dumps([r.to_json() for r in results], indent=2))
    lines = [f"# Success vs training step: {title}", "", f"![success vs step]({plot.name})", ""]
    if plot.suffix == ".svg":
        lines += ["(matplotlib is not installed: the plot is a hand-drawn SVG.)", ""]
    head = ["step", "average success" if task_names else "success", "95% CI", *task_names, "mean length", "report"]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for (step, rate, lo, hi), r in zip(points, results):
        sub = Path(r.out_dir).name
        cells = [str(step), f"{r.successes}/{r.episodes} = {rate:.3f}", f"{lo:.3f} – {hi:.3f}",
                 *(f"{t.success_rate:.2f}" for t in getattr(r, "tasks", [])), f"{r.mean_episode_length:.1f}",
                 f"[{sub}/report.md]({sub}/report.md)"]
        lines.append("| " + " | ".join(cells) + " |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return plot
