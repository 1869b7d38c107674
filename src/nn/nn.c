/*
 * nn.c -- linear and softmax cross-entropy kernels (see nn.h).
 * Matmuls go through cblas_sgemm on row-major data, split over the thread
 * pool by zdp_nn_sgemm_; also here: the pool helpers the kernels share.
 */
#include "nn.h"

#include <math.h>
#include <string.h>


/* ---- splitting work over the pool ------------------------------------------------- */

/* How a GEMM is cut.  Pieces start on multiples of GEMM_ALIGN_ rows or
 * columns, so every piece tiles like the whole (OpenBLAS's micro-kernels
 * take up to 16 x 4 or 4 x 16 blocks, and an edge block may round
 * differently); and none is below GEMM_MIN_MNK_ multiply-adds, where
 * OpenBLAS 0.3.21 may take another kernel with other rounding (the
 * SkylakeX "direct" sgemm below 28 * 512^2), and where a piece is too small
 * to pay for its packing anyway.  Within those rules each element is
 * computed by one single-threaded call with the whole K, exactly as the
 * undivided call computes it (bench/sgemm_split.c checks this on shapes
 * around both limits). */
#define GEMM_ALIGN_ 64
#define GEMM_MIN_MNK_ (1LL << 23)

typedef struct sgemm_job {
    CBLAS_TRANSPOSE ta, tb;
    int64_t M, N, K, lda, ldb, ldc, n_tasks;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int split_m; /* split M (rows of C) rather than N (its columns) */
} sgemm_job;

/* Piece t of n over [0, len): bounds rounded to GEMM_ALIGN_. */
static void gemm_span_(int64_t len, int64_t n, int64_t t, int64_t *lo, int64_t *hi) {
    *lo = t == 0 ? 0 : (len * t / n + GEMM_ALIGN_ / 2) / GEMM_ALIGN_ * GEMM_ALIGN_;
    *hi = t == n - 1 ? len : (len * (t + 1) / n + GEMM_ALIGN_ / 2) / GEMM_ALIGN_ * GEMM_ALIGN_;
}

static void sgemm_task_(void *ctx, int64_t t, int thread) {
    (void)thread;
    const sgemm_job *j = ctx;
    int64_t lo, hi;
    if (j->split_m) {
        gemm_span_(j->M, j->n_tasks, t, &lo, &hi);
        /* Rows lo..hi of op(A): rows of A, or columns when transposed. */
        const float *a = j->A + (j->ta == CblasNoTrans ? lo * j->lda : lo);
        cblas_sgemm(CblasRowMajor, j->ta, j->tb, (int)(hi - lo), (int)j->N, (int)j->K, j->alpha,
                    a, (int)j->lda, j->B, (int)j->ldb, j->beta, j->C + lo * j->ldc, (int)j->ldc);
    } else {
        gemm_span_(j->N, j->n_tasks, t, &lo, &hi);
        /* Columns lo..hi of op(B): columns of B, or rows when transposed. */
        const float *b = j->B + (j->tb == CblasNoTrans ? lo : lo * j->ldb);
        cblas_sgemm(CblasRowMajor, j->ta, j->tb, (int)j->M, (int)(hi - lo), (int)j->K, j->alpha,
                    j->A, (int)j->lda, b, (int)j->ldb, j->beta, j->C + lo, (int)j->ldc);
    }
}

void zdp_nn_sgemm_(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                   float beta, float *C, int64_t ldc) {
    sgemm_job j = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb,
                   .ldc = ldc, .alpha = alpha, .beta = beta, .A = A, .B = B, .C = C,
                   .split_m = M >= N};
    /* At most one piece per GEMM_ALIGN_ rows (so the rounded bounds
     * increase) and per GEMM_MIN_MNK_ multiply-adds. */
    const int64_t len = j.split_m ? M : N;
    const int64_t by_mnk = (int64_t)((double)M * (double)N * (double)K / (double)GEMM_MIN_MNK_);
    j.n_tasks = zdp_nn_tasks_(by_mnk < len / GEMM_ALIGN_ ? by_mnk : len / GEMM_ALIGN_, 1);
    zdp_pool_run(j.n_tasks, sgemm_task_, &j);
}

typedef struct range_job {
    int64_t len, n_tasks;
    zdp_nn_range_fn body;
    void *ctx;
} range_job;

static void range_task_(void *ctx, int64_t t, int thread) {
    (void)thread;
    const range_job *j = ctx;
    int64_t lo, hi;
    zdp_nn_span_(j->len, j->n_tasks, t, &lo, &hi);
    if (hi > lo) j->body(j->ctx, lo, hi);
}

void zdp_nn_parallel_ranges_(int64_t len, int64_t min_len, zdp_nn_range_fn body, void *ctx) {
    range_job j = {.len = len, .n_tasks = zdp_nn_tasks_(len, min_len), .body = body, .ctx = ctx};
    zdp_pool_run(j.n_tasks, range_task_, &j);
}

/* ---- linear (torch.nn.Linear: weight [out, in]) ------------------------------------ */

typedef struct bias_job {
    float *out;
    const float *bias;
    int64_t OC;
} bias_job;

static void add_bias_rows_(void *ctx, int64_t lo, int64_t hi) {
    const bias_job *j = ctx;
    for (int64_t n = lo; n < hi; n++)
        for (int64_t o = 0; o < j->OC; o++) j->out[n * j->OC + o] += j->bias[o];
}

/* dbias[o] += sum over rows n (in order) of dout[n, o], for o in [lo, hi):
 * split by columns, each sum runs in the serial order. */
typedef struct colsum_job {
    float *dbias;
    const float *dout;
    int64_t N, OC;
} colsum_job;

static void colsum_(void *ctx, int64_t lo, int64_t hi) {
    const colsum_job *j = ctx;
    for (int64_t n = 0; n < j->N; n++) {
        const float *d = j->dout + n * j->OC;
        for (int64_t o = lo; o < hi; o++) j->dbias[o] += d[o];
    }
}

void zdp_nn_colsum_add_(float *dbias, const float *dout, int64_t N, int64_t OC) {
    colsum_job j = {.dbias = dbias, .dout = dout, .N = N, .OC = OC};
    zdp_nn_parallel_ranges_(OC, 64, colsum_, &j);
}

void zdp_nn_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int64_t N, int64_t C, int64_t OC, int accumulate) {
    /* out (N,OC) = inp (N,C) @ weight^T (C,OC) [+ out] */
    zdp_nn_sgemm_(CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C,
                  accumulate ? 1.0f : 0.0f, out, OC);
    if (bias != NULL) {
        bias_job j = {.out = out, .bias = bias, .OC = OC};
        zdp_nn_parallel_ranges_(N, 16, add_bias_rows_, &j);
    }
}

void zdp_nn_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int64_t N, int64_t C,
                            int64_t OC) {
    if (dinp != NULL) /* dinp (N,C) += dout (N,OC) @ weight (OC,C) */
        zdp_nn_sgemm_(CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp,
                      C);
    if (dweight != NULL) /* dweight (OC,C) += dout^T (OC,N) @ inp (N,C) */
        zdp_nn_sgemm_(CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight,
                      C);
    if (dbias != NULL) zdp_nn_colsum_add_(dbias, dout, N, OC);
}

double zdp_nn_crossentropy_forward(float *probs, const float *logits, const int64_t *targets,
                                   int64_t N, int64_t V) {
    double total = 0.0;
    for (int64_t n = 0; n < N; n++) {
        const float *row = logits + n * V;
        float *p = probs + n * V;
        float maxv = row[0];
        for (int64_t v = 1; v < V; v++) maxv = row[v] > maxv ? row[v] : maxv;
        double sum = 0.0;
        for (int64_t v = 0; v < V; v++) {
            p[v] = expf(row[v] - maxv);
            sum += p[v];
        }
        for (int64_t v = 0; v < V; v++) p[v] = (float)(p[v] / sum);
        total += log(sum) + maxv - row[targets[n]];
    }
    return N > 0 ? total / (double)N : 0.0;
}

void zdp_nn_crossentropy_backward(float *dlogits, const float *probs, const int64_t *targets,
                                  float dloss, int64_t N, int64_t V) {
    const float s = N > 0 ? dloss / (float)N : 0.0f;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t v = 0; v < V; v++) dlogits[n * V + v] = s * probs[n * V + v];
        dlogits[n * V + targets[n]] -= s;
    }
}
