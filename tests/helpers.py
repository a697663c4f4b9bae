"""Shared test helpers: the demo recipe, overrides for short CPU runs, a CLI runner, and benchmark scripts as modules."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO_RECIPE = REPO / "recipes" / "demo_tiny.toml"


def load_benchmark_script(monkeypatch, name: str):
    """benchmarks/<name>.py imported as the module `name`, registered in sys.modules for the test's length (its
    dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def quick_overrides(demo_root: Path, output_root: Path, name: str, max_iter: int, save_iter: int) -> list[str]:
    pairs = {
        "job.name": name, "job.output_root": str(output_root), "data.path": str(demo_root),
        "data.generate_demo": "false", "trainer.max_iter": max_iter, "checkpoint.save_iter": save_iter,
        "trainer.samples_per_step": 4, "trainer.val_every": 0, "trainer.progress_bar": "false",
        "scheduler.warm_up_steps": "[2]",
    }
    out = []
    for key, value in pairs.items():
        value = f'"{value}"' if isinstance(value, str) and not value.startswith("[") and value not in ("true", "false") else value
        out += ["--set", f"{key}={value}"]
    return out


def train_in_process(args: list[str]) -> dict:
    """`wamkit train ARGS` (a recipe, then --set pairs) in this process, for the one-process reference runs
    distributed tests compare against: what `_train` in wamkit.cli does, without a new interpreter."""
    from wamkit.config import load_experiment
    from wamkit.train.trainer import Trainer

    recipe, rest = args[0], args[1:]
    return Trainer(load_experiment(recipe, [a for a in rest if a != "--set"]), device="auto").train()


def run_cli(args: list[str], env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "wamkit.cli", *args], capture_output=True, text=True, env=full_env, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"wamkit {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_torchrun(args: list[str], nproc: int = 2) -> subprocess.CompletedProcess:
    """`wamkit ARGS` under torchrun with `nproc` CPU (gloo) processes, one thread each."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "wamkit.cli", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    return proc


# The velocity action head: two of its noise draws are two plans, which real-time chunking's steering
# must reconcile (the demo recipe's x0 head samples close to one conditional-mean chunk whatever the noise).
VELOCITY_HEAD = ('diffusion.action_prediction="velocity"', "diffusion.shift=0.0")


def train_tiny_run(tmp: Path, name: str = "tiny_run", extra=()) -> Path:
    """Train the demo recipe 4 steps in-process on a generated 2-D reach dataset; the run dir."""
    from wamkit.config import load_experiment
    from wamkit.data import write_demo_dataset
    from wamkit.train.trainer import Trainer

    root = tmp / "reach"
    if not root.exists():
        write_demo_dataset(root, num_episodes=8)
    overrides = {
        "job.name": f'"{name}"', "job.output_root": f'"{tmp}"', "data.path": f'"{root}"',
        "trainer.max_iter": "4", "checkpoint.save_iter": "4", "trainer.samples_per_step": "2",
        "trainer.progress_bar": "false", "trainer.val_every": "0", "scheduler.warm_up_steps": "[1]",
    }
    Trainer(load_experiment(DEMO_RECIPE, [f"{k}={v}" for k, v in overrides.items()] + list(extra))).train()
    return tmp / name


CONSTANT_ACTION = (2, 0.3)  # (channel, value): the demo's grip, never used (0.3 is not exact in float32)
CONSTANT_STATE = (3, -0.125)  # vy, a "fixed joint"


def with_constant_channels(root: Path, action=CONSTANT_ACTION, state=CONSTANT_STATE) -> Path:
    """Make one action and one state channel of a demo dataset constant in every frame and recompute
    meta/stats.json (min == max there, as LeRobot's own writer records such channels)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wamkit.data.stats import write_stats

    for path in sorted((root / "data").glob("**/*.parquet")):
        table = pq.read_table(path)
        cols = table.to_pydict()
        for key, (c, v) in (("action", action), ("observation.state", state)):
            cols[key] = [row[:c] + [v] + row[c + 1:] for row in cols[key]]
        pq.write_table(pa.Table.from_pydict(cols, schema=table.schema), path)
    write_stats(root, overwrite=True)
    return root
