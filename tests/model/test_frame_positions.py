"""model.frame_positions = "fourier": vision patches carry their place in the frame in diffusers' packing
order, the network starts as plain Cosmos3 (zero projection), the projection trains, and a run with it
saves, reloads and exports to a directory that loads back as the same model (tests/model/test_vision_stem.py,
with the other variants)."""

import pytest
import torch

from tests.helpers import DEMO_RECIPE
from wamkit.config import load_experiment
from wamkit.errors import ConfigError
from wamkit.model.cosmos3 import build_transformer, set_trainable
from wamkit.model.frame_positions import FEATURES, FramePositionCosmos3, axis_features, grid_features
from wamkit.model.materialize import materialize

FOURIER = 'model.frame_positions="fourier"'


def test_features_follow_the_packing_order_rows_then_columns_per_frame():
    features = grid_features((2, 5, 6), patch=2, device=torch.device("cpu"))  # 5 rows pad to 3 token rows
    rows, cols = axis_features(3, torch.device("cpu")), axis_features(3, torch.device("cpu"))
    assert features.shape == (2 * 3 * 3, FEATURES)
    for t in range(2):
        for h in range(3):
            for w in range(3):
                token = features[t * 9 + h * 3 + w]
                torch.testing.assert_close(token[: FEATURES // 2], rows[h])
                torch.testing.assert_close(token[FEATURES // 2:], cols[w])
    assert len({tuple(f.tolist()) for f in features[:9]}) == 9  # every place of a frame differs


def _pair(seed: int = 0):
    torch.manual_seed(seed)
    plain = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4)
    placed = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4, frame_positions="fourier")
    missing, unexpected = placed.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["frame_position.weight"] and not unexpected
    return plain, placed


def test_starts_as_plain_cosmos3_and_then_tells_places_of_a_uniform_frame_apart():
    plain, placed = _pair()
    assert isinstance(placed, FramePositionCosmos3) and not placed.frame_position.weight.any()
    uniform = [torch.ones(1, 12, 1, 8, 8)]  # every patch the same
    a, shapes = plain._patchify_and_pack_latents(uniform)
    b, _ = placed._patchify_and_pack_latents(uniform)
    torch.testing.assert_close(a, b)
    assert shapes == [(1, 8, 8)] and len({tuple(r.tolist()) for r in a}) == 1
    with torch.no_grad():
        placed.frame_position.weight.normal_()
    b, _ = placed._patchify_and_pack_latents(uniform)
    assert len({tuple(r.tolist()) for r in b}) == 16  # 4x4 tokens, each its own place
    # a pack of several latents: each its own features, shapes built once
    c, _ = placed._patchify_and_pack_latents([torch.ones(1, 12, 2, 4, 8), *uniform, torch.ones(1, 12, 2, 4, 8)])
    assert c.shape == (16 + 16 + 16, 48) and len(placed._features_by_shape) == 2
    torch.testing.assert_close(c[16:32], b)
    torch.testing.assert_close(c[:16], c[32:])


def test_materialised_projection_starts_at_zero_and_is_trainable():
    with torch.device("meta"):
        model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4, frame_positions="fourier")
    materialize(model, torch.device("cpu"), seed=0)
    assert not model.frame_position.weight.any()
    set_trainable(model, train_text_pathway=False)
    assert model.frame_position.weight.requires_grad


def test_a_base_checkpoint_or_an_unknown_kind_is_a_named_error():
    with pytest.raises(ConfigError, match="frame_positions"):
        load_experiment(DEMO_RECIPE, [FOURIER, 'checkpoint.load_path="/some/base"'])
    with pytest.raises(ConfigError, match="frame_positions"):
        load_experiment(DEMO_RECIPE, ['model.frame_positions="learned"'])

