#!/usr/bin/env bash
# Many LoRA models on one `zdp serve` (docs/server.md, "Models") over a GPT-2
# base at -np 1, 2 and 3 (ZeRO stages 0, 1, 2) and a Qwen3 folder at -np 2,
# driven by tests/serve/multi_check.py: fresh
# models start at the base loss, two models interleaved == each alone
# (bitwise), from_state beside a live model, --max-models refusal, bad input
# (nothing changed), heartbeat unload, a forward in the window changing
# nothing, a restarted script creating its models again (ended sessions,
# finish).  Also the flags' own refusals.
# usage: test_serve_multi.sh ZDP_BINARY MPIEXEC
set -u
source "$(dirname "$0")/serve_lib.sh" "$@" # ZDP MPIEXEC: HERE, PY, $T, fail, start_server
CHECK="$HERE/../serve/multi_check.py"

MODEL=(--model gpt --n-layer 2 --n-head 2 --n-embd 16 --vocab-size 64 --block-size 16)
IDLE=6
SESSION=3 # --session-timeout-seconds: the restart check waits this long
config() {
  cat <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "managed_gradient_accumulation": false, "gradient_clipping": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8}},
 "zero_optimization": {"stage": $1, "reduce_bucket_size": 300}}
JSON
}

# The flags: --max-models with --full-finetune, and 0, are refused naming the flag.
config 0 >"$T/cfg.json"
expect_error 1 "--max-models 2 with --full-finetune" serve "${MODEL[@]}" --config "$T/cfg.json" --full-finetune \
  --max-models 2 --port 0
expect_error 1 "--max-models 0: need an integer in [1, 1024]" serve "${MODEL[@]}" --config "$T/cfg.json" \
  --max-models 0 --port 0

# A Llama-family base too: Qwen3 (q/k norm), grouped-query attention, tied head.
"$ZDP" init-model --arch qwen3 --layers 2 --hidden 16 --heads 2 --kv-heads 1 --ffn 32 --vocab 64 --tie \
  --max-pos 64 --out "$T/qwen" >/dev/null || fail "init-model"
QWEN=(--model-dir "$T/qwen" --block-size 16)

for run in ${RUNS:-gpt:1 gpt:2 gpt:3 qwen:2}; do
  kind=${run%:*} np=${run#*:}
  stage=$((np - 1))
  config $stage >"$T/cfg$np.json"
  log="$T/server-$kind-$np.log"
  if [ "$kind" = qwen ]; then args=("${QWEN[@]}"); else args=("${MODEL[@]}"); fi
  start_server $np "$log" "${args[@]}" --config "$T/cfg$np.json" --checkpoint-dir "$T/ck-$kind-$np" \
    --max-models 2 --model-idle-timeout-seconds $IDLE --session-timeout-seconds $SESSION \
    --long-poll-seconds 1 || continue
  timeout 300 $PY "$CHECK" "$URL" "$T/ck-$kind-$np" $IDLE $SESSION ||
    fail "multi_check $kind at -np $np (ZeRO stage $stage)"
  stop_server
  if [ $SERVER_RC -ne 0 ] || ! grep -q "zdp serve: stopped" "$log"; then
    fail "-np $np: no clean stop on SIGTERM (exit $SERVER_RC)"; tail -20 "$log"
  fi
  grep -q "create_model -> .*LoRA rank 4" "$log" || fail "-np $np: the server did not log a LoRA create_model"
  grep -q "unloaded: its session .* sent no heartbeat" "$log" || fail "-np $np: no heartbeat unload in the log"
  grep -q "create_model .* took its slot" "$log" || fail "-np $np: no slot taken from an ended session in the log"
  grep -q "session s[0-9]* finished (success)" "$log" || fail "-np $np: no session finish in the log"
  if grep -q "MPI_ABORT\|zdp: error" "$log"; then fail "-np $np: server log has errors"; cat "$log"; fi
done

finish test_serve_multi
