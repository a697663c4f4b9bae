"""A LeRobot v2.1 dataset (episodes.jsonl, one parquet per episode) gets one clear error naming the file,
the version and LeRobot's converter command, from the loader and from the doctor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wamkit.data import LeRobotV3Dataset
from wamkit.data.doctor import diagnose, doctor_main
from wamkit.errors import DataError

COMMAND = "python -m lerobot.datasets.v30.convert_dataset_v21_to_v30 --repo-id="


def write_v21(root: Path, version: str | None = "v2.1") -> Path:
    """The meta files of a LeRobot v2.1 dataset, as its writer lays them out."""
    (root / "meta").mkdir(parents=True)
    info = {"fps": 10, "total_episodes": 1, "total_chunks": 1, "chunks_size": 1000,
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
            "features": {"action": {"dtype": "float32", "shape": [3], "names": None},
                         "observation.images.front": {"dtype": "video", "shape": [64, 64, 3], "names": None}}}
    if version is not None:
        info["codebase_version"] = version
    (root / "meta" / "info.json").write_text(json.dumps(info))
    (root / "meta" / "episodes.jsonl").write_text(json.dumps({"episode_index": 0, "tasks": ["reach"], "length": 20}) + "\n")
    (root / "meta" / "tasks.jsonl").write_text(json.dumps({"task_index": 0, "task": "reach"}) + "\n")
    return root


def test_loader_names_file_version_and_converter(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "elsewhere"))
    root = write_v21(tmp_path / "old")
    with pytest.raises(DataError) as err:
        LeRobotV3Dataset(root)
    e = err.value
    assert e.where == f"{root}/meta/info.json: codebase_version" and "'v2.1'" in e.problem
    assert f"`{COMMAND}old --root={tmp_path} --push-to-hub=false`" in e.fix and "bring older" not in e.fix


def test_repo_id_filled_in_inside_the_lerobot_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    root = write_v21(tmp_path / "home" / "lerobot" / "aloha_old")
    with pytest.raises(DataError) as err:
        LeRobotV3Dataset(root)
    assert f"`{COMMAND}lerobot/aloha_old --root={tmp_path / 'home'} --push-to-hub=false`" in err.value.fix


def test_older_and_unversioned_v2_layouts(tmp_path):
    with pytest.raises(DataError, match="'v2.0'.*\n.*bring older datasets to v2.1 first"):
        LeRobotV3Dataset(write_v21(tmp_path / "v20", "v2.0"))
    with pytest.raises(DataError, match="missing and meta/episodes.jsonl exists: a LeRobot v2.x layout"):
        LeRobotV3Dataset(write_v21(tmp_path / "none", None))


def test_doctor_reports_only_the_version(tmp_path, capsys):
    root = write_v21(tmp_path / "old")
    report = diagnose(root)
    assert [f.code for f in report.findings] == ["info_bad_version"], report.format()
    assert COMMAND in report.findings[0].fix and "info.json" in report.findings[0].where
    assert doctor_main(str(root)) == 1 and COMMAND in capsys.readouterr().out
