#!/usr/bin/env bash
# `zdp tokenize`'s contract on a small tokenizer.json from the repository
# (tests/fuzz/corpus/tokenizer/qwen3_like.json: Qwen3's regex and NFC, 256
# bytes + a few merges, <|endoftext|> special, <think> not): text -> one
# line of ids, --decode back byte for byte (invalid UTF-8 included),
# --special, and each bad input a one-line error naming the thing, exit 2.
# The real tokenizers are checked in test_tokenizer_reference.sh.
# usage: test_tokenize.sh ZDP_BINARY [MPIEXEC]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ZDP=$1
source "$(dirname "$0")/lib.sh"
mkdir "$T/tok"
cp "$HERE/../fuzz/corpus/tokenizer/qwen3_like.json" "$T/tok/tokenizer.json"

# Encode: one line, ids separated by single spaces; "hello" is one token (259).
printf 'hello world' | timeout 30 "$ZDP" tokenize --tokenizer "$T/tok" >"$T/ids" 2>"$T/err"
[ $? -eq 0 ] || { fail "encode: exit $?"; cat "$T/err"; }
[ "$(cat "$T/ids")" = "259 261 114 108 100" ] || fail "encode: got '$(cat "$T/ids")'"
[ "$(wc -l <"$T/ids")" -eq 1 ] || fail "encode: not one line"

# Round trip on every byte value, invalid UTF-8 and special text included.
python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256)) * 3 + b"<|endoftext|> <think> caf\xc3\xa9 \xff\xfe")' >"$T/text"
for s in "" --special; do
    timeout 30 "$ZDP" tokenize --tokenizer "$T/tok" $s <"$T/text" >"$T/ids" || fail "encode $s failed"
    timeout 30 "$ZDP" tokenize --tokenizer "$T/tok" --decode <"$T/ids" >"$T/back" || fail "decode failed"
    cmp -s "$T/text" "$T/back" || fail "decode(encode(x)) != x ($s)"
done

# --special: the special token's text becomes its id; without, it stays text.
# A non-special added token (<think>, 1001) always matches.
[ "$(printf '<|endoftext|>' | "$ZDP" tokenize --tokenizer "$T/tok" --special)" = "1000" ] ||
    fail "--special: <|endoftext|> is not 1000"
out=$(printf '<|endoftext|>' | "$ZDP" tokenize --tokenizer "$T/tok")
[ "$out" != "1000" ] && [ "$(wc -w <<<"$out")" -gt 1 ] || fail "no --special: got '$out'"
[ "$(printf '<think>' | "$ZDP" tokenize --tokenizer "$T/tok")" = "1001" ] || fail "<think> is not 1001"
[ "$(printf '' | "$ZDP" tokenize --tokenizer "$T/tok")" = "" ] || fail "empty text: not an empty line"

# expect_error WHAT SUBSTRING ARGS... (stdin from $T/in): exit 2, one error line.
expect_error() {
    local what=$1 want=$2
    shift 2
    timeout 30 "$ZDP" "$@" <"$T/in" >"$T/out" 2>"$T/err"
    local rc=$?
    [ $rc -eq 2 ] || fail "$what: exit $rc, wanted 2"
    grep -qF -- "$want" "$T/err" || { fail "$what: no '$want' in:"; cat "$T/err"; }
    [ "$(grep -c 'error' "$T/err")" -eq 1 ] || { fail "$what: not one error line"; cat "$T/err"; }
}
printf '12 x 7' >"$T/in"
expect_error "a word in --decode input" 'stdin entry 2 = "x": need a token id' tokenize --tokenizer "$T/tok" --decode
printf '12 99999' >"$T/in"
expect_error "an id that is no token" "token 1 = 99999: not a token" tokenize --tokenizer "$T/tok" --decode
printf 'x' >"$T/in"
expect_error "no --tokenizer" "tokenize needs --tokenizer DIR" tokenize
expect_error "--tokenizer without its value" "--tokenizer: missing value" tokenize --tokenizer --decode
expect_error "an unknown option" "unknown option --bogus" tokenize --tokenizer "$T/tok" --bogus 1
expect_error "an empty folder" "no tokenizer here" tokenize --tokenizer "$T"
mkdir "$T/bad"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["model"]["merges"][0]=["h","nope"]; json.dump(d,open(sys.argv[2],"w"))' \
    "$T/tok/tokenizer.json" "$T/bad/tokenizer.json"
expect_error "a merge with an unknown part" "bad/tokenizer.json: model.merges[0]" tokenize --tokenizer "$T/bad"
printf '{"model": {"type": "BPE",' >"$T/bad/tokenizer.json"
expect_error "truncated JSON" "tokenizer.json: not valid JSON at line 1" tokenize --tokenizer "$T/bad"

if [ $failures -eq 0 ]; then echo "zdp tokenize: all passed"; else echo "$failures failure(s)"; fi
[ $failures -eq 0 ]
