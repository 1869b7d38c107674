#!/usr/bin/env bash
# Checkpoints through `zdp train --save-dir/--save-every/--resume` and
# `zdp ckpt inspect/export`:
#   a. exact resume, bitwise: MLP and GPT, ZeRO stages 0/1/2 (2 with
#      overlap_comm and small buckets), managed and unmanaged (--schedule);
#   b. resume at another world size (same global batch and data order) to
#      fp32 tolerance, and bitwise at the saving world size;
#   c. crash safety: rank 0 killed (ZDP_TEST_CKPT_CRASH) at each point of a
#      save leaves the previous checkpoint and `latest` usable;
#   d. corrupt or mismatched checkpoints: one error line naming the file and
#      the problem, a non-zero exit, and nothing written (a one-digit change
#      of a counter in meta.json; a GPT of another --n-head);
#   e. zdp ckpt export gives the checkpoint's weights;
#   f. --data-format: a damaged llm.c shard magic is an error under auto,
#      and --data-format bytes reads the same file as bytes.
# Every run is under `timeout`, so a hang fails the test.
# usage: test_checkpoint.sh ZDP_BINARY MPIEXEC
set -u
ZDP=$1
MPIEXEC=$2
source "$(dirname "$0")/lib.sh"

error_has() { # error_has SUBSTRING: the error line of the last run contains SUBSTRING too
  grep -a "zdp: error:" "$T/out" | grep -aqF -- "$1" || { fail "error line lacks '$1'"; cat "$T/out"; }
}
# The deterministic part of the step lines (GPT lines end with timings).
steps_of() { grep -a '^step ' "$1" | cut -d'|' -f1-5; }

# ---- models, data, configs ------------------------------------------------------
MLP=(--model mlp --hidden 8 --layers 3)
GPT=(--model gpt --n-layer 2 --n-head 2 --n-embd 16 --vocab-size 256 --block-size 16
     --val-every 0)
expect_ok 1 gen-data --hidden 8 --samples 200 --seed 3 --out "$T/data.safetensors"
expect_ok 1 gen-data --corpus arith --lines 400 --out "$T/tokens.bin"
mlp_data=(--data "$T/data.safetensors")
gpt_data=(--data "$T/tokens.bin" --out-dir "$T/gpt-out")

config() { # config NAME STAGE MANAGED(true|false) [extra zero keys]
  cat >"$T/$1.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
 "managed_gradient_accumulation": $3,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_type": "linear"}},
 "gradient_clipping": 1.0,
 "zero_optimization": {"stage": $2${4:+, $4}}}
JSON
}
config s0m 0 true
config s1m 1 true
config s2m 2 true '"overlap_comm": true, "reduce_bucket_size": 20'
config s0u 0 false
config s1u 1 false
config s2u 2 false '"overlap_comm": true, "reduce_bucket_size": 20'

# ---- a. exact resume, bitwise ---------------------------------------------------
exact_resume() { # exact_resume NP mlp|gpt CONFIG-NAME
  local np=$1 m=$2 c=$3 margs extra=() id="$2-$3-np$1"
  if [ "$m" = mlp ]; then margs=("${MLP[@]}" "${mlp_data[@]}"); else margs=("${GPT[@]}" "${gpt_data[@]}"); fi
  [ "${c: -1}" = u ] && extra=(--schedule 2,3,1)
  local D="$T/a-$id"
  expect_ok "$np" train "${margs[@]}" --config "$T/$c.json" "${extra[@]}" --steps 6 \
    --save-weights "$T/A-$id.safetensors"
  steps_of "$T/out" | sed -n '4,6p' >"$T/A-$id.steps"
  expect_ok "$np" train "${margs[@]}" --config "$T/$c.json" "${extra[@]}" --steps 3 \
    --save-dir "$D" --save-every 3
  [ "$(cat "$D/latest" 2>/dev/null)" = global_step3 ] || fail "$id: latest is not global_step3"
  expect_ok "$np" train "${margs[@]}" --config "$T/$c.json" "${extra[@]}" --resume "$D" \
    --steps 6 --save-weights "$T/B-$id.safetensors"
  grep -aq "^resumed from $D: step 3" "$T/out" || { fail "$id: no 'resumed from' line"; cat "$T/out"; }
  steps_of "$T/out" >"$T/B-$id.steps"
  [ "$(wc -l <"$T/B-$id.steps")" -eq 3 ] || fail "$id: the resumed run printed $(wc -l <"$T/B-$id.steps") step lines, wanted 3 (steps 4..6)"
  cmp -s "$T/A-$id.steps" "$T/B-$id.steps" || { fail "$id: step lines 4..6 differ after resume"; diff "$T/A-$id.steps" "$T/B-$id.steps"; }
  cmp -s "$T/A-$id.safetensors" "$T/B-$id.safetensors" || fail "$id: weights after resume differ from the uninterrupted run"
}
for m in mlp gpt; do
  for c in s0m s1m s2m s0u s1u s2u; do exact_resume 2 $m $c; done
done
exact_resume 3 mlp s2u
exact_resume 3 gpt s1m

# ---- b. another world size: same global batch and data order at every W ----------
# b = B/W with G = 1; data is consumed in one global order, so a run at W
# ranks does the same arithmetic up to the order of the gradient reduction.
ws_check() { # ws_check mlp|gpt B STAGE
  local m=$1 B=$2 stage=$3 margs
  if [ "$m" = mlp ]; then margs=("${MLP[@]}" "${mlp_data[@]}"); else margs=("${GPT[@]}" "${gpt_data[@]}"); fi
  cat >"$T/ws-$m.json" <<JSON
{"train_batch_size": $B, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
 "zero_optimization": {"stage": $stage, "reduce_bucket_size": 30}}
JSON
  local D="$T/ws-$m"
  expect_ok 4 train "${margs[@]}" --config "$T/ws-$m.json" --steps 3 --save-dir "$D"
  for np in 1 2 3 4; do
    expect_ok $np train "${margs[@]}" --config "$T/ws-$m.json" --steps 6 \
      --save-weights "$T/ws-$m-A$np.safetensors"
    cp "$T/out" "$T/ws-$m-A$np.out"
    expect_ok $np train "${margs[@]}" --config "$T/ws-$m.json" --resume "$D" --steps 6 \
      --save-weights "$T/ws-$m-B$np.safetensors"
    cp "$T/out" "$T/ws-$m-B$np.out"
    [ "$(grep -ac '^step ' "$T/ws-$m-B$np.out")" -eq 3 ] || fail "ws $m np=$np: wanted 3 step lines after resume"
    for s in 4 5 6; do
      local a b
      a=$(loss_of "$T/ws-$m-A$np.out" $s)
      b=$(loss_of "$T/ws-$m-B$np.out" $s)
      close "$a" "$b" 1e-5 || fail "ws $m: saved at np=4, resumed at np=$np: step $s loss $b, uninterrupted $a (rel. tol 1e-5)"
    done
    grep -aq "^step 6 | loss .* | global_samples $((6 * B)) " "$T/ws-$m-B$np.out" || fail "ws $m np=$np: global_samples at step 6"
  done
  # At the saving world size the resume is exact.
  cmp -s "$T/ws-$m-A4.safetensors" "$T/ws-$m-B4.safetensors" || fail "ws $m np=4: resume not bitwise"
}
ws_check mlp 24 2
ws_check gpt 12 1

# ---- c. crash safety --------------------------------------------------------------
expect_ok 2 train "${MLP[@]}" "${mlp_data[@]}" --config "$T/s2m.json" --steps 3 \
  --save-weights "$T/c-ref.safetensors"
for point in files meta latest; do
  D="$T/c-$point"
  expect_ok 2 train "${MLP[@]}" "${mlp_data[@]}" --config "$T/s2m.json" --steps 1 --save-dir "$D"
  ZDP_TEST_CKPT_CRASH=$point timeout 120 "$MPIEXEC" -np 2 --oversubscribe -x ZDP_TEST_CKPT_CRASH \
    "$ZDP" train "${MLP[@]}" "${mlp_data[@]}" --config "$T/s2m.json" --resume "$D" --steps 3 \
    --save-dir "$D" --save-every 1 >"$T/out" 2>&1
  rc=$?
  if [ $rc -eq 124 ]; then fail "crash $point: the job hung after rank 0 was killed";
  elif [ $rc -eq 0 ]; then fail "crash $point: exit 0; ZDP_TEST_CKPT_CRASH did not kill rank 0"; cat "$T/out"; fi
  grep -aq '^step 2 ' "$T/out" || { fail "crash $point: died before step 2"; cat "$T/out"; }
  grep -aq '^step 3 ' "$T/out" && fail "crash $point: step 3 ran; the save of step 2 was not interrupted"
  [ "$(cat "$D/latest")" = global_step1 ] || fail "crash $point: latest says '$(cat "$D/latest")', wanted global_step1"
  if [ $point = latest ]; then
    [ -f "$D/global_step2/meta.json" ] || fail "crash latest: global_step2 should be complete (renamed before latest)"
  else
    [ -e "$D/global_step2" ] && fail "crash $point: global_step2 exists although its save was interrupted"
  fi
  expect_ok 1 ckpt inspect "$D"
  grep -aq "^checkpoint $D/global_step1 " "$T/out" || { fail "crash $point: inspect does not show global_step1"; cat "$T/out"; }
  grep -aq "checksums verified" "$T/out" || fail "crash $point: inspect did not verify"
  if [ $point = latest ]; then
    expect_ok 1 ckpt inspect "$D" --tag global_step2   # the orphan is itself complete
  fi
  # Resume from what survived, saving again over the leftovers (global_step2.tmp
  # or a complete global_step2 that latest never named).
  expect_ok 2 train "${MLP[@]}" "${mlp_data[@]}" --config "$T/s2m.json" --resume "$D" --steps 3 \
    --save-dir "$D" --save-every 1 --save-weights "$T/c-$point.safetensors"
  grep -aq "^resumed from $D: step 1" "$T/out" || fail "crash $point: did not resume from step 1"
  cmp -s "$T/c-ref.safetensors" "$T/c-$point.safetensors" || fail "crash $point: weights differ from an uninterrupted 3-step run"
  [ "$(cat "$D/latest")" = global_step3 ] || fail "crash $point: latest after the resumed run is not global_step3"
  ls -d "$D"/*.tmp "$D"/*.old.* >/dev/null 2>&1 && fail "crash $point: leftovers after a successful save: $(ls "$D")"
  for tag in global_step2 global_step3; do
    expect_ok 1 ckpt inspect "$D" --tag $tag
  done
done
# Re-saving a tag that exists: killed right after the new directory took the
# tag's place (one atomic swap), the tag holds the complete new checkpoint and
# the old one waits in TAG.tmp; the next save clears it.
D="$T/c-latest"   # global_step1..3 complete, latest global_step3
printf 'global_step1\n' >"$D/latest"
ZDP_TEST_CKPT_CRASH=replace timeout 120 "$MPIEXEC" -np 2 --oversubscribe -x ZDP_TEST_CKPT_CRASH \
  "$ZDP" train "${MLP[@]}" "${mlp_data[@]}" --config "$T/s2m.json" --resume "$D" --steps 3 \
  --save-dir "$D" --save-every 1 >"$T/out" 2>&1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then fail "crash replace: exit $rc, wanted rank 0 killed"; cat "$T/out"; fi
[ -f "$D/global_step2/meta.json" ] || fail "crash replace: the tag global_step2 is missing after the swap"
expect_ok 1 ckpt inspect "$D" --tag global_step2
grep -aq "checksums verified" "$T/out" || fail "crash replace: global_step2 does not verify"
expect_ok 2 train "${MLP[@]}" "${mlp_data[@]}" --config "$T/s2m.json" --resume "$D" --steps 3 \
  --save-dir "$D" --save-every 1 --save-weights "$T/c-replace.safetensors"
cmp -s "$T/c-ref.safetensors" "$T/c-replace.safetensors" || fail "crash replace: weights differ from an uninterrupted run"
ls -d "$D"/*.tmp "$D"/*.old.* >/dev/null 2>&1 && fail "crash replace: leftovers after a successful save: $(ls "$D")"

# ---- d. corrupt and mismatched checkpoints ------------------------------------------
G="$T/good"
expect_ok 2 train "${MLP[@]}" "${mlp_data[@]}" --config "$T/s2m.json" --steps 3 --save-dir "$G" \
  --save-weights "$T/good-w3.safetensors"
GS="$G/global_step3"
fresh() { rm -rf "$T/bad"; cp -r "$G" "$T/bad"; B="$T/bad/global_step3"; }
snap() { (cd "$T/bad" && find . -type f -exec md5sum {} + | sort) 2>/dev/null; find "$T/bad" -type d | sort; }
bad_resume() { # bad_resume SUBSTRING [extra train args]: resume from $T/bad fails, nothing written
  local sub=$1; shift
  local before; before=$(snap)
  rm -rf "$T/nw" "$T/nw.safetensors"
  expect_error 2 "$sub" train "${MLP[@]}" "${mlp_data[@]}" --config "$T/s2m.json" --steps 6 \
    --resume "$T/bad" --save-dir "$T/nw" --save-every 1 --save-weights "$T/nw.safetensors" "$@"
  grep -aq '^step ' "$T/out" && fail "a failed resume trained: $sub"
  [ -e "$T/nw" ] && fail "a failed resume wrote its --save-dir ($sub)"
  [ -e "$T/nw.safetensors" ] && fail "a failed resume wrote --save-weights ($sub)"
  [ "$before" = "$(snap)" ] || fail "a failed resume changed the checkpoint directory ($sub)"
}
bad_inspect() { # bad_inspect SUBSTRING: inspect and export fail the same way, export writes nothing
  rm -f "$T/x.safetensors"
  expect_error 1 "$1" ckpt inspect "$T/bad"
  expect_error 1 "$1" ckpt export "$T/bad" --to "$T/x.safetensors"
  [ -e "$T/x.safetensors" ] && fail "export of a bad checkpoint wrote its output ($1)"
}

# A flipped byte in a rank file.
fresh
off=$(( $(stat -c %s "$B/optim_rank1.safetensors") - 5 ))
orig=$(od -An -tu1 -j $off -N1 "$B/optim_rank1.safetensors" | tr -d ' ')
printf "\\$(printf '%03o' $(( (orig ^ 0x55) & 255 )))" | dd of="$B/optim_rank1.safetensors" bs=1 seek=$off conv=notrunc status=none
bad_resume "optim_rank1.safetensors"; error_has "corrupted"; error_has "checksum"
# ... and the message quotes what meta.json says (size and checksum).
want_bytes=$(grep -a -A2 '"optim_rank1.safetensors"' "$B/meta.json" | sed -n 's/.*"bytes": \([0-9]*\).*/\1/p')
want_hash=$(grep -a -A2 '"optim_rank1.safetensors"' "$B/meta.json" | sed -n 's/.*"fnv1a64": "\([0-9a-f]*\)".*/\1/p')
error_has "meta.json says $want_bytes bytes, $want_hash:"
bad_inspect "optim_rank1.safetensors"

# model.safetensors truncated.
fresh
truncate -s 100 "$B/model.safetensors"
bad_resume "model.safetensors"; error_has "truncated"; error_has "100 bytes"
want_bytes=$(grep -a -A2 '"model.safetensors"' "$B/meta.json" | sed -n 's/.*"bytes": \([0-9]*\).*/\1/p')
error_has "meta.json says $want_bytes bytes"
bad_inspect "model.safetensors"

# A rank file deleted.
fresh
rm "$B/optim_rank1.safetensors"
bad_resume "optim_rank1.safetensors"; error_has "incomplete"
bad_inspect "optim_rank1.safetensors"

# meta.json replaced by garbage.
fresh
printf '\x00\x01garbage{{{' >"$B/meta.json"
bad_resume "meta.json"; error_has "corrupt metadata"
bad_inspect "meta.json"

# meta.json that is JSON but not a checkpoint's.
fresh
echo '{"format": "something-else", "format_version": 1}' >"$B/meta.json"
bad_resume "meta.json"; error_has "not a zdp checkpoint"

# A format version this zdp does not read.
fresh
sed -i 's/"format_version": 2,/"format_version": 99,/' "$B/meta.json"
grep -aq '"format_version": 99' "$B/meta.json" || fail "could not edit format_version"
bad_resume "format_version 99"; error_has "meta.json"; error_has "reads versions 1 and 2"
bad_inspect "format_version 99"

# meta.json's own checksum: one character of a counter changed (the file
# still parses, and loaded silently before) is refused, naming the file, the
# stored and the computed checksum.
flip_digit() { # flip_digit KEY: the last digit of KEY's integer value in $B/meta.json, +1 mod 10
  local before_sum; before_sum=$(md5sum <"$B/meta.json")
  perl -0pi -e 's/("'"$1"'": \d*)(\d)/$1.(($2 + 1) % 10)/e' "$B/meta.json"
  [ "$before_sum" != "$(md5sum <"$B/meta.json")" ] || fail "could not edit $1 in meta.json"
}
for key in global_steps global_samples optimizer_step samples_consumed; do
  fresh
  stored=$(sed -n 's/.*"meta_fnv1a64": "\([0-9a-f]*\)".*/\1/p' "$B/meta.json")
  flip_digit $key
  bad_resume "checksum mismatch"; error_has "$B/meta.json"; error_has "says meta_fnv1a64 $stored"
  error_has "restore it from a copy"
  bad_inspect "checksum mismatch"
done
# Whitespace counts too (the checksum is over the bytes), and so does the
# checksum itself.
fresh
sed -i 's/"world_size": 2/"world_size":  2/' "$B/meta.json"
bad_resume "checksum mismatch"
fresh
sed -i 's/"meta_fnv1a64": "\([0-9a-f]*\)[0-9a-f]"/"meta_fnv1a64": "\1x"/' "$B/meta.json"
bad_resume "no valid \"meta_fnv1a64\""
# A format 1 checkpoint (written before the checksum) loads, with a warning.
fresh
perl -0pi -e 's/"format_version": 2,/"format_version": 1,/; s/,\s*"meta_fnv1a64": "[0-9a-f]*"//' "$B/meta.json"
grep -aq meta_fnv1a64 "$B/meta.json" && fail "could not remove meta_fnv1a64"
expect_ok 2 train "${MLP[@]}" "${mlp_data[@]}" --config "$T/s2m.json" --steps 4 --resume "$T/bad"
grep -aq "format_version 1 has no meta.json checksum" "$T/out" || { fail "format 1: no warning"; cat "$T/out"; }
grep -aq '^step 4 ' "$T/out" || fail "format 1: did not train"
expect_ok 1 ckpt inspect "$T/bad"
grep -aq "meta.json has no checksum (format 1)" "$T/out" || { fail "inspect of format 1 does not say so"; cat "$T/out"; }

# Another model size: named by the shape recorded in meta.json.
fresh
before=$(snap)
rm -rf "$T/nw"
expect_error 2 "the checkpoint's model has hidden = 8, this model has hidden = 6" train --model mlp \
  --hidden 6 --layers 3 --config "$T/s2m.json" --steps 6 --resume "$T/bad" --save-dir "$T/nw"
error_has "--hidden 8"; error_has "meta.json"
[ -e "$T/nw" ] && fail "a failed resume (--hidden 6) wrote its --save-dir"
[ "$before" = "$(snap)" ] || fail "a failed resume (--hidden 6) changed the checkpoint"
# Same parameter count, other shapes: --layers 3 vs a model with other tensors
# is caught by numel; a different optimizer is caught by its state.
sed 's/"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}/"type": "SGD", "params": {"lr": 1e-2, "momentum": 0.9}/' \
  "$T/s0m.json" >"$T/sgd.json"
bad_resume "optimizer AdamW" --config "$T/sgd.json"

# No `latest` in the directory.
fresh
rm "$T/bad/latest"
bad_resume "latest"; error_has "no checkpoint has been completed"
bad_inspect "latest"
mkdir -p "$T/empty"
expect_error 2 "$T/empty/latest" train "${MLP[@]}" --config "$T/s2m.json" --resume "$T/empty"
# `latest` naming something that is not a tag.
fresh
echo "../../etc" >"$T/bad/latest"
bad_resume "is not a checkpoint tag"
# `latest` naming a tag that does not exist.
fresh
echo "global_step9" >"$T/bad/latest"
bad_resume "global_step9/meta.json"; error_has "missing"

# The GPT's n_head shows in no tensor shape: the shape recorded in meta.json
# refuses it, with both values (and so every other shape flag).
GA="$T/a-gpt-s2m-np2"
gpt_other() { # gpt_other FLAG VALUE: the GPT flags of section a with one changed
  local a=("${GPT[@]}") i
  for i in "${!a[@]}"; do [ "${a[$i]}" = "$1" ] && a[$((i + 1))]=$2; done
  echo "${a[@]}"
}
for change in "n-head 4 2" "block-size 8 16" "n-layer 1 2"; do
  read -r flag new old <<<"$change"
  key=${flag//-/_}
  rm -rf "$T/nw"
  # shellcheck disable=SC2046
  expect_error 2 "the checkpoint's model has $key = $old, this model has $key = $new" \
    train $(gpt_other --$flag $new) "${gpt_data[@]}" --config "$T/s2m.json" --steps 6 \
    --resume "$GA" --save-dir "$T/nw"
  error_has "$GA/global_step3/meta.json"; error_has "(the zdp command: --$flag $old)"
  grep -aq '^step ' "$T/out" && fail "a resume with --$flag $new trained"
  [ -e "$T/nw" ] && fail "a failed resume (--$flag $new) wrote its --save-dir"
done
# --init: a weights file zdp wrote (the checkpoint's model.safetensors, its
# export, --save-weights) records the shape in __metadata__ too.
expect_ok 1 ckpt export "$GA" --to "$T/ga.safetensors"
expect_ok 1 train "${GPT[@]}" "${gpt_data[@]}" --config "$T/s0m.json" --steps 1 \
  --save-weights "$T/gw.safetensors"
for w in "$GA/global_step3/model.safetensors" "$T/ga.safetensors" "$T/gw.safetensors"; do
  # shellcheck disable=SC2046
  expect_error 1 "zdp saved these weights for a GPT with n_head = 2" train $(gpt_other --n-head 4) \
    "${gpt_data[@]}" --config "$T/s0m.json" --steps 1 --init "$w"
  error_has "$w"; error_has "the config has n_head = 4"; error_has "--n-head 2"
  grep -aq '^step ' "$T/out" && fail "--init $w with another --n-head trained"
  expect_ok 1 train "${GPT[@]}" "${gpt_data[@]}" --config "$T/s0m.json" --steps 1 --init "$w"
done
expect_ok 1 ckpt inspect "$GA"
grep -aqF 'model shape: {"model":"gpt","n_layer":2,"n_head":2,"n_embd":16,"vocab_size":256,"block_size":16}' "$T/out" \
  || { fail "inspect does not show the GPT's shape"; cat "$T/out"; }

# ---- e. export -----------------------------------------------------------------------
expect_ok 1 ckpt export "$G" --to "$T/exp.safetensors"
cmp -s "$T/exp.safetensors" "$GS/model.safetensors" || fail "export differs from model.safetensors"
cmp -s "$T/exp.safetensors" "$T/good-w3.safetensors" || fail "MLP export differs from --save-weights of the same step"
# An older tag from a directory with several; a checkpoint saved at stage 0 / 3 ranks.
E="$T/e-multi"
expect_ok 3 train "${MLP[@]}" "${mlp_data[@]}" --config "$T/s0u.json" --schedule 2,3,1 --steps 4 \
  --save-dir "$E" --save-every 2 --save-weights "$T/e-w4.safetensors"
expect_ok 3 train "${MLP[@]}" "${mlp_data[@]}" --config "$T/s0u.json" --schedule 2,3,1 --steps 2 \
  --save-weights "$T/e-w2.safetensors"
expect_ok 1 ckpt export "$E" --tag global_step2 --to "$T/e2.safetensors"
cmp -s "$T/e2.safetensors" "$T/e-w2.safetensors" || fail "export --tag global_step2 differs from --save-weights at step 2"
expect_ok 1 ckpt export "$E" --to "$T/e4.safetensors"
cmp -s "$T/e4.safetensors" "$T/e-w4.safetensors" || fail "export (latest = step 4) differs from --save-weights"
cmp -s "$T/e4.safetensors" "$E/global_step4/model.safetensors" || fail "export differs from global_step4/model.safetensors"
# GPT: the export is the checkpoint's model file (a GPT2LMHeadModel file).
expect_ok 1 ckpt export "$T/a-gpt-s2m-np2" --to "$T/egpt.safetensors"
cmp -s "$T/egpt.safetensors" "$T/a-gpt-s2m-np2/global_step3/model.safetensors" || fail "GPT export differs from model.safetensors"
expect_error 1 "needs --to" ckpt export "$G"
expect_error 1 "no-such-tag" ckpt export "$G" --tag no-such-tag --to "$T/never.safetensors"
[ -e "$T/never.safetensors" ] && fail "export of a missing tag wrote its output"

# ---- f. --data-format: a damaged shard magic is an error, not bytes -----------------
cp "$T/tokens.bin" "$T/damaged.bin"
printf '\x00' | dd of="$T/damaged.bin" bs=1 seek=1 conv=notrunc status=none
cp "$T/damaged.bin" "$T/damaged.dat"
for f in damaged.bin damaged.dat; do
  for fmt in "" "--data-format auto"; do
    # shellcheck disable=SC2086
    expect_error 1 "$T/$f: header magic" train "${GPT[@]}" --data "$T/$f" $fmt --config "$T/s0m.json" \
      --steps 2 --out-dir "$T/gpt-out"
    error_has "expected 20240520"; error_has "--data-format bytes"
    grep -aq '^step ' "$T/out" && fail "trained on a damaged shard ($f $fmt)"
  done
done
expect_error 1 "header magic" train "${GPT[@]}" --data "$T/damaged.bin" --data-format llmc \
  --config "$T/s0m.json" --steps 2 --out-dir "$T/gpt-out"
expect_ok 1 train "${GPT[@]}" --data "$T/damaged.bin" --data-format bytes --config "$T/s0m.json" \
  --steps 2 --out-dir "$T/gpt-out"
grep -aq '^step 2 ' "$T/out" || { fail "--data-format bytes did not train"; cat "$T/out"; }
size=$(stat -c %s "$T/damaged.bin")
grep -aq "data $T/damaged.bin: $(( size - size / 10 )) train tokens" "$T/out" \
  || { fail "--data-format bytes: not one token per byte of $size"; cat "$T/out"; }
expect_ok 1 train "${GPT[@]}" --data "$T/tokens.bin" --config "$T/s0m.json" --steps 2 --out-dir "$T/gpt-out"
expect_error 1 "--data-format xml" train "${GPT[@]}" --data "$T/tokens.bin" --data-format xml \
  --config "$T/s0m.json"

finish test_checkpoint
