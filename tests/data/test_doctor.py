"""Dataset doctor: a corpus of deliberately broken demo datasets, each reported with its intended code,
and (where the training loader can see the problem cheaply) rejected by the loader with a DataError
naming the file or field."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wamkit.config.schema import ExperimentConfig
from wamkit.data import (LeRobotV3Dataset, Normalizer, SampleTransform, WindowDataset, check_constant_channels,
                         write_demo_dataset)
from wamkit.data.doctor import DatasetExpectation, DoctorReport, diagnose, doctor_main
from wamkit.data.synth import CAMERA_KEY
from wamkit.data.video import close_all
from wamkit.errors import DataError

BASE_EXPECT = DatasetExpectation(chunk_length=16)
DATA0 = "data/chunk-000/file-000.parquet"
DATA1 = "data/chunk-000/file-001.parquet"
META0 = "meta/episodes/chunk-000/file-000.parquet"
META1 = "meta/episodes/chunk-000/file-001.parquet"
VIDEO0 = f"videos/{CAMERA_KEY}/chunk-000/file-000.mp4"
VIDEO1 = f"videos/{CAMERA_KEY}/chunk-000/file-001.mp4"


@pytest.fixture(scope="module")
def base_root(tmp_path_factory) -> Path:
    """6 episodes over 2 data/mp4 files (3 + 3)."""
    return write_demo_dataset(tmp_path_factory.mktemp("doctor") / "demo", num_episodes=6, episodes_per_file=3)


@pytest.fixture
def copy_root(base_root, tmp_path) -> Path:
    close_all()
    return Path(shutil.copytree(base_root, tmp_path / "ds"))


# ---- mutation helpers ---------------------------------------------------------------------------
def edit_json(root: Path, rel: str, fn: Callable[[dict], None]) -> None:
    path = root / rel
    obj = json.loads(path.read_text())
    fn(obj)
    path.write_text(json.dumps(obj))


def edit_parquet(root: Path, rel: str, fn: Callable[[dict], None]) -> None:
    """fn edits the table as {column: list}; the schema is kept."""
    path = root / rel
    table = pq.read_table(path)
    cols = table.to_pydict()
    fn(cols)
    pq.write_table(pa.Table.from_pydict(cols, schema=table.schema), path)


def rows_of(cols: dict, ep: int) -> list[int]:
    return [i for i, e in enumerate(cols["episode_index"]) if e == ep]


def set_cell(column: str, ep: int, frame: int, channel: int, value: float):
    def fn(cols):
        row = rows_of(cols, ep)[frame]
        cols[column][row] = list(cols[column][row])
        cols[column][row][channel] = value
    return fn


def m_truncated_mp4(root):
    p = root / VIDEO0
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def m_stats_key_missing(root):
    edit_json(root, "meta/stats.json", lambda s: s.pop("action"))


def m_stats_nan(root):
    edit_json(root, "meta/stats.json", lambda s: s["action"]["max"].__setitem__(1, float("nan")))


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


def m_missing_tasks(root):
    (root / "meta/tasks.parquet").unlink()


def m_missing_episodes_meta(root):
    shutil.rmtree(root / "meta/episodes")


def m_none(root):
    pass


@dataclass
class Case:
    name: str
    mutate: Callable[[Path], None]
    code: str
    loader: str | None  # substring the loader's DataError must contain; None = not detectable by the loader
    expect_: DatasetExpectation | None = None

    @property
    def expect(self) -> DatasetExpectation:
        return self.expect_ or BASE_EXPECT


CASES = [
    Case("truncated_mp4", m_truncated_mp4, "video_undecodable", "file-000.mp4"),
    Case("stats_key_missing", m_stats_key_missing, "stats_key_missing", "stats.json: stats['action']"),
    Case("stats_nan", m_stats_nan, "stats_nonfinite", 'stats["action"]["max"][1]'),
    Case("stats_zero_range", m_stats_zero_range, "stats_zero_range", 'stats["action"]["max"][0]'),
    Case("stats_field_missing", m_stats_field_missing, "stats_field_missing", 'stats["observation.state"]["min"]'),
    Case("stats_dim_mismatch", m_stats_dim_mismatch, "stats_dim_mismatch", "stats.json"),
    Case("stats_missing", m_stats_missing, "stats_missing", "stats.json"),
    Case("fps_mismatch", m_none, "fps_mismatch", "info.json: fps", replace(BASE_EXPECT, fps=15.0)),
    Case("action_dim_too_large", m_none, "action_dim_too_large", "max_action_dim",
         replace(BASE_EXPECT, max_action_dim=2)),
    Case("nan_action_cell", m_nan_action, "action_nan", "file-000.parquet['action']"),
    Case("nan_state_cell", m_nan_state, "state_nan", "file-001.parquet['observation.state']"),
    Case("episode_index_gap", m_episode_gap, "episode_index_gap", None),
    Case("duplicate_episode", m_duplicate_episode, "episode_index_duplicate", "file-001.parquet"),
    Case("missing_video", m_missing_video, "video_file_missing", "file-001.mp4"),
    Case("missing_data_parquet", m_missing_data, "data_file_missing", "file-001.parquet"),
    Case("wrong_codebase_version", m_bad_version, "info_bad_version", "codebase_version"),
    Case("malformed_info", m_malformed_info, "info_invalid_json", "info.json"),
    Case("missing_info", m_missing_info, "info_missing", "info.json"),
    Case("info_missing_keys", m_info_missing_keys, "info_missing_keys", "info.json"),
    Case("frame_index_gap", m_frame_index_gap, "frame_index_gap", "file-000.parquet: frame_index (episode 2)"),
    Case("timestamps_vs_fps", m_timestamps, "timestamp_mismatch", "file-000.parquet: timestamp"),
    Case("task_index_unknown", m_task_unknown, "task_index_unknown", None),
    Case("row_count_mismatch", m_row_count, "row_count_mismatch", "file-000.parquet: episode 0"),
    Case("all_episodes_short", m_none, "no_episode_long_enough", "chunk_length",
         replace(BASE_EXPECT, chunk_length=80)),
    Case("missing_camera", m_none, "camera_missing", "observation.images.wrist",
         replace(BASE_EXPECT, camera_keys=["observation.images.wrist"])),
    Case("video_shorter_than_to_timestamp", m_video_short, "video_too_short", "file-001.mp4"),
    Case("missing_tasks_parquet", m_missing_tasks, "tasks_missing", "tasks.parquet"),
    Case("missing_episodes_meta", m_missing_episodes_meta, "episodes_missing", "meta/episodes"),
]


def read_all_windows(root: Path, expect: DatasetExpectation) -> int:
    """What training does: open, build normalizers + transform + windows, read every window."""
    ds = LeRobotV3Dataset(root, expected_fps=expect.fps)
    source = f"{ds.root}/meta/stats.json"
    action_norm = Normalizer.from_stats(ds.stats, expect.action_key, expect.normalization, source)
    state_norm = Normalizer.from_stats(ds.stats, expect.state_key, expect.normalization, source)
    check_constant_channels(ds, [action_norm, state_norm])
    transform = SampleTransform(action_norm, state_norm, expect.max_action_dim, True, 0)
    windows = WindowDataset(ds, ds.episode_indices, expect.chunk_length, expect.camera_keys or None,
                            expect.state_key, expect.action_key, stride=8)
    for i in range(len(windows)):
        transform(windows[i])
    return len(windows)


def test_healthy_dataset_has_no_findings(base_root):
    report = diagnose(base_root, BASE_EXPECT)
    assert report.ok and report.findings == [], report.format()
    assert read_all_windows(base_root, BASE_EXPECT) > 0


def test_case_corpus_is_large_enough():
    assert len(CASES) >= 20 and len({c.code for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_doctor_reports_intended_code(case, copy_root):
    case.mutate(copy_root)
    report = diagnose(copy_root, case.expect)
    assert not report.ok
    assert case.code in report.codes("error"), report.format()
    text = report.format()
    assert f"[{case.code}]" in text and "fix:" in text and "error(s)" in text.splitlines()[-1]


@pytest.mark.parametrize("case", [c for c in CASES if c.loader], ids=[c.name for c in CASES if c.loader])
def test_loader_raises_data_error(case, copy_root):
    case.mutate(copy_root)
    with pytest.raises(DataError) as info:
        read_all_windows(copy_root, case.expect)
    assert case.loader in str(info.value)


def test_warning_for_some_short_episodes(base_root):
    lengths = [LeRobotV3Dataset(base_root).episode_length(e) for e in range(6)]
    chunk = sorted(lengths)[2]  # the 3 shortest episodes are too short, the others long enough
    report = diagnose(base_root, replace(BASE_EXPECT, chunk_length=chunk))
    assert report.ok and "episode_too_short" in report.codes("warning")


def test_doctor_never_crashes_on_garbage(base_root, tmp_path):
    """Overwrite each file in turn with garbage bytes: always a report with errors, never an exception."""
    files = sorted(p.relative_to(base_root) for p in base_root.rglob("*") if p.is_file())
    for i, rel in enumerate(files):
        root = Path(shutil.copytree(base_root, tmp_path / f"g{i}"))
        (root / rel).write_bytes(b"\x00garbage\xff" * 7)
        report = diagnose(root, BASE_EXPECT)
        assert isinstance(report, DoctorReport)
        assert not report.ok, f"{rel}: {report.format()}"
        assert "check_crashed" not in report.codes(), report.format()


def test_doctor_on_missing_root(tmp_path):
    report = diagnose(tmp_path / "nope")
    assert report.codes("error") == {"root_missing"}


def test_expectation_from_config():
    cfg = ExperimentConfig()
    cfg.data.fps, cfg.data.chunk_length, cfg.data.camera_keys = 10.0, 16, [CAMERA_KEY]
    cfg.data.use_state, cfg.model.max_action_dim, cfg.data.normalization = False, 8, "meanstd"
    e = DatasetExpectation.from_config(cfg)
    assert (e.fps, e.chunk_length, e.camera_keys, e.state_key, e.max_action_dim, e.normalization) == (
        10.0, 16, [CAMERA_KEY], None, 8, "meanstd")


def test_doctor_main(base_root, copy_root, capsys):
    cfg = ExperimentConfig()
    cfg.data.chunk_length = 16
    assert doctor_main(str(base_root), cfg) == 0
    assert "0 error(s)" in capsys.readouterr().out
    m_missing_video(copy_root)
    assert doctor_main(str(copy_root)) == 1
    out = capsys.readouterr().out
    assert "video_file_missing" in out and "file-001.mp4" in out
