"""World-model rollouts along recorded episodes, chunk by chunk.

An episode of L frames is cut into chunks of the run's chunk_length T: chunk k covers frames
[kT, kT + T] and is driven by the recorded actions kT .. kT + T - 1 (normalized with the run's own
statistics, padded to max_action_dim), plus the recorded state at kT when the model uses a state row.

  teacher_forced  chunk k starts from the RECORDED frame kT (errors never accumulate); all chunks
                  of an episode are independent and sampled in batches.
  autoregressive  chunk 0 starts from recorded frame 0; chunk k > 0 starts from the model's own
                  last predicted frame of chunk k - 1 (decoded to pixels, re-encoded). The state
                  row is the recorded one (a forward-dynamics model predicts no state).
  probes          one chunk from recorded frame 0 per action axis a and sign: every row holds the
                  episode's mean normalized action, except channel a = clip(mean_a +- scale, -1, 1).

The copy-last-frame baseline repeats each chunk's conditioning frame: the recorded frame kT in
teacher-forced mode, recorded frame 0 for the whole episode in autoregressive mode (its own "last
frame" never changes). Noise is seeded per (seed, episode, chunk), so chunk 0 gets the same noise in
both modes and a rerun reproduces every video."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from wamkit.data import LeRobotV3Dataset
from wamkit.data.canvas import compose_frames, contract_padding
from wamkit.errors import WamkitError
from wamkit.model.attention_backends import attention_backend, install_packed_attention
from wamkit.policy.contract import ContractModel
from wamkit.train.step_profile import RolloutProfile
from wamkit.diffusion.sampling import sigma_schedule
from wamkit.worldmodel.chunked import sample_video_chunked
from wamkit.worldmodel.sampling import sample_video

MODES = ("teacher_forced", "autoregressive")
WORLD_MODEL_TRAINING_MODES = ("forward_dynamics", "mixed")


class WorldModelError(WamkitError, ValueError):
    """A world-model evaluation input is unusable; `where` names it."""


def _seed_for(seed: int, episode: int, chunk: int, salt: int = 0) -> int:
    return (int(seed) * 1_000_003 + int(episode) * 10_007 + int(chunk) * 101 + salt) % (2**63)


def sampling_attention(run_backend: str, device: torch.device, dtype: torch.dtype) -> str:
    """The backend rollouts sample with by default: the run's own, but per_sample where that resolves
    to flex. Every rollout pack has a new layout (chunk counts, prompts), so compiled flex recompiles
    for each and an H200 evaluation of a flex-trained world model did not finish in 50 s
    (benchmarks/RESULTS.md); per_sample gives the same outputs and compiles nothing."""
    backend = attention_backend(run_backend, device, dtype)
    return "per_sample" if backend == "flex" else backend


class WorldModel(ContractModel):
    """A loaded model (wamkit.policy.loading.LoadedModel) used as an action-conditioned video
    generator. Default sampling: 30 Euler steps, guidance 1.0, the training shift, and the run's
    `model.attention` backend, except that runs trained with flex sample with per_sample
    (`sampling_attention`)."""

    def __init__(self, loaded, num_steps: int = 30, shift: float | None = None, guidance: float = 1.0,
                 guidance_interval=(0.0, 1.0), solver: str = "euler", allow_any_mode: bool = False,
                 attention: str | None = None, student_sigmas: list[float] | None = None):
        mode = str(loaded.model_info.get("mode", "policy"))
        if mode not in WORLD_MODEL_TRAINING_MODES and not allow_any_mode:
            raise WorldModelError("model.mode", f"the checkpoint was trained in {mode!r} mode, which never learned to "
                                  "generate video from clean actions", "evaluate a run trained with model.mode = "
                                  "'forward_dynamics' or 'mixed' (or pass allow_any_mode=True)")
        self._init_contract(loaded)
        self.num_steps, self.shift, self.guidance = int(num_steps), shift, float(guidance)
        self.guidance_interval, self.solver = tuple(float(x) for x in guidance_interval), solver
        # Block-causal runs (stages 1-3) sample chunk by chunk; a distilled student on its own ladder.
        self.chunk_frames = int(loaded.diffusion.get("causal_chunk_frames", 0) or 0)
        self.student_sigmas = [float(s) for s in student_sigmas] if student_sigmas else None
        if self.student_sigmas:
            self.num_steps, self.solver = len(self.student_sigmas) - 1, "consistency"
        if self.chunk_frames and self.use_state:
            raise WorldModelError("data.use_state", "is true in a chunk-autoregressive run", "the block-causal stages take no state row")
        if self.chunk_frames and (self.guidance != 1.0 or self.solver == "unipc"):
            raise WorldModelError("guidance/solver", f"chunk-autoregressive sampling (causal_chunk_frames = {self.chunk_frames}) "
                                  "takes Euler or consistency steps without guidance", "use --solver euler --guidance 1.0")
        param = next(self.model.parameters())
        backend = (attention_backend(attention, param.device, param.dtype) if attention
                   else sampling_attention(str(loaded.model_info.get("attention", "auto")), param.device, param.dtype))
        self.processor = install_packed_attention(self.model, backend)
        self.device = param.device  # where the loader put the weights: the rollouts' and the scores' device
        self.warmed_up = False

    @classmethod
    def from_path(cls, path: str | Path, use_ema: bool = True, device: str | torch.device = "cpu",
                  dtype: str | torch.dtype = "auto", **kw) -> "WorldModel":
        """An export directory (has wamkit.json), a run directory or a checkpoints/iter_<N> directory;
        `dtype`: what it computes in (wamkit.device.resolve_inference_dtype)."""
        from wamkit.distill.export import student_ladder
        from wamkit.policy.loading import load_model

        kw.setdefault("student_sigmas", student_ladder(path))
        return cls(load_model(path, use_ema=use_ema, device=device, dtype=dtype), **kw)

    def warm_up(self, predict) -> float:
        """Once per model, one untimed batch (`predict()`) before the first timed rollout: the real-time
        factor then measures steady generation, not the process's first device work (CUDA's kernel
        selection, the allocator's growth), which on an H200 was a large part of a 4-step student's
        seconds. Returns its seconds (0 once warm), which the report gives beside the rollouts'."""
        if self.warmed_up:
            return 0.0
        t0 = time.perf_counter()
        predict()
        self.warmed_up = True
        return time.perf_counter() - t0

    def shift_for(self, frame: torch.Tensor) -> float:
        """The explicit shift, else the one training used for this frame size."""
        if self.shift is not None:
            return float(self.shift)
        return self.training_shift(frame.shape[-3], frame.shape[-2])

    def normalize_actions(self, raw: np.ndarray) -> torch.Tensor:
        """raw [..., action_dim] -> normalized, padded [..., max_action_dim] float32."""
        x = torch.as_tensor(np.asarray(raw, dtype=np.float64))
        y = self.action_normalizer.normalize(x).float()
        return torch.nn.functional.pad(y, (0, self.max_action_dim - y.shape[-1]))

    def normalize_states(self, raw: np.ndarray | None) -> torch.Tensor | None:
        if not self.use_state:
            return None
        x = torch.as_tensor(np.asarray(raw, dtype=np.float64))
        y = self.state_normalizer.normalize(x).float()
        return torch.nn.functional.pad(y, (0, self.max_action_dim - y.shape[-1]))

    def predict(self, first_frames: torch.Tensor, actions: torch.Tensor, states: torch.Tensor | None, tasks: list[str],
                seeds: list[int]) -> torch.Tensor:
        """Model-space inputs -> uint8 video [B, T+1, H, W, 3] (one packed forward per step)."""
        prompts = [self.contract["prompt_template"].format(task=t) for t in tasks]
        generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        if self.chunk_frames:
            sigmas = self.student_sigmas or sigma_schedule(self.num_steps, self.shift_for(first_frames[0])).tolist()
            return sample_video_chunked(
                self.model, self.processor, self.video_tokenizer, self.text_tokenizer, first_frames, actions, sigmas,
                self.chunk_frames, "consistency" if self.student_sigmas else "euler", generators, self.fps, prompts,
                domain_id=int(self.contract.get("domain_id", 0)), video_prediction=self.video_prediction,
                reuse_text_kv=True).cpu()  # loaded once: its weights do not change
        return sample_video(
            self.model, self.processor, self.video_tokenizer, self.text_tokenizer, first_frames, actions, states,
            num_steps=self.num_steps, shift=self.shift_for(first_frames[0]), guidance=self.guidance,
            guidance_interval=self.guidance_interval, generator=generators, fps=self.fps, solver=self.solver,
            prompts=prompts, domain_id=int(self.contract.get("domain_id", 0)),
            video_residual=bool(self.loaded.diffusion.get("video_residual", False)),
            video_prediction=self.video_prediction, reuse_text_kv=True,  # loaded once: its weights do not change
        ).cpu()


@dataclass
class EpisodeData:
    """One recorded episode in raw units: frames uint8 [L, H, V*W, 3] (cameras tiled along W)."""

    episode: int
    frames: torch.Tensor
    actions: np.ndarray  # [L, action_dim]
    states: np.ndarray | None  # [L, state_dim]
    task: str


def load_episode(dataset: LeRobotV3Dataset, episode: int, contract: dict) -> EpisodeData:
    cameras = list(contract.get("camera_keys") or dataset.camera_keys)
    length = dataset.episode_length(episode)
    views = [dataset.decode_frames(episode, cam, np.arange(length)) for cam in cameras]
    frames = compose_views(views, contract.get("canvas"))
    keys = [contract.get("action_key") or "action"]
    state_key = contract.get("state_key") if contract.get("use_state") else None
    if state_key:
        keys.append(state_key)
    cols = dataset.episode_columns(episode, keys)
    actions = cols[keys[0]].reshape(length, -1).astype(np.float64)
    states = cols[state_key].reshape(length, -1).astype(np.float64) if state_key else None
    return EpisodeData(episode, frames, actions, states, dataset.episode_task(episode))


class BundleEpisodes:
    """A sim-bimanual bundle's episodes as evaluation reads them (wamkit.bimanual.bundle): each episode's
    whole video, its raw 59-value action rows with the values its source does not provide zeroed (the
    training transform zeroes them after normalizing; the asinh of 0 is 0), and its caption. Episodes
    are numbered by their id's digits (`ep00012` -> 12, as `wamkit data bundle` names the LeRobot
    episode), so a run's `val_episodes` ids map to the numbers `--episodes` takes."""

    def __init__(self, root):
        from wamkit.bimanual.bundle import open_bundle

        self.bundle = open_bundle(root)
        self.root = self.bundle.root
        self.records = {}
        for r in self.bundle.samples:
            self.records.setdefault(self.number(r["episode_id"]), r)
        self.episode_indices = sorted(self.records)

    def number(self, episode_id: str) -> int:
        digits = "".join(ch for ch in str(episode_id) if ch.isdigit())
        if not digits:
            raise WorldModelError(f"{self.root}/samples.json", f"episode id {episode_id!r} has no number",
                                  "name episodes ep<N> (as `wamkit data bundle` does)")
        return int(digits)

    def load(self, episode: int) -> EpisodeData:
        from wamkit.data.video import decode_at_times

        if episode not in self.records:
            raise WorldModelError("episodes", f"{episode} is not an episode of {self.root}", f"use one of {self.episode_indices}")
        r = self.records[episode]
        actions = np.load(self.root / r["actions"]).astype(np.float64)
        actions *= np.load(self.root / r["action_mask"]).astype(bool)
        times = np.arange(len(actions) + 1) / self.bundle.fps
        frames = torch.from_numpy(np.ascontiguousarray(decode_at_times(self.root / r["media"], times, self.bundle.fps)))
        return EpisodeData(episode, frames, actions, None, r["caption"])

    def action_names(self) -> list[str]:
        return list(self.bundle.manifest["action_names"])


def compose_views(views: list[np.ndarray], canvas: dict | None) -> torch.Tensor:
    """Camera views [V][L, H, W, 3] -> the training canvas [L, H', W', 3] uint8, composed exactly as
    training did from the contract's `canvas` (side by side at native size when absent)."""
    canvas = canvas or {}
    tensors = [torch.from_numpy(np.ascontiguousarray(v)) for v in views]
    return compose_frames(tensors, canvas.get("camera_layout", "side_by_side"), int(canvas.get("resolution", 0)),
                          int(canvas.get("wrist_index", 0)), contract_padding(canvas))


def chunk_starts(length: int, chunk: int) -> list[int]:
    """Starts kT of every chunk whose T+1 frames lie inside an episode of `length` frames."""
    return list(range(0, length - chunk, chunk))


@dataclass
class Rollout:
    """One mode on one episode. Arrays are [N chunks, T+1, H, W, 3] uint8; frame 0 of `pred` is the
    tokenizer's reconstruction of the conditioning frame."""

    episode: int
    mode: str
    starts: list[int]
    real: torch.Tensor
    pred: torch.Tensor
    baseline: torch.Tensor
    mean_actions: torch.Tensor  # [N, action_dim] mean normalized action of each chunk
    wall_seconds: float
    video_seconds: float
    extra: dict = field(default_factory=dict)


@dataclass
class _EpisodeChunks:
    """One episode's chunks as the model takes them."""

    ep: EpisodeData
    starts: list[int]
    real: torch.Tensor  # [N, T+1, H, W, 3]
    actions: torch.Tensor  # [N, T, max_action_dim] normalized
    states: torch.Tensor | None  # [N, max_action_dim] normalized
    seeds: list[int]


def _episode_chunks(wm: WorldModel, ep: EpisodeData, seed: int) -> _EpisodeChunks:
    t = wm.chunk_length
    starts = chunk_starts(len(ep.frames), t)
    if not starts:
        raise WorldModelError(f"episode {ep.episode}", f"has {len(ep.frames)} frames, fewer than chunk_length + 1 = {t + 1}",
                              "pick longer episodes")
    return _EpisodeChunks(ep, starts, torch.stack([ep.frames[s:s + t + 1] for s in starts]),
                   torch.stack([wm.normalize_actions(ep.actions[s:s + t]) for s in starts]),
                   torch.stack([wm.normalize_states(ep.states[s]) for s in starts]) if wm.use_state else None,
                   [_seed_for(seed, ep.episode, k) for k in range(len(starts))])


def _predict(wm: WorldModel, items: list[tuple[_EpisodeChunks, int, torch.Tensor]]) -> torch.Tensor:
    """One batched predict of chunk k of each (episode inputs, k, conditioning frame) item."""
    states = [x.states[k] for x, k, _ in items] if wm.use_state else None
    return wm.predict(torch.stack([f for _, _, f in items]), torch.stack([x.actions[k] for x, k, _ in items]),
                      torch.stack(states) if states is not None else None, [x.ep.task for x, _, _ in items],
                      [x.seeds[k] for x, k, _ in items])


def rollout_episodes(wm: WorldModel, eps: list[EpisodeData], mode: str, seed: int = 0, max_batch: int = 16) -> list[Rollout]:
    """`mode` on every episode, the episodes' chunks sampled together in batches of up to `max_batch`: in
    teacher-forced mode any chunks, in autoregressive mode chunk k of every episode that has one (each
    waits only for its own chunk k - 1). Noise is per (seed, episode, chunk), so the videos do not depend
    on the batching. The wall time (after the model's one warm-up batch, `WorldModel.warm_up`) and the
    warm-up's are shared out by chunk count (the sums over episodes are the totals)."""
    if mode not in MODES:
        raise WorldModelError("modes", f"unknown rollout mode {mode!r}", f"use any of {list(MODES)}")
    inputs = [_episode_chunks(wm, ep, seed) for ep in eps]
    preds: list[list] = [[None] * len(x.starts) for x in inputs]
    warmup = wm.warm_up(lambda: _predict(wm, [(x, 0, x.real[0, 0]) for x in inputs[:max_batch]]))
    profiler, batches = RolloutProfile.start(wm.device), 0
    wall = time.perf_counter()
    if mode == "teacher_forced":
        items = [(i, k) for i, x in enumerate(inputs) for k in range(len(x.starts))]
        for b in range(0, len(items), max_batch):
            batch = items[b:b + max_batch]
            out = _predict(wm, [(inputs[i], k, inputs[i].real[k, 0]) for i, k in batch])
            batches += 1
            for (i, k), video in zip(batch, out):
                preds[i][k] = video
    else:
        for k in range(max(len(x.starts) for x in inputs)):
            live = [i for i, x in enumerate(inputs) if k < len(x.starts)]
            for b in range(0, len(live), max_batch):
                batch = live[b:b + max_batch]
                first = [inputs[i].real[0, 0] if k == 0 else preds[i][k - 1][-1] for i in batch]
                out = _predict(wm, [(inputs[i], k, f) for i, f in zip(batch, first)])
                batches += 1
                for i, video in zip(batch, out):
                    preds[i][k] = video
    wall = time.perf_counter() - wall
    if profiler is not None:
        profiler.finish(batches, f"{mode} rollouts of {len(inputs)} episodes")
    chunks = sum(len(x.starts) for x in inputs)
    rollouts = []
    for x, pred in zip(inputs, preds):
        real = x.real
        baseline = (real[:, :1] if mode == "teacher_forced" else real[:1, :1]).expand_as(real).clone()
        rollouts.append(Rollout(x.ep.episode, mode, x.starts, real, torch.stack(pred), baseline,
                                x.actions[..., : wm.action_dim].mean(1), wall * len(x.starts) / chunks,
                                len(x.starts) * wm.chunk_length / wm.fps, {"warmup_seconds": warmup * len(x.starts) / chunks}))
    return rollouts


def rollout_episode(wm: WorldModel, ep: EpisodeData, mode: str, seed: int = 0, max_batch: int = 8) -> Rollout:
    """`mode` on one episode (`rollout_episodes` with one episode)."""
    return rollout_episodes(wm, [ep], mode, seed, max_batch)[0]


def probe_actions(wm: WorldModel, ep: EpisodeData, scale: float = 1.0) -> tuple[list[tuple[int, str]], torch.Tensor]:
    """([(axis, '+'|'-'), ...], normalized padded actions [2A, T, max_action_dim])."""
    mean = wm.normalize_actions(ep.actions).mean(0)
    keys, rows = [], []
    for axis in range(wm.action_dim):
        for sign, s in (("+", 1.0), ("-", -1.0)):
            row = mean.clone()
            row[axis] = float(np.clip(float(mean[axis]) + s * scale, -1.0, 1.0))
            keys.append((axis, sign))
            rows.append(row.expand(wm.chunk_length, -1))
    return keys, torch.stack(rows)


def probe_episode(wm: WorldModel, ep: EpisodeData, scale: float = 1.0, seed: int = 0, max_batch: int = 8) -> dict:
    """{axis: {'+': video, '-': video}} uint8 [T+1, H, W, 3], all from recorded frame 0, same noise."""
    if len(ep.frames) < 1:
        raise WorldModelError(f"episode {ep.episode}", "has no frames")
    keys, actions = probe_actions(wm, ep, scale)
    n = len(keys)
    first = ep.frames[0].unsqueeze(0).expand(n, -1, -1, -1).contiguous()
    states = wm.normalize_states(ep.states[0]).unsqueeze(0).expand(n, -1) if wm.use_state else None
    seed0 = _seed_for(seed, ep.episode, 0, salt=7)
    videos = []
    for i in range(0, n, max_batch):
        j = slice(i, i + max_batch)
        videos.append(wm.predict(first[j], actions[j], states[j] if states is not None else None,
                                 [ep.task] * len(keys[j]), [seed0] * len(keys[j])))
    videos = torch.cat(videos)
    out: dict = {}
    for (axis, sign), video in zip(keys, videos):
        out.setdefault(axis, {})[sign] = video
    return out
