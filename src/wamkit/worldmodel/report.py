"""`eval_wm_main`: roll a forward-dynamics model along recorded episodes and write a report.

out_dir/
  report.json     settings, per mode: model and copy-last-frame baseline summaries, per-chunk rows,
                  PSNR/SSIM per horizon step; probes per episode and axis
  report.md       the same as tables (a baseline row under every model row)
  videos/ep<E>_<mode>.mp4   real | predicted | |difference| side by side, chunks back to back
  videos/ep<E>_probes.mp4   probe videos side by side: axis 0 +, axis 0 -, axis 1 +, ...
  plots/<mode>_<psnr|ssim>.png   metric vs horizon, model and baseline (needs matplotlib)

Horizon: in teacher_forced mode the step inside a chunk (1..T, chunks restart from recorded
frames); in autoregressive mode the frame count since the episode start (1..N*T)."""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from wamkit.data import LeRobotV3Dataset
from wamkit.worldmodel import metrics as M
from wamkit.worldmodel.rollout import (MODES, BundleEpisodes, Rollout, WorldModel, WorldModelError, load_episode, probe_episode,
                                       rollout_episodes)

PSNR_THRESHOLD_DB = 20.0


# ---- metrics of rollouts --------------------------------------------------------------------------
PSNR_CAP_DB = 100.0  # identical frames have infinite PSNR; means clip it here


def _curve(values: dict[int, list[float]], cap: float | None = None) -> list[float | None]:
    return [M.mean_finite(values[k], cap) for k in sorted(values)]


def score(rollouts: list[Rollout], which: str, fps: float, psnr_threshold: float = PSNR_THRESHOLD_DB,
          device: torch.device | str = "cpu") -> dict:
    """Summary of `which` ('pred' or 'baseline') against the recorded frames over rollouts of one mode.
    The per-frame PSNR and SSIM run on `device` (the model's: on a GPU host the float64 convolutions of
    SSIM took most of an evaluation on one CPU thread), one chunk at a time to bound its memory."""
    mode = rollouts[0].mode
    chunk_rows, all_psnr, all_ssim, ratios, corrs = [], [], [], [], []
    by_chunk_step: dict[str, dict[int, list[float]]] = {"psnr": defaultdict(list), "ssim": defaultdict(list)}
    by_rollout_step: dict[str, dict[int, list[float]]] = {"psnr": defaultdict(list), "ssim": defaultdict(list)}
    for r in rollouts:
        video = getattr(r, which)
        t = video.shape[1] - 1
        for k, start in enumerate(r.starts):
            pred_k, real_k = video[k, 1:].to(device), r.real[k, 1:].to(device)
            p, s = M.psnr(pred_k, real_k).tolist(), M.ssim(pred_k, real_k).tolist()
            ratio, corr = M.motion_ratio(video[k], r.real[k]), M.motion_correlation(video[k], r.real[k])
            chunk_rows.append({"episode": r.episode, "chunk": k, "start": start, "psnr": M.mean_finite(p, PSNR_CAP_DB),
                               "ssim": float(np.mean(s)), "motion_ratio": ratio, "motion_corr": corr,
                               "psnr_by_step": [M.finite(v) for v in p], "ssim_by_step": s})
            all_psnr += p
            all_ssim += s
            ratios.append(ratio)
            corrs.append(corr)
            for h in range(1, t + 1):
                by_chunk_step["psnr"][h].append(p[h - 1])
                by_chunk_step["ssim"][h].append(s[h - 1])
                by_rollout_step["psnr"][k * t + h].append(p[h - 1])
                by_rollout_step["ssim"][k * t + h].append(s[h - 1])
    horizon = by_rollout_step if mode == "autoregressive" else by_chunk_step
    psnr_curve, ssim_curve = _curve(horizon["psnr"], PSNR_CAP_DB), _curve(horizon["ssim"])
    out = {
        "psnr": M.mean_finite(all_psnr, PSNR_CAP_DB),
        "ssim": M.mean_finite(all_ssim),
        "motion_ratio": M.mean_finite(ratios),
        "motion_corr": M.mean_finite(corrs),
        "usable_horizon": M.usable_horizon([v if v is not None else -math.inf for v in psnr_curve], fps, psnr_threshold),
        "horizon_kind": "rollout_step" if mode == "autoregressive" else "chunk_step",
        "psnr_by_horizon": psnr_curve,
        "ssim_by_horizon": ssim_curve,
        "psnr_by_chunk_step": _curve(by_chunk_step["psnr"], PSNR_CAP_DB),
        "ssim_by_chunk_step": _curve(by_chunk_step["ssim"]),
        "per_chunk": chunk_rows,
    }
    if which == "pred":
        wall = sum(r.wall_seconds for r in rollouts)
        out["wall_seconds"] = wall
        out["warmup_seconds"] = sum(r.extra.get("warmup_seconds", 0.0) for r in rollouts)
        out["video_seconds"] = sum(r.video_seconds for r in rollouts)
        out["real_time_factor"] = M.real_time_factor(out["video_seconds"], wall)
    else:
        out["real_time_factor"] = None
    return out


def probe_report(probes: dict, reference: torch.Tensor | None, threshold: float = 8.0) -> dict:
    motion = {a: {s: M.motion_vector(v, threshold) for s, v in d.items()} for a, d in probes.items()}
    return M.probe_metrics(motion, reference)


# ---- files ----------------------------------------------------------------------------------------
def write_mp4(path: Path, frames: np.ndarray, fps: float) -> None:
    """uint8 [N, H, W, 3] -> H.264 mp4 (odd sizes padded by one pixel for yuv420p)."""
    import av

    frames = np.asarray(frames, dtype=np.uint8)
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)))
    path.parent.mkdir(parents=True, exist_ok=True)
    rate = Fraction(float(fps)).limit_denominator(1000)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "12", "preset": "veryfast"}
        for img in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")))
        container.mux(stream.encode(None))


def _separator(h: int) -> np.ndarray:
    return np.full((h, 2, 3), 255, dtype=np.uint8)


def side_by_side(r: Rollout) -> np.ndarray:
    """Chunks back to back (frame 0 of the first chunk, then frames 1..T of each): real | pred | |diff|."""
    real = torch.cat([r.real[0, :1]] + [c[1:] for c in r.real]).numpy()
    pred = torch.cat([r.pred[0, :1]] + [c[1:] for c in r.pred]).numpy()
    diff = np.abs(real.astype(np.int16) - pred.astype(np.int16)).astype(np.uint8)
    sep = np.broadcast_to(_separator(real.shape[1]), (len(real), *_separator(real.shape[1]).shape))
    return np.concatenate([real, sep, pred, sep, diff], axis=2)


def probe_strip(probes: dict) -> np.ndarray:
    panels = []
    for axis in sorted(probes):
        for sign in ("+", "-"):
            v = probes[axis][sign].numpy()
            if panels:
                panels.append(np.broadcast_to(_separator(v.shape[1]), (len(v), v.shape[1], 2, 3)))
            panels.append(v)
    return np.concatenate(panels, axis=2)


def write_plots(out_dir: Path, results: dict) -> list[str] | str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); no plots"
    files = []
    for mode, res in results.items():
        for metric in ("psnr", "ssim"):
            fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
            for which, style in (("model", "-o"), ("baseline", "--s")):
                curve = res[which][f"{metric}_by_horizon"]
                ax.plot(range(1, len(curve) + 1), [np.nan if v is None else v for v in curve], style, ms=3, label=which)
            if metric == "psnr":
                ax.axhline(res["model"]["usable_horizon"]["threshold_db"], color="grey", lw=0.8, ls=":")
            ax.set_xlabel("horizon step" + (" (since episode start)" if mode == "autoregressive" else " (within chunk)"))
            ax.set_ylabel(metric.upper() + (" [dB]" if metric == "psnr" else ""))
            ax.set_title(f"{mode}: {metric.upper()} vs horizon")
            ax.legend()
            fig.tight_layout()
            path = out_dir / "plots" / f"{mode}_{metric}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path)
            plt.close(fig)
            files.append(str(path.relative_to(out_dir)))
    return files


def _fmt(x, digits=3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def verdict(mode: str, result: dict) -> str:
    """Does the model beat copying the last real frame? By PSNR (the primary number), SSIM beside it."""
    m, b = result["model"], result["baseline"]
    if m["psnr"] is None or b["psnr"] is None:
        return f"{mode}: no verdict (PSNR undefined)"
    gain = m["psnr"] - b["psnr"]
    word = "beats" if gain > 0 else "does NOT beat"
    return (f"{mode}: the model {word} copy-last-frame by {gain:+.2f} dB PSNR ({m['psnr']:.2f} vs {b['psnr']:.2f} dB; "
            f"SSIM {_fmt(m['ssim'])} vs {_fmt(b['ssim'])})")


def model_seconds(report: dict, key: str) -> float:
    """The model's `key` (wall_seconds, warmup_seconds) summed over the report's modes."""
    return sum(res["model"].get(key) or 0.0 for res in report["results"].values())


def write_markdown(path: Path, report: dict) -> None:
    s = report["settings"]
    lines = [
        "# World-model evaluation", "",
        "checkpoint: `" + ", ".join(f"{k}={v}" for k, v in report["checkpoint"].items()) + "`  ", f"dataset: `{report['dataset']}`  episodes: {report['episodes']}  ",
        f"sampling: {s['num_steps']} {s['solver']} steps, shift {s['shift']}, guidance {s['guidance']} "
        f"in sigma {s['guidance_interval']}, seed {s['seed']}; chunk {s['chunk_length']} actions at {s['fps']} fps", "",
        "| mode | predictor | PSNR [dB] | SSIM | motion ratio | motion corr | usable horizon [s] | real-time factor [video s per compute s] |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for mode, res in report["results"].items():
        for which, name in (("model", "model"), ("baseline", "copy-last-frame baseline")):
            r = res[which]
            uh = r["usable_horizon"]
            lines.append(f"| {mode} | {name} | {_fmt(r['psnr'], 2)} | {_fmt(r['ssim'])} | {_fmt(r['motion_ratio'])} | "
                         f"{_fmt(r['motion_corr'])} | {_fmt(uh['seconds'], 2)}{'+' if uh['reached_end'] else ''} | "
                         f"{_fmt(r['real_time_factor'], 3)} |")
    warmup = model_seconds(report, "warmup_seconds")
    lines += ["", f"Usable horizon: time until PSNR per horizon step falls below {s['psnr_threshold_db']} dB "
              "('+': never within the evaluated horizon). Real-time factor: generated video seconds per second of "
              f"the rollouts, after one untimed warm-up batch ({warmup:.2f} s).", ""]
    if report.get("probes"):
        lines += ["## Action-axis probes", "",
                  "| episode | axis | cosine to data direction | +/- antisymmetry cosine | response (dx, dy) px |",
                  "| --- | --- | --- | --- | --- |"]
        names = report.get("action_names") or []
        for ep, p in report["probes"].items():
            for axis, a in p["model"]["axes"].items():
                name = f"{axis} {names[int(axis)]}" if int(axis) < len(names) else axis
                lines.append(f"| {ep} | {name} | {_fmt(a['cosine'])} | {_fmt(a['antisymmetry_cosine'])} | "
                             f"({a['response'][0]:.2f}, {a['response'][1]:.2f}) |")
            lines.append(f"| {ep} | min separation | {_fmt(p['model']['min_separation_deg'], 1)}° | | |")
            lines.append(f"| {ep} | baseline | {_fmt(p['baseline_cosine'])} | | (0, 0) |")
        lines.append("")
    if report.get("files"):
        lines += ["## Files", ""] + [f"- `{f}`" for f in report["files"]] + [""]
    lines += ["## Verdict", ""] + [f"- {verdict(mode, res)}" for mode, res in report["results"].items()] + [""]
    path.write_text("\n".join(lines))


# ---- entry ----------------------------------------------------------------------------------------
def open_episodes(path) -> "LeRobotV3Dataset | BundleEpisodes":
    """The recorded episodes at `path`: a sim-bimanual bundle or a LeRobot v3.0 dataset."""
    from wamkit.bimanual.bundle import is_bundle

    return BundleEpisodes(path) if is_bundle(path) else LeRobotV3Dataset(path)


def _episode(dataset, episode: int, contract: dict):
    return dataset.load(episode) if isinstance(dataset, BundleEpisodes) else load_episode(dataset, episode, contract)


def _action_names(dataset, contract: dict) -> list[str]:
    return dataset.action_names() if isinstance(dataset, BundleEpisodes) else dataset.channel_names(contract.get("action_key", "action"))


def evaluate(wm: WorldModel, dataset: LeRobotV3Dataset, episodes: list[int], modes, out_dir: Path, seed: int = 0,
             probes: bool = True, probe_scale: float = 1.0, psnr_threshold: float = PSNR_THRESHOLD_DB,
             videos: bool = True) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    files: list[str] = []
    loaded = {ep: _episode(dataset, ep, wm.contract) for ep in episodes}
    by_mode: dict[str, list[Rollout]] = {}
    for mode in modes:
        by_mode[mode] = rollout_episodes(wm, [loaded[ep] for ep in episodes], mode, seed)
        if videos:
            for r in by_mode[mode]:
                path = out_dir / "videos" / f"ep{r.episode:03d}_{mode}.mp4"
                write_mp4(path, side_by_side(r), wm.fps)
                files.append(str(path.relative_to(out_dir)))
    results = {mode: {which: score(rs, key, wm.fps, psnr_threshold, wm.device) for which, key in (("model", "pred"), ("baseline", "baseline"))}
               for mode, rs in by_mode.items()}

    probe_out = {}
    if probes:
        # Reference image direction per action axis, fitted on the recorded chunks of every episode.
        any_rollouts = next(iter(by_mode.values()))
        motions = torch.stack([M.motion_vector(c) for r in any_rollouts for c in r.real])
        means = torch.cat([r.mean_actions for r in any_rollouts])
        reference = M.reference_directions(motions, means)
        for ep in episodes:
            videos_ep = probe_episode(wm, loaded[ep], probe_scale, seed)
            model = probe_report(videos_ep, reference)
            baseline = probe_report({a: {s: loaded[ep].frames[:1].expand_as(v) for s, v in d.items()}
                                     for a, d in videos_ep.items()}, reference)
            probe_out[str(ep)] = {"model": model, "baseline": baseline,
                                  "baseline_cosine": M.mean_finite([a["cosine"] for a in baseline["axes"].values()]),
                                  "reference_fitted_on_chunks": int(len(motions))}
            if videos:
                path = out_dir / "videos" / f"ep{ep:03d}_probes.mp4"
                write_mp4(path, probe_strip(videos_ep), wm.fps)
                files.append(str(path.relative_to(out_dir)))

    plots = write_plots(out_dir, results)
    if isinstance(plots, list):
        files += plots
    report = {
        "format": "wamkit-wm-report", "version": 1,
        "checkpoint": wm.loaded.source, "dataset": str(dataset.root), "episodes": list(episodes), "modes": list(modes),
        "action_names": _action_names(dataset, wm.contract),
        "settings": {"num_steps": wm.num_steps, "solver": wm.solver, "shift": wm.shift_for(next(iter(loaded.values())).frames[0]),
                     "guidance": wm.guidance, "guidance_interval": list(wm.guidance_interval), "seed": seed,
                     "fps": wm.fps, "chunk_length": wm.chunk_length, "psnr_threshold_db": psnr_threshold,
                     "probe_scale": probe_scale, "motion_threshold": 8.0, "causal_chunk_frames": wm.chunk_frames,
                     "student_sigmas": wm.student_sigmas},
        "results": results, "probes": probe_out, "plots": plots, "files": files + ["report.json", "report.md"],
    }
    report = _json_safe(report)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, allow_nan=False))
    write_markdown(out_dir / "report.md", report)
    return report


def _json_safe(x):
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return M.finite(float(x))
    if isinstance(x, (np.integer,)):
        return int(x)
    return x


def default_out_dir(wm: WorldModel, use_ema: bool = True) -> Path:
    src = wm.loaded.source
    if "export" in src:
        return Path(src["export"]) / "eval_wm"
    from wamkit.storage import is_url, location

    ckpt = location(src["checkpoint"], "checkpoint path")
    name = ckpt.name if use_ema else f"{ckpt.name}_raw"
    if is_url(src["checkpoint"]):  # reports are local files: eval_wm/<run>/<iteration> here, not in the bucket
        return Path("eval_wm") / ckpt.parent.parent.name / name
    return ckpt.parent.parent / "eval_wm" / name


def eval_wm_main(checkpoint, dataset=None, episodes=None, modes=MODES, out_dir=None, num_steps: int = 30,
                 shift: float | None = None, guidance: float = 1.0, seed: int = 0, guidance_interval=(0.0, 1.0),
                 solver: str = "euler", probes: bool = True, probe_scale: float = 1.0,
                 psnr_threshold: float = PSNR_THRESHOLD_DB, device: str = "cpu", use_ema: bool = True,
                 allow_any_mode: bool = False, attention: str | None = None, dtype: str = "auto") -> int:
    """Evaluate a forward-dynamics checkpoint/export on recorded episodes; writes out_dir/report.{json,md},
    videos and plots. dataset: default the training dataset (data contract); episodes: default the
    run's first validation episode, else the first dataset episode; "held_out": all of the run's
    validation episodes; shift: default the training shift.
    The seed's eval setting is num_steps=30, guidance=1.0, shift=10."""
    modes = list(modes)
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise WorldModelError("modes", f"{bad or modes} not understood", f"use any of {list(MODES)}")
    t0 = time.perf_counter()
    wm = WorldModel.from_path(checkpoint, use_ema=use_ema, device=device, dtype=dtype, num_steps=num_steps, shift=shift,
                              guidance=guidance, guidance_interval=guidance_interval, solver=solver,
                              allow_any_mode=allow_any_mode, attention=attention)
    load_s = time.perf_counter() - t0
    ds = open_episodes(dataset or wm.contract["dataset"])
    val_episodes = list(wm.contract.get("val_episodes") or [])
    if isinstance(ds, BundleEpisodes):  # a bundle run records episode ids (ep00012)
        val_episodes = [ds.number(e) for e in val_episodes]
    if episodes == "held_out":
        if not val_episodes:
            raise WorldModelError("episodes", "this run recorded no validation episodes (data.val_fraction = 0?)",
                                  "name the episodes to evaluate with --episodes")
        episodes = val_episodes
    elif episodes is None or len(episodes) == 0:
        episodes = val_episodes[:1] or ds.episode_indices[:1]
    episodes = [int(e) for e in episodes]
    held_out = sum(e in val_episodes for e in episodes)
    print(f"evaluating episodes {episodes} of {ds.root} ({held_out} of them held out of training); the model computes "
          f"on {wm.device} in {str(next(wm.model.parameters()).dtype).removeprefix('torch.')}")
    out = Path(out_dir) if out_dir else default_out_dir(wm, use_ema)
    t1 = time.perf_counter()
    report = evaluate(wm, ds, episodes, modes, out, seed=seed, probes=probes, probe_scale=probe_scale,
                      psnr_threshold=psnr_threshold)
    rollout_s, warmup_s = model_seconds(report, "wall_seconds"), model_seconds(report, "warmup_seconds")
    print(f"time: model load {load_s:.1f} s, warm-up batch {warmup_s:.1f} s, rollouts {rollout_s:.1f} s, the rest (episodes, "
          f"probes, scores, videos, plots) {time.perf_counter() - t1 - rollout_s - warmup_s:.1f} s")
    for mode, res in report["results"].items():
        m, b = res["model"], res["baseline"]
        print(f"{mode:15s} PSNR {_fmt(m['psnr'], 2)} dB (baseline {_fmt(b['psnr'], 2)})  SSIM {_fmt(m['ssim'])} "
              f"(baseline {_fmt(b['ssim'])})  usable {_fmt(m['usable_horizon']['seconds'], 2)} s  "
              f"RTF {_fmt(m['real_time_factor'])}x real time (video s per compute s)")
    for mode, res in report["results"].items():
        print("verdict " + verdict(mode, res))
    print(f"wrote {out / 'report.md'}")
    return 0
