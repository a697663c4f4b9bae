"""The robot state of an imagined rollout, which a forward-dynamics world model does not generate.

A policy that reads a state needs one at every imagined step. `recorded` feeds the expert's state at the
same time index: a policy that leans on it then acts as if the arm were where the expert's was, whatever
the imagined frames show, and the world model ranks policies by how they react to a trajectory they are
not on. `affine` advances the state with the policy's own actions instead: a least-squares model

    s[t+1] - s[t] = W [s[t], s[t] - s[t-1], a[t], a[t-1], 1]

fit on the dataset's transitions outside the evaluated episodes, rolled from each episode's recorded first
state (observed, like its first frame), every value clipped to the range the dataset recorded (an arm at
its workspace limit, a gripper fully open). The previous change and the previous action carry the momentum
and the lag of a controller that tracks its target over a few steps (on the bundled Meta-World recordings
they lift the R^2 of the per-step change from 0.59-0.90 to 0.975-0.996). End-effector-delta and absolute
joint-target actions fit it closely;
`fit_report` says how closely on the evaluated episodes (the R^2 of the per-step change, and the drift of
an open-loop roll of the recorded actions over the whole episode), so a poor fit shows in every report."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RIDGE = 1e-6  # relative to the features' scale: keeps constant (padded) state values solvable


def _features(states: np.ndarray, change: np.ndarray, actions: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """[N, 2S + 2A + 1]: the regressors of one step (state, its last change, action, the action before), N steps at once."""
    return np.concatenate([states, change, actions, previous, np.ones((len(states), 1))], axis=1)


def _delayed(rows: np.ndarray) -> np.ndarray:
    """rows[t-1] for every t of one episode, zero before its first (the arm starts at rest)."""
    return np.concatenate([np.zeros_like(rows[:1]), rows[:-1]])


def _episode_features(states: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """The regressors of every step but the last of one recorded episode."""
    change = np.concatenate([np.zeros_like(states[:1]), np.diff(states, axis=0)])
    return _features(states[:-1], change[:-1], actions[:-1], _delayed(actions)[:-1])


@dataclass
class AffineStateModel:
    weights: np.ndarray  # [2S + 2A + 1, S]
    low: np.ndarray  # [S]: the smallest value each state entry took in the fitted episodes
    high: np.ndarray  # [S]
    transitions: int  # how many steps it was fit on

    @classmethod
    def fit(cls, states: list[np.ndarray], actions: list[np.ndarray]) -> "AffineStateModel":
        """Least squares over every step of every episode (states[i] [L, S] and actions[i] [L, A] of one episode)."""
        xs, ys = [], []
        for s, a in zip(states, actions):
            if len(s) != len(a):
                raise ValueError(f"an episode has {len(s)} state rows and {len(a)} action rows; they must match")
            if len(s) < 2:
                continue
            xs.append(_episode_features(s, a))
            ys.append(s[1:] - s[:-1])
        if not xs:
            raise ValueError("no episode has two or more steps to fit the state model on")
        x, y = np.concatenate(xs), np.concatenate(ys)
        scale = max(float(np.mean(x * x)), 1e-12)
        gram = x.T @ x + RIDGE * scale * len(x) * np.eye(x.shape[1])
        weights = np.linalg.solve(gram, x.T @ y)
        every = np.concatenate(states)
        return cls(weights, every.min(0), every.max(0), len(x))

    def step(self, states: np.ndarray, change: np.ndarray, actions: np.ndarray, previous: np.ndarray) -> np.ndarray:
        """The next state [B, S] after actions [B, A] taken in states [B, S]; `change` is the states' last change,
        `previous` the actions one step earlier (zero at an episode's start)."""
        return self._advance(states, _features(states, change, actions, previous))

    def _advance(self, states: np.ndarray, features: np.ndarray) -> np.ndarray:
        """states + the predicted change, clipped to the fitted range."""
        return np.clip(states + features @ self.weights, self.low, self.high)

    def roll(self, first: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """[L, S]: the states an episode goes through from `first` [S] under its actions [L, A] (row t before a[t])."""
        track = StateTrack([np.asarray(first, dtype=np.float64)[None]], self)
        out = [track.now()[0]]
        for a in actions[:-1]:
            track.advance(a[None, None])
            out.append(track.now()[0])
        return np.stack(out)

    def fit_report(self, states: list[np.ndarray], actions: list[np.ndarray]) -> dict:
        """How well the model explains episodes it was not fit on: per state value the R^2 of the one-step change
        and the mean |error| at the end of an open-loop roll of the recorded actions, beside the value's range."""
        pred, true, drift = [], [], []
        for s, a in zip(states, actions):
            if len(s) < 2:
                continue
            pred.append(self._advance(s[:-1], _episode_features(s, a)) - s[:-1])
            true.append(s[1:] - s[:-1])
            drift.append(np.abs(self.roll(s[0], a)[-1] - s[-1]))
        if not pred:
            return {"episodes": 0}
        p, t = np.concatenate(pred), np.concatenate(true)
        variance = t.var(0)
        r2 = np.where(variance > 0, 1.0 - ((p - t) ** 2).mean(0) / np.where(variance > 0, variance, 1.0), np.nan)
        return {"episodes": len(drift), "fit_transitions": self.transitions, "step_change_r2": r2.tolist(),
                "final_drift": np.mean(drift, axis=0).tolist(), "range": (self.high - self.low).tolist()}


class StateTrack:
    """The state an imagined batch of episodes is in: recorded (`model` None) or advanced by `model` from each
    episode's recorded first state with the actions the policy took."""

    def __init__(self, recorded: list[np.ndarray], model: AffineStateModel | None = None):
        self.recorded, self.model, self.t = recorded, model, 0
        self.current = np.stack([r[0] for r in recorded]) if model is not None else None
        self.change = np.zeros_like(self.current) if model is not None else None  # the state's last change
        self.previous = None  # the actions of the step before (none before the first)

    def now(self) -> np.ndarray:
        """[B, S]: the state at the current step (a recorded one held at its episode's last past the end)."""
        if self.model is not None:
            return self.current
        return np.stack([r[min(self.t, len(r) - 1)] for r in self.recorded])

    def advance(self, actions: np.ndarray) -> None:
        """Take actions [B, n, A], one step each."""
        for k in range(actions.shape[1]):
            a = np.asarray(actions[:, k], dtype=np.float64)
            if self.model is not None:
                previous = np.zeros_like(a) if self.previous is None else self.previous
                nxt = self.model.step(self.current, self.change, a, previous)
                self.current, self.change, self.previous = nxt, nxt - self.current, a
            self.t += 1
