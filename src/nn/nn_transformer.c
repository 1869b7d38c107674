/*
 * nn_transformer.c -- the GPT-2 layer kernels (see nn.h for the contracts).
 *
 * Every matrix product goes through cblas_sgemm or zdp's GEMM (gemm.c, on
 * the shapes where zdp_nn_gemm_wins_ says it beats the BLAS) on row-major data, attention
 * included (per batch row and head: QK^T, att @ V and their backward, each
 * whole on one thread: zdp_nn_gemm_1_).  The
 * element-wise loops (softmax, GELU, LayerNorm) are written so that GCC can
 * vectorise them at -O3 without -ffast-math: exp is a polynomial with an
 * exponent-bit scale instead of a libm call, and float sums keep eight partial
 * sums.  Work is split over the thread pool by rows (element-wise kernels,
 * matmuls), by (batch, head) (attention) or by columns (sums over rows: bias
 * and LayerNorm gradients, embedding scatters), never inside one sum.  Not
 * here: allocation, anything about parameters' storage.
 */
#include "nn.h"

#include <math.h>
#include <string.h>

/* ---- vectorisable helpers ---------------------------------------------------- */

/* Sum of x[0..n) with eight partial sums (GCC vectorises this without
 * -fassociative-math, which a single running sum would need). */
static inline float sum_(const float *x, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += x[i + j];
    float s = 0.0f;
    for (; i < n; i++) s += x[i];
    for (int j = 0; j < 8; j++) s += acc[j];
    return s;
}

static inline float dot_(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0.0f;
    for (; i < n; i++) s += a[i] * b[i];
    for (int j = 0; j < 8; j++) s += acc[j];
    return s;
}

/* In place: x[0..n) = softmax(x[0..n)); returns the sum of exponentials
 * (before normalisation) and the max in *maxv. */
static inline float softmax_inplace_(float *x, int64_t n, float *maxv) {
    const float m = zdp_nn_max_(x, n);
    for (int64_t i = 0; i < n; i++) x[i] = zdp_nn_exp_(x[i] - m);
    const float s = sum_(x, n);
    const float inv = 1.0f / s;
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
    *maxv = m;
    return s;
}

/* ---- embedding ---------------------------------------------------------------- */

typedef struct emb_job {
    float *out, *dwte, *dwpe;
    const float *wte, *wpe, *dout;
    const int32_t *inp;
    int64_t T, C, N;
} emb_job;

static void emb_fwd_rows_(void *ctx, int64_t lo, int64_t hi) {
    const emb_job *j = ctx;
    const int64_t C = j->C;
    for (int64_t n = lo; n < hi; n++) {
        float *o = j->out + n * C;
        const float *e = j->wte + (int64_t)j->inp[n] * C, *p = j->wpe + (n % j->T) * C;
        for (int64_t c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

void zdp_nn_embedding_forward(float *out, const int32_t *inp, const float *wte, const float *wpe,
                              int64_t B, int64_t T, int64_t C) {
    emb_job j = {.out = out, .wte = wte, .wpe = wpe, .inp = inp, .T = T, .C = C};
    zdp_nn_parallel_ranges_(B * T, 16, emb_fwd_rows_, &j);
}

/* Columns [lo, hi) of every row, rows in order: two rows with the same
 * token (or position) add into the same gradient row, so the split is by
 * columns, and each element sums in the serial order. */
static void emb_bwd_cols_(void *ctx, int64_t lo, int64_t hi) {
    const emb_job *j = ctx;
    const int64_t C = j->C;
    for (int64_t n = 0; n < j->N; n++) {
        const float *d = j->dout + n * C;
        if (j->dwte != NULL) {
            float *e = j->dwte + (int64_t)j->inp[n] * C;
            for (int64_t c = lo; c < hi; c++) e[c] += d[c];
        }
        if (j->dwpe != NULL) {
            float *p = j->dwpe + (n % j->T) * C;
            for (int64_t c = lo; c < hi; c++) p[c] += d[c];
        }
    }
}

void zdp_nn_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                               int64_t B, int64_t T, int64_t C) {
    emb_job j = {.dwte = dwte, .dwpe = dwpe, .dout = dout, .inp = inp, .T = T, .C = C,
                 .N = B * T};
    zdp_nn_parallel_ranges_(C, 32, emb_bwd_cols_, &j);
}

/* ---- layernorm (torch.nn.LayerNorm, eps 1e-5) ------------------------------------ */

typedef struct ln_job {
    float *out, *mean, *rstd, *dinp, *dweight, *dbias;
    const float *inp, *weight, *bias, *dout, *cmean, *crstd;
    int64_t N, C;
} ln_job;

static void ln_fwd_rows_(void *ctx, int64_t lo, int64_t hi) {
    const ln_job *j = ctx;
    const int64_t C = j->C;
    const float *weight = j->weight, *bias = j->bias;
    for (int64_t n = lo; n < hi; n++) {
        const float *x = j->inp + n * C;
        float *o = j->out + n * C;
        const float m = sum_(x, C) / (float)C;
        float acc[8] = {0}, v = 0.0f;
        int64_t i = 0;
        for (; i + 8 <= C; i += 8)
            for (int k = 0; k < 8; k++) acc[k] += (x[i + k] - m) * (x[i + k] - m);
        for (; i < C; i++) v += (x[i] - m) * (x[i] - m);
        for (int k = 0; k < 8; k++) v += acc[k];
        const float s = 1.0f / sqrtf(v / (float)C + 1e-5f);
        for (int64_t c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
        j->mean[n] = m;
        j->rstd[n] = s;
    }
}

void zdp_nn_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int64_t N, int64_t C) {
    ln_job j = {.out = out, .mean = mean, .rstd = rstd, .inp = inp, .weight = weight,
                .bias = bias, .N = N, .C = C};
    zdp_nn_parallel_ranges_(N, 16, ln_fwd_rows_, &j);
}

/* With xhat = (x - mean) rstd and g = dout * weight:
 *   dx = rstd (g - mean(g) - xhat mean(g xhat)),  dweight += dout xhat,  dbias += dout.
 * dinp by rows; dweight and dbias (sums over rows) by columns, rows in order. */
static void ln_bwd_rows_(void *ctx, int64_t lo, int64_t hi) {
    const ln_job *j = ctx;
    const int64_t C = j->C;
    const float *weight = j->weight;
    for (int64_t n = lo; n < hi; n++) {
        const float *x = j->inp + n * C, *d = j->dout + n * C;
        float *dx = j->dinp + n * C;
        const float m = j->cmean[n], s = j->crstd[n];
        float a1[8] = {0}, a2[8] = {0}, g1 = 0.0f, g2 = 0.0f;
        int64_t i = 0;
        for (; i + 8 <= C; i += 8)
            for (int k = 0; k < 8; k++) {
                float g = d[i + k] * weight[i + k];
                a1[k] += g;
                a2[k] += g * (x[i + k] - m) * s;
            }
        for (; i < C; i++) {
            float g = d[i] * weight[i];
            g1 += g;
            g2 += g * (x[i] - m) * s;
        }
        for (int k = 0; k < 8; k++) {
            g1 += a1[k];
            g2 += a2[k];
        }
        g1 /= (float)C;
        g2 /= (float)C;
        for (int64_t c = 0; c < C; c++) {
            const float xhat = (x[c] - m) * s;
            dx[c] += s * (d[c] * weight[c] - g1 - xhat * g2);
        }
    }
}

static void ln_bwd_cols_(void *ctx, int64_t lo, int64_t hi) {
    const ln_job *j = ctx;
    const int64_t C = j->C;
    for (int64_t n = 0; n < j->N; n++) {
        const float *x = j->inp + n * C, *d = j->dout + n * C;
        const float m = j->cmean[n], s = j->crstd[n];
        for (int64_t c = lo; c < hi; c++) {
            const float xhat = (x[c] - m) * s;
            j->dweight[c] += d[c] * xhat;
            j->dbias[c] += d[c];
        }
    }
}

void zdp_nn_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int64_t N, int64_t C) {
    ln_job j = {.dinp = dinp, .dweight = dweight, .dbias = dbias, .dout = dout, .inp = inp,
                .weight = weight, .cmean = mean, .crstd = rstd, .N = N, .C = C};
    zdp_nn_parallel_ranges_(N, 16, ln_bwd_rows_, &j);
    zdp_nn_parallel_ranges_(C, 32, ln_bwd_cols_, &j);
}

/* ---- matmul (Hugging Face Conv1D: weight [in, out]) ---------------------------- */

typedef struct bias_rows_job {
    float *out;
    const float *bias;
    int64_t OC;
} bias_rows_job;

static void bias_rows_(void *ctx, int64_t lo, int64_t hi) {
    const bias_rows_job *j = ctx;
    for (int64_t n = lo; n < hi; n++)
        memcpy(j->out + n * j->OC, j->bias, (size_t)j->OC * sizeof(float));
}

void zdp_nn_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int64_t N, int64_t C, int64_t OC) {
    /* Writing the bias first and letting sgemm add (beta = 1) saves a pass. */
    if (bias != NULL) {
        bias_rows_job j = {.out = out, .bias = bias, .OC = OC};
        zdp_nn_parallel_ranges_(N, 16, bias_rows_, &j);
    }
    /* out (N,OC) [+]= inp (N,C) @ weight (C,OC) */
    zdp_nn_sgemm_(CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, weight, OC,
                  bias != NULL ? 1.0f : 0.0f, out, OC);
}

void zdp_nn_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int64_t N, int64_t C,
                            int64_t OC) {
    /* The two products in one pool loop (zdp_nn_sgemm_many_). */
    zdp_nn_gemm g[2];
    int n = 0;
    if (dinp != NULL) /* dinp (N,C) = dout (N,OC) @ weight^T (OC,C) */
        g[n++] = (zdp_nn_gemm){.ta = CblasNoTrans, .tb = CblasTrans, .M = N, .N = C, .K = OC,
                               .alpha = 1.0f, .A = dout, .lda = OC, .B = weight, .ldb = OC,
                               .beta = 0.0f, .C = dinp, .ldc = C};
    if (dweight != NULL) /* dweight (C,OC) += inp^T (C,N) @ dout (N,OC) */
        g[n++] = (zdp_nn_gemm){.ta = CblasTrans, .tb = CblasNoTrans, .M = C, .N = OC, .K = N,
                               .alpha = 1.0f, .A = inp, .lda = C, .B = dout, .ldb = OC,
                               .beta = 1.0f, .C = dweight, .ldc = OC};
    zdp_nn_sgemm_many_(g, n);
    if (dbias != NULL) zdp_nn_colsum_add_(dbias, dout, N, OC);
}

/* ---- causal self-attention ----------------------------------------------------------
 *
 * For one (b, h): Q, K, V are (T, hs) views into qkv with row stride 3C, the
 * output a (T, hs) view into out with row stride C, and A = att[b,h] (T, T).
 * Query rows are processed in blocks [r0, r1) of ZDP_NN_ATTN_BLOCK: such a
 * block needs keys [0, r1) only (causality), so each product runs on a
 * (r1-r0, r1) slice of A and the fully masked part is never computed.
 *   S = Q K^T / sqrt(hs);  A = softmax over s <= t;  out = A V
 *   dA = dout V^T;  dS = A * (dA - rowsum(A * dA)) / sqrt(hs)
 *   dQ = dS K;  dK = dS^T Q;  dV = A^T dout */

typedef struct attn_job {
    float *out, *att, *dqkv, *scratch;
    const float *qkv, *dout, *catt;
    int64_t B, T, C, NH;
} attn_job;

/* One (b, h) of the forward: task = b * NH + h. */
static void attn_fwd_task_(void *ctx, int64_t task, int thread) {
    (void)thread;
    const attn_job *j = ctx;
    const int64_t T = j->T, C = j->C, NH = j->NH, hs = C / NH, ld = 3 * C;
    const int64_t b = task / NH, h = task % NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const float *q = j->qkv + b * T * ld + h * hs, *k = q + C, *v = q + 2 * C;
    float *A = j->att + task * T * T;
    float *o = j->out + b * T * C + h * hs;
    for (int64_t r0 = 0; r0 < T; r0 += ZDP_NN_ATTN_BLOCK) {
        const int64_t r1 = r0 + ZDP_NN_ATTN_BLOCK < T ? r0 + ZDP_NN_ATTN_BLOCK : T;
        /* A[r0:r1, 0:r1] = Q[r0:r1] @ K[0:r1]^T, then scaled (zdp's GEMM takes
         * alpha 1 only; cblas_sgemm's alpha rounds the same: one product
         * with the finished sum) */
        zdp_nn_gemm_1_(CblasNoTrans, CblasTrans, r1 - r0, r1, hs, q + r0 * ld, ld, k, ld, 0,
                       A + r0 * T, T);
        for (int64_t t = r0; t < r1; t++) {
            float *row = A + t * T, m;
            for (int64_t s = 0; s <= t; s++) row[s] *= scale;
            softmax_inplace_(row, t + 1, &m);
            for (int64_t s = t + 1; s < r1; s++) row[s] = 0.0f;
        }
        /* out[r0:r1] = A[r0:r1, 0:r1] @ V[0:r1] */
        zdp_nn_gemm_1_(CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, A + r0 * T, T, v, ld, 0,
                       o + r0 * C, C);
    }
}

void zdp_nn_attention_forward(float *out, float *att, const float *qkv, int64_t B, int64_t T,
                              int64_t C, int64_t NH) {
    attn_job j = {.out = out, .att = att, .qkv = qkv, .B = B, .T = T, .C = C, .NH = NH};
    zdp_nn_gemm_settle_();
    zdp_pool_run(B * NH, attn_fwd_task_, &j);
}

/* One (b, h) of the backward, with the running thread's (T, T) scratch. */
static void attn_bwd_task_(void *ctx, int64_t task, int thread) {
    const attn_job *j = ctx;
    const int64_t T = j->T, C = j->C, NH = j->NH, hs = C / NH, ld = 3 * C;
    const int64_t b = task / NH, h = task % NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int64_t nblocks = (T + ZDP_NN_ATTN_BLOCK - 1) / ZDP_NN_ATTN_BLOCK;
    const float *q = j->qkv + b * T * ld + h * hs, *k = q + C, *v = q + 2 * C;
    float *dq = j->dqkv + b * T * ld + h * hs, *dk = dq + C, *dv = dq + 2 * C;
    const float *A = j->catt + task * T * T;
    const float *dO = j->dout + b * T * C + h * hs;
    float *dA = j->scratch + (int64_t)thread * T * T;
    /* The last block meets every key, so it writes dK and dV whole
     * (beta 0) and the earlier blocks add into their first rows. */
    for (int64_t blk = nblocks - 1; blk >= 0; blk--) {
        const int64_t r0 = blk * ZDP_NN_ATTN_BLOCK;
        const int64_t r1 = r0 + ZDP_NN_ATTN_BLOCK < T ? r0 + ZDP_NN_ATTN_BLOCK : T;
        const int acc = blk != nblocks - 1;
        /* dA[r0:r1, 0:r1] = dO[r0:r1] @ V[0:r1]^T */
        zdp_nn_gemm_1_(CblasNoTrans, CblasTrans, r1 - r0, r1, hs, dO + r0 * C, C, v, ld, 0,
                       dA + r0 * T, T);
        /* dV[0:r1] (+)= A[r0:r1, 0:r1]^T @ dO[r0:r1] */
        zdp_nn_gemm_1_(CblasTrans, CblasNoTrans, r1, hs, r1 - r0, A + r0 * T, T, dO + r0 * C, C,
                       acc, dv, ld);
        /* Softmax backward, scale folded in: dA becomes dS. */
        for (int64_t t = r0; t < r1; t++) {
            const float *p = A + t * T;
            float *d = dA + t * T;
            const float rs = dot_(p, d, t + 1);
            for (int64_t s = 0; s <= t; s++) d[s] = scale * p[s] * (d[s] - rs);
            for (int64_t s = t + 1; s < r1; s++) d[s] = 0.0f;
        }
        /* dQ[r0:r1] = dS[r0:r1, 0:r1] @ K[0:r1] */
        zdp_nn_gemm_1_(CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, dA + r0 * T, T, k, ld, 0,
                       dq + r0 * ld, ld);
        /* dK[0:r1] (+)= dS[r0:r1, 0:r1]^T @ Q[r0:r1] */
        zdp_nn_gemm_1_(CblasTrans, CblasNoTrans, r1, hs, r1 - r0, dA + r0 * T, T, q + r0 * ld, ld,
                       acc, dk, ld);
    }
}

void zdp_nn_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int64_t B, int64_t T, int64_t C, int64_t NH) {
    attn_job j = {.dqkv = dqkv, .scratch = scratch, .dout = dout, .qkv = qkv, .catt = att,
                  .B = B, .T = T, .C = C, .NH = NH};
    zdp_nn_gemm_settle_();
    zdp_pool_run(B * NH, attn_bwd_task_, &j);
}

/* ---- GELU, tanh approximation ---------------------------------------------------------
 * 0.5 (1 + tanh(u)) = sigmoid(2u), so gelu(x) = x sigmoid(2u) with
 * u = sqrt(2/pi) (x + 0.044715 x^3); with s = sigmoid(2u),
 * gelu'(x) = s + 2 x s (1 - s) u'(x),  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2). */

#define GELU_K_ 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A_ 0.044715f

typedef struct ew_job {
    float *out, *da, *db;
    const float *a, *b, *dout;
} ew_job;

/* Element-wise kernels run in ranges of at least this many elements. */
#define EW_MIN_ 4096

static void gelu_fwd_range_(void *ctx, int64_t lo, int64_t hi) {
    const ew_job *j = ctx;
    for (int64_t i = lo; i < hi; i++) {
        const float x = j->a[i];
        const float u = GELU_K_ * (x + GELU_A_ * x * x * x);
        j->out[i] = x / (1.0f + zdp_nn_exp_(-2.0f * u));
    }
}

void zdp_nn_gelu_forward(float *out, const float *inp, int64_t N) {
    ew_job j = {.out = out, .a = inp};
    zdp_nn_parallel_ranges_(N, EW_MIN_, gelu_fwd_range_, &j);
}

static void gelu_bwd_range_(void *ctx, int64_t lo, int64_t hi) {
    const ew_job *j = ctx;
    for (int64_t i = lo; i < hi; i++) {
        const float x = j->a[i];
        const float u = GELU_K_ * (x + GELU_A_ * x * x * x);
        const float s = 1.0f / (1.0f + zdp_nn_exp_(-2.0f * u));
        const float du = GELU_K_ * (1.0f + 3.0f * GELU_A_ * x * x);
        j->out[i] = j->dout[i] * (s + 2.0f * x * s * (1.0f - s) * du);
    }
}

void zdp_nn_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t N) {
    ew_job j = {.out = dinp, .a = inp, .dout = dout};
    zdp_nn_parallel_ranges_(N, EW_MIN_, gelu_bwd_range_, &j);
}

/* ---- residual ------------------------------------------------------------------------ */

static void residual_fwd_range_(void *ctx, int64_t lo, int64_t hi) {
    const ew_job *j = ctx;
    for (int64_t i = lo; i < hi; i++) j->out[i] = j->a[i] + j->b[i];
}

void zdp_nn_residual_forward(float *out, const float *a, const float *b, int64_t N) {
    ew_job j = {.out = out, .a = a, .b = b};
    zdp_nn_parallel_ranges_(N, EW_MIN_, residual_fwd_range_, &j);
}

static void residual_bwd_range_(void *ctx, int64_t lo, int64_t hi) {
    const ew_job *j = ctx;
    if (j->da != NULL)
        for (int64_t i = lo; i < hi; i++) j->da[i] += j->dout[i];
    if (j->db != NULL)
        for (int64_t i = lo; i < hi; i++) j->db[i] += j->dout[i];
}

void zdp_nn_residual_backward(float *da, float *db, const float *dout, int64_t N) {
    ew_job j = {.da = da, .db = db, .dout = dout};
    zdp_nn_parallel_ranges_(N, EW_MIN_, residual_bwd_range_, &j);
}

/* ---- lm_head (tied) and cross-entropy -------------------------------------------------- */

void zdp_nn_lmhead_forward(float *logits, const float *inp, const float *wte, int64_t N,
                           int64_t C, int64_t V) {
    /* logits (N,V) = inp (N,C) @ wte^T (C,V) */
    zdp_nn_sgemm_(CblasNoTrans, CblasTrans, N, V, C, 1.0f, inp, C, wte, C, 0.0f, logits, V);
}

void zdp_nn_lmhead_backward(float *dinp, float *dwte, const float *dlogits, const float *inp,
                            const float *wte, int64_t N, int64_t C, int64_t V) {
    zdp_nn_gemm g[2];
    int n = 0;
    if (dinp != NULL) /* dinp (N,C) = dlogits (N,V) @ wte (V,C) */
        g[n++] = (zdp_nn_gemm){.ta = CblasNoTrans, .tb = CblasNoTrans, .M = N, .N = C, .K = V,
                               .alpha = 1.0f, .A = dlogits, .lda = V, .B = wte, .ldb = C,
                               .beta = 0.0f, .C = dinp, .ldc = C};
    if (dwte != NULL) /* dwte (V,C) += dlogits^T (V,N) @ inp (N,C) */
        g[n++] = (zdp_nn_gemm){.ta = CblasTrans, .tb = CblasNoTrans, .M = V, .N = C, .K = N,
                               .alpha = 1.0f, .A = dlogits, .lda = V, .B = inp, .ldb = C,
                               .beta = 1.0f, .C = dwte, .ldc = C};
    zdp_nn_sgemm_many_(g, n);
}

/* The loss sums over rows in CE_PARTS_ fixed parts (their bounds depend on N
 * only), each part in row order, then the parts in order: the same sum at
 * any thread count. */
#define CE_PARTS_ 64

typedef struct ce_job {
    float *probs, *logprobs, *dlogits;
    const float *logits, *weights, *cprobs;
    const int32_t *targets;
    float dloss;
    int64_t N, V;
    double part[CE_PARTS_];
} ce_job;

static void ce_fwd_part_(void *ctx, int64_t part, int thread) {
    (void)thread;
    ce_job *j = ctx;
    const int64_t V = j->V;
    int64_t lo, hi;
    zdp_nn_span_(j->N, CE_PARTS_, part, &lo, &hi);
    double total = 0.0;
    for (int64_t n = lo; n < hi; n++) {
        const float *row = j->logits + n * V;
        float *p = j->probs + n * V;
        const float zt = row[j->targets[n]]; /* read before probs (maybe aliased) is written */
        if (p != row) memcpy(p, row, (size_t)V * sizeof(float));
        float m;
        const float s = softmax_inplace_(p, V, &m);
        const double ce = log((double)s) + (double)m - (double)zt;
        if (j->logprobs != NULL) j->logprobs[n] = (float)-ce;
        total += j->weights != NULL ? (double)j->weights[n] * ce : ce;
    }
    j->part[part] = total;
}

double zdp_nn_softmax_crossentropy_forward(float *probs, const float *logits,
                                           const int32_t *targets, const float *weights,
                                           float *logprobs, int64_t N, int64_t V) {
    ce_job j = {.probs = probs, .logprobs = logprobs, .logits = logits, .weights = weights,
                .targets = targets, .N = N, .V = V};
    zdp_pool_run(CE_PARTS_, ce_fwd_part_, &j);
    double total = 0.0;
    for (int k = 0; k < CE_PARTS_; k++) total += j.part[k];
    return N > 0 ? total / (double)N : 0.0;
}

static void ce_bwd_rows_(void *ctx, int64_t lo, int64_t hi) {
    const ce_job *j = ctx;
    const int64_t V = j->V;
    const float s0 = j->N > 0 ? j->dloss / (float)j->N : 0.0f;
    for (int64_t n = lo; n < hi; n++) {
        const float s = j->weights != NULL ? s0 * j->weights[n] : s0;
        for (int64_t v = 0; v < V; v++) j->dlogits[n * V + v] = s * j->cprobs[n * V + v];
        j->dlogits[n * V + j->targets[n]] -= s;
    }
}

void zdp_nn_softmax_crossentropy_backward(float *dlogits, const float *probs,
                                          const int32_t *targets, const float *weights,
                                          float dloss, int64_t N, int64_t V) {
    ce_job j = {.dlogits = dlogits, .cprobs = probs, .weights = weights,
                .targets = targets, .dloss = dloss, .N = N, .V = V};
    zdp_nn_parallel_ranges_(N, 4, ce_bwd_rows_, &j);
}
