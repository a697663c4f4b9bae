"""Which text tokenizer a run uses: the base checkpoint's own (never bytes into pretrained text
weights), an explicit model.text_tokenizer_path, a chain's earlier run's; and the export carries it."""

import json
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import DEMO_RECIPE, train_tiny_run
from wamkit.config import load_experiment
from wamkit.errors import ConfigError
from wamkit.model.cosmos3 import build_transformer
from wamkit.model.text_tokenizer import ByteTokenizer, PretrainedTextTokenizer, resolve_text_tokenizer
from wamkit.train.setup import build_tokenizers, check_vocab

WORDS = "pick up the red cube and place it in bowl open drawer reach target push button verify export".split()
PROMPT = "pick up the red cube and place it in the bowl"


def _hf_tokenizer(words, out_dir):
    """A real (tiny, word-level) Hugging Face tokenizer saved with save_pretrained."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(dict.fromkeys(words))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    hf.save_pretrained(str(out_dir))
    return hf


def _base(root, with_tokenizer=True, words=WORDS):
    torch.manual_seed(0)
    build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=32).save_pretrained(str(root / "transformer"))
    return _hf_tokenizer(words, root / "tokenizer") if with_tokenizer else None


def _cfg(**overrides):
    return load_experiment(DEMO_RECIPE, [f'{k}="{v}"' for k, v in overrides.items()])


def test_diffusers_base_tokenizer_is_used(tmp_path):
    hf = _base(tmp_path / "base")
    tok = resolve_text_tokenizer(_cfg(**{"checkpoint.load_path": tmp_path / "base"}))
    assert isinstance(tok, PretrainedTextTokenizer)
    assert tok.encode(PROMPT) == hf(PROMPT)["input_ids"] == [hf.convert_tokens_to_ids(w) for w in PROMPT.split()]
    assert tok.encode(PROMPT) != ByteTokenizer(32).encode(PROMPT)
    # load_path pointing at the transformer/ folder itself finds the tokenizer beside it
    assert resolve_text_tokenizer(_cfg(**{"checkpoint.load_path": tmp_path / "base" / "transformer"})).encode(PROMPT) == hf(PROMPT)["input_ids"]


def test_tokenizer_files_beside_the_transformer_are_used(tmp_path):
    _base(tmp_path / "base", with_tokenizer=False)
    hf = _hf_tokenizer(WORDS, tmp_path / "base")  # tokenizer.json / tokenizer_config.json in the root
    assert resolve_text_tokenizer(_cfg(**{"checkpoint.load_path": tmp_path / "base"})).encode(PROMPT) == hf(PROMPT)["input_ids"]


def test_byte_tokenizer_with_pretrained_base_is_a_config_error(tmp_path):
    _base(tmp_path / "base", with_tokenizer=False)
    with pytest.raises(ConfigError) as err:
        build_tokenizers(_cfg(**{"checkpoint.load_path": tmp_path / "base"}))
    assert str(err.value).startswith("model.text_tokenizer_path") and "fix: set model.text_tokenizer_path" in str(err.value)
    # saying so explicitly is allowed (a base that was itself trained on bytes)
    tok = resolve_text_tokenizer(_cfg(**{"checkpoint.load_path": tmp_path / "base", "model.text_tokenizer_path": "byte"}))
    assert isinstance(tok, ByteTokenizer) and tok.explicit


def test_reference_export_without_tokenizer_names_the_setting(tmp_path):
    from safetensors.torch import save_file

    state = build_transformer("tiny", latent_channel=12, max_action_dim=8, num_domains=32).state_dict()
    save_file({"model.net." + k: v.contiguous() for k, v in state.items()}, str(tmp_path / "ref.safetensors"))
    with pytest.raises(ConfigError, match="model.text_tokenizer_path") as err:
        resolve_text_tokenizer(_cfg(**{"checkpoint.load_path": tmp_path / "ref.safetensors"}))
    assert "reference-framework" in str(err.value) and "Qwen tokenizer" in str(err.value)
    hf = _hf_tokenizer(WORDS, tmp_path / "tokenizer")  # a tokenizer/ beside the export is picked up
    assert resolve_text_tokenizer(_cfg(**{"checkpoint.load_path": tmp_path / "ref.safetensors"})).encode(PROMPT) == hf(PROMPT)["input_ids"]


def test_explicit_path_wins_over_the_base(tmp_path):
    base_hf = _base(tmp_path / "base")
    other = _hf_tokenizer(list(reversed(WORDS)), tmp_path / "other")
    tok = resolve_text_tokenizer(_cfg(**{"checkpoint.load_path": tmp_path / "base", "model.text_tokenizer_path": tmp_path / "other"}))
    assert tok.encode(PROMPT) == other(PROMPT)["input_ids"] != base_hf(PROMPT)["input_ids"]
    with pytest.raises(ConfigError, match="model.text_tokenizer_path"):
        resolve_text_tokenizer(_cfg(**{"model.text_tokenizer_path": tmp_path / "missing"}))


def test_random_init_keeps_the_byte_tokenizer():
    tok = resolve_text_tokenizer(_cfg())
    assert isinstance(tok, ByteTokenizer) and not tok.explicit


def test_check_vocab_refuses_mismatched_vocabularies(tmp_path):
    qwen_sized = SimpleNamespace(config=SimpleNamespace(vocab_size=151936))
    check_vocab(qwen_sized, ByteTokenizer(32))  # random Nano weights (no base): bytes have rows, nothing pretrained to mismatch
    big = _hf_tokenizer([f"w{i}" for i in range(400)], tmp_path / "big")
    assert len(big) > 384
    with pytest.raises(ConfigError, match="the model embeds 384"):
        check_vocab(build_transformer("tiny", 12, 8, 32), PretrainedTextTokenizer(str(tmp_path / "big"), 32))


def test_chain_keeps_the_base_tokenizer_and_export_carries_it(tmp_path):
    from wamkit.export import export_run
    from wamkit.policy import load_from_export

    hf = _base(tmp_path / "base", words=WORDS + ["reach"])
    run = train_tiny_run(tmp_path, "from_base", [f'checkpoint.load_path="{tmp_path / "base"}"'])
    iteration = sorted((run / "checkpoints").glob("iter_*"))[-1]
    chained = resolve_text_tokenizer(_cfg(**{"checkpoint.load_path": iteration}))
    assert chained.encode(PROMPT) == hf(PROMPT)["input_ids"]

    out = export_run(run, tmp_path / "export")
    manifest = json.loads((out / "wamkit.json").read_text())
    assert manifest["model"]["text_tokenizer"] == "text_tokenizer" and (out / "text_tokenizer" / "tokenizer.json").is_file()
    served = load_from_export(out).text_tokenizer
    for text in (PROMPT, "reach the target", "unknown words here"):
        assert served.encode(text) == hf(text)["input_ids"]
    # the export as a base keeps its tokenizer too, and tokenizes without the original base
    import shutil

    shutil.rmtree(tmp_path / "base")
    assert resolve_text_tokenizer(_cfg(**{"checkpoint.load_path": out})).encode(PROMPT) == hf(PROMPT)["input_ids"]


def test_prompts_longer_than_max_text_tokens_are_named_once_when_the_data_opens(tmp_path, capsys):
    """The byte tokenizer keeps bos + the first max_text_tokens - 2 bytes + eos: a longer prompt loses its end.
    Opening the data says so once, with the count, the longest prompt and the knob."""
    from wamkit.data import write_demo_dataset
    from wamkit.train.datasets import build_run_data

    root = write_demo_dataset(tmp_path / "demo", num_episodes=2, episodes_per_file=2)
    cfg = lambda n: load_experiment(DEMO_RECIPE, [f'data.path="{root}"', "data.generate_demo=false",  # noqa: E731
                                                  f"model.max_text_tokens={n}"])
    build_run_data(cfg(64))
    assert "max_text_tokens" not in capsys.readouterr().err  # "reach the green target" + bos/eos = 24 fits
    build_run_data(cfg(16))
    err = capsys.readouterr().err
    assert "2 of 2 prompt(s)" in err and "model.max_text_tokens = 16" in err, err
    assert "'reach the green target'" in err and "--set model.max_text_tokens=24" in err, err
    build_run_data(cfg(16))
    assert "max_text_tokens" not in capsys.readouterr().err  # once per process
    assert ByteTokenizer(16).length("reach the green target") == 24 and len(ByteTokenizer(16).encode("reach the green target")) == 16
