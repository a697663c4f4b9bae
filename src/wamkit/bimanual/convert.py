"""A bimanual LeRobot v3.0 dataset (ALOHA layout) -> a sim-bimanual bundle (`wamkit data bundle`).

Order matters: episodes are split into train/val first (`wamkit.data.split.split_episodes`, seeded),
then each episode is cut into windows of T+1 frames, so no frame of a validation episode ever sits
in a training window. The pinned asinh statistics come from the training episodes only.

ALOHA action layout (LeRobot's and gym-aloha's names): per arm, in the order left then right,
`<side>_waist, _shoulder, _elbow, _forearm_roll, _wrist_angle, _wrist_rotate` (absolute joint
targets, rad) and `<side>_gripper` (gym-aloha's normalized opening, 0 closed, 1 open). They map to
the unified schema's `<side>.joint_pos_1..6` and `<side>.gripper_width`; the gripper opening becomes
metres as twice gym-aloha's puppet finger position (each finger slides by
`0.01844 + g * (0.058 - 0.01844)` m). Those 14 values are marked valid; every other schema value
(end-effector pose and velocities, joint_pos_7, body) is invalid, so it gets neither noise nor loss.
LeRobot's row t is the command issued at observation t, i.e. the bundle's action row t (leading
from frame t to t+1); an episode of N frames gives N-1 action rows.

Cameras are tiled left to right (`wamkit.data.canvas`, side_by_side, optionally fitted to a
resolution tier) into the one video per episode the bundle holds."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from wamkit.bimanual.bundle import asinh_scale, validate_bundle, write_bundle_index
from wamkit.bimanual.schema import ACTION_DIM, index
from wamkit.errors import DataError

ARM_JOINTS = ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate")
SIDES = ("left", "right")
# LeRobot ALOHA action name -> schema name
ALOHA_JOINT_MAP = {f"{s}_{j}": f"{s}.joint_pos_{i + 1}" for s in SIDES for i, j in enumerate(ARM_JOINTS)}
ALOHA_GRIPPER_MAP = {f"{s}_gripper": f"{s}.gripper_width" for s in SIDES}
# gym-aloha constants.py: PUPPET_GRIPPER_POSITION_CLOSE / _OPEN (finger joint position, m)
FINGER_CLOSED, FINGER_OPEN = 0.01844, 0.058
SPATIAL_MULTIPLE = 16  # the Wan2.2 tokenizer's spatial factor: frames must tile into its patches


@dataclass
class BundleSummary:
    out: str
    fps: float
    chunk_length: int
    stride: int
    cameras: list[str]
    frame_size: list[int]
    episodes: dict = field(default_factory=dict)  # split -> episode ids
    windows: dict = field(default_factory=dict)  # split -> window count
    skipped_short: list[int] = field(default_factory=list)  # episodes with fewer than T+1 frames
    valid_action_values: int = 0


def aloha_columns(names: list[str], where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(schema index of every action column, which columns are grippers, validity mask [59]) for an
    ALOHA action feature; anything else is refused with the names it lacks."""
    known = {**ALOHA_JOINT_MAP, **ALOHA_GRIPPER_MAP}
    missing = [n for n in known if n not in names]
    unknown = [n for n in names if n not in known]
    if missing or unknown:
        raise DataError(where, f"is not the ALOHA bimanual action layout (missing {missing}, unknown {unknown})",
                        f"convert a dataset whose action names are the 14 ALOHA joints {list(known)}")
    targets = np.array([index(known[n]) for n in names])
    valid = np.zeros(ACTION_DIM, bool)
    valid[targets] = True
    return targets, np.array([n in ALOHA_GRIPPER_MAP for n in names]), valid


def feature_names(info_features: dict, key: str, where: str) -> list[str]:
    """A feature's per-value names: LeRobot writes a list, or a dict holding one list (e.g. {"motors": [...]})."""
    names = info_features.get(key, {}).get("names")
    if isinstance(names, dict) and len(names) == 1:
        names = next(iter(names.values()))
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise DataError(f"{where}: features[{key!r}].names", f"is {names!r}, not a list of value names",
                        "write the action names into meta/info.json (the converter maps them by name)")
    return names


def to_schema(actions: np.ndarray, targets: np.ndarray, grippers: np.ndarray) -> np.ndarray:
    """Raw ALOHA rows [N, 14] -> unified schema rows [N, 59] (invalid values 0)."""
    out = np.zeros((len(actions), ACTION_DIM), np.float32)
    values = np.asarray(actions, np.float64).copy()
    values[:, grippers] = 2.0 * (FINGER_CLOSED + values[:, grippers] * (FINGER_OPEN - FINGER_CLOSED))
    out[:, targets] = values
    return out


def window_starts(num_frames: int, chunk_length: int, stride: int) -> list[int]:
    """First frame of every window of T+1 frames that fits in an episode of `num_frames` frames."""
    return list(range(0, num_frames - chunk_length, stride))


def episode_canvas(ds, ep: int, cameras: list[str], tier: int) -> np.ndarray:
    """All frames of an episode, its cameras tiled left to right: uint8 [N, H, W, 3]."""
    from wamkit.data.canvas import compose_frames

    frames = range(ds.episode_length(ep))
    views = [torch.from_numpy(ds.decode_frames(ep, cam, frames)) for cam in cameras]
    return compose_frames(views, "side_by_side", tier).numpy()


def check_options(ds, root: Path, out: Path, chunk_length: int, stride: int, cameras: list[str] | None,
                  caption: str) -> list[str]:
    """Refuse bad arguments before any work; returns the cameras to tile."""
    try:
        caption.format(task="")
    except (KeyError, IndexError, ValueError) as exc:
        raise DataError("--caption", f"{caption!r} cannot be filled with the episode's task ({exc!r})",
                        "use a template whose only field is {task}, e.g. 'bimanual robot: {task}'") from exc
    if not (chunk_length > 0 and chunk_length % 4 == 0):
        raise DataError("--chunk-length", f"is {chunk_length}", "use a positive multiple of 4 (T actions <-> T+1 frames, "
                        "1 + T/4 latent frames), e.g. 32 as the stage recipes")
    if stride < 1:
        raise DataError("--stride", f"is {stride}", "use >= 1 (default: T, windows that do not overlap)")
    if abs(ds.fps - round(ds.fps)) > 1e-6:
        raise DataError(f"{root}/meta/info.json: fps", f"is {ds.fps}; bundle media are encoded at whole frames per second",
                        "convert a dataset recorded at an integer fps")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(str(out), "already exists and is not an empty directory", "choose a new bundle directory")
    chosen = cameras or list(ds.camera_keys)
    unknown = [c for c in chosen if c not in ds.camera_keys]
    if not chosen or unknown:
        raise DataError(f"{root}/meta/info.json: features", f"has no video feature {unknown or '(none at all)'}",
                        f"pick --cameras among {ds.camera_keys}")
    return chosen


def convert_lerobot(root: str | Path, out: str | Path, chunk_length: int, *, stride: int | None = None,
                    val_fraction: float = 0.1, seed: int = 0, cameras: list[str] | None = None, tier: int = 0,
                    source: str = "aloha", caption: str = "{task}") -> BundleSummary:
    """Write a bundle at `out` from the LeRobot v3.0 dataset at `root` (see the module docstring)."""
    from wamkit.data import LeRobotV3Dataset
    from wamkit.data.split import split_episodes
    from wamkit.data.writer import encode_video

    root, out = Path(root), Path(out)
    ds = LeRobotV3Dataset(root)
    stride = int(stride or chunk_length)
    cameras = check_options(ds, root, out, chunk_length, stride, cameras, caption)
    targets, grippers, valid = aloha_columns(feature_names(ds.features, "action", f"{root}/meta/info.json"),
                                             f"{root}/meta/info.json: features['action'].names")
    train, val = split_episodes(ds.episode_indices, val_fraction, seed)
    split_of = {**{e: "train" for e in train}, **{e: "val" for e in val}}
    summary = BundleSummary(str(out), ds.fps, chunk_length, stride, cameras, [], {"train": train, "val": val},
                            {"train": 0, "val": 0}, valid_action_values=int(valid.sum()))
    records, train_rows = [], []
    for ep in ds.episode_indices:
        starts = window_starts(ds.episode_length(ep), chunk_length, stride)
        if not starts:
            summary.skipped_short.append(ep)
            continue
        actions = to_schema(ds.episode_columns(ep, ["action"])["action"][:-1], targets, grippers)
        if not np.isfinite(actions).all():
            raise DataError(f"{root}: episode {ep} action", "contains NaN/inf", "drop or re-record the episode")
        frames = episode_canvas(ds, ep, cameras, tier)
        summary.frame_size = check_frame_size(frames.shape[1:3], summary.frame_size, tier)
        name = f"ep{ep:05d}"
        media, action_path, mask_path = f"media/{name}.mp4", f"actions/{name}.npy", f"actions/{name}.mask.npy"
        encode_video(out / media, frames, int(round(ds.fps)), "libx264")
        (out / "actions").mkdir(parents=True, exist_ok=True)
        np.save(out / action_path, actions)
        np.save(out / mask_path, valid)
        if split_of[ep] == "train":
            train_rows.append(actions)
        text = caption.format(task=ds.episode_task(ep))
        for k, start in enumerate(starts):
            records.append({"id": f"{name}_w{k}", "source": source, "episode_id": name, "split": split_of[ep],
                            "media": media, "actions": action_path, "action_mask": mask_path, "caption": text,
                            "frame_start": start, "frame_end": start + chunk_length + 1})
            summary.windows[split_of[ep]] += 1
    if not train_rows:
        raise DataError(str(root), f"no training episode has T+1 = {chunk_length + 1} frames "
                        f"(episodes {summary.skipped_short} are shorter)", "lower --chunk-length or record longer episodes")
    scale = asinh_scale(np.concatenate(train_rows), valid)
    write_bundle_index(out, records, scale, ds.fps, chunk_length, tuple(summary.frame_size), [(source, 1.0)])
    return summary


def check_frame_size(size: tuple[int, int], seen: list[int], tier: int) -> list[int]:
    """The canvas size, the same for every episode and tiling into the tokenizer's patches."""
    h, w = int(size[0]), int(size[1])
    if seen and seen != [h, w]:
        raise DataError("--cameras", f"episodes tile to {seen[0]}x{seen[1]} and {h}x{w}", "convert cameras of one size per dataset")
    if h % SPATIAL_MULTIPLE or w % SPATIAL_MULTIPLE:
        raise DataError("--resolution", f"the tiled frames are {h}x{w} (tier {tier}), not multiples of {SPATIAL_MULTIPLE}",
                        "pass --resolution 256 (or 480/720) to fit them into the model's canvases")
    return [h, w]


def bundle_main(args) -> int:
    """`wamkit data bundle LEROBOT_DIR OUT --chunk-length T ...`: convert, validate, print both as JSON."""
    cameras = [c.strip() for c in args.cameras.split(",") if c.strip()] if args.cameras else None
    summary = convert_lerobot(args.lerobot_dir, args.out, args.chunk_length, stride=args.stride,
                              val_fraction=args.val_fraction, seed=args.seed, cameras=cameras, tier=args.resolution,
                              source=args.source, caption=args.caption)
    report = validate_bundle(args.out)
    print(json.dumps({"bundle": asdict(summary), "validate": {"passed": report["passed"], "problems": report["problems"]}},
                     indent=2))
    return 0 if report["passed"] else 1


