"""What verifying a checkpoint costs: xxh3-128 of one multi-GB file, as wamkit.train.manifest
hashes every shard at save and at load. Prints MB/s for reading alone, hashing from memory, and
read + hash (wamkit's file_hash) from the page cache and, with --direct, from the disk itself.
Writes the file under --dir and deletes it afterwards.

    python benchmarks/hash_speed.py --gib 3 --dir /tmp
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import xxhash

from wamkit.train.manifest import CHUNK, file_hash


def write_file(path: Path, gib: float) -> int:
    block = os.urandom(64 << 20)
    size = int(gib * (1 << 30)) // len(block) * len(block)
    with open(path, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    return size


def rate(size: int, seconds: float) -> str:
    return f"{size / seconds / 1e6:8.0f} MB/s ({seconds:5.2f} s)"


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def read_only(path: Path, flags: int = 0) -> None:
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        if flags:  # O_DIRECT needs an aligned buffer: an anonymous mmap is page-aligned
            import mmap

            buf = mmap.mmap(-1, CHUNK)
            while os.readv(fd, [buf]):
                pass
        else:
            while os.read(fd, CHUNK):
                pass
    finally:
        os.close(fd)


def hash_direct(path: Path) -> str:
    import mmap

    digest, buf = xxhash.xxh3_128(), mmap.mmap(-1, CHUNK)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        while n := os.readv(fd, [buf]):
            digest.update(memoryview(buf)[:n])
    finally:
        os.close(fd)
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=3.0)
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--direct", action="store_true", help="also read with O_DIRECT (the disk, not the page cache)")
    args = parser.parse_args()
    path = Path(args.dir) / f"wamkit_hash_speed_{os.getpid()}.bin"
    try:
        size = write_file(path, args.gib)
        print(f"file: {path} ({size / (1 << 30):.2f} GiB), xxhash {xxhash.VERSION} (libxxhash {xxhash.XXHASH_VERSION}), chunk {CHUNK >> 20} MiB")
        memory = os.urandom(256 << 20)
        t = min(timed(lambda: xxhash.xxh3_128_hexdigest(memory)) for _ in range(3))
        print(f"xxh3-128 from memory              {rate(len(memory), t)}")
        read_only(path)  # warm the page cache
        print(f"read only, page cache             {rate(size, timed(lambda: read_only(path)))}")
        print(f"read + xxh3-128, page cache       {rate(size, timed(lambda: file_hash(path)))}   <- file_hash")
        if args.direct:
            print(f"read only, O_DIRECT (disk)        {rate(size, timed(lambda: read_only(path, os.O_DIRECT)))}")
            print(f"read + xxh3-128, O_DIRECT (disk)  {rate(size, timed(lambda: hash_direct(path)))}")
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
