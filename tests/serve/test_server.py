"""`wamkit serve`: openpi's real client gets raw action chunks equal to Policy.predict; bad requests get
named errors and the server keeps serving; concurrent requests share forwards; /healthz answers."""

import threading
import urllib.request

import numpy as np
import pytest
import websockets.sync.client
from openpi_client import msgpack_numpy as opm
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosedError

from tests.serve.serve_helpers import NUM_STEPS, SEED, as_policy_obs, make_obs
from tests.helpers import DEMO_RECIPE
from wamkit.config import load_experiment
from wamkit.policy import Policy
from wamkit.serve import PolicyServer, observation_from_request
from wamkit.serve.protocol import ProtocolError


def _raw_client(server):
    conn = websockets.sync.client.connect(f"ws://127.0.0.1:{server.port}", compression=None, max_size=None)
    opm.unpackb(conn.recv())  # metadata
    return conn


def test_openpi_client_gets_metadata_and_the_policys_actions(server, policy):
    client = WebsocketClientPolicy("127.0.0.1", server.port)
    meta = client.get_server_metadata()
    assert meta["action_dim"] == 3 and meta["chunk_length"] == 8 and meta["state_dim"] == 4 and meta["fps"] == 10.0
    assert meta["camera_keys"] == ["observation.images.front"] and meta["num_steps"] == NUM_STEPS
    assert meta["domain_id"] == load_experiment(DEMO_RECIPE).data.domain_id  # the run's domain row
    assert meta["protocol"] == "openpi-msgpack-numpy" and meta["seed"] == SEED
    request = make_obs(3)
    reply = client.infer(request)
    action = reply["action"]
    assert action.shape == (8, 3) and action.dtype == np.float32
    expected = policy.predict([as_policy_obs(request)], seed=SEED)[0]
    np.testing.assert_allclose(action, expected, rtol=1e-6, atol=1e-6)
    timing = reply["server_timing"]
    assert timing["infer_ms"] > 0 and timing["total_ms"] >= timing["infer_ms"] and timing["batch_size"] >= 1
    # a per-request seed overrides the server's; the nested `images` form gives the same as the flat one
    nested = {"images": {"front": request["observation/image"]}, "state": request["observation/state"],
              "prompt": request["prompt"], "seed": 5}
    np.testing.assert_allclose(client.infer(nested)["action"], policy.predict([as_policy_obs(request)], seed=5)[0],
                               rtol=1e-6, atol=1e-6)
    client._ws.close()


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.pop("observation/state"), "request['state']: is missing"),
    (lambda r: r.update({"observation/image": np.zeros((64, 64), np.uint8)}), "request['image']: shape is (64, 64)"),
    (lambda r: r.update({"observation/image": np.zeros((64, 64, 3), np.float32)}), "dtype is float32"),
    (lambda r: r.update({"observation/state": np.zeros(3)}), r"request['state']: shape is (3,), the model expects [4]"),
    (lambda r: r.update({"observation/state": np.array([0.1, np.nan, 0, 0])}), "NaN"),
    (lambda r: r.pop("prompt"), "request['prompt']: is missing"),
    (lambda r: r.update({"wrist": np.zeros(3)}), "request['wrist']: is not a request key"),
    (lambda r: r.update({"images": {"top": np.zeros((64, 64, 3), np.uint8)}}), "given together with"),
    (lambda r: r.update({"seed": -1}), "request['seed']"),
])
def test_malformed_requests_get_a_named_error_and_the_client_can_retry(server, policy, mutate, message):
    client = WebsocketClientPolicy("127.0.0.1", server.port)
    bad = make_obs(1)
    mutate(bad)
    with pytest.raises(RuntimeError, match="Error in inference server") as info:
        client.infer(bad)
    assert message in str(info.value)
    good = make_obs(2)
    np.testing.assert_allclose(client.infer(good)["action"], policy.predict([as_policy_obs(good)], seed=SEED)[0],
                               rtol=1e-6, atol=1e-6)  # same connection still served
    client._ws.close()


def test_oversized_garbage_and_text_messages_get_errors_and_the_server_stays_up(server):
    conn = _raw_client(server)
    big = make_obs(0)
    big["observation/image"] = np.zeros((128, 256, 3), np.uint8)  # ~98 KiB > the fixture's 64 KiB limit
    conn.send(opm.packb(big))
    reply = conn.recv()
    assert isinstance(reply, str) and "over the server's limit of 65536 bytes" in reply and "--max-request-bytes" in reply
    conn.send(b"\x00\xffnot msgpack at all \xc1")
    reply = conn.recv()
    assert isinstance(reply, str) and "is not valid msgpack" in reply
    conn.send(b"\x93\x01\x02")  # truncated msgpack
    assert "is not valid msgpack" in conn.recv()
    conn.send(opm.packb([1, 2, 3]))
    assert "must be a dict" in conn.recv()
    conn.send("hello")
    assert "is a text message" in conn.recv()
    conn.send(opm.packb(make_obs(4)))
    assert opm.unpackb(conn.recv())["action"].shape == (8, 3)  # still healthy on this connection
    # beyond twice the limit the websocket layer closes this connection with 1009; the server keeps serving
    conn.send(b"\0" * (3 * 64 * 1024))
    with pytest.raises(ConnectionClosedError) as info:
        conn.recv()
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009
    conn = _raw_client(server)
    conn.send(opm.packb(make_obs(4)))
    assert opm.unpackb(conn.recv())["action"].shape == (8, 3)
    conn.close()


def test_healthz_is_plain_http_200_ok(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=10) as response:
        assert response.status == 200 and response.read().decode().strip() == "ok"


def test_concurrent_clients_share_forwards_and_get_their_own_results(export_dir, policy):
    srv = PolicyServer(Policy.from_export(export_dir, num_steps=NUM_STEPS), host="127.0.0.1", port=0, seed=SEED,
                       batch_window_ms=400, max_requests=8).start_in_thread()
    calls = []
    inner = srv.predict_batch

    def counting(policy_, observations, seeds, num_steps):
        calls.append(len(observations))
        return inner(policy_, observations, seeds, num_steps)

    srv.predict_batch = counting
    requests = [make_obs(10 + i, prompt=f"task {i}") for i in range(4)]
    clients = [WebsocketClientPolicy("127.0.0.1", srv.port) for _ in requests]
    barrier = threading.Barrier(len(requests))
    replies = [None] * len(requests)

    def run(i):
        barrier.wait()
        replies[i] = clients[i].infer(requests[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    srv.stop()
    srv.join(30)
    assert sum(calls) == 4 and len(calls) < 4, calls
    assert max(r["server_timing"]["batch_size"] for r in replies) >= 2
    for request, reply in zip(requests, replies):
        expected = policy.predict([as_policy_obs(request)], seed=SEED)[0]
        np.testing.assert_allclose(reply["action"], expected, rtol=1e-4, atol=1e-4)  # batching does not change the noise
    others = [policy.predict([as_policy_obs(r)], seed=SEED)[0] for r in requests[1:]]
    assert not any(np.allclose(replies[0]["action"], o, atol=1e-4) for o in others)


def test_a_lone_client_does_not_wait_for_the_batch_window(export_dir):
    """A batch holding a request from every open connection is complete: with one client and a 60 s
    window the reply comes without the wait (the old loop held every request for the window)."""
    srv = PolicyServer(Policy.from_export(export_dir, num_steps=NUM_STEPS), host="127.0.0.1", port=0, seed=SEED,
                       batch_window_ms=60_000, max_requests=2).start_in_thread()
    client = WebsocketClientPolicy("127.0.0.1", srv.port)
    timings = [client.infer(make_obs(3 + i))["server_timing"] for i in range(2)]
    srv.stop()
    srv.join(30)
    assert all(t["batch_size"] == 1 and t["total_ms"] < 30_000 for t in timings), timings


def test_stop_after_the_server_stopped_itself_is_a_no_op(export_dir):
    """max_requests ends the server and closes its loop; a later stop() (as every caller's cleanup does) must not
    raise "Event loop is closed" (it raced the loop's close in CI)."""
    srv = PolicyServer(Policy.from_export(export_dir, num_steps=NUM_STEPS), host="127.0.0.1", port=0, seed=SEED,
                       max_requests=1).start_in_thread()
    WebsocketClientPolicy("127.0.0.1", srv.port).infer(make_obs(5))
    srv.join(30)
    assert not srv._thread.is_alive() and srv._loop.is_closed()
    srv.stop()
    srv.stop()


def test_request_mapping_camera_keys():
    img = np.zeros((8, 8, 3), np.uint8)
    obs, seed = observation_from_request({"images": {"observation.images.front": img}, "state": [1, 2], "prompt": "p"},
                                         ["observation.images.front"])
    assert len(obs["image"]) == 1 and obs["image"][0].shape == (8, 8, 3) and seed is None
    with pytest.raises(ProtocolError, match=r"\['images'\]\['side'\]: is not a camera"):
        observation_from_request({"images": {"side": img}, "state": [1], "prompt": "p"}, ["observation.images.front"])
    with pytest.raises(ProtocolError, match=r"\['images'\]\['observation.images.wrist'\]: is missing"):
        observation_from_request({"images": {"front": img}, "state": [1], "prompt": "p"},
                                 ["observation.images.front", "observation.images.wrist"])
    two, _ = observation_from_request({"images": {"wrist": img + 1, "front": img}, "state": [1], "prompt": "p"},
                                      ["observation.images.front", "observation.images.wrist"])
    assert [v.max() for v in two["image"]] == [0, 1]  # contract order, not request order
    wide = np.zeros((8, 12, 3), np.uint8)
    mixed, _ = observation_from_request({"images": {"wrist": wide, "front": img}, "state": [1], "prompt": "p"},
                                        ["observation.images.front", "observation.images.wrist"])
    assert [v.shape for v in mixed["image"]] == [(8, 8, 3), (8, 12, 3)]  # sizes kept: the policy composes the canvas


def test_policy_takes_camera_views_of_different_sizes_as_a_list():
    from wamkit.policy.policy import Policy, PolicyInputError

    views = Policy._views("obs['image']", [np.zeros((8, 8, 3), np.uint8), np.ones((6, 12, 3), np.uint8)])
    assert [v.shape for v in views] == [(8, 8, 3), (6, 12, 3)]
    assert len(Policy._views("obs['image']", np.zeros((2, 8, 8, 3), np.uint8))) == 2
    with pytest.raises(PolicyInputError, match=r"obs\['image'\]\[1\]: dtype is float32"):
        Policy._views("obs['image']", [np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8, 3), np.float32)])
    with pytest.raises(PolicyInputError, match="several views"):
        Policy._views("obs['image']", [np.zeros((2, 8, 8, 3), np.uint8)])


def test_load_policy_accepts_an_export_or_a_run_dir(export_dir, run_dir):
    from wamkit.serve import load_policy

    assert "export" in load_policy(export_dir, num_steps=2).loaded.source
    assert "checkpoint" in load_policy(run_dir, num_steps=2).loaded.source
