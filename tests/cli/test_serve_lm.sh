#!/usr/bin/env bash
# `zdp serve` on any causal LM through the real Tinker SDK and the plain API
# (tests/serve/lm_check.py): a byte-level GPT (vocab 256: id = byte), and a
# tiny Llama folder from `zdp init-model` with GPT-2's real tokenizer when
# the shared folder beside the repository (ZDP_SHARED overrides where) has
# one in data/tokenizers/, and the Tinker SDK comes from its tinker-sdk.sh.  get_info's arch and tokenizer_id,
# training, sampling from sampler weights, string and token stop sequences,
# save/load_state.  Exit 77 (skipped) with the reason when the SDK cannot be
# imported.
# usage: test_serve_lm.sh ZDP_BINARY MPIEXEC
set -u
source "$(dirname "$0")/serve_lib.sh" "$@" # ZDP MPIEXEC: HERE, PY, $T, fail, start_server
CHECK="$HERE/../serve/lm_check.py"
use_tinker_sdk

adamw_config 1 1e-3 0 5000 >"$T/cfg.json"
TEXT="$T/text.txt"
if [ -f "$SHARED/data/tinyshakespeare.txt" ]; then head -c 4000 "$SHARED/data/tinyshakespeare.txt" >"$TEXT"
else for _ in $(seq 40); do echo "First Citizen: we are accounted poor citizens, the patricians good."; done >"$TEXT"; fi

# run NP NAME ARCH TOKENIZER_ID SERVE_ARGS -- CODEC...
run() {
  local np=$1 name=$2 arch=$3 tok=$4
  shift 4
  local args=()
  while [ "$1" != "--" ]; do args+=("$1"); shift; done
  shift
  local log="$T/$name-np$np.log"
  # Started here, not by start_server: a sanitizer build takes longer than
  # its 30 s to load a real tokenizer and a 128k-token vocabulary.
  timeout 900 "$MPIEXEC" -np "$np" --oversubscribe "$ZDP" serve "${args[@]}" --full-finetune --config "$T/cfg.json" \
    --model-name "$name" --checkpoint-dir "$T/ck-$name-$np" --port 0 >"$log" 2>&1 &
  SERVER_PID=$!
  if ! wait_listening "$SERVER_PID" "$log" 3000; then
    fail "$name: server at -np $np did not start"; cat "$log"; stop_server; return
  fi
  timeout 600 $PY "$CHECK" "$URL" "$name" "$arch" "$tok" "$TEXT" "$@" || fail "lm_check $name at -np $np"
  stop_server
  if [ $SERVER_RC -ne 0 ] || ! grep -q "zdp serve: stopped" "$log"; then
    fail "$name -np $np: no clean stop (exit $SERVER_RC)"; tail -20 "$log"
  fi
  if grep -q "MPI_ABORT\|zdp: error" "$log"; then fail "$name -np $np: server log has errors"; cat "$log"; fi
}

# A byte-level GPT: its decode is the bytes themselves.
for np in ${NPS:-1}; do
  run $np zdp-bytes gpt2 - --model gpt --n-layer 2 --n-head 2 --n-embd 32 --vocab-size 256 --block-size 64 \
    --max-stop-bytes 40 -- bytes
done

# A tiny Llama folder with a real tokenizer (GPT-2's: the smallest
# vocabulary, so that a sanitizer build finishes): text through `zdp tokenize`.
TOK="$SHARED/data/tokenizers/gpt2"
if [ -f "$TOK/encoder.json" ]; then
  "$ZDP" init-model --arch llama --layers 2 --hidden 32 --heads 4 --kv-heads 2 --ffn 64 --vocab 50257 --tie \
    --max-pos 256 --tokenizer "$TOK" --out "$T/tiny-llama" >"$T/init.log" 2>&1 || { fail "init-model"; cat "$T/init.log"; }
  for np in ${NPS:-1 3}; do
    run $np tiny-llama llama "$(cd "$T/tiny-llama" && pwd -P)" --model-dir "$T/tiny-llama" --block-size 64 -- \
      "$ZDP" tokenize --tokenizer "$T/tiny-llama"
  done
else
  echo "note: no $TOK/encoder.json: the Llama folder checks did not run (byte-level GPT only)"
fi

finish test_serve_lm
