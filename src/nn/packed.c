/*
 * packed.c -- C = A @ B for a B packed once into column panels, with our own
 * small-M kernels (see nn.h, "packed B").
 *
 * Why: a batch-32 decode step multiplies 32 rows by every weight matrix.
 * cblas_sgemm re-packs the whole weight for each such call (a large part of
 * a decode step), and the product itself is too short in M for OpenBLAS's
 * blocking.  Here each weight is packed once (by the KV cache that uses it,
 * on its first batched step) into panels of NR_ columns, K rows each:
 *   panel j (K, NR_) = B[:, j*NR_ .. j*NR_+NR_), zero-padded past N,
 * so a kernel streams one panel from start to end while it keeps a block of
 * up to MR_ rows of C in registers.  Paths, chosen at run time: AVX-512
 * (8 rows x 3 panels, the last one or two panels 8 x 2 or 8 x 1), AVX2+FMA
 * (6 rows x 1 panel), portable C (4 rows x 1 panel, which GCC vectorises
 * across the panel's columns).
 *
 * Long products (prefills) run in row blocks of MC_ rows, each block against
 * every panel unit in turn, so A's block stays in L2 (without them a long A
 * is read back from memory for every panel unit).
 *
 * Every element of C is one chain of fused multiply-adds in k order (the
 * C path: multiply then add, unless the compiler contracts), continued
 * across K blocks, so it does not depend on how the work is split over
 * threads (by panels) or on M; the paths differ only in rounding (FMA or
 * not).
 */
#include "nn.h"
#include "gemm.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define ZDP_PACKED_X86_ 1
#endif

#define NR_ 16  /* columns per panel */
#define MR_ 6   /* rows per register block (AVX paths) */
#define MC_ 128 /* rows of a row block (prefills): A's block (MC_, K) stays in L2 */
/* Rows of a panel block: 3 x 16 KB on the AVX-512 path.  Each K block loads
 * and stores the rows' C block once more, so fewer, deeper blocks save
 * those passes; deeper than 256, the next block fetched while this one
 * runs crowds L1 when the weights stream from memory. */
#define KC_ 256
#define SPREAD_ROWS_ 64 /* products of 9..SPREAD_ROWS_ rows (decode batches) spread the next block's fetch */
#define AVX2_ROWS_ 64 /* the most rows the AVX2 kernel is used for (zdp_nn_packed_wins) */
#define PF_ 32  /* panel rows the AVX-512 kernel prefetches ahead (2 KB) */

static _Atomic int isa_now_ = -1; /* the path in use; -1: not asked yet */

static int isa_(void) {
    if (isa_now_ < 0) isa_now_ = zdp_nn_isa();
    return isa_now_;
}

int zdp_nn_packed_path(void) { return isa_(); }

int zdp_nn_packed_use_path(int want) {
    const int best = zdp_nn_isa_best();
    isa_now_ = want < 0 ? 0 : want < best ? want : best;
    return isa_now_;
}

int zdp_nn_packed_wins(int64_t M) {
    /* Against OpenBLAS on a decode step's shapes (docs/benchmarks.md): the
     * AVX-512 kernels win up to 256 rows; the AVX2 kernel wins at decode
     * batches (up to AVX2_ROWS_ rows) and loses at prefills; the portable
     * C kernel (multiply, then add) is far behind. */
    const int mode = zdp_nn_gemm_mode();
    if (mode != 1) return mode == 2;
    return isa_() == 2 || (isa_() == 1 && M <= AVX2_ROWS_);
}

int64_t zdp_nn_packed_floats(int64_t K, int64_t N) { return K * ((N + NR_ - 1) / NR_ * NR_); }

void zdp_nn_pack_b(float *dst, const float *W, int64_t K, int64_t N, int trans) {
    const int64_t np = (N + NR_ - 1) / NR_;
    for (int64_t j = 0; j < np; j++) {
        float *p = dst + j * K * NR_; /* (K, NR_) */
        for (int64_t k = 0; k < K; k++)
            for (int64_t c = 0; c < NR_; c++) {
                const int64_t n = j * NR_ + c;
                /* trans: W is (N, K) (torch.nn.Linear's weight); else (K, N). */
                p[k * NR_ + c] = n >= N ? 0.0f : trans ? W[n * K + k] : W[k * N + n];
            }
    }
}

/* ---- kernels: c (mr, ncols) [+]= a (mr, kc) @ panel block (kc, NR_ per panel) [+ bias] ----
 * a: rows at lda; b0, b1: the panels' blocks (kc, NR_); c at ldc.  load:
 * start from c (else 0).  ncols: the columns of c that exist (<= NR_ per
 * panel: the last panel is cut at N).  bias (the block's columns; NULL:
 * none), on the last K block only: added to the finished sums before they
 * are stored, while they are in registers (a separate pass over C after the
 * product was 3-4% of a gpt-m prefill); the same one rounding as after. */

static void kernel_c_(int64_t mr, int64_t kc, const float *a, int64_t lda, const float *b, float *c,
                      int64_t ldc, int64_t ncols, int load, const float *bias) {
    for (int64_t r0 = 0; r0 < mr; r0 += 4) {
        const int64_t rn = mr - r0 < 4 ? mr - r0 : 4;
        float acc[4][NR_];
        for (int64_t r = 0; r < 4; r++)
            for (int64_t j = 0; j < NR_; j++)
                acc[r][j] = load && r < rn && j < ncols ? c[(r0 + r) * ldc + j] : 0.0f;
        for (int64_t k = 0; k < kc; k++) {
            const float *bk = b + k * NR_;
            for (int64_t r = 0; r < rn; r++) {
                const float av = a[(r0 + r) * lda + k];
                for (int64_t j = 0; j < NR_; j++) acc[r][j] += av * bk[j];
            }
        }
        for (int64_t r = 0; r < rn; r++)
            for (int64_t j = 0; j < ncols; j++)
                c[(r0 + r) * ldc + j] = bias != NULL ? acc[r][j] + bias[j] : acc[r][j];
    }
}

#ifdef ZDP_PACKED_X86_
/* R rows (1..MR_, a constant where inlined) of C's panel columns against
 * one panel: 2R accumulators, 2 panel loads and R broadcasts per 2R fused
 * multiply-adds.  With R constant every loop over the rows unrolls and the
 * sums stay in registers (with a row count known only at run time, GCC
 * kept them in memory and stored all of them back after every k step: 0.6
 * FMA a cycle instead of 2). */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void
rows_avx2_(const int R, int64_t kc, const float *ar, int64_t lda, const float *b, float *c, int64_t ldc,
           int64_t ncols, int load, const float *bias) {
    __m256 lo[MR_], hi[MR_];
    float tmp[NR_];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        lo[r] = hi[r] = _mm256_setzero_ps();
        if (load) {
            for (int64_t j = 0; j < NR_; j++) tmp[j] = j < ncols ? c[r * ldc + j] : 0.0f;
            lo[r] = _mm256_loadu_ps(tmp), hi[r] = _mm256_loadu_ps(tmp + 8);
        }
    }
    for (int64_t k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_loadu_ps(b + k * NR_), b1 = _mm256_loadu_ps(b + k * NR_ + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 av = _mm256_broadcast_ss(ar + r * lda + k);
            lo[r] = _mm256_fmadd_ps(av, b0, lo[r]);
            hi[r] = _mm256_fmadd_ps(av, b1, hi[r]);
        }
    }
    if (bias != NULL) {
        for (int64_t j = 0; j < NR_; j++) tmp[j] = j < ncols ? bias[j] : 0.0f;
        const __m256 blo = _mm256_loadu_ps(tmp), bhi = _mm256_loadu_ps(tmp + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) lo[r] = _mm256_add_ps(lo[r], blo), hi[r] = _mm256_add_ps(hi[r], bhi);
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        float *cr = c + r * ldc;
        if (ncols == NR_) {
            _mm256_storeu_ps(cr, lo[r]);
            _mm256_storeu_ps(cr + 8, hi[r]);
        } else {
            _mm256_storeu_ps(tmp, lo[r]);
            _mm256_storeu_ps(tmp + 8, hi[r]);
            for (int64_t j = 0; j < ncols; j++) cr[j] = tmp[j];
        }
    }
}

__attribute__((target("avx2,fma"))) static void kernel_avx2_(int64_t mr, int64_t kc, const float *a,
                                                             int64_t lda, const float *b, float *c,
                                                             int64_t ldc, int64_t ncols, int load,
                                                             const float *bias) {
    for (int64_t r0 = 0; r0 < mr; r0 += MR_) {
        const float *ar = a + r0 * lda;
        float *cr = c + r0 * ldc;
        switch (mr - r0 < MR_ ? mr - r0 : MR_) {
        case 1: rows_avx2_(1, kc, ar, lda, b, cr, ldc, ncols, load, bias); break;
        case 2: rows_avx2_(2, kc, ar, lda, b, cr, ldc, ncols, load, bias); break;
        case 3: rows_avx2_(3, kc, ar, lda, b, cr, ldc, ncols, load, bias); break;
        case 4: rows_avx2_(4, kc, ar, lda, b, cr, ldc, ncols, load, bias); break;
        case 5: rows_avx2_(5, kc, ar, lda, b, cr, ldc, ncols, load, bias); break;
        default: rows_avx2_(MR_, kc, ar, lda, b, cr, ldc, ncols, load, bias); break;
        }
    }
}

/* Two panels at once, up to MR512_ rows: 16 accumulators, 2 panel loads and
 * 8 broadcasts per 16 fused multiply-adds (6 rows left a 2-row block at a
 * batch of 32 and reloaded each panel block from L1 six times).  b1 NULL:
 * one panel (the odd last one).  pf: while the first row block runs, fetch
 * the panels' next pf floats past this block (the next K block, or the next
 * pair's start: one cache line per panel and k), so that the weight stream
 * is already in flight when the kernel gets there; 0: none. */
#define MR512_ 8
__attribute__((target("avx512f"))) static void kernel_avx512_(int64_t mr, int64_t kc, const float *a,
                                                              int64_t lda, const float *b0p,
                                                              const float *b1p, float *c, int64_t ldc,
                                                              int64_t ncols0, int64_t ncols1, int load,
                                                              int64_t pf, const float *bias) {
    const __mmask16 m0 = (__mmask16)((1u << ncols0) - 1u), m1 = (__mmask16)((1u << ncols1) - 1u);
    for (int64_t r0 = 0; r0 < mr; r0 += MR512_) {
        const int64_t rn = mr - r0 < MR512_ ? mr - r0 : MR512_;
        __m512 x[MR512_], y[MR512_];
        for (int64_t r = 0; r < MR512_; r++) {
            const bool on = load && r < rn;
            x[r] = on ? _mm512_maskz_loadu_ps(m0, c + (r0 + r) * ldc) : _mm512_setzero_ps();
            y[r] = on && b1p != NULL ? _mm512_maskz_loadu_ps(m1, c + (r0 + r) * ldc + NR_)
                                     : _mm512_setzero_ps();
        }
        const float *ar = a + r0 * lda;
        const bool fetch = r0 == 0 && pf > 0;
        if (b1p != NULL && rn == MR512_) {
            for (int64_t k = 0; k < kc; k++) {
                if (fetch) {
                    _mm_prefetch((const char *)(b0p + pf + k * NR_), _MM_HINT_T0);
                    _mm_prefetch((const char *)(b1p + pf + k * NR_), _MM_HINT_T0);
                }
                const __m512 b0 = _mm512_loadu_ps(b0p + k * NR_), b1 = _mm512_loadu_ps(b1p + k * NR_);
                for (int r = 0; r < MR512_; r++) {
                    const __m512 av = _mm512_set1_ps(ar[r * lda + k]);
                    x[r] = _mm512_fmadd_ps(av, b0, x[r]);
                    y[r] = _mm512_fmadd_ps(av, b1, y[r]);
                }
            }
        } else if (b1p != NULL) {
            for (int64_t k = 0; k < kc; k++) {
                if (fetch) {
                    _mm_prefetch((const char *)(b0p + pf + k * NR_), _MM_HINT_T0);
                    _mm_prefetch((const char *)(b1p + pf + k * NR_), _MM_HINT_T0);
                }
                const __m512 b0 = _mm512_loadu_ps(b0p + k * NR_), b1 = _mm512_loadu_ps(b1p + k * NR_);
                for (int64_t r = 0; r < rn; r++) {
                    const __m512 av = _mm512_set1_ps(ar[r * lda + k]);
                    x[r] = _mm512_fmadd_ps(av, b0, x[r]);
                    y[r] = _mm512_fmadd_ps(av, b1, y[r]);
                }
            }
        } else {
            for (int64_t k = 0; k < kc; k++) {
                if (fetch) _mm_prefetch((const char *)(b0p + pf + k * NR_), _MM_HINT_T0);
                const __m512 b0 = _mm512_loadu_ps(b0p + k * NR_);
                for (int64_t r = 0; r < rn; r++)
                    x[r] = _mm512_fmadd_ps(_mm512_set1_ps(ar[r * lda + k]), b0, x[r]);
            }
        }
        if (bias != NULL) {
            const __m512 bx = _mm512_maskz_loadu_ps(m0, bias);
            const __m512 by = b1p != NULL ? _mm512_maskz_loadu_ps(m1, bias + NR_) : _mm512_setzero_ps();
            for (int64_t r = 0; r < rn; r++) x[r] = _mm512_add_ps(x[r], bx), y[r] = _mm512_add_ps(y[r], by);
        }
        for (int64_t r = 0; r < rn; r++) {
            _mm512_mask_storeu_ps(c + (r0 + r) * ldc, m0, x[r]);
            if (b1p != NULL) _mm512_mask_storeu_ps(c + (r0 + r) * ldc + NR_, m1, y[r]);
        }
    }
}

/* Three panels at once, up to MR512_ rows: 24 accumulators, 3 panel loads
 * and 8 broadcasts per 24 fused multiply-adds (the 2-panel kernel's 10 loads
 * per 16 fused multiply-adds bound it by the loads; 6 rows x 4 panels gains
 * nothing over 3 panels, with a 16-column panel kept).
 * ncols[q]: the columns of panel q that exist (<= NR_).
 *
 * nb[q], nrows: the panel block after this one (packed_range_: the same
 * panels' next K block, or the next unit's first), fetched to L1 while this
 * one runs: each row block fetches its share of nrows rows, its 3 x share
 * lines spread evenly over all of its kc steps (a line every 1.3 steps at
 * 32 rows).  Spread so, the weights stream from memory at an even rate
 * through all the row blocks and steps (three lines a step over the first
 * share steps, then none, would queue the fetches in bursts behind L1's
 * miss buffers); a fetch PF_ rows ahead in the first row block alone (as
 * the 2-panel kernel does) would ask for the stream in bursts at the rate
 * the first row block consumes it, past what one core reads from memory,
 * while the other row blocks read none. */
#define K3_STEP_(k, rows)                                                                    \
    do {                                                                                     \
        __m512 b_[3];                                                                        \
        for (int q = 0; q < 3; q++) b_[q] = _mm512_loadu_ps(b0p + q * bstride + (k) * NR_);  \
        for (int r = 0; r < (rows); r++) {                                                   \
            const __m512 av = _mm512_set1_ps(ar[r * lda + (k)]);                             \
            for (int q = 0; q < 3; q++) x[r][q] = _mm512_fmadd_ps(av, b_[q], x[r][q]);       \
        }                                                                                    \
    } while (0)
__attribute__((target("avx512f"))) static void kernel_avx512x3_(int64_t mr, int64_t kc, const float *a,
                                                                int64_t lda, const float *b0p,
                                                                int64_t bstride, float *c, int64_t ldc,
                                                                const int64_t *ncols, int load,
                                                                const float *const *nb, int64_t nrows,
                                                                int spread, const float *bias) {
    __mmask16 m[3];
    for (int q = 0; q < 3; q++) m[q] = (__mmask16)((1u << ncols[q]) - 1u);
    const int64_t nblk = (mr + MR512_ - 1) / MR512_;
    for (int64_t r0 = 0; r0 < mr; r0 += MR512_) {
        const int64_t rn = mr - r0 < MR512_ ? mr - r0 : MR512_;
        __m512 x[MR512_][3];
        for (int64_t r = 0; r < MR512_; r++)
            for (int q = 0; q < 3; q++)
                x[r][q] = load && r < rn ? _mm512_maskz_loadu_ps(m[q], c + (r0 + r) * ldc + q * NR_)
                                         : _mm512_setzero_ps();
        const float *ar = a + r0 * lda;
        /* This row block's share of the next block: rows lo .. lo+nf (spread
         * 0: all of them in the first row block). */
        const int64_t blk = r0 / MR512_, lo = spread ? blk * nrows / nblk : 0;
        int64_t nf = spread ? (blk + 1) * nrows / nblk - lo : blk == 0 ? nrows : 0;
        nf = nf < kc ? nf : kc;
        /* Its 3 nf lines over the kc steps, Bresenham's stepping: row by row,
         * the three panels' lines of a row in turn (not spread: nf is kc or
         * 0, so the first row block fetches one row of each panel a step). */
        const int64_t lines = 3 * nf;
        int64_t due = 0, pq = 0, row = lo;
#define K3_FETCH_()                                                                          \
    for (due += lines; due >= kc; due -= kc) {                                               \
        _mm_prefetch((const char *)(nb[pq] + row * NR_), _MM_HINT_T0);                       \
        if (++pq == 3) pq = 0, row++;                                                        \
    }
        if (rn == MR512_)
            for (int64_t k = 0; k < kc; k++) {
                K3_FETCH_();
                K3_STEP_(k, MR512_);
            }
        else
            for (int64_t k = 0; k < kc; k++) {
                K3_FETCH_();
                K3_STEP_(k, rn);
            }
        if (bias != NULL)
            for (int q = 0; q < 3; q++) {
                const __m512 bq = _mm512_maskz_loadu_ps(m[q], bias + q * NR_);
                for (int64_t r = 0; r < rn; r++) x[r][q] = _mm512_add_ps(x[r][q], bq);
            }
        for (int64_t r = 0; r < rn; r++)
            for (int q = 0; q < 3; q++)
                _mm512_mask_storeu_ps(c + (r0 + r) * ldc + q * NR_, m[q], x[r][q]);
    }
}
#undef K3_STEP_
#undef K3_FETCH_
#endif

/* ---- the product, split over the pool by panels ---------------------------------- */

typedef struct packed_job_ {
    float *C;
    const float *A, *B, *bias;
    int64_t M, K, N, lda, ldc, np;
    int accumulate, isa;
} packed_job_;

/* Panel units [lo, hi): triples on the AVX-512 path (the last unit holds
 * the one or two panels left, if any), single panels on the others.
 * Unit by unit, K block by K block within it: each panel is K rows
 * of NR_ columns, contiguous (zdp_nn_pack_b), so the weights are read front
 * to back as one stream per panel, and every row of C meets a K block of
 * the panels (24 KB on the AVX-512 path, in L1) before the next is read;
 * C's columns of the panels (M x 3 NR_) stay in L1 between K blocks. */
static void packed_range_(void *ctx, int64_t lo, int64_t hi) {
    const packed_job_ *j = ctx;
    const int64_t step = j->isa == 2 ? 3 : 1;
    lo *= step, hi = hi * step < j->np ? hi * step : j->np;
    for (int64_t m0 = 0; m0 < j->M; m0 += MC_) { /* row blocks: A's block stays in L2 */
        for (int64_t p = lo; p < hi; p += step) {
            const int64_t M = j->M - m0 < MC_ ? j->M - m0 : MC_;
            float *c = j->C + m0 * j->ldc + p * NR_;
            const int64_t n0 = j->N - p * NR_ < NR_ ? j->N - p * NR_ : NR_;
            for (int64_t k0 = 0; k0 < j->K; k0 += KC_) {
                const int64_t kc = j->K - k0 < KC_ ? j->K - k0 : KC_;
                const int load = k0 > 0 || j->accumulate;
                const float *a = j->A + m0 * j->lda + k0;
                const float *b = j->B + p * j->K * NR_ + k0 * NR_;
                const float *bias = j->bias != NULL && k0 + kc == j->K ? j->bias + p * NR_ : NULL;
#ifdef ZDP_PACKED_X86_
                if (j->isa == 2 && p + 2 < hi) { /* a triple */
                    int64_t nc[3];
                    for (int q = 0; q < 3; q++)
                        nc[q] = j->N - (p + q) * NR_ < NR_ ? j->N - (p + q) * NR_ : NR_;
                    /* The block to fetch meanwhile: these panels' next K
                     * block, else the next unit's first (its last panel
                     * repeated where it has fewer than 3), else none. */
                    const float *nb[3];
                    int64_t nrows = 0;
                    const int spread = M > MR512_ && M <= SPREAD_ROWS_;
                    if (!spread) { /* PF_ rows ahead, in the first row block */
                        /* (one row block: a whole block ahead is fetched too
                         * early; a prefill's 128-row blocks consume the
                         * stream fast enough without the spread) */
                        for (int q = 0; q < 3; q++) nb[q] = b + q * j->K * NR_ + PF_ * NR_;
                        nrows = kc;
                    } else if (k0 + kc < j->K) {
                        for (int q = 0; q < 3; q++) nb[q] = b + q * j->K * NR_ + kc * NR_;
                        nrows = j->K - k0 - kc < KC_ ? j->K - k0 - kc : KC_;
                    } else {
                        const int64_t u = p + 3 < hi ? p + 3 : m0 + MC_ < j->M ? lo : hi;
                        for (int q = 0; q < 3; q++)
                            nb[q] = j->B + (u + q < hi ? u + q : hi - 1) * j->K * NR_;
                        nrows = u < hi ? (j->K < KC_ ? j->K : KC_) : 0;
                    }
                    kernel_avx512x3_(M, kc, a, j->lda, b, j->K * NR_, c, j->ldc, nc, load, nb, nrows, spread, bias);
                    continue;
                }
                if (j->isa == 2) { /* the last one or two panels */
                    const bool two = p + 1 < hi;
                    const int64_t n1 = two ? (j->N - (p + 1) * NR_ < NR_ ? j->N - (p + 1) * NR_ : NR_) : 0;
                    kernel_avx512_(M, kc, a, j->lda, b, two ? b + j->K * NR_ : NULL, c, j->ldc, n0, n1, load,
                                   PF_ * NR_, bias);
                    continue;
                }
                if (j->isa == 1) {
                    kernel_avx2_(M, kc, a, j->lda, b, c, j->ldc, n0, load, bias);
                    continue;
                }
#endif
                kernel_c_(M, kc, a, j->lda, b, c, j->ldc, n0, load, bias);
            }
        }
    }
}

void zdp_nn_packed_gemm(float *C, int64_t ldc, const float *A, int64_t lda, const float *Bp,
                        const float *bias, int64_t M, int64_t K, int64_t N, int accumulate) {
    packed_job_ j = {.C = C, .A = A, .B = Bp, .bias = bias, .M = M, .K = K, .N = N, .lda = lda,
                     .ldc = ldc, .np = (N + NR_ - 1) / NR_, .accumulate = accumulate, .isa = isa_()};
    const int64_t units = j.isa == 2 ? (j.np + 2) / 3 : j.np;
    /* A task of at least ~64k multiply-adds: smaller ones cost more to hand out. */
    const int64_t per_unit = M * K * (j.isa == 2 ? 3 * NR_ : NR_);
    zdp_nn_parallel_ranges_(units, per_unit >= (1 << 16) ? 1 : (1 << 16) / (per_unit + 1) + 1,
                            packed_range_, &j);
}
