"""The VAE encoder's background warm-up (wamkit.train.warmup): the graph the first step needs is
compiled off the main thread, the latents do not change, and a failing warm-up only says why."""

from types import SimpleNamespace

import torch

from wamkit.model.tokenizer import build_video_tokenizer
from wamkit.train import memory
from wamkit.train.warmup import EncoderWarmup, warmup_clip_shape


def test_warmup_compiles_the_chunk_graph_in_its_thread_and_the_first_real_encode_compiles_nothing(tiny_wan_dir):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    plain = build_video_tokenizer("wan2.2", str(tiny_wan_dir))
    tok = build_video_tokenizer("wan2.2", str(tiny_wan_dir))
    tok.compile_encoder(backend="eager")
    warmup = EncoderWarmup(tok, (2, 9, 32, 48, 3)).start()
    note = warmup.join()
    assert warmup.error is None, warmup.error
    assert counters["stats"]["unique_graphs"] == 1 and warmup.compile_seconds > 0
    assert "2x9x32x48x3" in note and "warmed up in the background" in note

    clips = torch.randint(0, 256, (2, 9, 32, 48, 3), dtype=torch.uint8)
    seconds_before = tok.compile_seconds
    torch.testing.assert_close(tok.encode(clips), plain.encode(clips), rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1  # the warm-up's graph served the real clip
    assert tok.compile_seconds == seconds_before


def test_a_failing_warmup_says_why_and_raises_nothing():
    class Broken:
        device = torch.device("cpu")

        def encode(self, clips):
            raise RuntimeError("CUDA out of memory. Tried to allocate 9.00 GiB\nmore lines")

    warmup = EncoderWarmup(Broken(), (1, 5, 16, 16, 3)).start()
    note = warmup.join()
    assert isinstance(warmup.error, RuntimeError)
    assert "failed (RuntimeError: CUDA out of memory. Tried to allocate 9.00 GiB)" in note
    assert "the first step compiles it instead" in note and "more lines" not in note


def test_an_unstarted_warmup_joins_to_nothing():
    assert EncoderWarmup(None, (1, 5, 16, 16, 3)).join() == ""


def test_the_clip_shape_is_the_first_samples_video_times_the_micro_batch():
    video = torch.zeros(17, 544, 736, 3, dtype=torch.uint8)
    assert warmup_clip_shape([SimpleNamespace(video=video)], 6) == (6, 17, 544, 736, 3)
    assert warmup_clip_shape([SimpleNamespace(video=None, latents=torch.zeros(48, 5, 34, 46))], 6) is None
    assert warmup_clip_shape([], 6) is None


def test_the_gate_counts_the_blocks_this_process_already_holds(monkeypatch):
    """A warm-up's freed blocks sit in torch's cache (reserved, not allocated): they are this run's
    to use, so the gate must not read them as taken by someone else."""
    gib = memory.GIB
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * gib, 140 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 12 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 3 * gib)
    usable, total = memory.usable_bytes(torch.device("cuda"))
    assert total == 140 * gib
    assert usable == 112 * gib - memory.GATE_MARGIN * total
