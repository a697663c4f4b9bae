"""What a run reads, from a validated config: the dataset, its train/validation windows, the normalizers and
the data contract (`build_run_data`). No model imports: LeRobot's baselines (benchmarks/policy_quality.py) build
their training windows here on hosts that carry no diffusers."""

from __future__ import annotations

import os

from wamkit.config.env import resolved
from wamkit.data import (LeRobotV3Dataset, Normalizer, SampleTransform, WindowDataset, check_constant_channels,
                         split_episodes, write_demo_dataset)
from wamkit.data.augment import seam_note
from wamkit.data.canvas import CanvasTransform
from wamkit.data.episode_frames import cache_off_note
from wamkit.data.multi import is_multi_root, open_lerobot
from wamkit.data.run_data import RunData
from wamkit.data.selection import KeepRanges, NoWindowsKept
from wamkit.data.writer import recorded_sim_camera
from wamkit.errors import DataError
from wamkit.model.text_tokenizer import resolve_text_tokenizer, warn_truncated_prompts
from wamkit.model.tokenizer import sample_frame_indices


def open_dataset(cfg) -> LeRobotV3Dataset:
    root = cfg.data.resolved_path()
    if not (root / "meta" / "info.json").exists() and not is_multi_root(root) and cfg.data.generate_demo:
        write_demo_dataset(root)
    return open_lerobot(root, expected_fps=cfg.data.fps, include_failures=cfg.data.include_failures)


def build_run_data(cfg) -> RunData:
    from wamkit.bimanual.bundle import build_bundle_run_data, is_bundle

    if is_bundle(cfg.data.resolved_path()):  # a local sim-bimanual bundle (manifest.json + samples.json)
        return build_bundle_run_data(cfg)
    dataset = open_dataset(cfg)
    if not dataset.enable_frame_cache(cfg.data.frame_cache_mb) and os.environ.get("RANK", "0") == "0":
        note = cache_off_note(dataset.decoded_video_bytes(), cfg.data.frame_cache_mb, cfg.data.num_workers)
        if note:
            print(note, flush=True)
    if dataset.stats is None:
        raise DataError(f"{dataset.root}/meta/stats.json", "is missing", "compute normalization statistics for the dataset")
    if cfg.data.use_state and cfg.data.state_key not in dataset.features:
        raise DataError(f"{dataset.root}/meta/info.json: features", f"data.use_state is true but the dataset has no "
                        f"state feature {cfg.data.state_key!r} (have {sorted(dataset.features)})",
                        "--set data.use_state=false for a policy without state, or set data.state_key to the state feature")
    warn_truncated_prompts(resolve_text_tokenizer(cfg), [cfg.data.prompt_template.format(task=t) for t in dataset.tasks.values()],
                           f"{dataset.root}/meta/tasks.parquet (data.prompt_template {cfg.data.prompt_template!r})")
    tasks = [dataset.episode_task(e) for e in dataset.episode_indices] if cfg.data.val_split == "per_task" else None
    train_eps, val_eps = split_episodes(dataset.episode_indices, cfg.data.val_fraction, cfg.job.seed, groups=tasks)
    cameras = cfg.data.camera_keys or None
    state_key = cfg.data.state_key if cfg.data.use_state else None

    keep = KeepRanges.load(resolved(cfg.data, "keep_ranges_path")) if cfg.data.keep_ranges_path else None

    def windows(episodes):
        return WindowDataset(dataset, episodes, cfg.data.chunk_length, cameras, state_key, cfg.data.action_key,
                             keep_ranges=keep, trajectory_key_field=cfg.data.trajectory_key_field,
                             goal_horizon=cfg.diffusion.goal_state_horizon if cfg.diffusion.goal_state_loss_weight > 0 else None)

    def val_windows(episodes):  # a keep-ranges filter may leave no validation window: then no validation
        try:
            return windows(episodes) if episodes else None
        except NoWindowsKept:
            return None

    source = f"{dataset.root}/meta/stats.json"
    action_norm = Normalizer.from_stats(dataset.stats, cfg.data.action_key, cfg.data.normalization, source)
    state_norm = None
    if cfg.data.use_state:
        mode = cfg.data.state_normalization or cfg.data.normalization
        state_norm = Normalizer.from_stats(dataset.stats, cfg.data.state_key, mode, source)
    check_constant_channels(dataset, [action_norm, state_norm])  # stats that call a varying channel constant
    camera_keys = cameras or dataset.camera_keys  # the cameras the canvas composes (every video feature when unset)
    canvas = CanvasTransform.from_config(cfg.data, camera_keys)
    note = seam_note(cfg.data.random_shift_px, len(camera_keys))
    if note:
        print(f"[wamkit] note: {note}", flush=True)
    transform = SampleTransform(action_norm, state_norm, cfg.model.max_action_dim, cfg.data.use_state, cfg.data.domain_id,
                                canvas=canvas, frame_indices=sample_frame_indices(
                                    cfg.data.chunk_length, cfg.diffusion.future_video_latents, cfg.diffusion.future_video_stride))
    contract = {
        "dataset": str(dataset.root),
        "fps": dataset.fps,
        "chunk_length": cfg.data.chunk_length,
        "camera_keys": camera_keys,
        "camera_sizes": [list(dataset.frame_size(c)) for c in camera_keys],  # [H, W] each (serve warm-up)
        # the simulator camera(s) that rendered them (a `wamkit sim record` recording), which `eval sim` renders
        "sim_camera": recorded_sim_camera(dataset.root, camera_keys),
        "action_key": cfg.data.action_key,
        "action_dim": dataset.feature_dim(cfg.data.action_key),
        "state_key": state_key,
        "state_dim": dataset.feature_dim(state_key) if state_key else 0,
        "max_action_dim": cfg.model.max_action_dim,
        "use_state": cfg.data.use_state,
        "domain_name": cfg.data.domain_name,
        "domain_id": cfg.data.domain_id,
        "prompt_template": cfg.data.prompt_template,
        "canvas": canvas.state_dict(),  # compose_canvas(images, camera_layout, resolution, wrist_index)
        "action_normalizer": action_norm.state_dict(),
        "state_normalizer": state_norm.state_dict() if state_norm else None,
        "train_episodes": train_eps,
        "val_episodes": val_eps,
    }
    views = [tuple(size) for size in contract["camera_sizes"]]
    return RunData(dataset, windows(train_eps), val_windows(val_eps), transform, contract, frame_size=canvas.size(views),
                   example_task=dataset.episode_task(train_eps[0]) if train_eps else None)
