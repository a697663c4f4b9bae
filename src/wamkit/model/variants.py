"""Which transformer class a run builds and a saved config.json names: diffusers' own, or one with our
additions for models trained from scratch (frame positions, a convolutional or residual stem, or both)."""

from __future__ import annotations

from diffusers import Cosmos3OmniTransformer

from wamkit.model.frame_positions import FramePositionCosmos3
from wamkit.model.vision_stem import ActionEyeStemCosmos3, ActionKeypointStemCosmos3, ConvStemCosmos3, ResNetStemCosmos3


class ConvStemFramePositionCosmos3(ConvStemCosmos3, FramePositionCosmos3):
    """Both additions: the stem's features and the frame positions are added to the same patches (the
    inherited __init__ carries diffusers' signature, which from_config reads)."""


class ResNetStemFramePositionCosmos3(ResNetStemCosmos3, FramePositionCosmos3):
    """The residual stem and the frame positions."""


class ActionKeypointStemFramePositionCosmos3(ActionKeypointStemCosmos3, FramePositionCosmos3):
    """The residual stem with keypoints for the action rows, and the frame positions."""


class ActionEyeStemFramePositionCosmos3(ActionEyeStemCosmos3, FramePositionCosmos3):
    """The residual stem with a ResNet-18's read-out for the action rows, and the frame positions."""


BY_OPTIONS = {("none", "none"): Cosmos3OmniTransformer, ("fourier", "none"): FramePositionCosmos3,
              ("none", "conv"): ConvStemCosmos3, ("fourier", "conv"): ConvStemFramePositionCosmos3,
              ("none", "resnet"): ResNetStemCosmos3, ("fourier", "resnet"): ResNetStemFramePositionCosmos3,
              ("none", "action_keypoints"): ActionKeypointStemCosmos3,
              ("fourier", "action_keypoints"): ActionKeypointStemFramePositionCosmos3,
              ("none", "action_eye"): ActionEyeStemCosmos3, ("fourier", "action_eye"): ActionEyeStemFramePositionCosmos3}
BY_NAME = {cls.__name__: cls for cls in BY_OPTIONS.values()}


def transformer_class(frame_positions: str = "none", vision_stem: str = "none") -> type[Cosmos3OmniTransformer]:
    """The class of `model.frame_positions` x `model.vision_stem` (both validated by the config schema)."""
    return BY_OPTIONS[(frame_positions, vision_stem)]


def transformer_class_named(class_name: str | None) -> type[Cosmos3OmniTransformer]:
    """The class a saved config.json names (`_class_name`); diffusers' own for any other name."""
    return BY_NAME.get(class_name or "", Cosmos3OmniTransformer)
