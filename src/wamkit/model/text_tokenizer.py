"""Text tokenizers, and the one place that decides which one a run uses.

A pretrained Cosmos3 base embeds the ids of its own (Qwen) tokenizer; feeding it UTF-8 bytes would
train the generation pathway against meaningless text. `resolve_text_tokenizer(cfg)` therefore
picks, in order:

1. `model.text_tokenizer_path` when set: a tokenizer directory, or "byte" to choose the byte
   tokenizer explicitly (e.g. a tiny base that was itself trained on bytes);
2. with `checkpoint.load_path` a wamkit checkpoint (iter dir with a COMPLETE marker): the tokenizer
   that run used, resolved again from its resolved_config.json (a chain keeps its tokenizer);
3. with a wamkit export as the base: the tokenizer its wamkit.json names;
4. with a diffusers directory or a reference safetensors export: the tokenizer files shipped with it
   (`tokenizer/` beside `transformer/`, or tokenizer.json / tokenizer_config.json beside the
   weights). None found is a ConfigError naming model.text_tokenizer_path: the byte tokenizer with
   pretrained text weights is never chosen silently;
5. no base (random init): the byte tokenizer.

Export writes the resolved tokenizer next to the transformer and records it in wamkit.json
(`text_tokenizer_info`), and serving rebuilds it from there (`text_tokenizer_from_export`)."""

from __future__ import annotations

from pathlib import Path

from wamkit.errors import ConfigError

BYTE = "byte"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
EXPORT_TEXT_TOKENIZER_DIR = "text_tokenizer"
_FIX = ('set model.text_tokenizer_path to the tokenizer directory of the release the base came from '
        '(the Qwen tokenizer of Cosmos3, e.g. <Cosmos3-Nano diffusers dir>/tokenizer), or to "byte" only if the '
        'base was itself trained on byte tokens')


class ByteTokenizer:
    """Text tokenizer for the tiny preset: UTF-8 bytes offset by three special ids."""

    pad_id, bos_id, eos_id = 0, 1, 2
    vocab_size = 259
    path = BYTE

    def __init__(self, max_tokens: int, explicit: bool = False):
        self.max_tokens = max_tokens
        self.explicit = explicit  # chosen by name ("byte"), not by default (random init)

    def encode(self, text: str) -> list[int]:
        ids = [self.bos_id] + [b + 3 for b in text.encode("utf-8")][: self.max_tokens - 2] + [self.eos_id]
        return ids

    def length(self, text: str) -> int:
        """Tokens of `text` before the cut at max_tokens (bos + bytes + eos)."""
        return len(text.encode("utf-8")) + 2


class PretrainedTextTokenizer:
    """The tokenizer files shipped in a real checkpoint directory (through `transformers`; local
    files only, nothing is downloaded)."""

    def __init__(self, path: str, max_tokens: int):
        try:
            from transformers import AutoTokenizer, PreTrainedTokenizerFast
        except ImportError as exc:
            raise ConfigError("model.text_tokenizer_path", "needs the `transformers` package", "pip install transformers") from exc
        self.path = str(path)
        try:
            self.tok = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        except Exception as exc:  # e.g. a tokenizer.json without a tokenizer_config.json naming its class
            if not (Path(self.path) / "tokenizer.json").is_file():
                raise ConfigError("model.text_tokenizer_path", f"{self.path} does not load as a tokenizer: {exc}",
                                  "point it at a directory written by a tokenizer's save_pretrained") from exc
            self.tok = PreTrainedTokenizerFast(tokenizer_file=str(Path(self.path) / "tokenizer.json"))
        self.max_tokens = max_tokens
        self.vocab_size = len(self.tok)

    def encode(self, text: str) -> list[int]:
        return self.tok(text, truncation=True, max_length=self.max_tokens)["input_ids"]

    def length(self, text: str) -> int:
        """Tokens of `text` before the cut at max_tokens."""
        return len(self.tok(text)["input_ids"])

    def save(self, directory: str | Path) -> None:
        self.tok.save_pretrained(str(directory))


def build_text_tokenizer(path: str, max_tokens: int):
    """"" (default) or "byte" (chosen) -> ByteTokenizer; else a tokenizer directory. No resolution:
    see resolve_text_tokenizer."""
    if path in ("", BYTE):
        return ByteTokenizer(max_tokens, explicit=path == BYTE)
    return PretrainedTextTokenizer(path, max_tokens)


_WARNED: set[str] = set()


def warn_truncated_prompts(tokenizer, prompts, source: str) -> str | None:
    """Every prompt longer than `model.max_text_tokens` is cut by `encode` (the end of the text is lost):
    say so once per process (rank 0), with the count, the longest prompt and the knob. Returns the
    warning (None when every prompt fits)."""
    import os
    import sys

    lengths = sorted(((tokenizer.length(p), p) for p in set(prompts)), reverse=True)
    cut = [(n, p) for n, p in lengths if n > tokenizer.max_tokens]
    if not cut:
        return None
    n, longest = cut[0]
    text = (f"{len(cut)} of {len(lengths)} prompt(s) of {source} are longer than model.max_text_tokens = "
            f"{tokenizer.max_tokens} tokens and are cut to it (the longest, {n} tokens: {longest!r}); "
            f"--set model.max_text_tokens={n} keeps them whole")
    if text not in _WARNED and os.environ.get("RANK", "0") == "0":
        _WARNED.add(text)
        print(f"[wamkit] warning: {text}", file=sys.stderr, flush=True)
    return text


def has_tokenizer_files(directory: Path) -> bool:
    return directory.is_dir() and any((directory / name).is_file() for name in TOKENIZER_FILES)


def resolve_text_tokenizer(cfg):
    """The text tokenizer of this run (see the module docstring for the order)."""
    return build_text_tokenizer(text_tokenizer_source(cfg), cfg.model.max_text_tokens)


def text_tokenizer_source(cfg, _depth: int = 0) -> str:
    """"" (byte tokenizer by default: random init), "byte" (chosen) or the absolute path of a
    tokenizer directory."""
    from wamkit.config.env import resolved

    explicit = resolved(cfg.model, "text_tokenizer_path")
    if explicit:
        if explicit == BYTE:
            return BYTE
        path = Path(explicit).expanduser()
        if not has_tokenizer_files(path):
            raise ConfigError("model.text_tokenizer_path", f"{path} has no tokenizer files ({' or '.join(TOKENIZER_FILES)})",
                              'point it at a tokenizer directory (e.g. <Cosmos3-Nano diffusers dir>/tokenizer), or set "byte"')
        return str(path.resolve())
    if not cfg.checkpoint.load_path:
        return ""  # random init: nothing pretrained to match, the byte tokenizer
    from wamkit.train.checkpoint import COMPLETE_MARKER, load_path_location

    base = load_path_location(resolved(cfg.checkpoint, "load_path"))

    if (base / COMPLETE_MARKER).exists():
        return _from_wamkit_checkpoint(base, _depth)
    if (base / "wamkit.json").is_file():
        return _from_export_manifest(base)
    found = _shipped_tokenizer(base)
    if found is not None:
        return str(found.resolve())
    kind = "reference-framework safetensors export" if _is_reference_export(base) else "diffusers checkpoint"
    raise ConfigError(
        "model.text_tokenizer_path",
        f"is empty and the base checkpoint {base} ({kind}) ships no tokenizer files (a tokenizer/ directory beside "
        "transformer/, or tokenizer.json / tokenizer_config.json beside the weights); the byte tokenizer would feed "
        "UTF-8 bytes into a text pathway trained on other token ids",
        _FIX,
    )


def _shipped_tokenizer(base: Path) -> Path | None:
    if base.is_file():
        roots = [base.parent]
    elif (base / "transformer").is_dir():
        roots = [base]
    elif base.name == "transformer":
        roots = [base.parent, base]
    else:
        roots = [base]
    for root in roots:
        for candidate in (root / "tokenizer", root):
            if has_tokenizer_files(candidate):
                return candidate
    return None


def _is_reference_export(base: Path) -> bool:
    from safetensors import safe_open

    from wamkit.model.state_dict_adapter import is_reference_state_dict

    files = [base] if base.is_file() else sorted(base.glob("*.safetensors"))
    if not files:
        return False
    try:
        with safe_open(str(files[0]), framework="pt") as f:
            return is_reference_state_dict(list(f.keys()))
    except Exception:  # unreadable: the weight loader reports it
        return False


def _from_wamkit_checkpoint(iteration: Path, depth: int) -> str:
    import json

    from wamkit.config import config_from_dict

    run_dir = iteration.resolve().parent.parent
    saved = run_dir / "resolved_config.json"
    fix = 'set model.text_tokenizer_path to the tokenizer that run used ("byte" or its tokenizer directory)'
    if not saved.is_file():
        raise ConfigError("model.text_tokenizer_path", f"is empty and the wamkit checkpoint {iteration} has no "
                          f"{saved} telling which text tokenizer it was trained with", fix)
    if depth > 32:
        raise ConfigError("model.text_tokenizer_path", f"the checkpoint chain through {iteration} does not end", fix)
    earlier = config_from_dict(json.loads(saved.read_text()))
    try:
        return text_tokenizer_source(earlier, depth + 1)
    except ConfigError as exc:
        raise ConfigError("model.text_tokenizer_path", f"is empty, and the text tokenizer of the earlier run {run_dir} "
                          f"(which checkpoint.load_path continues) cannot be resolved: {exc}", fix) from exc


def _from_export_manifest(directory: Path) -> str:
    import json

    info = json.loads((directory / "wamkit.json").read_text()).get("model", {})
    return text_tokenizer_from_export_info(directory, info)


# ---- export / serving ----------------------------------------------------------------------------

def text_tokenizer_info(tokenizer) -> dict:
    """What wamkit.json records about the text tokenizer (the export holds its files)."""
    if isinstance(tokenizer, ByteTokenizer):
        return {"text_tokenizer": BYTE, "text_tokenizer_path": BYTE}
    return {"text_tokenizer": EXPORT_TEXT_TOKENIZER_DIR, "text_tokenizer_path": tokenizer.path}


def save_text_tokenizer(tokenizer, directory: Path) -> None:
    """Write the tokenizer files an export carries (nothing for the byte tokenizer)."""
    info = text_tokenizer_info(tokenizer)
    if info["text_tokenizer"] != BYTE:
        tokenizer.save(Path(directory) / info["text_tokenizer"])


def text_tokenizer_from_export_info(directory: Path, info: dict) -> str:
    name = info.get("text_tokenizer", BYTE)
    if name == BYTE:
        return BYTE
    path = Path(directory) / name
    if not has_tokenizer_files(path):
        from wamkit.errors import CheckpointError

        raise CheckpointError(str(path), "is named in wamkit.json as the text tokenizer but has no tokenizer files", "re-export the run")
    return str(path.resolve())


def text_tokenizer_from_export(directory: Path, info: dict):
    return build_text_tokenizer(text_tokenizer_from_export_info(directory, info), int(info["max_text_tokens"]))
