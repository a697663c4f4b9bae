"""A training-only head that asks the action rows where the episode ends (`diffusion.goal_state_loss_weight`).

A linear probe found the goal marker's position in the observed frame's tokens and not in what the action head
reads (benchmarks/RESULTS.md, thirty-third session): the action loss alone pulls a push's goal into the action rows
only slowly, while ACT gets there within the same samples. The robot's state at the last frame of a demonstration
is where that goal was (a reach ends at its marker; a push or a place ends beside it), and the recording holds it
for every window, so a linear map of the noisy action rows' last hidden states (the input of `action_proj_out`),
averaged over a sample's rows, is trained to predict it. Nothing at inference reads the head: loading a checkpoint
for inference removes it (`drop_goal_head`), and an export never holds it."""

from __future__ import annotations

import torch

GOAL_HEAD = "action_goal_head"  # "action_" puts it in the generation pathway, trained and checkpointed with the rest


def attach_goal_head(model: torch.nn.Module) -> None:
    """Add the head [hidden_size -> action_dim] (the state's padded width) to a Cosmos3 transformer, in place."""
    model.add_module(GOAL_HEAD, torch.nn.Linear(model.config.hidden_size, model.config.action_dim))


def drop_goal_head(model: torch.nn.Module) -> torch.nn.Module:
    """`model` without the head (a no-op when it has none): inference and export see the plain transformer."""
    if hasattr(model, GOAL_HEAD):
        delattr(model, GOAL_HEAD)
    return model


def is_goal_head_param(name: str) -> bool:
    """A parameter no base checkpoint holds: the head starts fresh whatever `checkpoint.load_path` loads."""
    return name.startswith(f"{GOAL_HEAD}.")


def goal_state_predictions(rows: torch.Tensor, noisy_rows_per_item: list[int], merged_samples: int = 0) -> torch.Tensor:
    """The head's outputs at the noisy action rows ([N, D], packed item after item as diffusers packs them) ->
    one prediction per sample with noisy rows, [K, D]: each sample's rows averaged. A merged pack holds
    `merged_samples` samples of `noisy_rows_per_item[0]` rows each; otherwise each item is one sample, and items
    without noisy rows (forward dynamics) have no prediction."""
    if merged_samples:
        per_sample = noisy_rows_per_item[0]
        return rows.view(merged_samples, per_sample, rows.shape[-1]).mean(dim=1)
    chunks = rows.split(noisy_rows_per_item)
    return torch.stack([chunk.mean(dim=0) for chunk, count in zip(chunks, noisy_rows_per_item) if count])
