"""Host tensor ops a training sample adds to one objective step (forward + backward), by function.

A small model's step on a GPU is bound by the host when its Python issues ops per sample: at batch 256
every op a sample costs ~256 dispatches of a few microseconds. This counts torch.profiler's top-level aten
ops of one `ModeObjective` step (the tiny preset, dense attention: no per-sample attention ops) at two
batch sizes of one layout, the MT10 recipe's (64 px, 17 frames, space-to-depth by 4, chunk 16, state row),
and prints the difference per sample by function. Data loading is left out (it runs in loader workers).

    python benchmarks/step_host_ops.py [--small 8 --large 16]
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from wamkit.config.schema import DiffusionConfig
from wamkit.data.sample import TrainingSample
from wamkit.diffusion.objective import ModeObjective
from wamkit.model.cosmos3 import build_transformer
from wamkit.model.tokenizer import build_text_tokenizer, build_video_tokenizer
from wamkit.train.step_profile import _top_level_op, site_of

TASKS = ("open the drawer", "close the drawer", "press the button down from the top", "slide the window open")


def objective() -> ModeObjective:
    torch.manual_seed(0)
    tokenizer = build_video_tokenizer("pixel_unshuffle", "", 4)
    model = build_transformer("tiny", tokenizer.latent_channels, 8, 4)
    diffusion = DiffusionConfig(action_prediction="x0", x0_loss_weighting="uniform", shift=1.0)
    return ModeObjective(model, tokenizer, build_text_tokenizer("", 64), diffusion, "{task}", 80.0, "sdpa")


def ops_by_function(obj: ModeObjective, batch: int) -> Counter:
    mask = torch.zeros(8, dtype=torch.bool)
    mask[:4] = True
    samples = [TrainingSample(video=torch.randint(0, 256, (17, 64, 64, 3), dtype=torch.uint8), actions=torch.rand(16, 8),
                              state=torch.rand(8), action_mask=mask, task=TASKS[i % len(TASKS)], domain_id=0) for i in range(batch)]
    generators = [torch.Generator().manual_seed(1000 + i) for i in range(batch)]
    obj(samples, generators).total.backward()  # warm: layouts and masks cached, as in training
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        obj(samples, generators).total.backward()
    return Counter(site_of(e) for e in prof.events() if _top_level_op(e))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=8)
    parser.add_argument("--large", type=int, default=16)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    obj = objective()
    small, large = ops_by_function(obj, args.small), ops_by_function(obj, args.large)
    extra = args.large - args.small
    rows = sorted(((large[k] - small[k]) / extra, k) for k in set(small) | set(large))
    print(f"| function | top-level ops a sample (batch {args.small} -> {args.large}) |\n| --- | ---: |")
    for per_sample, site in reversed(rows):
        if per_sample > 0:
            print(f"| {site} | {per_sample:.1f} |")
    print(f"| **all** | **{(sum(large.values()) - sum(small.values())) / extra:.1f}** |")
    print(f"\nwhole step: {sum(small.values()):,} ops at batch {args.small}, {sum(large.values()):,} at {args.large}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
