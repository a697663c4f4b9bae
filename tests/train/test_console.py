"""What a one-process training run prints: the validation loss whenever it is computed, and none of
DCP's one-process warnings (wamkit.train.dcp_quiet), which a user cannot act on."""

import re
import warnings
from pathlib import Path

import torch

from wamkit.cli import main
from wamkit.sim.schema_synth import write_schema_dataset
from wamkit.train import dcp_quiet

TINY_G1 = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny" / "g1_simple.toml")


def test_val_loss_is_printed_and_dcp_stays_quiet(tmp_path, capsys):
    data = write_schema_dataset("g1_simple", tmp_path / "data", 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["train", TINY_G1, "--set", f"data.path={str(data)!r}", "--set", f"job.output_root={str(tmp_path)!r}",
                     "--set", "trainer.max_iter=2", "--set", "trainer.val_every=2", "--set", "checkpoint.save_iter=2"])
    assert code == 0
    out = capsys.readouterr().out
    assert re.search(r"\[wamkit\] step 2: val_loss [0-9.]+ \(action [0-9.]+, video [0-9.]+\) \(held-out episodes\)", out)
    # what the wait for the first step was made of, milestone by milestone
    startup = next(line for line in out.splitlines() if line.startswith("[wamkit] startup: "))
    spans = [part.rsplit(" ", 2) for part in startup.removeprefix("[wamkit] startup: ").split(", ")]
    assert [name for name, _, _ in spans] == ["imports and process setup", "distributed init", "data", "tokenizers", "model",
                                              "optimizer/EMA/resume/loader", "first step"]
    assert all(unit == "s" and float(seconds) >= 0 for _, seconds, unit in spans)
    assert not [w for w in caught if "torch.distributed is disabled" in str(w.message)]


def test_only_the_one_process_warning_is_filtered(tmp_path):
    state = {"x": torch.arange(4.0)}
    with warnings.catch_warnings(record=True) as raw:
        warnings.simplefilter("always")
        torch.distributed.checkpoint.save(state, checkpoint_id=str(tmp_path / "raw"))
    if not torch.distributed.is_initialized():  # (a training run in this process may have left a group)
        assert any("torch.distributed is disabled" in str(w.message) for w in raw)  # what is filtered still exists
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        dcp_quiet.save(state, checkpoint_id=str(tmp_path / "quiet"))
        loaded = {"x": torch.zeros(4)}
        dcp_quiet.load(loaded, checkpoint_id=str(tmp_path / "quiet"))
        warnings.warn("another warning", UserWarning)
    assert [str(w.message) for w in quiet] == ["another warning"]
    assert torch.equal(loaded["x"], state["x"])
