"""A run trained on a dataset with a constant action and state channel: training proceeds, and the
checkpoint, its export and `wamkit serve` return exactly the constant in that action channel."""

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from tests.helpers import CONSTANT_ACTION, CONSTANT_STATE, train_tiny_run, with_constant_channels
from wamkit.data import write_demo_dataset
from wamkit.export import export_run
from wamkit.policy import Policy
from wamkit.serve import PolicyServer

CHANNEL, VALUE = CONSTANT_ACTION[0], np.float32(CONSTANT_ACTION[1])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("const_policy")
    with_constant_channels(write_demo_dataset(tmp / "reach", num_episodes=8))  # train_tiny_run trains on tmp/reach
    return train_tiny_run(tmp, "const_run")


def _obs(seed=0, fixed=CONSTANT_STATE[1]):
    rng = np.random.default_rng(seed)
    state = rng.uniform(0.2, 0.8, 4)
    state[CONSTANT_STATE[0]] = fixed
    return {"image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), "state": state, "prompt": "move to the green target"}


def test_checkpoint_and_export_predict_the_constant_exactly(run_dir, tmp_path):
    policy = Policy.from_checkpoint(run_dir, num_steps=3)
    assert policy.contract["action_normalizer"]["constant"]["channels"] == [CHANNEL]
    # a state off its recorded constant (sensor noise) still reads as 0 there, as in training
    for obs in (_obs(0), _obs(1, fixed=CONSTANT_STATE[1] + 0.01)):
        chunk = policy.predict([obs], seed=2)[0]
        assert chunk.shape == (8, 3) and np.isfinite(chunk).all()
        assert np.all(chunk[:, CHANNEL] == VALUE), chunk[:, CHANNEL]
        assert len(np.unique(chunk[:, 0])) > 1  # the other channels are the model's
    exported = Policy.from_export(export_run(run_dir, tmp_path / "export"), num_steps=3)
    assert np.all(exported.predict([_obs(3)], seed=4)[0][:, CHANNEL] == VALUE)


def test_serve_returns_the_constant_exactly(run_dir):
    server = PolicyServer(Policy.from_checkpoint(run_dir, num_steps=3), host="127.0.0.1", port=0, seed=5,
                          batch_window_ms=5, max_requests=10).start_in_thread()
    try:
        obs = _obs(7)
        reply = WebsocketClientPolicy("127.0.0.1", server.port).infer(
            {"observation/image": obs["image"], "observation/state": obs["state"], "prompt": obs["prompt"]})
        action = reply["action"]
        assert action.shape == (8, 3) and np.all(action[:, CHANNEL] == VALUE)
    finally:
        server.stop()
        server.join(30)
