"""The VAE encoder's torch.compile, run in a background thread while the transformer is built.

On a cold machine the encoder's compile is the largest single part of the wait for a first step
(22.9 of 69 s for SO-101 on an H200, benchmarks/RESULTS.md), and the model build beside it
(reading a base checkpoint, materialising shards) mostly waits on the disk and the GPU with the
GIL released. So the trainer encodes one zero batch of the clip shape training will use in a
thread, and joins it before the data loader's workers fork: the first step then finds the graph
compiled and cuDNN's convolutions autotuned. A warm-up that fails costs nothing but the time: it
says why once, and the first step compiles as before (and raises there if the fault is real)."""

from __future__ import annotations

import threading
import time

import torch


class EncoderWarmup:
    """`start()` encodes zeros of `clip_shape` ([B, T, H, W, 3] uint8, what one micro-batch's clips
    stack to) through `tokenizer.encode` in a daemon thread; `join()` waits for it and returns a
    note for the startup log."""

    def __init__(self, tokenizer, clip_shape: tuple[int, ...]):
        self.tokenizer, self.clip_shape = tokenizer, tuple(int(n) for n in clip_shape)
        self.seconds = 0.0  # wall time of the warm-up encode (its compile included)
        self.compile_seconds = 0.0  # torch.compile's share of it: spent off the first step
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "EncoderWarmup":
        self._thread = threading.Thread(target=self._run, name="wamkit-vae-warmup", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        before = getattr(self.tokenizer, "compile_seconds", 0.0)
        start = time.perf_counter()
        try:
            with torch.no_grad():
                clips = torch.zeros(self.clip_shape, dtype=torch.uint8, device=self.tokenizer.device)
                self.tokenizer.encode(clips)
                if clips.is_cuda:
                    torch.cuda.synchronize(clips.device)
        except BaseException as exc:  # noqa: BLE001 - reported by join(); the first step compiles instead
            self.error = exc
        self.seconds = time.perf_counter() - start
        self.compile_seconds = getattr(self.tokenizer, "compile_seconds", 0.0) - before

    def join(self) -> str:
        """Wait for the warm-up; the startup log's note on it ("" before start)."""
        if self._thread is None:
            return ""
        self._thread.join()
        shape = "x".join(str(n) for n in self.clip_shape)
        if self.error is not None:
            first = str(self.error).splitlines()[0] if str(self.error) else ""
            return (f"the VAE encoder's background warm-up on {shape} clips failed ({type(self.error).__name__}: {first[:200]}); "
                    "the first step compiles it instead")
        return (f"VAE encoder warmed up in the background on {shape} clips during the build: {self.seconds:.1f} s, "
                f"{self.compile_seconds:.1f} s of it torch.compile")


def warmup_clip_shape(samples, micro_batch: int) -> tuple[int, ...] | None:
    """[B, T, H, W, 3] of the clips a micro-batch encodes: the first training sample's video (what
    the canvas and chunk make) times the micro-batch; None for samples without video (a latent
    cache) or an empty split."""
    if len(samples) == 0:
        return None
    video = getattr(samples[0], "video", None)
    if video is None:
        return None
    return (micro_batch, *video.shape)
