"""Find a LeRobot dataset by repo id where LeRobot itself keeps it, offline.

LeRobot (0.4 to 0.6) opens `LeRobotDataset("org/name")` from `$HF_LEROBOT_HOME/org/name` when that folder
holds a dataset, and LeRobot 0.5+ downloads into a Hugging Face hub cache under `$HF_LEROBOT_HOME/hub`
(`datasets--org--name/snapshots/<commit>/`, revision `v3.0`). A recipe's `data.repo_id` resolves the same
two places, in that order, without touching the network: a run must never download behind the user's back.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from wamkit.errors import ConfigError

REVISIONS = ("v3.0", "main")  # LeRobot 0.6 asks the hub for the codebase version's tag; a branch download is "main"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")  # hub names: no leading "." (no ../)


def hf_lerobot_home() -> Path:
    """Where LeRobot keeps datasets, as LeRobot resolves it: $HF_LEROBOT_HOME, else $HF_HOME/lerobot,
    where HF_HOME defaults (as in huggingface_hub) to $XDG_CACHE_HOME/huggingface or ~/.cache/huggingface."""
    if os.environ.get("HF_LEROBOT_HOME"):
        return Path(os.environ["HF_LEROBOT_HOME"]).expanduser()
    hf_home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(hf_home).expanduser() / "lerobot"


def download_command(repo_id: str) -> str:
    """The one command that puts `repo_id` where both LeRobot 0.6 and wamkit look for it."""
    return (f"hf download {repo_id} --repo-type dataset --revision v3.0 --cache-dir {hf_lerobot_home() / 'hub'} "
            f"(or open it once online with LeRobot: LeRobotDataset({repo_id!r}))")


def _snapshot(repo_id: str, hub_cache: Path) -> Path | None:
    """The cached snapshot of the first revision in REVISIONS that is on disk, read by huggingface_hub
    itself (refs/<revision> -> snapshots/<commit>) with local_files_only: never a download."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    for revision in REVISIONS:
        try:
            return Path(snapshot_download(repo_id, repo_type="dataset", revision=revision, cache_dir=hub_cache,
                                          local_files_only=True))
        except LocalEntryNotFoundError:
            continue
    return None


def check_repo_id(repo_id: str, field_name: str = "data.repo_id") -> None:
    """A repo id is '<org>/<name>': anything else would be joined onto HF_LEROBOT_HOME as a path."""
    if not _REPO_ID.match(repo_id):
        raise ConfigError(field_name, f"{repo_id!r} is not a hub repo id", "use '<org>/<name>', e.g. 'lerobot/pusht'")


def resolve_repo_id(repo_id: str, field_name: str = "data.repo_id") -> Path:
    """The local root of dataset `repo_id`: $HF_LEROBOT_HOME/<repo_id>, else its hub-cache snapshot. A
    snapshot holding only meta/ (LeRobot downloads metadata first) is refused: training would stop at
    the first missing parquet instead."""
    check_repo_id(repo_id, field_name)
    home = hf_lerobot_home()
    local = home / repo_id
    if (local / "meta" / "info.json").is_file():
        return local
    snapshot = _snapshot(repo_id, home / "hub")
    if snapshot is None or not (snapshot / "meta" / "info.json").is_file():
        raise ConfigError(field_name, f"{repo_id!r} is not in LeRobot's local cache: neither {local}/meta/info.json "
                          f"nor a {'/'.join(REVISIONS)} snapshot under {home / 'hub'} (HF_LEROBOT_HOME = {home})",
                          f"download it: {download_command(repo_id)}; or set data.path to the dataset's folder")
    if not (snapshot / "data").is_dir():
        raise ConfigError(field_name, f"the cached snapshot {snapshot} holds the metadata but no data/ folder "
                          "(LeRobot downloads meta/ first, then the episodes it is asked for)",
                          f"download the whole dataset: {download_command(repo_id)}")
    return snapshot
