"""wamkit reads every layout LeRobot's own writer writes, exactly as LeRobot itself reads it, and trains on it.

Each layout is written with `lerobot-dataset==0.4.4` (LeRobotDataset.create / add_frame / save_episode /
finalize) inside a separate venv, and LeRobot's reading of some windows (delta_timestamps) is dumped;
wamkit's WindowDataset must give the same parquet values bit for bit, the same task, and the same pixels
(within codec tolerance for video, exactly for images); then the tiny recipe trains 3 steps on it. The
venv is built on first use (a few minutes); a venv that cannot be built FAILS the test.

| layout | what LeRobot wrote |
| --- | --- |
| av1 | AV1 (LeRobot's default), episodes sharing data/mp4 files, files rotated by size, 3 tasks |
| h264_mixed | H.264; data over 3 chunk dirs (chunks_size 2); cameras 64x96 and 48x64; float64 state and action; unused extra features; a task that changes mid-episode |
| hevc_scalar | HEVC; state and action of shape [1] (scalar parquet columns) |

HEVC pixels are checked against the system ffmpeg's decode of the whole mp4 in stream order (frame
from_timestamp * fps + frame_index) instead: LeRobot's torchcodec 0.11.1 returns some frames of that file one
period late, so LeRobot refuses its own dataset (its tolerance check), and its PyAV backend needs
torchvision's VideoReader, which torchvision 0.28 no longer has. State, action and task still come from LeRobot.
| images_no_state | frames as PNG in the parquet (`dtype: image`); no observation.state: a policy without state |
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import DEMO_RECIPE
from tests.interop import lerobot_venv
from wamkit.data import LeRobotV3Dataset, WindowDataset
from wamkit.data.video import close_all
from wamkit.errors import DataError

CHUNK = 8
LAYOUTS = {  # layout -> the writer's flags
    "av1": [],
    "h264_mixed": ["--vcodec", "h264", "--chunks-size", "2", "--sizes", "64x96,48x64", "--dtype", "float64",
                   "--extra", "--task-switch"],
    "hevc_scalar": ["--vcodec", "hevc", "--state-dim", "1", "--action-dim", "1"],
    "images_no_state": ["--images", "--state-dim", "0"],
}
READ_FLAGS = {"hevc_scalar": ["--tolerance-s", "1"]}  # LeRobot's pixels unused there (see above)
FFMPEG_PIXELS = {"hevc_scalar"}


def ffmpeg_window(ds: LeRobotV3Dataset, ep: int, start: int, cam: str) -> np.ndarray:
    """[T+1, H, W, 3] of a window decoded by the ffmpeg CLI in stream order (no seeking, no timestamps)."""
    h, w = ds.frame_size(cam)
    raw = subprocess.run(["ffmpeg", "-v", "error", "-i", str(ds.video_path(ep, cam)), "-f", "rawvideo",
                          "-pix_fmt", "rgb24", "-"], capture_output=True, check=True).stdout
    first = round(float(ds._episode(ep)[f"videos/{cam}/from_timestamp"]) * ds.fps) + start
    return np.frombuffer(raw, np.uint8).reshape(-1, h, w, 3)[first:first + CHUNK + 1]


@pytest.fixture(scope="module")
def lerobot_dumps(tmp_path_factory) -> dict:
    """Every layout written by LeRobot's own writer, then windows of it read by LeRobot's own reader: all the
    writes in one process of the LeRobot venv and all the reads in another (importing LeRobot costs ~10 s)."""
    tmp = tmp_path_factory.mktemp("layouts")
    lerobot_venv.run_writer_batch([["write", str(tmp / name / "ds"), "--episodes", "6", "--length", "24", *flags]
                                   for name, flags in sorted(LAYOUTS.items())], tmp)
    dumps, reads = {}, []
    for name in sorted(LAYOUTS):
        root = tmp / name / "ds"
        ds = LeRobotV3Dataset(root)
        last = ds.episode_indices[-1]
        # episode 1 (27 frames) switches task at frame 13 under --task-switch: windows on both sides
        windows = [(0, 0), (1, 7), (1, 14), (2, 3), (3, 12), (4, 0), (last, ds.episode_length(last) - CHUNK - 1)]
        (tmp / name / "windows.json").write_text(json.dumps(windows))
        reads.append(["read", str(root), str(tmp / name / "windows.json"), str(tmp / name / "dump"), "--chunk", str(CHUNK),
                      *READ_FLAGS.get(name, [])])
        dumps[name] = (name, root, windows, tmp / name / "dump")
    lerobot_venv.run_writer_batch(reads, tmp)
    return dumps


@pytest.fixture(params=sorted(LAYOUTS))
def lerobot_dump(request, lerobot_dumps):
    return lerobot_dumps[request.param]


def test_layout_is_what_it_claims(lerobot_dump):
    layout, root, _, _ = lerobot_dump
    info = json.loads((root / "meta" / "info.json").read_text())
    feats = info["features"]
    cams = [k for k, f in feats.items() if f["dtype"] in ("video", "image")]
    assert info["codebase_version"].startswith("v3.") and len(cams) == 2
    assert len(list((root / "data").glob("*/*.parquet"))) > 1  # size-rotated data files
    if layout == "images_no_state":
        assert {feats[c]["dtype"] for c in cams} == {"image"} and not (root / "videos").exists()
        assert "observation.state" not in feats
        return
    codec = {"av1": "av1", "h264_mixed": "h264", "hevc_scalar": "hevc"}[layout]
    assert {feats[c]["info"]["video.codec"] for c in cams} == {codec}
    if layout == "av1":
        assert all(len(list((root / "videos" / c).glob("*/*.mp4"))) > 1 for c in cams)
    if layout == "h264_mixed":
        assert len(list((root / "data").glob("chunk-*"))) == 3
        assert {tuple(feats[c]["shape"]) for c in cams} == {(64, 96, 3), (48, 64, 3)}
        assert feats["action"]["dtype"] == feats["observation.state"]["dtype"] == "float64"
        assert {"observation.velocity", "next.reward"} <= set(feats)
    if layout == "hevc_scalar":
        assert feats["action"]["shape"] == feats["observation.state"]["shape"] == [1]


def test_windows_equal_lerobot_reading(lerobot_dump):
    layout, root, windows, dump = lerobot_dump
    close_all()
    ds = LeRobotV3Dataset(root)
    state_key = "observation.state" if "observation.state" in ds.features else None
    wd = WindowDataset(ds, ds.episode_indices, chunk_length=CHUNK, state_key=state_key)
    position = {tuple(int(v) for v in row): i for i, row in enumerate(wd.index)}
    worst = 0.0
    for n, (ep, start) in enumerate(windows):
        w = wd[position[(ep, start)]]
        # wamkit trains in float32: LeRobot's values (float64 when recorded so) cast once, bit for bit
        theirs = np.load(dump / f"{n}_action.npy").reshape(CHUNK, -1).astype(np.float32)
        np.testing.assert_array_equal(w.action.numpy(), theirs)
        if state_key:
            theirs = np.load(dump / f"{n}_{state_key}.npy").reshape(CHUNK + 1, -1).astype(np.float32)
            np.testing.assert_array_equal(w.state.numpy(), theirs)
        else:
            assert w.state is None
        assert w.task == (dump / f"{n}_task.txt").read_text(), (ep, start)
        for v, cam in enumerate(wd.camera_keys):
            theirs = (ffmpeg_window(ds, ep, start, cam) if layout in FFMPEG_PIXELS else
                      np.load(dump / f"{n}_{cam}.npy")).astype(np.int16)
            ours = w.video[v].numpy().astype(np.int16)
            assert ours.shape == theirs.shape == (CHUNK + 1, *ds.frame_size(cam), 3)
            diff = np.abs(ours - theirs)
            if ds.features[cam]["dtype"] == "image":
                assert diff.max() == 0, (ep, start, cam)  # PNG is lossless: the same pixels
                continue
            # same bitstream, two decoders (PyAV vs torchcodec/system FFmpeg): only YUV->RGB rounding differs
            assert diff.mean() < 1.0 and diff.max() <= 12, (ep, start, cam, diff.mean(), diff.max())
            worst = max(worst, float(diff.mean()))
        # and the frame is the right one: neighbouring frames differ far more than the tolerance
        cam = wd.camera_keys[0]
        shifted = (ffmpeg_window(ds, ep, start, cam) if layout in FFMPEG_PIXELS else
                   np.load(dump / f"{n}_{cam}.npy")).astype(np.int16)[1:]
        assert np.abs(w.video[0].numpy()[:-1].astype(np.int16) - shifted).mean() > 3 * max(worst, 0.1)
    if layout == "h264_mixed":  # the mid-episode switch was seen on both sides
        assert {(dump / f"{n}_task.txt").read_text() for n in (1, 2)} == {"open the drawer", "put it back"}


def test_trains_three_steps(lerobot_dump, tmp_path):
    from wamkit.config import load_experiment
    from wamkit.train.datasets import build_run_data
    from wamkit.train.trainer import Trainer

    layout, root, _, _ = lerobot_dump
    close_all()
    has_state = "observation.state" in LeRobotV3Dataset(root).features
    overrides = {"job.name": f'"{layout}"', "job.output_root": f'"{tmp_path}"', "data.path": f'"{root}"',
                 "data.use_state": str(has_state).lower(), "trainer.max_iter": "3", "checkpoint.save_iter": "3",
                 "trainer.samples_per_step": "2", "trainer.val_every": "0", "trainer.progress_bar": "false",
                 "scheduler.warm_up_steps": "[1]"}
    if not has_state:  # the recipe's default use_state = true is refused, naming the knob
        with_state = [f"{k}={v}" for k, v in {**overrides, "data.use_state": "true"}.items()]
        with pytest.raises(DataError, match="data.use_state is true but the dataset has no state") as err:
            build_run_data(load_experiment(DEMO_RECIPE, with_state))
        assert "--set data.use_state=false" in err.value.fix
    Trainer(load_experiment(DEMO_RECIPE, [f"{k}={v}" for k, v in overrides.items()])).train()
    rows = [json.loads(line) for line in (tmp_path / layout / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses), rows
