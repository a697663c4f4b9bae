"""Real-time chunking over the wire: committed actions and the delay travel in the request, the reply
equals Policy.predict with the same keys, bad RTC fields get named errors, plain clients are unaffected."""

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from tests.serve.serve_helpers import SEED, as_policy_obs, make_obs


def _rtc(request: dict, committed: np.ndarray, delay) -> dict:
    return {**request, "committed_actions": committed, "inference_delay": delay}


def test_rtc_round_trip_equals_policy_predict(server, policy):
    client = WebsocketClientPolicy("127.0.0.1", server.port)
    assert client.get_server_metadata()["rtc_max_guidance"] == 5.0
    request = make_obs(5)
    previous = client.infer({**request, "seed": 1})["action"]
    committed = previous[4:]  # 4 actions executed since that chunk's observation
    reply = client.infer(_rtc(request, committed, 2))["action"]
    expected = policy.predict([{**as_policy_obs(request), "committed_actions": committed, "inference_delay": 2}], seed=SEED)[0]
    np.testing.assert_allclose(reply, expected, rtol=1e-5, atol=1e-5)
    plain = client.infer(request)["action"]
    assert np.abs(reply[:2] - committed[:2]).mean() < 0.2 * np.abs(plain[:2] - committed[:2]).mean()
    # numpy scalars and lists (what other msgpack clients send) are accepted too
    as_lists = client.infer(_rtc(request, committed.tolist(), np.int64(2)))["action"]
    np.testing.assert_allclose(as_lists, reply, rtol=1e-5, atol=1e-5)
    client._ws.close()


@pytest.mark.parametrize("fields, message", [
    ({"committed_actions": np.zeros((4, 5), np.float32), "inference_delay": 1},
     "request['committed_actions']: shape is (4, 5), expected [K, 3]"),
    ({"committed_actions": np.zeros((4, 3), np.float32)}, "request['inference_delay']: is missing"),
    ({"committed_actions": np.zeros((4, 3), np.float32), "inference_delay": 6}, "request['inference_delay']: is 6"),
    ({"committed_actions": np.zeros((4, 3), np.float32), "inference_delay": 1, "execution_horizon": 9},
     "request['execution_horizon']: is 9"),
    ({"inference_delay": 1}, "without 'committed_actions'"),
])
def test_bad_rtc_fields_get_a_named_error(server, fields, message):
    client = WebsocketClientPolicy("127.0.0.1", server.port)
    with pytest.raises(RuntimeError, match="Error in inference server") as info:
        client.infer({**make_obs(1), **fields})
    assert message in str(info.value)
    assert client.infer(make_obs(2))["action"].shape == (8, 3)  # the connection keeps serving
    client._ws.close()
