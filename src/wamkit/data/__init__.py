"""Data layer: LeRobot v3.0 reading, windows, normalization, samples, splits, the demo dataset, the dataset doctor, stats and modality.json."""

from wamkit.data.batching import pack_by_token_budget
from wamkit.data.canvas import BUCKETS, CanvasTransform, canvas_size, compose_canvas, compose_frames
from wamkit.data.doctor import DatasetExpectation, DoctorReport, Finding, diagnose, doctor_main
from wamkit.data.lerobot_v3 import LeRobotV3Dataset
from wamkit.data.modality import ModalitySelector
from wamkit.data.multi import MultiDataset, open_lerobot
from wamkit.data.order import EpisodeShuffleOrder
from wamkit.data.normalize import NORMALIZATION_MODES, Normalizer, check_constant_channels
from wamkit.data.sample import SampleTransform, TrainingSample
from wamkit.data.selection import KeepRanges, NoWindowsKept, trajectory_keys
from wamkit.data.split import split_episodes
from wamkit.data.stats import compute_dataset_stats, stats_main, write_stats
from wamkit.data.synth import SynthEpisode, generate_episodes, render_scene, write_demo_dataset
from wamkit.data.writer import RecordedEpisode, compute_stats, write_lerobot_dataset
from wamkit.data.windows import Window, WindowDataset

__all__ = [
    "BUCKETS",
    "CanvasTransform",
    "EpisodeShuffleOrder",
    "KeepRanges",
    "MultiDataset",
    "NoWindowsKept",
    "canvas_size",
    "compose_canvas",
    "compose_frames",
    "open_lerobot",
    "pack_by_token_budget",
    "trajectory_keys",
    "DatasetExpectation",
    "DoctorReport",
    "Finding",
    "ModalitySelector",
    "compute_dataset_stats",
    "diagnose",
    "doctor_main",
    "stats_main",
    "write_stats",
    "LeRobotV3Dataset",
    "NORMALIZATION_MODES",
    "Normalizer",
    "check_constant_channels",
    "SampleTransform",
    "SynthEpisode",
    "TrainingSample",
    "Window",
    "WindowDataset",
    "compute_stats",
    "RecordedEpisode",
    "write_lerobot_dataset",
    "generate_episodes",
    "render_scene",
    "split_episodes",
    "write_demo_dataset",
]
