"""LeRobot `image` features (use_videos=False: each frame a PNG embedded in the data parquet as
struct<bytes, path>) are cameras like videos; and a window's task is its first frame's task_index, so an
episode whose task changes halfway gives each window the task LeRobot gives that frame. The real LeRobot
writer's versions of both layouts are in tests/interop; these build them from the demo dataset, fast."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from wamkit.data import LeRobotV3Dataset, WindowDataset
from wamkit.data.doctor import DatasetExpectation, diagnose
from wamkit.data.video import close_all
from wamkit.errors import DataError


def png(frame: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return buf.getvalue()


def to_image_layout(root: Path) -> dict[int, np.ndarray]:
    """Embed every camera frame of `root` as PNG in its data parquet, mark the cameras `dtype: image`,
    drop videos/; returns the frames {episode: [L, H, W, 3]} of the first camera."""
    ds = LeRobotV3Dataset(root)
    cams, truth = ds.camera_keys, {}
    for path in sorted((root / "data").glob("*/*.parquet")):
        table = pq.read_table(path)
        eps, frames = table.column("episode_index").to_numpy(), table.column("frame_index").to_numpy()
        for cam in cams:
            decoded = {ep: ds.decode_frames(int(ep), cam, range(ds.episode_length(int(ep)))) for ep in set(eps.tolist())}
            if cam == cams[0]:
                truth.update(decoded)
            blobs = [{"bytes": png(decoded[e][f]), "path": f"frame-{f:06d}.png"} for e, f in zip(eps, frames)]
            table = table.append_column(cam, pa.array(blobs, pa.struct([("bytes", pa.binary()), ("path", pa.string())])))
        pq.write_table(table, path)
    info = json.loads((root / "meta" / "info.json").read_text())
    for cam in cams:
        info["features"][cam]["dtype"] = "image"
    (root / "meta" / "info.json").write_text(json.dumps(info))
    close_all()
    for mp4 in (root / "videos").rglob("*.mp4"):
        mp4.unlink()
    return truth


def test_image_features_read_as_cameras(demo_copy):
    truth = to_image_layout(demo_copy)
    ds = LeRobotV3Dataset(demo_copy)
    cam = ds.camera_keys[0]
    assert ds.features[cam]["dtype"] == "image" and ds.video_keys == []
    np.testing.assert_array_equal(ds.decode_frames(2, cam, [5, 0, 9]), truth[2][[5, 0, 9]])
    w = WindowDataset(ds, ds.episode_indices, chunk_length=8)[3]
    np.testing.assert_array_equal(w.video[0].numpy(), truth[w.episode_index][w.start:w.start + 9])
    report = diagnose(demo_copy, DatasetExpectation(chunk_length=8))
    assert not report.errors, report.format()


def test_image_column_without_bytes_is_an_error(demo_copy):
    to_image_layout(demo_copy)
    path = demo_copy / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    cam = LeRobotV3Dataset(demo_copy).camera_keys[0]
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    paths_only = pa.array([{"bytes": None, "path": "x.png"}] * len(table), struct)
    pq.write_table(table.set_column(table.column_names.index(cam), cam, paths_only), path)
    with pytest.raises(DataError, match="frames hold only a path, not their bytes") as err:
        LeRobotV3Dataset(demo_copy).decode_frames(0, cam, [0])
    assert str(path) in err.value.where and "embed the images" in err.value.fix


def test_window_task_is_its_first_frames_task(demo_copy):
    """Episode 0's second half is relabelled with another task, as LeRobot records a mid-episode change."""
    tasks = pq.read_table(demo_copy / "meta" / "tasks.parquet")
    new_index = max(tasks.column("task_index").to_pylist()) + 1
    pq.write_table(pa.table({"task_index": tasks.column("task_index").to_pylist() + [new_index],
                             "task": tasks.column("task").to_pylist() + ["put it back"]}), demo_copy / "meta" / "tasks.parquet")
    ds = LeRobotV3Dataset(demo_copy)
    half = ds.episode_length(0) // 2
    data = demo_copy / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(data)
    switch = (table.column("episode_index").to_numpy() == 0) & (table.column("frame_index").to_numpy() >= half)
    index = np.where(switch, new_index, table.column("task_index").to_numpy())
    pq.write_table(table.set_column(table.column_names.index("task_index"), "task_index", pa.array(index, pa.int64())), data)
    meta = demo_copy / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    rows = pq.read_table(meta).to_pylist()
    first = rows[0]["tasks"][0]
    rows[0]["tasks"] = ["put it back", first]  # LeRobot stores the set, in no particular order
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(meta)), meta)
    close_all()
    ds = LeRobotV3Dataset(demo_copy)
    assert ds.frame_task(0, 0) == first and ds.frame_task(0, half) == "put it back"
    wd = WindowDataset(ds, [0], chunk_length=4)
    by_start = {int(s): wd[i].task for i, (_, s) in enumerate(wd.index)}
    assert by_start[0] == by_start[half - 1] == first and by_start[half] == "put it back"
