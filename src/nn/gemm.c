/*
 * gemm.c -- zdp's own single-precision GEMM for training's large-M products
 * (see gemm.h): C (M,N) [+]= op(A) (M,K) @ op(B) (K,N), row-major.
 *
 * Why: a small model's training products have K of a few hundred to a
 * few thousand and M = batch x sequence; K is shallow, so OpenBLAS's
 * packing of both operands and its separate beta pass over C are a large
 * part of each product (docs/benchmarks-llama.md).  This file does the same job
 * with blocking chosen for these shapes, packs each operand with a loop made
 * for its layout, and folds beta into the micro-kernel (C is loaded into
 * the registers, or not, before the k loop: no pass over C).
 *
 * The blocking (BLIS's loop order): for each block of nc columns of C (N in
 * near-equal blocks of at most NC_MAX_ columns, or of B_DIRECT_FLOATS_ / kc
 * when A is read in place), for each block of kc rows of K, B's block (kc,
 * nc) is packed into panels of NR columns (panel q: (kc, NR), k-major; the
 * block stays in L2); for
 * each block of MC rows of C, A's block is packed into strips of MR rows
 * (strip s: (kc, MR), k-major) -- on the AVX-512 path a row-major A is not
 * packed but read in place; then every (strip, panel) pair is one call of
 * the micro-kernel, which keeps an MR x NR tile of C in registers for the
 * whole kc.  Micro-kernels, chosen at run time: AVX-512 (8 x 48: 24
 * accumulators, 3 loads of B and 8 broadcasts of A per 24 FMAs; a 14 x 32
 * tile needs more loads per FMA), AVX2+FMA (6 x 16), portable
 * C (4 x 16).  8 x 48 tiles the step's shapes exactly (M = 1024; N and K
 * multiples of 48).  Edge tiles run the same kernel on a zero-padded copy.
 *
 * Invariant: every element of C is one chain of fused multiply-adds in k
 * order, starting from C (accumulate, or a later K block) or from 0, so the
 * result does not depend on the tile, the blocks, M, N or where a piece of
 * C starts: the pool may cut a product anywhere along M or N and the result
 * is the whole product's, bit for bit.  The AVX paths and the C path (where
 * the compiler has a fast fmaf) round identically.
 *
 * The k loops of both AVX-512 kernels compile without a spill (24 FMAs, 3
 * loads of B, 8 broadcasts of A per k), so they run near the core's FMA
 * peak.  The transposed A of dW is prefetched while it is packed, and the
 * packing buffer is kept per thread (no page faults per product).  How it
 * compares with OpenBLAS, and what was tried and not kept, is in
 * docs/benchmarks-llama.md.
 *
 * Not here: alpha other than 1, beta other than 0 and 1 (cblas_sgemm takes
 * those), threads (the pool's tasks call this on pieces, nn.c).
 */
/* The kernels are the product's whole cost: optimised in every build (a
 * Debug build's -O0 made the sanitizer runs of the model tests time out). */
#if defined(__GNUC__) && !defined(__clang__) && !defined(__OPTIMIZE__)
#pragma GCC optimize("O2")
#endif

#include "gemm.h"
#include "blas_wide.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define ZDP_GEMM_X86_ 1
#endif

#define KC_MAX_ 384   /* deepest K block: K = 576 in 2 blocks of 288 (a panel: 54 KB), 1536 in 4 */
#define MC_STRIPS_ 12 /* strips per A block: 96 x 384 floats = 147 KB on the AVX-512 path, in L2 */
#define NC_MAX_ 768   /* columns per B block: 288 x 768 floats = 885 KB, in L2 */
/* The B block's floats when A is read in place (no packed A block beside
 * it): at most 768 KB, so that the block stays in a 1.25 MB L2 with A's
 * rows and C's tiles (a larger block is read back from L3 for every block
 * of A).  Packed A keeps NC_MAX_: a narrower B block packs A once more per
 * block. */
#define B_DIRECT_FLOATS_ (384 * 512)
#define PF_A_ 128     /* floats of a packed A strip the AVX-512 kernel prefetches ahead (16 k steps) */
#define PF_K_ 16      /* rows of a transposed A the AVX-512 packing prefetches ahead */
#define MR_MAX_ 8
#define NR_MAX_ 48

#ifdef FP_FAST_FMAF
#define FMA_(a, b, c) fmaf((a), (b), (c))
#else
#define FMA_(a, b, c) ((a) * (b) + (c))
#endif

/* c (MR, NR) at ldc [+]= a (kc, MR) @ b (kc, NR): load = start from c, else 0.
 * c_next: the next tile's C (prefetched), or NULL. */
typedef void (*ukr_fn_)(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int load,
                        const float *c_next);

/* ---- micro-kernels ------------------------------------------------------------------ */

enum { C_MR_ = 4, C_NR_ = 16 };

static void ukr_c_(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int load,
                   const float *c_next) {
    (void)c_next;
    float acc[C_MR_][C_NR_]; /* (MR, NR) */
    for (int r = 0; r < C_MR_; r++)
        for (int j = 0; j < C_NR_; j++) acc[r][j] = load ? c[r * ldc + j] : 0.0f;
    for (int64_t k = 0; k < kc; k++)
        for (int r = 0; r < C_MR_; r++) {
            const float av = a[k * C_MR_ + r];
            for (int j = 0; j < C_NR_; j++) acc[r][j] = FMA_(av, b[k * C_NR_ + j], acc[r][j]);
        }
    for (int r = 0; r < C_MR_; r++)
        for (int j = 0; j < C_NR_; j++) c[r * ldc + j] = acc[r][j];
}

#ifdef ZDP_GEMM_X86_
enum { AVX2_MR_ = 6, AVX2_NR_ = 16 };

__attribute__((target("avx2,fma"))) static void ukr_avx2_(int64_t kc, const float *a, const float *b,
                                                          float *c, int64_t ldc, int load,
                                                          const float *c_next) {
    (void)c_next;
    __m256 c0[AVX2_MR_], c1[AVX2_MR_];
    for (int r = 0; r < AVX2_MR_; r++) {
        c0[r] = load ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
        c1[r] = load ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
    }
    for (int64_t k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_load_ps(b + k * AVX2_NR_), b1 = _mm256_load_ps(b + k * AVX2_NR_ + 8);
#pragma GCC unroll 6
        for (int r = 0; r < AVX2_MR_; r++) {
            const __m256 av = _mm256_broadcast_ss(a + k * AVX2_MR_ + r);
            c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
        }
    }
    for (int r = 0; r < AVX2_MR_; r++) {
        _mm256_storeu_ps(c + r * ldc, c0[r]);
        _mm256_storeu_ps(c + r * ldc + 8, c1[r]);
    }
}

enum { AVX512_MR_ = 8, AVX512_NR_ = 48 };

__attribute__((target("avx512f"))) static void ukr_avx512_(int64_t kc, const float *a, const float *b,
                                                           float *c, int64_t ldc, int load,
                                                           const float *c_next) {
    __m512 acc[AVX512_MR_][3]; /* the tile (8, 48): row r = acc[r][0] | acc[r][1] | acc[r][2] */
#pragma GCC unroll 8
    for (int r = 0; r < AVX512_MR_; r++)
#pragma GCC unroll 3
        for (int v = 0; v < 3; v++) acc[r][v] = load ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
    /* The next tile's C rows, fetched while this tile computes (its load
     * would otherwise wait on memory at the start of the next call). */
    if (c_next != NULL)
        for (int r = 0; r < AVX512_MR_; r++)
            for (int v = 0; v < 3; v++) _mm_prefetch((const char *)(c_next + r * ldc + 16 * v), _MM_HINT_T1);
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++) {
        const float *ak = a + k * AVX512_MR_;
        _mm_prefetch((const char *)(ak + PF_A_), _MM_HINT_T0);
        const __m512 b0 = _mm512_load_ps(b + k * AVX512_NR_), b1 = _mm512_load_ps(b + k * AVX512_NR_ + 16),
                     b2 = _mm512_load_ps(b + k * AVX512_NR_ + 32);
#pragma GCC unroll 8
        for (int r = 0; r < AVX512_MR_; r++) {
            const __m512 av = _mm512_set1_ps(ak[r]);
            acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(av, b2, acc[r][2]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < AVX512_MR_; r++)
#pragma GCC unroll 3
        for (int v = 0; v < 3; v++) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
}

/* ukr_avx512_ with A (8 rows of kc, at lda) read where it lies, not packed. */
__attribute__((target("avx512f"))) static void ukr_avx512_rows_(int64_t kc, const float *a, int64_t lda, const float *b,
                                                           float *c, int64_t ldc, int load,
                                                           const float *c_next) {
    __m512 acc[AVX512_MR_][3]; /* as ukr_avx512_, A read in place: row r at a + r lda */
#pragma GCC unroll 8
    for (int r = 0; r < AVX512_MR_; r++)
#pragma GCC unroll 3
        for (int v = 0; v < 3; v++) acc[r][v] = load ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
    /* The next tile's C rows, fetched while this tile computes (its load
     * would otherwise wait on memory at the start of the next call). */
    if (c_next != NULL)
        for (int r = 0; r < AVX512_MR_; r++)
            for (int v = 0; v < 3; v++) _mm_prefetch((const char *)(c_next + r * ldc + 16 * v), _MM_HINT_T1);
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++) {
        const __m512 b0 = _mm512_load_ps(b + k * AVX512_NR_), b1 = _mm512_load_ps(b + k * AVX512_NR_ + 16),
                     b2 = _mm512_load_ps(b + k * AVX512_NR_ + 32);
#pragma GCC unroll 8
        for (int r = 0; r < AVX512_MR_; r++) {
            const __m512 av = _mm512_set1_ps(a[r * lda + k]);
            acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(av, b2, acc[r][2]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < AVX512_MR_; r++)
#pragma GCC unroll 3
        for (int v = 0; v < 3; v++) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
}
#endif

/* ---- the path in use ------------------------------------------------------------------ */

typedef struct path_ {
    int mr, nr;
    ukr_fn_ ukr;
} path_;

/* Atomic: read by every product from whichever thread runs it (the pool's,
 * a server's workers); set once lazily (a race sets the same value) or by
 * the use_ calls between products. */
static _Atomic int isa_now_ = -1; /* the path in use; -1: not asked yet */
static _Atomic int mode_ = -1;    /* zdp_nn_gemm_mode; -1: not read yet */
static _Atomic int blas_narrow_ = -1; /* blas_narrower_(); -1: not asked yet */

static int isa_(void) {
    if (isa_now_ < 0) isa_now_ = zdp_nn_isa();
    return isa_now_;
}

static path_ path_now_(void) {
#ifdef ZDP_GEMM_X86_
    switch (isa_()) {
    case 2: return (path_){AVX512_MR_, AVX512_NR_, ukr_avx512_};
    case 1: return (path_){AVX2_MR_, AVX2_NR_, ukr_avx2_};
    default: break;
    }
#endif
    return (path_){C_MR_, C_NR_, ukr_c_};
}

int zdp_nn_gemm_path(void) { return isa_(); }

int zdp_nn_gemm_use_path(int want) {
    const int best = zdp_nn_isa_best();
    isa_now_ = want < 0 ? 0 : want < best ? want : best;
    return isa_now_;
}

int zdp_nn_gemm_mode(void) {
    if (mode_ < 0) {
        const char *e = getenv("ZDP_GEMM");
        mode_ = e != NULL && !strcmp(e, "blas") ? 0 : e != NULL && !strcmp(e, "zdp") ? 2 : 1;
    }
    return mode_;
}

int zdp_nn_gemm_use_mode(int mode) {
    mode_ = mode < 0 ? 0 : mode > 2 ? 2 : mode;
    return mode_;
}

/* 1 when cblas_sgemm runs an OpenBLAS core whose kernels are narrower than
 * zdp's AVX-512 path: OpenBLAS 0.3.21 has AVX-512 sgemm kernels for a few
 * cores only (blas_wide.h); on a CPU it does not know, or with
 * OPENBLAS_CORETYPE set to an AVX2 core, it runs its AVX2 kernel at half
 * the machine's rate.  Another cblas, or an OpenBLAS without
 * openblas_get_corename: 0 (the rule below is the one against OpenBLAS's
 * AVX-512 kernels). */
static int blas_narrower_(void) {
    if (blas_narrow_ < 0) {
        int narrow = 0;
#ifdef ZDP_HAVE_OPENBLAS_CORENAME
        const char *core = openblas_get_corename();
        narrow = core != NULL && !zdp_blas_core_is_wide(core);
#endif
        blas_narrow_ = narrow;
    }
    return blas_narrow_;
}

int zdp_nn_gemm_wins_(const zdp_nn_gemm *g) {
    const int mode = zdp_nn_gemm_mode();
    if (mode == 0 || g->alpha != 1.0f || (g->beta != 0.0f && g->beta != 1.0f)) return 0;
    if (mode == 2) return 1;
    /* Only the AVX-512 path beats the BLAS: zdp's AVX2 kernel (6 x 16) and
     * its portable C kernel are well behind OpenBLAS's AVX2 kernels, so on
     * those paths every product goes to cblas_sgemm: the default is the
     * BLAS there, never slower than it. */
    if (isa_() < 2) return 0;
    /* Small products: the BLAS, whose small-matrix paths zdp does not try
     * to beat. */
    if (g->M < 64 || g->N < 48 || g->K < 64) return 0;
    /* Against OpenBLAS's AVX2 kernel: faster on every product of a
     * training step, the lm_head's dX and attention's included
     * (docs/benchmarks-llama.md). */
    if (blas_narrower_()) return 1;
    /* Against its AVX-512 kernels: faster on a training step's shapes;
     * slower where K is far deeper than M and N (the lm_head's dX, K =
     * 49,152: C goes through the cache once per K block) and where the 8 x
     * 48 tile pads N by an eighth or more (attention's head-size products,
     * N = 64 padded to 96; a 256-wide model's N = 256, padded to 288): the
     * padded columns are work the BLAS does not do. */
    if (g->K > 8192) return 0;
    if ((g->N + NR_MAX_ - 1) / NR_MAX_ * NR_MAX_ * 8 >= 9 * g->N) return 0;
    return 1;
}

/* ---- packing ------------------------------------------------------------------------- */

/* dst: strips of MR rows, strip s (kc, MR) = op(A)[i0 + s MR .., p0 ..], rows
 * past i0 + mc zero.  op(A)[i, k] = A[i lda + k], or A[k lda + i] (ta). */
static void pack_a_(float *dst, int mr, CBLAS_TRANSPOSE ta, const float *A, int64_t lda, int64_t i0,
                    int64_t mc, int64_t p0, int64_t kc) {
    for (int64_t s = 0; s * mr < mc; s++) {
        float *d = dst + s * kc * mr; /* (kc, mr) */
        const int64_t rows = mc - s * mr < mr ? mc - s * mr : mr, i = i0 + s * mr;
        if (ta == CblasNoTrans) {
            for (int64_t r = 0; r < rows; r++) {
                const float *src = A + (i + r) * lda + p0;
                for (int64_t k = 0; k < kc; k++) d[k * mr + r] = src[k];
            }
            for (int64_t r = rows; r < mr; r++)
                for (int64_t k = 0; k < kc; k++) d[k * mr + r] = 0.0f;
        } else {
            for (int64_t k = 0; k < kc; k++) {
                const float *src = A + (p0 + k) * lda + i;
                for (int64_t r = 0; r < mr; r++) d[k * mr + r] = r < rows ? src[r] : 0.0f;
            }
        }
    }
}

/* dst: panels of NR columns, panel q (kc, NR) = op(B)[p0 .., j0 + q NR ..],
 * columns past j0 + nc zero.  op(B)[k, j] = B[k ldb + j], or B[j ldb + k] (tb). */
static void pack_b_(float *dst, int nr, CBLAS_TRANSPOSE tb, const float *B, int64_t ldb, int64_t j0,
                    int64_t nc, int64_t p0, int64_t kc) {
    for (int64_t q = 0; q * nr < nc; q++) {
        float *d = dst + q * kc * nr; /* (kc, nr) */
        const int64_t cols = nc - q * nr < nr ? nc - q * nr : nr, j = j0 + q * nr;
        if (tb == CblasNoTrans) {
            for (int64_t k = 0; k < kc; k++) {
                const float *src = B + (p0 + k) * ldb + j;
                for (int64_t c = 0; c < nr; c++) d[k * nr + c] = c < cols ? src[c] : 0.0f;
            }
        } else {
            for (int64_t c = 0; c < cols; c++) {
                const float *src = B + (j + c) * ldb + p0;
                for (int64_t k = 0; k < kc; k++) d[k * nr + c] = src[k];
            }
            for (int64_t c = cols; c < nr; c++)
                for (int64_t k = 0; k < kc; k++) d[k * nr + c] = 0.0f;
        }
    }
}

#ifdef ZDP_GEMM_X86_
/* r (16 rows of 16) <- its transpose: r[i][j] = old r[j][i]. */
__attribute__((target("avx512f"))) static inline void tr16_(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) { /* pairs of rows interleaved */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* 4 x 4 blocks transposed within each 128-bit lane */
        u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) { /* then the 4 x 4 grid of lanes */
        t[i] = _mm512_shuffle_f32x4(u[i], u[4 + i], 0x88);
        t[4 + i] = _mm512_shuffle_f32x4(u[i], u[4 + i], 0xDD);
        t[8 + i] = _mm512_shuffle_f32x4(u[8 + i], u[12 + i], 0x88);
        t[12 + i] = _mm512_shuffle_f32x4(u[8 + i], u[12 + i], 0xDD);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
        r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
    }
}

/* pack_a_ for the AVX-512 path (MR 8): two strips (16 rows) at a time, 16 k
 * at a time by one 16 x 16 transpose; op(A) transposed (A (K, M)): each k's
 * row read once, its 8-float pieces written to the strips. */
__attribute__((target("avx512f,avx512dq,avx512vl"))) static void pack_a_avx512_(float *dst, CBLAS_TRANSPOSE ta, const float *A,
                                                              int64_t lda, int64_t i0, int64_t mc,
                                                              int64_t p0, int64_t kc) {
    enum { MR = AVX512_MR_ };
    const int64_t strips = (mc + MR - 1) / MR;
    if (ta == CblasTrans) { /* op(A)[i, k] = A[k lda + i] */
        for (int64_t k = 0; k < kc; k++) {
            const float *src = A + (p0 + k) * lda + i0;
            /* Row k + PF_K_'s lines, fetched ahead: the rows are lda apart
             * (a page or more in the lm_head's dW), a stride the hardware
             * prefetcher does not follow, and unfetched each row would wait
             * on memory. */
            if (k + PF_K_ < kc)
                for (int64_t l = 0; l < mc + 15; l += 16)
                    _mm_prefetch((const char *)(src + PF_K_ * lda + (l < mc ? l : mc - 1)), _MM_HINT_T0);
            for (int64_t s = 0; s < strips; s++) {
                const int64_t rows = mc - s * MR < MR ? mc - s * MR : MR;
                const __m256 v = _mm256_maskz_loadu_ps((__mmask8)((1u << rows) - 1), src + s * MR);
                _mm256_store_ps(dst + s * kc * MR + k * MR, v);
            }
        }
        return;
    }
    for (int64_t s = 0; s < strips; s += 2) { /* strips s and s + 1: rows i .. i + 15 */
        const int64_t rows = mc - s * MR < 2 * MR ? mc - s * MR : 2 * MR, i = i0 + s * MR;
        float *d0 = dst + s * kc * MR, *d1 = d0 + kc * MR; /* (kc, MR) each */
        for (int64_t k0 = 0; k0 < kc; k0 += 16) {
            const int64_t kn = kc - k0 < 16 ? kc - k0 : 16;
            const __mmask16 m = (__mmask16)((1u << kn) - 1);
            __m512 r[16];
            for (int64_t q = 0; q < 16; q++) {
                /* 16 rows are 16 streams: fetch each 4 lines ahead. */
                if (q < rows) _mm_prefetch((const char *)(A + (i + q) * lda + p0 + k0 + 64), _MM_HINT_T0);
                r[q] = q < rows ? _mm512_maskz_loadu_ps(m, A + (i + q) * lda + p0 + k0) : _mm512_setzero_ps();
            }
            tr16_(r); /* r[k] = rows 0..15 at k0 + k */
            for (int64_t k = 0; k < kn; k++) _mm256_store_ps(d0 + (k0 + k) * MR, _mm512_castps512_ps256(r[k]));
            if (rows > MR)
                for (int64_t k = 0; k < kn; k++)
                    _mm256_store_ps(d1 + (k0 + k) * MR, _mm512_extractf32x8_ps(r[k], 1));
        }
    }
}

/* pack_b_ for the AVX-512 path (NR 48). */
__attribute__((target("avx512f"))) static void pack_b_avx512_(float *dst, CBLAS_TRANSPOSE tb, const float *B,
                                                              int64_t ldb, int64_t j0, int64_t nc,
                                                              int64_t p0, int64_t kc) {
    enum { NR = AVX512_NR_ };
    for (int64_t q = 0; q * NR < nc; q++) {
        float *d = dst + q * kc * NR; /* (kc, NR) */
        const int64_t cols = nc - q * NR < NR ? nc - q * NR : NR, j = j0 + q * NR;
        if (tb == CblasNoTrans) { /* op(B)[k, j] = B[k ldb + j]: 48 contiguous per k */
            __mmask16 m[3];
            for (int v = 0; v < 3; v++)
                m[v] = (__mmask16)(cols >= 16 * (v + 1) ? 0xFFFF : cols <= 16 * v ? 0 : (1u << (cols - 16 * v)) - 1);
            for (int64_t k = 0; k < kc; k++) {
                const float *src = B + (p0 + k) * ldb + j;
                for (int v = 0; v < 3; v++)
                    _mm512_store_ps(d + k * NR + 16 * v, _mm512_maskz_loadu_ps(m[v], src + 16 * v));
            }
            continue;
        }
        for (int64_t h = 0; h < 3; h++) /* columns h*16 .. h*16+15 of the panel: rows of B */
            for (int64_t k0 = 0; k0 < kc; k0 += 16) {
                const int64_t kn = kc - k0 < 16 ? kc - k0 : 16;
                const __mmask16 m = (__mmask16)((1u << kn) - 1);
                __m512 r[16];
                for (int64_t c = 0; c < 16; c++)
                    r[c] = h * 16 + c < cols ? _mm512_maskz_loadu_ps(m, B + (j + h * 16 + c) * ldb + p0 + k0)
                                             : _mm512_setzero_ps();
                tr16_(r); /* r[k] = the 16 columns at k0 + k */
                for (int64_t k = 0; k < kn; k++) _mm512_store_ps(d + (k0 + k) * NR + h * 16, r[k]);
            }
    }
}
#endif

/* ---- the product ----------------------------------------------------------------------- */

/* The packed blocks live in one buffer per thread, kept between products
 * and only ever grown.  Allocated and freed per call, the B block (up to
 * 1.2 MB) sits at glibc's mmap threshold: a fresh mapping, and its page
 * faults, for every product until the threshold happens to move.  The
 * key's destructor frees a thread's buffer when the thread ends. */
static pthread_key_t pack_key_;
static pthread_once_t pack_once_ = PTHREAD_ONCE_INIT;
static int pack_key_ok_;

typedef struct pack_buf_ {
    float *p;
    size_t floats;
} pack_buf_;

static void pack_buf_free_(void *v) {
    pack_buf_ *b = v;
    free(b->p), free(b);
}

static void pack_key_init_(void) { pack_key_ok_ = pthread_key_create(&pack_key_, pack_buf_free_) == 0; }

/* This thread's buffer of at least n floats (64-byte aligned), or NULL. */
static float *pack_floats_(int64_t n) {
    pthread_once(&pack_once_, pack_key_init_);
    if (!pack_key_ok_) return NULL;
    pack_buf_ *b = pthread_getspecific(pack_key_);
    if (b == NULL) {
        if ((b = calloc(1, sizeof *b)) == NULL) return NULL;
        if (pthread_setspecific(pack_key_, b) != 0) {
            free(b);
            return NULL;
        }
    }
    if (b->floats < (size_t)n) {
        const size_t floats = ((size_t)n + 15) / 16 * 16; /* whole 64-byte lines */
        float *p = aligned_alloc(64, floats * sizeof(float));
        if (p == NULL) return NULL;
        free(b->p);
        b->p = p, b->floats = floats;
    }
    return b->p;
}

void zdp_nn_gemm_compute(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
                 const float *A, int64_t lda, const float *B, int64_t ldb, int accumulate, float *C,
                 int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate)
            for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    const path_ p = path_now_();
    const int64_t kc_n = (K + KC_MAX_ - 1) / KC_MAX_;
    const int64_t kc_blk = (K + kc_n - 1) / kc_n; /* K in kc_n near-equal blocks */
    /* A row-major (not transposed) on the AVX-512 path: read in place, not
     * packed: its 8 rows are 8 streams the prefetcher follows, so the
     * packing would only add a pass over A. */
#ifdef ZDP_GEMM_X86_
    const int direct = p.ukr == ukr_avx512_ && ta == CblasNoTrans;
#else
    const int direct = 0;
#endif
    const int64_t mc_blk = (int64_t)MC_STRIPS_ * p.mr;
    int64_t nc_cap = NC_MAX_ / p.nr * p.nr; /* the widest B block */
    if (direct) {
        const int64_t fit = B_DIRECT_FLOATS_ / kc_blk / p.nr * p.nr;
        nc_cap = fit < p.nr ? p.nr : fit < nc_cap ? fit : nc_cap;
    }
    /* N in near-equal blocks of whole panels (1536 = 3 x 512, not 672 + 672 + 192). */
    const int64_t nc_n = (N + nc_cap - 1) / nc_cap;
    const int64_t nc_blk = ((N + nc_n - 1) / nc_n + p.nr - 1) / p.nr * p.nr;
    const int64_t mc_most = M < mc_blk ? (M + p.mr - 1) / p.mr * p.mr : mc_blk;
    const int64_t nc_most = N < nc_blk ? (N + p.nr - 1) / p.nr * p.nr : nc_blk;
    /* This thread's buffer: the A block's strips, then (at a whole line) the
     * B block's panels. */
    const int64_t a_floats = (mc_most * kc_blk + 15) / 16 * 16;
    float *ap = pack_floats_(a_floats + nc_most * kc_blk);
    float *bp = ap != NULL ? ap + a_floats : NULL;
    if (ap == NULL) {
        /* Out of memory for the packed blocks: cblas_sgemm does the product. */
        cblas_sgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb,
                    accumulate ? 1.0f : 0.0f, C, (int)ldc);
        return;
    }
    _Alignas(64) float tile[MR_MAX_ * NR_MAX_]; /* (mr, nr): an edge tile, zero-padded */
    for (int64_t jc = 0; jc < N; jc += nc_blk) {
        const int64_t nc = N - jc < nc_blk ? N - jc : nc_blk;
        for (int64_t pc = 0; pc < K; pc += kc_blk) {
            const int64_t kc = K - pc < kc_blk ? K - pc : kc_blk;
            const int load = accumulate || pc > 0;
#ifdef ZDP_GEMM_X86_
            if (p.ukr == ukr_avx512_) pack_b_avx512_(bp, tb, B, ldb, jc, nc, pc, kc);
            else
#endif
                pack_b_(bp, p.nr, tb, B, ldb, jc, nc, pc, kc);
            for (int64_t ic = 0; ic < M; ic += mc_blk) {
                const int64_t mc = M - ic < mc_blk ? M - ic : mc_blk;
#ifdef ZDP_GEMM_X86_
                if (direct) { /* only a last, short strip is packed */
                    if (mc % p.mr != 0)
                        pack_a_avx512_(ap + mc / p.mr * kc * p.mr, ta, A, lda, ic + mc / p.mr * p.mr,
                                       mc % p.mr, pc, kc);
                } else if (p.ukr == ukr_avx512_) pack_a_avx512_(ap, ta, A, lda, ic, mc, pc, kc);
                else
#endif
                    pack_a_(ap, p.mr, ta, A, lda, ic, mc, pc, kc);
                for (int64_t jr = 0; jr < nc; jr += p.nr) {
                    const int64_t nr = nc - jr < p.nr ? nc - jr : p.nr;
                    const float *b = bp + jr / p.nr * kc * p.nr;
                    for (int64_t ir = 0; ir < mc; ir += p.mr) {
                        const int64_t mr = mc - ir < p.mr ? mc - ir : p.mr;
                        const float *a = ap + ir / p.mr * kc * p.mr;
                        float *c = C + (ic + ir) * ldc + jc + jr;
                        if (mr == p.mr && nr == p.nr) {
                            const float *next = ir + 2 * p.mr <= mc ? c + p.mr * ldc : NULL;
#ifdef ZDP_GEMM_X86_
                            if (direct)
                                ukr_avx512_rows_(kc, A + (ic + ir) * lda + pc, lda, b, c, ldc, load, next);
                            else
#endif
                                p.ukr(kc, a, b, c, ldc, load, next);
                            continue;
                        }
                        for (int64_t r = 0; r < p.mr; r++)
                            for (int64_t j = 0; j < p.nr; j++)
                                tile[r * p.nr + j] = load && r < mr && j < nr ? c[r * ldc + j] : 0.0f;
#ifdef ZDP_GEMM_X86_
                        if (direct && mr == p.mr)
                            ukr_avx512_rows_(kc, A + (ic + ir) * lda + pc, lda, b, tile, p.nr, load, NULL);
                        else
#endif
                            p.ukr(kc, a, b, tile, p.nr, load, NULL);
                        for (int64_t r = 0; r < mr; r++)
                            memcpy(c + r * ldc, tile + r * p.nr, (size_t)nr * sizeof(float));
                    }
                }
            }
        }
    }
}
