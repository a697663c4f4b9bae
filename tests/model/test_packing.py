"""A packed forward over several samples must equal each sample's own forward."""

import pytest
import torch

from wamkit.model.cosmos3 import build_transformer
from wamkit.model.attention import packed_layout
from wamkit.model.attention_backends import install_packed_attention
from wamkit.model.packing import SequenceSample, pack_samples


def _sample(gen, text_len, t, h, w, n_actions, sigma, domain, state_row):
    return SequenceSample(
        text_ids=torch.randint(3, 250, (text_len,), generator=gen).tolist(),
        video=torch.randn(12, t, h, w, generator=gen),
        actions=torch.randn(n_actions, 8, generator=gen),
        clean_video_frames=[0],
        clean_action_rows=[0] if state_row else [],
        sigma=sigma,
        domain_id=domain,
        fps=10.0 + domain,
        action_start_frame=0 if state_row else 1,
    )


def _model():
    torch.manual_seed(0)
    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4).eval()
    with torch.no_grad():  # zero-initialised embeddings would hide action-path bugs
        model.action_modality_embed.normal_()
    return model


def test_packed_forward_equals_per_sample_forwards():
    gen = torch.Generator().manual_seed(1)
    samples = [
        _sample(gen, 5, 3, 4, 4, 9, 0.3, 0, True),
        _sample(gen, 11, 2, 6, 4, 5, 0.8, 2, False),
        _sample(gen, 7, 3, 2, 6, 9, 0.55, 1, True),
    ]
    model = _model()
    with torch.no_grad():
        singles = [model(**pack_samples([s], model.config).forward_kwargs) for s in samples]
        batch = pack_samples(samples, model.config)
        processor = install_packed_attention(model)
        with packed_layout(processor, batch):
            packed = model(**batch.forward_kwargs)
    for i, single in enumerate(singles):
        torch.testing.assert_close(packed.sample[i], single.sample[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(packed.action[i], single.action[0], atol=1e-5, rtol=1e-4)


def test_unmasked_packing_differs_so_the_test_has_teeth():
    """Without the cross-sample mask, packing leaks information between samples."""
    gen = torch.Generator().manual_seed(2)
    samples = [_sample(gen, 5, 3, 4, 4, 9, 0.3, 0, True), _sample(gen, 6, 3, 4, 4, 9, 0.6, 1, True)]
    model = _model()
    with torch.no_grad():
        single = model(**pack_samples([samples[0]], model.config).forward_kwargs)
        leaky = model(**pack_samples(samples, model.config).forward_kwargs)  # default diffusers processor
    assert not torch.allclose(leaky.sample[0], single.sample[0], atol=1e-4)


def test_clean_positions_get_no_prediction_and_noisy_do():
    gen = torch.Generator().manual_seed(3)
    s = _sample(gen, 4, 3, 4, 4, 9, 0.5, 0, True)
    model = _model()
    with torch.no_grad():
        out = model(**pack_samples([s], model.config).forward_kwargs)
    assert torch.count_nonzero(out.sample[0][:, :, 0]) == 0
    assert torch.count_nonzero(out.sample[0][:, :, 1:]) > 0
    assert torch.count_nonzero(out.action[0][0]) == 0
    assert torch.count_nonzero(out.action[0][1:]) > 0


@pytest.mark.parametrize("num_samples", [2, 1])  # one sample takes the fused-SDPA fast path
def test_flex_attention_backend_matches_dense_masks(num_samples):
    """The GPU path (flex block masks), run eagerly on CPU, equals the dense-mask path."""
    from wamkit.model.flex_attention import FlexPackedAttention

    gen = torch.Generator().manual_seed(4)
    samples = [_sample(gen, 5, 3, 4, 4, 9, 0.3, 0, True), _sample(gen, 9, 2, 4, 6, 5, 0.7, 1, False)][:num_samples]
    model = _model()
    batch = pack_samples(samples, model.config)
    with torch.no_grad():
        dense = install_packed_attention(model)
        with packed_layout(dense, batch):
            expected = model(**batch.forward_kwargs)
        flex = FlexPackedAttention(compiled=False)
        model.set_attn_processor(flex)
        with packed_layout(flex, batch):
            got = model(**batch.forward_kwargs)
            took_fast_path = flex._single
    for a, b in zip(got.sample + got.action, expected.sample + expected.action):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert took_fast_path == (num_samples == 1) and flex._single is False  # cleared with the layout


def test_attention_backend_auto_rule_is_shared_by_training_and_inference():
    from wamkit.model.attention_backends import attention_backend

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert attention_backend("auto", cuda, torch.bfloat16) == attention_backend("auto", cuda, "bfloat16") == "flex"
    assert attention_backend("auto", cuda, torch.float32) == attention_backend("auto", cpu, "bfloat16") == "per_sample"
    assert attention_backend("flex", cpu, torch.float32) == "flex"  # an explicit choice wins


@pytest.mark.parametrize("chunk_frames", [0, 1])  # bidirectional, block-causal teacher forcing
def test_per_sample_backend_matches_dense_masks_with_gradients(chunk_frames):
    """`per_sample` (fused SDPA sample by sample) gives the dense-mask outputs and gradients."""
    gen = torch.Generator().manual_seed(5)
    samples = [_sample(gen, 5, 3, 4, 4, 9, 0.3, 0, True), _sample(gen, 9, 3, 4, 6, 9, 0.7, 1, False),
               _sample(gen, 1, 3, 2, 2, 9, 0.5, 2, True)]
    for s in samples:
        s.causal_chunk_frames = chunk_frames
    model = _model()
    batch = pack_samples(samples, model.config)
    results = []
    for backend in ("sdpa", "per_sample"):
        model.zero_grad(set_to_none=True)
        processor = install_packed_attention(model, backend)
        with packed_layout(processor, batch):
            out = model(**batch.forward_kwargs)
        sum(o.square().sum() for o in out.sample + out.action).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        results.append(([o.detach() for o in out.sample + out.action], grads))
    (want, want_grads), (got, got_grads) = results
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert len(got_grads) == len(want_grads) > 0
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_per_sample_backend_refuses_an_unordered_pack():
    from wamkit.model.attention import PerSampleAttention

    with pytest.raises(ValueError, match="contiguous"):
        PerSampleAttention().set_layout(torch.tensor([0, 1, 0]), torch.tensor([0, 1]))


@pytest.mark.parametrize("backend", ["sdpa", "per_sample", "flex"])
@pytest.mark.parametrize("num_samples", [1, 3])
@pytest.mark.parametrize("chunk_frames", [0, 1])
def test_text_filler_changes_no_output_or_gradient(backend, num_samples, chunk_frames):
    """pack_samples(text_multiple=16) rounds the text prefix up with filler tokens: every real
    sample's outputs and the weight gradients equal those of the unpadded pack (flex: outputs only,
    it has no backward on CPU)."""
    from wamkit.model.flex_attention import FlexPackedAttention

    gen = torch.Generator().manual_seed(6)
    samples = [_sample(gen, 5, 3, 4, 4, 9, 0.3, 0, True), _sample(gen, 9, 3, 4, 6, 9, 0.7, 1, False),
               _sample(gen, 3, 3, 2, 2, 9, 0.5, 2, True)][:num_samples]
    for s in samples:
        s.causal_chunk_frames = chunk_frames
    model = _model()
    results = []
    for multiple in (0, 16):
        batch = pack_samples(samples, model.config, text_multiple=multiple)
        assert batch.forward_kwargs["und_len"] % 16 == 0 if multiple else True
        model.zero_grad(set_to_none=True)
        if backend == "flex":
            processor = FlexPackedAttention(compiled=False)
            model.set_attn_processor(processor)
        else:
            processor = install_packed_attention(model, backend)
        with packed_layout(processor, batch), torch.set_grad_enabled(backend != "flex"):
            out = model(**batch.forward_kwargs)
        grads = []
        if backend != "flex":
            sum(o.square().sum() for o in out.sample + out.action).backward()
            grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        results.append(([o.detach() for o in out.sample + out.action], grads))
    (want, want_grads), (got, got_grads) = results
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert len(got_grads) == len(want_grads) and (len(got_grads) > 0) == (backend != "flex")
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_text_filler_buckets_pack_lengths():
    from wamkit.model.packing import text_padding

    assert text_padding([5, 9, 3], 0) == 0
    assert text_padding([5, 9, 3], 16) == 15
    assert text_padding([8, 8], 16) == 0
    lengths = {sum(n) + text_padding(n, 128) for n in ([20, 24, 22], [21, 25, 30], [40, 22, 19], [90, 60, 10])}
    assert lengths == {128, 256}


@pytest.mark.parametrize("fps_modulation", [True, False])
def test_fps_modulation_sets_the_temporal_spacing_of_frames(fps_modulation):
    """model.fps_modulation = false: latent frames sit one temporal position apart whatever the fps;
    on (Cosmos3's default), a second spans the same positions, so 80 fps frames sit 0.3 apart."""
    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4, fps_modulation=fps_modulation)
    gen = torch.Generator().manual_seed(7)
    sample = _sample(gen, 5, 3, 2, 2, 9, 0.3, 0, True)
    sample.fps = 80.0
    batch = pack_samples([sample], model.config)
    temporal = batch.forward_kwargs["position_ids"][0, 5:5 + 3 * 1]  # first token of each latent frame (1x1 grid)
    steps = temporal[1:] - temporal[:-1]
    expected = 1.0 if not fps_modulation else (80 / 4) ** -1 * (24 / 4)  # latent-frame rate vs base_fps 24 / 4
    torch.testing.assert_close(steps, torch.full_like(steps, expected), atol=2e-3, rtol=0)  # fp32 at ~15000


def test_compiled_layers_do_not_recompile_for_new_per_sample_packs():
    """parallel.compile compiles each decoder layer; packs of the same total lengths but other sample
    boundaries (every training step) must reuse its graphs (they recompiled every step on the CPU)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = _model()
    for layer in model.layers:
        layer.compile(dynamic=False, backend="eager")
    processor = install_packed_attention(model, "per_sample")
    gen = torch.Generator().manual_seed(3)
    packs = [[_sample(gen, 4, 3, 4, 4, 9, 0.3, 0, True), _sample(gen, 8, 3, 4, 4, 9, 0.6, 1, True)],
             [_sample(gen, 9, 3, 4, 4, 9, 0.4, 0, True), _sample(gen, 3, 3, 4, 4, 9, 0.2, 1, True)],
             [_sample(gen, 6, 3, 4, 4, 9, 0.5, 2, True), _sample(gen, 6, 3, 4, 4, 9, 0.7, 0, True)]]
    graphs = []
    for samples in packs:  # 12 text tokens and the same video/action tokens in every pack
        batch = pack_samples(samples, model.config)
        with packed_layout(processor, batch):
            out = model(**batch.forward_kwargs)
        sum(o.square().sum() for o in out.sample + out.action).backward()
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] > 0 and graphs[1] == graphs[2] == graphs[0], graphs


def test_loss_indexes_timesteps_and_sample_ids_spell_out_the_layout():
    """The packed index tensors, written out by hand for two samples: the second with a noisy frame
    between clean ones (a block-causal target chunk) and a filler-padded text prefix."""
    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4)
    a = SequenceSample(text_ids=[1, 2, 3], video=torch.zeros(12, 2, 4, 4), actions=torch.zeros(2, 8), clean_video_frames=[0],
                       clean_action_rows=[0], sigma=0.25, fps=10.0)
    b = SequenceSample(text_ids=[4, 5], video=torch.zeros(12, 3, 4, 4), actions=torch.zeros(3, 8), clean_video_frames=[0, 2],
                       clean_action_rows=[0, 1, 2], sigma=0.5, fps=10.0)
    batch = pack_samples([a, b], model.config, text_multiple=4)
    kw = batch.forward_kwargs
    und = 8  # 3 + 2 text tokens + 3 filler
    per_frame = 4  # 4x4 latents in 2x2 patches
    a_video, b_video = und, und + 2 * per_frame + 2  # a: 2 frames + 2 action rows
    assert kw["und_len"] == und and kw["sequence_length"] == b_video + 3 * per_frame + 3
    assert kw["vision_mse_loss_indexes"].tolist() == [*range(a_video + 4, a_video + 8), *range(b_video + 4, b_video + 8)]
    assert kw["vision_timesteps"].dtype == torch.float32 and kw["vision_timesteps"].tolist() == [250.0] * 4 + [500.0] * 4
    assert kw["action_mse_loss_indexes"].tolist() == [a_video + 2 * per_frame + 1]
    assert batch.und_sample_ids.tolist() == [0, 0, 0, 1, 1, 2, 2, 2]  # the filler is a sample of its own
    assert batch.gen_sample_ids.tolist() == [0] * 10 + [1] * 15
    assert batch.vision_noisy_frames == [[1], [1]] and batch.action_noisy_rows == [[1], []]


def test_merged_pack_gives_the_per_item_outputs():
    """pack_samples(merge=True) hands diffusers one vision item and one action item for samples of one
    layout (texts of different lengths, a clean state row, different noise levels): the outputs and
    the gradients of every input are those of the per-item pack."""
    gen = torch.Generator().manual_seed(5)
    samples = [_sample(gen, n_text, 3, 4, 4, 9, sigma, 1, True) for n_text, sigma in ((5, 0.3), (9, 0.7), (6, 0.5))]
    model = _model()
    processor = install_packed_attention(model)
    results = []
    for merge in (False, True):
        inputs = [(s.video.clone().requires_grad_(True), s.actions.clone().requires_grad_(True)) for s in samples]
        pack = [SequenceSample(**{**s.__dict__, "video": v, "actions": a}) for s, (v, a) in zip(samples, inputs)]
        batch = pack_samples(pack, model.config, merge=merge)
        assert batch.merged is merge
        with packed_layout(processor, batch):
            out = model(**batch.forward_kwargs)
        videos, actions = batch.video_outputs(out), batch.action_outputs(out)
        (videos.square().sum() + actions.square().sum()).backward()
        results.append((videos.detach(), actions.detach(), [(v.grad, a.grad) for v, a in inputs]))
    assert len(pack_samples(samples, model.config, merge=True).forward_kwargs["vision_tokens"]) == 1
    (v0, a0, g0), (v1, a1, g1) = results
    torch.testing.assert_close(v1, v0, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(a1, a0, atol=1e-5, rtol=1e-4)
    assert v0[:, :, 0].abs().max() == 0 and v0[:, :, 1:].abs().min() > 0  # clean frame 0 gets no prediction
    for (gv0, ga0), (gv1, ga1) in zip(g0, g1):
        torch.testing.assert_close(gv1, gv0, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ga1, ga0, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("change", ["grid", "domain", "clean_rows"])
def test_samples_of_different_layouts_are_not_merged(change):
    gen = torch.Generator().manual_seed(6)
    a = _sample(gen, 5, 3, 4, 4, 9, 0.3, 1, True)
    b = {"grid": _sample(gen, 5, 3, 4, 6, 9, 0.3, 1, True), "domain": _sample(gen, 5, 3, 4, 4, 9, 0.3, 2, True),
         "clean_rows": _sample(gen, 5, 3, 4, 4, 9, 0.3, 1, False)}[change]
    batch = pack_samples([a, b], _model().config, merge=True)
    assert not batch.merged and len(batch.forward_kwargs["vision_tokens"]) == 2


@pytest.mark.parametrize("merge", [False, True])
def test_packing_a_larger_batch_of_one_layout_adds_no_tensor_ops(merge):
    """Positions and indexes come from each layout's cached pieces and a few batched ops, so the host's
    tensor ops per pack do not grow with the samples (at batch 256, ~37 ops a sample held an MT10
    training step on an H200 host-bound). Counted with torch.profiler: aten ops at the top level."""
    from torch.profiler import ProfilerActivity, profile

    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4)
    gen = torch.Generator().manual_seed(3)

    def top_level_ops(n: int) -> int:
        samples = [_sample(gen, 5 + i % 3, 3, 4, 4, 9, 0.1 * (i % 9), 1, True) for i in range(n)]  # three text lengths
        pack_samples(samples, model.config, text_multiple=8, merge=merge)  # layouts cached, as in training
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            pack_samples(samples, model.config, text_multiple=8, merge=merge)
        return sum(1 for e in prof.events() if e.name.startswith("aten::")
                   and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::")))

    small, large = top_level_ops(6), top_level_ops(24)
    per_sample = (large - small) / 18
    # unmerged packs hand the forward one item per sample (an unsqueeze each); merged ones build nothing per sample
    assert per_sample <= (1.0 if not merge else 0.0), (small, large)
