"""The repeated transformer forwards of one sampling call, done once instead of once per step.

Across the denoising steps of one call only the noisy values and the noise level change: the packed
layout (positions, indexes, attention masks) is the same, so it is built and installed once. And
the text pathway is causal over text alone, so its keys and values are identical at every step:
with `cache_text`, step 1 runs the full sequence and records each layer's text K/V; later steps run
only the generation tokens against the recorded K/V. Both are exact rewrites of the plain loop.

With `reuse_text` the recorded K/V outlive the call: they depend only on the packed text tokens and
the weights, so a later call packing the same prompts (a robot's task text, request after request)
replays them from its first step and never runs the text pathway. The caller vouches that the weights
do not change behind the model's back (wamkit.policy.Policy, whose weights are loaded once);
in-place writes that torch counts (optimizer steps, copies under no_grad) end the reuse anyway."""

from __future__ import annotations

import torch

from wamkit.model.attention import PackedAttention, packed_layout
from wamkit.model.packing import SequenceSample, pack_samples

_SHIFTED_INDEXES = ("vision_sequence_indexes", "vision_mse_loss_indexes", "action_sequence_indexes", "action_mse_loss_indexes")


def without_text(forward_kwargs: dict) -> dict:
    """The forward kwargs of the same packed sequence minus its text tokens (the text prefix is
    served from the K/V cache): sequence indexes shift left by the text length."""
    und_len = int(forward_kwargs["und_len"])
    out = dict(forward_kwargs)
    out.update(
        input_ids=forward_kwargs["input_ids"][:0], text_indexes=forward_kwargs["text_indexes"][:0],
        position_ids=forward_kwargs["position_ids"][:, und_len:], und_len=0,
        sequence_length=int(forward_kwargs["sequence_length"]) - und_len,
    )
    for key in _SHIFTED_INDEXES:
        if key in forward_kwargs:
            out[key] = forward_kwargs[key] - und_len
    return out


class DenoisingForward:
    """Use as a context manager around the step loop; call it once per step with the current
    noisy tensors of every packed sample (in the order of `samples`).

    `samples` fixes the layout (their values and sigma are placeholders). Text caching needs the
    processor to be wamkit's PackedAttention (or its flex subclass); any other processor runs the
    full sequence every step."""

    def __init__(self, model, processor, samples: list[SequenceSample], cache_text: bool = True, reuse_text: bool = False,
                 merge: bool = False):
        self.model, self.processor = model, processor
        # A processor may ask for the text of several samples to be padded (flex: to shared padded shapes)
        text_multiple = getattr(processor, "inference_text_multiple", 0) if len(samples) > 1 else 0
        self.batch = pack_samples(samples, model.config, text_multiple=text_multiple, merge=merge)  # merged: read outputs with batch.video_outputs
        self.dtype = next(model.parameters()).dtype
        self.und_len = int(self.batch.forward_kwargs["und_len"])
        self.cache_text = cache_text and isinstance(processor, PackedAttention) and self.und_len > 0
        self._text_kwargs = without_text(self.batch.forward_kwargs) if self.cache_text else None
        # What the recorded text K/V are a function of; this object alone when they must not outlive the call.
        self.text_key = text_key(model, samples, self.dtype) if reuse_text else self
        self._layout = None

    def __enter__(self) -> "DenoisingForward":
        self._layout = packed_layout(self.processor, self.batch)
        self._layout.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if isinstance(self.processor, PackedAttention):
            self.processor.stop_text_cache()
        self._layout.__exit__(*exc)

    def __call__(self, videos, actions, sigma: float):
        """One forward at noise level `sigma` (the same for every noisy token of the batch). `videos`
        and `actions`: every sample's latents and rows, as lists (or stacked tensors when merged)."""
        replay = self.cache_text and self.processor.holds_text(self.text_key, self.und_len)
        kwargs = dict(self._text_kwargs if replay else self.batch.forward_kwargs)
        kwargs["vision_tokens"] = [v.to(self.dtype) for v in self.batch.vision_items(videos)]
        kwargs["vision_timesteps"] = torch.full_like(kwargs["vision_timesteps"], float(sigma) * 1000.0)
        if actions is not None:
            kwargs["action_tokens"] = [a.to(self.dtype) for a in self.batch.action_items(actions)]
            kwargs["action_timesteps"] = torch.full_like(kwargs["action_timesteps"], float(sigma) * 1000.0)
        if self.cache_text:
            self.processor.start_text_cache(record=not replay, text_length=self.und_len)
        out = self.model(**kwargs)
        if self.cache_text and not replay:
            self.processor.text_recorded(self.text_key, self.und_len)
        return out


def text_key(model, samples: list[SequenceSample], dtype: torch.dtype) -> tuple:
    """The packed text (every sample's token ids, in pack order), the compute dtype and the weights'
    identity and in-place write count: equal keys mean equal text K/V in every layer."""
    weights = [*model.parameters(), *model.buffers()]
    return (tuple(tuple(s.text_ids) for s in samples), dtype, id(model), len(weights), sum(t._version for t in weights))
