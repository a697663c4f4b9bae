"""What a checkpoint or export directory holds, recorded when it is written and checked when it is read.

A file that is there is not a file to trust: shards get cut short, bit-rotted, lost or copied from
another iteration, and DCP or safetensors then fail with an internal traceback, or load the wrong
weights without a word. So every save writes `wamkit_manifest.json` (each file's relative name,
size and xxh3-128 hash) before its completion marker, and every load compares the files with it:
sizes always (a stat), hashes unless `checkpoint.verify = "size"` (one read of every byte). The
manifest carries a digest of its own entries, so a torn or edited manifest is damage too.

This module knows only files in a directory, not what a state dict holds. Under torch.distributed
(as for DCP's own save and load) the files are split over the ranks, each hashes its share, and
every rank gets every rank's findings, so all ranks stop together with the same error."""

from __future__ import annotations

import json
from dataclasses import dataclass

import xxhash

from wamkit.errors import CheckpointError

MANIFEST = "wamkit_manifest.json"
FORMAT = "wamkit-manifest"
VERSION = 1
HASH = "xxh3_128"
VERIFY_LEVELS = ("hash", "size")  # checkpoint.verify; sizes are checked at every level
CHUNK = 16 << 20


@dataclass(frozen=True)
class Damage:
    """One file that is not what the manifest says it was when it was written."""

    file: str
    problem: str

    def __str__(self) -> str:
        return f"{self.file}: {self.problem}"


def file_hash(path) -> str:
    """xxh3-128 of a local or object-store file, read in chunks."""
    digest = xxhash.xxh3_128()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def bytes_entry(data: bytes, hashes: bool = True) -> dict:
    """The manifest entry of a file about to be written with `data` (the completion marker)."""
    return {"size": len(data), **({HASH: xxhash.xxh3_128_hexdigest(data)} if hashes else {})}


def file_entries(directory, names, hashes: bool) -> dict:
    """{name: {"size", "xxh3_128"}} of the named files of `directory`."""
    return {name: {"size": _size(directory / name), **({HASH: file_hash(directory / name)} if hashes else {})} for name in names}


def list_files(directory) -> list[str]:
    """Every file under `directory` as a relative posix name, the manifest itself left out."""
    if hasattr(directory, "fs"):  # a UPath: one listing call instead of a walk
        _forget_listings(directory)
        root = directory.path.rstrip("/") + "/"
        names = [p[len(root):] for p in directory.fs.find(directory.path)]
        _forget_listings(directory)  # this listing predates the marker: never let a later exists() see it
    else:
        names = [p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()]
    return sorted(n for n in names if n and n != MANIFEST)


def write_manifest(directory, files: dict, hashes: bool) -> None:
    """Write the manifest of `files` (from file_entries / bytes_entry) into `directory`."""
    entries = {name: files[name] for name in sorted(files)}
    body = {"format": FORMAT, "version": VERSION, "hash": HASH if hashes else None, "files": entries, "digest": _digest(entries)}
    (directory / MANIFEST).write_text(json.dumps(body, indent=1))


def read_manifest(directory) -> dict | None:
    """The manifest's file entries; None when the directory has none (written before manifests).
    Raises CheckpointError when the manifest itself is damaged."""
    path = directory / MANIFEST
    if not path.exists():
        return None
    try:
        body = json.loads(path.read_text())
        files = body["files"]
        intact = body.get("format") == FORMAT and body.get("digest") == _digest(files)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        intact = False
    if not intact:
        raise CheckpointError(str(directory), f"is damaged: {MANIFEST} is torn or altered (its digest does not match its entries)",
                              "restore the directory from a copy, or use another one")
    return files


def find_damage(directory, files: dict, level: str, rank: int = 0, world: int = 1) -> list[Damage]:
    """This rank's share of the damaged files (missing, other size, other hash), in name order."""
    found = []
    for i, name in enumerate(sorted(files)):
        if i % world != rank:
            continue
        entry, path = files[name], directory / name
        size = _size(path)
        if size is None:
            found.append(Damage(name, "missing (the manifest lists it)"))
        elif size != entry["size"]:
            found.append(Damage(name, f"is {size} bytes, the manifest says {entry['size']} (cut short, grown or replaced)"))
        elif level == "hash" and HASH in entry and file_hash(path) != entry[HASH]:
            found.append(Damage(name, "content hash differs from the manifest (bytes changed since the save)"))
    return found


def gather(items: list) -> list:
    """Every rank's `items`, concatenated in rank order (the list itself without torch.distributed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(items)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, list(items))
    return [item for part in everyone for item in part]


def rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def damage_of(directory, level: str = "hash", collective: bool = True) -> list[Damage] | None:
    """All damage in `directory` (an empty list: intact), None when it has no manifest. `collective`
    under torch.distributed: every rank must call it; otherwise this process checks every file."""
    if level not in VERIFY_LEVELS:
        raise ValueError(f"verify level {level!r} is not one of {VERIFY_LEVELS}")
    _forget_listings(directory)
    try:
        files = read_manifest(directory)
    except CheckpointError as exc:
        files, own = {}, [Damage(MANIFEST, exc.problem.removeprefix("is damaged: "))]
    else:
        own = []
    share = gather if collective else list
    if files is None:
        share([])
        return None
    rank, world = rank_and_world() if collective else (0, 1)
    own += find_damage(directory, files, level, rank, world)
    _forget_listings(directory)
    return sorted(set(share(own)), key=lambda d: d.file)


def damage_report(directory, damage: list[Damage]) -> str:
    return f"is damaged: {'; '.join(map(str, damage))}"


def unverified_note(directory) -> str:
    return f"[wamkit] note: {directory} has no {MANIFEST} (written before wamkit recorded one): its files cannot be verified"


def _forget_listings(directory) -> None:
    """An object-store filesystem caches listings (and sizes) per process: look at the store itself,
    and leave no listing behind that a later look (at a marker written meanwhile) would trust."""
    if hasattr(directory, "fs"):
        directory.fs.invalidate_cache(directory.path)


def _size(path) -> int | None:
    try:
        return int(path.stat().st_size)
    except (FileNotFoundError, OSError):
        return None


def _digest(files: dict) -> str:
    return xxhash.xxh3_128_hexdigest(json.dumps(files, sort_keys=True).encode())
