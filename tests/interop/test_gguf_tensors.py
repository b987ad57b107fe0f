"""GGUF tensors read as float32: every type sheepop reads, decoded by the reader and compared with
a reference written here from ggml's block layouts (ggml-quants.c, dequantize_row_*), on blocks
of random bytes; the types `gguf` can quantize also round-trip a known matrix within their step;
any other type, a truncated file and a file that is not GGUF are one-line refusals."""

import re

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from sheepop.errors import UserError
from sheepop.interop.gguf_tensors import SUPPORTED_TYPE_NAMES, is_gguf, read_gguf

Q = GGMLQuantizationType
ROWS, COLS = 3, 512  # two 256-weight super-blocks a row, sixteen 32-weight blocks


def f16(a: np.ndarray) -> np.ndarray:
    return a.view(np.float16).astype(np.float32)


def scale_min_k4(j: int, s: np.ndarray) -> tuple[int, int]:
    """The 6-bit scale and minimum of sub-block j of a Q4_K / Q5_K block (get_scale_min_k4)."""
    if j < 4:
        return int(s[j] & 63), int(s[j + 4] & 63)
    return (int((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4)),
            int((s[j + 4] >> 4) | ((s[j] >> 6) << 4)))


def ref_block(qtype: Q, b: np.ndarray) -> list[float]:
    """One block of bytes -> its weights, written out from ggml's dequantize_row_* loops."""
    if qtype == Q.Q8_0:
        return list(f16(b[:2])[0] * b[2:].view(np.int8))
    if qtype in (Q.Q4_0, Q.Q4_1):
        d, off = f16(b[:2])[0], 4 if qtype == Q.Q4_1 else 2
        qs = b[off:]
        q = [int(x & 0xF) for x in qs] + [int(x >> 4) for x in qs]
        return [d * x + f16(b[2:4])[0] if qtype == Q.Q4_1 else d * (x - 8) for x in q]
    if qtype in (Q.Q5_0, Q.Q5_1):
        d, off = f16(b[:2])[0], 4 if qtype == Q.Q5_1 else 2
        qh = int(b[off:off + 4].view(np.uint32)[0])
        qs = b[off + 4:]
        q = [int(qs[j] & 0xF) | (((qh >> j) & 1) << 4) for j in range(16)] + \
            [int(qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4) for j in range(16)]
        return [d * x + f16(b[2:4])[0] if qtype == Q.Q5_1 else d * (x - 16) for x in q]
    if qtype in (Q.Q4_K, Q.Q5_K):
        d, dmin, scales = f16(b[:2])[0], f16(b[2:4])[0], b[4:16]
        qh, ql = (b[16:48], b[48:]) if qtype == Q.Q5_K else (None, b[16:])
        out, u1, u2 = [], 1, 2
        for j in range(4):
            (s1, m1), (s2, m2) = scale_min_k4(2 * j, scales), scale_min_k4(2 * j + 1, scales)
            q = ql[32 * j:32 * j + 32]
            hi1 = [16 if qh is not None and qh[l] & u1 else 0 for l in range(32)]
            hi2 = [16 if qh is not None and qh[l] & u2 else 0 for l in range(32)]
            out += [d * s1 * (int(q[l] & 0xF) + hi1[l]) - dmin * m1 for l in range(32)]
            out += [d * s2 * (int(q[l] >> 4) + hi2[l]) - dmin * m2 for l in range(32)]
            u1, u2 = u1 << 2, u2 << 2
        return out
    if qtype == Q.Q6_K:
        ql, qh, sc, d = b[:128], b[128:192], b[192:208].view(np.int8), f16(b[208:210])[0]
        out = [0.0] * 256
        for n in range(2):
            lo, hi, s, y = ql[64 * n:], qh[32 * n:], sc[8 * n:], 128 * n
            for l in range(32):
                i = l // 16
                q1 = (int(lo[l] & 0xF) | (((int(hi[l]) >> 0) & 3) << 4)) - 32
                q2 = (int(lo[l + 32] & 0xF) | (((int(hi[l]) >> 2) & 3) << 4)) - 32
                q3 = (int(lo[l] >> 4) | (((int(hi[l]) >> 4) & 3) << 4)) - 32
                q4 = (int(lo[l + 32] >> 4) | (((int(hi[l]) >> 6) & 3) << 4)) - 32
                out[y + l], out[y + l + 32] = d * s[i] * q1, d * s[i + 2] * q2
                out[y + l + 64], out[y + l + 96] = d * s[i + 4] * q3, d * s[i + 6] * q4
        return out
    if qtype == Q.BF16:
        return list((b.view(np.uint16).astype(np.uint32) << 16).view(np.float32))
    if qtype == Q.F16:
        return list(f16(b))
    return list(b.view(np.float32))


def random_blocks(qtype: Q, n_blocks: int, rng) -> np.ndarray:
    """Random block bytes whose float16 scale fields hold ordinary numbers (not NaN/inf)."""
    block, size = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    scale = lambda: rng.uniform(0.01, 0.1, n_blocks).astype(np.float16).view(np.uint8)  # noqa: E731
    fields = {Q.Q8_0: [0], Q.Q4_0: [0], Q.Q5_0: [0], Q.Q4_1: [0, 2], Q.Q5_1: [0, 2],
              Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}
    for at in fields.get(qtype, []):
        data[:, at:at + 2] = scale().reshape(n_blocks, 2)
    if qtype in (Q.F16, Q.BF16, Q.F32):  # whole values: random finite numbers
        values = rng.standard_normal(n_blocks * block).astype(np.float32)
        kind = {Q.F16: np.float16, Q.F32: np.float32}.get(qtype)
        data = (values.astype(kind).view(np.uint8) if kind else
                (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8))
        data = data.reshape(n_blocks, size)
    return data


def write(path, tensors: dict) -> None:
    """A GGUF file of the given tensors: name -> (raw bytes or float array, GGML type)."""
    w = GGUFWriter(path, "llama")
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("name", SUPPORTED_TYPE_NAMES)
def test_each_type_decodes_as_ggml_defines_it(tmp_path, name):
    qtype = Q[name]
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = random_blocks(qtype, ROWS * COLS // block, np.random.default_rng(len(name)))
    raw = blocks.reshape(ROWS, COLS // block * size)
    write(tmp_path / "t.gguf", {"m": (raw, qtype)})
    got = read_gguf(tmp_path / "t.gguf").array("m")
    assert got.shape == (ROWS, COLS) and got.dtype == np.float32
    expected = np.array([ref_block(qtype, b) for b in blocks], dtype=np.float32)
    np.testing.assert_allclose(got, expected.reshape(ROWS, COLS), rtol=1e-6, atol=1e-7)
    assert np.abs(expected).max() > 0.05  # blocks that hold real numbers


@pytest.mark.parametrize("name, step", [("F32", 0.0), ("F16", 1e-3), ("BF16", 8e-3),
                                        ("Q8_0", 1 / 127), ("Q4_0", 1 / 7), ("Q4_1", 1 / 15),
                                        ("Q5_0", 1 / 15), ("Q5_1", 1 / 31)])
def test_a_quantized_matrix_comes_back_within_its_step(tmp_path, name, step):
    """A (rows, cols) float matrix, quantized by `gguf`, is read back in its own shape and
    order (GGUF's dims are reversed on disk) within the type's rounding: half a step of the
    block's range."""
    qtype = Q[name]
    w = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    data = quantize(w, qtype)
    write(tmp_path / "t.gguf", {"w": (data, qtype), "v": (w[0], Q.F32)})
    gguf = read_gguf(tmp_path / "t.gguf")
    assert gguf.shape("w") == (5, 64) and gguf.shape("v") == (64,)
    got = gguf.array("w")
    block_range = np.abs(w).reshape(5, 2, 32).max(axis=2, keepdims=True) * 2
    bound = np.broadcast_to(block_range * step, (5, 2, 32)).reshape(5, 64) + 1e-6
    assert (np.abs(got - w) <= bound).all()
    np.testing.assert_array_equal(gguf.array("v"), w[0])


def test_other_types_are_refused_by_name(tmp_path):
    raw = np.zeros((2, GGML_QUANT_SIZES[Q.Q2_K][1]), dtype=np.uint8)
    write(tmp_path / "t.gguf", {"blk.0.attn_q.weight": (raw, Q.Q2_K)})
    gguf = read_gguf(tmp_path / "t.gguf")
    for read in (gguf.check_types, lambda: gguf.array("blk.0.attn_q.weight")):
        with pytest.raises(UserError, match=r"tensor blk.0.attn_q.weight has type Q2_K, which "
                                            r"sheepop does not read \(it reads F32, F16, BF16"):
            read()


def test_files_that_are_not_readable_gguf(tmp_path):
    write(tmp_path / "good.gguf", {"w": (np.ones((4, 32), np.float32), Q.F32)})
    data = (tmp_path / "good.gguf").read_bytes()
    assert is_gguf(tmp_path / "good.gguf")
    (tmp_path / "cut.gguf").write_bytes(data[:-100])
    with pytest.raises(UserError, match="cut.gguf: not a readable GGUF file .truncated or "
                                        "corrupt"):
        read_gguf(tmp_path / "cut.gguf")
    (tmp_path / "text.gguf").write_text("hello, this is not a model\n")
    assert not is_gguf(tmp_path / "text.gguf")
    with pytest.raises(UserError, match=r"text.gguf is not a GGUF file \(it does not start "
                                        r"with b'GGUF'\)"):
        read_gguf(tmp_path / "text.gguf")
    with pytest.raises(UserError, match="GGUF file not found"):
        read_gguf(tmp_path / "absent.gguf")


def test_the_layout_reader_gives_the_metadata_of_ggufs_own_reader(tmp_path):
    """sheepop.interop.gguf_layout reads every metadata value type (numbers of each width,
    bool, string, arrays of numbers and of strings) as `gguf.GGUFReader` does, and the tensors'
    names, shapes and bytes at the same offsets, with a custom alignment."""
    from gguf import GGUFReader

    w = GGUFWriter(tmp_path / "m.gguf", "llama")
    w.add_custom_alignment(64)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60_000)
    w.add_int16("t.i16", -30_000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "Ġhello ▁wörld\n")
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, 1.5])
    w.add_array("t.strs", ["a", "", "Ċ b", "<|im_end|>"])
    m = np.arange(6 * 32, dtype=np.float32).reshape(6, 32)
    w.add_tensor("m", m, raw_dtype=Q.F32)
    w.add_tensor("q", quantize(m, Q.Q8_0), raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = read_gguf(tmp_path / "m.gguf")
    reader = GGUFReader(tmp_path / "m.gguf")
    theirs = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert ours.meta == theirs and ours.meta["t.u64"] == 2**63 + 5
    assert ours.meta["t.strs"] == ["a", "", "Ċ b", "<|im_end|>"]
    for t in reader.tensors:
        assert ours.shape(t.name) == tuple(reversed(t.shape.tolist()))
    np.testing.assert_array_equal(ours.array("m"), m)
    from gguf.quants import dequantize
    np.testing.assert_array_equal(ours.array("q"), dequantize(quantize(m, Q.Q8_0), Q.Q8_0))


def test_arrays_nested_without_end_are_a_one_line_refusal(tmp_path):
    """A hostile file whose metadata value is an array of arrays of arrays ... (100,000 deep)
    is refused as corrupt, not a RecursionError."""
    import struct
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k"
    nested = struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 100_000
    (tmp_path / "deep.gguf").write_bytes(head + nested)
    with pytest.raises(UserError, match="deep.gguf: not a readable GGUF file .truncated or "
                                        "corrupt: arrays nested more than 8 deep"):
        read_gguf(tmp_path / "deep.gguf")


def raw_gguf(path, tensors, alignment=None, data=b""):
    """A GGUF file written byte by byte, so that its offsets and alignment can be anything:
    `tensors` are (name, rows, row length, offset) float32 descriptions; `alignment` is a
    (value type, packed value) pair for general.alignment or None; `data` follows the padding."""
    import struct

    def string(s):
        return struct.pack("<Q", len(s)) + s.encode()
    meta = b"" if alignment is None else string("general.alignment") + struct.pack(
        "<I", alignment[0]) + alignment[1]
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 0 if alignment is None else 1) + meta
    for name, rows, row, offset in tensors:
        head += string(name) + struct.pack("<IQQIQ", 2, row, rows, int(Q.F32), offset)
    step = 32 if alignment is None or alignment[0] != 4 else struct.unpack("<I", alignment[1])[0]
    path.write_bytes(head + b"\0" * (-len(head) % max(step, 1)) + data)


def test_the_raw_writer_writes_what_ggufs_own_reader_reads(tmp_path):
    """The control for the hostile files below: the same writer with honest offsets (two
    tensors, alignment 64) gives a file that both readers read to the same values."""
    import struct

    from gguf import GGUFReader
    a, b = np.arange(64, dtype=np.float32).reshape(2, 32), -np.ones((1, 32), np.float32)
    raw_gguf(tmp_path / "ok.gguf", [("a", 2, 32, 0), ("b", 1, 32, 256)],
             (4, struct.pack("<I", 64)), a.tobytes() + b.tobytes())
    gguf = read_gguf(tmp_path / "ok.gguf")
    np.testing.assert_array_equal(gguf.array("a"), a)
    np.testing.assert_array_equal(gguf.array("b"), b)
    theirs = {t.name: t.data for t in GGUFReader(tmp_path / "ok.gguf").tensors}
    np.testing.assert_array_equal(theirs["b"], b)


@pytest.mark.parametrize("tensors, alignment, message", [
    ([("a", 2, 32, 0), ("b", 2, 32, 128)], (4, b"\3\0\0\0"),
     r"general.alignment is 3, not a power of two"),
    ([("a", 2, 32, 0)], (4, b"\0\0\0\0"), r"general.alignment is 0, not a power of two"),
    ([("a", 2, 32, 0)], (8, b"\2\0\0\0\0\0\0\0" + b"32"),
     r"general.alignment is not a uint32 \('32'\)"),
    ([("a", 2, 32, 0), ("b", 2, 32, 64)], None,
     r"tensor b's data \(from offset 64\) overlaps tensor a's \(which ends at 256\)"),
    ([("a", 2, 32, 0), ("b", 1, 32, 0)], None, r"tensor a's data \(from offset 0\) overlaps "
                                              r"tensor b's \(which ends at 128\)"),
    ([("a", 2, 32, 8)], None, r"tensor a's data offset 8 is not a multiple of "
                              r"general.alignment \(32\)"),
    ([("a", 2, 32, 0), ("b", 2, 32, 264)], (4, b"\x10\0\0\0"),
     r"tensor b's data offset 264 is not a multiple of general.alignment \(16\)"),
])
def test_hostile_offsets_and_alignments_are_refused_by_name(tmp_path, capsys, tensors,
                                                            alignment, message):
    """Overlapping or misaligned tensor data, or a general.alignment that is not a uint32
    power of two (llama.cpp's reader refuses each), is refused in one line, exit 2, before any
    tensor is read: they imported without a word (issue 41)."""
    from sheepop.cli import main
    raw_gguf(tmp_path / "bad.gguf", tensors, alignment, np.ones(1024, np.float32).tobytes())
    with pytest.raises(UserError, match="bad.gguf: not a readable GGUF file .truncated or "
                                        "corrupt: " + message):
        read_gguf(tmp_path / "bad.gguf")
    assert main(["import", str(tmp_path / "bad.gguf"), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sheepop: error: ") and err.count("\n") == 1
    assert re.search(message, err)
    assert not (tmp_path / "run").exists()
