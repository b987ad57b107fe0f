"""sheepop's safetensors writer (sheepop.checkpoint.tensor_file) against the reference reader:
every dtype it writes, shapes with no element and no axis, column-major and big-endian arrays,
the metadata; the header padded as the reference pads it; and a checkpoint written with it is
read back by sheepop's own checked loader."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import safetensors.numpy
from safetensors import safe_open
from safetensors.numpy import save as reference_save

from sheepop.checkpoint import format as checkpoint
from sheepop.checkpoint.check import check_weights_file
from sheepop.checkpoint.commit import sha256_hex
from sheepop.checkpoint.tensor_file import DTYPES, safetensors_bytes, safetensors_parts


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {f"t.{name}": (rng.standard_normal((3, 5)) * 50).astype(dtype)
           for dtype, name in DTYPES.items() if name != "BOOL"}
    out["t.BOOL"] = rng.random((4,)) > 0.5
    out["scalar"] = np.array(2.5, dtype=np.float32)
    out["empty"] = np.zeros((0, 7), dtype=np.float32)
    out["column_major"] = np.asfortranarray(rng.standard_normal((6, 4), dtype=np.float32))
    out["transposed_view"] = rng.standard_normal((4, 6), dtype=np.float32).T
    out["big_endian"] = rng.standard_normal(5).astype(">f4")
    return out


def test_the_reference_reader_reads_back_every_tensor_and_the_metadata(tmp_path):
    tensors = arrays()
    data = safetensors_bytes(tensors, metadata={"format": "pt", "note": "ünïcode"})
    back = safetensors.numpy.load(data)
    assert set(back) == set(tensors)
    for name, array in tensors.items():
        assert back[name].shape == array.shape, name
        assert back[name].dtype == array.dtype.newbyteorder("<"), name
        np.testing.assert_array_equal(back[name], array, err_msg=name)
    path = tmp_path / "t.safetensors"
    path.write_bytes(data)
    with safe_open(path, framework="numpy") as f:
        assert f.metadata() == {"format": "pt", "note": "ünïcode"}


def test_the_header_is_padded_to_8_bytes_and_the_data_follows_in_order():
    tensors = {"b": np.arange(3, dtype=np.float32), "a": np.arange(2, dtype=np.int64)}
    data = safetensors_bytes(tensors)
    n = int.from_bytes(data[:8], "little")
    assert n % 8 == 0
    header = json.loads(data[8:8 + n])
    assert header == {"b": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
                      "a": {"dtype": "I64", "shape": [2], "data_offsets": [12, 28]}}
    assert data[8 + n:] == tensors["b"].tobytes() + tensors["a"].tobytes()
    assert "__metadata__" not in header  # none given, none written
    parts = safetensors_parts(tensors)
    assert b"".join(parts) == data
    assert sha256_hex(parts) == sha256_hex(data) == hashlib.sha256(data).hexdigest()


def test_the_same_tensors_as_the_reference_writer_with_a_byte_equal_data_part():
    """The reference orders tensors its own way; each tensor's bytes are the same. (Row-major
    little-endian ones only: the reference writes a column-major array's memory as it lies,
    which its own reader then takes as row-major: the transpose, scrambled.)"""
    tensors = {k: v for k, v in arrays().items()
               if v.dtype.byteorder != ">" and v.flags.c_contiguous}
    ours, ref = safetensors_bytes(tensors), reference_save(tensors)
    for data in (ours, ref):
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n])
        body = data[8 + n:]
        got = {k: body[e["data_offsets"][0]:e["data_offsets"][1]] for k, e in header.items()}
        assert got == {k: np.ascontiguousarray(v).tobytes() for k, v in tensors.items()}


def test_a_dtype_it_has_no_name_for_is_refused_by_the_tensors_name():
    with pytest.raises(ValueError, match="'z'.*complex64"):
        safetensors_bytes({"z": np.zeros(2, dtype=np.complex64)})


def test_a_checkpoint_written_with_it_loads_through_the_checked_reader(tmp_path):
    rng = np.random.default_rng(1)
    weights = {"w": np.asfortranarray(rng.standard_normal((5, 3), dtype=np.float32)),
               "b": rng.standard_normal(5).astype(np.float64)}  # saved as float32
    state = {"exp_avg.w": weights["w"] * 2, "rng.torch": np.arange(9, dtype=np.uint8)}
    files = checkpoint.checkpoint_files(weights, {}, "{}", state, {"step": 3})
    (tmp_path / checkpoint.MODEL_FILE).write_bytes(b"".join(files[checkpoint.MODEL_FILE]))
    check_weights_file(tmp_path / checkpoint.MODEL_FILE)
    back = checkpoint.load_weights(tmp_path)
    np.testing.assert_array_equal(back["w"], weights["w"])
    np.testing.assert_array_equal(back["b"], weights["b"].astype(np.float32))
    trainer = safetensors.numpy.load(b"".join(files[checkpoint.TRAINER_FILE]))
    np.testing.assert_array_equal(trainer["exp_avg.w"], weights["w"] * 2)
    assert trainer["rng.torch"].dtype == np.uint8
    assert trainer["rng.torch"].tolist() == list(range(9))
