#!/usr/bin/env bash
# `zdp serve --full-finetune` at ZeRO stage 3 (docs/server.md, "ZeRO stage 3")
# against stage 2 at -np 2 and 3, on a GPT and a Qwen3 folder, driven by
# tests/serve/zero3_check.py: loss:sum of each forward_backward within fp32
# tolerance, greedy /sample tokens equal after every optim_step (stage 3
# gathers the whole model for them), save_weights files within fp32
# tolerance, save/load_state round trip, GET /info's gathered_whole_bytes.
# Then the LoRA server (the default mode) at stage 3 against stage 2 at -np
# 1-4 (GPT) and 2-3 (Qwen3), driven by tests/serve/zero3_lora_check.py: two
# models' losses and adapters within fp32 tolerance, a third created, trained
# and unloaded between their requests, greedy samples with each adapter
# equal, load_state, GET /info's memory rows (the base's partition once per
# rank, base / W, not once per model).  Last, stage 3 with gather failures
# injected on one rank (ZDP_TEST_FAIL_GATHER, ZDP_TEST_FAIL_FROZEN_GATHER):
# each fails its request on every rank and the next request works; one in a
# forward_backward's second round drops the window it had added to.  And a
# failure on one rank alone that no agreement covers (ZDP_TEST_SERVE_FATAL)
# ends every rank through the tool.
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

# A step that fails on some ranks only, where no agreement covers it (the
# test hook ZDP_TEST_SERVE_FATAL: rank 1's first job; a stage-3 gather that
# cannot be allocated is agreed on instead, and fails the request on every
# rank: the faults runs below): zdp_server_run returns ZDP_ERR_FATAL and
# the tool, not the library, ends the whole job: no rank left waiting, a
# non-zero exit and the reason ("zdp serve: " is the tool's prefix).
if ZDP_TEST_SERVE_FATAL=1:1 start_server 2 "$T/fatal.log" "${GPT[@]}" --full-finetune \
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
  if [ $SERVER_RC -ne 0 ] && grep -q "fatal: zdp serve: forward_backward: ZDP_TEST_SERVE_FATAL" "$T/fatal.log"; then
    echo "ok: a fatal error mid-request ends every rank through the tool (exit $SERVER_RC)"
  else
    fail "a fatal error: exit $SERVER_RC, no 'fatal: zdp serve: forward_backward' line"; tail -20 "$T/fatal.log"
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

LCHECK="$HERE/../serve/zero3_lora_check.py"
for run in ${LORA_RUNS:-gpt:1 gpt:2 gpt:3 gpt:4 qwen:2 qwen:3}; do
  name=${run%%:*} np=${run##*:}
  if [ "$name" = gpt ]; then model=("${GPT[@]}"); else model=("${QWEN[@]}"); fi
  for stage in 2 3; do
    dir="$T/lck-$name-$np-$stage"
    log="$T/lora-$name-$np-$stage.log"
    start_server "$np" "$log" "${model[@]}" --config "$T/cfg$stage.json" --checkpoint-dir "$dir" \
      --max-models 3 || continue
    timeout 300 $PY "$LCHECK" run "$URL" "$dir" "$T/lora-$name-$np-$stage.json" ||
      fail "zero3_lora_check run $name -np $np stage $stage"
    stop_server
    if [ $SERVER_RC -ne 0 ] || ! grep -q "zdp serve: stopped" "$log"; then
      fail "LoRA $name -np $np stage $stage: no clean stop (exit $SERVER_RC)"; tail -20 "$log"
    fi
  done
  before=$failures
  timeout 60 $PY "$LCHECK" compare "$T/lora-$name-$np-2.json" "$T/lora-$name-$np-3.json" ||
    fail "LoRA $name -np $np: stage 3 differs from stage 2"
  [ $failures -eq "$before" ] && echo "ok: LoRA $name -np $np: stage 3 == stage 2"
done

for np in ${FAULT_RUNS:-2 3}; do
  log="$T/faults-$np.log"
  ZDP_TEST_FAIL_GATHER=1:1 ZDP_TEST_FAIL_FROZEN_GATHER=0:2 \
    start_server "$np" "$log" "${GPT[@]}" --config "$T/cfg3.json" --checkpoint-dir "$T/fck-$np" || continue
  timeout 300 $PY "$LCHECK" faults "$URL" || fail "zero3_lora_check faults -np $np"
  stop_server
  if [ $SERVER_RC -ne 0 ] || ! grep -q "zdp serve: stopped" "$log"; then
    fail "faults -np $np: no clean stop (exit $SERVER_RC)"; tail -20 "$log"
  fi
done

# A failure in the second round of a forward_backward (-np 2: DATA_A's 3
# datums make 2 rounds), after the first round added its gradients: the
# window is dropped on every rank and the retry's step equals a fresh model's.
log="$T/partial.log"
if ZDP_TEST_FAIL_FROZEN_GATHER=0:9 start_server 2 "$log" "${GPT[@]}" --config "$T/cfg3.json" --checkpoint-dir "$T/pck"; then
  timeout 300 $PY "$LCHECK" partial "$URL" || fail "zero3_lora_check partial -np 2"
  stop_server
fi

finish test_serve_zero3
