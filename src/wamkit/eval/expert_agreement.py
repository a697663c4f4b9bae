"""How far a policy's executed actions are from what the simulator's scripted expert would do in the same
states: the policy's own states along its closed loop, not the recording's (`wamkit eval sim --expert-trace`).

A success rate says that a task fails; this says which action dimension goes wrong where. The nineteenth
session's traces showed an MT10 policy driving the gripper's x towards the same place whatever the drawer's
or button's placement (the expert asked for +-1 in x, the policy for ~0): it does not read the object's
place from the image. Per dimension, over every executed step of a task's episodes (and over the failed
episodes alone): the mean absolute difference, and the share of steps where the expert moves firmly
(|a| >= FIRM of the half range) in which the policy moves the same way."""

from __future__ import annotations

import numpy as np

FIRM = 0.2  # of the half range: the expert clearly wants this dimension to move


def agreement(executed: list[np.ndarray], expert: list[np.ndarray], failed: list[bool],
              names: tuple[str, ...], bounds: tuple[tuple[float, ...], tuple[float, ...]]) -> dict:
    """executed[i], expert[i]: [steps_i, D] of episode i; failed[i]: whether it failed. A JSON-ready summary."""
    low, high = (np.asarray(b, np.float64) for b in bounds)
    centre, half = (high + low) / 2, np.maximum((high - low) / 2, 1e-12)

    def summary(episodes: list[int]) -> dict | None:
        rows = [i for i in episodes if len(executed[i])]
        if not rows:
            return None
        a = (np.concatenate([executed[i] for i in rows]) - centre) / half
        e = (np.concatenate([expert[i] for i in rows]) - centre) / half
        firm = np.abs(e) >= FIRM
        same = (np.sign(a) == np.sign(e)) & firm
        share = [float(same[:, d].sum() / firm[:, d].sum()) if firm[:, d].any() else None for d in range(a.shape[1])]
        return {"steps": int(len(a)), "mean_abs_diff": np.abs(a - e).mean(0).round(4).tolist(), "same_direction": share}

    everything = summary(list(range(len(executed))))
    return {"names": list(names), "scale": "half range of the action bounds", "firm": FIRM,
            "all": everything, "failed": summary([i for i, f in enumerate(failed) if f])}


def agreement_line(result: dict) -> str:
    """One report line: per dimension, the share of firm expert moves the policy followed, and |diff|."""
    parts = []
    for d, name in enumerate(result["names"]):
        share = result["all"]["same_direction"][d] if result["all"] else None
        diff = result["all"]["mean_abs_diff"][d] if result["all"] else None
        failed = result["failed"]["same_direction"][d] if result["failed"] else None
        parts.append(f"{name} {percent(share)} (failed episodes {percent(failed)}), |diff| {diff if diff is not None else '-'}")
    return "; ".join(parts)


def percent(x) -> str:
    """A share as a whole percentage, "-" where there was nothing to share."""
    return "-" if x is None else f"{100 * x:.0f}%"
