#!/usr/bin/env bash
# The official Tinker SDK (vendored, never patched) against `zdp serve` in its
# LoRA mode (tests/serve/sdk_lora_check.py): two training clients of different
# LoRA configurations at once through a cookbook-shaped SFT loop and an RL loop
# (sample -> group advantages -> importance_sampling -> optim_step), sampling
# with each adapter applied (the sampler's logprobs == the trainer's forward),
# save_weights_for_sampler and save_state as PEFT adapter folders, the
# RestClient's runs and checkpoints, then resume in a fresh server process
# (create_training_client_from_state_with_optimizer).  A Llama folder from
# `zdp init-model`, -np 1 and 2 (ZeRO stage 0 and 2).  Exit 77 (skipped) with
# the reason when the SDK cannot be imported (the shared folder beside the
# repository, or ZDP_SHARED, has its tinker-sdk.sh).
# usage: test_tinker_sdk_lora.sh ZDP_BINARY MPIEXEC
set -u
source "$(dirname "$0")/serve_lib.sh" "$@" # ZDP MPIEXEC: HERE, PY, $T, fail, start_server
CHECK="$HERE/../serve/sdk_lora_check.py"
use_tinker_sdk
export TINKER_API_KEY=tml-local

"$ZDP" init-model --arch llama --layers 2 --hidden 32 --heads 4 --kv-heads 2 --ffn 64 --vocab 64 \
  --max-pos 64 --seed 3 --out "$T/base" >/dev/null || fail "init-model"
for np in ${NPS:-1 2}; do
  stage=$(( np == 1 ? 0 : 2 ))
  cat >"$T/cfg$np.json" <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "managed_gradient_accumulation": false, "gradient_clipping": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
 "zero_optimization": {"stage": $stage, "reduce_bucket_size": 5000}}
JSON
  ck="$T/ck-$np"
  for phase in train resume; do
    log="$T/$phase-$np.log"
    start_server "$np" "$log" --model-dir "$T/base" --block-size 32 --config "$T/cfg$np.json" \
      --checkpoint-dir "$ck" --max-models 3 || continue
    timeout 400 $PY "$CHECK" "$URL" "$ck" "$phase" "$T/state-$np.json" || fail "sdk_lora_check $phase at -np $np"
    stop_server
    if [ $SERVER_RC -ne 0 ] || ! grep -q "zdp serve: stopped" "$log"; then
      fail "-np $np $phase: no clean stop (exit $SERVER_RC)"; tail -20 "$log"
    fi
  done
done

finish test_tinker_sdk_lora
