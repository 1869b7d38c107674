/*
 * nn.c -- linear and softmax cross-entropy kernels (see nn.h).
 * Matmuls go through cblas_sgemm or zdp's own GEMM (gemm.c, on the shapes
 * where it beats the BLAS: zdp_nn_gemm_wins_) on row-major data, split over the
 * thread pool by zdp_nn_sgemm_; also here: the pool helpers the kernels
 * share.
 */
#include "nn.h"
#include "gemm.h"

#include <math.h>
#include <string.h>


/* ---- splitting work over the pool ------------------------------------------------- */

/* How a GEMM is cut.  Products that cblas_sgemm computes: along M (rows
 * of C) only, pieces starting on multiples of GEMM_ALIGN_ rows, so every
 * piece tiles like the whole; and none below GEMM_MIN_MNK_ multiply-adds,
 * where OpenBLAS 0.3.21 may take another kernel with other rounding (its
 * AVX-512 core's "direct" sgemm below 28 * 512^2), and where a piece is too
 * small to pay for its packing anyway.  192 = lcm(64, 24): OpenBLAS's
 * AVX-512 kernels take up to 16 x 4 or 4 x 16 blocks, its AVX2 ones 24 rows
 * of a row-major C, and an edge block may round differently (the AVX2
 * core's pieces cut at a row that is not a multiple of 24 differ from the
 * whole).  Not along N: the AVX2 core's pieces of N differ from the whole
 * wherever they are cut, even at multiples of 192 (its blocking
 * of that side depends on the extent).  Within those rules each element is
 * computed by one single-threaded call with the whole K, exactly as the
 * undivided call computes it (tests/unit/test_pool.c checks it under the
 * core the environment picks).  Products that zdp's GEMM computes (gemm.c)
 * give the same bits cut anywhere along M or N; they are cut at its tiles
 * (GEMM_ZDP_ALIGN_M_ rows, GEMM_ZDP_ALIGN_N_ columns: the AVX-512 tile is
 * 8 x 48, the AVX2 one 6 x 16) so that no piece has an edge tile the whole
 * has not. */
#define GEMM_ALIGN_ 192
#define GEMM_ZDP_ALIGN_M_ 16
#define GEMM_ZDP_ALIGN_N_ 48
#define GEMM_MIN_MNK_ (1LL << 23)

/* Which dimension of product g is cut, and at what multiple.  cblas: M.
 * zdp's GEMM: N where op(A) is A itself (its AVX-512 path reads A in place,
 * so pieces of N share A without copying it and each packs only its own
 * columns of B) when N has two tiles or more; else M when M >= N, else N. */
static int gemm_cut_n_(const zdp_nn_gemm *g, int64_t *align) {
    if (!zdp_nn_gemm_wins_(g)) {
        *align = GEMM_ALIGN_;
        return 0;
    }
    const int n = g->ta == CblasNoTrans ? g->N >= 2 * GEMM_ZDP_ALIGN_N_ : g->M < g->N;
    *align = n ? GEMM_ZDP_ALIGN_N_ : GEMM_ZDP_ALIGN_M_;
    return n;
}

/* Pieces of one product: at most one per alignment unit of the dimension
 * it is cut along (so the rounded bounds increase) and per GEMM_MIN_MNK_
 * multiply-adds; at most `want`, at least 1. */
static int64_t gemm_pieces_(const zdp_nn_gemm *g, int64_t want) {
    int64_t align;
    const int64_t len = gemm_cut_n_(g, &align) ? g->N : g->M;
    const int64_t by_mnk =
        (int64_t)((double)g->M * (double)g->N * (double)g->K / (double)GEMM_MIN_MNK_);
    int64_t most = by_mnk < len / align ? by_mnk : len / align;
    if (most > want) most = want;
    return most < 1 ? 1 : most;
}

/* Piece t of n over [0, len): bounds rounded to align. */
static void gemm_span_(int64_t len, int64_t align, int64_t n, int64_t t, int64_t *lo,
                       int64_t *hi) {
    *lo = t == 0 ? 0 : (len * t / n + align / 2) / align * align;
    *hi = t == n - 1 ? len : (len * (t + 1) / n + align / 2) / align * align;
}

/* Piece t of n of product g (gemm_cut_n_ says along which dimension). */
static void gemm_piece_(const zdp_nn_gemm *g, int64_t n, int64_t t) {
    int64_t lo, hi, align;
    if (!gemm_cut_n_(g, &align)) {
        gemm_span_(g->M, align, n, t, &lo, &hi);
        /* Rows lo..hi of op(A): rows of A, or columns when transposed. */
        const float *a = g->A + (g->ta == CblasNoTrans ? lo * g->lda : lo);
        if (zdp_nn_gemm_wins_(g))
            zdp_nn_gemm_compute(g->ta, g->tb, hi - lo, g->N, g->K, a, g->lda, g->B, g->ldb,
                        g->beta != 0.0f, g->C + lo * g->ldc, g->ldc);
        else
            cblas_sgemm(CblasRowMajor, g->ta, g->tb, (int)(hi - lo), (int)g->N, (int)g->K, g->alpha,
                        a, (int)g->lda, g->B, (int)g->ldb, g->beta, g->C + lo * g->ldc, (int)g->ldc);
    } else {
        gemm_span_(g->N, align, n, t, &lo, &hi);
        /* Columns lo..hi of op(B): columns of B, or rows when transposed. */
        const float *b = g->B + (g->tb == CblasNoTrans ? lo : lo * g->ldb);
        if (zdp_nn_gemm_wins_(g))
            zdp_nn_gemm_compute(g->ta, g->tb, g->M, hi - lo, g->K, g->A, g->lda, b, g->ldb,
                        g->beta != 0.0f, g->C + lo, g->ldc);
        else
            cblas_sgemm(CblasRowMajor, g->ta, g->tb, (int)g->M, (int)(hi - lo), (int)g->K, g->alpha,
                        g->A, (int)g->lda, b, (int)g->ldb, g->beta, g->C + lo, (int)g->ldc);
    }
}

#define GEMM_MANY_MAX_ 8

typedef struct sgemm_job {
    const zdp_nn_gemm *g;
    int n;
    int64_t first[GEMM_MANY_MAX_ + 1]; /* product i's pieces are tasks first[i] .. first[i+1] */
} sgemm_job;

static void sgemm_task_(void *ctx, int64_t t, int thread) {
    (void)thread;
    const sgemm_job *j = ctx;
    int i = 0;
    while (t >= j->first[i + 1]) i++;
    gemm_piece_(&j->g[i], j->first[i + 1] - j->first[i], t - j->first[i]);
}

void zdp_nn_sgemm_many_(const zdp_nn_gemm *g, int n) {
    /* gemm.c reads its mode and path from the pool's threads: settle both
     * here, before any task runs. */
    (void)zdp_nn_gemm_mode();
    (void)zdp_nn_gemm_path();
    for (int done = 0; done < n; done += GEMM_MANY_MAX_) {
        const int m = n - done < GEMM_MANY_MAX_ ? n - done : GEMM_MANY_MAX_;
        sgemm_job j = {.g = g + done, .n = m};
        /* zdp's GEMM products are each cut into one piece per thread, so
         * every thread gets an equal share of every product and the join
         * waits for no one: two products of equal multiply-adds run at
         * different speeds (a backward's dX and dW), and given whole, one
         * per thread, the faster thread would wait out the difference at
         * every join.  Cutting costs little here: pieces of N share A read in
         * place.  cblas products get threads in proportion to their
         * multiply-adds (rounded up): OpenBLAS packs both operands, so a
         * piece duplicates a whole operand's packing. */
        double total = 0.0;
        for (int i = 0; i < m; i++) total += (double)j.g[i].M * (double)j.g[i].N * (double)j.g[i].K;
        const int64_t P = zdp_pool_size();
        j.first[0] = 0;
        for (int i = 0; i < m; i++) {
            const double f = (double)j.g[i].M * (double)j.g[i].N * (double)j.g[i].K;
            const int64_t want = zdp_nn_gemm_wins_(&j.g[i])  ? P
                                 : total > 0.0               ? (int64_t)ceil((double)P * f / total)
                                                             : 1;
            j.first[i + 1] = j.first[i] + gemm_pieces_(&j.g[i], want);
        }
        zdp_pool_run(j.first[m], sgemm_task_, &j);
    }
}

void zdp_nn_gemm_1_(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
                    const float *A, int64_t lda, const float *B, int64_t ldb, int accumulate,
                    float *C, int64_t ldc) {
    const zdp_nn_gemm g = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .alpha = 1.0f, .A = A,
                           .lda = lda, .B = B, .ldb = ldb, .beta = accumulate ? 1.0f : 0.0f,
                           .C = C, .ldc = ldc};
    if (zdp_nn_gemm_wins_(&g))
        zdp_nn_gemm_compute(ta, tb, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
    else
        cblas_sgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb,
                    g.beta, C, (int)ldc);
}

void zdp_nn_gemm_settle_(void) {
    (void)zdp_nn_gemm_mode();
    (void)zdp_nn_gemm_path();
}

void zdp_nn_sgemm_(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                   float beta, float *C, int64_t ldc) {
    const zdp_nn_gemm g = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .alpha = alpha, .A = A,
                           .lda = lda, .B = B, .ldb = ldb, .beta = beta, .C = C, .ldc = ldc};
    zdp_nn_sgemm_many_(&g, 1);
}

#define RANGE_TASKS_PER_THREAD_ 4

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
    /* Up to RANGE_TASKS_PER_THREAD_ tasks per thread, not one: a thread
     * that starts late (woken from sleep, or descheduled by other work)
     * then takes fewer of them instead of the others waiting out its
     * whole share at the join.  The bodies work row by row or column by
     * column, so the cut changes no result. */
    const int64_t P = zdp_pool_size(), most = len / (min_len > 0 ? min_len : 1);
    const int64_t want = P > 1 ? RANGE_TASKS_PER_THREAD_ * P : 1;
    range_job j = {.len = len, .n_tasks = most < 1 ? 1 : most < want ? most : want, .body = body,
                   .ctx = ctx};
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

void zdp_nn_linear_forward_shared(int n, float *const *out, const float *inp,
                                  const float *const *weight, const float *const *bias,
                                  const int64_t *OC, int64_t N, int64_t C) {
    zdp_nn_gemm g[GEMM_MANY_MAX_];
    for (int done = 0; done < n; done += GEMM_MANY_MAX_) {
        const int m = n - done < GEMM_MANY_MAX_ ? n - done : GEMM_MANY_MAX_;
        for (int i = 0; i < m; i++) /* out_i (N,OC_i) = inp (N,C) @ weight_i^T (C,OC_i) */
            g[i] = (zdp_nn_gemm){.ta = CblasNoTrans, .tb = CblasTrans, .M = N, .N = OC[done + i],
                                 .K = C, .alpha = 1.0f, .A = inp, .lda = C, .B = weight[done + i],
                                 .ldb = C, .beta = 0.0f, .C = out[done + i], .ldc = OC[done + i]};
        zdp_nn_sgemm_many_(g, m);
    }
    for (int i = 0; i < n; i++)
        if (bias != NULL && bias[i] != NULL) {
            bias_job j = {.out = out[i], .bias = bias[i], .OC = OC[i]};
            zdp_nn_parallel_ranges_(N, 16, add_bias_rows_, &j);
        }
}

void zdp_nn_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int64_t N, int64_t C,
                            int64_t OC, int flags) {
    /* The two products in one pool loop (zdp_nn_sgemm_many_). */
    zdp_nn_gemm g[2];
    int n = 0;
    if (dinp != NULL) /* dinp (N,C) (+)= dout (N,OC) @ weight (OC,C) */
        g[n++] = (zdp_nn_gemm){.ta = CblasNoTrans, .tb = CblasNoTrans, .M = N, .N = C, .K = OC,
                               .alpha = 1.0f, .A = dout, .lda = OC, .B = weight, .ldb = C,
                               .beta = (flags & ZDP_NN_SET_DINP) ? 0.0f : 1.0f, .C = dinp,
                               .ldc = C};
    if (dweight != NULL) /* dweight (OC,C) += dout^T (OC,N) @ inp (N,C) */
        g[n++] = (zdp_nn_gemm){.ta = CblasTrans, .tb = CblasNoTrans, .M = OC, .N = C, .K = N,
                               .alpha = 1.0f, .A = dout, .lda = OC, .B = inp, .ldb = C,
                               .beta = 1.0f, .C = dweight, .ldc = C};
    zdp_nn_sgemm_many_(g, n);
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
