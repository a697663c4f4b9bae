"""model.vision_stem = "conv" (and "resnet", "action_keypoints", "action_eye"): the stem's features land on the patch they were computed at (diffusers'
packing order, padded frames included), the network starts as plain Cosmos3 (zero projection), the stem
trains, combines with frame positions, materialises from meta; a run with either addition or both
reloads and exports to a directory that loads back as the same class and outputs."""

import pytest
import torch

from tests.helpers import DEMO_RECIPE, train_tiny_run
from wamkit.config import load_experiment
from wamkit.errors import ConfigError
from wamkit.export import export_run, verify_same_outputs
from wamkit.model.attention import packed_layout
from wamkit.model.attention_backends import install_packed_attention
from wamkit.model.cosmos3 import build_transformer, set_trainable
from wamkit.model.frame_positions import FramePositionCosmos3
from wamkit.model.materialize import materialize
from wamkit.model.packing import SequenceSample, pack_samples
from wamkit.model.resnet import ResNet18
from wamkit.model.tokenizer import PixelTokenizer
from wamkit.model.variants import (ActionEyeStemFramePositionCosmos3, ActionKeypointStemFramePositionCosmos3,
                                   ConvStemFramePositionCosmos3, ResNetStemFramePositionCosmos3, transformer_class_named)
from wamkit.model.vision_stem import (EYE_SAVED_VALUES_PER_PIXEL, ActionEyeStemCosmos3, ActionKeypointStemCosmos3,
                                      ConvStem, ConvStemCosmos3, ResNetStemCosmos3, latest_frame_pixels,
                                      observed_frame_of_rows)
from wamkit.policy import load_from_checkpoint
from wamkit.policy.loading import load_transformer

CONV = 'model.vision_stem="conv"'
RESNET = 'model.vision_stem="resnet"'
FOURIER = 'model.frame_positions="fourier"'
EYE = ['model.vision_stem="action_eye"', 'model.tokenizer="pixel_unshuffle"']


def test_features_are_packed_like_the_patches_they_were_computed_on():
    """A projection that copies the stem's first channel back to its own pixel makes the stem's output a
    patchified picture of that channel: it must equal diffusers' patchify of the same picture."""
    torch.manual_seed(0)
    model = build_transformer("tiny", latent_channel=4, max_action_dim=8, num_domains=4, vision_stem="conv")
    stem = model.vision_stem
    latent = torch.randn(4, 2, 5, 6)  # 5 rows pad to 6 (3 token rows)
    with torch.no_grad():
        for conv in stem.convs:
            conv.weight.zero_()
            conv.bias.zero_()
            conv.weight[0, 0, 1, 1] = 1.0  # channel 0 passes through (GELU of it), the rest is zero
        stem.out.weight.zero_()
        p, c, channels = stem.patch, 4, stem.out.in_features // stem.patch ** 2
        for i in range(p * p):  # patch position i: feature channel 0 -> latent channel 0
            stem.out.weight[i * c, i * channels] = 1.0
    picture = latent.clone()
    for _ in stem.convs:
        picture[0] = torch.nn.functional.gelu(picture[0])
    picture[1:] = 0
    expected, shapes = super(ConvStemCosmos3, model)._patchify_and_pack_latents([picture[None]])
    torch.testing.assert_close(stem(latent), expected)
    assert shapes == [(2, 5, 6)]


# the stem's own tensors: "conv" three convolutions and the projection; "resnet" one convolution, two residual
# blocks (two GroupNorms and two convolutions each) and the projection
@pytest.mark.parametrize("kind, stem_tensors", [("conv", 7), ("resnet", 2 + 2 * 8 + 1)])
def test_starts_as_plain_cosmos3_then_sees_what_a_patch_embedding_alone_cannot(kind, stem_tensors):
    torch.manual_seed(0)
    plain = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4)
    stemmed = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4, vision_stem=kind)
    missing, unexpected = stemmed.load_state_dict(plain.state_dict(), strict=False)
    assert all(k.startswith("vision_stem.") for k in missing) and len(missing) == stem_tensors and not unexpected
    assert isinstance(stemmed, ConvStemCosmos3) and not stemmed.vision_stem.out.weight.any()
    assert isinstance(stemmed, ResNetStemCosmos3) == (kind == "resnet")
    latents = [torch.randn(1, 12, 2, 8, 8), torch.randn(1, 12, 1, 4, 6)]
    a, shapes = plain._patchify_and_pack_latents(latents)
    b, same = stemmed._patchify_and_pack_latents(latents)
    torch.testing.assert_close(a, b)
    assert shapes == same
    with torch.no_grad():
        stemmed.vision_stem.out.weight.normal_()
    b, _ = stemmed._patchify_and_pack_latents(latents)
    assert b.shape == a.shape and not torch.allclose(a, b)
    # a patch's stem feature depends on its neighbours (3x3 convolutions): change one pixel, the next patch moves
    moved = [latents[0].clone(), latents[1]]
    moved[0][0, :, 0, 1, 1] += 1.0  # frame 0, inside patch (0, 0)
    c, _ = stemmed._patchify_and_pack_latents(moved)
    assert not torch.allclose(c[1], b[1])  # patch (0, 1) sees it through the stem
    assert torch.equal(a[1], plain._patchify_and_pack_latents(moved)[0][1])  # the patch embedding alone does not


def test_combines_with_frame_positions_and_materialises_from_meta():
    with torch.device("meta"):
        model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4,
                                  frame_positions="fourier", vision_stem="conv")
    assert isinstance(model, ConvStemFramePositionCosmos3) and isinstance(model, FramePositionCosmos3)
    materialize(model, torch.device("cpu"), seed=0)
    assert not model.vision_stem.out.weight.any() and not model.frame_position.weight.any()
    assert all(conv.weight.abs().sum() > 0 for conv in model.vision_stem.convs)
    set_trainable(model, train_text_pathway=False)
    assert all(p.requires_grad for p in model.vision_stem.parameters())
    assert transformer_class_named("ConvStemFramePositionCosmos3") is ConvStemFramePositionCosmos3
    assert isinstance(ConvStem(12, 2), torch.nn.Module)
    with torch.device("meta"):
        residual = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4, vision_stem="resnet")
    materialize(residual, torch.device("cpu"), seed=0)
    norms = [m for m in residual.vision_stem.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert len(norms) == 4 and all(bool((n.weight == 1).all() and not n.bias.any()) for n in norms)


def test_a_base_checkpoint_or_an_unknown_kind_or_an_eye_without_pixels_is_a_named_error():
    with pytest.raises(ConfigError, match="vision_stem"):
        load_experiment(DEMO_RECIPE, [CONV, 'checkpoint.load_path="/some/base"'])
    with pytest.raises(ConfigError, match="vision_stem"):
        load_experiment(DEMO_RECIPE, ['model.vision_stem="vit"'])
    with pytest.raises(ConfigError, match="model.tokenizer=pixel_unshuffle"):  # the area-pooling tokenizer loses pixels
        load_experiment(DEMO_RECIPE, ['model.vision_stem="action_eye"', 'model.tokenizer="pixel"'])
    assert load_experiment(DEMO_RECIPE, EYE).model.vision_stem == "action_eye"
    with pytest.raises(ValueError, match="pixel_unshuffle"):  # 16 channels: a VAE's latent, not 4 x 3 x f^2
        build_transformer("tiny", latent_channel=16, max_action_dim=8, num_domains=4, vision_stem="action_eye")


def test_the_eye_is_resnet18_and_its_saved_activations_are_what_the_memory_estimate_counts():
    """torchvision's resnet18 without its classifier has 11,176,512 parameters (GroupNorm's affine pairs count as
    BatchNorm's); the tensors its forward saves for the backward, weights aside, are EYE_SAVED_VALUES_PER_PIXEL."""
    eye = ResNet18()
    assert sum(p.numel() for p in eye.parameters()) == 11_176_512
    weights = {p.data_ptr() for p in eye.parameters()}
    saved = {}

    def pack(t):
        if t.data_ptr() not in weights:
            saved[(t.data_ptr(), t.shape)] = t.numel() * t.element_size() / 4  # in fp32 values
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        features = eye(torch.randn(2, 3, 64, 128))
    assert features.shape == (2, 512, 2, 4)
    assert sum(saved.values()) / (2 * 64 * 128) == pytest.approx(EYE_SAVED_VALUES_PER_PIXEL, rel=0.02)


def test_the_eye_sees_each_latent_frames_last_video_frame_exactly():
    """latest_frame_pixels inverts the pixel_unshuffle tokenizer: frames 0 (the first, repeated), 4 and 8 of 9."""
    video = torch.randint(0, 256, (1, 9, 8, 12, 3), dtype=torch.uint8)
    latent = PixelTokenizer(4, lossless=True).encode(video)[0]
    pixels = latest_frame_pixels(latent, 4)
    expected = video[0, [0, 4, 8]].permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
    assert pixels.shape == (3, 3, 8, 12)
    torch.testing.assert_close(pixels, expected)



@pytest.mark.parametrize("extra, cls, added", [
    ([FOURIER], FramePositionCosmos3, "frame_position.weight"),
    ([CONV], ConvStemCosmos3, "vision_stem.out.weight"),
    ([FOURIER, CONV], ConvStemFramePositionCosmos3, "vision_stem.out.weight"),
    ([FOURIER, RESNET], ResNetStemFramePositionCosmos3, "vision_stem.out.weight"),
    ([FOURIER, 'model.vision_stem="action_keypoints"'], ActionKeypointStemFramePositionCosmos3, "action_readout_out.weight"),
    ([FOURIER, *EYE], ActionEyeStemFramePositionCosmos3, "action_readout_out.weight"),
], ids=["frame_positions", "vision_stem", "both", "resnet_both", "action_keypoints_both", "action_eye_both"])
def test_a_run_trains_the_added_weights_reloads_and_exports(tmp_path, extra, cls, added):
    run = train_tiny_run(tmp_path, "variant", extra=extra)
    loaded = load_from_checkpoint(run, use_ema=False)
    assert type(loaded.model) is cls
    assert loaded.model.get_parameter(added).abs().sum() > 0  # four steps moved the zero projection
    exported = export_run(run, tmp_path / "export", use_ema=False)
    for use_from_pretrained in (True, False):
        reloaded = load_transformer(exported / "transformer", use_from_pretrained=use_from_pretrained)
        assert type(reloaded) is cls
        # bit for bit, but for the eye: the CPU's convolutions of one image differ in the last bits (~1e-6) between two
        # copies of the same weights at other memory alignments, so its outputs are held to export's own tolerance
        exact = cls is not ActionEyeStemFramePositionCosmos3
        verify_same_outputs(loaded.model, reloaded, loaded.contract, loaded.model.config.latent_channel,
                            loaded.text_tokenizer, **({"atol": 0, "rtol": 0} if exact else {}))


def test_each_action_row_reads_its_own_samples_latest_observed_frame():
    assert observed_frame_of_rows(torch.tensor([1, 2]), 3, 4).tolist() == [0, 0, 0, 0]
    # two samples of 3 frames and 4 rows each, merged into one item
    assert observed_frame_of_rows(torch.tensor([1, 2, 4, 5]), 6, 8).tolist() == [0] * 4 + [3] * 4
    # two observed frames each: the later one, for every row of the sample (3 rows a sample)
    assert observed_frame_of_rows(torch.tensor([2, 3, 6, 7]), 8, 6).tolist() == [1] * 3 + [5] * 3


@pytest.mark.parametrize("kind, cls", [("action_keypoints", ActionKeypointStemCosmos3), ("action_eye", ActionEyeStemCosmos3)])
def test_action_readouts_reach_their_own_samples_action_rows_merged_or_not(kind, cls):
    """Each sample's action rows get the read-out (keypoints, or the eye's features) of its own latest observed
    frame: a merged pack (one item for all samples) gives the per-sample pack's actions, the projection moves them,
    and with it at zero (as built) the model is the residual stem's."""
    gen = torch.Generator().manual_seed(5)
    samples = [SequenceSample(text_ids=[4, 5, 6], video=torch.randn(12, 3, 4, 4, generator=gen),
                              actions=torch.randn(9, 8, generator=gen), clean_video_frames=[0], clean_action_rows=[0],
                              sigma=sigma, domain_id=1, fps=10.0, action_start_frame=0) for sigma in (0.3, 0.7, 0.5)]
    torch.manual_seed(0)
    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4,
                              vision_stem=kind).eval()
    assert isinstance(model, cls) and not model.action_readout_out.weight.any()
    resnet = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4, vision_stem="resnet").eval()
    resnet.load_state_dict(model.state_dict(), strict=False)
    processors = [install_packed_attention(m) for m in (model, resnet)]

    def actions(m, processor, merge):
        batch = pack_samples(samples, m.config, merge=merge)
        with packed_layout(processor, batch), torch.no_grad():
            return batch.action_outputs(m(**batch.forward_kwargs))

    torch.testing.assert_close(actions(model, processors[0], False), actions(resnet, processors[1], False))
    with torch.no_grad():
        model.action_readout_out.weight.normal_()
        model.vision_stem.out.weight.normal_()
    separate, merged = actions(model, processors[0], False), actions(model, processors[0], True)
    torch.testing.assert_close(merged, separate, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(separate, actions(resnet, processors[1], False), atol=1e-3)


def test_the_eye_reads_only_the_clean_frames_and_gives_each_frame_its_observed_ones_readout():
    """Two samples of three frames merged into one item, frames 0 and 3 observed: the eye sees those two alone, and
    every frame gets what a pass over all six gives the clean frame at or before it (what observed_frame_of_rows
    sends a sample's rows to); an item without a clean frame reads zeros."""
    torch.manual_seed(0)
    model = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=4, vision_stem="action_eye").eval()
    latent, noisy = torch.randn(12, 6, 4, 4), torch.tensor([1, 2, 4, 5])
    batch_sizes = []
    model.action_eye.register_forward_hook(lambda module, args, out: batch_sizes.append(args[0].shape[0]))
    with torch.no_grad():
        readout = model._read_observed_frames(latent, noisy)
        every_frame = model.action_eye(latest_frame_pixels(latent, 1))
        assert not model._read_observed_frames(latent, torch.arange(6)).any()
    assert batch_sizes == [2, 6]
    torch.testing.assert_close(readout, every_frame[[0, 0, 0, 3, 3, 3]])
