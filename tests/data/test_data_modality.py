"""meta/modality.json (GR00T style): named slices select and order sub-vectors; bad files are errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from wamkit.data.modality import ModalitySelector
from wamkit.errors import DataError

SPEC = {"state": {"xy": {"start": 0, "end": 2}, "vel": {"start": 2, "end": 4}},
        "action": {"move": {"start": 0, "end": 2}, "grip": {"start": 2, "end": 3}}}


def _write(tmp_path, spec, info_dims=None):
    meta = tmp_path / "meta"
    meta.mkdir(exist_ok=True)
    (meta / "modality.json").write_text(json.dumps(spec))
    if info_dims:
        (meta / "info.json").write_text(json.dumps({"features": {k: {"dtype": "float32", "shape": [d]}
                                                                 for k, d in info_dims.items()}}))
    return meta / "modality.json"


def test_select_and_order(tmp_path):
    path = _write(tmp_path, SPEC, {"observation.state": 4, "action": 3})
    sel = ModalitySelector.from_file(path, "state", ["vel", "xy"])
    assert sel.indices.tolist() == [2, 3, 0, 1] and sel.dim == 4 and sel.width == 4
    x = np.arange(8.0).reshape(2, 4)
    np.testing.assert_array_equal(sel.select(x), x[:, [2, 3, 0, 1]])
    assert torch.equal(sel.select(torch.as_tensor(x)), torch.as_tensor(x[:, [2, 3, 0, 1]]))
    whole = ModalitySelector.from_file(tmp_path, "action")  # dataset root; all names ordered by start
    assert whole.names == ("move", "grip") and whole.indices.tolist() == [0, 1, 2]
    assert ModalitySelector.from_file(path, "action", ["grip"]).indices.tolist() == [2]


@pytest.mark.parametrize("spec,group,names,match", [
    ({"state": {"a": {"start": 0, "end": 3}, "b": {"start": 2, "end": 4}}}, "state", None, "overlap"),
    ({"state": {"a": {"start": 0, "end": 5}}}, "state", None, "out of range"),
    ({"state": {"a": {"start": 2, "end": 2}}}, "state", None, "empty"),
    ({"state": {"a": {"start": -1, "end": 2}}}, "state", None, "empty or negative"),
    ({"state": {"a": {"start": 0.5, "end": 2}}}, "state", None, "not integers"),
    ({"state": {"a": {"start": 0}}}, "state", None, "start' and 'end'"),
    (SPEC, "state", ["xy", "arm"], "unknown names \\['arm'\\]"),
    (SPEC, "video", None, "group is missing"),
    (SPEC, "state", ["xy", "xy"], "repeated"),
])
def test_errors(tmp_path, spec, group, names, match):
    path = _write(tmp_path, spec, {"observation.state": 4, "action": 3})
    with pytest.raises(DataError, match=match) as info:
        ModalitySelector.from_file(path, group, names)
    assert "modality.json" in str(info.value)


def test_missing_and_malformed_file(tmp_path):
    with pytest.raises(DataError, match="missing"):
        ModalitySelector.from_file(tmp_path, "state")
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "modality.json").write_text("{oops")
    with pytest.raises(DataError, match="invalid JSON"):
        ModalitySelector.from_file(tmp_path, "state")


def test_explicit_dim_and_select_width_check():
    sel = ModalitySelector.from_dict(SPEC, "state", ["vel"], dim=4)
    with pytest.raises(DataError, match="channels"):
        sel.select(np.zeros((2, 3)))
    with pytest.raises(DataError, match="out of range"):
        ModalitySelector.from_dict(SPEC, "state", dim=3)
