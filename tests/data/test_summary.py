"""`wamkit data doctor` first says what it read (wamkit.data.summary), from the metadata alone."""

from wamkit.data.doctor import doctor_main
from wamkit.data.summary import dataset_summary
from wamkit.sim.schema_synth import write_schema_dataset


def test_the_doctor_prints_a_summary_of_the_dataset(tmp_path, capsys):
    root = write_schema_dataset("g1_simple", tmp_path / "g1", 2)
    assert doctor_main(str(root)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("dataset: 2 episodes, ") and " at 50 fps), robot unitree_g1, v3.0" in out[0]
    assert out[1] == "cameras (HxW px): observation.images.ego_view 64x96"
    assert "observation.state 32-D float32" in out[2] and "action 36-D float32" in out[2]
    assert out[3].startswith("tasks (") and "'pick up the bottle'" in out[3]
    assert out[4].startswith("dataset doctor: ")


def test_no_summary_of_an_unreadable_dataset(tmp_path):
    assert dataset_summary(tmp_path) == []
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "info.json").write_text("{not json")
    assert dataset_summary(tmp_path) == []
