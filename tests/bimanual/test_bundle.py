"""The local sim-bimanual bundle: writer, validator (good and broken bundles), materialize, dataset."""

import json
import shutil

import numpy as np
import pytest
import torch

from wamkit.bimanual import ACTION_DIM, ACTION_NAMES, PADDED_DIM, BundleTransform, BundleWindows, open_bundle, validate_bundle, validate_main, write_synthetic_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return write_synthetic_bundle(tmp_path_factory.mktemp("bimanual") / "bundle", samples=8)


def test_schema_has_59_named_values_padded_to_64():
    assert ACTION_DIM == 59 and PADDED_DIM == 64 and len(set(ACTION_NAMES)) == 59
    assert ACTION_NAMES[0] == "left.ee_pos_x" and ACTION_NAMES[24] == "right.ee_pos_x" and ACTION_NAMES[-1] == "body.head_tilt"


def test_synthetic_bundle_validates(bundle):
    report = validate_bundle(bundle)
    assert report["passed"] is True and report["problems"] == [] and report["materialized"] is False
    assert report["splits"]["train"] > 0 and report["splits"]["val"] > 0
    assert validate_main(str(bundle)) == 0


def _broken(bundle, tmp_path, edit):
    copy = tmp_path / "broken"
    shutil.copytree(bundle, copy)
    manifest, samples = json.loads((copy / "manifest.json").read_text()), json.loads((copy / "samples.json").read_text())
    edit(copy, manifest, samples)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    (copy / "samples.json").write_text(json.dumps(samples))
    report = validate_bundle(copy)
    assert report["passed"] is False
    return report


def _checks(report):
    return {p["check"] for p in report["problems"]}


def test_missing_caption(bundle, tmp_path):
    report = _broken(bundle, tmp_path, lambda root, m, s: s[0].update(caption="  "))
    assert _checks(report) == {"caption"} and report["problems"][0]["where"] == "samples.json[0].caption"


def test_episode_in_two_splits(bundle, tmp_path):
    def edit(root, m, s):
        ep = s[0]["episode_id"]
        other = next(r for r in s[1:] if r["episode_id"] == ep)
        other["split"] = "val" if s[0]["split"] == "train" else "train"
    report = _broken(bundle, tmp_path, edit)
    assert "splits" in _checks(report) and "both" in report["problems"][0]["problem"]


def test_bad_stats(bundle, tmp_path):
    report = _broken(bundle, tmp_path, lambda root, m, s: m["stats"].update(scale=[1.0] * 58))
    assert _checks(report) == {"stats"}
    report = _broken(bundle, tmp_path / "b", lambda root, m, s: m["stats"]["scale"].__setitem__(3, 0.0))
    assert report["problems"][0]["where"] == "manifest.json:stats.scale[3]"


def test_media_shorter_than_frame_range(bundle, tmp_path):
    def edit(root, m, s):
        s[0]["frame_start"] += 16  # episodes have 17 frames
        s[0]["frame_end"] += 16
    report = _broken(bundle, tmp_path, edit)
    assert "media" in _checks(report)


def test_missing_media_and_bad_action_shape(bundle, tmp_path):
    def edit(root, m, s):
        (root / s[0]["media"]).unlink()
        np.save(root / s[-1]["actions"], np.zeros((16, 12), np.float32))
    report = _broken(bundle, tmp_path, edit)
    assert {"files", "schema"} <= _checks(report)


def test_materialize_stage0_and_stage1(bundle):
    r0 = validate_bundle(bundle, materialize_stage=0)
    assert r0["passed"] and r0["materialized"]
    m0 = r0["materialize"]
    assert m0["attention"] == "bidirectional" and m0["chunks"] == 1 and m0["batch_samples"] == 1
    assert m0["sample"]["video"] == {"shape": [9, 32, 32, 3], "dtype": "uint8"}
    assert m0["sample"]["actions"] == {"shape": [8, 64], "dtype": "float32"}
    assert m0["sample"]["action_mask"] == {"shape": [64], "dtype": "bool"} and m0["sample"]["valid_action_values"] == 48
    assert m0["packed"]["action_tokens"][0]["shape"] == [8, 64] and m0["noisy_video_frames"] == [1, 2]
    r1 = validate_bundle(bundle, materialize_stage=1)
    m1 = r1["materialize"]
    assert r1["passed"] and m1["attention"] == "block_causal" and m1["chunks"] == 3 and len(m1["noisy_video_frames"]) == 1


def test_dataset_normalizes_with_pinned_asinh_stats(bundle):
    b = open_bundle(bundle)
    windows = BundleWindows(b, "train")
    window = windows[0]
    assert window.video.dtype == torch.uint8 and tuple(window.video.shape) == (9, 32, 32, 3)
    sample = BundleTransform(b)(window)
    scale = torch.tensor(b.manifest["stats"]["scale"], dtype=torch.float32)
    expected = torch.asinh(window.actions / scale) * window.valid
    assert torch.allclose(sample.actions[:, :59], expected) and (sample.actions[:, 59:] == 0).all()
    assert sample.action_mask[:48].all() and not sample.action_mask[48:].any() and sample.state is None and sample.task
