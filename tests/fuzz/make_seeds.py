#!/usr/bin/env python3
"""Writes the hand-made seeds of tests/fuzz/corpus/ (edge cases of the
safetensors reader and of checkpoint meta.json).  The real_* seeds come from
a zdp run (see README.md); the meta seeds here are edits of
corpus/meta/real_mlp_np2_stage2.json, so they keep the fixture files' sizes
and checksums and reach past the checksum checks.
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


def edit(name, fn):
    m = json.loads(json.dumps(real))
    out = fn(m)
    put(META, "edge_" + name + ".json",
        out if isinstance(out, (str, bytes)) else json.dumps(m, separators=(",", ":")))


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
