#!/usr/bin/env bash
# One rank failing at start-up never hangs the job: each rank runs in its own
# working directory (Open MPI's MPMD form, `mpirun -np 1 -wdir A zdp ... :
# -np 1 -wdir B zdp ...`, as on nodes without a shared file system), one of
# them holds a bad file, and the job must exit non-zero within the timeout
# with one error that names the failing rank and what is wrong there.
# Cases, at -np 2 and 3: --data missing, a token outside the vocabulary, too
# few tokens, a bad config, a missing --init, a missing --resume checkpoint,
# an unusable --save-dir, for `zdp train --model gpt`; the ones that apply to
# --model mlp; and `zdp serve`'s start-up.
# usage: test_startup.sh ZDP_BINARY MPIEXEC
set -u
ZDP=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") # the test changes directory
MPIEXEC=$2
source "$(dirname "$0")/lib.sh"

# The good files every rank's directory starts with.
G=$T/good
mkdir -p "$G/out"
MODEL=(--n-layer 1 --n-head 2 --n-embd 16 --vocab-size 64 --block-size 16)
cat >"$G/c.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
 "zero_optimization": {"stage": 2}}
JSON
cat >"$G/s.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
 "managed_gradient_accumulation": false,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
 "zero_optimization": {"stage": 1}}
JSON
(
  cd "$G" || exit 1
  timeout 60 "$ZDP" gen-data --corpus arith --lines 200 --out tok.bin &&
    timeout 60 "$ZDP" gen-data --hidden 8 --samples 16 --out d.safetensors &&
    timeout 60 "$ZDP" train --model gpt "${MODEL[@]}" --config c.json --data tok.bin --steps 1 \
      --val-every 0 --out-dir run --save-weights init.safetensors --save-dir ck
) >"$T/setup.log" 2>&1 || { echo "FAIL: setup"; cat "$T/setup.log"; exit 1; }
rm -rf "$G/run"

# An llm.c shard (256 int32 header {magic, version 1, count}, then uint16
# tokens) holding token 122, outside --vocab-size 64.
python3 -c 'import struct,sys; t=[1,2,3,122]*20; sys.stdout.buffer.write(struct.pack("<256i",*([20240520,1,len(t)]+[0]*253))+struct.pack("<%dH"%len(t),*t))' >"$T/oov.bin"
# A shard of a few tokens, fewer than --block-size + 1.
timeout 60 "$ZDP" gen-data --corpus arith --lines 1 --out "$T/tiny.bin" >/dev/null 2>&1
# MLP data whose last label is 99 (the hidden size, 8, is the class count).
cp "$G/d.safetensors" "$T/badlabel.safetensors"
size=$(stat -c %s "$T/badlabel.safetensors")
printf '\143\0\0\0\0\0\0\0' | dd of="$T/badlabel.safetensors" bs=1 seek=$((size - 8)) conv=notrunc 2>/dev/null

# spoil NAME: what the bad rank's directory gets instead of the good files.
spoil() {
  case $1 in
    data-missing) rm -f tok.bin d.safetensors ;;
    data-oov) cp "$T/oov.bin" tok.bin ;;
    data-short) cp "$T/tiny.bin" tok.bin ;;
    data-label) cp "$T/badlabel.safetensors" d.safetensors ;;
    config-bad) echo '{"train_micro_batch_size_per_gpu": 0}' >c.json; cp c.json s.json ;;
    config-json) echo '{"train_micro_batch_size_per_gpu": 2,' >c.json; cp c.json s.json ;;
    init-missing) rm -f init.safetensors ;;
    resume-missing) rm -rf ck ;;
    savedir-file) rm -rf out-ck; echo not a directory >out-ck ;;
    outdir-missing) rm -rf out ;;
  esac
}

# expect_rank_error NP BAD_RANK CASE SUBSTRING ARGS...: every rank r gets its
# own copy of the good files in $T/CASE.NP/r; rank BAD_RANK's is spoiled.
expect_rank_error() {
  local np=$1 bad=$2 case=$3 sub=$4
  shift 4
  local dir=$T/$case.$np.$bad app=() r
  for ((r = 0; r < np; r++)); do
    mkdir -p "$dir/$r"
    cp -r "$G"/. "$dir/$r"/
    [ "$r" -eq "$bad" ] && (cd "$dir/$r" && spoil "$case")
    [ "$r" -gt 0 ] && app+=(:)
    app+=(-np 1 -wdir "$dir/$r" "$ZDP" "$@")
  done
  timeout 60 "$MPIEXEC" --oversubscribe "${app[@]}" >"$dir/out" 2>&1
  local rc=$? what="-np $np, $case on rank $bad: zdp $1 ${2:-} ${3:-}"
  if [ $rc -eq 124 ]; then fail "timed out (hang): $what"; cat "$dir/out"; return; fi
  if [ $rc -eq 0 ]; then fail "exit 0, wanted an error: $what"; cat "$dir/out"; return; fi
  # Rank 0 prints one line per distinct message, each naming its ranks (for
  # --resume the others also say that another rank could not read it).
  if ! grep -qE -- "^(zdp: error: |  )rank $bad: " "$dir/out"; then
    fail "the error does not name rank $bad: $what"; cat "$dir/out"; return
  fi
  if ! grep -qF -- "$sub" "$dir/out"; then fail "message lacks '$sub': $what"; cat "$dir/out"; fi
  local n
  n=$(grep -c "zdp: error:" "$dir/out")
  if [ "$n" -ne 1 ]; then fail "wanted one error line, got $n: $what"; cat "$dir/out"; fi
  # The other ranks said nothing of their own: only rank 0 prints.
  if grep -q "MPI_ABORT" "$dir/out"; then fail "MPI_Abort instead of a clean exit: $what"; fi
}

GPT=(train --model gpt "${MODEL[@]}" --config c.json --data tok.bin --steps 2 --val-every 0 --out-dir run)
MLP=(train --model mlp --hidden 8 --layers 2 --config c.json --data d.safetensors --steps 2)
SERVE=(serve --model gpt "${MODEL[@]}" --full-finetune --config s.json --port 0)

for np in 2 3; do
  last=$((np - 1))
  # zdp train --model gpt
  expect_rank_error $np $last data-missing "--data: tok.bin: cannot open" "${GPT[@]}"
  expect_rank_error $np $last data-oov "is outside the vocabulary (--vocab-size 64)" "${GPT[@]}"
  expect_rank_error $np $last data-short "fewer than --block-size + 1" "${GPT[@]}"
  expect_rank_error $np $last config-bad "train_micro_batch_size_per_gpu = 0" "${GPT[@]}"
  expect_rank_error $np $last init-missing "--init init.safetensors" "${GPT[@]}" --init init.safetensors
  expect_rank_error $np $last resume-missing "--resume ck" "${GPT[@]}" --resume ck --steps 3
  expect_rank_error $np $last savedir-file "--save-dir out-ck: " "${GPT[@]}" --save-dir out-ck
  expect_rank_error $np $last savedir-file "--save-dir out-ck/sub: " "${MLP[@]}" --save-dir out-ck/sub
  # zdp train --model mlp
  expect_rank_error $np $last data-missing "--data d.safetensors" "${MLP[@]}"
  expect_rank_error $np $last data-label "y[15] = 99" "${MLP[@]}"
  expect_rank_error $np $last config-json "c.json:" "${MLP[@]}"
  # zdp serve's start-up
  expect_rank_error $np $last config-bad "train_micro_batch_size_per_gpu = 0" "${SERVE[@]}"
  expect_rank_error $np $last init-missing "--init init.safetensors" "${SERVE[@]}" --init init.safetensors
done
# A middle rank, and rank 0 alone.
expect_rank_error 3 1 data-short "fewer than --block-size + 1" "${GPT[@]}"
expect_rank_error 3 0 data-missing "--data: tok.bin: cannot open" "${GPT[@]}"
expect_rank_error 3 0 config-bad "train_micro_batch_size_per_gpu = 0" "${SERVE[@]}"
# --save-weights is written by rank 0 only: its directory is checked there.
expect_rank_error 2 0 outdir-missing "--save-weights out/w.safetensors: out: " "${GPT[@]}" \
  --save-weights out/w.safetensors
expect_rank_error 2 0 outdir-missing "--save-weights out/w.safetensors: out: " "${MLP[@]}" \
  --save-weights out/w.safetensors

# Every rank failing alike: one message, no rank list.
mkdir -p "$T/all"
cp "$G/c.json" "$T/all"/
timeout 60 "$MPIEXEC" -np 3 --oversubscribe -wdir "$T/all" "$ZDP" "${GPT[@]}" >"$T/all/out" 2>&1
rc=$?
[ $rc -eq 124 ] && fail "timed out (hang): data missing on every rank"
[ $rc -eq 0 ] && fail "exit 0 with data missing on every rank"
grep -q "^zdp: error: --data: tok.bin: cannot open" "$T/all/out" ||
  { fail "every rank failing alike: wanted the plain message"; cat "$T/all/out"; }
# Two of three failing alike: the ranks are listed once.
d=$T/two
mkdir -p "$d/0" "$d/1" "$d/2"
cp -r "$G"/. "$d/1"/
cp "$G/c.json" "$d/0"/
cp "$G/c.json" "$d/2"/
timeout 60 "$MPIEXEC" --oversubscribe -np 1 -wdir "$d/0" "$ZDP" "${GPT[@]}" : \
  -np 1 -wdir "$d/1" "$ZDP" "${GPT[@]}" : -np 1 -wdir "$d/2" "$ZDP" "${GPT[@]}" >"$d/out" 2>&1
rc=$?
[ $rc -eq 124 ] && fail "timed out (hang): data missing on ranks 0 and 2"
grep -q "^zdp: error: ranks 0, 2: --data: tok.bin: cannot open" "$d/out" ||
  { fail "ranks 0 and 2 failing: wanted 'ranks 0, 2: '"; cat "$d/out"; }

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "start-up failures on one rank: all passed"
