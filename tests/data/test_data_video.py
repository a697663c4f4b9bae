"""Decoder reuse: a request that starts ahead of where the file's decoding stopped continues decoding
instead of seeking, and gets exactly the frames a fresh reader (seek + decode) gets; H.264 and AV1."""

from __future__ import annotations

import av
import numpy as np
import pytest

from wamkit.data import LeRobotV3Dataset, write_demo_dataset
from wamkit.data import video
from wamkit.data.synth import CAMERA_KEY
from wamkit.data.video import close_all

from .framecheck import check_frames


@pytest.fixture(scope="module")
def av1_ds(tmp_path_factory) -> LeRobotV3Dataset:
    root = write_demo_dataset(tmp_path_factory.mktemp("av1") / "demo", num_episodes=3, episodes_per_file=2, seed=1,
                              codec="libsvtav1")
    return LeRobotV3Dataset(root)


@pytest.fixture(params=["h264", "av1"])
def ds(request, demo_ds, av1_ds) -> LeRobotV3Dataset:
    close_all()
    yield demo_ds if request.param == "h264" else av1_ds
    close_all()


def _fresh(ds: LeRobotV3Dataset, ep: int, idx) -> np.ndarray:
    """What a newly opened reader returns (seek to the last keyframe at or before, decode forward)."""
    close_all()
    frames = ds.decode_frames(ep, CAMERA_KEY, idx)
    close_all()
    return frames


def _seeks(ds: LeRobotV3Dataset, ep: int) -> int:
    return video._cache[ds.video_path(ep, CAMERA_KEY)].seeks


def test_forward_requests_continue_and_equal_a_fresh_seek(ds):
    ep = 1  # the second episode of file-000: starts at a non-zero from_timestamp
    length = ds.episode_length(ep)
    requests = [range(0, 5), range(5, 9), range(9, 12), range(12, length)]  # each starts where the last ended
    expected = [_fresh(ds, ep, list(r)) for r in requests]
    got = []
    for r in requests:
        got.append(ds.decode_frames(ep, CAMERA_KEY, list(r)))
        assert _seeks(ds, ep) == 1, f"request {list(r)[:2]}... seeked instead of decoding on"
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


def test_backward_and_far_requests_seek_and_equal_a_fresh_seek(ds):
    ep = 1
    last = ds.episode_length(ep) - 1
    requests = [[6, 7, 8], [1, 2, 3], [last - 2, last - 1, last], [0, last, 4]]
    expected = [_fresh(ds, ep, r) for r in requests]
    got = [ds.decode_frames(ep, CAMERA_KEY, r) for r in requests]
    assert _seeks(ds, ep) >= 3  # back to 1, back to 0 (the unordered request); the far one depends on keyframes
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


def test_continuing_across_episodes_of_one_file(demo_ds, demo_truth):
    """Episodes 0 and 1 share file-000: reading one after the other decodes on through the boundary."""
    close_all()
    first = demo_ds.decode_frames(0, CAMERA_KEY, range(demo_ds.episode_length(0)))
    second = demo_ds.decode_frames(1, CAMERA_KEY, range(demo_ds.episode_length(1)))
    assert demo_ds.video_path(0, CAMERA_KEY) == demo_ds.video_path(1, CAMERA_KEY) and _seeks(demo_ds, 1) == 1
    check_frames(first, demo_truth[0])
    check_frames(second, demo_truth[1])
    np.testing.assert_array_equal(second, _fresh(demo_ds, 1, range(demo_ds.episode_length(1))))


def test_decode_into_a_strided_buffer(ds):
    """`out` may be a column slice of a wider buffer (the side-by-side window layout)."""
    idx = [3, 4, 5, 6]
    expected = _fresh(ds, 0, idx)
    h, w = ds.frame_size(CAMERA_KEY)
    buffer = np.zeros((len(idx), h, 3 * w, 3), np.uint8)
    out = buffer[:, :, w:2 * w]
    assert ds.decode_frames(0, CAMERA_KEY, idx, out=out) is out
    np.testing.assert_array_equal(buffer[:, :, w:2 * w], expected)
    assert not buffer[:, :, :w].any() and not buffer[:, :, 2 * w:].any()


def test_repeated_times_convert_once_and_match(ds):
    idx = [2, 2, 5, 2]
    frames = ds.decode_frames(0, CAMERA_KEY, idx)
    np.testing.assert_array_equal(frames[0], frames[1])
    np.testing.assert_array_equal(frames[0], frames[3])
    assert np.abs(frames[2].astype(np.int16) - frames[0]).mean() > 0.5  # another frame, not an aliased buffer
    np.testing.assert_array_equal(frames, _fresh(ds, 0, idx))


def test_a_request_starting_on_a_keyframe_decodes_no_earlier_frame(ds):
    """The seek lands on the last keyframe at or before the first requested frame, not one GOP earlier."""
    path = ds.video_path(0, CAMERA_KEY)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        keys = [float(f.pts * stream.time_base) for f in container.decode(stream) if f.key_frame]
    start = float(ds._episode(0)[f"videos/{CAMERA_KEY}/from_timestamp"])
    first = next(round((t - start) * ds.fps) for t in keys if t > start)  # a later keyframe inside episode 0
    assert 0 < first <= ds.episode_length(0) - 4
    idx = list(range(first, first + 4))
    expected = _fresh(ds, 0, list(range(ds.episode_length(0))))[idx]
    frames = ds.decode_frames(0, CAMERA_KEY, idx)
    reader = video._cache[path]
    assert (reader.seeks, reader.decoded) == (1, 4)
    np.testing.assert_array_equal(frames, expected)
