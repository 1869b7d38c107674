/*
 * kv_attention.c -- attention of a decode pass's rows against a key/value
 * cache (kv_attention.h): one row over its own slot, the rows over a shared
 * prompt as a group, and a prompt's block of rows as two products per head.
 *
 * Every kernel fixes the order of each sum (fused multiply-adds in position
 * order, 16 partial sums added by one halving tree), so a row gets the same
 * bits on every SIMD path, at any batch and thread count, and whether it is
 * attended alone or with a group.  The three paths (zdp_nn_packed_path():
 * AVX-512, AVX2+FMA, portable C) are compiled with target attributes and
 * chosen at run time.  Not here: which rows go to which kind of work, the
 * cache's storage and the scratch (src/sample/decode.c, src/sample/kv.c).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "kv_attention.h"
#include "nn.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define KVA_X86_ 1
#endif

/* This core's L1 data cache in bytes (32 KB where the C library cannot
 * tell: the smallest L1 of the x86 cores zdp targets). */
static int64_t l1d_bytes_(void) {
#ifdef _SC_LEVEL1_DCACHE_SIZE
    const long b = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    if (b > 0) return b;
#endif
    return 32 * 1024;
}

bool zdp_nn_kv_keys_to_l2(int64_t KD) { return 2 * 16 * KD * 4 > l1d_bytes_(); }

/* q . k over hd floats in 16 interleaved partial sums, each a chain of
 * fused multiply-adds (one rounding per step: half the instructions of a
 * multiply and an add; decode attention over a shared prompt is bound by
 * them), added pairwise at the end: a fixed order (so the same bits at any
 * batch or thread count) that the compiler vectorises, where one running
 * sum cannot be.  The weighted values (weigh_values_) are fmaf chains too. */
static inline float dot16_(const float *q, const float *k, int hd) {
    float acc[16] = {0};
    int d = 0;
    for (; d + 16 <= hd; d += 16)
        for (int j = 0; j < 16; j++) acc[j] = fmaf(q[d + j], k[d + j], acc[j]);
    for (int j = 0; d < hd; d++, j++) acc[j] = fmaf(q[d], k[d], acc[j]);
    /* The halving tree, acc[j] + acc[j + w] for w = 8, 4, 2, 1, written out
     * with constant bounds: as one loop over w GCC runs it one float at a
     * time through the stack; the same additions, the same bits. */
    float h8[8], h4[4];
    for (int j = 0; j < 8; j++) h8[j] = acc[j] + acc[j + 8];
    for (int j = 0; j < 4; j++) h4[j] = h8[j] + h8[j + 4];
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

#ifdef __GNUC__
/* o[h*ostride + 0..16*nv) = sum over s < n of sr[h*sstride + s] *
 * v[h*vstep + s*KD + 0..16*nv), for heads h < nh (1..3, or 6 with vstep hd)
 * and nv (2 or 4) 16-float vectors per head, all constants where it is
 * inlined; the positions in order.  vstep 0: the heads share one KV head's
 * values (GQA), each value row loaded once for all nh heads; vstep hd: nh
 * consecutive heads of a model whose heads each have their own (GPT-2),
 * nh x nv independent sums where one head's two would be a chain of
 * dependent adds (6 x 4 = 24 sums: 6 heads of 64 dimensions read 1.5 KB of
 * each value row front to back, one stream the hardware fetches ahead).
 * init: the sums go on from o's values (a group's rows, position block by
 * block, zdp_nn_kv_attend_shared_prompt), else from 0.  While position s <
 * fetch_rows is summed, the lines this walk reads of it are fetched at
 * fetch_ahead floats further on: a row's own values 32 positions ahead
 * (read once, from memory), or a shared prompt's next head's (or next
 * block's) values, which the group's next walks read.
 * Three variants, one per SIMD path (zdp_nn_packed_path(), weigh_values_):
 * AVX-512 (value_walk_avx512_), AVX2+FMA (value_walk_avx2_: each 16 floats
 * as two 8-float halves) and portable (value_walk_c_).  In each, every lane
 * is one fused multiply-add per position, in position order (fmaf rounds
 * once, as vfmadd does), so all three give the same bits.  No 64-byte
 * vector is passed or returned outside an AVX-512 function: its ABI would
 * change with -march (GCC's -Wpsabi). */
#define WALK_ARGS_                                                                                 \
    float *o, int64_t ostride, const float *sr, int64_t sstride, int n, const float *v,            \
        int64_t vstep, int64_t KD, int nh, int nv, int init, int64_t fetch_ahead, int fetch_rows

/* The lines of value row vs that a walk reads, fetched fetch_ahead floats on. */
static inline __attribute__((always_inline)) void
walk_prefetch_(const float *vs, int64_t fetch_ahead, int64_t vstep, int nh, int nv) {
    for (int h = 0; h < (vstep != 0 ? nh : 1); h++)
        for (int c = 0; c < nv; c++)
            __builtin_prefetch(vs + fetch_ahead + h * vstep + 16 * c, 0, 3);
}

/* The portable walk: GCC keeps a float array accumulator on the stack,
 * hence the vector type, which it splits into the target's registers. */
typedef float v16_ __attribute__((vector_size(64)));
static inline __attribute__((always_inline)) void value_walk_c_(WALK_ARGS_) {
    v16_ a[6][4] = {{{0}}};
    if (init)
        for (int h = 0; h < nh; h++)
            for (int c = 0; c < nv; c++) memcpy(&a[h][c], o + h * ostride + 16 * c, 64);
    for (int s = 0; s < n; s++) {
        const float *vs = v + (size_t)s * KD;
        if (s < fetch_rows) walk_prefetch_(vs, fetch_ahead, vstep, nh, nv);
        for (int h = 0; h < nh; h++) {
            const float w = sr[h * sstride + s];
            for (int c = 0; c < nv; c++) {
                v16_ x;
                memcpy(&x, vs + h * vstep + 16 * c, 64);
                for (int e = 0; e < 16; e++) a[h][c][e] = fmaf(w, x[e], a[h][c][e]);
            }
        }
    }
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < nv; c++) memcpy(o + h * ostride + 16 * c, &a[h][c], 64);
}

#ifdef KVA_X86_
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
value_walk_avx512_(WALK_ARGS_) {
    __m512 a[6][4];
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < nv; c++)
            a[h][c] = init ? _mm512_loadu_ps(o + h * ostride + 16 * c) : _mm512_setzero_ps();
    for (int s = 0; s < n; s++) {
        const float *vs = v + (size_t)s * KD;
        if (s < fetch_rows) walk_prefetch_(vs, fetch_ahead, vstep, nh, nv);
        for (int h = 0; h < nh; h++) {
            const __m512 w = _mm512_set1_ps(sr[h * sstride + s]);
            for (int c = 0; c < nv; c++)
                a[h][c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(vs + h * vstep + 16 * c), a[h][c]);
        }
    }
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < nv; c++) _mm512_storeu_ps(o + h * ostride + 16 * c, a[h][c]);
}

/* a[h][2c], a[h][2c + 1]: the halves of value_walk_avx512_'s a[h][c]. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void
value_walk_avx2_(WALK_ARGS_) {
    __m256 a[6][8];
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < 2 * nv; c++)
            a[h][c] = init ? _mm256_loadu_ps(o + h * ostride + 8 * c) : _mm256_setzero_ps();
    for (int s = 0; s < n; s++) {
        const float *vs = v + (size_t)s * KD;
        if (s < fetch_rows) walk_prefetch_(vs, fetch_ahead, vstep, nh, nv);
        for (int h = 0; h < nh; h++) {
            const __m256 w = _mm256_set1_ps(sr[h * sstride + s]);
            for (int c = 0; c < 2 * nv; c++)
                a[h][c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vs + h * vstep + 8 * c), a[h][c]);
        }
    }
    for (int h = 0; h < nh; h++)
        for (int c = 0; c < 2 * nv; c++) _mm256_storeu_ps(o + h * ostride + 8 * c, a[h][c]);
}
#endif
#undef WALK_ARGS_

/* weigh_values_'s walks by WV over o's first hd / 32 * 32 dimensions (64 at a
 * time, then 32), each call with constant nh and nv so that the walk's
 * loops unroll and its sums stay in registers; the dimensions done.  One
 * function per variant: each inlines its walk under its own target. */
#define WALK_HEADS_(WV, NV)                                                                        \
    do {                                                                                           \
        if (vstep == 0) {                                                                          \
            if (nh == 3)                                                                           \
                WV(o + d0, os, sr, ss, n, v + d0, 0, KD, 3, NV, init, fetch_ahead, fetch_rows);    \
            else if (nh == 2)                                                                      \
                WV(o + d0, os, sr, ss, n, v + d0, 0, KD, 2, NV, init, fetch_ahead, fetch_rows);    \
            else                                                                                   \
                WV(o + d0, os, sr, ss, n, v + d0, 0, KD, 1, NV, init, fetch_ahead, fetch_rows);    \
        } else {                                                                                   \
            if (nh == 6)                                                                           \
                WV(o + d0, os, sr, ss, n, v + d0, vstep, KD, 6, NV, init, fetch_ahead,             \
                   fetch_rows);                                                                    \
            else if (nh == 3)                                                                      \
                WV(o + d0, os, sr, ss, n, v + d0, vstep, KD, 3, NV, init, fetch_ahead,             \
                   fetch_rows);                                                                    \
            else if (nh == 2)                                                                      \
                WV(o + d0, os, sr, ss, n, v + d0, vstep, KD, 2, NV, init, fetch_ahead,             \
                   fetch_rows);                                                                    \
            else                                                                                   \
                WV(o + d0, os, sr, ss, n, v + d0, vstep, KD, 1, NV, init, fetch_ahead,             \
                   fetch_rows);                                                                    \
        }                                                                                          \
    } while (0)
#define WALKS_BODY_(WV)                                                                            \
    int d0 = 0;                                                                                    \
    for (; d0 + 64 <= hd; d0 += 64) WALK_HEADS_(WV, 4);                                            \
    for (; d0 + 32 <= hd; d0 += 32) WALK_HEADS_(WV, 2);                                            \
    return d0
#define WALKS_ARGS_                                                                                \
    float *o, int64_t os, int hd, const float *sr, int64_t ss, int n, const float *v,              \
        int64_t vstep, int64_t KD, int nh, int init, int64_t fetch_ahead, int fetch_rows
static int value_walks_c_(WALKS_ARGS_) { WALKS_BODY_(value_walk_c_); }
#ifdef KVA_X86_
__attribute__((target("avx512f"))) static int value_walks_avx512_(WALKS_ARGS_) {
    WALKS_BODY_(value_walk_avx512_);
}
__attribute__((target("avx2,fma"))) static int value_walks_avx2_(WALKS_ARGS_) {
    WALKS_BODY_(value_walk_avx2_);
}
#endif
#undef WALKS_ARGS_
#undef WALK_HEADS_
#undef WALKS_BODY_
#endif

/* out[h*os + 0..hd) (init: += onto its values) = the weighted sum over
 * positions s < n of sr[h*ss + s] * v[h*vstep + s*KD + 0..hd), for nh (1..3,
 * or 6 with vstep hd) score rows h: a row's heads, or (vstep 0) one head of several query rows
 * over the same values: attend_row_'s sums, each lane from position 0 (or o's value) in
 * order, whatever the width (64 or 32 dimensions a walk, then one at a
 * time) and whatever the path, so the same bits as one dimension at a
 * time. */
static void weigh_values_(float *o, int64_t os, int hd, const float *sr, int64_t ss, int n,
                          const float *v, int64_t vstep, int64_t KD, int nh, int init,
                          int64_t fetch_ahead, int fetch_rows) {
    int d0 = 0;
#ifdef __GNUC__
#ifdef KVA_X86_
    const int path = zdp_nn_packed_path();
    if (path == 2)
        d0 = value_walks_avx512_(o, os, hd, sr, ss, n, v, vstep, KD, nh, init, fetch_ahead,
                                 fetch_rows);
    else if (path == 1)
        d0 = value_walks_avx2_(o, os, hd, sr, ss, n, v, vstep, KD, nh, init, fetch_ahead,
                               fetch_rows);
    else
#endif
        d0 = value_walks_c_(o, os, hd, sr, ss, n, v, vstep, KD, nh, init, fetch_ahead, fetch_rows);
#endif
    for (int h = 0; h < nh; h++)
        for (int d = d0; d < hd; d++) {
            float acc = init ? o[h * os + d] : 0.0f;
            for (int s = 0; s < n; s++)
                acc = fmaf(sr[h * ss + s], v[h * vstep + (int64_t)s * KD + d], acc);
            o[h * os + d] = acc;
        }
}

/* The weighted values of query heads kv_lo*group .. kv_hi*group (KV heads kv_lo
 * .. kv_hi): weigh_values_ over sets of up to 3 heads, within one KV head's group
 * (its value rows shared), or, where every head is its own KV head, 6
 * consecutive heads at a time while 6 are left, then up to 3 (each value
 * row's 6 x hd floats read contiguously; at most 6 heads: one walk,
 * one_walk_per_row_). */
__attribute__((noinline)) static void weigh_head_range_(float *o, int NH, int KV, int hd,
                                                        const float *sr, int64_t ss, int n,
                                                        const float *v, int64_t KD, int kv_lo,
                                                        int kv_hi, int init, int64_t fetch_ahead,
                                                        int fetch_rows) {
    const int group = NH / KV;
    for (int h0 = kv_lo * group; h0 < kv_hi * group;) {
        const int g = h0 / group, end = group == 1 ? kv_hi : (g + 1) * group;
        const int nh = group == 1 && end - h0 >= 6 ? 6 : end - h0 < 3 ? end - h0 : 3;
        weigh_values_(o + (int64_t)h0 * hd, hd, hd, sr + h0 * ss, ss, n, v + (int64_t)g * hd,
              group == 1 ? hd : 0, KD, nh, init, fetch_ahead, fetch_rows);
        h0 += nh;
    }
}

/* Whether weigh_head_range_ weighs each value row whole in one walk, front
 * to back: every head its own KV head, at most 6 of 32 or 64 dimensions.
 * Then the row's values stream from memory into the weighing, in order,
 * which the hardware fetches ahead, and are not fetched to L2 during its
 * scores: on a 32 KB L1 those fetches would push out the keys fetched there
 * for the next block. */
static inline bool one_walk_per_row_(int NH, int KV, int hd) {
    return NH == KV && NH <= 6 && (hd == 64 || hd == 32);
}

#ifdef KVA_X86_
/* attend_row_'s scores on the AVX-512 path (hd a multiple of 16): score[h*n +
 * s] = scale * dot16_(q + h*hd, K[s] + (h/group)*hd, hd) for s < n, with the
 * same operations in the same order as dot16_ (its 16 partial sums are the
 * 16 lanes; the halving tree runs on 16 positions' sums at once, lanes
 * moved by shuffles, each addition the one dot16_ makes), so the same bits.
 * dot16_ one position at a time would spend most of the time in its
 * per-score reduction and waiting on the key rows.
 * Blocks of 16 positions: the block's key rows (12-24 KB) stay in L1 for
 * every head; while a block runs, the next block's key rows are fetched to
 * L1 and this block's value rows to L2 (the weighted values walk V once per
 * KV head and 32 dimensions, strided walks the hardware prefetcher follows
 * poorly), so the cache streams from memory while the scores are made.
 * Where two blocks of keys do not fit in L1 (keys_to_l2: 24 KB blocks on a
 * 32 KB L1), the next block goes to L2 instead: lines fetched to L1 would
 * be evicted before they are read. */
/* Scores of up to 16 positions (m) for one query head: dst[i] = scale *
 * dot16_(qh, kh + i*KD, hd), i < m, as the block's 16 lanes; while its dot
 * products run, kper of the lines nk[*ki .. kl) are prefetched to L1 (k_l2:
 * to L2) and vper of vb[*vi .. vl) to L2 per position (the caller's
 * streams; 0: none). */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
scores16_avx512_(float *dst, const float *qh, const float *kh, int KD, int hd, int m, __m512 vscale,
         const float *nk, int *ki, int kl, int kper, bool k_l2, const float *vb, int *vi, int vl,
         int vper) {
    /* out lane i <- r lane 4 (i % 4) + i / 4 (the tree leaves position L +
     * 4k in lane 4L + k). */
    const __m512i perm = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    const __m512 zero = _mm512_setzero_ps();
    /* dot16_'s acc[j] = fmaf(q[d + j], k[d + j], acc[j]), d by 16 from 0;
     * with the position's kper and vper lines of the caller's streams. At
     * head_dim 64 (every model here) q's four vectors stay in registers
     * and the loops unroll into one straight run, so each position's chain
     * of four overlaps the next positions' (as a loop over a variable hd,
     * each would wait on its own chain's latency). */
    __m512 acc[16];
#define SCORE16_FETCH_()                                                                    \
    do {                                                                                    \
        for (int u = 0; u < kper && *ki < kl; u++, (*ki)++)                                 \
            if (k_l2) _mm_prefetch((const char *)(nk + (size_t)*ki * 16), _MM_HINT_T1);     \
            else _mm_prefetch((const char *)(nk + (size_t)*ki * 16), _MM_HINT_T0);          \
        for (int u = 0; u < vper && *vi < vl; u++, (*vi)++)                                 \
            _mm_prefetch((const char *)(vb + (size_t)*vi * 16), _MM_HINT_T1);               \
    } while (0)
    if (m == 16 && hd == 64) {
        const __m512 q0 = _mm512_loadu_ps(qh), q1 = _mm512_loadu_ps(qh + 16),
                     q2 = _mm512_loadu_ps(qh + 32), q3 = _mm512_loadu_ps(qh + 48);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            SCORE16_FETCH_();
            const float *k = kh + (size_t)i * KD;
            __m512 a = _mm512_fmadd_ps(q0, _mm512_loadu_ps(k), zero);
            a = _mm512_fmadd_ps(q1, _mm512_loadu_ps(k + 16), a);
            a = _mm512_fmadd_ps(q2, _mm512_loadu_ps(k + 32), a);
            acc[i] = _mm512_fmadd_ps(q3, _mm512_loadu_ps(k + 48), a);
        }
    } else
        for (int i = 0; i < 16; i++) {
            SCORE16_FETCH_();
            acc[i] = zero;
            if (i < m)
                for (int d = 0; d < hd; d += 16)
                    acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(qh + d),
                                             _mm512_loadu_ps(kh + (size_t)i * KD + d), acc[i]);
        }
#undef SCORE16_FETCH_
    /* h8[j] = acc[j] + acc[j + 8]: positions 2t, 2t+1 in t8[t]'s halves. */
    __m512 t8[8], t4[4], t2[2];
    for (int t = 0; t < 8; t++)
        t8[t] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * t], acc[2 * t + 1], 0x44),
                              _mm512_shuffle_f32x4(acc[2 * t], acc[2 * t + 1], 0xEE));
    /* h4[j] = h8[j] + h8[j + 4]: positions 4t..4t+3 in t4[t]'s 128-bit lanes. */
    for (int t = 0; t < 4; t++)
        t4[t] = _mm512_add_ps(_mm512_shuffle_f32x4(t8[2 * t], t8[2 * t + 1], 0x88),
                              _mm512_shuffle_f32x4(t8[2 * t], t8[2 * t + 1], 0xDD));
    /* h4[0] + h4[2] and h4[1] + h4[3], then their sum. */
    for (int t = 0; t < 2; t++)
        t2[t] = _mm512_add_ps(_mm512_shuffle_ps(t4[2 * t], t4[2 * t + 1], 0x44),
                              _mm512_shuffle_ps(t4[2 * t], t4[2 * t + 1], 0xEE));
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(t2[0], t2[1], 0x88),
                                   _mm512_shuffle_ps(t2[0], t2[1], 0xDD));
    _mm512_mask_storeu_ps(dst, (__mmask16)((1u << m) - 1u),
                          _mm512_mul_ps(vscale, _mm512_permutexvar_ps(perm, r)));
}

/* score[h*ss + s] for s < n (ss: the score rows' stride, n for attend_row_).
 * Vc: rows fetched to L2 block by block alongside the keys: the values
 * weighed next, from L2 (NULL: none).  after: the key
 * rows read next, whose first block is fetched to L1 while the last
 * block's scores run (NULL: none). */
__attribute__((target("avx512f"), noinline)) static void
row_scores_avx512_(float *score, int64_t ss, const float *q, const float *K, const float *Vc, int n,
                   int NH, int group, int hd, int KD, float scale, const float *after, bool k_l2) {
    const __m512 vscale = _mm512_set1_ps(scale);
    const int lines_row = KD / 16; /* 64-byte lines per cached row */
    for (int s0 = 0; s0 < n; s0 += 16) {
        const int m = n - s0 < 16 ? n - s0 : 16;
        int next = n - s0 - 16 < 0 ? 0 : n - s0 - 16 < 16 ? n - s0 - 16 : 16;
        const float *kb = K + (size_t)s0 * KD, *nk = kb + (size_t)16 * KD,
                    *vb = Vc != NULL ? Vc + (size_t)s0 * KD : NULL;
        if (next == 0 && after != NULL) nk = after, next = 16;
        const int kl = next * lines_row, vl = Vc != NULL ? m * lines_row : 0, steps = NH * 16;
        const int kper = (kl + steps - 1) / steps, vper = (vl + steps - 1) / steps;
        int ki = 0, vi = 0;
        for (int h = 0; h < NH; h++)
            scores16_avx512_(score + h * ss + s0, q + (size_t)h * hd, kb + (size_t)(h / group) * hd,
                     KD, hd, m, vscale, nk, &ki, kl, kper, k_l2, vb, &vi, vl, vper);
    }
}

/* A group's scores over a block of a shared prompt (zdp_nn_kv_attend_shared_prompt):
 * dst[(r*NH + h)*T + s0 + i] for the rows' queries (q + rows[r]*qs), every
 * head, over the m <= 16 key rows kb (KD apart): the block's keys (16 rows,
 * 12-24 KB) stay in L1 for every row and head of the group, while the next
 * block's (next_lines cache lines at next_k) are fetched to L1 and this
 * block's values (vb, m rows) to L2. */
__attribute__((target("avx512f"), noinline)) static void
group_scores_avx512_(float *dst, int64_t T, const float *q, int64_t qs, const int *rows, int nr,
                     int NH, int group, const float *kb, const float *vb, int s0, int m, int KD,
                     int hd, float scale, const float *next_k, int next_lines, bool k_l2) {
    const __m512 vscale = _mm512_set1_ps(scale);
    const int steps = nr * NH * 16, vl = vb != NULL ? m * (KD / 16) : 0;
    const int kper = (next_lines + steps - 1) / steps, vper = (vl + steps - 1) / steps;
    int ki = 0, vi = 0;
    for (int r = 0; r < nr; r++)
        for (int h = 0; h < NH; h++)
            scores16_avx512_(dst + ((int64_t)r * NH + h) * T + s0,
                             q + rows[r] * qs + (int64_t)h * hd, kb + (int64_t)(h / group) * hd, KD,
                             hd, m, vscale, next_k, &ki, next_lines, kper, k_l2, vb, &vi, vl, vper);
}
#endif

#ifdef KVA_X86_
/* max(x[0..n)) as a loop of sr[s] > mx ? sr[s] : mx finds it (max is
 * exact: any order gives the same value; a NaN never wins the comparison),
 * 16 lanes at a time where the loop is one dependent compare per
 * position. */
__attribute__((target("avx512f"))) static float row_max_avx512_(const float *x, int n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int s = 0;
    for (; s + 16 <= n; s += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + s), m);
    if (s < n) {
        const __mmask16 k = (__mmask16)((1u << (n - s)) - 1u);
        m = _mm512_mask_max_ps(m, k, _mm512_maskz_loadu_ps(k, x + s), m);
    }
    float l[16], mx = -INFINITY;
    _mm512_storeu_ps(l, m);
    for (int i = 0; i < 16; i++) mx = l[i] > mx ? l[i] : mx;
    return mx;
}
#endif

/* x[0] + .. + x[n-1] as dot16_ sums: 16 partial sums (lane j: the positions
 * j, j + 16, .. in order), added by the same halving tree; a fixed order
 * that the compiler vectorises, where one running sum waited on each add. */
static inline float sum_16_lanes_(const float *x, int n) {
    float acc[16] = {0};
    int s = 0;
    for (; s + 16 <= n; s += 16)
        for (int j = 0; j < 16; j++) acc[j] += x[s + j];
    for (int j = 0; s < n; s++, j++) acc[j] += x[s];
    float h8[8], h4[4];
    for (int j = 0; j < 8; j++) h8[j] = acc[j] + acc[j + 8];
    for (int j = 0; j < 4; j++) h4[j] = h8[j] + h8[j + 4];
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

/* Each of nh score rows S[h*ss + 0..n) <- its softmax: a decode row's
 * attention weights.  attend_row_ and zdp_nn_kv_attend_shared_prompt both
 * call it, so a row over a shared prompt gets the bits it gets alone; and
 * every path (AVX-512 or not) gets the same: each row's max, its exps (a
 * loop of zdp_nn_exp_ alone, which GCC vectorises with the same operations
 * per element; with the running sum in the same loop it runs one element
 * at a time), their sum (sum_16_lanes_), then the products by 1 / sum.
 * Kept out of line, as are row_scores_avx512_, group_scores_avx512_ and
 * weigh_head_range_, so that a profile names each part. */
__attribute__((noinline)) static void softmax_rows_(float *S, int64_t ss, int nh, int n) {
    for (int h = 0; h < nh; h++) {
        float *sr = S + h * ss, mx = -INFINITY;
#ifdef KVA_X86_
        if (zdp_nn_packed_path() == 2) mx = row_max_avx512_(sr, n);
        else
#endif
        for (int s = 0; s < n; s++) mx = sr[s] > mx ? sr[s] : mx;
        for (int s = 0; s < n; s++) sr[s] = zdp_nn_exp_(sr[s] - mx);
        const float inv = 1.0f / sum_16_lanes_(sr, n);
        for (int s = 0; s < n; s++) sr[s] *= inv;
    }
}

/* out (NH*hd) = softmax(q . K / sqrt(hd)) V over the slot's positions
 * 0..p: q (NH*hd), K, V (>p, KV*hd) with query head h on KV head
 * h / (NH/KV).  Position by position, every head at once, so each cached
 * key and value row is read once, front to back (decode attention is bound
 * by reading the cache: every row reads its own slot's).  Plain loops: one
 * row's products are far too small for cblas_sgemm's call and packing
 * costs.
 * keys_to_l2: the cache's keys_to_l2.  score: (NH, p+1) scratch. */
static void attend_row_(float *out, const float *q, const float *K, const float *Vc, int p, int NH,
                    int KVh, int hd, int prompt_len, bool keys_to_l2, float *score) {
    const int KD = KVh * hd, group = NH / KVh, n = p + 1;
    (void)keys_to_l2; /* read on the AVX-512 path alone */
    const float scale = 1.0f / sqrtf((float)hd);
#ifdef KVA_X86_
    if (hd % 16 == 0 && zdp_nn_packed_path() == 2)
        row_scores_avx512_(score, n, q, K, one_walk_per_row_(NH, KVh, hd) ? NULL : Vc, n, NH, group,
                           hd, KD, scale, NULL, keys_to_l2);
    else
#endif
        for (int s = 0; s < n; s++) {
            const float *ks = K + (size_t)s * KD;
            for (int h = 0; h < NH; h++)
                score[(size_t)h * n + s] =
                    scale * dot16_(q + (size_t)h * hd, ks + (size_t)(h / group) * hd, hd);
        }
    softmax_rows_(score, n, NH, n);
    /* The weighted values, up to 64 dimensions at a time held in registers
     * over all the positions (not out[] loaded and stored at every
     * position), for up to 3 query heads at once (weigh_head_range_): of
     * one KV group, so each value row is loaded once for all of them
     * (GQA), or 3 heads with their own values (GPT-2); each sum still
     * runs over the positions in order from 0, with the same operations:
     * the same bits as head by head. */
    if (n <= prompt_len) { /* a prompt's row */
        weigh_head_range_(out, NH, KVh, hd, score, n, n, Vc, KD, 0, KVh, 0, 0, 0);
        return;
    }
    /* The prompt's positions and the row's own as two sums, added: the
     * bits of zdp_nn_kv_attend_shared_prompt, which weighs a shared
     * prompt's values once for all of its rows. */
    float *a = score + (int64_t)NH * n;
    weigh_head_range_(a, NH, KVh, hd, score, n, prompt_len, Vc, KD, 0, KVh, 0, 0, 0);
    weigh_head_range_(out, NH, KVh, hd, score + prompt_len, n, n - prompt_len,
                      Vc + (int64_t)prompt_len * KD, KD, 0, KVh, 0, 0, 0);
    for (int i = 0; i < NH * hd; i++) out[i] = a[i] + out[i];
}

/* Positions of a shared prompt's values weighed per block in
 * zdp_nn_kv_attend_shared_prompt: the block's value rows of one KV head (64 x head_dim floats, 16 KB at
 * head_dim 64) stay in L1 for all of the group's rows and heads. */
#define SHARED_VALUE_BLOCK_ 64
/* A row's own values are fetched to L2 while its scores run (and weighed
 * from there) where they take at most this many bytes; longer ones stream
 * from memory into the weighing, fetched 32 positions ahead.  Except where
 * one walk of weigh_head_range_ weighs each value row whole (one_walk_per_row_). */
#define OWN_L2_BYTES_ (512 * 1024)

/* zdp_nn_kv_attend_shared_prompt: a group's rows (rows whose slot reads
 * the first plen positions of prompt slot ps: ps's own rows and its
 * sharers'; src/sample/decode.c makes the groups), every head.  attend_row_'s math for each row
 * and head, with its operations in its order: each score dot16_'s (scores16_avx512_
 * on AVX-512), the softmax over positions 0..p, the weighted values as two
 * sums from 0 (the prompt's positions, then the row's own), added: so the
 * same bits as the row attended alone over a copy of the prompt, its
 * prompt length plen.  What differs is the reading: the prompt's keys are
 * read once for all of the chunk's rows (16 samples of a prompt read them
 * once, not 16 times), then each row's own keys, its own values fetched to
 * L2 meanwhile (OWN_L2_BYTES_), its softmax and its own weighted values,
 * then the prompt's values once for all rows, a block at a time.  S: (rows, NH, T) this
 * thread's scores, then (rows, NH hd) the prompt's weighted values. */
void zdp_nn_kv_attend_shared_prompt(const zdp_nn_kv_layer *c, const zdp_nn_kv_rows *pass,
                                    const int *rows, int nr, int ps, int plen, float *S) {
    const int64_t KD = (int64_t)c->KV * c->hd, T = c->T, QD = (int64_t)c->NH * c->hd;
    const int hd = c->hd, NH = c->NH, KVh = c->KV, group = c->NH / c->KV;
    const float scale = 1.0f / sqrtf((float)hd);
    const float *Kp = c->k + (int64_t)ps * T * KD; /* (plen, KD) */
    const float *Vp = c->v + (int64_t)ps * T * KD;
    float *W = S + (int64_t)nr * NH * T; /* (nr, QD) */
/* Row i's own keys or values: its slot's positions from plen on. */
#define OWN_(arr, i) (c->arr + ((int64_t)pass->slots[i] * T + plen) * KD)
#ifdef KVA_X86_
    const bool x86 = hd % 16 == 0 && zdp_nn_packed_path() == 2;
    if (x86) /* the prompt's scores, block by block for every row */
        for (int s0 = 0; s0 < plen; s0 += 16) {
            const int m = plen - s0 < 16 ? plen - s0 : 16,
                      nx = plen - s0 - m < 16 ? plen - s0 - m : 16;
            group_scores_avx512_(S, T, pass->q, pass->q_stride, rows, nr, NH, group,
                                 Kp + (int64_t)s0 * KD, NULL, s0, m, (int)KD, hd, scale,
                                 Kp + (int64_t)(s0 + m) * KD, nx * (int)(KD / 16), c->keys_to_l2);
        }
#endif
    const bool fetch = !one_walk_per_row_(NH, KVh, hd); /* the own values, to L2 (OWN_L2_BYTES_) */
    for (int r = 0; r < nr; r++) {
        const int n = pass->pos[rows[r]] + 1, own = n - plen;
        float *sr = S + (int64_t)r * NH * T;
        const float *qr = pass->q + rows[r] * pass->q_stride;
        const bool fits = (int64_t)own * KD * 4 <= OWN_L2_BYTES_;
#ifdef KVA_X86_
        if (x86)
            row_scores_avx512_(sr + plen, T, qr, OWN_(k, rows[r]),
                               fetch && fits ? OWN_(v, rows[r]) : NULL, own, NH, group, hd, (int)KD,
                               scale, r + 1 < nr ? OWN_(k, rows[r + 1]) : NULL, c->keys_to_l2);
        else
#endif
            for (int h = 0; h < NH; h++)
                for (int s = 0; s < n; s++)
                    sr[h * T + s] =
                        scale * dot16_(qr + (int64_t)h * hd,
                                       (s < plen ? Kp + (int64_t)s * KD
                                                 : OWN_(k, rows[r]) + (int64_t)(s - plen) * KD) +
                                           (int64_t)(h / group) * hd,
                                       hd);
        softmax_rows_(sr, T, NH, n); /* attend_row_'s softmax */
        /* the row's own weighted values (OWN_L2_BYTES_) */
        weigh_head_range_(pass->out + (int64_t)rows[r] * QD, NH, KVh, hd, sr + plen, T, own,
                          OWN_(v, rows[r]), KD, 0, KVh, 0, 32 * KD, fetch && !fits ? own - 32 : 0);
    }
    /* The prompt's weighted values, a block at a time for every row (one KV
     * head's columns of the block in L1), each sum carried across blocks.
     * Where each query head has its own KV head (GPT-2), three rows at a
     * time share each load of a value row (12 independent sums where one
     * head of one row had 4, a chain of dependent fused multiply-adds); a
     * KV head's query heads (GQA) share them already (weigh_head_range_). */
    for (int b0 = 0; b0 < plen; b0 += SHARED_VALUE_BLOCK_) {
        const int nb = plen - b0 < SHARED_VALUE_BLOCK_ ? plen - b0 : SHARED_VALUE_BLOCK_;
        for (int g = 0; g < KVh; g++)
            if (group == 1) {
                /* The first three rows' walk fetches what the next walks
                 * read: this block's next head, or the next block's first
                 * (else those values are waited on from memory). */
                const int left = plen - b0 - SHARED_VALUE_BLOCK_;
                const bool last = g == KVh - 1;
                const int64_t fetch_ahead =
                    last ? (int64_t)SHARED_VALUE_BLOCK_ * KD - (int64_t)g * hd : hd;
                const int fetch_rows = !last ? nb : left < nb ? (left > 0 ? left : 0) : nb;
                for (int r = 0; r < nr; r += 3)
                    weigh_values_(
                        W + r * QD + (int64_t)g * hd, QD, hd, S + ((int64_t)r * NH + g) * T + b0,
                        (int64_t)NH * T, nb, Vp + (int64_t)b0 * KD + (int64_t)g * hd, 0, KD,
                        nr - r < 3 ? nr - r : 3, b0 > 0, fetch_ahead, r == 0 ? fetch_rows : 0);
            } else
                for (int r = 0; r < nr; r++)
                    weigh_head_range_(W + r * QD, NH, KVh, hd, S + (int64_t)r * NH * T + b0, T, nb,
                                      Vp + (int64_t)b0 * KD, KD, g, g + 1, b0 > 0, 0, 0);
    }
    for (int r = 0; r < nr; r++) { /* attend_row_'s sum of the two */
        float *o = pass->out + (int64_t)rows[r] * QD;
        for (int64_t i = 0; i < QD; i++) o[i] = W[r * QD + i] + o[i];
    }
#undef OWN_
}

#ifdef KVA_X86_
/* zdp_nn_kv_attend_prompt_block's products on the AVX-512 path (hd a
 * multiple of 16), in place of two cblas_sgemm per (block, head): those are
 * small (M <= 64, K = hd = 64 for Q K^T; N = hd for S V), the BLAS packs
 * both operands per call and may run a narrower kernel than the CPU has,
 * and gemm.c's blocking does not pay at these sizes.  Here nothing is packed but a 32-key panel of
 * K^T (8 KB at hd 64, in L1 for all the block's query rows), and neither product computes the
 * masked triangle past the block's rows' own positions.
 *
 * The order of each element's sum (the bits depend only on the row's
 * query, its keys, values and the block's split, which the batch plan
 * (src/sample/decode.c) makes from the run alone, so not on the batch, the other rows of the
 * pass or the thread count):
 *   S[r][s] = scale * (fma chain over d = 0, 1, .., hd-1 from 0 of
 *             Q[r][d] * K[s][d]), one rounding per fused step;
 *   out[r][d] = fma chain over s = 0, 1, .., e-1 from 0 of S[r][s] *
 *             V[s][d], e = the row group's last position + 1 (the row's own
 *             positions past p0 + r add S = 0, exactly). */

/* 16 rows of 16 floats (src[i], i < 16) transposed into dst[c * ld + i]. */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
transpose16_avx512_(float *dst, int64_t ld, const float *const *src) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src[i]);
    for (int i = 0; i < 8; i++) { /* per 128-bit lane: (a0 b0 a1 b1), (a2 b2 a3 b3) */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* r[4i + c]: rows 4i..4i+3 of column 4L + c in lane L */
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; c++) { /* lanes L of rows 0-3, 4-7, 8-11, 12-15 gathered */
        const __m512 u0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        const __m512 u1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        const __m512 v0 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        const __m512 v1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
        _mm512_storeu_ps(dst + (c + 0) * ld, _mm512_shuffle_f32x4(u0, v0, 0x88));
        _mm512_storeu_ps(dst + (c + 4) * ld, _mm512_shuffle_f32x4(u1, v1, 0x88));
        _mm512_storeu_ps(dst + (c + 8) * ld, _mm512_shuffle_f32x4(u0, v0, 0xDD));
        _mm512_storeu_ps(dst + (c + 12) * ld, _mm512_shuffle_f32x4(u1, v1, 0xDD));
    }
}

/* S[r][s0 + c] (rows of stride ss) for R query rows q (stride qs) and the
 * panel's 32 keys kt[d * 32 + c], c < m (the rest masked off): 2R
 * accumulators, per d two panel loads and R broadcasts of q. */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
qk_rows_avx512_(float *S, int64_t ss, const float *q, int64_t qs, const float *kt, int hd, int m,
         __m512 vscale, int R) {
    __m512 a[8][2];
    for (int r = 0; r < R; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const __m512 k0 = _mm512_loadu_ps(kt + d * 32), k1 = _mm512_loadu_ps(kt + d * 32 + 16);
        for (int r = 0; r < R; r++) {
            const __m512 x = _mm512_set1_ps(q[r * qs + d]);
            a[r][0] = _mm512_fmadd_ps(x, k0, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(x, k1, a[r][1]);
        }
    }
    const __mmask16 m0 = m >= 16 ? 0xFFFF : (__mmask16)((1u << m) - 1u);
    const __mmask16 m1 = m >= 32 ? 0xFFFF : m <= 16 ? 0 : (__mmask16)((1u << (m - 16)) - 1u);
    for (int r = 0; r < R; r++) {
        _mm512_mask_storeu_ps(S + r * ss, m0, _mm512_mul_ps(vscale, a[r][0]));
        _mm512_mask_storeu_ps(S + r * ss + 16, m1, _mm512_mul_ps(vscale, a[r][1]));
    }
}

/* out[r][d0 .. d0 + 16 NV) (rows of stride os) = sum over s < e of S[r][s]
 * V[s][d0 ..] for R rows: R x NV accumulators, per position NV loads of V's
 * row (contiguous) and R broadcasts of S. */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
sv_rows_avx512_(float *out, int64_t os, const float *S, int64_t ss, const float *V, int64_t KD,
                int e, int R, int NV) {
    __m512 a[6][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NV; c++) a[r][c] = _mm512_setzero_ps();
    for (int s = 0; s < e; s++) {
        __m512 v[4];
        for (int c = 0; c < NV; c++) v[c] = _mm512_loadu_ps(V + s * KD + 16 * c);
        for (int r = 0; r < R; r++) {
            const __m512 x = _mm512_set1_ps(S[r * ss + s]);
            for (int c = 0; c < NV; c++) a[r][c] = _mm512_fmadd_ps(x, v[c], a[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NV; c++) _mm512_storeu_ps(out + r * os + 16 * c, a[r][c]);
}

/* S (rb, n) = scale Q K^T for the block's rows at positions p0 .. p0+rb-1,
 * only the 32-key panels some row of an 8-row group reaches (entries past
 * a row's own position are left for the softmax, which zeroes them). kt:
 * the 32 x hd panel. */
__attribute__((target("avx512f"))) static void
prompt_qk_avx512_(float *S, int64_t n, const float *q, int64_t qs, const float *K, int64_t KD,
                  int hd, int64_t p0, int64_t rb, float scale, float *kt) {
    static const float zeros[16] = {0};
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t s0 = 0; s0 < n; s0 += 32) {
        const int m = n - s0 < 32 ? (int)(n - s0) : 32;
        for (int half = 0; half < 2; half++) /* the panel, keys past n as zeros */
            for (int d = 0; d < hd; d += 16) {
                const float *src[16];
                for (int i = 0; i < 16; i++)
                    src[i] = 16 * half + i < m ? K + (s0 + 16 * half + i) * KD + d : zeros;
                transpose16_avx512_(kt + d * 32 + 16 * half, 32, src);
            }
        /* Row groups whose last row's position reaches s0. */
        for (int64_t r0 = s0 - p0 > 7 ? (s0 - p0) / 8 * 8 : 0; r0 < rb; r0 += 8) {
            const int R = rb - r0 < 8 ? (int)(rb - r0) : 8;
            float *Sr = S + r0 * n + s0;
            const float *qr = q + r0 * qs;
            switch (R) {
            case 8: qk_rows_avx512_(Sr, n, qr, qs, kt, hd, m, vscale, 8); break;
            case 7: qk_rows_avx512_(Sr, n, qr, qs, kt, hd, m, vscale, 7); break;
            case 6: qk_rows_avx512_(Sr, n, qr, qs, kt, hd, m, vscale, 6); break;
            case 5: qk_rows_avx512_(Sr, n, qr, qs, kt, hd, m, vscale, 5); break;
            case 4: qk_rows_avx512_(Sr, n, qr, qs, kt, hd, m, vscale, 4); break;
            case 3: qk_rows_avx512_(Sr, n, qr, qs, kt, hd, m, vscale, 3); break;
            case 2: qk_rows_avx512_(Sr, n, qr, qs, kt, hd, m, vscale, 2); break;
            default: qk_rows_avx512_(Sr, n, qr, qs, kt, hd, m, vscale, 1); break;
            }
        }
    }
}

/* out (rb, hd; stride os) = S V, rows in groups of 6, each group's sums
 * over positions 0 .. p0 + its last row (S is 0 past each row's own). */
__attribute__((target("avx512f"))) static void prompt_sv_avx512_(float *out, int64_t os,
                                                                 const float *S, int64_t n,
                                                                 const float *V, int64_t KD, int hd,
                                                                 int64_t p0, int64_t rb) {
    for (int64_t r0 = 0; r0 < rb; r0 += 6) {
        const int R = rb - r0 < 6 ? (int)(rb - r0) : 6, e = (int)(p0 + r0 + R);
        for (int d0 = 0; d0 < hd; d0 += 64) {
            const int NV = hd - d0 < 64 ? (hd - d0) / 16 : 4;
            float *o = out + r0 * os + d0;
            const float *Sr = S + r0 * n, *Vd = V + d0;
#define SV_(RR)                                                                          \
    case RR:                                                                             \
        if (NV == 4) sv_rows_avx512_(o, os, Sr, n, Vd, KD, e, RR, 4);                           \
        else if (NV == 3) sv_rows_avx512_(o, os, Sr, n, Vd, KD, e, RR, 3);                      \
        else if (NV == 2) sv_rows_avx512_(o, os, Sr, n, Vd, KD, e, RR, 2);                      \
        else sv_rows_avx512_(o, os, Sr, n, Vd, KD, e, RR, 1);                                   \
        break;
            switch (R) {
                SV_(6) SV_(5) SV_(4) SV_(3) SV_(2) default: SV_(1)
            }
#undef SV_
        }
    }
}
#endif

/* One block of a prompt's rows for one query head: rows i0 .. i0+rb of the
 * pass, on one slot at positions p0 .. p0+rb, against the slot's keys and
 * values 0 .. p0+rb (stored before the pass attends):
 *   S (rb, n) = Q K^T / sqrt(hd);  each row's softmax over its positions
 *   0..p, 0 past them;  out (rb, hd) = S V.
 * Two products per (block, head) instead of a dot product per (row,
 * position, head): the prompt's rows are many, so the keys and values are
 * read once per block, not once per row.  S stays in L2 (a block's rows, 64
 * at most, of at most T floats). */
void zdp_nn_kv_attend_prompt_block(const zdp_nn_kv_layer *c, const zdp_nn_kv_rows *pass, int64_t i0,
                                   int64_t rb, int64_t h, float *S) {
    const int64_t QD = (int64_t)c->NH * c->hd, KD = (int64_t)c->KV * c->hd, hd = c->hd;
    const int64_t p0 = pass->pos[i0], n = p0 + rb;
    const int64_t g = h / (c->NH / c->KV);
    const int64_t base = (int64_t)pass->slots[i0] * c->T * KD + g * hd;
    const float scale = 1.0f / sqrtf((float)hd);
#ifdef KVA_X86_
    const bool direct = hd % 16 == 0 && zdp_nn_packed_path() == 2;
    if (direct) {
        float kt[32 * 256]; /* 32 keys' K^T panel; a head past 256 keeps cblas_sgemm for Q K^T */
        if (hd <= 256)
            prompt_qk_avx512_(S, n, pass->q + i0 * pass->q_stride + h * hd, pass->q_stride,
                              c->k + base, KD, (int)hd, p0, rb, scale, kt);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rb, (int)n, (int)hd, scale,
                        pass->q + i0 * pass->q_stride + h * hd, (int)pass->q_stride, c->k + base,
                        (int)KD, 0.0f, S, (int)n);
    } else
#endif
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rb, (int)n, (int)hd, scale,
                    pass->q + i0 * pass->q_stride + h * hd, (int)pass->q_stride, c->k + base,
                    (int)KD, 0.0f, S, (int)n);
    for (int64_t r = 0; r < rb; r++) { /* attend_row_'s softmax, on positions 0..p0+r */
        float *sr = S + r * n, mx = -INFINITY, sum = 0.0f;
        const int64_t m = p0 + r + 1;
#ifdef KVA_X86_
        if (direct) mx = row_max_avx512_(sr, (int)m);
        else
#endif
        for (int64_t s = 0; s < m; s++) mx = sr[s] > mx ? sr[s] : mx;
        for (int64_t s = 0; s < m; s++) {
            sr[s] = zdp_nn_exp_(sr[s] - mx);
            sum += sr[s];
        }
        const float inv = 1.0f / sum;
        for (int64_t s = 0; s < m; s++) sr[s] *= inv;
        for (int64_t s = m; s < n; s++) sr[s] = 0.0f;
    }
#ifdef KVA_X86_
    if (direct) {
        prompt_sv_avx512_(pass->out + i0 * QD + h * hd, QD, S, n, c->v + base, KD, (int)hd, p0, rb);
        return;
    }
#endif
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rb, (int)hd, (int)n, 1.0f, S,
                (int)n, c->v + base, (int)KD, 0.0f, pass->out + i0 * QD + h * hd, (int)QD);
}

void zdp_nn_kv_attend_row(const zdp_nn_kv_layer *c, const zdp_nn_kv_rows *r, int64_t i,
                          int prompt_len, float *scratch) {
    const int64_t KD = (int64_t)c->KV * c->hd, QD = (int64_t)c->NH * c->hd;
    const int64_t base = (int64_t)r->slots[i] * c->T * KD;
    attend_row_(r->out + i * QD, r->q + i * r->q_stride, c->k + base, c->v + base, r->pos[i], c->NH,
                c->KV, c->hd, prompt_len, c->keys_to_l2, scratch);
}
