"""`Policy`: raw observations in, raw action chunks out.

predict() validates each observation, normalizes the state with the run's own statistics (the data
contract), pads it to max_action_dim, samples normalized actions with the flow sampler, slices the
real channels and denormalizes them back to robot units.

An observation may also carry the actions the robot has committed to while this chunk is computed
(`committed_actions`, `inference_delay`, optional `execution_horizon`): the chunk is then sampled
with real-time chunking (wamkit.diffusion.rtc), steered to continue them without a jump."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from wamkit.data.canvas import compose_canvas, contract_padding
from wamkit.diffusion.rtc import DEFAULT_MAX_GUIDANCE, InpaintTarget, soft_mask
from wamkit.diffusion.sampling import PolicyInput, sample_policy
from wamkit.errors import CheckpointError, WamkitError
from wamkit.model.cuda_graphs import DecoderStackGraphs, ForwardGraphs
from wamkit.model.cuda_graphs import compile_pointwise as compile_pointwise_ops
from wamkit.model.attention_backends import attention_backend, install_packed_attention
from wamkit.policy.contract import ContractModel
from wamkit.policy.loading import LoadedModel, load_from_checkpoint, load_from_export, load_model, reload_refusal, reload_weights


class PolicyInputError(WamkitError, ValueError):
    """An observation passed to Policy.predict is malformed; `where` names the field."""


RTC_KEYS = ("committed_actions", "inference_delay", "execution_horizon")


class Policy(ContractModel):
    def __init__(self, loaded: LoadedModel, num_steps: int = 10, guidance: float = 1.0, attention: str = "auto",
                 cache_text: bool = True, cuda_graphs: bool | None = None, compile_pointwise: bool | None = None,
                 rtc_max_guidance: float = DEFAULT_MAX_GUIDANCE):
        """`rtc_max_guidance`: real-time chunking's guidance clip beta (the paper's 5; 0 turns the
        steering off while keeping its cost). `cache_text`: compute the text pathway once per chunk
        instead of once per denoising step (exact). `cuda_graphs` (default: on for CUDA models): replay the decoder stack and the VAE
        encode from CUDA graphs captured per shape (the first request of each new shape pays the
        capture; the whole denoising forward is one graph where its capture works, else the decoder
        stack alone). `compile_pointwise` (default: on for CUDA models): fuse the norms, MLP gates and
        rotary embedding with torch.compile. benchmarks/RESULTS.md has what each one buys.
        The text pathway's K/V are kept from one call to the next with the same prompts (a robot's
        task text): a Policy's weights are loaded once, or replaced through `reload` (which drops them).
        Changing them in place behind its back through `.data` is not seen: call
        `self.processor.forget_text_kv()` after doing so."""
        if not float(rtc_max_guidance) >= 0:
            raise WamkitError("rtc_max_guidance", f"is {rtc_max_guidance}", "use a guidance clip >= 0 (the paper uses 5)")
        self._init_contract(loaded)
        self.num_steps = int(num_steps)
        self.noise_scale = 1.0
        self.guidance = float(guidance)
        self.cache_text = bool(cache_text)
        self.rtc_max_guidance = float(rtc_max_guidance)
        param = next(self.model.parameters())
        self.device = device = param.device  # decided by the loader (load_from_*(device=...)); read, never re-derived
        self.processor = install_packed_attention(self.model, attention_backend(attention, device, param.dtype))
        use_graphs = device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        # Up to 64 graphs each: a batched closed loop sees every batch size up to its worker count, twice
        # (the text-recording step and the replaying ones), and a few padded text lengths of each.
        self.graphs = DecoderStackGraphs(self.model, self.processor, max_graphs=64) if use_graphs else None
        self.forward_graphs = ForwardGraphs(self.model, self.processor, max_graphs=64) if use_graphs else None
        if use_graphs and hasattr(self.video_tokenizer, "enable_cuda_graphs"):
            self.video_tokenizer.enable_cuda_graphs()
        if device.type == "cuda" if compile_pointwise is None else compile_pointwise:
            compile_pointwise_ops(self.model, self.processor)

    def use_fp8_matmuls(self) -> int:
        """Multiply the generation pathway in FP8 from now on (wamkit.model.fp8; `wamkit serve --fp8`):
        its linear layers get e4m3 weights in place, and graphs captured before are dropped. Returns
        the number of layers quantized."""
        from wamkit.model.fp8 import check_fp8_device, quantize_generation_linears

        check_fp8_device(self.device)
        self.fp8_linears = quantize_generation_linears(self.model)
        self.processor.forget_text_kv()
        for graphs in (self.graphs, self.forward_graphs):
            if graphs is not None:
                graphs.cache.clear()
        return self.fp8_linears

    @property
    def noise_scale(self) -> float:
        """The sampler's starting noise, x this (1 = the trained distribution, 0 = one chunk whatever the seed;
        wamkit.diffusion.sampling.sample_policy says why). Checked when set."""
        return self._noise_scale

    @noise_scale.setter
    def noise_scale(self, value: float) -> None:
        self._noise_scale = checked_noise_scale(value)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, path_or_run_dir: str | Path, use_ema: bool = True, device: str | torch.device = "cpu",
                        num_steps: int = 10, guidance: float = 1.0, dtype: str | torch.dtype = "auto") -> "Policy":
        """A run directory (its latest checkpoint) or one checkpoints/iter_<N> directory."""
        return cls(load_from_checkpoint(path_or_run_dir, use_ema=use_ema, device=device, dtype=dtype), num_steps, guidance)

    @classmethod
    def from_export(cls, directory: str | Path, device: str | torch.device = "cpu", num_steps: int = 10,
                    guidance: float = 1.0, dtype: str | torch.dtype = "auto") -> "Policy":
        """A directory written by wamkit.export.export_run."""
        return cls(load_from_export(directory, device=device, dtype=dtype), num_steps, guidance)

    def reload_refusal(self, path: str | Path) -> str | None:
        """Why `reload` cannot take this checkpoint (None: it can)."""
        return self._fp8_refusal() or reload_refusal(self.loaded, path)

    def _fp8_refusal(self) -> str | None:
        return "the generation pathway was quantized to FP8 in place" if getattr(self, "fp8_linears", 0) else None

    def reload(self, path: str | Path, use_ema: bool = True) -> None:
        """Another checkpoint of this policy's run, loaded into the same tensors: the graphs captured so
        far replay it (an evaluation of every checkpoint captures its graphs once), and the text K/V
        recorded with the old weights are dropped. Refused with `reload_refusal`'s reason (reload_weights
        checks the checkpoint's own)."""
        reason = self._fp8_refusal()
        if reason:
            raise CheckpointError(str(path), f"cannot be loaded in place: {reason}", "load it afresh (load_policy)")
        self.loaded = reload_weights(self.loaded, path, use_ema)
        self.processor.forget_text_kv()

    @property
    def replays_cuda_graphs(self) -> bool:
        """Whether predicts replay CUDA graphs, one captured per batch shape: a caller that knows its largest
        batch pads to it (wamkit.eval.batched) and captures once."""
        return self.graphs is not None or self.forward_graphs is not None

    @property
    def graph_captures(self) -> int:
        """CUDA graphs captured so far (whole forwards and decoder stacks): each new shape costs one."""
        return sum(g.captures for g in (self.graphs, self.forward_graphs) if g is not None)

    def shift_for(self, frame: torch.Tensor) -> float:
        """The same noise shift that training used for this frame size."""
        return self.training_shift(frame.shape[0], frame.shape[1])

    def disable_cuda_graphs(self) -> None:
        """Back to kernel-by-kernel launches (frees every captured graph)."""
        if self.forward_graphs is not None:
            self.forward_graphs.remove()
            self.forward_graphs = None
        if self.graphs is not None:
            self.graphs.remove()
            self.graphs = None
        if hasattr(self.video_tokenizer, "disable_cuda_graphs"):
            self.video_tokenizer.disable_cuda_graphs()

    # ---- inference -----------------------------------------------------------------------------
    def prepare(self, observations: list[Mapping]) -> list[PolicyInput]:
        """Validate raw observations and turn them into model-space PolicyInputs."""
        if isinstance(observations, Mapping) or not isinstance(observations, (list, tuple)):
            raise PolicyInputError("observations", f"must be a list of dicts, got {type(observations).__name__}",
                                   "wrap a single observation in a list: predict([obs])")
        if not observations:
            raise PolicyInputError("observations", "is empty", "pass at least one observation")
        return [self._prepare_one(i, obs) for i, obs in enumerate(observations)]

    def _prepare_one(self, i: int, obs) -> PolicyInput:
        where = f"observations[{i}]"
        if not isinstance(obs, Mapping):
            raise PolicyInputError(where, f"must be a dict with 'image', 'state' and 'prompt', got {type(obs).__name__}")
        frame = self._image(f"{where}['image']", obs.get("image"))
        state = self._state(f"{where}['state']", obs.get("state")) if self.use_state else None
        prompt = obs.get("prompt")
        if prompt is None:
            raise PolicyInputError(f"{where}['prompt']", "is missing", "pass the task instruction as a string")
        if not isinstance(prompt, str):
            raise PolicyInputError(f"{where}['prompt']", f"must be a str, got {type(prompt).__name__}")
        text = self.contract["prompt_template"].format(task=prompt)
        return PolicyInput(frame=frame, state=state, prompt=text, chunk_length=self.chunk_length,
                           action_dim=self.action_dim, domain_id=int(self.contract["domain_id"]),
                           inpaint=self._inpaint(where, obs))

    def _inpaint(self, where: str, obs: Mapping) -> InpaintTarget | None:
        """Real-time chunking's target from `committed_actions` (raw [K, action_dim]: the previous
        chunk's actions not yet executed when this observation was taken, in order),
        `inference_delay` d (how many of them run before this chunk arrives; frozen) and
        `execution_horizon` (how many of them steer the chunk at all; default K)."""
        committed = obs.get("committed_actions")
        delay, horizon = obs.get("inference_delay"), obs.get("execution_horizon")
        if committed is None:
            if delay is not None or horizon is not None:
                key = "inference_delay" if delay is not None else "execution_horizon"
                raise PolicyInputError(f"{where}[{key!r}]", "is given without 'committed_actions'",
                                       "send the committed actions with it, or neither (plain sampling)")
            return None
        actions = self._committed_actions(f"{where}['committed_actions']", committed)
        k = actions.shape[0]
        if delay is None:
            raise PolicyInputError(f"{where}['inference_delay']", "is missing",
                                   "send how many control steps the robot executes while this chunk is computed")
        d = self._count(f"{where}['inference_delay']", delay, 0, min(k, self.chunk_length - 1),
                        f"0 <= delay <= len(committed_actions) = {k} and < the chunk length {self.chunk_length}")
        h = k if horizon is None else self._count(f"{where}['execution_horizon']", horizon, d, k,
                                                   f"inference_delay {d} <= horizon <= len(committed_actions) {k}")
        normalized = torch.as_tensor(self.action_normalizer.normalize(actions), dtype=torch.float32)
        target = torch.zeros(self.chunk_length, self.max_action_dim)
        target[:k, : self.action_dim] = normalized
        return InpaintTarget(target, soft_mask(self.chunk_length, d, h), self.rtc_max_guidance)

    def _committed_actions(self, where: str, committed) -> np.ndarray:
        h, a = self.chunk_length, self.action_dim
        return self._floats(where, committed, lambda shape: len(shape) == 2 and shape[1] == a and 1 <= shape[0] <= h,
                            f"expected [K, {a}] with 1 <= K <= {h}",
                            "send the rows of the previous chunk not yet executed, in raw robot units")

    @staticmethod
    def _floats(where: str, value, shape_ok, expected: str, fix: str) -> np.ndarray:
        """`value` as finite float64 numbers of an accepted shape, or an error naming `where`."""
        try:
            values = np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise PolicyInputError(where, f"is not numeric: {exc}") from exc
        if not shape_ok(values.shape):
            raise PolicyInputError(where, f"shape is {tuple(values.shape)}, {expected}", fix)
        if not np.all(np.isfinite(values)):
            raise PolicyInputError(where, "contains NaN/inf")
        return values

    @staticmethod
    def _count(where: str, value, low: int, high: int, rule: str) -> int:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not low <= int(value) <= high:
            raise PolicyInputError(where, f"is {value!r}", f"send an int with {rule}")
        return int(value)

    def _image(self, where: str, image) -> torch.Tensor:
        views = self._views(where, image)
        cameras = self.camera_keys
        if cameras and len(views) != len(cameras):
            raise PolicyInputError(where, f"has {len(views)} camera view(s), the model was trained on {len(cameras)} {cameras}",
                                   "stack the views in this camera order as [V, H, W, 3] (or pass a list of [H, W, 3])")
        canvas = self.contract.get("canvas", {})  # the same composition training used
        try:
            frame = compose_canvas(views, canvas.get("camera_layout", "side_by_side"), canvas.get("resolution", 0),
                                   canvas.get("wrist_index", 0), contract_padding(canvas))
        except WamkitError as exc:
            raise PolicyInputError(where, exc.problem, exc.fix) from exc
        factor = int(getattr(self.video_tokenizer, "spatial_factor", 1))
        h, w = frame.shape[0], frame.shape[1]
        if h == 0 or w == 0 or h % factor or w % factor:
            raise PolicyInputError(where, f"frame size {h}x{w} is not a positive multiple of the tokenizer's spatial factor {factor}",
                                   "resize to the training resolution")
        return torch.from_numpy(np.ascontiguousarray(frame))

    @staticmethod
    def _views(where: str, image) -> list[np.ndarray]:
        """uint8 [H, W, 3], [V, H, W, 3], or a list of [H, W, 3] (cameras of different sizes)."""
        if image is None:
            raise PolicyInputError(where, "is missing", "pass a uint8 image [H, W, 3] (or [V, H, W, 3] for V cameras)")
        if isinstance(image, (list, tuple)):
            if not image:
                raise PolicyInputError(where, "is an empty list", "pass one uint8 [H, W, 3] image per camera")
            views = [Policy._views(f"{where}[{i}]", view) for i, view in enumerate(image)]
            if any(len(v) != 1 for v in views):
                raise PolicyInputError(where, "a list entry holds several views", "pass one [H, W, 3] image per list entry")
            return [v[0] for v in views]
        if isinstance(image, torch.Tensor):
            image = image.detach().cpu().numpy()
        if not isinstance(image, np.ndarray):
            raise PolicyInputError(where, f"must be a numpy array, got {type(image).__name__}")
        if image.dtype != np.uint8:
            raise PolicyInputError(where, f"dtype is {image.dtype}, expected uint8", "pass RGB pixels as uint8 in [0, 255]")
        if image.ndim == 3:
            image = image[None]
        if image.ndim != 4 or image.shape[-1] != 3:
            raise PolicyInputError(where, f"shape is {tuple(image.shape)}, expected [H, W, 3] or [V, H, W, 3]")
        return list(image)

    def _state(self, where: str, state) -> torch.Tensor:
        if state is None:
            raise PolicyInputError(where, "is missing", f"pass the robot state as {self.state_dim} floats in raw units")
        values = self._floats(where, state, lambda shape: shape == (self.state_dim,), f"the model expects [{self.state_dim}]",
                              f"pass the {self.contract.get('state_key')!r} vector of one time step")
        normalized = torch.as_tensor(self.state_normalizer.normalize(values), dtype=torch.float32)
        return torch.nn.functional.pad(normalized, (0, self.max_action_dim - normalized.shape[0]))

    def predict_normalized(self, observations: list[Mapping], seed: int | torch.Generator = 0,
                           num_steps: int | None = None, guidance: float | None = None) -> torch.Tensor:
        """Normalized actions [B, T, max_action_dim] (padded channels zero)."""
        generator = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(int(seed))
        return self.sample(self.prepare(observations), generator, num_steps, guidance)

    def sample(self, inputs: list[PolicyInput], generator, num_steps: int | None = None, guidance: float | None = None) -> torch.Tensor:
        """Normalized actions for prepared inputs of one frame size (one packed sampling call)."""
        shifts = {self.shift_for(x.frame) for x in inputs}
        if len(shifts) > 1:
            raise PolicyInputError("observations", "images of different sizes in one call", "predict each size separately")
        return sample_policy(
            self.model, self.processor, self.video_tokenizer, self.text_tokenizer, inputs,
            num_steps=num_steps or self.num_steps, shift=shifts.pop(), generator=generator, fps=self.fps,
            guidance=self.guidance if guidance is None else guidance, cache_text=self.cache_text,
            video_prediction=self.video_prediction, action_prediction=self.action_prediction,
            reuse_text_kv=self.cache_text, noise_scale=self.noise_scale, future_latents=self.future_video_latents,
            future_stride=self.future_video_stride,
        )

    def predict(self, observations: list[Mapping], seed: int | torch.Generator = 0, num_steps: int | None = None,
                guidance: float | None = None) -> list[np.ndarray]:
        """One float32 [T, action_dim] chunk per observation, in raw robot units."""
        normalized = self.predict_normalized(observations, seed, num_steps, guidance)
        real = normalized[..., : self.action_dim].double().cpu()
        raw = self.action_normalizer.denormalize(real)
        return [chunk.numpy().astype(np.float32) for chunk in raw]


def load_policy(path: str | Path, device: str = "cpu", num_steps: int = 10, use_ema: bool = True,
                dtype: str | torch.dtype = "auto", noise_scale: float = 1.0) -> Policy:
    """What `wamkit serve` and `wamkit eval` load: an export directory (has wamkit.json), a run
    directory or a checkpoints/iter_<N> directory, local or in object storage; `dtype`: what it
    computes in (wamkit.device.resolve_inference_dtype); `noise_scale`: the sampler's starting noise
    scale (1 = the trained distribution, < 1 samples nearer the mode)."""
    checked_noise_scale(noise_scale)  # before any weights load
    policy = Policy(load_model(path, use_ema=use_ema, device=device, dtype=dtype), num_steps)
    policy.noise_scale = noise_scale
    return policy


def sampler_text(num_steps: int, noise_scale: float = 1.0) -> str:
    """How chunks are sampled, as reports and the server's console say it: the noise scale only when not the trained one."""
    return f"{num_steps} denoising steps" + ("" if noise_scale == 1.0 else f" from noise x {noise_scale:g}")


def checked_noise_scale(value: float) -> float:
    """The sampler's starting-noise scale as a float, refused below 0 (or NaN) with the field named."""
    if not float(value) >= 0:
        raise PolicyInputError("noise_scale", f"is {value}", "use a scale >= 0 (1 samples the trained distribution)")
    return float(value)
