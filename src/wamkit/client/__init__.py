"""Robot-side client for `wamkit serve` (numpy, msgpack, websockets; no torch)."""

from wamkit.client.buffer import ChunkBuffer
from wamkit.client.realtime import Exchange, RealtimeClient

__all__ = ["ChunkBuffer", "Exchange", "RealtimeClient"]
