#!/usr/bin/env bash
# `zdp serve --full-finetune` at ZeRO stage 3 (docs/server.md, "ZeRO stage 3")
# against stage 2 at -np 2 and 3, on a GPT and a Qwen3 folder, driven by
# tests/serve/zero3_check.py: loss:sum of each forward_backward within fp32
# tolerance, greedy /sample tokens equal after every optim_step (stage 3
# gathers the whole model for them), save_weights files within fp32
# tolerance, save/load_state round trip, GET /info's gathered_whole_bytes.
# Also the start-up refusal of LoRA at stage 3, naming the key and the fix.
# usage: test_serve_zero3.sh ZDP_BINARY MPIEXEC
set -u
source "$(dirname "$0")/serve_lib.sh" "$@" # ZDP MPIEXEC: HERE, PY, $T, fail, start_server
CHECK="$HERE/../serve/zero3_check.py"

config() {
  cat <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "managed_gradient_accumulation": false, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
 "zero_optimization": {"stage": $1, "reduce_bucket_size": 300, "stage3_prefetch_bucket_size": 400,
                       "stage3_param_persistence_threshold": 40}}
JSON
}
config 2 >"$T/cfg2.json"
config 3 >"$T/cfg3.json"

GPT=(--model gpt --n-layer 2 --n-head 2 --n-embd 16 --vocab-size 64 --block-size 32)
"$ZDP" init-model --arch qwen3 --layers 2 --hidden 16 --heads 2 --kv-heads 1 --ffn 32 --vocab 64 --tie \
  --max-pos 64 --out "$T/qwen" >/dev/null || fail "init-model"
QWEN=(--model-dir "$T/qwen" --block-size 32)

# LoRA over a partitioned base is not built: refused at start-up.
expect_error 1 "zero_optimization.stage = 3: zdp serve trains LoRA models over a whole base" \
  serve "${GPT[@]}" --config "$T/cfg3.json" --port 0

# A collective step that fails on some ranks only (rank 1 cannot allocate
# its 3rd stage-3 gather, mid-forward): zdp_server_run returns ZDP_ERR_FATAL
# and the tool, not the library, ends the whole job: no rank left waiting, a
# non-zero exit and the reason ("zdp serve: " is the tool's prefix).
if ZDP_TEST_FAIL_GATHER=1:3 start_server 2 "$T/fatal.log" "${GPT[@]}" --full-finetune \
     --config "$T/cfg3.json" --checkpoint-dir "$T/ck-fatal"; then
  $PY - "$URL" <<'PY' >/dev/null 2>&1
import json, sys, urllib.request
d = {"model_input": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3, 4]}]},
     "loss_fn_inputs": {"target_tokens": [2, 3, 4, 5]}}
r = urllib.request.Request(sys.argv[1] + "/forward_backward", method="POST",
                           data=json.dumps({"data": [d], "loss_fn": "cross_entropy"}).encode(),
                           headers={"Content-Type": "application/json"})
urllib.request.urlopen(r, timeout=60)
PY
  for _ in $(seq 600); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$SERVER_PID" 2>/dev/null && fail "a fatal error: the server still runs after 60 s"
  stop_server
  if [ $SERVER_RC -ne 0 ] && grep -q "fatal: zdp serve: forward: zdp_param_fetch" "$T/fatal.log"; then
    echo "ok: a fatal error mid-request ends every rank through the tool (exit $SERVER_RC)"
  else
    fail "a fatal error: exit $SERVER_RC, no 'fatal: zdp serve: forward' line"; tail -20 "$T/fatal.log"
  fi
fi

for run in ${RUNS:-gpt:2 gpt:3 qwen:2 qwen:3}; do
  name=${run%%:*} np=${run##*:}
  if [ "$name" = gpt ]; then model=("${GPT[@]}"); else model=("${QWEN[@]}"); fi
  for stage in 2 3; do
    dir="$T/ck-$name-$np-$stage"
    log="$T/$name-$np-$stage.log"
    start_server "$np" "$log" "${model[@]}" --full-finetune --config "$T/cfg$stage.json" \
      --checkpoint-dir "$dir" || continue
    timeout 300 $PY "$CHECK" run "$URL" "$T/$name-$np-$stage.json" || fail "zero3_check run $name -np $np stage $stage"
    stop_server
    if [ $SERVER_RC -ne 0 ] || ! grep -q "zdp serve: stopped" "$log"; then
      fail "$name -np $np stage $stage: no clean stop (exit $SERVER_RC)"; tail -20 "$log"
    fi
  done
  before=$failures
  timeout 60 $PY "$CHECK" compare "$T/$name-$np-2.json" "$T/$name-$np-3.json" ||
    fail "$name -np $np: stage 3 differs from stage 2"
  timeout 60 $PY "$HERE/../serve/serve_check.py" compare "$T/ck-$name-$np-2/w.safetensors" \
    "$T/ck-$name-$np-3/w.safetensors" || fail "$name -np $np: save_weights at stage 3 differs from stage 2"
  [ $failures -eq "$before" ] && echo "ok: $name -np $np: stage 3 == stage 2"
done

finish test_serve_zero3
