"""benchmarks/mt10_report.py on hand-made phase results: per-task and pooled intervals, the RESULTS lines read
from the files, Spearman's rho with its exact p-value; and the LeRobot time box's step count."""

import json

import pytest

from tests.helpers import load_benchmark_script

ENVS = ["metaworld/reach-v3", "metaworld/push-v3"]


def _suite(counts, step=None, rewards=(None, None)):
    return {"tasks": [{"env_name": e, "successes": k, "episodes": n, "mean_best_reward": r}
                      for e, (k, n), r in zip(ENVS, counts, rewards)], "training_step": step}


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_report_pools_intervals_and_prints_measured_lines(tmp_path, monkeypatch, capsys):
    report = load_benchmark_script(monkeypatch, "mt10_report")
    one, two = tmp_path / "one", tmp_path / "two"
    _write(one / "eval/final/results.json", _suite([(9, 10), (6, 10)], rewards=(9.0, 5.0)))
    for step, counts in ((100, [(1, 4), (0, 4)]), (200, [(3, 4), (1, 4)])):
        _write(one / f"eval/curve/step_{step:09d}/results.json", _suite(counts, step))
    scores, success = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [0.1, 0.2, 0.3, 0.4, 0.6, 0.5]
    _write(one / "eval/judge/report.json", {"policies": [{"label": f"p{i}", "score": s, "success_rate": r}
                                                         for i, (s, r) in enumerate(zip(scores, success))]})
    for method, counts in (("act", [(5, 10), (2, 10)]), ("diffusion", [(4, 10), (4, 10)])):
        extra = {"per_task": dict(zip(ENVS, counts))}
        if method == "act":  # DP's results predate the best reward: no average is made up for it
            extra["per_task_best_reward"] = dict(zip(ENVS, [6.0, 1.0]))
        _write(two / f"eval/{method}/results.json", {"rows": [{"status": "ok", "extra": extra}]})
    assert report.main([str(one), str(two), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "mt10_wamkit=0.750 mt10_act=0.350 mt10_dp=0.400" in out
    assert "best shaped reward, mean over tasks (0-10): wamkit 7.00, act 3.50\n" in out
    # one swapped pair of 6: rho = 1 - 6 * 2 / (6 * 35) = 0.943, p from all 720 pairings
    rho = report.spearman_with_p(scores, success)
    assert rho["rho"] == pytest.approx(1 - 6 * 2 / (6 * 35)) and rho["p_method"] == "exact permutation"
    assert f"wm_rank_spearman={rho['rho']:.3f} n=6 p={rho['p']:.3g}" in out and 0 < rho["p"] < 0.05
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["average"]["wamkit"]["successes"] == 15 and summary["average"]["wamkit"]["episodes"] == 20
    lo, hi = summary["average"]["wamkit"]["ci95"]
    assert lo < 0.75 < hi  # the pooled Wilson interval of 15/20
    assert [p["step"] for p in summary["curve"]] == [100, 200]
    assert "| reach-v3 | 9/10 = 0.90" in (tmp_path / "out" / "table.md").read_text()
    assert (tmp_path / "out" / "success_vs_step.png").stat().st_size > 0


def test_the_merged_ranking_with_act_and_dp_is_the_headline(tmp_path, monkeypatch, capsys):
    """PHASE=2's merge (checkpoints, ACT, DP: 9 policies) heads the line, drawn p-value named; PHASE=1's own after it."""
    report = load_benchmark_script(monkeypatch, "mt10_report")
    one, two = tmp_path / "one", tmp_path / "two"
    _write(one / "eval/final/results.json", _suite([(9, 10), (6, 10)]))
    rows = [{"label": f"p{i}", "score": float(i), "success_rate": 0.1 * i} for i in range(9)]
    _write(one / "eval/judge/report.json", {"policies": rows[:7]})
    rows[7]["score"], rows[8]["score"] = 0.5, 1.5  # ACT and DP, best in the sim, judged poorly
    for r in rows:  # over the changed pixels the same rollouts rank exactly as the sim does
        r["by_region"] = {"frame": {"score": r["score"]}, "changed": {"score": r["success_rate"] * 10}}
        r["best_reward"] = 10 - r["score"]  # the sim's graded measure, ranked exactly against the judge's scores
    refs = {"expert": {"score": 9.5, "per_episode": [9.0, 10.0]}, "swapped_actions": {"score": 4.25, "per_episode": [4.0, 10.0]},
            "static": {"score": 2.0, "per_episode": [2.0, 2.0]}}
    _write(two / "eval/judge_all/report.json", {"policies": rows, "references": refs})
    assert report.main([str(one), str(two), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    merged = report.spearman_with_p([r["score"] for r in rows], [r["success_rate"] for r in rows])
    assert merged["n"] == 9 and merged["p_method"].startswith("permutation") and merged["rho"] < 0.9
    assert f"wm_rank_spearman={merged['rho']:.3f} n=9 p={merged['p']:.3g}" in out
    assert "(wamkit's checkpoints alone: 1.000 n=7" in out
    assert "wm_rank_spearman (changed-region score)=1.000 n=9" in out
    assert "wm_rank_spearman (against the best shaped reward, not success)=-1.000 n=9" in out
    assert "judge scores [dB]: policies 0.00-6.00; expert 9.50, swapped_actions 4.25, static 2.00" in out
    assert "Action response (expert minus swapped_actions, per episode): 2.50 ± 2.50 dB; 1 of 2 episodes moved" in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["judge"]["changed_region"]["rho"] == pytest.approx(1.0) and "changed_region" not in summary["judge_checkpoints_only"]


def test_the_judges_episode_rank_heads_the_line_and_the_mean_score_follows(tmp_path, monkeypatch, capsys):
    report = load_benchmark_script(monkeypatch, "mt10_report")
    one, two = tmp_path / "one", tmp_path / "two"
    _write(one / "eval/final/results.json", _suite([(9, 10), (6, 10)]))
    success = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    rows = [{"label": f"p{i}", "score": 7.0 - i, "episode_rank": 7.0 - i, "success_rate": r} for i, r in enumerate(success)]
    _write(two / "eval/judge_all/report.json", {"policies": rows})  # episode ranks agree with the sim, mean scores oppose it
    assert report.main([str(one), str(two), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "wm_rank_spearman=1.000 n=7" in out and "wm_rank_spearman (mean score)=-1.000 n=7" in out
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["judge"]["ranked_by"] == "episode_rank"

    # a report written before the judge ranked by episode: recomputed from its per-episode scores
    per_episode = [[7.0 - i, 1.0 * i] for i in range(7)]  # every policy first on one episode, last on the other...
    per_episode[6] = [3.0, 6.5]                            # ...but the best-in-sim one is ahead on both
    old_rows = [{"label": f"p{i}", "score": sum(e) / 2, "per_episode": e, "success_rate": r}
                for i, (e, r) in enumerate(zip(per_episode, success))]
    _write(two / "eval/judge_all_recorded/report.json", {"policies": old_rows})
    assert report.main([str(one), str(two), "--judge", "judge_all_recorded", "--out", str(tmp_path / "out2")]) == 0
    judge = json.loads((tmp_path / "out2" / "summary.json").read_text())["judge"]
    assert judge["ranked_by"] == "episode_rank" and judge["policies"][6]["episode_rank"] < judge["policies"][0]["episode_rank"]


def test_a_cut_call_reports_what_came_back_and_names_what_did_not(tmp_path, monkeypatch, capsys):
    """Phase 1 cut before its final evaluation and phase 2 without DP (the first H200 run): the curve's
    last checkpoint stands in for wamkit with a note, DP reads unmeasured, nothing is invented."""
    report = load_benchmark_script(monkeypatch, "mt10_report")
    one, two = tmp_path / "one", tmp_path / "two"
    for step, counts in ((100, [(1, 4), (0, 4)]), (218, [(2, 4), (1, 4)])):
        _write(one / f"eval/curve/step_{step:09d}/results.json", _suite(counts, step))
    _write(two / "eval/act/results.json", {"rows": [{"status": "ok", "extra": {"per_task": dict(zip(ENVS, [(5, 10), (2, 10)]))}}]})
    assert report.main([str(one), str(two), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "mt10_wamkit=0.375 mt10_act=0.350 mt10_dp=unmeasured" in out
    assert "the curve's last checkpoint (step 218)" in out and "dp: no results" in out
    assert "wm_rank_spearman: no judge report" in out


def test_time_box_fixes_steps_from_the_measured_rate(monkeypatch):
    pq = load_benchmark_script(monkeypatch, "policy_quality")
    assert pq.steps_in_budget(0.5, 100.0, 20) == 220
    assert pq.steps_in_budget(0.5, -3.0, 20) == 20  # already over: stop after the probe


def test_time_box_times_the_rate_after_the_warm_up(monkeypatch):
    """Slow first steps (autotuning) must not shrink the run: 20 steps of 0.133 s, then 0.047 s a step, in a
    240 s box, as ACT ran on the H200 (issue 26), fix ~5000 steps, not the 1801 that took 86 s."""
    pq = load_benchmark_script(monkeypatch, "policy_quality")
    t_warm = pq.WARMUP_STEPS * 0.133
    t_probe = t_warm + (pq.PROBE_STEPS - pq.WARMUP_STEPS) * 0.047
    steps = pq.time_box_steps(t_warm, t_probe, pq.PROBE_STEPS, 240.0)
    assert steps == pq.PROBE_STEPS + int((240.0 - t_probe) / 0.047)
    assert abs(t_probe + (steps - pq.PROBE_STEPS) * 0.047 - 240.0) < 0.05  # the box is filled
    assert pq.time_box_steps(t_warm, 250.0, pq.PROBE_STEPS, 240.0) == pq.PROBE_STEPS  # over already: stop


def test_training_peaks_come_from_the_logs_archive_and_the_baselines_rows(tmp_path, monkeypatch, capsys):
    """wamkit's peak (beside its --dry-run estimate) is read from PHASE=1's logs archive, ACT's and DP's from their
    rows; the archives are extracted elsewhere, the folder the device tool filled stays as it came back."""
    import tarfile

    report = load_benchmark_script(monkeypatch, "mt10_report")
    staged, one, two = tmp_path / "staged", tmp_path / "one", tmp_path / "two"
    _write(staged / "eval/final/results.json", _suite([(9, 10), (6, 10)]))
    from wamkit.train.memory import measured_line  # the trainer's own words, so a change to them fails here

    (staged / "train_policy.log").write_text(f"[wamkit] {measured_line(10.8, 11.7, 0.3)}\n")
    one.mkdir()
    with tarfile.open(one / "mt10_phase1.tgz", "w:gz") as tar:
        tar.add(staged / "eval", arcname="eval")
    with tarfile.open(one / "logs_phase1.tgz", "w:gz") as tar:
        tar.add(staged / "train_policy.log", arcname="train_policy.log")
    for method, peak in (("act", 3.25), ("diffusion", None)):  # DP's row predates the field: it is left out
        extra = {"per_task": dict(zip(ENVS, [(5, 10), (2, 10)]))}
        _write(two / f"eval/{method}/results.json", {"rows": [{"status": "ok", "extra": extra, "peak_memory_gib": peak}]})
    assert report.main([str(one), str(two), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "mt10_wamkit=0.750" in out and sorted(p.name for p in one.iterdir()) == ["logs_phase1.tgz", "mt10_phase1.tgz"]
    assert "training peak GPU memory: wamkit 10.8 GiB (--dry-run 11.7), act 3.2 GiB\n" in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["training_peak_memory"] == {"wamkit": {"peak_gib": 10.8, "estimate_gib": 11.7},
                                               "act": {"peak_gib": 3.25, "estimate_gib": None}}
