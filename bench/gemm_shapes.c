/*
 * gemm_shapes.c -- how fast zdp's kernels run every matrix product of one
 * training step of a model, each against the square sgemm peak measured in
 * the same run: what the products alone allow the step's MFU to reach
 * (docs/benchmarks-llama.md, "What limits it").
 *
 *   gemm_shapes [--model smollm2|gpt-m|gpt-s] [--rows N] [--reps R]
 *
 * Per product (forward: the linears of one layer and the lm_head; backward:
 * zdp_nn_linear_backward's dX and dW pair, or GPT-2's), the median over R
 * repetitions of GFLOP per CPU-second of this process (all the pool's
 * threads; clock_gettime(CLOCK_PROCESS_CPUTIME_ID)), so a shared machine's
 * load mostly drops out; and the same for a 1024^3 cblas_sgemm split over
 * the pool (the reference, measured between the products).  The last line:
 * the step's products at those rates, as a fraction of the reference --
 * the MFU the step would reach if everything else (attention's T x T
 * products included) were free.  Each product twice per repetition,
 * alternating which goes first: through cblas_sgemm (ZDP_GEMM=blas) and
 * as training runs it (ZDP_GEMM=auto: src/nn/gemm.c where it wins).  The pool's
 * size: ZDP_NUM_THREADS (default 1).  A second table: the same runs by the
 * wall clock (GFLOP/s, medians) and the CPU share (CPU seconds / (threads x
 * wall seconds)): whether the pool's threads all computed through each
 * product (1.00) or one waited (a late worker, the machine's other load),
 * which per-CPU-second rates cannot show.  Not a test.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "nn/gemm.h"
#include "nn/nn.h"

static double cpu_s_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double wall_s_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static float *vec_(int64_t n) {
    float *v = malloc((size_t)n * sizeof(float));
    if (v == NULL) {
        fprintf(stderr, "gemm_shapes: out of memory (%lld floats)\n", (long long)n);
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) v[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    return v;
}

/* One linear of the model: inp (N, C) -> out (N, OC); count: how many a step has. */
typedef struct shape_ {
    const char *name;
    int64_t C, OC, count;
    int gpt; /* GPT-2's layout (weight (C, OC)) */
} shape_;

int main(int argc, char **argv) {
    const char *model = "smollm2";
    int64_t N = 1024;
    int reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--rows")) N = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "gemm_shapes: unknown option %s (--model, --rows, --reps)\n", argv[i]);
            return 2;
        }
    }
    if (reps < 1 || reps > 99 || N < 1) {
        fprintf(stderr, "gemm_shapes: --reps must be 1-99 and --rows >= 1\n");
        return 2;
    }
    if (getenv("ZDP_NUM_THREADS") == NULL) setenv("ZDP_NUM_THREADS", "1", 0);
    /* SmolLM2-135M: 30 layers, hidden 576, q 576, k/v 192, FFN 1536, vocab 49152.
     * gpt-m (bench/run_gpt_bench.sh): 6 layers, C 384, vocab 256. */
    const shape_ llama[] = {{"q_proj/o_proj", 576, 576, 60, 0},  {"k_proj/v_proj", 576, 192, 60, 0},
                            {"gate/up", 576, 1536, 60, 0},       {"down", 1536, 576, 30, 0},
                            {"lm_head", 576, 49152, 1, 0}};
    const shape_ gpt[] = {{"c_attn", 384, 1152, 6, 1}, {"attn c_proj", 384, 384, 6, 1},
                          {"c_fc", 384, 1536, 6, 1},   {"mlp c_proj", 1536, 384, 6, 1},
                          {"lm_head", 384, 256, 1, 0}};
    /* gpt-s: 4 layers, C 256, vocab 256. */
    const shape_ gpt_s[] = {{"c_attn", 256, 768, 4, 1}, {"attn c_proj", 256, 256, 4, 1},
                            {"c_fc", 256, 1024, 4, 1},   {"mlp c_proj", 1024, 256, 4, 1},
                            {"lm_head", 256, 256, 1, 0}};
    const int small = !strcmp(model, "gpt-s"), is_gpt = small || !strcmp(model, "gpt-m");
    if (!is_gpt && strcmp(model, "smollm2") != 0) {
        fprintf(stderr, "gemm_shapes: --model is smollm2, gpt-m or gpt-s, not %s\n", model);
        return 2;
    }
    const shape_ *sh = small ? gpt_s : is_gpt ? gpt : llama;
    const int ns = 5;
    printf("# gemm_shapes: model %s, rows %lld, threads %d, reps %d (medians, GFLOP per CPU-second)\n",
           model, (long long)N, zdp_pool_size(), reps);
    /* Kernels: [0] cblas_sgemm for every product (ZDP_GEMM=blas), [1] what
     * training uses (ZDP_GEMM=auto: gemm.c where it wins, cblas elsewhere);
     * alternating within each repetition, each first in turn. */
    const int saved_mode = zdp_nn_gemm_mode();
    double ref_all[99 * 5], t_step[2] = {0}, t_best[2] = {0}, t_ref_step = 0.0;
    double fm_[2][5], bm_[2][5], fb_[2][5], bb_[2][5];
    double fw_[2][5], bw_[2][5], fs_[2][5], bs_[2][5]; /* wall GFLOP/s and CPU share, medians */
    double refw_all[99 * 5], t_wall[2] = {0};
    int nref = 0;
    const int64_t S = 1024;
    float *ra = vec_(S * S), *rb = vec_(S * S), *rc = vec_(S * S);
    for (int s = 0; s < ns; s++) {
        const int64_t C = sh[s].C, OC = sh[s].OC;
        float *inp = vec_(N * C), *w = vec_(OC * C), *out = vec_(N * OC), *dout = vec_(N * OC);
        float *dinp = vec_(N * C), *dw = vec_(OC * C);
        double f[2][99], b[2][99], fw[2][99], bw[2][99], fs[2][99], bs[2][99];
        for (int r = 0; r < reps; r++) {
            zdp_nn_gemm_use_mode(0);
            double c0 = cpu_s_(), w0 = wall_s_();
            zdp_nn_sgemm_(CblasNoTrans, CblasNoTrans, S, S, S, 1.0f, ra, S, rb, S, 0.0f, rc, S);
            double c1 = cpu_s_();
            refw_all[nref] = 2.0 * (double)S * S * S / (wall_s_() - w0) * 1e-9;
            ref_all[nref++] = 2.0 * (double)S * S * S / (c1 - c0) * 1e-9;
            for (int q = 0; q < 2; q++) {
                const int kern = (r + q) % 2; /* alternate which goes first */
                zdp_nn_gemm_use_mode(kern == 0 ? 0 : 1);
                c1 = cpu_s_();
                const double w1 = wall_s_();
                if (sh[s].gpt) zdp_nn_matmul_forward(out, inp, w, NULL, N, C, OC);
                else zdp_nn_linear_forward(out, inp, w, NULL, N, C, OC, 0);
                double c2 = cpu_s_();
                const double w2 = wall_s_();
                if (sh[s].gpt) zdp_nn_matmul_backward(dinp, dw, NULL, dout, inp, w, N, C, OC);
                else zdp_nn_linear_backward(dinp, dw, NULL, dout, inp, w, N, C, OC, 0);
                double c3 = cpu_s_();
                const double w3 = wall_s_();
                f[kern][r] = 2.0 * (double)N * C * OC / (c2 - c1) * 1e-9;
                b[kern][r] = 4.0 * (double)N * C * OC / (c3 - c2) * 1e-9;
                fw[kern][r] = 2.0 * (double)N * C * OC / (w2 - w1) * 1e-9;
                bw[kern][r] = 4.0 * (double)N * C * OC / (w3 - w2) * 1e-9;
                fs[kern][r] = (c2 - c1) / ((double)zdp_pool_size() * (w2 - w1));
                bs[kern][r] = (c3 - c2) / ((double)zdp_pool_size() * (w3 - w2));
            }
        }
        t_ref_step += (double)sh[s].count * 6.0 * (double)N * C * OC;
        for (int kern = 0; kern < 2; kern++) {
            qsort(f[kern], (size_t)reps, sizeof(double), cmp_);
            qsort(b[kern], (size_t)reps, sizeof(double), cmp_);
            qsort(fw[kern], (size_t)reps, sizeof(double), cmp_);
            qsort(bw[kern], (size_t)reps, sizeof(double), cmp_);
            qsort(fs[kern], (size_t)reps, sizeof(double), cmp_);
            qsort(bs[kern], (size_t)reps, sizeof(double), cmp_);
            fw_[kern][s] = fw[kern][reps / 2], bw_[kern][s] = bw[kern][reps / 2];
            fs_[kern][s] = fs[kern][reps / 2], bs_[kern][s] = bs[kern][reps / 2];
            t_wall[kern] += (double)sh[s].count * (2.0 * (double)N * C * OC / fw_[kern][s] +
                                                  4.0 * (double)N * C * OC / bw_[kern][s]);
            const double fm = f[kern][reps / 2], bm = b[kern][reps / 2];
            /* The step's time in these products, at these rates (6 N C OC FLOPs each). */
            t_step[kern] += (double)sh[s].count * (2.0 * (double)N * C * OC / fm + 4.0 * (double)N * C * OC / bm);
            fm_[kern][s] = fm, bm_[kern][s] = bm, fb_[kern][s] = f[kern][reps - 1], bb_[kern][s] = b[kern][reps - 1];
            t_best[kern] += (double)sh[s].count * (2.0 * (double)N * C * OC / fb_[kern][s] +
                                                  4.0 * (double)N * C * OC / bb_[kern][s]);
        }
        free(inp), free(w), free(out), free(dout), free(dinp), free(dw);
    }
    zdp_nn_gemm_use_mode(saved_mode);
    qsort(ref_all, (size_t)nref, sizeof(double), cmp_);
    const double ref = ref_all[nref / 2];
    const double ref_best = ref_all[nref - 1];
    printf("| product | M x N x K | kernel | forward median (best) | backward (dX + dW) median (best) | "
           "forward median / ref median | backward median / ref median |\n");
    printf("|---|---|---|---|---|---|---|\n");
    const char *kname[2] = {"cblas", "auto (gemm.c)"};
    for (int s = 0; s < ns; s++)
        for (int kern = 0; kern < 2; kern++)
            printf("| %s | %lld x %lld x %lld | %s | %.1f (%.1f) | %.1f (%.1f) | %.0f%% | %.0f%% |\n",
                   sh[s].name, (long long)N, (long long)sh[s].OC, (long long)sh[s].C, kname[kern],
                   fm_[kern][s], fb_[kern][s], bm_[kern][s], bb_[kern][s],
                   100.0 * fm_[kern][s] / ref, 100.0 * bm_[kern][s] / ref);
    printf("# reference: 1024^3 cblas_sgemm over the pool, median %.1f, best %.1f GFLOP per CPU-second\n",
           ref, ref_best);
    for (int kern = 0; kern < 2; kern++) {
        printf("# %s: the step's products at their best rates: %.1f GFLOP per CPU-second = %.1f%% of the "
               "best reference\n", kname[kern], t_ref_step / t_best[kern],
               100.0 * t_ref_step / t_best[kern] / ref_best);
        printf("# %s: the step's products at their median rates: %.1f GFLOP per CPU-second = %.1f%% of the "
               "median reference (the MFU ceiling if nothing else took time)\n",
               kname[kern], t_ref_step / t_step[kern], 100.0 * t_ref_step / t_step[kern] / ref);
    }
    qsort(refw_all, (size_t)nref, sizeof(double), cmp_);
    const double refw = refw_all[nref / 2];
    printf("\n| product | kernel | forward GFLOP/s (wall) | backward GFLOP/s (wall) | CPU share forward | CPU share "
           "backward |\n|---|---|---|---|---|---|\n");
    for (int s = 0; s < ns; s++)
        for (int kern = 0; kern < 2; kern++)
            printf("| %s | %s | %.1f | %.1f | %.2f | %.2f |\n", sh[s].name, kern == 0 ? "cblas" : "auto (gemm.c)",
                   fw_[kern][s], bw_[kern][s], fs_[kern][s], bs_[kern][s]);
    printf("# wall clock: reference median %.1f GFLOP/s; the step's products at their median wall rates: cblas %.1f "
           "(%.1f%%), auto %.1f (%.1f%%)\n", refw, t_ref_step / t_wall[0], 100.0 * t_ref_step / t_wall[0] / refw,
           t_ref_step / t_wall[1], 100.0 * t_ref_step / t_wall[1] / refw);
    free(ra), free(rb), free(rc);
    return 0;
}
