"""The closed loop runs other frameworks' policies (benchmarks/policy_quality.py: LeRobot's ACT and DP) on hosts
that carry no diffusers; wamkit.eval must import there and load wamkit's own policy only when asked (the
nineteenth session's MT10 PHASE=2 died at this import)."""

import subprocess
import sys


def test_eval_imports_with_diffusers_unavailable_and_says_so_when_a_wamkit_policy_is_loaded():
    code = (
        "import sys; sys.modules['diffusers'] = None\n"
        "import wamkit.eval, wamkit.eval.suite, wamkit.eval.lerobot_adapter\n"
        "from wamkit.eval import load_policy\n"
        "try:\n"
        "    load_policy('/nonexistent/run')\n"
        "except ImportError as exc:\n"
        "    print('needs', exc.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "needs diffusers"
