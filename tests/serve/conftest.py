"""A tiny trained run, its export, and a server on 127.0.0.1 (ephemeral port) around the export."""

import pytest

from tests.helpers import VELOCITY_HEAD
from tests.serve.serve_helpers import NUM_STEPS, SEED, train_tiny_run
from wamkit.export import export_run
from wamkit.policy import Policy
from wamkit.serve import PolicyServer


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory):
    """With the velocity action head: the real-time-chunking tests need a policy whose noise draws differ."""
    return train_tiny_run(tmp_path_factory.mktemp("serve"), extra=VELOCITY_HEAD)


@pytest.fixture(scope="session")
def export_dir(run_dir, tmp_path_factory):
    return export_run(run_dir, tmp_path_factory.mktemp("serve_export") / "policy")


@pytest.fixture(scope="session")
def policy(export_dir):
    return Policy.from_export(export_dir, num_steps=NUM_STEPS)


@pytest.fixture(scope="module")
def server(export_dir):
    """A server on its own Policy instance (the test's `policy` fixture stays untouched), bounded to 200 requests."""
    srv = PolicyServer(Policy.from_export(export_dir, num_steps=NUM_STEPS), host="127.0.0.1", port=0, seed=SEED,
                       batch_window_ms=5, max_request_bytes=64 * 1024, max_requests=200).start_in_thread()
    yield srv
    srv.stop()
    srv.join(30)
