"""Data layer: LeRobot v3.0 reading, windows, normalization, samples, splits and the demo dataset."""

from wamkit.data.lerobot_v3 import LeRobotV3Dataset
from wamkit.data.normalize import NORMALIZATION_MODES, Normalizer
from wamkit.data.sample import SampleTransform, TrainingSample
from wamkit.data.split import split_episodes
from wamkit.data.synth import (
    SynthEpisode,
    compute_stats,
    generate_episodes,
    render_scene,
    write_demo_dataset,
)
from wamkit.data.windows import Window, WindowDataset

__all__ = [
    "LeRobotV3Dataset",
    "NORMALIZATION_MODES",
    "Normalizer",
    "SampleTransform",
    "SynthEpisode",
    "TrainingSample",
    "Window",
    "WindowDataset",
    "compute_stats",
    "generate_episodes",
    "render_scene",
    "split_episodes",
    "write_demo_dataset",
]
