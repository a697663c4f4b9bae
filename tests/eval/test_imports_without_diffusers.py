"""The closed loop runs other frameworks' policies (benchmarks/policy_quality.py: LeRobot's ACT and DP) on hosts
that carry no diffusers; wamkit.eval and the data a run trains on (wamkit.train.datasets) must import and build
there, and wamkit's own policy load only when asked (the nineteenth session's MT10 PHASE=2 died at this import)."""

import subprocess
import sys

from tests.helpers import DEMO_RECIPE, REPO


def test_eval_imports_with_diffusers_unavailable_and_says_so_when_a_wamkit_policy_is_loaded():
    code = (
        "import sys; sys.modules['diffusers'] = None\n"
        "import wamkit.eval, wamkit.eval.suite, wamkit.eval.lerobot_adapter\n"
        "from wamkit.config import load_experiment\n"
        "from wamkit.train.datasets import build_run_data\n"
        f"data = build_run_data(load_experiment({str(DEMO_RECIPE)!r}))\n"
        "print('windows', len(data.train_windows) > 0)\n"
        "from wamkit.eval import load_policy\n"
        "try:\n"
        "    load_policy('/nonexistent/run')\n"
        "except ImportError as exc:\n"
        "    print('needs', exc.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["windows", "True", "needs", "diffusers"]
