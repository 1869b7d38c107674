#!/usr/bin/env bash
# zdp's tokenizers against the reference (transformers.js's tokenizers, run by
# Node.js) on the real Qwen3, Llama 3 and GPT-2 tokenizer files: a
# deterministic corpus of 1.1 MB of mixed text (English prose, code, numbers,
# whitespace runs, CJK, emoji, accented letters, invalid UTF-8, special tokens
# whole and broken) encoded by `zdp tokenize --special` must give exactly the
# reference's ids, and `zdp tokenize --decode` must give the corpus back byte
# for byte (in NFC for Qwen3, whose normalizer is NFC).  On a mismatch the
# first differing token is printed with the text around it.
#
# The tokenizer files, the reference and the corpus's prose live in the
# shared folder beside the repository (ZDP_SHARED overrides where); without
# it, or without node, the test says why and exits 77 (CTest: skipped).
#
# usage: test_tokenizer_reference.sh ZDP_CLI [MPIEXEC]
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ZDP=$1
SHARED=${ZDP_SHARED:-$(cd "$HERE/../../.." && pwd)/shared}
LIB=$SHARED/vendor/lenml-tokenizers/main.js
TOK=$SHARED/data/tokenizers

if ! command -v node >/dev/null 2>&1; then
    echo "test_tokenizer_reference: SKIPPED: node (Node.js) is not installed; the reference runs on it"
    exit 77
fi
for f in "$LIB" "$TOK/qwen3/tokenizer.json" "$TOK/llama3/tokenizer.json" "$TOK/gpt2/vocab.bpe" \
         "$SHARED/data/tinyshakespeare.txt"; do
    if [ ! -f "$f" ]; then
        echo "test_tokenizer_reference: SKIPPED: $f is missing (the shared folder beside the" \
             "repository holds the real tokenizers and the reference; set ZDP_SHARED to it)"
        exit 77
    fi
done

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
node "$HERE/tokenizer_reference.js" corpus "$WORK/corpus.txt" 1.1 "$SHARED/data/tinyshakespeare.txt" || exit 1
bytes=$(stat -c %s "$WORK/corpus.txt")
if [ "$bytes" -lt 1048576 ]; then
    echo "FAIL: the corpus has $bytes bytes, fewer than 1 MB"
    exit 1
fi

fail=0
for name in qwen3 llama3 gpt2; do
    if ! timeout 120 "$ZDP" tokenize --tokenizer "$TOK/$name" --special < "$WORK/corpus.txt" \
            > "$WORK/ids_$name.txt"; then
        echo "FAIL: $name: zdp tokenize failed"
        fail=1
        continue
    fi
    if ! timeout 120 "$ZDP" tokenize --tokenizer "$TOK/$name" --decode < "$WORK/ids_$name.txt" \
            > "$WORK/dec_$name.txt"; then
        echo "FAIL: $name: zdp tokenize --decode failed"
        fail=1
        continue
    fi
    timeout 300 node "$HERE/tokenizer_reference.js" compare "$LIB" "$TOK/$name" "$WORK/corpus.txt" \
        "$WORK/ids_$name.txt" "$WORK/dec_$name.txt" || fail=1
done
[ $fail -eq 0 ] && echo "test_tokenizer_reference: OK"
exit $fail
