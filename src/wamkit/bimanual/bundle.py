"""The local sim-bimanual training bundle: format, synthetic writer, validator, and the window dataset.

    <bundle>/manifest.json      format, version, action schema id + the 59 names, padded dim (64), fps,
                                chunk_length T (a window is T+1 frames / T action rows), sources with
                                relative weights and domain ids, pinned global asinh statistics
                                ({"kind": "global_asinh", "scale": [59]}: y = asinh(x / scale)), the
                                tokenizer resource path, frame size
    <bundle>/samples.json       [{"id", "source", "episode_id", "split": train|val, "media", "actions",
                                "action_mask", "caption", "frame_start", "frame_end"}]; frame_end is
                                exclusive and frame_end - frame_start == T + 1; action rows
                                [frame_start, frame_end - 1) of the episode's action file
    <bundle>/media/*.mp4        one H.264 video per episode (frame i at pts i / fps)
    <bundle>/actions/*.npy      raw float32 [N - 1, 59] per episode (row t leads from frame t to t+1),
                                and *.mask.npy bool [59]: which schema values the source provides
    <bundle>/resources/tokenizer/  tokenizer_config.json ({"kind": "byte"} or a tokenizer directory)

Training reads raw actions and normalizes them with the pinned statistics (never per-run stats), pads
59 -> 64 and masks invalid and padded values. Every window of an episode must lie in one split."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from wamkit.bimanual.schema import ACTION_DIM, ACTION_NAMES, ARM_SIZE, PADDED_DIM, SCHEMA_ID
from wamkit.errors import ConfigError, DataError

BUNDLE_FORMAT = "wamkit-bimanual-bundle"
BUNDLE_VERSION = 1
MANIFEST = "manifest.json"
SAMPLES = "samples.json"
TOKENIZER_DIR = "resources/tokenizer"
SPLITS = ("train", "val")
SAMPLE_KEYS = ("id", "source", "episode_id", "split", "media", "actions", "action_mask", "caption", "frame_start", "frame_end")
# latent frames per chunk of the block-causal stages (1-3); stage 0 is bidirectional
STAGE_CAUSAL_CHUNK_FRAMES = {0: 0, 1: 1, 2: 1, 3: 1}


def is_bundle(path: str | Path) -> bool:
    path = Path(path)
    return (path / MANIFEST).is_file() and (path / SAMPLES).is_file()


# ---- synthetic writer ---------------------------------------------------------------------------
def _rot6d(yaw: float) -> np.ndarray:
    c, s = math.cos(yaw), math.sin(yaw)
    return np.array([c, s, 0.0, -s, c, 0.0])  # first two columns of Rz(yaw), column-major


def _render(left: np.ndarray, right: np.ndarray, size: int) -> np.ndarray:
    """Two disks (left arm red, right arm blue) at the arms' ee x/y; radius grows with gripper width."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    img = np.full((size, size, 3), 60, np.uint8)
    for arm, color in ((left, (230, 60, 50)), (right, (50, 90, 230))):
        cx, cy = (arm[0] + 0.5) * size, (arm[1] + 0.5) * size
        radius = size * (0.08 + 1.2 * arm[9])
        img[(xx - cx) ** 2 + (yy - cy) ** 2 <= radius**2] = color
    return img


def _simulate_episode(rng: np.random.Generator, num_frames: int, fps: float) -> tuple[np.ndarray, str]:
    """Raw pose trajectory [num_frames, 59] of two arms (fixed base: body values stay 0, invalid)."""
    t = np.arange(num_frames) / fps
    poses = np.zeros((num_frames, ACTION_DIM), np.float32)
    words = []
    for a, arm in enumerate(("left", "right")):
        base = a * ARM_SIZE
        start = rng.uniform(-0.3, 0.3, 2) + np.array([-0.1 if arm == "left" else 0.1, 0.0])
        velocity = rng.uniform(-0.25, 0.25, 2)
        freq, phase = rng.uniform(0.2, 0.6), rng.uniform(0, 2 * math.pi)
        xy = np.clip(start[None] + velocity[None] * t[:, None], -0.42, 0.42)
        poses[:, base + 0: base + 2] = xy
        poses[:, base + 2] = 0.1 + 0.05 * np.sin(2 * math.pi * freq * t + phase)
        yaw = np.arctan2(velocity[1], velocity[0]) + 0.3 * np.sin(2 * math.pi * freq * t)
        poses[:, base + 3: base + 9] = np.stack([_rot6d(y) for y in yaw])
        poses[:, base + 9] = 0.04 + 0.035 * np.sin(2 * math.pi * freq * t + phase)  # gripper width, m
        joints = np.cumsum(rng.normal(0, 0.02, (num_frames, 7)), axis=0) + rng.uniform(-1, 1, 7)
        poses[:, base + 10: base + 17] = joints
        poses[1:, base + 17: base + 20] = np.diff(poses[:, base: base + 3], axis=0) * fps
        poses[1:, base + 20: base + 23] = 0.0
        poses[1:, base + 22] = np.diff(yaw) * fps  # angular velocity about z
        poses[1:, base + 23] = np.diff(poses[:, base + 9]) * fps  # gripper velocity
        words.append(f"{arm} arm {'right' if velocity[0] > 0 else 'left'}ward and {'down' if velocity[1] > 0 else 'up'}")
    return poses, "bimanual reach: move the " + " while the ".join(words) + "."


def write_synthetic_bundle(
    out: str | Path, samples: int = 12, chunk_length: int = 8, windows_per_episode: int = 2, image_size: int = 32,
    fps: float = 10.0, seed: int = 0, val_fraction: float = 0.25, sources: list[tuple[str, float]] | None = None,
) -> Path:
    """Write a small bundle: `samples` windows of two moving arms (disks) driven by the actions."""
    from wamkit.data.writer import encode_video

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise DataError(str(out), "already exists and is not empty", "choose a new bundle directory")
    sources = sources or [("sim_bimanual_synth", 1.0)]
    rng = np.random.default_rng(seed)
    num_episodes = max(2, math.ceil(samples / windows_per_episode))
    num_frames = windows_per_episode * chunk_length + 1
    n_val = min(max(1, round(num_episodes * val_fraction)), num_episodes - 1) if val_fraction > 0 else 0
    val_episodes = set(rng.permutation(num_episodes)[:n_val].tolist())
    mask = np.zeros(ACTION_DIM, bool)
    mask[: 2 * ARM_SIZE] = True  # fixed-base source: body values invalid
    records, all_actions = [], []
    for ep in range(num_episodes):
        source = sources[ep % len(sources)][0]
        poses, caption = _simulate_episode(rng, num_frames, fps)
        frames = np.stack([_render(poses[i, :ARM_SIZE], poses[i, ARM_SIZE: 2 * ARM_SIZE], image_size) for i in range(num_frames)])
        actions = poses[1:].copy()  # row t = the pose commanded for frame t+1
        media, action_path, mask_path = f"media/ep{ep:05d}.mp4", f"actions/ep{ep:05d}.npy", f"actions/ep{ep:05d}.mask.npy"
        encode_video(out / media, frames, int(fps), "libx264")
        (out / "actions").mkdir(parents=True, exist_ok=True)
        np.save(out / action_path, actions.astype(np.float32))
        np.save(out / mask_path, mask)
        all_actions.append(actions)
        for w in range(windows_per_episode):
            if len(records) >= samples:
                break
            records.append({
                "id": f"ep{ep:05d}_w{w}", "source": source, "episode_id": f"ep{ep:05d}",
                "split": "val" if ep in val_episodes else "train", "media": media, "actions": action_path,
                "action_mask": mask_path, "caption": caption, "frame_start": w * chunk_length,
                "frame_end": w * chunk_length + chunk_length + 1,
            })
    scale = asinh_scale(np.concatenate(all_actions), mask)
    write_bundle_index(out, records, scale, fps, chunk_length, (image_size, image_size), sources)
    return out


def asinh_scale(actions: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Pinned global asinh scale [59] from raw action rows [N, 59]: each valid value's std (floored at
    1e-3 so a value that never moves still normalizes finitely), 1.0 where no source provides it."""
    return np.where(valid, np.maximum(np.asarray(actions, np.float64).std(axis=0), 1e-3), 1.0)


def write_bundle_index(out: Path, records: list[dict], scale: np.ndarray, fps: float, chunk_length: int,
                       frame_size: tuple[int, int], sources: list[tuple[str, float]]) -> None:
    """manifest.json, samples.json and the byte-tokenizer resource of a bundle whose media and action
    files are already written (one writer for every bundle producer, so they cannot drift)."""
    (out / TOKENIZER_DIR).mkdir(parents=True, exist_ok=True)
    (out / TOKENIZER_DIR / "tokenizer_config.json").write_text(json.dumps({"kind": "byte"}))
    manifest = {
        "format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "action_schema": SCHEMA_ID, "action_names": list(ACTION_NAMES),
        "action_dim": ACTION_DIM, "padded_action_dim": PADDED_DIM, "fps": fps, "chunk_length": chunk_length,
        "window_frames": chunk_length + 1, "frame_size": [int(frame_size[0]), int(frame_size[1])],
        "sources": [{"name": n, "weight": w, "domain_id": i} for i, (n, w) in enumerate(sources)],
        "stats": {"kind": "global_asinh", "pinned": True, "scale": [float(x) for x in scale]},
        "tokenizer": TOKENIZER_DIR,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    (out / SAMPLES).write_text(json.dumps(records, indent=2))


# ---- reading ------------------------------------------------------------------------------------
@dataclass
class Bundle:
    root: Path
    manifest: dict
    samples: list[dict]

    @property
    def fps(self) -> float:
        return float(self.manifest["fps"])

    @property
    def chunk_length(self) -> int:
        return int(self.manifest["chunk_length"])

    def source(self, name: str) -> dict:
        return next(s for s in self.manifest["sources"] if s["name"] == name)

    def normalizer(self):
        from wamkit.data.normalize import Normalizer

        return Normalizer("action", "asinh", {"scale": self.manifest["stats"]["scale"]}, source=str(self.root / MANIFEST))


def open_bundle(path: str | Path) -> Bundle:
    root = Path(path).expanduser()
    for name in (MANIFEST, SAMPLES):
        if not (root / name).is_file():
            raise DataError(str(root / name), "is missing", "point at a bundle directory (manifest.json + samples.json); see wamkit.bimanual.bundle")
    try:
        manifest = json.loads((root / MANIFEST).read_text())
        samples = json.loads((root / SAMPLES).read_text())
    except json.JSONDecodeError as exc:
        raise DataError(str(root), f"invalid JSON: {exc}", "rewrite manifest.json / samples.json") from exc
    return Bundle(root, manifest, samples)


@dataclass
class BundleWindow:
    video: torch.Tensor  # uint8 [T+1, H, W, 3]
    actions: torch.Tensor  # raw float32 [T, 59]
    valid: torch.Tensor  # bool [59]
    caption: str
    source: str
    episode_id: str


class BundleWindows(torch.utils.data.Dataset):
    """The windows of one split; a source of relative weight w appears round(w / min weight) times."""

    def __init__(self, bundle: Bundle, split: str):
        self.bundle = bundle
        weights = {s["name"]: float(s["weight"]) for s in bundle.manifest["sources"]}
        lowest = min(weights.values())
        self.records = []
        for record in bundle.samples:
            if record["split"] == split:
                self.records.extend([record] * max(1, round(weights[record["source"]] / lowest)))
        if not self.records:
            raise DataError(str(bundle.root / SAMPLES), f"has no '{split}' samples", "assign at least one episode to this split")

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> BundleWindow:
        from wamkit.data.video import decode_at_times

        r = self.records[i]
        root, fps = self.bundle.root, self.bundle.fps
        frames = np.arange(r["frame_start"], r["frame_end"])
        video = decode_at_times(root / r["media"], frames / fps, fps)
        actions = np.load(root / r["actions"], mmap_mode="r")[r["frame_start"]: r["frame_end"] - 1]
        valid = np.load(root / r["action_mask"]).astype(bool)
        return BundleWindow(torch.from_numpy(np.ascontiguousarray(video)), torch.from_numpy(np.array(actions, np.float32)),
                            torch.from_numpy(valid), r["caption"], r["source"], r["episode_id"])


class BundleTransform:
    """BundleWindow -> wamkit.data.TrainingSample: pinned asinh normalization, pad 59 -> 64, mask."""

    def __init__(self, bundle: Bundle, max_action_dim: int = PADDED_DIM):
        if max_action_dim != PADDED_DIM:
            raise ConfigError("model.max_action_dim", f"is {max_action_dim} for a bimanual bundle", f"set it to {PADDED_DIM} (59 values padded to 64)")
        self.bundle, self.normalizer = bundle, bundle.normalizer()

    def __call__(self, window: BundleWindow):
        from wamkit.data.sample import TrainingSample

        normalized = self.normalizer.normalize(window.actions) * window.valid
        actions = torch.nn.functional.pad(normalized, (0, PADDED_DIM - ACTION_DIM)).float()
        mask = torch.nn.functional.pad(window.valid, (0, PADDED_DIM - ACTION_DIM))
        return TrainingSample(video=window.video, actions=actions, state=None, action_mask=mask, task=window.caption,
                              domain_id=int(self.bundle.source(window.source)["domain_id"]))


@dataclass
class _BundleInfo:  # what RunData.dataset is asked for (fps, root)
    root: Path
    fps: float


def build_bundle_run_data(cfg):
    """RunData for wamkit.train (Trainer and DistillTrainer) from a bundle at data.path."""
    from wamkit.data.run_data import RunData

    bundle = open_bundle(cfg.data.resolved_path())
    if cfg.data.normalization != "asinh":
        raise ConfigError("data.normalization", f"is {cfg.data.normalization!r} for a bimanual bundle", "set it to 'asinh': the bundle pins global asinh statistics")
    if cfg.data.use_state:
        raise ConfigError("data.use_state", "is true for a bimanual bundle (it has no state feature)", "set data.use_state = false")
    if cfg.data.chunk_length != bundle.chunk_length:
        raise ConfigError("data.chunk_length", f"is {cfg.data.chunk_length} but the bundle's windows have T = {bundle.chunk_length}", f"set data.chunk_length = {bundle.chunk_length}")
    transform = BundleTransform(bundle, cfg.model.max_action_dim)
    has_val = any(r["split"] == "val" for r in bundle.samples)
    train, val = BundleWindows(bundle, "train"), (BundleWindows(bundle, "val") if has_val else None)
    total = sum(float(s["weight"]) for s in bundle.manifest["sources"])
    contract = {
        "dataset": str(bundle.root), "format": BUNDLE_FORMAT, "action_schema": SCHEMA_ID, "fps": bundle.fps,
        "chunk_length": bundle.chunk_length, "camera_keys": ["media"], "action_key": "action", "action_dim": ACTION_DIM,
        "action_names": list(ACTION_NAMES), "state_key": None, "state_dim": 0, "max_action_dim": cfg.model.max_action_dim,
        "use_state": False, "domain_name": cfg.data.domain_name, "domain_id": cfg.data.domain_id,
        "prompt_template": cfg.data.prompt_template, "action_normalizer": transform.normalizer.state_dict(),
        "state_normalizer": None,
        "sources": [{**s, "normalized_weight": float(s["weight"]) / total} for s in bundle.manifest["sources"]],
        "train_episodes": sorted({r["episode_id"] for r in bundle.samples if r["split"] == "train"}),
        "val_episodes": sorted({r["episode_id"] for r in bundle.samples if r["split"] == "val"}),
    }
    first_train = next((r for r in bundle.samples if r["split"] == "train"), None)
    return RunData(_BundleInfo(bundle.root, bundle.fps), train, val, transform, contract,
                   frame_size=tuple(int(n) for n in bundle.manifest["frame_size"]),
                   example_task=first_train["caption"] if first_train else None)


# ---- validation ---------------------------------------------------------------------------------
def _media_frames(path: Path) -> int:
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if stream.frames:
            return int(stream.frames)
        return sum(1 for _ in container.decode(stream))


def validate_bundle(path: str | Path, materialize_stage: int | None = None, preset: str = "tiny",
                    pixel_spatial_factor: int = 8) -> dict:
    """Check a bundle; returns {"passed", "materialized", "problems": [{"check", "where", "problem"}], ...}."""
    root = Path(path).expanduser()
    problems: list[dict] = []

    def bad(check: str, where: str, problem: str) -> None:
        problems.append({"check": check, "where": where, "problem": problem})

    report: dict = {"bundle": str(root), "passed": False, "materialized": False, "problems": problems}
    try:
        bundle = open_bundle(root)
    except DataError as exc:
        bad("files", str(root), str(exc))
        return report
    m = bundle.manifest
    for key in ("format", "version", "action_schema", "action_names", "action_dim", "padded_action_dim", "fps",
                "chunk_length", "window_frames", "sources", "stats", "tokenizer"):
        if key not in m:
            bad("manifest", f"manifest.json:{key}", "is missing")
    if problems:
        return report
    if m["format"] != BUNDLE_FORMAT or m["version"] != BUNDLE_VERSION:
        bad("manifest", "manifest.json:version", f"format {m['format']!r} v{m['version']} is not {BUNDLE_FORMAT!r} v{BUNDLE_VERSION}")
    if m["action_schema"] != SCHEMA_ID or list(m["action_names"]) != list(ACTION_NAMES) or m["action_dim"] != ACTION_DIM:
        bad("schema", "manifest.json:action_names", f"is not the {SCHEMA_ID} layout of {ACTION_DIM} named values")
    if m["padded_action_dim"] != PADDED_DIM:
        bad("schema", "manifest.json:padded_action_dim", f"is {m['padded_action_dim']}, expected {PADDED_DIM}")
    if not (isinstance(m["fps"], (int, float)) and m["fps"] > 0):
        bad("manifest", "manifest.json:fps", f"is {m['fps']!r}; must be positive")
    T = m["chunk_length"]
    if not (isinstance(T, int) and T > 0 and T % 4 == 0) or m["window_frames"] != T + 1:
        bad("manifest", "manifest.json:chunk_length", f"T={T!r}, window_frames={m['window_frames']!r}: T must be a positive multiple of 4 and window_frames T+1")
    sources = {}
    for i, s in enumerate(m["sources"] if isinstance(m["sources"], list) else []):
        w = s.get("weight")
        if not s.get("name") or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            bad("sources", f"manifest.json:sources[{i}]", "needs a name and a finite positive relative weight")
        else:
            sources[s["name"]] = s
    if not sources:
        bad("sources", "manifest.json:sources", "no valid source")
    stats = m["stats"]
    scale = np.asarray(stats.get("scale", []) if isinstance(stats, dict) else [], dtype=np.float64)
    if not isinstance(stats, dict) or stats.get("kind") != "global_asinh" or scale.shape != (ACTION_DIM,):
        bad("stats", "manifest.json:stats", f"must be {{'kind': 'global_asinh', 'scale': [{ACTION_DIM} values]}} (pinned global asinh statistics)")
    elif not (np.isfinite(scale).all() and (scale > 0).all()):
        c = int(np.flatnonzero(~(np.isfinite(scale) & (scale > 0)))[0])
        bad("stats", f"manifest.json:stats.scale[{c}]", f"is {scale[c]} ({ACTION_NAMES[c]}); must be finite and > 0")
    if not (root / str(m["tokenizer"])).is_dir():
        bad("files", str(root / str(m["tokenizer"])), "tokenizer resource directory is missing")

    if not isinstance(bundle.samples, list) or not bundle.samples:
        bad("samples", "samples.json", "must be a non-empty list")
        return report
    episode_split: dict[tuple, str] = {}
    media_frames: dict[str, int] = {}
    counts = {s: 0 for s in SPLITS}
    for i, r in enumerate(bundle.samples):
        where = f"samples.json[{i}]"
        missing = [k for k in SAMPLE_KEYS if k not in r]
        if missing:
            bad("samples", where, f"missing {missing}")
            continue
        if r["source"] not in sources:
            bad("sources", f"{where}.source", f"{r['source']!r} is not a manifest source")
        if r["split"] not in SPLITS:
            bad("splits", f"{where}.split", f"{r['split']!r} is not one of {list(SPLITS)}")
        else:
            counts[r["split"]] += 1
        key = (r["source"], r["episode_id"])
        if episode_split.setdefault(key, r["split"]) != r["split"]:
            bad("splits", f"{where}.split", f"episode {r['episode_id']!r} has windows in both {episode_split[key]!r} and {r['split']!r}; keep all windows of an episode in one split")
        if not isinstance(r["caption"], str) or not r["caption"].strip():
            bad("caption", f"{where}.caption", "is empty; every sample needs a task caption")
        start, end = r["frame_start"], r["frame_end"]
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start and end - start == T + 1):
            bad("frames", f"{where}.frame_start/frame_end", f"[{start}, {end}) is not a window of T+1 = {T + 1} frames")
            continue
        media = root / r["media"]
        if not media.is_file():
            bad("files", f"{where}.media", f"{media} is missing")
        else:
            if r["media"] not in media_frames:
                media_frames[r["media"]] = _media_frames(media)
            if media_frames[r["media"]] < end:
                bad("media", f"{where}.media", f"{r['media']} has {media_frames[r['media']]} frames ({media_frames[r['media']] / float(m['fps']):.2f}s) but the window needs frames up to {end}")
        for field_name in ("actions", "action_mask"):
            if not (root / r[field_name]).is_file():
                bad("files", f"{where}.{field_name}", f"{root / r[field_name]} is missing")
        if not (root / r["actions"]).is_file() or not (root / r["action_mask"]).is_file():
            continue
        actions = np.load(root / r["actions"], mmap_mode="r")
        valid = np.load(root / r["action_mask"])
        if actions.ndim != 2 or actions.shape[1] != ACTION_DIM:
            bad("schema", f"{where}.actions", f"has shape {tuple(actions.shape)}; expected [N, {ACTION_DIM}] raw values")
        elif actions.shape[0] < end - 1:
            bad("frames", f"{where}.actions", f"has {actions.shape[0]} rows; the window needs rows up to {end - 1}")
        elif not np.isfinite(np.asarray(actions[start: end - 1])).all():
            bad("schema", f"{where}.actions", "contains NaN/inf in this window")
        if valid.shape != (ACTION_DIM,) or valid.dtype != np.bool_:
            bad("schema", f"{where}.action_mask", f"is {valid.dtype} {tuple(valid.shape)}; expected bool [{ACTION_DIM}]")
        elif not valid.any():
            bad("schema", f"{where}.action_mask", "marks no value valid")
    if counts["train"] == 0:
        bad("splits", "samples.json", "no train samples")
    report.update(num_samples=len(bundle.samples), splits=counts, sources=sorted(sources), episodes=len(episode_split))
    if not problems and materialize_stage is not None:
        try:
            report["materialize"] = materialize(bundle, materialize_stage, preset, pixel_spatial_factor)
            report["materialized"] = True
        except Exception as exc:  # report, don't crash: the point of the check is the report
            bad("materialize", f"stage {materialize_stage}", f"{type(exc).__name__}: {exc}")
    report["passed"] = not problems
    return report


def _describe(value) -> object:
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", "")}
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (torch.Tensor, tuple, list)):
        return [_describe(v) for v in value]
    return value


def materialize(bundle: Bundle, stage: int, preset: str = "tiny", pixel_spatial_factor: int = 8) -> dict:
    """One packed sample of `stage` through the real transform, ModeObjective and pack_samples (the
    network is built on the meta device: shapes only, no weights)."""
    from wamkit.config.schema import DiffusionConfig
    from wamkit.diffusion.objective import ModeObjective
    from wamkit.model.cosmos3 import build_transformer
    from wamkit.model.packing import pack_samples
    from wamkit.model.tokenizer import build_text_tokenizer, build_video_tokenizer

    if stage not in STAGE_CAUSAL_CHUNK_FRAMES:
        raise ValueError(f"stage {stage} is not one of {sorted(STAGE_CAUSAL_CHUNK_FRAMES)}")
    transform = BundleTransform(bundle)
    window = BundleWindows(bundle, "train")[0]
    sample = transform(window)
    video_tok = build_video_tokenizer("pixel", "", pixel_spatial_factor)
    text_tok = build_text_tokenizer("", 64)
    with torch.device("meta"):
        model = build_transformer(preset, video_tok.latent_channels, PADDED_DIM, 32)
    diffusion = DiffusionConfig(causal_chunk_frames=STAGE_CAUSAL_CHUNK_FRAMES[stage])
    objective = ModeObjective(model, video_tok, text_tok, diffusion, "{task}", bundle.fps, "sdpa", mode="forward_dynamics")
    x0 = objective.encode_videos([sample.video])[0]
    seq, _ = objective._noised_sequence(sample, x0, 0.5, torch.Generator().manual_seed(0), "forward_dynamics")
    batch = pack_samples([seq], model.config)
    chunks = batch.gen_chunk_ids
    return {
        "stage": stage, "attention": "block_causal" if chunks is not None else "bidirectional",
        "batch_samples": batch.num_samples, "text_tokens": int(batch.forward_kwargs["und_len"]),
        "sequence_tokens": int(batch.forward_kwargs["sequence_length"]),
        "generation_tokens": int(batch.forward_kwargs["sequence_length"] - batch.forward_kwargs["und_len"]),
        "chunks": int(chunks.max()) + 1 if chunks is not None else 1,
        "sample": {"video": _describe(sample.video), "actions": _describe(sample.actions), "action_mask": _describe(sample.action_mask),
                   "valid_action_values": int(sample.action_mask.sum()), "caption": sample.task, "latents": _describe(x0)},
        "packed": {k: _describe(v) for k, v in batch.forward_kwargs.items()},
        "clean_video_frames": seq.clean_video_frames, "noisy_video_frames": batch.vision_noisy_frames[0],
    }


def validate_main(bundle: str, materialize: bool = False, stage: int = 0) -> int:
    """`wamkit data validate --bundle PATH [--materialize --stage N]`: print the JSON report; 0 iff passed."""
    report = validate_bundle(bundle, materialize_stage=stage if materialize else None)
    print(json.dumps(report, indent=2))
    return 0 if report["passed"] else 1
