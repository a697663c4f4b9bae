"""`wamkit train --dry-run`'s input checks: open (cheaply) every file the run will read and every
place it will write, and report all problems at once. A real launch stops at the first one; a user
who fixes them one launch at a time waits for a cluster allocation each time, so the dry run names
them all, each with its fix, and exits non-zero when any would stop the run."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from wamkit.config.env import ENV_PATH_FIELDS, expand_env, resolved
from wamkit.errors import ConfigError, DataError, WamkitError
from wamkit.storage import is_url


@dataclass
class CheckResult:
    name: str
    detail: str = ""  # what was found (ok) or why the check did not run (skipped)
    problems: list[WamkitError] = field(default_factory=list)
    skipped: bool = False

    @property
    def status(self) -> str:
        return "ERROR" if self.problems else "skip" if self.skipped else "ok"


@dataclass
class PreflightReport:
    results: list[CheckResult] = field(default_factory=list)

    @property
    def problems(self) -> list[WamkitError]:
        return [p for r in self.results for p in r.problems]

    def lines(self) -> list[str]:
        """The '# inputs' section of the dry run: one line per check."""
        out = ["# inputs (every file the run reads or writes; `wamkit data doctor` checks the dataset's contents)"]
        for r in self.results:
            text = r.detail if not r.problems else "; ".join(p.problem for p in r.problems)
            out.append(f"{r.status:<5} {r.name}: {text}")
        n = len(self.problems)
        out.append(f"{n} problem{'s' if n != 1 else ''} would stop the run" if n else "every input is in place")
        return out


Check = Callable[..., str | None]  # returns what it found (None: does not apply); raises WamkitError


def preflight(cfg, iterations: dict[str, str] | None = None) -> PreflightReport:
    """Run every input check; one failing check never hides another (a check whose input failed an
    earlier check is skipped, saying which). `iterations`: {field: path} of further wamkit
    iteration directories the run reads (a distillation's teacher, reference and critic)."""
    report = PreflightReport()

    def run(name: str, check: Check, *args, needs: CheckResult | None = None) -> CheckResult:
        result = CheckResult(name)
        if needs is not None and (needs.problems or needs.skipped):
            result.skipped, result.detail = True, f"not checked: {needs.name} did not pass"
        else:
            try:
                found = check(cfg, *args)
                result.skipped, result.detail = found is None, found or "does not apply to this recipe"
            except WamkitError as exc:
                result.problems.append(exc)
        report.results.append(result)
        return result

    opened: dict = {}  # the dataset, opened once for both of its checks
    dataset = run("dataset", check_dataset, opened)
    run("dataset keys", check_dataset_keys, opened, needs=dataset)
    run("keep ranges", check_keep_ranges)
    run("latent cache", check_latent_cache)
    base = run("base checkpoint", check_base_checkpoint)
    run("text tokenizer", check_text_tokenizer, needs=base if cfg.checkpoint.load_path else None)
    run("video tokenizer", check_vae)
    for dotted, value in (iterations or {}).items():
        run(dotted, check_iteration, dotted, value)
    run("output root", check_output_root)
    return report


def _field_path(cfg, dotted: str) -> Path:
    section, key = dotted.split(".")
    return Path(resolved(getattr(cfg, section), key)).expanduser()


def _missing(dotted: str, path: Path, problem: str = "does not exist") -> ConfigError:
    example, what = ENV_PATH_FIELDS[dotted]
    return ConfigError(dotted, f"{path} {problem}", f"point {dotted} at {what.split(';')[0]} (e.g. --set {dotted}={example})")


def check_dataset(cfg, opened: dict) -> str:
    from wamkit.bimanual.bundle import is_bundle, open_bundle
    from wamkit.data.multi import is_multi_root

    root = cfg.data.resolved_path()  # an unset ${VAR} or a repo_id LeRobot never downloaded raises here
    if is_bundle(root):
        return f"sim-bimanual bundle {root}: {len(open_bundle(root).samples)} samples"
    if not (root / "meta" / "info.json").exists() and not is_multi_root(root):
        if cfg.data.generate_demo:
            return f"{root} is missing: data.generate_demo writes the demo dataset there"
        raise _missing("data.path", root, "does not exist" if not root.exists() else "has no meta/info.json (not a LeRobot v3.0 dataset)")
    from wamkit.train.datasets import open_dataset

    dataset = opened["dataset"] = open_dataset(cfg)
    return (f"{root}: LeRobot v3.0, {len(dataset.episode_indices)} episodes, {dataset.fps:g} fps, "
            f"cameras {dataset.camera_keys}")


def check_dataset_keys(cfg, opened: dict) -> str | None:
    """The features and statistics the recipe reads are in the dataset (what build_run_data would
    refuse, without reading a single parquet row). None for a bundle or a demo still to be written."""
    if "dataset" not in opened:
        return None
    dataset, d = opened["dataset"], cfg.data
    info = f"{dataset.root}/meta/info.json: features"
    fix = "set the key to one of the dataset's features, or check the dataset with `wamkit data doctor`"
    if d.action_key not in dataset.features:
        raise DataError(info, f"has no action feature {d.action_key!r} (have {sorted(dataset.features)})", f"data.action_key: {fix}")
    if d.use_state and d.state_key not in dataset.features:
        raise DataError(info, f"data.use_state is true but there is no state feature {d.state_key!r}",
                        "--set data.use_state=false for a policy without state, or set data.state_key")
    missing = [c for c in d.camera_keys if c not in dataset.camera_keys]
    if missing:
        raise DataError(info, f"data.camera_keys names {missing}, which are not cameras of the dataset "
                        f"(cameras: {dataset.camera_keys})", "list the dataset's camera keys, or [] for all")
    dim = dataset.feature_dim(d.action_key)
    if dim > cfg.model.max_action_dim:
        raise ConfigError("model.max_action_dim", f"{cfg.model.max_action_dim} is below the dataset's action dim {dim}",
                          f"--set model.max_action_dim={dim}")
    if dataset.stats is None:
        raise DataError(f"{dataset.root}/meta/stats.json", "is missing", f"wamkit data stats {dataset.root}")
    return f"action {d.action_key!r} ({dim}-D)" + (f", state {d.state_key!r}" if d.use_state else "") + ", meta/stats.json"


def check_keep_ranges(cfg) -> str | None:
    if not cfg.data.keep_ranges_path:
        return None
    from wamkit.data.selection import KeepRanges

    ranges = KeepRanges.load(_field_path(cfg, "data.keep_ranges_path"))
    return f"{ranges.source}: {len(ranges.ranges)} trajectories"


def check_latent_cache(cfg) -> str | None:
    if not cfg.data.latent_cache:
        return None
    from wamkit.data.latent_cache import LatentCache

    cache = LatentCache(_field_path(cfg, "data.latent_cache"))
    return f"{cache.root} (the run checks its fingerprint against this recipe)"


def check_base_checkpoint(cfg) -> str | None:
    """checkpoint.load_path exists and is loadable: a wamkit iteration, or safetensors whose tensor
    names and shapes match the model (headers only, nothing is read)."""
    if not cfg.checkpoint.load_path:
        return None
    from wamkit.train import checkpoint as ckpt
    from wamkit.train.setup import base_weights_path

    path = base_weights_path(cfg)
    if (path / ckpt.COMPLETE_MARKER).exists():
        return f"{path}: wamkit checkpoint (step {ckpt.checkpoint_step(path)})"
    from wamkit.model.weights import BaseWeights
    from wamkit.train.setup import build_model, plain_state_dict

    base = BaseWeights(path)
    from wamkit.model.tokenizer import latent_channels_for

    channels = latent_channels_for(cfg.model.tokenizer, cfg.model.pixel_spatial_factor)
    model = build_model(cfg, channels, meta=True)
    base.check_matches({k: tuple(v.shape) for k, v in plain_state_dict(model).items()}, cfg.checkpoint.skip_action_heads)
    return f"{path}: {base.kind}, {len(list(base.keys()))} tensors match the model"


def check_iteration(cfg, dotted: str, value: str) -> str:
    """A completed wamkit iteration directory (its COMPLETE marker written last by the save)."""
    from wamkit.train import checkpoint as ckpt

    path = Path(expand_env(value, dotted)).expanduser()
    if not path.is_dir():
        raise ConfigError(dotted, f"{path} does not exist", "point it at a completed runs/<name>/checkpoints/iter_<N> directory")
    if not (path / ckpt.COMPLETE_MARKER).exists():
        raise ConfigError(dotted, f"{path} has no {ckpt.COMPLETE_MARKER} marker (not a completed wamkit checkpoint)",
                          "point it at a completed runs/<name>/checkpoints/iter_<N> directory")
    return f"{path}: wamkit checkpoint (step {ckpt.checkpoint_step(path)})"


def check_text_tokenizer(cfg) -> str:
    from wamkit.model.text_tokenizer import BYTE, text_tokenizer_source

    source = text_tokenizer_source(cfg)
    return {"": "byte tokenizer (random init: no pretrained vocabulary to match)", BYTE: "byte tokenizer (chosen)"}.get(source, source)


def check_vae(cfg) -> str:
    if cfg.model.tokenizer != "wan2.2":
        return f"{cfg.model.tokenizer} tokenizer (no weights to read)"
    path = _field_path(cfg, "model.vae_path")
    if not path.is_dir():
        raise _missing("model.vae_path", path, "does not exist" if not path.exists() else "is not a directory")
    if not (path / "config.json").is_file() or not any([*path.glob("*.safetensors"), *path.glob("*.bin")]):
        raise _missing("model.vae_path", path, "has no config.json and weights (*.safetensors or *.bin): not a diffusers "
                       "AutoencoderKLWan directory")
    return f"{path}: AutoencoderKLWan directory"


def check_output_root(cfg) -> str:
    """The run directory can be created and written: found now, not at the first save."""
    if is_url(cfg.job.output_root):
        return f"{cfg.job.output_root}/{cfg.job.name} (object store: written through the local staging directory)"
    run_dir = Path(cfg.job.run_dir())
    existing = next(p for p in [run_dir, *run_dir.parents] if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError("job.output_root", f"{existing} is not a writable directory, so {run_dir} cannot be written",
                          "--set job.output_root=DIR with a directory you can write (or export WAMKIT_OUTPUT_ROOT=DIR)")
    latest = run_dir / "checkpoints" / "latest"
    resumes = f" (resumes from {latest.read_text().strip()})" if latest.is_file() else " (a new run)"
    return f"{run_dir}{resumes}"
