"""Policy serving: `wamkit serve EXPORT_DIR` speaks openpi's websocket + msgpack-numpy protocol."""

from wamkit.serve.protocol import ProtocolError, packb, unpackb
from wamkit.serve.server import PolicyServer, ServeConfig, load_policy, metadata, observation_from_request, predict_batch, serve_main

__all__ = ["PolicyServer", "ProtocolError", "ServeConfig", "load_policy", "metadata", "observation_from_request",
           "packb", "predict_batch", "serve_main", "unpackb"]
