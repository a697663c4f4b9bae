"""`python -m wamkit.config.run_dir RECIPE [--set KEY=VALUE ...] [other train flags]`: print the run
directory that `wamkit train` with the same arguments writes (flags other than --set are ignored), so a
script evaluates the run it trained whatever job.name / job.output_root its caller overrode
(scripts/demo.sh)."""

from __future__ import annotations

import argparse
import sys

from wamkit.config.loader import load_experiment


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m wamkit.config.run_dir")
    parser.add_argument("recipe")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args, _ = parser.parse_known_args(argv)
    print(load_experiment(args.recipe, args.overrides).job.run_dir())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
