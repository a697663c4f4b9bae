"""recipes/metaworld_mt10.toml: its usage header records, trains and evaluates as written, with only the sizes
shrunk for a CPU (2 of the 10 tasks, 1 episode per task instead of 50, 1 training step, 1 evaluation episode of
2 steps). Every MT10 task records and evaluates in tests/sim/test_mt10.py."""

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO
from tests.recipes.test_usage_headers import cli_commands
from wamkit.config import load_experiment

RECIPE = "recipes/metaworld_mt10.toml"
CPU_TRAIN = ["--set", "trainer.max_iter=1", "--set", "checkpoint.save_iter=1", "--set", "trainer.samples_per_step=2",
             "--set", "parallel.compile=false", "--set", "data.num_workers=0", "--set", "trainer.val_every=0",
             "--set", "data.val_fraction=0.0", "--set", "trainer.progress_bar=false", "--device", "cpu"]
CPU_EVAL = ["--episodes", "1", "--max-steps", "2", "--num-steps", "1", "--device", "cpu"]  # argparse: the last value wins
TWO_TASKS = "metaworld/reach-v3,metaworld/peg-insert-side-v3"  # in place of the suite (each task costs ~10 s a command)


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_header_commands_agree_with_the_recipe():
    cfg = load_experiment(REPO / RECIPE)
    commands = [argv for _, argv in cli_commands(RECIPE)]
    assert [a[:2] for a in commands] == [["sim", "record"], ["train", RECIPE], ["eval", "sim"], ["eval", "sim"]]
    record, _, *evals = commands
    assert record[2] == "metaworld/mt10" and _value(record, "--out") == cfg.data.path
    assert int(_value(record, "--episodes")) == 50
    for argv in evals:
        assert argv[2] == f"runs/{cfg.job.name}" and argv[3] == "metaworld/mt10"
        assert _value(argv, "--seed") != _value(record, "--seed")  # held-out placements
        assert int(_value(argv, "--horizon")) <= cfg.data.chunk_length
    assert "--all-checkpoints" in evals[1]
    assert "MEASURED on one H200 (issue 26" in (REPO / RECIPE).read_text()  # the header says what the GPU run reached


def test_header_runs_as_written_on_a_cpu_with_shrunk_sizes(tmp_path):
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WAMKIT_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")]))
    outputs = []
    for _, argv in cli_commands(RECIPE):
        if argv[0] == "sim":
            argv = [*argv[:argv.index("--episodes") + 1], "1", *argv[argv.index("--episodes") + 2:]]
        argv = [TWO_TASKS if a == "metaworld/mt10" else a for a in argv]
        argv = argv + (CPU_TRAIN if argv[0] == "train" else CPU_EVAL if argv[0] == "eval" else [])
        proc = subprocess.run([sys.executable, "-m", "wamkit.cli", *argv], cwd=tmp_path, env=env, capture_output=True,
                              text=True)
        assert proc.returncode == 0, f"wamkit {' '.join(argv)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        outputs.append(proc.stdout)
    assert "2/2 expert episodes succeeded" in outputs[0]
    assert "average of 2 tasks: success " in outputs[2]
    assert (tmp_path / "eval" / "mt10" / "metaworld_peg-insert-side-v3" / "report.md").is_file()
    assert (tmp_path / "eval" / "mt10_curve" / "success_vs_step.png").stat().st_size > 0
    assert Path(tmp_path / "runs" / "metaworld_mt10" / "checkpoints" / "iter_000000001").is_dir()
