"""The wire format of `wamkit serve`: openpi's msgpack-numpy over websockets.

Every binary websocket message is one msgpack value. numpy arrays travel as a map

    {b"__ndarray__": True, b"data": <raw bytes, C order>, b"dtype": <numpy dtype.str, e.g. "<f4">, b"shape": [..]}

and numpy scalars as {b"__npgeneric__": True, b"data": <python value>, b"dtype": <dtype.str>}, with bytes
keys, exactly as `openpi_client.msgpack_numpy` writes and reads them (maps with str keys are accepted
too). Errors are sent as a websocket *text* message: openpi's `WebsocketClientPolicy.infer` treats a
str reply as a server error and raises `RuntimeError` with its text.

Decoding is safe by construction: msgpack never executes code, extension types are rejected, and only
plain numeric/bool dtypes are accepted (object, void/structured and complex dtypes are refused), the
byte length must match shape x itemsize, and arrays are copied into writable native-order memory.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

from wamkit.errors import WamkitError

# numpy dtype kinds a request may carry: bool, signed/unsigned int, float.
ALLOWED_KINDS = frozenset("biuf")
MAX_NDIM = 8


class ProtocolError(WamkitError, ValueError):
    """A request could not be decoded or does not follow the request schema; `where` names the field."""


# ---- encoding -----------------------------------------------------------------------------------

def _encode_default(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind not in ALLOWED_KINDS:
        raise TypeError(f"cannot send numpy dtype {obj.dtype} (only bool/int/uint/float)")
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        return {b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": arr.dtype.str, b"shape": list(arr.shape)}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot send objects of type {type(obj).__name__}")


def packb(obj: Any) -> bytes:
    """msgpack bytes for a value made of dicts, lists, str, numbers, bytes and numpy arrays/scalars."""
    return msgpack.packb(obj, default=_encode_default, use_bin_type=True)


# ---- decoding -----------------------------------------------------------------------------------

def _get(obj: dict, name: str):
    if name.encode() in obj:
        return obj[name.encode()]
    return obj.get(name)


def _dtype(value, where: str) -> np.dtype:
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str) or len(value) > 8:
        raise ProtocolError(where, f"dtype must be a numpy dtype string like '<f4', got {value!r}")
    try:
        dtype = np.dtype(value)
    except TypeError as exc:
        raise ProtocolError(where, f"unknown dtype {value!r}: {exc}") from exc
    if dtype.kind not in ALLOWED_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise ProtocolError(where, f"dtype {value!r} is not allowed", "send bool, int, uint or float arrays (object/void/complex are refused)")
    return dtype


def _decode_ndarray(obj: dict) -> np.ndarray:
    where = "request: ndarray"
    dtype = _dtype(_get(obj, "dtype"), where)
    shape = _get(obj, "shape")
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_NDIM or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise ProtocolError(where, f"shape must be a list of at most {MAX_NDIM} non-negative ints, got {shape!r}")
    data = _get(obj, "data")
    if not isinstance(data, (bytes, bytearray)):
        raise ProtocolError(where, f"data must be bytes, got {type(data).__name__}")
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise ProtocolError(where, f"data has {len(data)} bytes, shape {list(shape)} of {dtype.str} needs {expected}")
    arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=True)  # writable, native byte order


def _decode_generic(obj: dict):
    dtype = _dtype(_get(obj, "dtype"), "request: numpy scalar")
    value = _get(obj, "data")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if not (dtype.kind == "b" and isinstance(value, bool)):
            raise ProtocolError("request: numpy scalar", f"data must be a number, got {type(value).__name__}")
    try:
        return dtype.newbyteorder("=").type(value)
    except (OverflowError, ValueError) as exc:
        raise ProtocolError("request: numpy scalar", f"{value!r} does not fit {dtype.str}: {exc}") from exc


def _object_hook(obj: dict):
    if _get(obj, "__ndarray__") is not None:
        return _decode_ndarray(obj)
    if _get(obj, "__npgeneric__") is not None:
        return _decode_generic(obj)
    return obj


def _ext_hook(code: int, data: bytes):
    raise ProtocolError("request", f"msgpack extension type {code} is not supported", "send plain msgpack (openpi's msgpack_numpy)")


def unpackb(data: bytes) -> Any:
    """Decode one request message; raises ProtocolError (never anything else) on bad input."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError("request", f"must be a binary message, got {type(data).__name__}",
                            "send msgpack bytes (openpi_client.msgpack_numpy.packb), not text")
    try:
        return msgpack.unpackb(bytes(data), raw=False, object_hook=_object_hook, ext_hook=_ext_hook,
                               strict_map_key=True)
    except ProtocolError:
        raise
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise ProtocolError("request", f"is not valid msgpack ({type(exc).__name__}: {exc})",
                            "send msgpack bytes (openpi_client.msgpack_numpy.packb)") from exc
    except Exception as exc:  # msgpack raises a few other types on truncated input
        raise ProtocolError("request", f"is not valid msgpack ({type(exc).__name__}: {exc})",
                            "send msgpack bytes (openpi_client.msgpack_numpy.packb)") from exc


def error_text(exc: BaseException) -> str:
    """The text message sent for a failed request (one line of where/problem, then the fix)."""
    if isinstance(exc, WamkitError):
        return f"wamkit serve error: {exc}"
    return f"wamkit serve error: internal error ({type(exc).__name__}: {exc})"
