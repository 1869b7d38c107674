#!/usr/bin/env bash
# Where zdp stands on each kind of CPU (docs/benchmarks.md, "Where zdp
# stands"): training -- the GPT benchmark's gpt-s and gpt-m and the Llama
# benchmark's SmolLM2-135M shape, at 2 ranks x 1 thread and 1 rank x 2
# threads -- and sampling -- gpt-m and SmolLM2-135M, a 64-token prompt, 64
# new tokens, batch 1 and 32, 2 threads -- each as zdp's default, zdp with
# ZDP_GEMM=blas (every product through the BLAS) and PyTorch, alternating
# within each repetition; medians.  One machine imitates three kinds:
#   avx512    the machine as it is (AVX-512 only if it has it)
#   avx2      a CPU with AVX2+FMA and no AVX-512: a -march=haswell build,
#             ZDP_GEMM_ISA=1, OpenBLAS's Haswell kernels, PyTorch's AVX2
#             kernels (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA)
#   portable  no zdp SIMD path (as on ARM): ZDP_GEMM_ISA=0; the BLAS and
#             PyTorch keep their own
# usage: bench/run_cpu_kinds.sh [REPS]      (default 3)
# env:   KINDS=avx512,avx2,portable PARTS=gpt,llama,sample OUT=build/bench-kinds
#        LLAMA_REPS (default REPS); TRAIN_BLAS=0 leaves ZDP_GEMM=blas out of the
#        training parts (off the AVX-512 path it runs the default's code:
#        every product already goes to the BLAS)
# Then: python3 bench/kinds_table.py OUT prints the tables.
# Needs PyTorch for /usr/bin/python3 (bench/setup_torch.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
OUT=${OUT:-build/bench-kinds}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
source scripts/env.sh
IFS=, read -r -a kinds <<<"${KINDS:-avx512,avx2,portable}"
IFS=, read -r -a parts <<<"${PARTS:-gpt,llama,sample}"
gpt_impls=zdp2,zdp2blas,torch llama_impls=zdp,zdpblas,torch
if [ "${TRAIN_BLAS:-1}" = 0 ]; then gpt_impls=zdp2,torch llama_impls=zdp,torch; fi

for kind in "${kinds[@]}"; do
  case $kind in
    avx512|portable)
      build=build-bench
      cmake -S . -B $build -DCMAKE_BUILD_TYPE=Release -DZDP_NATIVE=ON -DCMAKE_C_FLAGS= \
        -DZDP_BUILD_TESTS=OFF -DZDP_BUILD_BENCH=ON >/dev/null
      kind_env=()
      [ "$kind" = portable ] && kind_env=(ZDP_GEMM_ISA=0) ;;
    avx2)
      build=build-bench-haswell
      cmake -S . -B $build -DCMAKE_BUILD_TYPE=Release -DZDP_NATIVE=OFF -DCMAKE_C_FLAGS=-march=haswell \
        -DZDP_BUILD_TESTS=OFF -DZDP_BUILD_BENCH=ON >/dev/null
      kind_env=(ZDP_GEMM_ISA=1 OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2) ;;
    *) echo "run_cpu_kinds: unknown kind '$kind' (avx512, avx2, portable)" >&2; exit 2 ;;
  esac
  cmake --build $build -j"$(nproc)" --target zdp_cli llama_bench bench_sample optim_bench >/dev/null
  echo "== $kind: ${kind_env[*]:-(no pins)}, $build"
  for part in "${parts[@]}"; do
    case $part in
      gpt)
        env "${kind_env[@]}" BUILD=$build MODELS=gpt-s,gpt-m NPS=1,2 IMPLS=$gpt_impls \
          JSON="$OUT/$kind-gpt.json" bash bench/run_gpt_bench.sh "$REPS" 6 | tee "$OUT/$kind-gpt.txt" ;;
      llama)
        env "${kind_env[@]}" BUILD=$build LAYOUTS=2x1,1x2 IMPLS=$llama_impls \
          JSON="$OUT/$kind-llama.json" bash bench/run_llama_bench.sh "${LLAMA_REPS:-$REPS}" 3 | tee "$OUT/$kind-llama.txt" ;;
      sample)
        : >"$OUT/$kind-sample.txt"
        for rep in $(seq "$REPS"); do
          for model in gpt-m smollm2; do
            for B in 1 32; do
              for impl in zdp blas torch; do
                case $impl in
                  zdp|blas)
                    env "${kind_env[@]}" OPENBLAS_NUM_THREADS=2 ZDP_NUM_THREADS=2 \
                      $([ $impl = blas ] && echo ZDP_GEMM=blas) \
                      $build/bin/bench_sample --model $model --prompt 64 --new 64 --batch $B --reps 2 |
                      sed "s/^/impl=$impl /" ;;
                  torch)
                    env "${kind_env[@]}" OPENBLAS_NUM_THREADS=2 /usr/bin/python3 bench/torch/sample_torch.py \
                      --model $model --prompt 64 --new 64 --batch $B --reps 2 --threads 2 ;;
                esac
              done
            done
          done
        done | tee -a "$OUT/$kind-sample.txt" ;;
      *) echo "run_cpu_kinds: unknown part '$part' (gpt, llama, sample)" >&2; exit 2 ;;
    esac
  done
done
