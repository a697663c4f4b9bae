"""`wamkit serve` refuses (or, when asked, resizes) camera images of another size than training's, and
says on its console what it serves, each refused request, periodic counts with latency percentiles
and, on SIGTERM, that it stopped."""

import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from tests.helpers import REPO
from tests.serve.serve_helpers import NUM_STEPS, SEED, as_policy_obs, make_obs
from wamkit.data.canvas import resize_view
from wamkit.policy import Policy
from wamkit.serve import PolicyServer, observation_from_request
from wamkit.serve.protocol import ProtocolError

FRONT = ["observation.images.front"]


def test_a_camera_of_another_size_is_refused_or_resized_like_the_canvas():
    big = np.random.default_rng(0).integers(0, 256, (128, 128, 3), dtype=np.uint8)
    request = {"observation/image": big, "state": [0.0] * 4, "prompt": "p"}
    with pytest.raises(ProtocolError, match=r"(?s)request\['observation/image'\]: is 128x128; camera 'observation.images.front' "
                                            r"was trained at 64x64 .*--resize-images"):
        observation_from_request(request, FRONT, camera_sizes=[(64, 64)])
    with pytest.raises(ProtocolError, match=r"request\['images'\]\['observation.images.front'\]: is 128x128"):
        observation_from_request({"images": {"front": big}, "state": [0.0], "prompt": "p"}, FRONT, camera_sizes=[(64, 64)])
    obs, _ = observation_from_request(request, FRONT, camera_sizes=[(64, 64)], resize=True)
    assert obs["image"][0].shape == (64, 64, 3)
    np.testing.assert_array_equal(obs["image"][0], resize_view(big, (64, 64)))
    small = big[:64, :64].copy()
    same, _ = observation_from_request({**request, "observation/image": small}, FRONT, camera_sizes=[(64, 64)])
    assert same["image"] is small  # the training size passes untouched


def test_console_says_what_it_serves_each_refusal_the_rates_and_the_stop(export_dir, policy, caplog):
    caplog.set_level(logging.INFO, logger="wamkit.serve")
    srv = PolicyServer(Policy.from_export(export_dir, num_steps=NUM_STEPS), host="127.0.0.1", port=0, seed=SEED,
                       stats_every_s=0.3).start_in_thread()
    client = WebsocketClientPolicy("127.0.0.1", srv.port)
    bad = make_obs(1)
    bad["observation/image"] = np.zeros((128, 128, 3), np.uint8)
    with pytest.raises(RuntimeError, match="was trained at 64x64"):
        client.infer(bad)
    good = make_obs(2)
    np.testing.assert_allclose(client.infer(good)["action"], policy.predict([as_policy_obs(good)], seed=SEED)[0], rtol=1e-6, atol=1e-6)
    time.sleep(0.5)
    client._ws.close()
    srv.stop()
    srv.join(30)
    lines = [r.getMessage() for r in caplog.records if r.name == "wamkit.serve"]
    text = "\n".join(lines)
    assert f"wamkit serve: {export_dir} (step 4, EMA weights) on cpu" in text, text
    assert "cameras observation.images.front 64x64 (HxW px; another size is refused" in text and "state 4-D" in text
    assert "action 3-D x 8 steps per chunk at 10 fps, 3 denoising steps" in text
    refused = [line for line in lines if "refused:" in line]
    assert len(refused) == 1 and "\n" not in refused[0] and "is 128x128" in refused[0] and " | fix: " in refused[0]
    rates = [line for line in lines if line.startswith("wamkit serve: last ")]
    assert sum(int(line.split(": ")[2].split()[0]) for line in rates) == 1, text  # answered, over the intervals
    assert any(" 1 failed" in line for line in rates) and any("latency p50 " in line and " ms, p99 " in line for line in rates)
    assert lines[-1] == "wamkit serve: stopped (stop() called) after 1 answered and 1 failed requests"


def test_sigterm_stops_the_server_cleanly_with_a_line(export_dir):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    proc = subprocess.Popen([sys.executable, "-m", "wamkit.cli", "serve", str(export_dir), "--port", "0", "--num-steps", "2",
                             "--noise-scale", "0.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "listening on" in line:
                break
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, "".join(seen) + rest
    assert "stopped (SIGTERM) after 0 answered and 0 failed requests" in rest
    assert "2 denoising steps from noise x 0.5" in "".join(seen)  # --noise-scale reaches the served policy
    assert "Traceback" not in rest


def test_an_unknown_request_key_suggests_the_nearest():
    with pytest.raises(ProtocolError, match=r"request\['promt'\]: is not a request key\n  fix: did you mean 'prompt'\?"):
        observation_from_request({"promt": "p", "image": np.zeros((8, 8, 3), np.uint8)}, FRONT, use_state=False)
