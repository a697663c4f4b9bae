"""Policy serving: `wamkit serve EXPORT_DIR` speaks openpi's websocket + msgpack-numpy protocol.

The server names load lazily, so a robot-side client can import `wamkit.serve.protocol` without torch."""

from wamkit.serve.protocol import ProtocolError, packb, unpackb

_SERVER_NAMES = ("PolicyServer", "ServeConfig", "load_policy", "metadata", "observation_from_request", "predict_batch",
                 "serve_main")

__all__ = ["ProtocolError", "packb", "unpackb", *_SERVER_NAMES]


def __getattr__(name: str):
    if name in _SERVER_NAMES:
        from wamkit.serve import server

        return getattr(server, name)
    raise AttributeError(f"module 'wamkit.serve' has no attribute {name!r}")
