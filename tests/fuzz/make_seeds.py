#!/usr/bin/env python3
"""Writes the hand-made seeds of tests/fuzz/corpus/ (edge cases of the
safetensors reader and of checkpoint meta.json).  The real_* seeds come from
a zdp run (see README.md); the meta seeds here are edits of
corpus/meta/real_mlp_np2_stage2.json, so they keep the fixture files' sizes
and checksums, and each carries meta.json's own checksum (meta_fnv1a64)
recomputed for its edited bytes, so they reach past the checksum checks
(except the seeds about that checksum).
usage: python3 tests/fuzz/make_seeds.py   (from the repository root)"""
import json, os, struct

HERE = os.path.dirname(os.path.abspath(__file__))
ST = os.path.join(HERE, "corpus", "safetensors")
META = os.path.join(HERE, "corpus", "meta")


def st_file(header, data=b"", raw_len=None):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(h) if raw_len is None else raw_len
    return struct.pack("<Q", n) + h + data


def put(d, name, content):
    with open(os.path.join(d, name), "wb") as f:
        f.write(content if isinstance(content, bytes) else content.encode())


# ---- safetensors ----------------------------------------------------------
f32 = lambda *v: struct.pack("<%df" % len(v), *v)
seeds = {
    "empty": b"",
    "short_len": b"\x05\x00\x00",
    "len_only": struct.pack("<Q", 0),
    "len_huge": struct.pack("<Q", 2**63) + b"{}",
    "len_past_end": struct.pack("<Q", 100) + b"{}",
    "empty_header": st_file({}),
    "metadata_only": st_file({"__metadata__": {"format": "pt"}}),
    "metadata_not_strings": st_file({"__metadata__": {"a": 1}}),
    "one_f32": st_file({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, f32(1, 2)),
    "scalar_0d": st_file({"s": {"dtype": "F64", "shape": [], "data_offsets": [0, 8]}}, b"\0" * 8),
    "empty_tensor": st_file({"e": {"dtype": "I32", "shape": [0, 3], "data_offsets": [0, 0]}}),
    "all_dtypes": st_file({
        "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
        "b": {"dtype": "F64", "shape": [1], "data_offsets": [4, 12]},
        "c": {"dtype": "I64", "shape": [1], "data_offsets": [12, 20]},
        "d": {"dtype": "I32", "shape": [1], "data_offsets": [20, 24]},
        "e": {"dtype": "U16", "shape": [1], "data_offsets": [24, 26]},
        "f": {"dtype": "BF16", "shape": [1], "data_offsets": [26, 28]},
        "g": {"dtype": "F16", "shape": [1], "data_offsets": [28, 30]},
        "h": {"dtype": "U8", "shape": [1, 1, 1, 1], "data_offsets": [30, 31]},
    }, b"\x01" * 31),
    "bad_dtype": st_file({"w": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}}, f32(1)),
    "five_dims": st_file({"w": {"dtype": "U8", "shape": [1, 1, 1, 1, 1], "data_offsets": [0, 1]}}, b"x"),
    "negative_dim": st_file({"w": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}}, b"x"),
    "shape_overflow": st_file({"w": {"dtype": "F64", "shape": [2**62, 2**62], "data_offsets": [0, 8]}}, b"\0" * 8),
    "overlap": st_file({
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12),
    "gap": st_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8),
    "trailing": st_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 9),
    "offsets_reversed": st_file({"a": {"dtype": "U8", "shape": [0], "data_offsets": [3, 0]}}, b"\0" * 3),
    "offsets_float": st_file({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0.0, 1.0]}}, b"\0"),
    "size_mismatch": st_file({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8),
    "duplicate_names": st_file(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                               b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\0\0"),
    "header_not_object": st_file(b"[1, 2, 3]"),
    "header_bad_json": st_file(b'{"a": {'),
    "header_nul": st_file(b'{"a\\u0000b": {"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0"),
    "header_padded": st_file(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}   ', b"\7"),
    "empty_name": st_file({"": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\1"),
    "missing_field": st_file({"a": {"dtype": "U8", "shape": [1]}}, b"\1"),
}
for name, content in seeds.items():
    put(ST, "edge_" + name + ".safetensors", content)

# ---- checkpoint meta.json ---------------------------------------------------
real = json.load(open(os.path.join(META, "real_mlp_np2_stage2.json")))


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for c in data:
        h = ((h ^ c) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def meta_sum_digits(b):
    """Offset of the 16 hex digits of the last "meta_fnv1a64": "...", or None
    (the rule of src/engine/checkpoint_format.c and docs/checkpoints.md)."""
    key = b'"meta_fnv1a64"'
    i = b.rfind(key)
    if i < 0:
        return None
    j = i + len(key)
    while j < len(b) and b[j] in b" \t\r\n":
        j += 1
    if j >= len(b) or b[j] != ord(":"):
        return None
    j += 1
    while j < len(b) and b[j] in b" \t\r\n":
        j += 1
    if j + 18 > len(b) or b[j] != ord('"') or b[j + 17] != ord('"'):
        return None
    return j + 1


def with_sum(b):
    """b with its meta_fnv1a64 set to what zdp computes: FNV-1a 64 of the bytes
    with the 16 digits read as '0's."""
    k = meta_sum_digits(b)
    if k is None:
        return b
    z = b[:k] + b"0" * 16 + b[k + 16:]
    return z[:k] + b"%016x" % fnv1a64(z) + z[k + 16:]


def edit(name, fn, fix_sum=True):
    m = json.loads(json.dumps(real))
    out = fn(m)
    out = out if isinstance(out, (str, bytes)) else json.dumps(m, separators=(",", ":"))
    out = out.encode() if isinstance(out, str) else out
    put(META, "edge_" + name + ".json", with_sum(out) if fix_sum else out)


def setp(path, value):
    def fn(m):
        d = m
        for k in path[:-1]:
            d = d[k]
        if value is KeyError:
            del d[path[-1]]
        else:
            d[path[-1]] = value
    return fn


edit("version_99", setp(["format_version"], 99))
edit("version_string", setp(["format_version"], "1"))
edit("format_other", setp(["format"], "other"))
edit("no_format", setp(["format"], KeyError))
edit("world_1", setp(["world_size"], 1))
edit("world_3", setp(["world_size"], 3))
edit("world_0", setp(["world_size"], 0))
edit("world_int_overflow", setp(["world_size"], 2**32 + 1))
edit("world_huge", setp(["world_size"], 2**31 - 1))
edit("stage_neg", setp(["zero_stage"], -7))
edit("numel_0", setp(["layout", "numel"], 0))
edit("layout_not_object", setp(["layout"], [1, 2]))
edit("no_counters", setp(["counters"], KeyError))
edit("counter_real", setp(["counters", "global_steps"], 1.5))
edit("pending", setp(["counters", "pending_backwards"], 1))
edit("last_lr_string", setp(["counters", "last_lr"], "x"))
edit("no_config", setp(["config"], KeyError))
edit("optimizer_not_string", setp(["config", "optimizer"], 5))
edit("no_zdp_version", setp(["zdp_version"], KeyError))
edit("zdp_version_number", setp(["zdp_version"], 1))
edit("tensors_not_array", setp(["tensors"], {}))
edit("files_array", setp(["files"], []))
edit("files_empty", setp(["files"], {}))
edit("file_slash", setp(["files", "../model.safetensors"], {"bytes": 1, "fnv1a64": "00"}))
edit("file_dotdot", setp(["files", ".."], {"bytes": 1, "fnv1a64": "00"}))
edit("file_self", setp(["files", "meta.json"], {"bytes": 1, "fnv1a64": "00"}))
edit("file_missing", setp(["files", "nothere.safetensors"], {"bytes": 1, "fnv1a64": "00"}))
edit("file_bytes_string", setp(["files", "model.safetensors", "bytes"], "1304"))
edit("file_hash_number", setp(["files", "model.safetensors", "fnv1a64"], 7))
edit("file_hash_wrong", setp(["files", "optim_rank1.safetensors", "fnv1a64"], "0123456789abcdef"))
edit("file_bytes_wrong", setp(["files", "model.safetensors", "bytes"], 1303))
edit("file_entry_null", setp(["files", "model.safetensors"], None))
edit("client_nested", setp(["client"], {"a": [1, {"b": [None, True, 1.5e300]}], "s": "\u00e9\u2603"}))
edit("client_not_object", setp(["client"], [1]))
edit("no_client", setp(["client"], KeyError))
edit("top_array", lambda m: "[1, 2]")
edit("top_null", lambda m: "null")
edit("duplicate_key", lambda m: json.dumps(m)[:-1] + ', "world_size": 2}')
edit("truncated", lambda m: json.dumps(m)[:700])
edit("nul_byte", lambda m: json.dumps(m).replace('"zdp-checkpoint"', '"zdp-\\u0000checkpoint"'))
edit("empty", lambda m: "")
# Long strings: zdp_checkpoint_inspect formats them into its description
# (a zdp_version or optimizer of ~8 KB overflows its 8 KB buffer: found by
# reading the code, confirmed under ASan; 150 s of fuzzing from the real seed
# alone did not grow a string that long).
edit("long_zdp_version", setp(["zdp_version"], "v" * 8000))
edit("long_optimizer", setp(["config", "optimizer"], "o" * 8000))
edit("long_client", setp(["client"], {"k": "c" * 2000}))
# meta.json's own checksum, and the model's shape.
edit("meta_sum_wrong", setp(["meta_fnv1a64"], "0123456789abcdef"), fix_sum=False)
edit("meta_sum_missing", setp(["meta_fnv1a64"], KeyError))
edit("meta_sum_number", setp(["meta_fnv1a64"], 7))
edit("meta_sum_short", setp(["meta_fnv1a64"], "0123"))
edit("meta_sum_upper", lambda m: with_sum(json.dumps(m).encode()).replace(b'"meta_fnv1a64": "', b'"meta_fnv1a64": "X'), fix_sum=False)
edit("counter_flipped", lambda m: json.dumps(m).replace('"global_steps": 3', '"global_steps": 4'),
     fix_sum=False)
edit("client_sum_key", setp(["client", "meta_fnv1a64"], "0000000000000000"))
edit("format_1_no_sum", lambda m: (m.__setitem__("format_version", 1), m.pop("meta_fnv1a64"))[0])
edit("format_1_with_sum", setp(["format_version"], 1))
edit("model_not_object", setp(["model"], [1]))
edit("model_other_shape", setp(["model", "hidden"], 6))
edit("model_nested", setp(["model"], {"model": {"a": [1, None]}, "n_head": 1.5, "x": "y" * 300}))

# ---- zdp serve's protobuf ForwardBackwardRequest (SDK 0.25) -----------------
# Requests as tests/serve/tinker_sdk.py encodes them (what the SDK's
# request_conv writes), and hand-made edges: each malformed case of
# tests/serve/tinker_check.py, unknown fields newer SDKs add, unpacked
# repeated fields, every DType, image/dmel chunks, sparse tensors.
import sys  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "serve"))
import tinker_sdk as T  # noqa: E402

PB = os.path.join(HERE, "corpus", "serve_proto")
os.makedirs(PB, exist_ok=True)
L, K, V = T._pb_len, T._pb_key, T._pb_uvarint
d1 = T.datum([1, 2, 3], [2, 3, 4], [0.0, 1.0, 1.0])
d2 = T.datum([5, 6], [6, 7], logprobs=[-1.0, -2.5], advantages=[0.5, -0.5])
image = T.datum([1], [2, 3])
image["model_input"]["chunks"].append({"type": "image", "data": "iVBORw0KGgo=", "format": "png",
                                       "expected_tokens": 1})
sparse = T.datum([1, 2, 3], [2, 3, 4])
sparse["loss_fn_inputs"]["weights"] = {"data": [1.0], "dtype": "float32", "shape": [1, 3],
                                       "sparse_crow_indices": [0, 1], "sparse_col_indices": [2]}
enc = T.encode_forward_backward_request_proto


def tensor_pb(dense, dtype, shape=None, packed=True):
    out = L(1, dense) + K(3, 0) + V(dtype)
    if shape:
        out += L(4, T._pb_packed(shape)) if packed else b"".join(K(4, 0) + V(s) for s in shape)
    return out


def datum_pb(tokens_bytes, inputs):
    out = L(1, L(1, L(1, tokens_bytes)))
    for name, t in inputs:
        out += L(2, L(1, name) + L(2, t))
    return out


tok3 = T._pb_le("i", [1, 2, 3])
pb_seeds = {
    "sdk_cross_entropy": enc("s1:train:0", 1, [d1, d1], "cross_entropy"),
    "sdk_ppo_config": enc("s1:train:0", 2, [d2], "ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
    "sdk_forward_only": enc("s1:train:0", 3, [d1], "cross_entropy", forward_only=True),
    "sdk_image_chunk": enc("m", 4, [image], "cross_entropy"),
    "sdk_sparse": enc("m", 5, [sparse], "cross_entropy"),
    "empty": b"",
    "negative_seq": L(1, b"m") + K(2, 0) + V(-5),
    "unknown_fields": enc("m", 6, [d1], "cross_entropy") + L(7, L(1, b"beta") + L(2, K(1, 1) + b"\0" * 8))
    + K(99, 5) + b"\1\2\3\4" + K(1000, 1) + b"\0" * 8,
    "datum_spans": L(1, b"m") + K(2, 0) + V(1) + L(3, datum_pb(tok3, [(b"target_tokens", tensor_pb(
        T._pb_le("q", [2, 3, 4]), 2, [3]))]) + L(3, L(1, L(3, b"s") + K(2, 0) + V(3)))),
    "unpacked_shape": L(3, datum_pb(tok3, [(b"target_tokens", tensor_pb(T._pb_le("q", [2, 3, 4]), 2, [3],
                                                                        packed=False))])),
    "dtypes": L(3, datum_pb(tok3, [(b"a", tensor_pb(T._pb_le("i", [1, 2, 3]), 3)),
                                   (b"b", tensor_pb(b"\x80\x3f" * 3, 4)),
                                   (b"c", tensor_pb(b"\0" * 12, 0)),
                                   (b"d", tensor_pb(b"\0" * 12, 9)),
                                   (b"e", tensor_pb(T._pb_le("f", [float("nan"), float("inf"), 1.0]), 1))])),
    "dmel_and_empty_chunk": L(3, L(1, L(3, L(1, b"\0\1"))) + L(1, b"")),
    "map_entry_value_first": L(3, L(1, L(1, L(1, tok3))) + L(2, L(2, tensor_pb(T._pb_le("q", [1, 2, 3]), 2))
                                                             + L(1, b"target_tokens"))),
    "config_nan": L(5, L(1, b"beta") + K(2, 1) + struct.pack("<d", float("nan"))),
    # SDK 0.26+: loss_fn_config_v2 (7) {key -> LossConfigValue {1 number | 2 text}} beside field 5,
    # an entry with no arm, and provenance spans (Datum 3, 4).
    "sdk_config_v2": enc("m", 7, [d2], "ppo", {"clip_low_threshold": 0.7})
    + L(7, L(1, b"clip_low_threshold") + L(2, K(1, 1) + struct.pack("<d", 0.9)))
    + L(7, L(1, b"clip_high_threshold") + L(2, L(2, b"k3"))) + L(7, L(1, b"beta") + L(2, b"")),
    "sdk_provenance_spans": L(1, b"m") + K(2, 0) + V(8) + L(3, datum_pb(tok3, [(b"target_tokens", tensor_pb(
        T._pb_le("q", [2, 3, 4]), 2, [3]))]) + L(3, L(1, L(1, b"s1:sample:0:0") + K(3, 0) + V(3)))
        + L(4, L(1, L(1, b"s1:sample:0:0") + K(2, 0) + V(1) + K(3, 0) + V(1)))
        + L(4, L(2, L(1, b"s1:sample:0:0") + K(3, 0) + V(2)))) + L(4, b"cross_entropy"),
    "truncated_varint": b"\x0a\x01m\x10\xff\xff",
    "length_past_end": enc("m", 1, [d1], "cross_entropy") + b"\x1a\x40\x0a\x02",
    "wrong_wire_type": b"\x0d\x01\x02\x03\x04",
    "varint_too_long": b"\x10" + b"\xff" * 10 + b"\x01",
    "group": b"\x1b",
    "field_zero": b"\x02\x00",
    "tokens_odd": L(3, L(1, L(1, L(1, b"\1\0\0\0\2\0")))),
    "dense_odd": L(3, L(2, L(1, b"target_tokens") + L(2, tensor_pb(b"\0" * 7, 2)))),
    "bad_utf8": L(1, b"\xc3\x28") + L(4, b"cross_entropy"),
    "nul_in_key": L(5, L(1, b"a\0b") + K(2, 1) + b"\0" * 8),
    "shape_too_long": L(3, L(2, L(1, b"x") + L(2, L(4, b"\1" * 65)))),
}
for name, content in pb_seeds.items():
    put(PB, name + ".pb", content)
