"""Where runs and checkpoints live: a local or shared-filesystem path, or an object store (s3://,
gs://) through fsspec.

A local path stays a pathlib.Path. An object-store URL becomes a universal_pathlib UPath, which
has the same methods (`/`, exists, read_text, write_text, glob), so the code that writes a run's
config files or reads a checkpoint's marker is the same for both. Whole-object writes are atomic in
S3 and GCS (a reader sees the old object or the new one), which is what `latest` relies on there.

Credentials come only from what the fsspec backend reads itself: the environment
(AWS_ACCESS_KEY_ID, AWS_PROFILE, AWS_ENDPOINT_URL, GOOGLE_APPLICATION_CREDENTIALS, ...) and the
standard config files (~/.aws, gcloud). A URL carrying credentials is refused, because URLs are
written into resolved_config.json and printed."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from urllib.parse import urlparse

from wamkit.errors import ConfigError

OBJECT_STORES = {"s3": "s3fs", "gs": "gcsfs"}  # scheme -> the fsspec backend package it needs
_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
INSTALL_FIX = 'pip install -e ".[objectstore]" (universal-pathlib, s3fs; for gs:// also gcsfs matching your fsspec)'


def is_url(path) -> bool:
    return bool(_URL_SCHEME.match(str(path)))


def is_remote(path) -> bool:
    """True for a location in an object store (as returned by `location`)."""
    return not isinstance(path, (str, Path))


def check_url(url: str, where: str) -> None:
    """Refuse, naming the field, what cannot be honoured: a scheme that is no object store wamkit
    supports (it would otherwise become a local folder named like the scheme), credentials inside
    the URL, or an object store whose fsspec backend is not installed."""
    if not is_url(url):
        return
    parts = urlparse(url)
    if parts.scheme not in OBJECT_STORES:
        raise ConfigError(where, f"{url!r} uses {parts.scheme}://, which wamkit does not support",
                          "use a local or shared-filesystem path, or an s3:// or gs:// URL")
    if parts.username or parts.password or "@" in parts.netloc:
        raise ConfigError(where, "the URL carries credentials, which would be written to resolved_config.json and logs",
                          "remove them from the URL and give them through the environment or the standard config files "
                          "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or ~/.aws; GOOGLE_APPLICATION_CREDENTIALS or gcloud)")
    if not parts.netloc:
        raise ConfigError(where, f"{url!r} names no bucket", f"write it as {parts.scheme}://<bucket>/<prefix>")
    _check_backend(parts.scheme, where)


def _check_backend(scheme: str, where: str) -> None:
    import importlib.util

    for module in ("upath", OBJECT_STORES[scheme]):
        if importlib.util.find_spec(module) is None:
            raise ConfigError(where, f"{scheme}:// needs the {module} package, which is not installed", INSTALL_FIX)


def location(path, where: str):
    """A Path (user-expanded) for a local path; a UPath for an s3:// or gs:// URL."""
    text = str(path)
    if not is_url(text):
        return Path(text).expanduser()
    check_url(text, where)
    from upath import UPath

    return UPath(text)


def remove_tree(path) -> None:
    """Delete a directory (local) or every object under a prefix (object store); absent is fine."""
    if not is_remote(path):
        shutil.rmtree(path, ignore_errors=True)
    elif path.fs.exists(path.path):
        path.fs.rm(path.path, recursive=True)


def move_tree(source, target) -> None:
    """Rename a directory (local) or move every object under a prefix, one by one (a recursive
    fsspec mv also tries to copy the prefix itself, which is no object in S3)."""
    if not is_remote(source):
        source.rename(target)
        return
    root = source.path.rstrip("/") + "/"
    for key in source.fs.find(source.path):
        source.fs.copy(key, (target / key[len(root):]).path)
    source.fs.rm(source.path, recursive=True)


def upload(local: Path, remote, names: tuple[str, ...]) -> None:
    """Copy the named files or directories of `local` to the `remote` prefix, file by file (a
    recursive put into an existing prefix would nest the directory inside itself)."""
    for name in names:
        source = local / name
        files = sorted(f for f in source.rglob("*") if f.is_file()) if source.is_dir() else [source] if source.is_file() else []
        for file in files:
            remote.fs.put_file(str(file), (remote / file.relative_to(local).as_posix()).path)


def download(remote, local: Path, name: str) -> None:
    """Copy one file of the `remote` prefix into `local` when it exists there."""
    source = remote / name
    if source.exists():
        local.mkdir(parents=True, exist_ok=True)
        source.fs.get_file(source.path, str(local / name))
