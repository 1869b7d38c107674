/*
 * step_parts.c -- the parts of a SmolLM2-135M-shaped training step outside
 * the linears, each timed alone: the lm_head's three products (logits, dX,
 * dE), the loss (forward, backward), causal grouped-query attention (forward,
 * backward; one layer), RMSNorm, rotary embeddings and SwiGLU (one layer),
 * with a 1024^3 sgemm split over the pool as the reference, measured between
 * them (docs/benchmarks-llama.md, "What limits it").
 *
 *   step_parts [--reps R] [--layers L] [--part I]   (pool size: ZDP_NUM_THREADS, default 1)
 *   --part I: run only part I (the table's row I, from 0) R times, print nothing (perf)
 *
 * Per part, medians over R repetitions: wall ms, CPU ms (this process, all
 * the pool's threads: CLOCK_PROCESS_CPUTIME_ID), GFLOP/s by the wall and
 * GFLOP per CPU-second (products: their multiply-adds x 2; attention: the
 * step's FLOP count, the full T x T square, as llama_bench counts it), and
 * the part's share of L layers' worth of these parts.  Not a test.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "nn/gemm.h"
#include "nn/nn.h"

static double now_(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static float *vec_(int64_t n, float scale) {
    float *v = malloc((size_t)n * sizeof(float));
    if (v == NULL) {
        fprintf(stderr, "step_parts: out of memory (%lld floats)\n", (long long)n);
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) v[i] = scale * ((float)((i * 7919) % 1000) * 1e-3f - 0.5f);
    return v;
}

enum { B_ = 4, T_ = 256, H_ = 576, NH_ = 9, KV_ = 3, HD_ = 64, FF_ = 1536, V_ = 49152 };
enum { N_ = B_ * T_, MAXREP_ = 99 };

typedef struct bufs_ {
    float *x, *w, *logits, *dx, *dwte, *q, *k, *v, *att, *out, *dq, *dk, *dv, *scratch, *dout;
    float *rstd, *g, *u, *h, *dg, *du, *cs, *sn, *ra, *rb, *rc;
    int32_t *tgt;
} bufs_;

enum {
    P_REF_, P_LOGITS_, P_LOSS_FWD_, P_LOSS_BWD_, P_DX_, P_DE_, P_HEAD_BWD_, P_ATT_FWD_, P_ATT_BWD_,
    P_RMS_FWD_, P_RMS_BWD_, P_ROPE_, P_SWIGLU_FWD_, P_SWIGLU_BWD_, P_COUNT_
};
static const char *names_[P_COUNT_] = {
    "sgemm 1024^3 (reference)", "lm_head logits", "loss forward", "loss backward", "lm_head dX",
    "lm_head dE", "lm_head backward (dX + dE)", "attention forward", "attention backward",
    "RMSNorm forward", "RMSNorm backward", "rope q+k forward", "SwiGLU forward", "SwiGLU backward"};

static void run_(int p, bufs_ *b) {
    switch (p) {
    case P_REF_:
        zdp_nn_sgemm_(CblasNoTrans, CblasNoTrans, 1024, 1024, 1024, 1.0f, b->ra, 1024, b->rb, 1024,
                      0.0f, b->rc, 1024);
        break;
    case P_LOGITS_: zdp_nn_lmhead_forward(b->logits, b->x, b->w, N_, H_, V_); break;
    case P_LOSS_FWD_:
        zdp_nn_softmax_crossentropy_forward(b->logits, b->logits, b->tgt, NULL, NULL, N_, V_);
        break;
    case P_LOSS_BWD_:
        zdp_nn_softmax_crossentropy_backward(b->logits, b->logits, b->tgt, NULL, 1.0f, N_, V_);
        break;
    case P_DX_: zdp_nn_lmhead_backward(b->dx, NULL, b->logits, b->x, b->w, N_, H_, V_); break;
    case P_DE_: zdp_nn_lmhead_backward(NULL, b->dwte, b->logits, b->x, b->w, N_, H_, V_); break;
    case P_HEAD_BWD_:
        zdp_nn_lmhead_backward(b->dx, b->dwte, b->logits, b->x, b->w, N_, H_, V_);
        break;
    case P_ATT_FWD_:
        zdp_nn_gqa_attention_forward(b->out, b->att, b->q, b->k, b->v, B_, T_, NH_, KV_, HD_);
        break;
    case P_ATT_BWD_:
        zdp_nn_gqa_attention_backward(b->dq, b->dk, b->dv, b->scratch, b->dout, b->q, b->k, b->v,
                                      b->att, B_, T_, NH_, KV_, HD_);
        break;
    case P_RMS_FWD_: zdp_nn_rmsnorm_forward(b->out, b->rstd, b->x, b->w, N_, H_, 1e-5f); break;
    case P_RMS_BWD_:
        zdp_nn_rmsnorm_backward(b->dx, b->dwte, b->dout, b->x, b->w, b->rstd, N_, H_);
        break;
    case P_ROPE_:
        zdp_nn_rope_forward(b->q, b->q, b->cs, b->sn, B_, T_, NH_, HD_);
        zdp_nn_rope_forward(b->k, b->k, b->cs, b->sn, B_, T_, KV_, HD_);
        break;
    case P_SWIGLU_FWD_: zdp_nn_swiglu_forward(b->h, b->g, b->u, (int64_t)N_ * FF_); break;
    case P_SWIGLU_BWD_:
        zdp_nn_swiglu_backward(b->dg, b->du, b->h, b->g, b->u, (int64_t)N_ * FF_);
        break;
    default: break;
    }
}

int main(int argc, char **argv) {
    int reps = 5, layers = 30, only = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--part")) only = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "step_parts: unknown option %s (--reps, --layers, --part)\n", argv[i]);
            return 2;
        }
    }
    if (reps < 1 || (only < 0 && reps > MAXREP_) || layers < 1) {
        fprintf(stderr, "step_parts: --reps must be 1-%d and --layers >= 1\n", MAXREP_);
        return 2;
    }
    if (getenv("ZDP_NUM_THREADS") == NULL) setenv("ZDP_NUM_THREADS", "1", 0);
    const int P = zdp_pool_size();
    bufs_ b;
    b.x = vec_((int64_t)N_ * H_, 1.0f), b.w = vec_((int64_t)V_ * H_, 0.05f);
    b.logits = vec_((int64_t)N_ * V_, 1.0f), b.dx = vec_((int64_t)N_ * H_, 1.0f);
    b.dwte = vec_((int64_t)V_ * H_, 0.0f);
    b.q = vec_((int64_t)N_ * NH_ * HD_, 0.2f), b.k = vec_((int64_t)N_ * KV_ * HD_, 0.2f);
    b.v = vec_((int64_t)N_ * KV_ * HD_, 1.0f), b.att = vec_((int64_t)B_ * NH_ * T_ * T_, 0.0f);
    b.out = vec_((int64_t)N_ * NH_ * HD_, 0.0f), b.dq = vec_((int64_t)N_ * NH_ * HD_, 0.0f);
    b.dk = vec_((int64_t)N_ * KV_ * HD_, 0.0f), b.dv = vec_((int64_t)N_ * KV_ * HD_, 0.0f);
    b.scratch = vec_((int64_t)P * T_ * T_, 0.0f), b.dout = vec_((int64_t)N_ * NH_ * HD_, 1.0f);
    b.rstd = vec_(N_, 0.0f), b.g = vec_((int64_t)N_ * FF_, 4.0f), b.u = vec_((int64_t)N_ * FF_, 1.0f);
    b.h = vec_((int64_t)N_ * FF_, 1.0f), b.dg = vec_((int64_t)N_ * FF_, 0.0f);
    b.du = vec_((int64_t)N_ * FF_, 0.0f);
    b.cs = vec_((int64_t)T_ * HD_ / 2, 1.0f), b.sn = vec_((int64_t)T_ * HD_ / 2, 1.0f);
    b.ra = vec_(1024 * 1024, 1.0f), b.rb = vec_(1024 * 1024, 1.0f), b.rc = vec_(1024 * 1024, 0.0f);
    b.tgt = malloc(N_ * sizeof(int32_t));
    for (int n = 0; n < N_; n++) b.tgt[n] = (int32_t)((n * 7919) % V_);
    zdp_nn_gqa_attention_forward(b.out, b.att, b.q, b.k, b.v, B_, T_, NH_, KV_, HD_);

    const double head = 2.0 * N_ * H_ * (double)V_;
    const double att = 4.0 * N_ * (double)T_ * HD_ * NH_; /* forward: scores and weighted sum */
    /* FLOPs (0: none counted) and how many a step of `layers` layers has. */
    const double flops[P_COUNT_] = {2.0 * 1024 * 1024 * 1024, head, 0, 0, head, head, 2 * head,
                                    att, 2 * att, 0, 0, 0, 0, 0};
    const double per_step[P_COUNT_] = {0, 1, 1, 1, 0, 0, 1, layers, layers,
                                       2 * layers + 1, 2 * layers + 1, layers, layers, layers};
    if (only >= 0 && only < P_COUNT_) {
        for (int r = 0; r < reps; r++) run_(only, &b);
        return 0;
    }
    double wall[P_COUNT_][MAXREP_], cpu[P_COUNT_][MAXREP_];
    for (int p = 0; p < P_COUNT_; p++) run_(p, &b); /* warm-up: first touch, the pool */
    for (int r = 0; r < reps; r++)
        for (int p = 0; p < P_COUNT_; p++) {
            const double w0 = now_(CLOCK_MONOTONIC), c0 = now_(CLOCK_PROCESS_CPUTIME_ID);
            run_(p, &b);
            wall[p][r] = now_(CLOCK_MONOTONIC) - w0;
            cpu[p][r] = now_(CLOCK_PROCESS_CPUTIME_ID) - c0;
        }
    double med_w[P_COUNT_], med_c[P_COUNT_], total = 0.0;
    for (int p = 0; p < P_COUNT_; p++) {
        qsort(wall[p], (size_t)reps, sizeof(double), cmp_);
        qsort(cpu[p], (size_t)reps, sizeof(double), cmp_);
        med_w[p] = wall[p][reps / 2], med_c[p] = cpu[p][reps / 2];
        total += per_step[p] * med_w[p];
    }
    printf("# step_parts: threads %d, reps %d, layers %d (medians); gemm mode %d\n", P, reps, layers,
           zdp_nn_gemm_mode());
    printf("| part | wall ms | CPU ms | CPU share | GFLOP/s (wall) | GFLOP per CPU-s | of the reference "
           "(wall) | per step | share of these parts' step time |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int p = 0; p < P_COUNT_; p++) {
        const double gw = flops[p] / med_w[p] * 1e-9, gc = flops[p] / med_c[p] * 1e-9;
        printf("| %s | %.2f | %.2f | %.0f%% | %s%.1f | %s%.1f | %.0f%% | %g | %.1f%% |\n", names_[p],
               1e3 * med_w[p], 1e3 * med_c[p], 100.0 * med_c[p] / (P * med_w[p]),
               flops[p] > 0 ? "" : "(none) ", gw, flops[p] > 0 ? "" : "(none) ", gc,
               flops[p] > 0 ? 100.0 * (flops[p] / med_w[p]) / (flops[0] / med_w[0]) : 0.0,
               per_step[p], 100.0 * per_step[p] * med_w[p] / total);
    }
    printf("# these parts per step: %.1f ms (wall)\n", 1e3 * total);
    return 0;
}
