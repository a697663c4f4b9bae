"""Issue 26's table, plot and RESULTS lines from what `benchmarks/mt10_device.sh` PHASE=1 and PHASE=2 sent back.

    python benchmarks/mt10_report.py PHASE1_DIR PHASE2_DIR [--out benchmarks/mt10]

Each DIR holds the phase's mt10_phase<N>.tgz and logs_phase<N>.tgz (a call's files_at, left as it is) or their
unpacked tree. Writes
<out>/table.md (per task and average: successes/episodes, rate, 95% Wilson interval, for wamkit, ACT and
DP), <out>/success_vs_step.png (wamkit's checkpoints with intervals, ACT and DP as lines) and
<out>/summary.json, then prints the RESULTS lines, every number read from the results files (and, where the
evaluations kept it, each method's best shaped reward averaged over tasks: graded where success is not; and each
method's training peak GPU memory, wamkit's beside its --dry-run estimate):

    mt10_wamkit=<x> mt10_act=<y> mt10_dp=<z>
    wm_rank_spearman=<r> n=<k> p=<p>

The judge's ranking is its headline one: each policy's mean rank over the imagined episodes where the
report carries it (wamkit.worldmodel.policy_eval.episode_ranks), else its mean score; the mean score's
rho follows on its own line.
The average's interval pools every episode (tasks have equal episode counts, so the average of the
task rates is the pooled rate). Spearman's p is exact (all n! pairings) up to 8 policies, else
scipy's t approximation.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from wamkit.eval.sim_eval import wilson_interval  # noqa: E402

METHODS = {"wamkit": "wamkit (Cosmos3 medium, x0 action head)", "act": "LeRobot ACT", "dp": "LeRobot Diffusion Policy"}


def unpacked(directory: Path) -> Path:
    """The phase's tree: its results and logs archives (mt10_phase*.tgz, logs_phase*.tgz) extracted together into a
    temporary folder (the device tool's files_at is meant to stay as it came back); the directory itself where it holds
    no archive."""
    archives = sorted(directory.glob("mt10_phase*.tgz")) + sorted(directory.glob("logs_phase*.tgz"))
    if not archives:
        return directory
    dest = Path(tempfile.mkdtemp(prefix=f"mt10_report_{directory.name}_"))
    for archive in archives:
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
    return dest


def suite_counts(results: dict) -> dict[str, tuple[int, int]]:
    """{env: (successes, episodes)} of a `wamkit eval sim` results.json (one env or a suite)."""
    tasks = results.get("tasks", [results])
    return {t["env_name"]: (int(t["successes"]), int(t["episodes"])) for t in tasks}


def policy_quality_counts(results: dict) -> dict[str, tuple[int, int]]:
    """The same from benchmarks/policy_quality.py's results.json (its one ok row)."""
    rows = [r for r in results["rows"] if r["status"] == "ok"]
    if not rows:
        raise SystemExit(f"policy_quality results hold no finished row: {[r['status'] for r in results['rows']]}")
    return {env: (int(k), int(n)) for env, (k, n) in rows[0]["extra"]["per_task"].items()}


def suite_rewards(results: dict) -> dict[str, float | None]:
    """{env: mean best shaped reward} of a `wamkit eval sim` results.json (None where the run predates it)."""
    tasks = results.get("tasks", [results])
    return {t["env_name"]: t.get("mean_best_reward") for t in tasks}


def policy_quality_rewards(results: dict) -> dict[str, float | None]:
    return dict(results["rows"][0]["extra"].get("per_task_best_reward", {}))


# wamkit.train.memory.measured_line's words, as the trainer logs them after its first step
MEMORY_LINE = re.compile(r"memory: peak ([0-9.]+) GiB allocated in the first step against the estimate's ([0-9.]+) GiB")


def training_peaks(one: Path, two: Path) -> dict[str, dict]:
    """{method: {"peak_gib", "estimate_gib"}}: wamkit's policy from its trainer's log line (against its --dry-run
    estimate), ACT's and DP's from policy_quality.py's rows (no estimate: not our model). Methods without one are left
    out (a CPU run, or logs from before the rows carried it)."""
    peaks = {}
    log = one / "train_policy.log"
    found = MEMORY_LINE.search(log.read_text(errors="replace")) if log.is_file() else None
    if found:
        peaks["wamkit"] = {"peak_gib": float(found[1]), "estimate_gib": float(found[2])}
    for method, name in (("act", "act"), ("dp", "diffusion")):
        path = two / f"eval/{name}/results.json"
        rows = json.loads(path.read_text())["rows"] if path.is_file() else []
        peak = next((r.get("peak_memory_gib") for r in rows if r["status"] == "ok"), None)
        if peak is not None:
            peaks[method] = {"peak_gib": float(peak), "estimate_gib": None}
    return peaks


def peaks_text(peaks: dict[str, dict]) -> str:
    return "training peak GPU memory: " + ", ".join(
        f"{m} {p['peak_gib']:.1f} GiB" + (f" (--dry-run {p['estimate_gib']:.1f})" if p["estimate_gib"] else "")
        for m, p in peaks.items())


def reward_average(rewards: dict[str, float | None], envs: list[str]) -> float | None:
    """The mean over tasks of each task's mean best reward, where every task has one (a graded companion of success:
    Meta-World's shaped reward, 0-10, how close failures came)."""
    values = [rewards.get(env) for env in envs]
    return None if not values or None in values else sum(values) / len(values)


def average(counts: dict[str, tuple[int, int]]) -> dict:
    """Mean of the task rates and the pooled 95% Wilson interval."""
    k, n = sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())
    rate = sum(c[0] / c[1] for c in counts.values()) / len(counts)
    return {"successes": k, "episodes": n, "rate": rate, "ci95": list(wilson_interval(k, n))}


def spearman_with_p(scores: list[float], success: list[float]) -> dict:
    """Spearman's rho of the world model's scores against sim success, and its two-sided p-value."""
    from wamkit.worldmodel.policy_eval import spearman, spearman_p

    rho = spearman(scores, success)
    if rho is None:
        return {"rho": None, "p": None, "n": len(scores), "p_method": "undefined: constant ranks"}
    p, method = spearman_p(scores, success)
    return {"rho": rho, "p": p, "n": len(scores), "p_method": method}


def curve_points(curve_dir: Path) -> list[dict]:
    """(training step, rate, interval) of every checkpoint `eval sim --all-checkpoints` evaluated."""
    points = []
    for results in sorted(curve_dir.glob("step_*/results.json")):
        data = json.loads(results.read_text())
        points.append({"step": int(results.parent.name.split("_")[1]), "dir": results.parent.name, **average(suite_counts(data))})
    return points


def cell(counts: tuple[int, int]) -> str:
    k, n = counts
    lo, hi = wilson_interval(k, n)
    return f"{k}/{n} = {k / n:.2f} ({lo:.2f}–{hi:.2f})"


def table(per_method: dict[str, dict[str, tuple[int, int]]], averages: dict[str, dict]) -> str:
    methods = list(per_method)
    lines = ["| task | " + " | ".join(METHODS[m] for m in methods) + " |", "| --- |" + " --- |" * len(methods)]
    for env in per_method[methods[0]]:
        lines.append(f"| {env.split('/')[-1]} | " + " | ".join(cell(per_method[m][env]) for m in methods) + " |")
    lines.append("| **average** | " + " | ".join(
        f"**{a['rate']:.3f}** ({a['ci95'][0]:.2f}–{a['ci95'][1]:.2f})" for a in (averages[m] for m in methods)) + " |")
    return "\n".join(lines) + "\n"


def plot(points: list[dict], averages: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    steps = [p["step"] for p in points]
    rates = [p["rate"] for p in points]
    err = [[p["rate"] - p["ci95"][0] for p in points], [p["ci95"][1] - p["rate"] for p in points]]
    ax.errorbar(steps, rates, yerr=err, marker="o", capsize=3, label="wamkit checkpoints")
    for method, style in (("act", "--"), ("dp", ":")):
        if method in averages:
            ax.axhline(averages[method]["rate"], linestyle=style, color="gray", label=f"{METHODS[method]} (final: {averages[method]['rate']:.3f})")
    ax.set(xlabel="training step", ylabel="MT10 average success", ylim=(0, 1), title="Meta-World MT10, held-out seeds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def judge_episode_ranks(rows: list[dict]) -> list[float] | None:
    """The rows' mean episode ranks: as the report gives them, else recomputed from their per-episode scores (a
    report written before the judge ranked by episode), else None."""
    from wamkit.worldmodel.policy_eval import episode_ranks

    if all("episode_rank" in p for p in rows):
        return [p["episode_rank"] for p in rows]
    ranks = episode_ranks([p.get("per_episode") for p in rows])
    return None if ranks is None else [float(r) for r in ranks]


def judge_summary(report_path: Path) -> dict | None:
    """The world model's scores and the sim success of the policies it ranked, with Spearman's rho."""
    if not report_path.is_file():
        return None
    report = json.loads(report_path.read_text())
    rows = report["policies"]
    success = [p["success_rate"] for p in rows]
    ranks = judge_episode_ranks(rows)
    by_episode_rank = ranks is not None  # the judge's headline ranking where the rows allow it
    predicted = [-r for r in ranks] if by_episode_rank else [p["score"] for p in rows]
    summary = {"policies": [{"label": p["label"], "score": p["score"], "episode_rank": None if ranks is None else ranks[i],
                             "success_rate": p["success_rate"]} for i, p in enumerate(rows)],
               "ranked_by": "episode_rank" if by_episode_rank else "mean_score", **spearman_with_p(predicted, success)}
    if by_episode_rank:
        summary["mean_score"] = spearman_with_p([p["score"] for p in rows], success)
    if all("changed" in p.get("by_region", {}) for p in rows):  # the same rollouts scored over the changed pixels
        summary["changed_region"] = spearman_with_p([p["by_region"]["changed"]["score"] for p in rows], success)
    if all(p.get("best_reward") is not None for p in rows):  # the same ranking against the sim's graded measure
        summary["best_reward"] = spearman_with_p(predicted, [p["best_reward"] for p in rows])
    # the unranked anchors: whether the world model tells expert motion from static and from misdirected motion
    summary["references"] = {name: ref["score"] for name, ref in report.get("references", {}).items()}
    from wamkit.worldmodel.policy_eval import action_response  # torch: only where a judge report is read

    summary["action_response"] = action_response(report.get("references", {}))  # None without the swapped reference
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("phase1", type=Path)
    p.add_argument("phase2", type=Path)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "mt10")
    p.add_argument("--judge", default="judge_all", help="PHASE=2's merged ranking under eval/ (judge_all: the first of "
                   "JUDGE_STATES; judge_all_<state> for the others)")
    args = p.parse_args(argv)
    one, two = unpacked(args.phase1), unpacked(args.phase2)
    points = curve_points(one / "eval/curve")
    per_method, rewards, notes = {}, {}, []
    final = one / "eval/final/results.json"
    if final.is_file():
        results = json.loads(final.read_text())
        per_method["wamkit"], rewards["wamkit"] = suite_counts(results), suite_rewards(results)
    elif points:  # the call was cut before the final evaluation: the curve's last checkpoint stands in
        last = max(points, key=lambda point: point["step"])
        per_method["wamkit"] = suite_counts(json.loads((one / f"eval/curve/{last['dir']}/results.json").read_text()))
        notes.append(f"wamkit: no final evaluation came back; the curve's last checkpoint (step {last['step']}) at its episode count")
    for method, name in (("act", "act"), ("dp", "diffusion")):
        path = two / f"eval/{name}/results.json"
        if path.is_file():
            results = json.loads(path.read_text())
            per_method[method], rewards[method] = policy_quality_counts(results), policy_quality_rewards(results)
        else:
            notes.append(f"{method}: no results ({path} is missing)")
    if not per_method:
        raise SystemExit(f"nothing to report: neither {final} nor a curve nor phase 2's results are there")
    averages = {m: average(c) for m, c in per_method.items()}
    for m, c in per_method.items():
        averages[m]["best_reward"] = reward_average(rewards.get(m, {}), list(c))
    # the headline ranking is PHASE=2's merge (wamkit's checkpoints, ACT and DP) when it came back, else PHASE=1's
    checkpoints_only = judge_summary(one / "eval/judge/report.json")
    merged = judge_summary(two / "eval" / args.judge / "report.json")
    judge = merged or checkpoints_only
    peaks = training_peaks(one, two)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table(per_method, averages))
    if points:
        plot(points, averages, args.out / "success_vs_step.png")
    (args.out / "summary.json").write_text(json.dumps({"per_task": per_method, "average": averages, "curve": points,
                                                       "judge": judge, "judge_checkpoints_only": checkpoints_only,
                                                       "training_peak_memory": peaks, "notes": notes}, indent=2))
    print(table(per_method, averages))
    for note in notes:
        print(f"note: {note}")
    print(" ".join(f"mt10_{m}={averages[m]['rate']:.3f}" if m in averages else f"mt10_{m}=unmeasured" for m in ("wamkit", "act", "dp")))
    graded = {m: a["best_reward"] for m, a in averages.items() if a["best_reward"] is not None}
    if graded:
        print("best shaped reward, mean over tasks (0-10): " + ", ".join(f"{m} {r:.2f}" for m, r in graded.items()))
    if peaks:
        print(peaks_text(peaks))
    if judge is None:
        print("wm_rank_spearman: no judge report in phase 1")
    else:
        print(f"wm_rank_spearman={_rho_text(judge)}")
        if "mean_score" in judge:
            print(f"wm_rank_spearman (mean score)={_rho_text(judge['mean_score'])}")
        if "changed_region" in judge:
            print(f"wm_rank_spearman (changed-region score)={_rho_text(judge['changed_region'])}")
        if "best_reward" in judge:
            print(f"wm_rank_spearman (against the best shaped reward, not success)={_rho_text(judge['best_reward'])}")
        scored = [p["score"] for p in judge["policies"]]
        if judge["references"]:
            print("judge scores [dB]: policies " + f"{min(scored):.2f}-{max(scored):.2f}; "
                  + ", ".join(f"{name} {score:.2f}" for name, score in judge["references"].items()))
        if judge.get("action_response"):
            from wamkit.worldmodel.policy_eval import action_response_text

            print(action_response_text(judge["action_response"]))
    if merged and checkpoints_only:
        print(f"(wamkit's checkpoints alone: {_rho_text(checkpoints_only)})")
    return 0


def _rho_text(judge: dict) -> str:
    rho = "undefined" if judge["rho"] is None else f"{judge['rho']:.3f}"
    p_text = "" if judge["p"] is None else f" p={judge['p']:.3g}"
    return f"{rho} n={judge['n']}{p_text} ({judge['p_method']})"


if __name__ == "__main__":
    sys.exit(main())
