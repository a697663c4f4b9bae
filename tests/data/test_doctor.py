"""Dataset doctor beyond the corpus (tests/data/test_doctor_corpus.py): a clean dataset, partly short
episodes, garbage in every file, a missing root, recipe expectations and the CLI entry."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tests.data.doctor_corpus import BASE_EXPECT, m_missing_video, read_all_windows, write_base
from wamkit.config.schema import ExperimentConfig
from wamkit.data import LeRobotV3Dataset
from wamkit.data.doctor import DatasetExpectation, DoctorReport, diagnose, doctor_main
from wamkit.data.synth import CAMERA_KEY
from wamkit.data.video import close_all


@pytest.fixture(scope="module")
def base_root(tmp_path_factory) -> Path:
    """6 episodes over 2 data/mp4 files (3 + 3)."""
    return write_base(tmp_path_factory.mktemp("doctor") / "demo")


@pytest.fixture
def copy_root(base_root, tmp_path) -> Path:
    close_all()
    return Path(shutil.copytree(base_root, tmp_path / "ds"))


def test_healthy_dataset_has_no_findings(base_root):
    report = diagnose(base_root, BASE_EXPECT)
    assert report.ok and report.findings == [], report.format()
    assert read_all_windows(base_root, BASE_EXPECT) > 0


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
