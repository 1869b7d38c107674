/*
 * nn.h -- internal: layer kernels as plain forward/backward functions.
 *
 * Legend: N = rows (batch), C = input channels, OC = output channels.
 * linear / crossentropy: nn.c; the GPT-2 kernels: nn_transformer.c; the
 * Llama-family kernels: nn_llama.c.
 * Kernels allocate nothing, hold no state and never talk to MPI.  They split
 * their work over the thread pool (src/core/pool.c) into tasks that write
 * disjoint outputs, each summing in the same order at any thread count, so
 * results are bitwise independent of the pool's size.  Backward
 * kernels ADD (+=) into parameter gradients, which come from the grad sink,
 * and either overwrite or add into input gradients as their comment says.
 */
#ifndef ZDP_NN_H
#define ZDP_NN_H

#include <stdint.h>
#include <string.h>

#include "zdp/core.h" /* ZDP_API: tests call the kernels */

#include <cblas.h>

#include "../core/core.h" /* the thread pool */

/* ---- max of a row (softmaxes) --------------------------------------------- */

/* max of x[0..n), n >= 1, in ZDP_NN_MAX_LANES_ independent running maxima
 * (one running max is a chain of dependent compares, 4 cycles each, which
 * a loss over a large vocabulary would wait on).  A max is exact
 * in any order, so this returns the serial loop's value, NaN included (a NaN
 * is kept only from x[0], in both); only a zero's sign may differ, which the
 * softmaxes (x - max) never see. */
#define ZDP_NN_MAX_LANES_ 16
static inline float zdp_nn_max_(const float *x, int64_t n) {
    float acc[ZDP_NN_MAX_LANES_];
    for (int q = 0; q < ZDP_NN_MAX_LANES_; q++) acc[q] = x[0];
    int64_t i = 0;
    for (; i + ZDP_NN_MAX_LANES_ <= n; i += ZDP_NN_MAX_LANES_)
        for (int q = 0; q < ZDP_NN_MAX_LANES_; q++) acc[q] = x[i + q] > acc[q] ? x[i + q] : acc[q];
    float m = acc[0];
    for (int q = 1; q < ZDP_NN_MAX_LANES_; q++) m = acc[q] > m ? acc[q] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* ---- sums in double (norms, softmax denominators) --------------------------- */

/* sum of x[0..n) and of a[i] b[i], each term in double, in
 * ZDP_NN_SUM_LANES_ partial sums added in a fixed order at the end: a
 * single running sum is a chain of dependent adds (4 cycles each), which
 * attention's softmax and RMSNorm would otherwise wait on.  The order depends on n
 * only, so a row gives the same sum on any thread. */
#define ZDP_NN_SUM_LANES_ 16
static inline double zdp_nn_sum_d_(const float *x, int64_t n) {
    double acc[ZDP_NN_SUM_LANES_] = {0};
    int64_t i = 0;
    for (; i + ZDP_NN_SUM_LANES_ <= n; i += ZDP_NN_SUM_LANES_)
        for (int q = 0; q < ZDP_NN_SUM_LANES_; q++) acc[q] += (double)x[i + q];
    for (int64_t q = 0; i < n; i++, q++) acc[q] += (double)x[i];
    double s = 0.0;
    for (int q = 0; q < ZDP_NN_SUM_LANES_; q++) s += acc[q];
    return s;
}

static inline double zdp_nn_dot_d_(const float *a, const float *b, int64_t n) {
    double acc[ZDP_NN_SUM_LANES_] = {0};
    int64_t i = 0;
    for (; i + ZDP_NN_SUM_LANES_ <= n; i += ZDP_NN_SUM_LANES_)
        for (int q = 0; q < ZDP_NN_SUM_LANES_; q++) acc[q] += (double)a[i + q] * b[i + q];
    for (int64_t q = 0; i < n; i++, q++) acc[q] += (double)a[i] * b[i];
    double s = 0.0;
    for (int q = 0; q < ZDP_NN_SUM_LANES_; q++) s += acc[q];
    return s;
}

/* ---- vectorisable e^x (GPT-2's softmax and GELU, the Llama family's SwiGLU
 * and attention softmax) --------------------------------------------------- */

/* e^x to 2.4e-7 relative for |x| <= 87 (|x| > 88 is taken as +-88, so
 * e^x saturates at 1.65e38 and flushes to 0 below about -87.7; NaN stays NaN):
 * e^x = 2^k e^r with k = round(x / ln 2), |r| <= ln2 / 2, e^r by its degree-6
 * Taylor polynomial, 2^k built in the exponent bits.  GCC will not
 * if-convert float comparisons without -fno-trapping-math, so the clamps and
 * the NaN test are integer masks on the bits: loops calling exp_ vectorise. */
static inline float zdp_nn_exp_(float x) {
    uint32_t xb;
    memcpy(&xb, &x, sizeof xb);
    const int32_t ax = (int32_t)(xb & 0x7FFFFFFFu); /* |x| as bits: monotonic */
    const uint32_t big = 0u - (uint32_t)(ax > 0x42B00000); /* |x| > 88 (or NaN) */
    const uint32_t cb = (((xb & 0x80000000u) | 0x42B00000u) & big) | (xb & ~big);
    float xc;
    memcpy(&xc, &cb, sizeof xc);
    /* Adding 1.5 * 2^23 rounds to an integer, which lands in the low
     * mantissa bits of t: k as a float and as bits without a conversion. */
    const float magic = 12582912.0f;
    const float t = xc * 1.44269504088896341f + magic;
    const float k = t - magic;
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    float r = xc - k * 0.693145751953125f; /* ln 2, high part (exact product) */
    r -= k * 1.428606765330187e-06f;       /* ln 2, low part */
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const uint32_t sb = (tb - 0x4B400000u + 127u) << 23; /* 2^k, k in [-127, 127] */
    float scale;
    memcpy(&scale, &sb, sizeof scale);
    const float y = p * scale;
    uint32_t yb;
    memcpy(&yb, &y, sizeof yb);
    const uint32_t nan = 0u - (uint32_t)(ax > 0x7F800000);
    yb = (xb & nan) | (yb & ~nan);
    float out;
    memcpy(&out, &yb, sizeof out);
    return out;
}

/* ---- splitting work over the pool (nn.c) -------------------------------------- */

/* Task t of n over [0, len): [*lo, *hi), contiguous, in order. */
static inline void zdp_nn_span_(int64_t len, int64_t n, int64_t t, int64_t *lo, int64_t *hi) {
    *lo = len * t / n;
    *hi = len * (t + 1) / n;
}

/* How many tasks len units of work make, each at least min_len units: the
 * pool's size at most, 1 at least. */
static inline int64_t zdp_nn_tasks_(int64_t len, int64_t min_len) {
    const int64_t p = zdp_pool_size(), most = len / (min_len > 0 ? min_len : 1);
    return most < 1 ? 1 : most < p ? most : p;
}

/* cblas_sgemm (row-major), or zdp's GEMM (gemm.c) where it wins, split
 * over the pool along M or N, whichever is larger; each element is computed
 * by one single-threaded call with the whole K, so the result is the single
 * call's. */
ZDP_API void zdp_nn_sgemm_(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                   float beta, float *C, int64_t ldc);

/* One row-major product C = alpha op(A) op(B) + beta C, for zdp_nn_sgemm_many_. */
typedef struct zdp_nn_gemm {
    CBLAS_TRANSPOSE ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float *C;
} zdp_nn_gemm;

/* n independent products (no C overlaps another's A, B or C) in one pool
 * loop: each gets threads in proportion to its multiply-adds and is cut as
 * zdp_nn_sgemm_ cuts, so every C is the single call's, at any thread count. */
ZDP_API void zdp_nn_sgemm_many_(const zdp_nn_gemm *g, int n);

/* One product C (M,N) = op(A) op(B) [+ C when accumulate], alpha 1, on the
 * calling thread: zdp's GEMM where it wins on the product's shape
 * (zdp_nn_gemm_wins_), else cblas_sgemm -- for the pool's tasks that each
 * run whole small products (attention's, one (batch, head) per task).  Call
 * zdp_nn_gemm_settle_ before the pool runs them (gemm.c reads its mode and
 * path lazily). */
void zdp_nn_gemm_1_(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
                    const float *A, int64_t lda, const float *B, int64_t ldb, int accumulate,
                    float *C, int64_t ldc);
void zdp_nn_gemm_settle_(void);

/* dbias (OC) += column sums of dout (N,OC), split by columns. */
void zdp_nn_colsum_add_(float *dbias, const float *dout, int64_t N, int64_t OC);

/* Runs body(ctx, lo, hi) over [0, len) cut into contiguous ranges of at
 * least min_len units (but one): up to 4 per pool thread, claimed as the
 * threads come free; body must give the same result however [0, len) is
 * cut. */
typedef void (*zdp_nn_range_fn)(void *ctx, int64_t lo, int64_t hi);
void zdp_nn_parallel_ranges_(int64_t len, int64_t min_len, zdp_nn_range_fn body, void *ctx);

/* ---- packed B: small-M products against a weight packed once (packed.c) ----
 * C (M,N) [+]= A (M,K) @ B (K,N) + bias, B packed by zdp_nn_pack_b into
 * column panels: for the decode steps of the KV cache (M = the batch), where
 * cblas_sgemm would re-pack the weight on every call.  Any M; threads split
 * the panels, so results do not depend on the pool's size. */

/* ---- SIMD path (isa.c) ----
 * zdp's own kernels (gemm.c, packed.c, the KV cache's attention) each run
 * one of three paths: 0 portable C, 1 AVX2+FMA, 2 AVX-512 (f, dq, vl),
 * compiled with target attributes and chosen at run time, so they do not
 * depend on -march.  zdp_nn_isa_best: the best this CPU has.  zdp_nn_isa:
 * the path the kernels start on: the best, or lower where the environment
 * says ZDP_GEMM_ISA=0|1 (one variable for every kernel family). */
ZDP_API int zdp_nn_isa_best(void);
ZDP_API int zdp_nn_isa(void);

/* 1 when a product of M rows against a packed B beats cblas_sgemm on the
 * path in use: on the AVX-512 path up to 256 rows, on the AVX2 path up to
 * 64 (decode batches), on the portable path never; ZDP_GEMM=blas: never,
 * ZDP_GEMM=zdp: always (zdp_nn_gemm_mode: one switch between zdp's own
 * kernels and the BLAS).  Callers that get 0 multiply by the unpacked
 * weight through the BLAS. */
ZDP_API int zdp_nn_packed_wins(int64_t M);
/* Floats the packed copy of a (K,N) B takes. */
ZDP_API int64_t zdp_nn_packed_floats(int64_t K, int64_t N);
/* dst (zdp_nn_packed_floats(K, N)) <- B: trans = 1 for W (N,K) (B = W^T,
 * torch.nn.Linear's weight), 0 for W (K,N) (Hugging Face Conv1D). */
ZDP_API void zdp_nn_pack_b(float *dst, const float *W, int64_t K, int64_t N, int trans);
/* C (rows at ldc) = A (rows at lda) @ B + bias (NULL: none), or += with
 * accumulate. */
ZDP_API void zdp_nn_packed_gemm(float *C, int64_t ldc, const float *A, int64_t lda, const float *Bp,
                                const float *bias, int64_t M, int64_t K, int64_t N, int accumulate);
/* The path the products take: 0 portable C, 1 AVX2+FMA, 2 AVX-512
 * (zdp_nn_isa() at first use). */
ZDP_API int zdp_nn_packed_path(void);
/* Uses path min(want, the best the CPU has) from now on (tests compare the
 * paths); returns it.  Not while a product runs. */
ZDP_API int zdp_nn_packed_use_path(int want);

/* out = inp @ weight^T + bias   (torch.nn.Linear)
 * out (N,OC), inp (N,C), weight (OC,C) row-major, bias (OC) or NULL.
 * accumulate: add into out instead of overwriting it. */
ZDP_API void zdp_nn_linear_forward(float *out, const float *inp, const float *weight,
                                   const float *bias, int64_t N, int64_t C, int64_t OC,
                                   int accumulate);

/* n linears of one input: out_i = inp @ weight_i^T + bias_i (bias NULL, or
 * bias_i NULL: none), each exactly as zdp_nn_linear_forward(..., 0) computes
 * it, in one pool loop (zdp_nn_sgemm_many_): q/k/v, gate/up. */
ZDP_API void zdp_nn_linear_forward_shared(int n, float *const *out, const float *inp,
                                          const float *const *weight, const float *const *bias,
                                          const int64_t *OC, int64_t N, int64_t C);

/* dinp (N,C) += dout @ weight      (skipped when dinp is NULL)
 * dweight (OC,C) += dout^T @ inp   (skipped when NULL)
 * dbias (OC) += column sums of dout (skipped when NULL)
 * flags: ZDP_NN_SET_DINP stores dinp (=) instead of adding into it, so the
 * caller need not zero it first (the product runs with beta = 0: the same
 * bits as adding into zeros, one pass over dinp less).  0: add. */
#define ZDP_NN_SET_DINP 1
ZDP_API void zdp_nn_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int64_t N, int64_t C,
                            int64_t OC, int flags);

/* Mean cross-entropy of logits (N,V) against targets (N) in [0,V):
 * returns mean_n [logsumexp(logits_n) - logits_n[target_n]]  (torch's
 * F.cross_entropy, reduction="mean").  probs (N,V) receives softmax(logits). */
double zdp_nn_crossentropy_forward(float *probs, const float *logits, const int64_t *targets,
                                   int64_t N, int64_t V);

/* dlogits (N,V) = dloss * (probs - onehot(targets)) / N  (overwrites). */
void zdp_nn_crossentropy_backward(float *dlogits, const float *probs, const int64_t *targets,
                                  float dloss, int64_t N, int64_t V);

/* ---- transformer (GPT-2) kernels: nn_transformer.c -------------------------
 *
 * Legend: B = batch, T = sequence length, C = channels, NH = heads,
 * hs = C / NH (head size), V = vocabulary, N = B * T rows, OC = output
 * channels.  All tensors are row-major and contiguous.  Parameter gradients
 * are always ADDED into (+=); each kernel says whether it overwrites or adds
 * into its input gradient. */

/* out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]   (GPT-2's token + position embedding)
 * out (B,T,C), inp (B,T) ids in [0,V) (not checked here), wte (V,C), wpe (>=T,C). */
ZDP_API void zdp_nn_embedding_forward(float *out, const int32_t *inp, const float *wte,
                                      const float *wpe, int64_t B, int64_t T, int64_t C);
/* dwte (V,C) += scatter of dout by token id; dwpe (>=T,C) += dout summed over b.
 * Either gradient may be NULL (skipped).  dout (B,T,C), inp (B,T). */
ZDP_API void zdp_nn_embedding_backward(float *dwte, float *dwpe, const float *dout,
                                       const int32_t *inp, int64_t B, int64_t T, int64_t C);

/* out = (inp - mean) * rstd * weight + bias per row, rstd = 1/sqrt(var + 1e-5)
 * with the biased variance (torch.nn.LayerNorm, eps 1e-5).
 * out (N,C), mean (N), rstd (N) (kept for backward), inp (N,C), weight (C), bias (C). */
ZDP_API void zdp_nn_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                      const float *weight, const float *bias, int64_t N, int64_t C);
/* dinp (N,C) += ..., dweight (C) += ..., dbias (C) += ...  (all ADD).
 * dout (N,C), inp (N,C), weight (C), mean (N), rstd (N) from the forward. */
ZDP_API void zdp_nn_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                       const float *inp, const float *weight, const float *mean,
                                       const float *rstd, int64_t N, int64_t C);

/* out = inp @ weight + bias   (Hugging Face Conv1D: weight is [in, out])
 * out (N,OC) (overwritten), inp (N,C), weight (C,OC), bias (OC) or NULL. */
ZDP_API void zdp_nn_matmul_forward(float *out, const float *inp, const float *weight,
                                   const float *bias, int64_t N, int64_t C, int64_t OC);
/* dinp (N,C) = dout @ weight^T       (OVERWRITES; skipped when NULL)
 * dweight (C,OC) += inp^T @ dout     (skipped when NULL)
 * dbias (OC) += column sums of dout  (skipped when NULL)
 * dout (N,OC), inp (N,C), weight (C,OC). */
ZDP_API void zdp_nn_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *weight, int64_t N, int64_t C,
                                    int64_t OC);

/* Row blocks of the causal attention: a block of query rows [r0, r1) only
 * meets keys [0, r1), so the products skip most of the masked triangle. */
#define ZDP_NN_ATTN_BLOCK 64

/* Causal multi-head self-attention on the fused projection
 * qkv[b,t,:] = [q (C) | k (C) | v (C)], head h at channels h*hs..(h+1)*hs:
 *   att[b,h,t,s] = softmax_{s<=t}(q_t . k_s / sqrt(hs)), 0 for s > t
 *   out[b,t,h*hs:(h+1)*hs] = sum_s att[b,h,t,s] v_s
 * out (B,T,C) (overwritten), att (B,NH,T,T) (the probabilities, kept for
 * backward; above the diagonal only the entries inside each row's block of
 * ZDP_NN_ATTN_BLOCK rows are written, as zeros), qkv (B,T,3C). */
ZDP_API void zdp_nn_attention_forward(float *out, float *att, const float *qkv, int64_t B,
                                      int64_t T, int64_t C, int64_t NH);
/* dqkv (B,T,3C) = d/dqkv   (OVERWRITES).  scratch (zdp_pool_size(),T,T) is
 * workspace, one (T,T) slice per thread.
 * dout (B,T,C), qkv (B,T,3C), att (B,NH,T,T) from the forward. */
ZDP_API void zdp_nn_attention_backward(float *dqkv, float *scratch, const float *dout,
                                       const float *qkv, const float *att, int64_t B, int64_t T,
                                       int64_t C, int64_t NH);

/* out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (GELU, approximate="tanh")
 * out (N), inp (N); out may alias inp. */
ZDP_API void zdp_nn_gelu_forward(float *out, const float *inp, int64_t N);
/* dinp (N) = dout * gelu'(inp)  (OVERWRITES; dinp may alias dout).  inp (N). */
ZDP_API void zdp_nn_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t N);

/* out = a + b   out, a, b (N); out may alias a or b. */
ZDP_API void zdp_nn_residual_forward(float *out, const float *a, const float *b, int64_t N);
/* da (N) += dout, db (N) += dout  (ADD; either may be NULL). */
ZDP_API void zdp_nn_residual_backward(float *da, float *db, const float *dout, int64_t N);

/* logits = inp @ wte^T   (GPT-2's lm_head, tied to the token embedding)
 * logits (N,V) (overwritten), inp (N,C), wte (V,C). */
ZDP_API void zdp_nn_lmhead_forward(float *logits, const float *inp, const float *wte, int64_t N,
                                   int64_t C, int64_t V);
/* dinp (N,C) = dlogits @ wte     (OVERWRITES; skipped when NULL)
 * dwte (V,C) += dlogits^T @ inp  (skipped when NULL) */
ZDP_API void zdp_nn_lmhead_backward(float *dinp, float *dwte, const float *dlogits,
                                    const float *inp, const float *wte, int64_t N, int64_t C,
                                    int64_t V);

/* Weighted mean cross-entropy of logits (N,V) against targets (N) in [0,V)
 * (int32): returns (1/N) sum_n w_n [logsumexp(logits_n) - logits_n[target_n]]
 * (F.cross_entropy when weights is NULL, i.e. all w_n = 1).  probs (N,V)
 * receives softmax(logits) and may alias logits; logprobs (N), when not
 * NULL, receives log p(target_n). */
ZDP_API double zdp_nn_softmax_crossentropy_forward(float *probs, const float *logits,
                                                   const int32_t *targets, const float *weights,
                                                   float *logprobs, int64_t N, int64_t V);
/* dlogits (N,V) = dloss * w_n * (probs - onehot(targets)) / N  (OVERWRITES;
 * may alias probs; weights NULL = all 1). */
ZDP_API void zdp_nn_softmax_crossentropy_backward(float *dlogits, const float *probs,
                                                  const int32_t *targets, const float *weights,
                                                  float dloss, int64_t N, int64_t V);

/* ---- Llama-family kernels: nn_llama.c ---------------------------------------
 *
 * Legend: B = batch, T = sequence length, N = B * T rows, C = channels,
 * H = hidden, NH = query heads, KV = key/value heads (dividing NH), hd =
 * head_dim (even), nh = heads of a tensor.  Per-token head tensors are
 * (B, T, nh, hd) row-major, i.e. (N, nh*hd).  Parameter gradients are ADDED
 * into; each kernel says what it does to its input gradient.  Linear layers
 * ([out, in] weights) are zdp_nn_linear_forward / _backward above. */

/* out[n,:] = wte[inp[n],:]   out (N,C), inp (N) ids in [0,V) (not checked), wte (V,C). */
ZDP_API void zdp_nn_token_embedding_forward(float *out, const int32_t *inp, const float *wte,
                                            int64_t N, int64_t C);
/* dwte (V,C) += scatter of dout (N,C) by token id inp (N). */
ZDP_API void zdp_nn_token_embedding_backward(float *dwte, const float *dout, const int32_t *inp,
                                             int64_t N, int64_t C);

/* out = inp * rstd * weight per row, rstd = 1/sqrt(mean(inp^2) + eps)
 * (transformers' LlamaRMSNorm).  out (N,C), rstd (N) (kept for backward),
 * inp (N,C), weight (C).  Qwen3's per-head q/k norm is this on N*nh rows of hd. */
ZDP_API void zdp_nn_rmsnorm_forward(float *out, float *rstd, const float *inp,
                                    const float *weight, int64_t N, int64_t C, float eps);
/* dinp (N,C) += ..., dweight (C) += ...  (both ADD).
 * dout (N,C), inp (N,C), weight (C), rstd (N) from the forward. */
ZDP_API void zdp_nn_rmsnorm_backward(float *dinp, float *dweight, const float *dout,
                                     const float *inp, const float *weight, const float *rstd,
                                     int64_t N, int64_t C);

/* inv_freq[i] (i < head_dim/2) of the rotary embedding:
 * theta^(-2i/head_dim), then rope_type 0 (default) as is, 1 (linear) divided
 * by factor, 2 (llama3) transformers' _compute_llama3_parameters: kept above
 * original_max_position / high_freq_factor's frequency, divided by factor
 * below original_max_position / low_freq_factor's, interpolated between. */
ZDP_API double zdp_nn_rope_inv_freq(int i, int head_dim, double theta, int rope_type,
                                    double factor, double low_freq_factor,
                                    double high_freq_factor, int original_max_position);
/* cos_t, sin_t (T, head_dim/2): cos and sin of t * inv_freq[i], computed in double. */
ZDP_API void zdp_nn_rope_tables(float *cos_t, float *sin_t, int T, int head_dim, double theta,
                                int rope_type, double factor, double low_freq_factor,
                                double high_freq_factor, int original_max_position);
/* Rotary embedding at positions 0..T-1 of each sequence (rotate_half pairs
 * i, i + hd/2): out (B,T,nh,hd) (overwritten; may alias inp), inp (B,T,nh,hd),
 * cos_t, sin_t (>=T, hd/2). */
ZDP_API void zdp_nn_rope_forward(float *out, const float *inp, const float *cos_t,
                                 const float *sin_t, int64_t B, int64_t T, int64_t nh, int64_t hd);
/* dinp (B,T,nh,hd) = the inverse rotation of dout  (OVERWRITES; may alias dout). */
ZDP_API void zdp_nn_rope_backward(float *dinp, const float *dout, const float *cos_t,
                                  const float *sin_t, int64_t B, int64_t T, int64_t nh,
                                  int64_t hd);

/* Causal grouped-query attention, query head h on KV head h / (NH/KV):
 *   att[b,h,t,s] = softmax_{s<=t}(q_t . k_s / sqrt(hd)), 0 for s > t
 *   out[b,t,h,:] = sum_s att[b,h,t,s] v_s
 * out (B,T,NH*hd) (overwritten), att (B,NH,T,T) (kept for backward; above
 * the diagonal only the entries inside each row's block of ZDP_NN_ATTN_BLOCK
 * rows are written, as zeros), q (B,T,NH*hd), k, v (B,T,KV*hd). */
ZDP_API void zdp_nn_gqa_attention_forward(float *out, float *att, const float *q, const float *k,
                                          const float *v, int64_t B, int64_t T, int64_t NH,
                                          int64_t KV, int64_t hd);
/* dq (B,T,NH*hd), dk, dv (B,T,KV*hd) = d/dq, d/dk, d/dv  (all OVERWRITE).
 * scratch (zdp_pool_size(),T,T) is workspace, one (T,T) slice per thread.
 * dout (B,T,NH*hd); q, k, v, att from the forward. */
ZDP_API void zdp_nn_gqa_attention_backward(float *dq, float *dk, float *dv, float *scratch,
                                           const float *dout, const float *q, const float *k,
                                           const float *v, const float *att, int64_t B,
                                           int64_t T, int64_t NH, int64_t KV, int64_t hd);

/* out = silu(gate) * up, silu(g) = g / (1 + e^-g)  (SwiGLU).  out, gate, up (N). */
ZDP_API void zdp_nn_swiglu_forward(float *out, const float *gate, const float *up, int64_t N);
/* dgate (N), dup (N) = gradients  (OVERWRITE; dgate may alias dout).  gate, up (N). */
ZDP_API void zdp_nn_swiglu_backward(float *dgate, float *dup, const float *dout,
                                    const float *gate, const float *up, int64_t N);

#endif /* ZDP_NN_H */
