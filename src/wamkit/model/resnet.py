"""ResNet-18's convolutional trunk (He et al. 2016), with GroupNorm, for reading camera frames from scratch.

ACT and Diffusion Policy read their cameras with a ResNet-18; wamkit's `model.vision_stem = "action_eye"` gives the
action rows the same reader (wamkit.model.vision_stem). It is written here rather than imported because PyPI's
torchvision for the pinned torch is a CUDA build, and because a model trained from scratch on small batches wants
GroupNorm (as Diffusion Policy swaps it in) rather than BatchNorm's running statistics. Layout and parameter count
match torchvision's `resnet18` without its classifier (11,176,512 parameters)."""

from __future__ import annotations

import torch

WIDTHS = (64, 128, 256, 512)
BLOCKS_PER_STAGE = 2
CHANNELS_PER_GROUP = 16  # GroupNorm groups = channels // 16 (4 groups at 64 channels, 32 at 512)


def group_norm(channels: int) -> torch.nn.GroupNorm:
    return torch.nn.GroupNorm(channels // CHANNELS_PER_GROUP, channels)


class BasicBlock(torch.nn.Module):
    """relu(x' + norm(conv(relu(norm(conv(x)))))), x' = x or its strided 1x1 projection when the shape changes."""

    def __init__(self, inputs: int, outputs: int, stride: int):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
        self.norm1 = group_norm(outputs)
        self.conv2 = torch.nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
        self.norm2 = group_norm(outputs)
        self.shortcut = torch.nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = torch.nn.Sequential(torch.nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False),
                                                group_norm(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm1(self.conv1(x)))
        return torch.relu(self.shortcut(x) + self.norm2(self.conv2(h)))


class ResNet18(torch.nn.Module):
    """Images [N, 3, H, W] -> features [N, 512, H/32, W/32] (rounded up): a 7x7 stride-2 convolution, a 3x3
    stride-2 max pool, then four stages of two basic blocks at 64, 128, 256 and 512 channels."""

    def __init__(self, in_channels: int = 3):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(in_channels, WIDTHS[0], 7, stride=2, padding=3, bias=False),
                                        group_norm(WIDTHS[0]), torch.nn.ReLU(), torch.nn.MaxPool2d(3, stride=2, padding=1))
        stages, inputs = [], WIDTHS[0]
        for i, width in enumerate(WIDTHS):
            blocks = [BasicBlock(inputs if b == 0 else width, width, 2 if b == 0 and i > 0 else 1)
                      for b in range(BLOCKS_PER_STAGE)]
            stages.append(torch.nn.Sequential(*blocks))
            inputs = width
        self.stages = torch.nn.Sequential(*stages)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))
