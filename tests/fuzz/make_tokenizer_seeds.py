#!/usr/bin/env python3
"""Writes the seeds of tests/fuzz/corpus/tokenizer/: small tokenizer.json
files of the shapes the real ones have (Qwen3's Split + ByteLevel with NFC,
Llama 3's ignore_merges and "a b" merges, GPT-2's ByteLevel regex, added
tokens with lstrip/rstrip), and malformed ones (each refusal of
src/tokenizer/load.c).
usage: python3 tests/fuzz/make_tokenizer_seeds.py   (from the repository root)"""
import copy, json, os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "tokenizer")


def byte_chars():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BC = byte_chars()
bl = lambda s: "".join(BC[b] for b in s.encode())
MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), (" ", "w"), (" w", "o"), ("a", "b"),
          ("你", "好"), ("1", "2"), ("<", "|")]
vocab = {BC[b]: b for b in range(256)}
for a, b in MERGES:
    vocab.setdefault(bl(a), len(vocab))
    vocab.setdefault(bl(b), len(vocab))
    vocab.setdefault(bl(a + b), len(vocab))
QWEN_RX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
           "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
base = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": 1000, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True},
                     {"id": 1001, "content": "<think>", "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": False}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN_RX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
    "post_processor": None,
    "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
              "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
              "vocab": vocab, "merges": [[bl(a), bl(b)] for a, b in MERGES]},
}


def variant(fn):
    d = copy.deepcopy(base)
    fn(d)
    return d


def llama(d):
    d["normalizer"] = None
    d["model"]["ignore_merges"] = True
    d["model"]["merges"] = [bl(a) + " " + bl(b) for a, b in MERGES]
    d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN_RX.replace("\\p{N}|", "\\p{N}{1,3}|")


def gpt2(d):
    d["normalizer"] = None
    d["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}


def strips(d):
    d["added_tokens"].append({"id": 1002, "content": "[MASK]", "lstrip": True, "rstrip": True, "special": True})
    d["pre_tokenizer"]["pretokenizers"].insert(0, {"type": "Split", "pattern": {"String": "\n"},
                                                   "behavior": "Removed", "invert": False})
    d["pre_tokenizer"]["pretokenizers"][-1]["add_prefix_space"] = True


def setter(path, value):
    def fn(d):
        o = d
        for k in path[:-1]:
            o = o[k]
        o[path[-1]] = value
    return fn


seeds = {
    "qwen3_like.json": base,
    "llama3_like.json": variant(llama),
    "gpt2_like.json": variant(gpt2),
    "strips_prefix_removed.json": variant(strips),
    "bad_model_type.json": variant(setter(["model", "type"], "Unigram")),
    "bad_merge_unknown.json": variant(setter(["model", "merges"], [["q", "zz"]])),
    "bad_merge_string.json": variant(setter(["model", "merges"], ["nospace"])),
    "bad_vocab_id.json": variant(setter(["model", "vocab", "Ā"], -3)),
    "bad_regex.json": variant(lambda d: d["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex="(?<")),
    "bad_behavior.json": variant(lambda d: d["pre_tokenizer"]["pretokenizers"][0].update(behavior="Contiguous")),
    "bad_normalizer.json": variant(setter(["normalizer"], {"type": "NFKC"})),
    "bad_decoder.json": variant(setter(["decoder"], {"type": "Metaspace"})),
    "bad_added.json": variant(setter(["added_tokens"], [{"id": 5, "content": ""}])),
    "no_bytelevel.json": variant(lambda d: d["pre_tokenizer"]["pretokenizers"].pop()),
}
os.makedirs(OUT, exist_ok=True)
for name, d in seeds.items():
    with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False)
with open(os.path.join(OUT, "truncated.json"), "w", encoding="utf-8") as f:
    f.write(json.dumps(base, ensure_ascii=False)[:700])
