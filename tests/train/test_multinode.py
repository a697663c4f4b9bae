"""Two "nodes" on one machine: two torchrun agents meeting at one c10d rendezvous (as two hosts of a
SLURM job do, docs/cluster.md), one gloo process each, HSDP with data_parallel_replicate_degree = 2.
The run equals the one-process run with the same global batch, and after a "node" is lost it resumes
on the one left (the DCP checkpoint reshards to world size 1) and goes on like the one-process run."""

import json
import os
import socket
import subprocess
import sys

import torch

from tests.helpers import DEMO_RECIPE, REPO, quick_overrides, run_cli, train_in_process

AGENT_TIMEOUT_S = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _losses(run_dir):
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def _two_node_run(args: list[str]) -> list[subprocess.CompletedProcess]:
    """Start both node agents at once, as `srun` does; neither knows its node rank in advance (the
    c10d rendezvous assigns them), which is the launch docs/cluster.md documents."""
    endpoint = f"127.0.0.1:{_free_port()}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
           f"--rdzv-endpoint={endpoint}", "--rdzv-id=wamkit-two-nodes", "--max-restarts=0", "-m", "wamkit.cli", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    agents = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    done = []
    for agent in agents:
        try:
            out, err = agent.communicate(timeout=AGENT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for other in agents:
                other.kill()
            raise
        done.append(subprocess.CompletedProcess(cmd, agent.returncode, out, err))
    for proc in done:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return done


def test_two_nodes_with_hsdp_match_one_process_and_resume_on_one_node(demo_root, tmp_path):
    hsdp = ["--set", "parallel.data_parallel_replicate_degree=2"]
    two = quick_overrides(demo_root, tmp_path, "nodes", 4, 2) + ["--set", "trainer.samples_per_step=2", *hsdp]
    one = quick_overrides(demo_root, tmp_path, "one", 4, 2) + ["--set", "trainer.samples_per_step=4"]
    agents = _two_node_run(["train", str(DEMO_RECIPE), *two])
    printed = "".join(a.stdout for a in agents)
    assert printed.count("world size 2, global batch 4") == 1  # rank 0 alone prints, on whichever agent it landed
    train_in_process([str(DEMO_RECIPE), *one])
    torch.testing.assert_close(torch.tensor(_losses(tmp_path / "nodes")), torch.tensor(_losses(tmp_path / "one")), rtol=1e-4, atol=1e-5)
    saved = json.loads((tmp_path / "nodes" / "checkpoints" / "iter_000000004" / "wamkit_complete.json").read_text())
    assert saved["world_size"] == 2

    # A node died: relaunch the run name on the node left, with the replicate degree of the nodes it
    # has and twice the gradient accumulation to keep the global batch of 4; the 2-rank HSDP
    # checkpoint reshards to one process, and the run goes on exactly like the one-process run.
    six = ["--set", "trainer.max_iter=6"]
    with_two_nodes = run_cli(["train", str(DEMO_RECIPE), *two, *six], check=False)
    assert with_two_nodes.returncode != 0 and "parallel.data_parallel_replicate_degree" in with_two_nodes.stderr
    one_node = ["--set", "parallel.data_parallel_replicate_degree=1", "--set", "trainer.grad_accum_iter=2"]
    resumed = run_cli(["train", str(DEMO_RECIPE), *two, *six, *one_node])
    assert "at step 4" in resumed.stdout and "world size 1, global batch 4" in resumed.stdout
    train_in_process([str(DEMO_RECIPE), *one, *six])
    losses = _losses(tmp_path / "nodes")
    assert len(losses) == 6
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(_losses(tmp_path / "one")), rtol=1e-4, atol=1e-5)
