"""Where a push policy goes wrong, step by step: the hand, puck and goal positions and the policy's and the
scripted expert's actions every 8 steps of closed-loop Meta-World push episodes (held-out seeds 1000).

    python benchmarks/push_trace.py RUN EPISODES [--budget 120]     # e.g. runs/pu_z2_sf 0,1

The expert is asked in the policy's own states (what it would do there), as `wamkit eval sim --expert-trace`
counts over whole episodes; this prints the trajectory those counts come from (benchmarks/RESULTS.md,
twenty-ninth session: the tiny policy descends 4-5 cm from the puck where the expert waits for 2 cm).
"""

from __future__ import annotations

import argparse

from wamkit.eval.realtime import run_episode
from wamkit.eval.sim_eval import load_policy, policy_cameras
from wamkit.sim.envs import make_env
from wamkit.sim.record import episode_seed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="run directory, checkpoint or export")
    p.add_argument("episodes", help="comma-separated episode indices at seed 1000")
    p.add_argument("--budget", type=int, default=120, help="env steps per episode")
    args = p.parse_args()
    policy = load_policy(args.run, num_steps=10)
    with make_env("metaworld/push-v3", resolution=64, camera=policy_cameras(policy, None)) as env:
        raw = []  # the raw observation before each action (hand 0:3, puck 4:7, goal 36:39): what the policy's image hides
        step = env.step

        def logged_step(action):
            raw.append(env._raw_obs.copy())
            return step(action)

        env.step = logged_step
        for i in (int(x) for x in args.episodes.split(",")):
            seed = episode_seed(1000, i)
            raw.clear()
            first = env.reset(seed)
            result = run_episode(policy, env, first, mode="sync", delay=0, horizon=8, seed=seed, num_steps=10,
                                 budget=args.budget, expert=True)  # the expert asked in every state the policy acts in
            print(f"episode {i} success {result.success}")
            for t in range(0, len(raw), 8):
                obs = raw[t]
                print(f"t{t:3d} hand {obs[:3].round(3)} puck {obs[4:7].round(3)} goal {obs[36:39].round(3)} | "
                      f"policy {result.executed[t].round(2)} expert {result.expert[t].round(2)}")


if __name__ == "__main__":
    main()
