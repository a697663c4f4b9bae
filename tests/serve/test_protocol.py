"""The wire format: openpi's msgpack-numpy both ways, and safe decoding."""

import pickle

import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy as opm

from wamkit.serve.protocol import ProtocolError, packb, unpackb


def test_openpi_client_encoding_decodes_and_ours_decodes_in_openpi():
    obj = {"observation/image": np.arange(24, dtype=np.uint8).reshape(2, 4, 3), "state": np.array([1.5, -2.0]),
           "prompt": "reach", "n": np.int64(3), "f": np.float32(0.25), "nested": {"a": [np.zeros((0, 2), np.float32)]}}
    ours = unpackb(opm.packb(obj))
    np.testing.assert_array_equal(ours["observation/image"], obj["observation/image"])
    assert ours["observation/image"].dtype == np.uint8 and ours["observation/image"].flags.writeable
    np.testing.assert_array_equal(ours["state"], obj["state"])
    assert ours["prompt"] == "reach" and ours["n"] == 3 and isinstance(ours["n"], np.int64)
    assert ours["f"] == np.float32(0.25) and ours["nested"]["a"][0].shape == (0, 2)
    back = opm.unpackb(packb({"action": np.ones((8, 3), np.float32), "server_timing": {"infer_ms": 1.0}}))
    assert back["action"].shape == (8, 3) and back["action"].dtype == np.float32


def test_big_endian_arrays_are_converted_to_native():
    arr = np.array([1.0, 2.0], dtype=">f8")
    out = unpackb(msgpack.packb({b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": arr.dtype.str, b"shape": [2]}))
    np.testing.assert_array_equal(out, [1.0, 2.0]) and out.dtype.isnative


@pytest.mark.parametrize("dtype", ["|O", "|V8", "<c8", "<U3", "|S3", "<M8[s]"])
def test_object_void_and_other_dtypes_are_rejected(dtype):
    msg = msgpack.packb({b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": dtype, b"shape": [1]})
    with pytest.raises(ProtocolError, match="dtype"):
        unpackb(msg)


def test_wrong_byte_count_shape_and_scalar_are_rejected():
    with pytest.raises(ProtocolError, match="bytes"):
        unpackb(msgpack.packb({b"__ndarray__": True, b"data": b"\0" * 7, b"dtype": "<f4", b"shape": [2]}))
    with pytest.raises(ProtocolError, match="shape"):
        unpackb(msgpack.packb({b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [-1]}))
    with pytest.raises(ProtocolError, match="number"):
        unpackb(msgpack.packb({b"__npgeneric__": True, b"data": "x", b"dtype": "<f4"}))


def test_pickle_ext_types_and_garbage_are_rejected():
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        unpackb(pickle.dumps({"a": 1}))
    with pytest.raises(ProtocolError, match="extension type"):
        unpackb(msgpack.packb(msgpack.ExtType(42, b"payload")))
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        unpackb(b"\xc1\xc1\xc1")
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        unpackb(opm.packb({"a": np.zeros(100)})[:-5])  # truncated
    with pytest.raises(ProtocolError, match="binary"):
        unpackb("text")


def test_encoding_refuses_object_arrays():
    with pytest.raises(TypeError):
        packb({"x": np.array([object()], dtype=object)})
