"""A corpus of broken (and deliberately valid) LeRobot v3.0 datasets for `wamkit data doctor`.

Each :class:`Case` mutates a private copy of one base dataset (the demo: 6 episodes over 2 data/mp4
files) into what people meet in practice: damaged files, metadata that disagrees with the data, stats
of another dataset, recording glitches, and every layout LeRobot writes (issue 16). A case states
wamkit's verdict: the exact set of error codes (an error wherever training would crash or silently
train on something else) and the warnings it must at least give. `tests/data/test_doctor_corpus.py`
asserts those verdicts; `benchmarks/doctor_coverage.py` runs lerobot-doctor beside wamkit on the
same corpus and prints the comparison table of docs/data.md.
"""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from wamkit.data import LeRobotV3Dataset, write_demo_dataset
from wamkit.data.doctor import DatasetExpectation
from wamkit.data.synth import CAMERA_KEY
from wamkit.data.video import close_all
from wamkit.data.writer import encode_video

BASE_EXPECT = DatasetExpectation(chunk_length=16)
DATA0 = "data/chunk-000/file-000.parquet"
DATA1 = "data/chunk-000/file-001.parquet"
META0 = "meta/episodes/chunk-000/file-000.parquet"
META1 = "meta/episodes/chunk-000/file-001.parquet"
VIDEO0 = f"videos/{CAMERA_KEY}/chunk-000/file-000.mp4"
VIDEO1 = f"videos/{CAMERA_KEY}/chunk-000/file-001.mp4"
WRIST = "observation.images.wrist"


def write_base(root: Path) -> Path:
    """The healthy dataset every case starts from: 6 episodes over 2 data/mp4 files (3 + 3), H.264."""
    return write_demo_dataset(root, num_episodes=6, episodes_per_file=3)


# ---- file edits ---------------------------------------------------------------------------------
def edit_json(root: Path, rel: str, fn: Callable[[dict], None]) -> None:
    path = root / rel
    obj = json.loads(path.read_text())
    fn(obj)
    path.write_text(json.dumps(obj))


def edit_parquet(root: Path, rel: str, fn: Callable[[dict], None]) -> None:
    """fn edits the table as {column: list} (it may drop columns); the types of the others are kept."""
    path = root / rel
    table = pq.read_table(path)
    cols = table.to_pydict()
    fn(cols)
    pq.write_table(pa.Table.from_pydict(cols, schema=pa.schema([table.schema.field(n) for n in cols])), path)


def edit_data(root: Path, fn: Callable[[dict], None]) -> None:
    """fn applied to every data parquet."""
    for path in sorted((root / "data").glob("*/*.parquet")):
        edit_parquet(root, str(path.relative_to(root)), fn)


def rows_of(cols: dict, ep: int) -> list[int]:
    return [i for i, e in enumerate(cols["episode_index"]) if e == ep]


def set_cell(column: str, ep: int, frame: int, channel: int, value: float):
    def fn(cols):
        row = rows_of(cols, ep)[frame]
        cols[column][row] = list(cols[column][row])
        cols[column][row][channel] = value
    return fn


def edit_stats(key: str, name: str, fn: Callable[[np.ndarray], np.ndarray]):
    """A mutation replacing stats[key][name] by fn(it)."""
    def mutate(root):
        edit_json(root, "meta/stats.json", lambda s: s[key].__setitem__(name, fn(np.asarray(s[key][name])).tolist()))
    return mutate


def recompute_stats(root: Path) -> None:
    from wamkit.data.stats import write_stats

    write_stats(root, overwrite=True)


def decode_all(root: Path, camera: str = CAMERA_KEY) -> dict[Path, np.ndarray]:
    """Every frame of each mp4 of `camera`, by file."""
    import av

    out = {}
    for path in sorted((root / "videos" / camera).glob("*/*.mp4")):
        with av.open(str(path)) as c:
            out[path] = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    return out


# ---- mutations: files and metadata --------------------------------------------------------------
def m_none(root):
    pass


def m_truncated_mp4(root):
    p = root / VIDEO0
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def m_stats_key_missing(root):
    edit_json(root, "meta/stats.json", lambda s: s.pop("action"))


def m_stats_zero_range(root):
    edit_json(root, "meta/stats.json", lambda s: s["action"]["min"].__setitem__(0, s["action"]["max"][0]))


def m_stats_field_missing(root):
    edit_json(root, "meta/stats.json", lambda s: s["observation.state"].pop("min"))


def m_stats_dim_mismatch(root):
    edit_json(root, "meta/stats.json", lambda s: s["action"].update({k: v[:2] for k, v in s["action"].items()
                                                                       if k != "count"}))


def m_stats_missing(root):
    (root / "meta/stats.json").unlink()


def m_nan_action(root):
    edit_parquet(root, DATA0, set_cell("action", 1, 5, 2, float("nan")))


def m_nan_state(root):
    edit_parquet(root, DATA1, set_cell("observation.state", 4, 3, 0, float("inf")))


def m_episode_gap(root):
    """Renumber episode 5 -> 7 everywhere: a hole at 5, 6."""
    def fn(cols):
        cols["episode_index"] = [7 if e == 5 else e for e in cols["episode_index"]]
    edit_parquet(root, META1, fn)
    edit_parquet(root, DATA1, fn)


def m_duplicate_episode(root):
    def fn(cols):
        cols["episode_index"] = [3 if e == 4 else e for e in cols["episode_index"]]
    edit_parquet(root, META1, fn)


def m_missing_video(root):
    (root / VIDEO1).unlink()


def m_missing_data(root):
    (root / DATA1).unlink()


def m_bad_version(root):
    edit_json(root, "meta/info.json", lambda i: i.update(codebase_version="v2.1"))


def m_malformed_info(root):
    (root / "meta/info.json").write_text('{"codebase_version": "v3.0", "fps": 10,')


def m_missing_info(root):
    (root / "meta/info.json").unlink()


def m_info_missing_keys(root):
    edit_json(root, "meta/info.json", lambda i: i.pop("data_path"))


def m_frame_index_gap(root):
    def fn(cols):
        cols["frame_index"][rows_of(cols, 2)[10]] = 11  # 0..9, 11, 11, 12, ...
    edit_parquet(root, DATA0, fn)


def m_timestamps(root):
    def fn(cols):
        for r in rows_of(cols, 0):
            cols["timestamp"][r] *= 1.5
    edit_parquet(root, DATA0, fn)


def m_timestamps_swapped(root):
    """Two frames recorded out of order: their timestamps swapped."""
    def fn(cols):
        a, b = rows_of(cols, 1)[20:22]
        cols["timestamp"][a], cols["timestamp"][b] = cols["timestamp"][b], cols["timestamp"][a]
    edit_parquet(root, DATA0, fn)


def m_task_unknown(root):
    def fn(cols):
        for r in rows_of(cols, 0):
            cols["task_index"][r] = 9
    edit_parquet(root, DATA0, fn)


def m_row_count(root):
    def fn(cols):
        cols["length"][0] += 1
    edit_parquet(root, META0, fn)


def m_video_short(root):
    """The last episode of file-001 points 3 s past the end of the mp4."""
    def fn(cols):
        for f in ("from_timestamp", "to_timestamp"):
            cols[f"videos/{CAMERA_KEY}/{f}"][-1] += 3.0
    edit_parquet(root, META1, fn)


def m_video_fps(root):
    """file-001 re-encoded at twice the dataset's fps: it lasts half as long as meta/episodes says."""
    frames = decode_all(root)[root / VIDEO1]
    close_all()
    encode_video(root / VIDEO1, frames, 20, "libx264")


def m_video_shape(root):
    """info.json declares the camera 48x48; the mp4s are 64x64."""
    edit_json(root, "meta/info.json", lambda i: i["features"][CAMERA_KEY].update(shape=[48, 48, 3]))


def m_missing_tasks(root):
    (root / "meta/tasks.parquet").unlink()


def m_missing_episodes_meta(root):
    shutil.rmtree(root / "meta/episodes")


def m_absolute_data_path(root):
    """data_path written as the absolute path of the machine that recorded it (here: still present)."""
    edit_json(root, "meta/info.json", lambda i: i.update(data_path=str(root / i["data_path"])))


def m_total_frames(root):
    edit_json(root, "meta/info.json", lambda i: i.update(total_frames=i["total_frames"] + 40))


def m_total_tasks(root):
    edit_json(root, "meta/info.json", lambda i: i.update(total_tasks=i["total_tasks"] + 2))


def m_index_shifted(root):
    """The global `index` column restarts at 0 in file-001 (files concatenated without renumbering)."""
    def fn(cols):
        cols["index"] = list(range(len(cols["index"])))
    edit_parquet(root, DATA1, fn)


def m_action_width_one_file(root):
    """file-001 records a 4th action channel (a merged dataset of another robot version)."""
    t = pq.read_table(root / DATA1)
    action = np.asarray(t.column("action").to_pylist(), dtype=np.float32)
    wide = np.concatenate([action, np.zeros((len(action), 1), np.float32)], 1)
    t = t.set_column(t.column_names.index("action"), "action",
                     pa.FixedSizeListArray.from_arrays(pa.array(wide.reshape(-1)), 4))
    pq.write_table(t, root / DATA1)


def m_action_float64_one_file(root):
    """file-001 stores action as float64 while info.json (and file-000) say float32."""
    t = pq.read_table(root / DATA1)
    action = np.asarray(t.column("action").to_pylist(), dtype=np.float64)
    t = t.set_column(t.column_names.index("action"), "action",
                     pa.FixedSizeListArray.from_arrays(pa.array(action.reshape(-1), pa.float64()), 3))
    pq.write_table(t, root / DATA1)


# ---- mutations: stats that disagree with the data -----------------------------------------------
m_stats_nan = edit_stats("action", "max", lambda v: np.where(np.arange(v.size) == 1, np.nan, v))
m_stats_narrow = edit_stats("action", "max", lambda v: v - 0.25 * np.abs(v) - 0.1)  # data above max
m_stats_mean_shift = edit_stats("observation.state", "mean", lambda v: v + 1.0)  # another dataset's
m_stats_std_scaled = edit_stats("action", "std", lambda v: v * 3.0)
m_stats_std_zero = edit_stats("action", "std", lambda v: np.where(np.arange(v.size) == 0, 0.0, v))
m_stats_q99_wide = edit_stats("action", "q99", lambda v: v + 2.0)


def m_constant_channel(root):
    """An unused gripper: action channel 2 constant in every frame, stats recomputed (min == max)."""
    def fn(cols):
        cols["action"] = [row[:2] + [0.3] for row in cols["action"]]
    edit_data(root, fn)
    recompute_stats(root)


def m_stale_stats_after_edit(root):
    """Actions rescaled (degrees -> radians) after the stats were written: all stats are stale."""
    def fn(cols):
        cols["action"] = [[v * 0.0174533 for v in row] for row in cols["action"]]
    edit_data(root, fn)


# ---- mutations: recording glitches --------------------------------------------------------------
def m_action_spike(root):
    edit_parquet(root, DATA1, set_cell("action", 4, 7, 0, 1000.0))
    recompute_stats(root)  # the stats agree with the data: the glitch itself is the problem


def m_frozen_actions(root):
    """The teleop link stalled for half of episode 1: the same action row repeated."""
    def fn(cols):
        rows = rows_of(cols, 1)
        for r in rows[10:10 + len(rows) // 2]:
            cols["action"][r] = list(cols["action"][rows[10]])
    edit_parquet(root, DATA0, fn)
    recompute_stats(root)


def m_nan_unused_feature(root):
    """An extra recorded feature (next.reward) with NaN; the recipe does not read it."""
    m_extra_features(root)
    edit_parquet(root, DATA0, lambda cols: cols["next.reward"].__setitem__(3, float("nan")))


# ---- layouts LeRobot writes (issue 16) and their broken variants --------------------------------
def reencode(encoder: str):
    def mutate(root):
        videos = decode_all(root)
        close_all()
        for path, frames in videos.items():
            encode_video(path, frames, 10, encoder)
        codec = {"libx265": "hevc", "libsvtav1": "av1"}[encoder]
        edit_json(root, "meta/info.json", lambda i: i["features"][CAMERA_KEY]["info"].update({"video.codec": codec}))
    return mutate


def png(frame: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return buf.getvalue()


IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def m_image_layout(root):
    """LeRobot's use_videos=False: every frame a PNG inside the data parquet, `dtype: image`, no videos/."""
    ds = LeRobotV3Dataset(root)
    for path in sorted((root / "data").glob("*/*.parquet")):
        table = pq.read_table(path)
        eps, frames = table.column("episode_index").to_numpy(), table.column("frame_index").to_numpy()
        decoded = {int(ep): ds.decode_frames(int(ep), CAMERA_KEY, range(ds.episode_length(int(ep)))) for ep in set(eps)}
        blobs = [{"bytes": png(decoded[int(e)][f]), "path": f"frame-{f:06d}.png"} for e, f in zip(eps, frames)]
        pq.write_table(table.append_column(CAMERA_KEY, pa.array(blobs, IMAGE_STRUCT)), path)
    edit_json(root, "meta/info.json", lambda i: i["features"][CAMERA_KEY].update(dtype="image"))
    close_all()
    shutil.rmtree(root / "videos")


def m_image_garbage(root):
    m_image_layout(root)
    def fn(cols):
        cols[CAMERA_KEY][rows_of(cols, 4)[12]] = {"bytes": b"\x00not a png", "path": "frame-000012.png"}
    edit_parquet(root, DATA1, fn)


def m_image_column_missing(root):
    m_image_layout(root)
    t = pq.read_table(root / DATA1)
    pq.write_table(t.drop_columns([CAMERA_KEY]), root / DATA1)


def m_chunk_dirs(root):
    """file-001 of every kind moved to chunk-001/file-000 (LeRobot's chunks_size reached)."""
    moves = [(DATA1, "data/chunk-001/file-000.parquet"), (META1, "meta/episodes/chunk-001/file-000.parquet"),
             (VIDEO1, f"videos/{CAMERA_KEY}/chunk-001/file-000.mp4")]
    for old, new in moves:
        (root / new).parent.mkdir(parents=True, exist_ok=True)
        (root / old).rename(root / new)

    def fn(cols):
        for k in ("data/chunk_index", f"videos/{CAMERA_KEY}/chunk_index", "meta/episodes/chunk_index"):
            cols[k] = [1] * len(cols[k])
        for k in ("data/file_index", f"videos/{CAMERA_KEY}/file_index", "meta/episodes/file_index"):
            cols[k] = [0] * len(cols[k])
    edit_parquet(root, "meta/episodes/chunk-001/file-000.parquet", fn)


def m_task_switch(root):
    """A third task, and episode 1's task changes halfway (LeRobot records a task per frame)."""
    tasks = pq.read_table(root / "meta/tasks.parquet").to_pydict()
    new = len(tasks["task"])
    tasks["task_index"].append(new)
    tasks["task"].append("put it back")
    pq.write_table(pa.table({"task_index": pa.array(tasks["task_index"], pa.int64()), "task": tasks["task"]}),
                   root / "meta/tasks.parquet")

    def fn(cols):
        rows = rows_of(cols, 1)
        for r in rows[len(rows) // 2:]:
            cols["task_index"][r] = new
    edit_parquet(root, DATA0, fn)
    edit_parquet(root, META0, lambda cols: cols["tasks"].__setitem__(1, cols["tasks"][1] + ["put it back"]))
    edit_json(root, "meta/info.json", lambda i: i.update(total_tasks=new + 1))


def m_float64(root):
    for path in sorted((root / "data").glob("*/*.parquet")):
        t = pq.read_table(path)
        for key in ("observation.state", "action"):
            x = np.asarray(t.column(key).to_pylist(), dtype=np.float64)
            t = t.set_column(t.column_names.index(key), key,
                             pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), pa.float64()), x.shape[1]))
        pq.write_table(t, path)
    edit_json(root, "meta/info.json", lambda i: [i["features"][k].update(dtype="float64")
                                                 for k in ("observation.state", "action")])


def m_extra_features(root):
    """Recorded but unused: a scalar (shape [1]) reward and a 2-D velocity."""
    for path in sorted((root / "data").glob("*/*.parquet")):
        t = pq.read_table(path)
        n = t.num_rows
        t = t.append_column("next.reward", pa.array(np.linspace(0, 1, n, dtype=np.float32)))
        vel = np.stack([np.sin(np.arange(n) / 5), np.cos(np.arange(n) / 5)], 1).astype(np.float32)
        t = t.append_column("observation.velocity", pa.FixedSizeListArray.from_arrays(pa.array(vel.reshape(-1)), 2))
        pq.write_table(t, path)
    edit_json(root, "meta/info.json", lambda i: i["features"].update({
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "observation.velocity": {"dtype": "float32", "shape": [2], "names": ["vx", "vy"]}}))


def m_no_state(root):
    """A policy without proprioception: no observation.state column, feature or stats."""
    edit_data(root, lambda cols: cols.pop("observation.state"))
    edit_json(root, "meta/info.json", lambda i: i["features"].pop("observation.state"))
    edit_json(root, "meta/stats.json", lambda s: s.pop("observation.state"))


def m_two_camera_sizes(root):
    """A second camera (wrist) at 32x32 beside the 64x64 front camera, in the same files."""
    for path, frames in decode_all(root).items():
        small = frames.reshape(len(frames), 32, 2, 32, 2, 3).mean((2, 4)).astype(np.uint8)
        encode_video(root / "videos" / WRIST / path.parent.name / path.name, small, 10, "libx264")

    def fn(cols):
        for f in ("chunk_index", "file_index", "from_timestamp", "to_timestamp"):
            cols[f"videos/{WRIST}/{f}"] = list(cols[f"videos/{CAMERA_KEY}/{f}"])
    for rel in (META0, META1):
        t = pq.read_table(root / rel)
        cols = t.to_pydict()
        fn(cols)
        pq.write_table(pa.Table.from_pydict(cols), root / rel)
    edit_json(root, "meta/info.json", lambda i: i["features"].update(
        {WRIST: {**i["features"][CAMERA_KEY], "shape": [32, 32, 3]}}))


def m_symlinked_snapshot(root):
    """The hub-cache layout LeRobot 0.5+ downloads: every file a symlink into a blobs folder."""
    blobs = root.parent / f"{root.name}-blobs"
    for i, path in enumerate(sorted(p for p in root.rglob("*") if p.is_file())):
        blobs.mkdir(exist_ok=True)
        target = blobs / f"blob{i}"
        path.rename(target)
        path.symlink_to(target)


def m_v21(root):
    """A real LeRobot v2.1 layout: episodes.jsonl, tasks.jsonl, one parquet and mp4 per episode."""
    shutil.rmtree(root)
    from tests.data.test_legacy_version import write_v21

    write_v21(root)


@dataclass
class Case:
    name: str
    what: str  # one line: what is broken (or which layout it is)
    mutate: Callable[[Path], None]
    errors: frozenset[str] = frozenset()  # exactly the error codes wamkit reports
    warnings: frozenset[str] = frozenset()  # warning codes wamkit reports at least
    loader: str | None = None  # substring of the training loader's DataError; None = the loader does not see it
    expect: DatasetExpectation = field(default_factory=lambda: BASE_EXPECT)

    @property
    def breaks_training(self) -> bool:
        return bool(self.errors)


def case(name, what, mutate, errors=(), warnings=(), loader=None, **expect) -> Case:
    return Case(name, what, mutate, frozenset(errors), frozenset(warnings), loader,
                replace(BASE_EXPECT, **expect) if expect else BASE_EXPECT)


CASES = [
    # files and metadata
    case("truncated_mp4", "an mp4 cut in half", m_truncated_mp4, ["video_undecodable"], loader="file-000.mp4"),
    case("missing_video", "an mp4 deleted", m_missing_video, ["video_file_missing"], loader="file-001.mp4"),
    case("missing_data_parquet", "a data parquet deleted", m_missing_data, ["data_file_missing"],
         loader="file-001.parquet"),
    case("wrong_codebase_version", "info.json says v2.1 over a v3.0 layout", m_bad_version, ["info_bad_version"],
         loader="codebase_version"),
    case("malformed_info", "info.json is not valid JSON", m_malformed_info, ["info_invalid_json"], loader="info.json"),
    case("missing_info", "meta/info.json deleted", m_missing_info, ["info_missing"], loader="info.json"),
    case("info_missing_keys", "info.json without data_path", m_info_missing_keys, ["info_missing_keys"],
         loader="info.json"),
    case("absolute_data_path", "data_path is an absolute path of the recording machine", m_absolute_data_path,
         ["info_absolute_path"], loader="absolute path"),
    case("total_frames_mismatch", "info.json total_frames larger than the episodes hold", m_total_frames,
         warnings=["total_frames_mismatch"]),
    case("total_tasks_mismatch", "info.json total_tasks larger than tasks.parquet", m_total_tasks,
         warnings=["total_tasks_mismatch"]),
    case("missing_tasks_parquet", "meta/tasks.parquet deleted", m_missing_tasks, ["tasks_missing"]),
    case("missing_episodes_meta", "meta/episodes/ deleted", m_missing_episodes_meta, ["episodes_missing"]),
    case("episode_index_gap", "episode 5 renumbered 7 (5, 6 missing)", m_episode_gap, ["episode_index_gap"]),
    case("duplicate_episode", "meta/episodes lists episode 3 twice", m_duplicate_episode,
         ["episode_index_duplicate", "episode_index_gap", "data_episode_unknown"], loader="file-001.parquet"),
    case("row_count_mismatch", "meta/episodes length one more than the rows", m_row_count,
         ["row_count_mismatch"], loader="file-000.parquet: episode 0"),
    case("frame_index_gap", "a frame_index skipped and one duplicated", m_frame_index_gap,
         ["frame_index_gap", "timestamp_mismatch"],
         loader="file-000.parquet: frame_index (episode 2)"),
    case("timestamps_vs_fps", "timestamps of an episode at 1.5x the fps period", m_timestamps,
         ["timestamp_mismatch"], loader="file-000.parquet: timestamp"),
    case("timestamps_swapped", "two frames' timestamps out of order", m_timestamps_swapped,
         ["timestamp_mismatch"], loader="file-000.parquet: timestamp"),
    case("index_not_sequential", "global index restarts at 0 in the second file", m_index_shifted,
         warnings=["index_mismatch"]),
    case("task_index_unknown", "task_index 9 not in tasks.parquet", m_task_unknown, ["task_index_unknown"]),
    case("action_width_one_file", "one file's action rows have 4 values, info.json says 3",
         m_action_width_one_file, ["data_dim_mismatch"], loader="file-001.parquet['action']"),
    case("action_float64_one_file", "one file stores action as float64, info.json says float32",
         m_action_float64_one_file, warnings=["data_dtype_mismatch"]),
    case("video_shorter_than_to_timestamp", "meta/episodes points 3 s past the end of an mp4", m_video_short,
         ["video_too_short"], loader="file-001.mp4"),
    case("video_fps_mismatch", "an mp4 re-encoded at 20 fps in a 10 fps dataset", m_video_fps,
         ["video_too_short"], warnings=["video_fps_mismatch"], loader="file-001.mp4"),
    case("video_shape_mismatch", "info.json says 48x48, the mp4s are 64x64", m_video_shape,
         ["video_shape_mismatch"], loader="expected [48, 48, 3]"),
    # stats against the data
    case("stats_missing", "meta/stats.json deleted", m_stats_missing, ["stats_missing"], loader="stats.json"),
    case("stats_key_missing", "stats.json has no 'action'", m_stats_key_missing, ["stats_key_missing"],
         loader="stats.json: stats['action']"),
    case("stats_nan", "stats action max is NaN", m_stats_nan, ["stats_nonfinite"], loader='stats["action"]["max"][1]'),
    case("stats_zero_range", "stats min == max where the data varies", m_stats_zero_range,
         ["stats_zero_range", "stats_data_mismatch"], loader='stats["action"]["max"][0]'),
    case("stats_field_missing", "stats state has no 'min'", m_stats_field_missing, ["stats_field_missing"],
         loader='stats["observation.state"]["min"]'),
    case("stats_dim_mismatch", "stats action has 2 channels, the data 3", m_stats_dim_mismatch,
         ["stats_dim_mismatch"], loader="stats.json"),
    case("stats_narrower_than_data", "stats action max below the data's max", m_stats_narrow,
         ["stats_data_mismatch"]),
    case("stats_stale_after_edit", "actions rescaled after the stats were written", m_stale_stats_after_edit,
         ["stats_data_mismatch"]),
    case("stats_mean_shifted_meanstd", "stats state mean of another dataset, recipe normalizes meanstd",
         m_stats_mean_shift, ["stats_data_mismatch"], normalization="meanstd"),
    case("stats_mean_shifted_minmax", "the same stats, recipe normalizes minmax (mean unused)",
         m_stats_mean_shift, warnings=["stats_data_mismatch"]),
    case("stats_std_scaled", "stats action std 3x the data's, recipe minmax", m_stats_std_scaled,
         warnings=["stats_data_mismatch"]),
    case("stats_std_zero_varying", "stats action std 0 on a varying channel, recipe minmax", m_stats_std_zero,
         warnings=["stats_data_mismatch"]),
    case("stats_q99_outside_data_quantile", "stats action q99 above the data's max, recipe quantile",
         m_stats_q99_wide, ["stats_data_mismatch"], normalization="quantile"),
    case("constant_channel", "an unused gripper: one action channel constant, min == max (trains)",
         m_constant_channel, warnings=["constant_channel"]),
    # recording glitches
    case("nan_action_cell", "one NaN in an action row", m_nan_action, ["action_nan"],
         loader="file-000.parquet['action']"),
    case("nan_state_cell", "one inf in a state row", m_nan_state, ["state_nan"],
         loader="file-001.parquet['observation.state']"),
    case("action_spike", "one action value of 1000 (a logging glitch); stats recomputed", m_action_spike,
         warnings=["value_outlier"]),
    case("frozen_actions", "the same action row for half of an episode (a stalled teleop)", m_frozen_actions,
         warnings=["values_frozen"]),
    case("nan_unused_feature", "NaN in an extra feature the recipe does not read", m_nan_unused_feature,
         warnings=["unused_nan"]),
    # the recipe against the dataset (lerobot-doctor has no recipe)
    case("fps_mismatch", "recipe data.fps = 15, dataset 10", m_none, ["fps_mismatch"], loader="info.json: fps",
         fps=15.0),
    case("action_dim_too_large", "3 action channels, model.max_action_dim = 2", m_none, ["action_dim_too_large",
         "state_dim_too_large"], loader="max_action_dim", max_action_dim=2),
    case("all_episodes_short", "chunk_length 80, longest episode 57", m_none, ["no_episode_long_enough"],
         loader="chunk_length", chunk_length=80),
    case("missing_camera", "recipe camera observation.images.wrist absent", m_none, ["camera_missing"],
         loader=WRIST, camera_keys=[WRIST]),
    # layouts LeRobot writes (issue 16): valid ones train; their broken variants are errors
    case("layout_hevc", "valid: HEVC video", reencode("libx265")),
    case("layout_av1", "valid: AV1 video (LeRobot's default)", reencode("libsvtav1")),
    case("layout_chunk_dirs", "valid: episodes over two chunk dirs", m_chunk_dirs),
    case("layout_task_switch", "valid: 3 tasks, one changing mid-episode", m_task_switch),
    case("layout_float64", "valid: float64 state/action", m_float64),
    case("layout_extra_features", "valid: unused scalar [1] and vector features, no stats for them",
         m_extra_features, warnings=["stats_key_missing"]),
    case("layout_no_state", "valid: no observation.state, recipe use_state = false", m_no_state, state_key=None),
    case("no_state_with_use_state", "no observation.state, recipe use_state = true", m_no_state,
         ["feature_missing", "stats_key_missing"], loader="observation.state"),
    case("layout_two_camera_sizes", "valid: a 64x64 and a 32x32 camera", m_two_camera_sizes),
    case("layout_image_features", "valid: frames as PNG in the parquet (dtype image)", m_image_layout),
    case("image_frame_garbage", "image layout, one embedded frame not a PNG", m_image_garbage,
         ["image_undecodable"], loader="not a readable image"),
    case("image_column_missing", "image layout, one file without the camera column", m_image_column_missing,
         ["data_column_missing"], loader="observation.images.front"),
    case("layout_hub_snapshot", "valid: every file a symlink into a blob store (hub cache)", m_symlinked_snapshot),
    case("layout_v21", "LeRobot v2.1 (episodes.jsonl, a parquet per episode)", m_v21, ["info_bad_version"],
         loader="convert_dataset_v21_to_v30"),
]


def read_all_windows(root: Path, expect: DatasetExpectation) -> int:
    """What training does: open, build normalizers + transform + windows, read every window."""
    from wamkit.data import Normalizer, SampleTransform, WindowDataset, check_constant_channels

    ds = LeRobotV3Dataset(root, expected_fps=expect.fps)
    source = f"{ds.root}/meta/stats.json"
    action_norm = Normalizer.from_stats(ds.stats, expect.action_key, expect.normalization, source)
    state_norm = Normalizer.from_stats(ds.stats, expect.state_key, expect.normalization, source) \
        if expect.state_key else None
    check_constant_channels(ds, [n for n in (action_norm, state_norm) if n is not None])
    transform = SampleTransform(action_norm, state_norm, expect.max_action_dim, expect.state_key is not None, 0)
    windows = WindowDataset(ds, ds.episode_indices, expect.chunk_length, expect.camera_keys or None,
                            expect.state_key, expect.action_key, stride=8)
    for i in range(len(windows)):
        transform(windows[i])
    return len(windows)


def build_case(c: Case, base: Path, out: Path) -> Path:
    """A private copy of `base` at `out`, broken as `c` says."""
    close_all()
    root = Path(shutil.copytree(base, out, symlinks=True))
    c.mutate(root)
    close_all()
    return root
