"""README command 1 ends by running the trained demo policy in its simulator: scripts/demo.sh's evaluation
lines find the run the demo recipe writes, evaluate it in the tasks of the bundled data on unrecorded seeds,
and print the success rate and a rollout video's path."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import wamkit.sim  # noqa: F401 - picks the headless GL backend before metaworld imports mujoco
from tests.helpers import DEMO_RECIPE, REPO
from wamkit.config import load_experiment
from wamkit.data import LeRobotV3Dataset
from wamkit.sim import expand_env_names, get_spec
from wamkit.train.trainer import Trainer

DEMO = REPO / "scripts" / "demo.sh"


def _eval_lines() -> list[str]:
    """The script's lines from the one after `wamkit train` to the end (the evaluation)."""
    lines = [line.strip() for line in DEMO.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return lines[next(i for i, line in enumerate(lines) if line.startswith("wamkit train")) + 1:]


def test_demo_evaluates_the_run_it_trained_in_the_tasks_of_its_data_on_new_seeds():
    cfg = load_experiment(DEMO_RECIPE)
    lines = _eval_lines()
    argv = shlex.split(next(line for line in lines if line.startswith("wamkit eval sim")))
    assert any(line.startswith('RUN="$(python -m wamkit.config.run_dir recipes/demo_tiny.toml "$@")"') for line in lines)
    assert argv[3] == "$RUN"
    data = REPO / cfg.data.path
    assert {get_spec(n).task for n in expand_env_names(argv[4])} == set(LeRobotV3Dataset(data).tasks.values())
    recorded = json.loads((data / "meta" / "wamkit_recording.json").read_text())["seed"]
    assert int(argv[argv.index("--seed") + 1]) != recorded


def test_demo_evaluation_lines_print_the_success_rate_and_a_video(tmp_path):
    """The demo's arguments rename the run (job.name): the evaluation follows them to the run trained."""
    cfg = load_experiment(DEMO_RECIPE)
    overrides = {"job.output_root": f'"{tmp_path}"', "data.path": f'"{REPO / cfg.data.path}"', "job.name": '"renamed"',
                 "trainer.max_iter": "1", "checkpoint.save_iter": "1", "trainer.val_every": "0",
                 "trainer.progress_bar": "false"}
    Trainer(load_experiment(DEMO_RECIPE, [f"{k}={v}" for k, v in overrides.items()])).train()
    script = "set -euo pipefail\n" + "\n".join(_eval_lines()) + " --max-steps 2 --num-steps 1 --device cpu\n"
    env = {**os.environ, "WAMKIT_OUTPUT_ROOT": str(tmp_path)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # the venv's `wamkit`
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH", "")]))
    demo_args = ["--set", 'job.name="renamed"', "--device", "cpu"]  # what `scripts/demo.sh ARGS` passes to train
    proc = subprocess.run(["bash", "-c", script, "demo.sh", *demo_args], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    tasks = len(set(LeRobotV3Dataset(REPO / cfg.data.path).tasks.values()))
    assert any(line.startswith(f"average of {tasks} tasks: success ") for line in lines), proc.stdout
    video = Path(next(line for line in lines if line.startswith("rollout video: ")).split(": ", 1)[1])
    assert video.is_file() and tmp_path / "renamed" / "eval_sim" in video.parents
