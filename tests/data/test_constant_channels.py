"""Constant channels (an unused gripper, a fixed joint): the doctor warns and names the value, training
builds its normalizers, and stats that call a varying channel constant stay errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import CONSTANT_ACTION, CONSTANT_STATE, DEMO_RECIPE, run_cli, with_constant_channels
from wamkit.config import load_experiment
from wamkit.data import write_demo_dataset
from wamkit.data.doctor import DatasetExpectation, diagnose
from wamkit.data.video import close_all
from wamkit.errors import DataError
from wamkit.train.datasets import build_run_data

DATA0 = "data/chunk-000/file-000.parquet"


@pytest.fixture(scope="module")
def const_root(tmp_path_factory) -> Path:
    root = write_demo_dataset(tmp_path_factory.mktemp("const") / "demo", num_episodes=6, episodes_per_file=3)
    return with_constant_channels(root)


def _cfg(root: Path, *extra: str):
    return load_experiment(DEMO_RECIPE, [f'data.path="{root}"', "data.generate_demo=false", *extra])


def test_doctor_cli_warns_with_channel_and_value_and_exits_0(const_root):
    proc = run_cli(["data", "doctor", str(const_root), "--recipe", str(DEMO_RECIPE)])
    out = proc.stdout
    assert proc.returncode == 0 and "0 error(s), 2 warning(s)" in out, out
    value = repr(float(np.float32(CONSTANT_ACTION[1])))  # the float32 the parquet holds
    assert "WARNING [constant_channel]" in out and f"channel {CONSTANT_ACTION[0]} of 'action' is constant at {value}" in out
    assert f"channel {CONSTANT_STATE[0]} of 'observation.state' is constant at {CONSTANT_STATE[1]}" in out


@pytest.mark.parametrize("mode", ["minmax", "quantile", "meanstd", "asinh"])
def test_training_data_maps_constant_channels_to_zero(const_root, mode):
    run = build_run_data(_cfg(const_root, f'data.normalization="{mode}"'))
    assert run.contract["action_normalizer"]["constant"] == {
        "channels": [CONSTANT_ACTION[0]], "values": [float(np.float32(CONSTANT_ACTION[1]))]}
    assert run.contract["state_normalizer"]["constant"] == {"channels": [CONSTANT_STATE[0]], "values": [CONSTANT_STATE[1]]}
    sample = run.transform(run.train_windows[0])
    assert np.isfinite(sample.actions.numpy()).all() and (sample.actions[:, CONSTANT_ACTION[0]] == 0).all()
    assert sample.state[CONSTANT_STATE[0]] == 0


@pytest.fixture
def lying_root(const_root, tmp_path) -> Path:
    """The stats still say min == max at action channel 2, but one frame of the data moves there."""
    close_all()
    root = Path(shutil.copytree(const_root, tmp_path / "ds"))
    table = pq.read_table(root / DATA0)
    cols = table.to_pydict()
    cols["action"][5] = [*cols["action"][5][:2], 0.9]
    pq.write_table(pa.Table.from_pydict(cols, schema=table.schema), root / DATA0)
    return root


def test_zero_range_where_the_data_varies_is_an_error(lying_root):
    report = diagnose(lying_root, DatasetExpectation(chunk_length=8))
    assert not report.ok
    zero = [f for f in report.errors if f.code == "stats_zero_range"]
    assert zero and 'stats["action"]["max"][2]' in zero[0].where and "varies" in zero[0].problem, report.format()
    assert "stats_data_mismatch" in report.codes("error")  # 0.9 is also outside [min, max]
    assert "constant_channel" not in {f.code for f in report.warnings if "'action'" in f.problem}
    with pytest.raises(DataError) as err:
        build_run_data(_cfg(lying_root))
    text = str(err.value)
    assert 'stats.json: stats["action"]["max"][2]' in text and "file-000.parquet" in text and "0.899999" in text


def test_values_outside_stats_range_are_an_error(const_root, tmp_path):
    close_all()
    root = Path(shutil.copytree(const_root, tmp_path / "ds"))
    stats = json.loads((root / "meta/stats.json").read_text())
    stats["observation.state"]["max"][0] -= 0.05  # stale stats: the data reaches past max
    (root / "meta/stats.json").write_text(json.dumps(stats))
    report = diagnose(root, DatasetExpectation(chunk_length=8))
    bad = [f for f in report.errors if f.code == "stats_data_mismatch"]
    assert bad and 'stats["observation.state"]' in bad[0].where and "[0]" in bad[0].where, report.format()
