/*
 * nn_llama.c -- the Llama-family layer kernels (see nn.h for the contracts):
 * token embedding, RMSNorm, rotary embeddings (with their frequency tables),
 * causal grouped-query attention and SwiGLU.
 *
 * The math is transformers' (modeling_llama.py, modeling_qwen3.py,
 * modeling_rope_utils.py), written for row-major fp32; e^x is nn.h's
 * vectorisable zdp_nn_exp_ (2.4e-7 relative).  Attention's matrix
 * products go through zdp_nn_gemm_1_ (cblas_sgemm or zdp's GEMM, by the
 * product's shape and the machine); attention keeps GPT-2's row blocks, so a block of
 * query rows only meets the keys before its end.  Work is split over the
 * thread pool by rows, by (batch, head) or (batch, KV head), or by columns
 * for sums over rows, so results do not depend on the thread count.  Not
 * here: allocation, parameters' storage.
 */
#include "nn.h"

#include <math.h>
#include <string.h>


/* ---- token embedding ---------------------------------------------------------- */

typedef struct tok_job {
    float *out, *dwte;
    const float *wte, *dout;
    const int32_t *inp;
    int64_t N, C;
} tok_job;

static void tok_fwd_rows_(void *ctx, int64_t lo, int64_t hi) {
    const tok_job *j = ctx;
    for (int64_t n = lo; n < hi; n++)
        memcpy(j->out + n * j->C, j->wte + (int64_t)j->inp[n] * j->C, (size_t)j->C * sizeof(float));
}

void zdp_nn_token_embedding_forward(float *out, const int32_t *inp, const float *wte, int64_t N,
                                    int64_t C) {
    tok_job j = {.out = out, .wte = wte, .inp = inp, .N = N, .C = C};
    zdp_nn_parallel_ranges_(N, 16, tok_fwd_rows_, &j);
}

/* By columns: rows with the same token add into the same row of dwte. */
static void tok_bwd_cols_(void *ctx, int64_t lo, int64_t hi) {
    const tok_job *j = ctx;
    for (int64_t n = 0; n < j->N; n++) {
        float *e = j->dwte + (int64_t)j->inp[n] * j->C;
        const float *d = j->dout + n * j->C;
        for (int64_t c = lo; c < hi; c++) e[c] += d[c];
    }
}

void zdp_nn_token_embedding_backward(float *dwte, const float *dout, const int32_t *inp,
                                     int64_t N, int64_t C) {
    tok_job j = {.dwte = dwte, .dout = dout, .inp = inp, .N = N, .C = C};
    zdp_nn_parallel_ranges_(C, 32, tok_bwd_cols_, &j);
}

/* ---- RMSNorm ----------------------------------------------------------------------
 * y = x r w with r = 1 / sqrt(mean(x^2) + eps).  Since dr/dx_j = -r^3 x_j / C,
 * with g = dout * w:  dx = r (g - x r^2 mean(g x)),  dw += dout x r.
 * Sums of squares run in double: C is up to thousands and the variance is
 * what every later output scales by. */

typedef struct rms_job {
    float *out, *rstd, *dinp, *dweight;
    const float *inp, *weight, *dout, *crstd;
    int64_t N, C;
    float eps;
} rms_job;

static void rms_fwd_rows_(void *ctx, int64_t lo, int64_t hi) {
    const rms_job *j = ctx;
    const int64_t C = j->C;
    for (int64_t n = lo; n < hi; n++) {
        const float *x = j->inp + n * C;
        float *o = j->out + n * C;
        const double ss = zdp_nn_dot_d_(x, x, C);
        const float r = (float)(1.0 / sqrt(ss / (double)C + (double)j->eps));
        for (int64_t c = 0; c < C; c++) o[c] = x[c] * r * j->weight[c];
        j->rstd[n] = r;
    }
}

void zdp_nn_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                            int64_t N, int64_t C, float eps) {
    rms_job j = {.out = out, .rstd = rstd, .inp = inp, .weight = weight, .N = N, .C = C,
                 .eps = eps};
    zdp_nn_parallel_ranges_(N, 16, rms_fwd_rows_, &j);
}

/* dinp by rows; dweight (a sum over rows) by columns, rows in order. */
static void rms_bwd_rows_(void *ctx, int64_t lo, int64_t hi) {
    const rms_job *j = ctx;
    const int64_t C = j->C;
    const float *weight = j->weight;
    for (int64_t n = lo; n < hi; n++) {
        const float *x = j->inp + n * C, *d = j->dout + n * C;
        float *dx = j->dinp + n * C;
        const float r = j->crstd[n];
        /* gx = sum of d w x, each term in double, in lanes as zdp_nn_dot_d_ */
        double acc[ZDP_NN_SUM_LANES_] = {0};
        int64_t c = 0;
        for (; c + ZDP_NN_SUM_LANES_ <= C; c += ZDP_NN_SUM_LANES_)
            for (int q = 0; q < ZDP_NN_SUM_LANES_; q++)
                acc[q] += (double)d[c + q] * weight[c + q] * x[c + q];
        for (int q = 0; c < C; c++, q++) acc[q] += (double)d[c] * weight[c] * x[c];
        double gx = 0.0;
        for (int q = 0; q < ZDP_NN_SUM_LANES_; q++) gx += acc[q];
        const float k = (float)(gx / (double)C) * r * r;
        for (c = 0; c < C; c++) dx[c] += r * (d[c] * weight[c] - x[c] * k);
    }
}

static void rms_bwd_cols_(void *ctx, int64_t lo, int64_t hi) {
    const rms_job *j = ctx;
    const int64_t C = j->C;
    for (int64_t n = 0; n < j->N; n++) {
        const float *x = j->inp + n * C, *d = j->dout + n * C;
        const float r = j->crstd[n];
        for (int64_t c = lo; c < hi; c++) j->dweight[c] += d[c] * x[c] * r;
    }
}

void zdp_nn_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int64_t N, int64_t C) {
    rms_job j = {.dinp = dinp, .dweight = dweight, .dout = dout, .inp = inp, .weight = weight,
                 .crstd = rstd, .N = N, .C = C};
    zdp_nn_parallel_ranges_(N, 16, rms_bwd_rows_, &j);
    zdp_nn_parallel_ranges_(C, 32, rms_bwd_cols_, &j);
}

/* ---- rotary embeddings ---------------------------------------------------------------
 * transformers' rotate_half convention: a head's channels i and i + hd/2
 * form a pair rotated by the angle t * inv_freq[i]:
 *   out[i]        = x[i] cos - x[i + hd/2] sin
 *   out[i + hd/2] = x[i + hd/2] cos + x[i] sin
 * The backward is the rotation by -angle (the transpose). */

double zdp_nn_rope_inv_freq(int i, int head_dim, double theta, int rope_type, double factor,
                            double low_freq_factor, double high_freq_factor,
                            int original_max_position) {
    const double base = 1.0 / pow(theta, (double)(2 * i) / (double)head_dim);
    if (rope_type == 1) return base / factor; /* linear: positions divided by factor */
    if (rope_type != 2) return base;
    /* llama3: wavelengths shorter than original / high_freq_factor keep their
     * frequency, longer than original / low_freq_factor are divided by
     * factor, and the band between interpolates smoothly. */
    const double wavelen = 6.283185307179586 / base;
    const double old_len = (double)original_max_position;
    if (wavelen < old_len / high_freq_factor) return base;
    if (wavelen > old_len / low_freq_factor) return base / factor;
    const double smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    return (1.0 - smooth) * base / factor + smooth * base;
}

void zdp_nn_rope_tables(float *cos_t, float *sin_t, int T, int head_dim, double theta,
                        int rope_type, double factor, double low_freq_factor,
                        double high_freq_factor, int original_max_position) {
    const int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        const double f = zdp_nn_rope_inv_freq(i, head_dim, theta, rope_type, factor,
                                              low_freq_factor, high_freq_factor,
                                              original_max_position);
        for (int t = 0; t < T; t++) {
            cos_t[(int64_t)t * half + i] = (float)cos((double)t * f);
            sin_t[(int64_t)t * half + i] = (float)sin((double)t * f);
        }
    }
}

typedef struct rope_job {
    float *out;
    const float *inp, *cos_t, *sin_t;
    int64_t T, nh, hd;
    float sign;
} rope_job;

/* Rotates every head of rows [lo, hi) of (B*T, nh, hd) by sign * angle. */
static void rope_rows_(void *ctx, int64_t lo, int64_t hi) {
    const rope_job *j = ctx;
    const int64_t half = j->hd / 2;
    for (int64_t bt = lo; bt < hi; bt++) {
        const int64_t t = bt % j->T;
        const float *c = j->cos_t + t * half, *s = j->sin_t + t * half;
        for (int64_t h = 0; h < j->nh; h++) {
            const int64_t off = (bt * j->nh + h) * j->hd;
            const float *x = j->inp + off;
            float *o = j->out + off;
            for (int64_t i = 0; i < half; i++) {
                const float x1 = x[i], x2 = x[i + half], si = j->sign * s[i];
                o[i] = x1 * c[i] - x2 * si;
                o[i + half] = x2 * c[i] + x1 * si;
            }
        }
    }
}

static void rope_apply_(float *out, const float *inp, const float *cos_t, const float *sin_t,
                        int64_t B, int64_t T, int64_t nh, int64_t hd, float sign) {
    rope_job j = {.out = out, .inp = inp, .cos_t = cos_t, .sin_t = sin_t, .T = T, .nh = nh,
                  .hd = hd, .sign = sign};
    zdp_nn_parallel_ranges_(B * T, 16, rope_rows_, &j);
}

void zdp_nn_rope_forward(float *out, const float *inp, const float *cos_t, const float *sin_t,
                         int64_t B, int64_t T, int64_t nh, int64_t hd) {
    rope_apply_(out, inp, cos_t, sin_t, B, T, nh, hd, 1.0f);
}

void zdp_nn_rope_backward(float *dinp, const float *dout, const float *cos_t, const float *sin_t,
                          int64_t B, int64_t T, int64_t nh, int64_t hd) {
    rope_apply_(dinp, dout, cos_t, sin_t, B, T, nh, hd, -1.0f);
}

/* ---- causal grouped-query attention ---------------------------------------------------
 *
 * Query head h reads KV head h / (NH / KV) (transformers' repeat_kv).  For
 * one (b, h): Q (T, hd) a view into q with row stride NH*hd, K and V views
 * into k and v with row stride KV*hd, A = att[b,h] (T, T).  Query rows run
 * in blocks [r0, r1) of ZDP_NN_ATTN_BLOCK that meet keys [0, r1) only.
 *   S = Q K^T / sqrt(hd);  A = softmax over s <= t;  out = A V
 *   dA = dout V^T;  dS = A * (dA - rowsum(A * dA)) / sqrt(hd)
 *   dQ = dS K;  dK += dS^T Q;  dV += A^T dout  (summed over the group's query heads) */

/* row (n) <- softmax(scale * row).  The scale is applied here, not as the
 * score product's alpha: zdp's GEMM takes alpha 1 only.  One rounding
 * either way (cblas_sgemm's alpha multiplies the finished sum), so the
 * probabilities are cblas's with alpha. */
static void softmax_causal_row_(float *row, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) row[i] *= scale;
    const float m = zdp_nn_max_(row, n);
    /* Exponentials first (a loop that vectorises), then the sum in order. */
    for (int64_t i = 0; i < n; i++) row[i] = zdp_nn_exp_(row[i] - m);
    const float inv = (float)(1.0 / zdp_nn_sum_d_(row, n));
    for (int64_t i = 0; i < n; i++) row[i] *= inv;
}

typedef struct gqa_job {
    float *out, *att, *dq, *dk, *dv, *scratch;
    const float *q, *k, *v, *dout, *catt;
    int64_t B, T, NH, KV, hd;
} gqa_job;

/* One (b, h) of the forward: task = b * NH + h. */
static void gqa_fwd_task_(void *ctx, int64_t task, int thread) {
    (void)thread;
    const gqa_job *j = ctx;
    const int64_t T = j->T, NH = j->NH, hd = j->hd;
    const int64_t QD = NH * hd, KD = j->KV * hd, rep = NH / j->KV;
    const int64_t b = task / NH, h = task % NH;
    const float scale = 1.0f / sqrtf((float)hd);
    const float *Q = j->q + b * T * QD + h * hd;
    const float *K = j->k + b * T * KD + (h / rep) * hd, *Vv = j->v + b * T * KD + (h / rep) * hd;
    float *A = j->att + task * T * T;
    float *o = j->out + b * T * QD + h * hd;
    for (int64_t r0 = 0; r0 < T; r0 += ZDP_NN_ATTN_BLOCK) {
        const int64_t r1 = r0 + ZDP_NN_ATTN_BLOCK < T ? r0 + ZDP_NN_ATTN_BLOCK : T;
        /* A[r0:r1, 0:r1] = Q[r0:r1] @ K[0:r1]^T (scaled in the softmax) */
        zdp_nn_gemm_1_(CblasNoTrans, CblasTrans, r1 - r0, r1, hd, Q + r0 * QD, QD, K, KD, 0,
                       A + r0 * T, T);
        for (int64_t t = r0; t < r1; t++) {
            float *row = A + t * T;
            softmax_causal_row_(row, t + 1, scale);
            for (int64_t s = t + 1; s < r1; s++) row[s] = 0.0f;
        }
        /* out[r0:r1] = A[r0:r1, 0:r1] @ V[0:r1] */
        zdp_nn_gemm_1_(CblasNoTrans, CblasNoTrans, r1 - r0, hd, r1, A + r0 * T, T, Vv, KD, 0,
                       o + r0 * QD, QD);
    }
}

void zdp_nn_gqa_attention_forward(float *out, float *att, const float *q, const float *k,
                                  const float *v, int64_t B, int64_t T, int64_t NH, int64_t KV,
                                  int64_t hd) {
    gqa_job j = {.out = out, .att = att, .q = q, .k = k, .v = v, .B = B, .T = T, .NH = NH,
                 .KV = KV, .hd = hd};
    zdp_nn_gemm_settle_();
    zdp_pool_run(B * NH, gqa_fwd_task_, &j);
}

/* One (b, KV head g) of the backward: its query heads in order, since they
 * all add into g's dK and dV; task = b * KV + g. */
static void gqa_bwd_task_(void *ctx, int64_t task, int thread) {
    const gqa_job *j = ctx;
    const int64_t T = j->T, NH = j->NH, KV = j->KV, hd = j->hd;
    const int64_t QD = NH * hd, KD = KV * hd, rep = NH / KV;
    const int64_t b = task / KV, g = task % KV;
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t kvo = b * T * KD + g * hd;
    const float *K = j->k + kvo, *Vv = j->v + kvo;
    float *dK = j->dk + kvo, *dV = j->dv + kvo;
    float *dA = j->scratch + (int64_t)thread * T * T;
    /* A KV head collects from all of its query heads: start from zero, add. */
    for (int64_t t = 0; t < T; t++) {
        memset(dK + t * KD, 0, (size_t)hd * sizeof(float));
        memset(dV + t * KD, 0, (size_t)hd * sizeof(float));
    }
    for (int64_t h = g * rep; h < (g + 1) * rep; h++) {
        const float *Q = j->q + b * T * QD + h * hd;
        float *dQ = j->dq + b * T * QD + h * hd;
        const float *A = j->catt + (b * NH + h) * T * T;
        const float *dO = j->dout + b * T * QD + h * hd;
        for (int64_t r0 = 0; r0 < T; r0 += ZDP_NN_ATTN_BLOCK) {
            const int64_t r1 = r0 + ZDP_NN_ATTN_BLOCK < T ? r0 + ZDP_NN_ATTN_BLOCK : T;
            /* dA[r0:r1, 0:r1] = dO[r0:r1] @ V[0:r1]^T */
            zdp_nn_gemm_1_(CblasNoTrans, CblasTrans, r1 - r0, r1, hd, dO + r0 * QD, QD, Vv, KD, 0,
                           dA + r0 * T, T);
            /* dV[0:r1] += A[r0:r1, 0:r1]^T @ dO[r0:r1] */
            zdp_nn_gemm_1_(CblasTrans, CblasNoTrans, r1, hd, r1 - r0, A + r0 * T, T, dO + r0 * QD,
                           QD, 1, dV, KD);
            /* Softmax backward, scale folded in: dA becomes dS. */
            for (int64_t t = r0; t < r1; t++) {
                const float *p = A + t * T;
                float *d = dA + t * T;
                const double rs = zdp_nn_dot_d_(p, d, t + 1);
                for (int64_t s = 0; s <= t; s++) d[s] = scale * p[s] * (d[s] - (float)rs);
                for (int64_t s = t + 1; s < r1; s++) d[s] = 0.0f;
            }
            /* dQ[r0:r1] = dS[r0:r1, 0:r1] @ K[0:r1] */
            zdp_nn_gemm_1_(CblasNoTrans, CblasNoTrans, r1 - r0, hd, r1, dA + r0 * T, T, K, KD, 0,
                           dQ + r0 * QD, QD);
            /* dK[0:r1] += dS[r0:r1, 0:r1]^T @ Q[r0:r1] */
            zdp_nn_gemm_1_(CblasTrans, CblasNoTrans, r1, hd, r1 - r0, dA + r0 * T, T, Q + r0 * QD,
                           QD, 1, dK, KD);
        }
    }
}

void zdp_nn_gqa_attention_backward(float *dq, float *dk, float *dv, float *scratch,
                                   const float *dout, const float *q, const float *k,
                                   const float *v, const float *att, int64_t B, int64_t T,
                                   int64_t NH, int64_t KV, int64_t hd) {
    gqa_job j = {.dq = dq, .dk = dk, .dv = dv, .scratch = scratch, .dout = dout, .q = q,
                 .k = k, .v = v, .catt = att, .B = B, .T = T, .NH = NH, .KV = KV, .hd = hd};
    zdp_nn_gemm_settle_();
    zdp_pool_run(B * KV, gqa_bwd_task_, &j);
}

/* ---- SwiGLU ----------------------------------------------------------------------------
 * out = silu(g) u with silu(g) = g sigmoid(g);  silu'(g) = s (1 + g (1 - s)). */

typedef struct swiglu_job {
    float *out, *dgate, *dup;
    const float *gate, *up, *dout;
} swiglu_job;

static void swiglu_fwd_range_(void *ctx, int64_t lo, int64_t hi) {
    const swiglu_job *j = ctx;
    for (int64_t i = lo; i < hi; i++) {
        const float g = j->gate[i];
        j->out[i] = g / (1.0f + zdp_nn_exp_(-g)) * j->up[i];
    }
}

void zdp_nn_swiglu_forward(float *out, const float *gate, const float *up, int64_t N) {
    swiglu_job j = {.out = out, .gate = gate, .up = up};
    zdp_nn_parallel_ranges_(N, 4096, swiglu_fwd_range_, &j);
}

static void swiglu_bwd_range_(void *ctx, int64_t lo, int64_t hi) {
    const swiglu_job *j = ctx;
    for (int64_t i = lo; i < hi; i++) {
        const float g = j->gate[i], d = j->dout[i]; /* read first: dgate may alias dout */
        const float s = 1.0f / (1.0f + zdp_nn_exp_(-g));
        j->dup[i] = d * g * s;
        j->dgate[i] = d * j->up[i] * s * (1.0f + g * (1.0f - s));
    }
}

void zdp_nn_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, int64_t N) {
    swiglu_job j = {.dgate = dgate, .dup = dup, .dout = dout, .gate = gate, .up = up};
    zdp_nn_parallel_ranges_(N, 4096, swiglu_bwd_range_, &j);
}
