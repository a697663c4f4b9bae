"""Do a policy's CUDA graphs give the plain forward's actions when every batch mixes prompts anew?

Graphs are keyed by padded shape (wamkit.model.flex_attention's mask slots): a graph captured on one
mix of prompts replays every other mix of the same padded shape with the masks rewritten in place.
This loads the policy twice (graphs on and off), predicts the same batches (same noise) through both
and prints the largest difference in normalized action units, and the captures the mixes took.
With --reload, the graphed policy then takes another checkpoint of its run in place (Policy.reload, as
`wamkit eval sim --all-checkpoints` does) and must match that checkpoint loaded afresh, replaying the
graphs it captured before (no new captures for the same shapes).
    python benchmarks/graph_replay_check.py runs/metaworld_mt10 --device cuda [--reload runs/metaworld_mt10/checkpoints/iter_<N>]"""

from __future__ import annotations

import argparse
import random
import sys

import numpy as np
import torch

from wamkit.policy import load_policy
from wamkit.serve.warmup import camera_sizes, warmup_observation


def observations(policy, prompts: list[str], rng: np.random.Generator) -> list[dict]:
    base = warmup_observation(policy, camera_sizes(policy, None) or [(64, 64)] * max(1, len(policy.camera_keys)))
    out = []
    for prompt in prompts:
        obs = dict(base, prompt=prompt)
        images = obs["image"] if isinstance(obs["image"], list) else [obs["image"]]
        noisy = [rng.integers(0, 256, im.shape, dtype=np.uint8) for im in images]
        obs["image"] = noisy if isinstance(obs["image"], list) else noisy[0]
        if "state" in obs:
            obs["state"] = rng.standard_normal(obs["state"].shape).astype(np.float32) * 0.1
        out.append(obs)
    return out


def plain_policy(path: str, device: str):
    """The policy without CUDA graphs: kernel by kernel."""
    plain = load_policy(path, device=device)
    for graphs in (plain.graphs, plain.forward_graphs):
        if graphs is not None:
            graphs.remove()
    return plain


def compare(graphed, plain, batches: list[int], mixes: int) -> float:
    """The largest difference between the two policies' actions over `mixes` prompt mixes a batch size."""
    prompts = [("pick the block " * 4)[:n] for n in range(20, 62, 3)]  # 14 prompt lengths, 20-59 bytes
    rng, pick = np.random.default_rng(0), random.Random(0)
    worst = 0.0
    for batch in batches:
        captures = graphed.graph_captures
        for mix in range(mixes):
            obs = observations(graphed, pick.choices(prompts, k=batch), rng)
            a = graphed.predict_normalized(obs, seed=mix)
            b = plain.predict_normalized(obs, seed=mix)
            worst = max(worst, float((a.float() - b.float()).abs().max()))
        print(f"batch {batch}: {mixes} prompt mixes, {graphed.graph_captures - captures} graph captures, "
              f"largest difference so far {worst:.5f}")
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("policy", help="run, checkpoint or export directory")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", default="2,7,15", help="batch sizes to check")
    parser.add_argument("--mixes", type=int, default=6, help="prompt mixes per batch size")
    parser.add_argument("--tolerance", type=float, default=0.02, help="largest allowed difference (normalized actions)")
    parser.add_argument("--reload", help="another checkpoint of the same run, then loaded into the graphed policy in place")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    graphed = load_policy(args.policy, device=args.device)
    worst = compare(graphed, plain_policy(args.policy, args.device), batches, args.mixes)
    if args.reload:
        graphed.reload(args.reload)
        print(f"reloaded in place: {args.reload}")
        worst = max(worst, compare(graphed, plain_policy(args.reload, args.device), batches, args.mixes))
    ok = worst <= args.tolerance
    print(f"graph replay {'matches' if ok else 'DIFFERS FROM'} the plain forward: {worst:.5f} (tolerance {args.tolerance})")
    return 0 if ok else 1


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    sys.exit(main())
