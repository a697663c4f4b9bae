"""Train <-> serve parity: for a dataset frame sent through the server, the model inputs the server builds
(normalized padded state row, frame, latent frame 0, prompt token ids, domain) equal the ones training's
SampleTransform + objective build for the same frame."""

import inspect
import json

import numpy as np
import pytest
import torch
from openpi_client.websocket_client_policy import WebsocketClientPolicy

import wamkit.diffusion.objective as objective_module
from wamkit.policy import Policy, config_from_dict, load_from_export
from wamkit.serve import PolicyServer
from wamkit.train.datasets import build_run_data

from tests.serve.serve_helpers import NUM_STEPS


class _Captured(Exception):
    pass


def _training_sequence(run_dir, loaded, sample):
    """The SequenceSample training's objective packs for `sample` (captured just before the forward)."""
    cfg = config_from_dict(json.loads((run_dir / "resolved_config.json").read_text()))
    cls = getattr(objective_module, "PolicyObjective", None) or getattr(objective_module, "ModeObjective")
    objective = cls(loaded.model, loaded.video_tokenizer, loaded.text_tokenizer, cfg.diffusion,
                    cfg.data.prompt_template, float(loaded.contract["fps"]))
    captured = {}

    def capture(sequence, config, **_packing_options):
        captured["sequence"] = list(sequence)
        raise _Captured

    generator = torch.Generator().manual_seed(0)
    params = list(inspect.signature(objective.__call__).parameters)
    generators = [generator] if "generators" in params else generator
    original = objective_module.pack_samples
    objective_module.pack_samples = capture
    try:
        with pytest.raises(_Captured):
            objective([sample], generators)
    finally:
        objective_module.pack_samples = original
    return captured["sequence"][0], cfg


@pytest.mark.parametrize("index", [0, 37])
def test_server_builds_the_same_model_inputs_as_training(run_dir, export_dir, index):
    cfg = config_from_dict(json.loads((run_dir / "resolved_config.json").read_text()))
    data = build_run_data(cfg)
    window = data.train_windows[index % len(data.train_windows)]
    sample = data.transform(window)
    loaded = load_from_export(export_dir)
    seq, cfg = _training_sequence(run_dir, loaded, sample)

    srv = PolicyServer(Policy.from_export(export_dir, num_steps=NUM_STEPS), host="127.0.0.1", port=0,
                       max_requests=1).start_in_thread()
    built = []
    prepare = srv.policy.prepare
    srv.policy.prepare = lambda observations: built.extend(prepare(observations)) or built[-len(observations):]
    cameras = data.contract["camera_keys"]
    request = {"images": {cam: window.video[v, 0].numpy() for v, cam in enumerate(cameras)},
               "state": window.state[0].numpy(), "prompt": window.task}  # raw values, as a robot would send them
    client = WebsocketClientPolicy("127.0.0.1", srv.port)
    reply = client.infer(request)
    srv.join(30)
    assert reply["action"].shape == (cfg.data.chunk_length, data.contract["action_dim"])
    (inp,) = built

    # frame: cameras tiled exactly as training's first video frame
    assert torch.equal(inp.frame, sample.video[0])
    # state row: normalized with the run's statistics, padded to max_action_dim; training keeps row 0 clean
    assert seq.clean_action_rows == [0]
    torch.testing.assert_close(inp.state.float(), seq.actions[0].float(), atol=1e-6, rtol=0)
    torch.testing.assert_close(inp.state.float(), sample.state.float(), atol=1e-6, rtol=0)
    assert inp.state.shape == (cfg.model.max_action_dim,) and torch.count_nonzero(inp.state[data.contract["state_dim"]:]) == 0
    # prompt: the same template and the same token ids
    assert loaded.text_tokenizer.encode(inp.prompt) == list(seq.text_ids) or torch.equal(
        torch.as_tensor(loaded.text_tokenizer.encode(inp.prompt)), torch.as_tensor(seq.text_ids))
    # the clean conditioning latent the sampler computes from the frame equals training's latent frame 0
    clip = inp.frame.unsqueeze(0).expand(inp.chunk_length + 1, -1, -1, -1).unsqueeze(0).contiguous()
    served_latent = loaded.video_tokenizer.encode(clip)[0][:, 0].float()
    torch.testing.assert_close(served_latent, seq.video[:, 0].float(), atol=1e-5, rtol=1e-5)
    assert inp.domain_id == seq.domain_id and inp.chunk_length == cfg.data.chunk_length
    assert np.isfinite(reply["action"]).all()
