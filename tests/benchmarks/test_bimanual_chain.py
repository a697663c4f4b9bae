"""benchmarks/bimanual_chain.py's own logic, cheaply: the handoff table it binds and the stage-3 schedule
check it asserts. The whole chain runs on the CPU with `--phase smoke` (minutes; benchmarks/RESULTS.md)."""

import pytest

from tests.helpers import load_benchmark_script


@pytest.fixture
def chain_module(monkeypatch):
    return load_benchmark_script(monkeypatch, "bimanual_chain")


def _records(n: int, flip: int | None = None) -> list[dict]:
    out, student, critic = [], 0, 0
    for step in range(1, n + 1):
        role = "student" if (step - 1) % 6 == 5 else "critic"
        if step == flip:
            role = "student" if role == "critic" else "critic"
        student, critic = student + (role == "student"), critic + (role == "critic")
        out.append({"step": step, "role": role, "student_updates": student, "critic_updates": critic})
    return out


def test_stage3_schedule_is_checked_step_by_step(chain_module):
    marker = {"student_updates": 2, "critic_updates": 10}
    assert chain_module.check_schedule(_records(12), marker) == marker
    with pytest.raises(AssertionError, match="step 3: student updated"):
        chain_module.check_schedule(_records(12, flip=3), marker)
    with pytest.raises(AssertionError, match="log every step"):
        chain_module.check_schedule(_records(12)[1:], marker)


def test_handoff_follows_seed_002_table(chain_module, tmp_path, monkeypatch):
    chain = chain_module.Chain(tmp_path, tmp_path / "out", "smoke")
    monkeypatch.setattr(chain, "iteration", lambda stage: tmp_path / f"s{stage}")
    env = {stage: chain.handoff_env(stage) for stage in range(4)}
    assert env[0]["COSMOS3_NANO_DIR"] == "" and "STAGE0_CHECKPOINT" not in env[0]
    assert env[1]["STAGE0_CHECKPOINT"] == str(tmp_path / "s0")
    assert env[2]["STAGE1_CHECKPOINT"] == str(tmp_path / "s1")  # student init and frozen teacher
    assert (env[3]["STAGE2_CHECKPOINT"], env[3]["STAGE0_CHECKPOINT"]) == (str(tmp_path / "s2"), str(tmp_path / "s0"))
    assert all(e["BIMANUAL_BUNDLE"] == str(chain.bundle) for e in env.values())
    with pytest.raises(SystemExit, match="no completed checkpoint"):
        chain_module.Chain(tmp_path, tmp_path / "out", "smoke").handoff_env(1)


def test_a_stage_completed_but_never_checked_is_checked_not_retrained(chain_module, tmp_path, monkeypatch):
    """A phase deadline can fall between a stage's last save and its checks: the next call must check
    it (once), never skip it as if checked, and never train it again."""
    chain = chain_module.Chain(tmp_path, tmp_path / "out", "smoke")
    checked, launched = [], []
    monkeypatch.setattr(chain_module, "complete", lambda chain, stage: True)
    monkeypatch.setattr(chain, "iteration", lambda stage: tmp_path / f"s{stage}")
    monkeypatch.setattr(chain_module, "run", lambda *a, **k: launched.append(a))

    def check(chain, stage):
        checked.append(stage)
        chain_module.accepted_path(chain, stage).write_text('{"stage": 3, "steps": 360}')
        return {"stage": 3, "steps": 360}

    monkeypatch.setattr(chain_module, "check_stage", check)
    assert chain_module.train_stage(chain, 3) == {"stage": 3, "steps": 360} and checked == [3]
    assert chain_module.train_stage(chain, 3) == {"stage": 3, "steps": 360} and checked == [3]  # kept from the first check
    assert launched == []
