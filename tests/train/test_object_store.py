"""Runs and checkpoints in an object store, against a real S3-protocol server (moto in server mode)
that the test starts on 127.0.0.1: sharded writes from every rank, a rank killed mid-save leaving
the previous `latest` valid, resume by run name from the bucket (on the same and on another world
size, equal to a local one-process run), keep_last pruning in the bucket, a later run, `wamkit
export` and the serve/eval loader reading the bucket, and the credentials from the environment
written nowhere."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from tests.helpers import DEMO_RECIPE, REPO, quick_overrides, run_cli, train_in_process
from wamkit.config import load_experiment
from wamkit.errors import ConfigError
from wamkit.train.faults import KILL_RANK_DURING_SAVE

BUCKET = "wamkit-test-runs"
SECRET = "wamkit-test-secret-key-0123456789abcdef"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on a free loopback port, one bucket, and the environment (credentials,
    endpoint) every wamkit process of the test reads, as s3fs reads it on a cluster."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "wamkit-test-access-key", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}", "WAMKIT_STAGING_DIR": str(tmp_path_factory.mktemp("staging"))}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import boto3

    boto3.client("s3").create_bucket(Bucket=BUCKET)
    yield env
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _fs():
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)


def _torchrun(args, env=None):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "wamkit.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _losses(text: str) -> list[float]:
    return [json.loads(line)["loss"] for line in text.splitlines() if '"loss"' in line]


def test_a_run_in_s3_survives_a_rank_killed_mid_save_and_resumes_on_another_world_size(s3, demo_root, tmp_path):
    fs, run = _fs(), f"{BUCKET}/runs/s3run"
    two = quick_overrides(demo_root, tmp_path, "s3run", 4, 2) + [
        "--set", f'job.output_root="s3://{BUCKET}/runs"', "--set", "trainer.samples_per_step=2", "--set", "checkpoint.keep_last=1"]

    crashed = _torchrun(["train", str(DEMO_RECIPE), *two], env={KILL_RANK_DURING_SAVE: "1:4"})
    assert crashed.returncode != 0 and re.search(r"rank\s*: 1 \(local_rank: 1\)\s*\n\s*exitcode\s*: -9", crashed.stderr), crashed.stderr  # SIGKILLed
    assert fs.cat(f"{run}/checkpoints/latest").decode().strip() == "iter_000000002"  # the previous latest, complete
    assert fs.exists(f"{run}/checkpoints/iter_000000002/wamkit_complete.json")
    assert fs.exists(f"{run}/checkpoints/iter_000000002/__0_0.distcp") and fs.exists(f"{run}/checkpoints/iter_000000002/__1_0.distcp")
    partial = fs.find(f"{run}/checkpoints/iter_000000004")
    assert partial and not any(p.endswith("wamkit_complete.json") for p in partial), partial  # shards of the killed save only

    resumed = _torchrun(["train", str(DEMO_RECIPE), *two])
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed s3://{run}/checkpoints/iter_000000002 at step 2" in resumed.stdout
    assert fs.cat(f"{run}/checkpoints/latest").decode().strip() == "iter_000000004"
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(f"{run}/checkpoints")) == ["iter_000000004", "latest"]  # keep_last = 1

    # On one process, with grad_accum 2 to keep the global batch of 4: the 2-rank checkpoint
    # reshards and the run goes on exactly like a local one-process run.
    one_rank = ["--set", "trainer.max_iter=6", "--set", "trainer.grad_accum_iter=2"]
    out = run_cli(["train", str(DEMO_RECIPE), *two, *one_rank])
    assert "at step 4" in out.stdout and "world size 1, global batch 4" in out.stdout
    local = quick_overrides(demo_root, tmp_path, "local", 4, 2)
    train_in_process([str(DEMO_RECIPE), *local])  # the one-process reference, in this process
    train_in_process([str(DEMO_RECIPE), *local, "--set", "trainer.max_iter=6"])
    in_bucket = _losses(fs.cat(f"{run}/metrics.jsonl").decode())
    assert len(in_bucket) == 6 and fs.exists(f"{run}/resolved_config.json")
    events = [p for p in fs.find(f"{run}/tensorboard") if "tfevents" in p]
    assert len(events) == 3 and all(p.rsplit("/", 2)[1] == "tensorboard" for p in events), events  # one per launch, not nested
    torch.testing.assert_close(torch.tensor(in_bucket), torch.tensor(_losses((tmp_path / "local" / "metrics.jsonl").read_text())),
                               rtol=1e-4, atol=1e-5)

    # A later run starts from the bucket's checkpoint, and export reads the run from the bucket.
    chained = quick_overrides(demo_root, tmp_path, "chained", 1, 1) + [
        "--set", f'checkpoint.load_path="s3://{run}/checkpoints/iter_000000006"']
    assert "fresh run from base weights (wamkit checkpoint)" in run_cli(["train", str(DEMO_RECIPE), *chained]).stdout
    exported = run_cli(["export", f"s3://{run}", str(tmp_path / "export")])
    assert "exported to" in exported.stdout and (tmp_path / "export" / "wamkit.json").is_file()
    from wamkit.serve.server import load_policy  # what `wamkit serve` and `eval` load a run with

    policy = load_policy(f"s3://{run}")
    assert policy.loaded.source["checkpoint"] == f"s3://{run}/checkpoints/iter_000000006"

    assert not (REPO / "s3:").exists() and not (tmp_path / "s3:").exists()
    for proc in (crashed, resumed, out, exported):
        assert SECRET not in proc.stdout + proc.stderr
    for path in fs.find(run):  # the secret key from the environment is in no object and no local file
        assert SECRET.encode() not in fs.cat(path), path
    for root in (tmp_path, s3["WAMKIT_STAGING_DIR"]):
        for path in __import__("pathlib").Path(root).rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path


@pytest.mark.parametrize("url, problem", [
    ("hdfs://namenode/runs", "uses hdfs://, which wamkit does not support"),
    ("s3://AKIA123:secret@bucket/runs", "carries credentials"),
    ("s3:///runs", "names no bucket"),
])
def test_urls_wamkit_cannot_honour_are_config_errors_naming_the_field(url, problem):
    with pytest.raises(ConfigError) as err:
        load_experiment(DEMO_RECIPE, [f'job.output_root="{url}"'])
    assert str(err.value).startswith("job.output_root") and problem in str(err.value), str(err.value)
    with pytest.raises(ConfigError, match="checkpoint.load_path"):
        load_experiment(DEMO_RECIPE, [f'checkpoint.load_path="{url}/iter_000000004"'])


def test_an_output_url_and_a_missing_backend_are_errors_before_any_work(monkeypatch):
    proc = run_cli(["export", "runs/r", f"s3://{BUCKET}/export"], check=False)
    assert proc.returncode == 2 and "wamkit export OUT_DIR" in proc.stderr and "local directory" in proc.stderr
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gcsfs" else real(name, *a))
    with pytest.raises(ConfigError, match="gs:// needs the gcsfs package") as err:
        load_experiment(DEMO_RECIPE, ['job.output_root="gs://bucket/runs"'])
    assert "objectstore" in err.value.fix


def test_a_damaged_checkpoint_in_s3_is_named_and_the_run_goes_on_from_the_previous_one(s3, demo_root, tmp_path):
    """The manifest in the bucket is written and checked like a local one; the damaged iteration is
    moved aside in the bucket when the run saves its step again, never deleted."""
    import s3fs

    from wamkit.errors import CheckpointError
    from wamkit.train.trainer import Trainer

    fs, run = _fs(), f"{BUCKET}/runs/s3damage"
    args = quick_overrides(demo_root, tmp_path, "s3damage", 4, 2) + ["--set", f'job.output_root="s3://{BUCKET}/runs"']
    cfg = lambda *extra: load_experiment(DEMO_RECIPE, [a for a in args if a != "--set"] + list(extra))  # noqa: E731
    Trainer(cfg()).train()
    losses = _losses(fs.cat(f"{run}/metrics.jsonl").decode())
    listed = json.loads(fs.cat(f"{run}/checkpoints/iter_000000004/wamkit_manifest.json"))["files"]
    assert {"__0_0.distcp", ".metadata", "wamkit_complete.json"} <= set(listed)
    shard = f"{run}/checkpoints/iter_000000004/__0_0.distcp"
    cut = fs.cat(shard)[:1000]
    fs.pipe(shard, cut)
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(CheckpointError) as err:
        Trainer(cfg())
    assert f"s3://{run}/checkpoints/iter_000000004: is damaged: __0_0.distcp: is 1000 bytes" in str(err.value)
    assert "--set checkpoint.resume_step=2" in err.value.fix
    assert Trainer(cfg("checkpoint.on_damage=previous")).train()["step"] == 4
    assert fs.cat(f"{run}/checkpoints/replaced_iter_000000004/__0_0.distcp") == cut
    assert fs.cat(f"{run}/checkpoints/latest").decode().strip() == "iter_000000004"
    assert _losses(fs.cat(f"{run}/metrics.jsonl").decode()) == losses
