"""`wamkit serve --warmup`: every batch size up to --max-batch runs once plain and once with real-time
chunking, at the training cameras' size (recorded in the data contract), before /healthz answers 200;
until then it answers 503."""

import threading
import urllib.error
import urllib.request

import pytest

from tests.serve.serve_helpers import NUM_STEPS
from wamkit.errors import WamkitError
from wamkit.policy import Policy
from wamkit.serve import PolicyServer
from wamkit.serve.server import predict_batch
from wamkit.serve.warmup import parse_size


def _health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_healthz_is_503_until_every_batch_size_ran_at_the_training_size(export_dir):
    policy = Policy.from_export(export_dir, num_steps=NUM_STEPS)
    assert policy.contract["camera_sizes"] == [[64, 64]]
    release, seen = threading.Event(), []

    def gated(policy, observations, seeds, num_steps):
        release.wait(60)
        seen.append((len(observations), observations[0]["image"].shape, "committed_actions" in observations[0]))
        return predict_batch(policy, observations, seeds, num_steps)

    server = PolicyServer(policy, port=0, max_batch=3, warmup=True)
    server.predict_batch = gated
    server.start_in_thread()
    try:
        assert _health(server.port) == 503  # listening, not ready
        release.set()
        assert server.warmed_up.wait(120)
        assert _health(server.port) == 200
        # every batch size plain and with real-time chunking's fields (its guided path compiles apart)
        assert seen == [(b, (64, 64, 3), rtc) for b in (1, 2, 3) for rtc in (False, True)]
        assert [b for b, _ in server.warmup_seconds] == [1, 2, 3]
    finally:
        server.stop()
        server.join(30)


def test_no_warmup_on_the_cpu_by_default_and_an_unknown_size_is_named(export_dir):
    policy = Policy.from_export(export_dir, num_steps=NUM_STEPS)
    assert PolicyServer(policy, port=0)._warmup_sizes() is None  # auto: only on CUDA
    assert PolicyServer(policy, port=0, warmup=True, warmup_size=(32, 48))._warmup_sizes() == [(32, 48)]
    del policy.contract["camera_sizes"]  # an export from before camera sizes were recorded
    with pytest.raises(WamkitError, match="--warmup-size"):
        PolicyServer(policy, port=0, warmup=True)._warmup_sizes()
    with pytest.raises(WamkitError, match="HxW"):
        parse_size("480by640")
    assert parse_size("480x640") == (480, 640)


def test_the_server_reads_the_device_the_policy_decided_once(export_dir):
    import torch

    policy = Policy.from_export(export_dir, num_steps=NUM_STEPS)
    assert policy.device == next(policy.model.parameters()).device == torch.device("cpu")
    policy.device = torch.device("cuda")  # what a policy loaded on a GPU says: auto warm-up follows it, not a parameter
    assert PolicyServer(policy, port=0)._warmup_sizes() == [(64, 64)]
