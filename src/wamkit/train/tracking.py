"""Weights & Biases as a metrics sink beside metrics.jsonl and TensorBoard (rank 0 only).

Why these choices:
- The W&B run id is kept in <run>/wandb_run_id, so relaunching a run name (a resume, possibly on
  another machine or world size) continues the same W&B run (resume="allow").
- Charts use wamkit's own `step` as their x-axis (define_metric) rather than W&B's internal step,
  which must only increase: the steps a killed run logged after its last checkpoint are trained
  again on resume, and W&B would silently drop their second logging.
- Credentials come only from the environment (WANDB_API_KEY, or the netrc entry `wandb login`
  writes); wamkit never reads them into files. An online run without them is a ConfigError at
  start, not an interactive login prompt or a hang on a cluster node; "offline" needs none.
- wandb is an optional extra (`pip install -e ".[tracking]"`): "disabled", the default, never
  imports it."""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from urllib.parse import urlparse

from wamkit.errors import ConfigError

RUN_ID_FILE = "wandb_run_id"
INSTALL_FIX = 'pip install -e ".[tracking]" (wandb==0.31.0)'


def check_wandb(cfg) -> None:
    """Fail before any model is built when W&B is asked for but cannot work."""
    mode = cfg.logging.wandb
    if mode == "disabled":
        return
    try:
        import wandb  # noqa: F401
    except ImportError as exc:
        raise ConfigError("logging.wandb", f"is {mode!r} but the wandb package is not installed ({exc})",
                          f"{INSTALL_FIX}, or --set logging.wandb='disabled'") from exc
    if mode == "online" and os.environ.get("WANDB_MODE", "") not in ("offline", "disabled", "dryrun") and not has_credentials():
        raise ConfigError(
            "logging.wandb", "is 'online' but no W&B credentials are in the environment (WANDB_API_KEY unset, "
            f"no netrc entry for {_host()})",
            "export WANDB_API_KEY=<your key> (or run `wandb login` once on this machine); or --set logging.wandb='offline' "
            "and upload later with `wandb sync <run>/wandb/offline-run-*`",
        )


def has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    path = os.environ.get("NETRC") or str(Path.home() / ".netrc")
    try:
        return netrc.netrc(path).authenticators(_host()) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _host() -> str:
    return urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"


def start_wandb(cfg, run_dir, local_dir: Path, config: dict, data_contract: dict):
    """The W&B run of this run name (new, or the one a previous launch started), or None when
    logging.wandb = "disabled". The run id is kept in `run_dir` (possibly an object store), W&B's
    own files go under `local_dir`. `config`: the resolved config; it and the data contract are
    logged once, as the run's config."""
    if cfg.logging.wandb == "disabled":
        return None
    check_wandb(cfg)
    import wandb
    from wandb.sdk.lib.runid import generate_id

    id_file = run_dir / RUN_ID_FILE
    if id_file.is_file():
        run_id = id_file.read_text().strip()
    else:
        run_id = generate_id()
        id_file.write_text(run_id + "\n")
    run = wandb.init(
        project=cfg.logging.project, group=cfg.logging.group or None, name=cfg.logging.run_name or cfg.job.name,
        id=run_id, resume="allow", mode=cfg.logging.wandb, dir=os.environ.get("WANDB_DIR") or str(local_dir),
        config={**config, "data_contract": data_contract},
        settings=wandb.Settings(init_timeout=120, console="off", save_code=False, disable_git=True),
    )
    run.define_metric("step", hidden=True)
    run.define_metric("*", step_metric="step")
    return run


def log_wandb(run, record: dict) -> None:
    run.log({k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
