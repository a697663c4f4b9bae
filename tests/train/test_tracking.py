"""W&B tracking in offline mode (no key, no network): the same metrics as metrics.jsonl, the resolved
config and data contract once, a resume continuing the same W&B run, and no credentials on disk."""

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import DEMO_RECIPE, quick_overrides, run_cli
from wamkit.config import load_experiment
from wamkit.errors import ConfigError
from wamkit.train.tracking import RUN_ID_FILE, check_wandb

SECRET = "wamkit-test-sentinel-key-0123456789abcdef"


def wandb_records(path: Path):
    """The protobuf records of a .wandb file: a 7-byte header (":W&B", magic, version), then
    LevelDB-log chunks (crc32, length, type) in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, parts, block = 7, b"", 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is zero padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def _key(item) -> str:
    """A history item's name: wandb 0.31 writes it as nested_key, older versions as key."""
    return item.key or "/".join(item.nested_key)


def _offline_run(wandb_dir: Path, run_id: str, index: int):
    runs = sorted(wandb_dir.glob(f"wandb/offline-run-*-{run_id}"))
    assert len(runs) > index, runs
    records = list(wandb_records(runs[index] / f"run-{run_id}.wandb"))
    history = [{_key(i): json.loads(i.value_json) for i in r.history.item} for r in records if r.WhichOneof("record_type") == "history"]
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    return run, history


def test_offline_wandb_mirrors_metrics_and_a_resume_continues_the_same_run(demo_root, tmp_path):
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wb"), "WANDB_API_KEY": SECRET, "WANDB_SILENT": "true"}
    args = ["train", str(DEMO_RECIPE), *quick_overrides(demo_root, tmp_path, "tracked", 3, 3),
            "--set", "trainer.log_every=1", "--set", 'logging.wandb="offline"', "--set", 'logging.group="g1"']
    run_cli(args, env=env)
    run_dir = tmp_path / "tracked"
    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    run, history = _offline_run(tmp_path / "wb", run_id, 0)
    assert run.run_id == run_id and run.display_name == "tracked" and run.project == "wamkit" and run.run_group == "g1"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["job"]["name"] == "tracked" and config["logging"]["wandb"] == "offline"
    assert config["data_contract"] == json.loads((run_dir / "data_contract.json").read_text())
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [r["step"] for r in logged] == [1, 2, 3]
    for h, r in zip(history, logged):
        for key in ("loss", "video_loss", "action_loss", "lr", "grad_norm", "samples_per_s", "tokens_per_s"):
            assert h[key] == pytest.approx(r[key]), key

    run_cli(args + ["--set", "trainer.max_iter=5"], env=env)  # relaunch: resume at step 3
    assert (run_dir / RUN_ID_FILE).read_text().strip() == run_id
    run, history = _offline_run(tmp_path / "wb", run_id, 1)
    assert run.run_id == run_id and [h["step"] for h in history] == [4, 5]

    for path in tmp_path.rglob("*"):  # the key from the environment is never written anywhere
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_wandb_problems_are_config_errors_before_anything_is_built(monkeypatch, tmp_path):
    cfg = load_experiment(DEMO_RECIPE, ['logging.wandb="online"'])
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    with pytest.raises(ConfigError) as err:  # online without a key: an error with both ways out, never a login prompt
        check_wandb(cfg)
    assert "logging.wandb" in str(err.value) and "WANDB_API_KEY" in err.value.fix and "offline" in err.value.fix
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password k\n")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    check_wandb(cfg)  # `wandb login`'s netrc entry counts
    monkeypatch.setitem(sys.modules, "wandb", None)  # the package is missing
    with pytest.raises(ConfigError, match="not installed") as err:
        check_wandb(load_experiment(DEMO_RECIPE, ['logging.wandb="offline"']))
    assert "[tracking]" in err.value.fix
    check_wandb(load_experiment(DEMO_RECIPE))  # disabled, the default: wandb is never imported
    with pytest.raises(ConfigError, match="logging.wandb"):
        load_experiment(DEMO_RECIPE, ['logging.wandb="on"'])
