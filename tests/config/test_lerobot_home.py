"""data.repo_id finds a dataset where LeRobot keeps it ($HF_LEROBOT_HOME/<repo_id>, or its hub-cache
snapshot under $HF_LEROBOT_HOME/hub, laid out by huggingface_hub), offline; a missing one is an error
naming the download command."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import DEMO_RECIPE, train_tiny_run
from wamkit.config import load_experiment
from wamkit.config.lerobot_home import hf_lerobot_home, resolve_repo_id
from wamkit.data import LeRobotV3Dataset, write_demo_dataset
from wamkit.errors import ConfigError

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return write_demo_dataset(tmp_path_factory.mktemp("src") / "reach", num_episodes=8)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "lerobot_home"))
    return tmp_path / "lerobot_home"


def hub_snapshot(src: Path, home: Path, repo_id: str, ref: str = "v3.0", only: str = "") -> Path:
    """Lay `src` out as huggingface_hub caches a dataset repo: blobs/ by content hash, snapshots/<commit>/
    of symlinks into them, refs/<ref> naming the commit (what LeRobot 0.6's snapshot_download leaves)."""
    repo = home / "hub" / f"datasets--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    for path in sorted(p for p in src.rglob("*") if p.is_file() and str(p.relative_to(src)).startswith(only)):
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, blob)
        link = snapshot / path.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(COMMIT)
    return snapshot


def test_home_follows_lerobot(monkeypatch, tmp_path):
    for var in ("HF_LEROBOT_HOME", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    assert hf_lerobot_home() == Path("~/.cache/huggingface/lerobot").expanduser()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_lerobot_home() == tmp_path / "xdg" / "huggingface" / "lerobot"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hf_lerobot_home() == tmp_path / "hf" / "lerobot"
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "lr"))
    assert hf_lerobot_home() == tmp_path / "lr"


def test_local_copy_under_home(demo, home):
    shutil.copytree(demo, home / "lerobot" / "reach")
    cfg = load_experiment(DEMO_RECIPE, ["data.path=''", "data.repo_id='lerobot/reach'"])
    assert cfg.data.resolved_path() == home / "lerobot" / "reach"


@pytest.mark.parametrize("ref", ["v3.0", "main"])
def test_hub_cache_snapshot(demo, home, ref):
    snapshot = hub_snapshot(demo, home, "lerobot/reach", ref)
    root = resolve_repo_id("lerobot/reach")
    assert root == snapshot and (root / "meta" / "info.json").is_symlink()
    ds = LeRobotV3Dataset(root)
    assert len(ds.episode_indices) == 8 and ds.decode_frames(0, ds.camera_keys[0], [0, 5]).shape[0] == 2


def test_home_copy_wins_over_the_snapshot(demo, home):
    hub_snapshot(demo, home, "lerobot/reach")
    shutil.copytree(demo, home / "lerobot" / "reach")
    assert resolve_repo_id("lerobot/reach") == home / "lerobot" / "reach"


def test_missing_dataset_names_the_download_command(home):
    with pytest.raises(ConfigError) as err:
        resolve_repo_id("lerobot/pusht")
    e = err.value
    assert e.where == "data.repo_id" and str(home / "lerobot" / "pusht") in e.problem
    assert f"hf download lerobot/pusht --repo-type dataset --revision v3.0 --cache-dir {home / 'hub'}" in e.fix


def test_metadata_only_snapshot_is_refused(demo, home):
    hub_snapshot(demo, home, "lerobot/reach", only="meta")
    with pytest.raises(ConfigError, match="holds the metadata but no data/ folder") as err:
        resolve_repo_id("lerobot/reach")
    assert "hf download lerobot/reach" in err.value.fix


def test_repo_id_validated_at_load_and_path_wins(demo, home):
    with pytest.raises(ConfigError, match="data.repo_id: '../reach' is not a hub repo id"):
        load_experiment(DEMO_RECIPE, ["data.path=''", "data.repo_id='../reach'"])
    with pytest.raises(ConfigError, match=r"data.path: is empty.*\n.*--set data.repo_id="):
        load_experiment(DEMO_RECIPE, ["data.path=''"])
    cfg = load_experiment(DEMO_RECIPE, [f"data.path='{demo}'", "data.repo_id='lerobot/absent'"])
    assert cfg.data.resolved_path() == demo  # data.path is LeRobot's `root`: the cache is not consulted


def test_trains_from_a_hub_snapshot(demo, home, tmp_path):
    hub_snapshot(demo, home, "lerobot/reach")
    run = train_tiny_run(tmp_path, extra=["data.path=''", "data.repo_id='lerobot/reach'", "data.generate_demo=false"])
    assert (run / "checkpoints" / "iter_000000004").is_dir()
