"""Evaluation reports: results.json + report.md per evaluation, and a success-vs-training-step plot
(PNG with matplotlib; without it, an SVG drawn by hand and a note in the report) over checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from wamkit.errors import CheckpointError


def _fmt_len(x) -> str:
    return "-" if x is None else f"{x:.1f}"


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
        f"- re-planning: chunks of {result.chunk_length}, executing {result.execute_horizon} actions open-loop; "
        f"{result.num_steps} denoising steps per chunk",
        f"- frames {result.resolution}x{result.resolution} px; episode seeds from seed {result.seed}; "
        f"{result.seconds:.1f} s wall",
        f"- inference delay {result.inference_delay} control steps, mode {result.mode}; mean squared action change "
        f"at chunk seams {_fmt_jerk(result.seam_jerk)} ({result.seams} seams), over all steps {_fmt_jerk(result.step_jerk)}", "",
        "| episode | seed | success | length | chunks | video |", "| --- | --- | --- | --- | --- | --- |",
    ]
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
             f"chunks of {first.chunk_length}, {first.execute_horizon} actions executed per chunk, {first.num_steps} "
             f"denoising steps; budget {first.max_episode_steps} control steps (pauses count); episode seeds from {first.seed}", "",
             "| delay (steps) | mode | success | 95% CI | seam jerk | step jerk | seams | control steps | steps moving |",
             "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        lines.append(f"| {row['inference_delay']} | {row['mode']} | {row['successes']}/{row['episodes']} | "
                     f"{row['ci95'][0]:.2f}-{row['ci95'][1]:.2f} | {_fmt_jerk(row['seam_jerk'])} | "
                     f"{_fmt_jerk(row['step_jerk'])} | {row['seams']} | {row['mean_ticks']:.1f} | {row['mean_env_steps']:.1f} |")
    path = out / "realtime.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def plot_success_vs_step(points: Sequence[tuple[int, float, float, float]], path: str | Path, title: str = "") -> Path:
    """points: (step, success_rate, ci_low, ci_high). Writes `path` (.png) with matplotlib, else an .svg
    next to it (same stem) and returns the path actually written."""
    path = Path(path)
    points = sorted(points)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return _svg_plot(points, path.with_suffix(".svg"), title)
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    steps = [p[0] for p in points]
    rates = [p[1] for p in points]
    ax.fill_between(steps, [p[2] for p in points], [p[3] for p in points], alpha=0.25, label="95% Wilson CI")
    ax.plot(steps, rates, marker="o", label="success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("training step")
    ax.set_ylabel("success rate")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
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


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints/iter_<N> directories of a run, oldest first."""
    from wamkit.train.checkpoint import COMPLETE_MARKER

    from wamkit.storage import location

    checkpoints = location(run_dir, "run directory") / "checkpoints"
    found = sorted((p for p in checkpoints.glob("iter_*") if (p / COMPLETE_MARKER).is_file()),
                   key=lambda p: int(p.name.split("_")[1]))
    if not found:
        raise CheckpointError(str(checkpoints), "has no complete iter_<N> checkpoints",
                              "pass a run directory that has been trained (runs/<name>)")
    return found


def evaluate_checkpoints(run_dir: str | Path, env_name: str, episodes: int, seed: int = 1, *, out_dir: str | Path,
                         num_steps: int = 10, **kwargs) -> list:
    """Evaluate every checkpoint of a run (each into out_dir/step_<N>/), then write out_dir/report.md,
    out_dir/results.json and out_dir/success_vs_step.png (or .svg without matplotlib)."""
    from wamkit.eval.sim_eval import evaluate, load_policy

    out = Path(out_dir)
    results = []
    for iteration in list_checkpoints(run_dir):
        policy = load_policy(iteration, num_steps=num_steps)
        step = int(iteration.name.split("_")[1])
        results.append(evaluate(policy, env_name, episodes, seed, out_dir=out / f"step_{step:09d}",
                                num_steps=num_steps, **kwargs))
    points = [(r.training_step if r.training_step is not None else i, r.success_rate, *r.ci95)
              for i, r in enumerate(results)]
    plot = plot_success_vs_step(points, out / "success_vs_step.png", f"{env_name}: {episodes} episodes per checkpoint")
    (out / "results.json").write_text(json.dumps([r.to_json() for r in results], indent=2))
    lines = [f"# Success vs training step: {env_name}", "", f"![success vs step]({plot.name})", ""]
    if plot.suffix == ".svg":
        lines += ["(matplotlib is not installed: the plot is a hand-drawn SVG.)", ""]
    lines += ["| step | success | 95% CI | mean length | report |", "| --- | --- | --- | --- | --- |"]
    for (step, rate, lo, hi), r in zip(points, results):
        sub = Path(r.out_dir).name
        lines.append(f"| {step} | {r.successes}/{r.episodes} = {rate:.3f} | {lo:.3f} – {hi:.3f} | "
                     f"{r.mean_episode_length:.1f} | [{sub}/report.md]({sub}/report.md) |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return results
