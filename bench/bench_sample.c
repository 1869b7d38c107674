/*
 * bench_sample.c -- sampling speed (docs/benchmarks-sample.md): prefill and
 * KV-cache decode of zdp_lm_decode on a gpt-m-shaped GPT-2 or a
 * SmolLM2-135M-shaped Llama with random weights, against the machine's
 * copy bandwidth and sgemm peak measured in the same run.
 *
 * usage: bench_sample --model gpt-m|smollm2 [--prompt P] [--new N] [--batch B]
 *                     [--reps R] [--seed S] [--samples-per-prompt S [--share 0|1]]
 *   B prompts of P random tokens are prefilled in one pass, then N tokens are
 *   decoded (greedily unless --temperature), one pass per position for all B sequences.  Best of R.
 *   --samples-per-prompt S (a divisor of B; default 1): the RL case, B/S
 *   prompts of S samples each: each prompt is prefilled once and its S slots
 *   share it (zdp_kv_share_slot: read once per group and pass), or with
 *   --share 0 get copies of it (zdp_kv_copy_slot, main's earlier way: every
 *   row reads its own).  The two print the same logits_fnv.
 * Prints one line of key=value pairs:
 *   prefill_tok_s, prefill_gflops, decode_tok_s (new tokens of all sequences
 *   per second), decode_gflops, weight_bytes, copy_gb_s, roofline_tok_s
 *   (copy_gb_s / weight_bytes: batch-1 decode reading every weight once per
 *   token), sgemm_gflops (cblas_sgemm 1024^3 .. 2048^3, best; on an AVX-512
 *   CPU where OpenBLAS runs a narrower core, also under its SkylakeX core in
 *   a child, bench_sample --probe, the better by CPU second: sgemm_core
 *   names the core, bench/blas_core.h), kv_mb
 *   (zdp_kv_bytes: the cache, its scratch and, at a batch > 1, the packed
 *   weights), first_decode_tok_s (the first repetition, which packs them),
 *   prefill_cpu_gflops and decode_cpu_gflops (per CPU second of the
 *   process: what a loaded machine's waiting leaves out), sgemm_cpu_gflops
 *   (the sgemm probe per CPU second; the ratio of these is the fraction of
 *   peak each core reached while it ran), read_gb_s and read_cpu_gb_s (a
 *   read-only stream over 256 MB split over the pool's threads, per wall and
 *   per CPU second), decode_cache_mb_per_pass (the keys and values a decode
 *   pass reads, on average; a shared prompt once per group), decode_cpu_tok_s, decode_roof_cpu_tok_s
 *   (decode's roofline per CPU second: the passes' FLOPs at sgemm_cpu_gflops
 *   plus their weight and cache bytes at read_cpu_gb_s, added) and
 *   decode_of_roof (the measured speed over that bound); then a second line,
 *   logits_fnv: a hash of the last pass's logits.
 *   --temperature T (default 0, greedy): decode draws each token at T (top_k
 *   none, top_p 1) and asks for its logprob, the RL case.
 * Threads: OPENBLAS_NUM_THREADS, as the tool runs.
 *
 * bench_sample --sampler V [--reps R]: zdp_sample_token alone on rows of V
 *   random logits (spread like a model's), against main's earlier code
 *   (kept below as old_sample_token_: a double exp per token for the sum,
 *   for the walk and for zdp_logprob_of's normaliser; top_p by qsort),
 *   alternating, R rounds of 32 rows each; for temperature 1 with logprob
 *   and 0.7 with top_p 0.9 (no top_k: its heap is unchanged).  Prints the
 *   medians of CPU microseconds per row of each and their ratio.
 *
 * bench_sample --gemm M,K,N [--reps R]: the products alone, C (M,N) = A (M,K)
 *   @ W^T for W (N,K) a torch.nn.Linear weight, through the packed kernels
 *   (nn.h's packed B, the decode path) and through cblas_sgemm, alternating
 *   in the same loop R times over enough distinct weights (>= 256 MB) that
 *   they stream from memory as a decode step's do (M,K,N,W: W weights; 1
 *   keeps the weight in cache, the kernel's own speed).  Prints the medians of
 *   GFLOP/s per CPU second and per wall second of each, and their ratio.
 */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blas_core.h"
#include "nn/nn.h"
#include "zdp/zdp.h"

static double now_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best memcpy GB/s (bytes copied per second) over a 256 MB buffer. */
static double copy_gb_s_(void) {
    const size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (a == NULL || b == NULL) return 0;
    memset(a, 1, n), memset(b, 2, n);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t = now_();
        memcpy(b, a, n);
        t = now_() - t;
        if (n / t / 1e9 > best) best = n / t / 1e9;
        a[r] = b[n - 1 - r]; /* keep the copies */
    }
    free(a), free(b);
    return best;
}

/* A read-only stream: the best GB/s over R passes summing a 256 MB buffer,
 * split over the pool's threads (as decode attention splits its rows), per
 * wall second and (*cpu_best) per CPU second of the process.  Decode
 * attention only reads its cache, so this, not memcpy's rate, is its
 * bandwidth bound. */
typedef struct read_job_ {
    const float *buf;
    int64_t n, per;
    float *sums; /* (tasks) keeps the reads */
} read_job_;
static void read_task_(void *ctx, int64_t t, int thread) {
    (void)thread;
    const read_job_ *j = ctx;
    const int64_t lo = t * j->per, hi = lo + j->per < j->n ? lo + j->per : j->n;
    float acc[16] = {0};
    for (int64_t i = lo; i + 16 <= hi; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += j->buf[i + k];
    float s = 0;
    for (int k = 0; k < 16; k++) s += acc[k];
    j->sums[t] = s;
}
static double cpu_now_(void);
static double read_gb_s_(double *cpu_best) {
    const int64_t n = ((int64_t)256 << 20) / 4;
    float *a = malloc((size_t)n * 4), sums[64];
    *cpu_best = 0;
    if (a == NULL) return 0;
    for (int64_t i = 0; i < n; i++) a[i] = (float)(i & 7);
    const int tasks = zdp_pool_size() < 64 ? zdp_pool_size() : 64;
    read_job_ j = {.buf = a, .n = n, .per = (n / tasks + 15) / 16 * 16, .sums = sums};
    double best = 0;
    for (int r = 0; r < 5; r++) {
        const double c0 = cpu_now_(), t0 = now_();
        zdp_pool_run(tasks, read_task_, &j);
        const double t = now_() - t0, ct = cpu_now_() - c0;
        if (n * 4.0 / t / 1e9 > best) best = n * 4.0 / t / 1e9;
        if (n * 4.0 / ct / 1e9 > *cpu_best) *cpu_best = n * 4.0 / ct / 1e9;
        a[r] = sums[0]; /* keep the reads */
    }
    free(a);
    return best;
}

/* CPU seconds of this process (all its threads): on a shared, loaded
 * machine, time spent waiting for a core is not counted, so figures per CPU
 * second compare runs taken under different loads (at one thread, they are
 * the speed the code would have on a core of its own). */
static double cpu_now_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best cblas_sgemm GFLOP/s per wall second; *cpu_best: per CPU second. */
static double sgemm_probe_(double *cpu_best) {
    double best = 0;
    *cpu_best = 0;
    for (int n = 1024; n <= 2048; n *= 2) {
        size_t nn = (size_t)n * n;
        float *a = malloc(nn * 4), *b = malloc(nn * 4), *c = malloc(nn * 4);
        if (a == NULL || b == NULL || c == NULL) return best;
        for (size_t i = 0; i < nn; i++) a[i] = b[i] = (float)(i % 7) * 0.01f;
        for (int r = 0; r < 3; r++) {
            const double c0 = cpu_now_();
            double t = now_();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f,
                        c, n);
            t = now_() - t;
            const double ct = cpu_now_() - c0;
            if (2.0 * n * n * n / t / 1e9 > best) best = 2.0 * n * n * n / t / 1e9;
            if (2.0 * n * n * n / ct / 1e9 > *cpu_best) *cpu_best = 2.0 * n * n * n / ct / 1e9;
        }
        free(a), free(b), free(c);
    }
    return best;
}

/* The machine's sgemm peak: this process's cblas_sgemm, and where OpenBLAS
 * runs a narrower core than the CPU can (blas_core.h) the same probe in a
 * child under OPENBLAS_CORETYPE=SkylakeX (bench_sample --probe); the better
 * of the two, by CPU second.  *core: the OpenBLAS core that gave it. */
static double sgemm_gflops_(double *cpu_best, const char **core) {
    double best = sgemm_probe_(cpu_best);
    *core = openblas_get_corename();
    if (!bench_blas_narrower_core()) return best;
    char out[512];
    static char name[] = "bench_sample", probe[] = "--probe";
    char *argv[] = {name, probe, NULL};
    const int rc = bench_run_wide_core(argv, out, sizeof out);
    const double wide = bench_find_number(out, "sgemm_gflops"),
                 wide_cpu = bench_find_number(out, "sgemm_cpu_gflops");
    if (rc != 0 || wide <= 0 || wide_cpu <= 0) {
        fprintf(stderr, "bench_sample: the probe under OPENBLAS_CORETYPE=%s failed (%d): %s\n",
                BENCH_WIDE_CORE, rc, out);
        return best;
    }
    if (wide_cpu > *cpu_best) best = wide, *cpu_best = wide_cpu, *core = BENCH_WIDE_CORE;
    return best;
}

static int cmp_d_(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d_);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* --gemm M,K,N: packed kernels against cblas_sgemm, alternating. */
static int gemm_bench_(const char *shape, int reps) {
    long M, K, N, nwant = 0;
    const int got = sscanf(shape, "%ld,%ld,%ld,%ld", &M, &K, &N, &nwant);
    if (got < 3 || M < 1 || K < 1 || N < 1 || nwant < 0 || reps > 64) {
        fprintf(stderr, "bench_sample: --gemm M,K,N[,W] (each >= 1; --reps <= 64), not '%s'\n", shape);
        return 2;
    }
    /* Distinct weights, each read once per pass, so that they come from
     * memory (W: this many instead; 1 keeps one weight in cache). */
    const int64_t wf = (int64_t)K * N, pf = zdp_nn_packed_floats(K, N);
    const int nw = nwant > 0 ? (int)nwant : (int)(((int64_t)256 << 20) / (wf * 4) + 1);
    float *A = malloc((size_t)(M * K) * 4), *Cm = malloc((size_t)(M * N) * 4);
    float **W = calloc((size_t)nw, sizeof *W), **Bp = calloc((size_t)nw, sizeof *Bp);
    if (A == NULL || Cm == NULL || W == NULL || Bp == NULL) return 1;
    uint64_t s = 7;
    for (int64_t i = 0; i < M * K; i++) A[i] = (float)(zdp_splitmix64(&s) % 1000) * 1e-3f - 0.5f;
    for (int w = 0; w < nw; w++) {
        W[w] = malloc((size_t)wf * 4), Bp[w] = zdp_big_alloc((size_t)pf * 4);
        if (W[w] == NULL || Bp[w] == NULL) return 1;
        for (int64_t i = 0; i < wf; i++) W[w][i] = (float)(zdp_splitmix64(&s) % 1000) * 1e-3f - 0.5f;
        zdp_nn_pack_b(Bp[w], W[w], K, N, 1);
    }
    double pc[64], pw[64], bc[64], bw[64], ratio[64];
    const double flops = 2.0 * M * K * N * nw;
    for (int r = 0; r < reps; r++) {
        for (int which = 0; which < 2; which++) {
            const double c0 = cpu_now_(), t0 = now_();
            for (int w = 0; w < nw; w++) {
                if (which == 0) zdp_nn_packed_gemm(Cm, N, A, K, Bp[w], NULL, M, K, N, 0);
                else
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, A,
                                (int)K, W[w], (int)K, 0.0f, Cm, (int)N);
            }
            const double ct = cpu_now_() - c0, t = now_() - t0;
            (which == 0 ? pc : bc)[r] = flops / ct / 1e9;
            (which == 0 ? pw : bw)[r] = flops / t / 1e9;
        }
        ratio[r] = pc[r] / bc[r];
    }
    printf("gemm M=%ld K=%ld N=%ld weights=%d path=%d reps=%d packed_cpu_gflops=%.1f packed_gflops=%.1f "
           "sgemm_cpu_gflops=%.1f sgemm_gflops=%.1f packed_over_sgemm_cpu=%.2f\n",
           M, K, N, nw, zdp_nn_packed_path(), reps, median_(pc, reps), median_(pw, reps),
           median_(bc, reps), median_(bw, reps), median_(ratio, reps));
    for (int w = 0; w < nw; w++) free(W[w]), free(Bp[w]);
    free(W), free(Bp), free(A), free(Cm);
    return 0;
}

/* ---- --sampler: main's earlier zdp_sample_token, the "before" ---------- */

typedef struct old_ranked_ {
    float logit;
    int id;
} old_ranked_;

static int old_desc_(const void *a, const void *b) {
    const old_ranked_ *x = a, *y = b;
    return x->logit > y->logit ? -1 : x->logit < y->logit ? 1 : (x->id > y->id) - (x->id < y->id);
}

static int old_sample_token_(const float *logits, int V, const zdp_sample_params *sp,
                             uint64_t *rng, float *logprob) { /* (top_k 0 only) */
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    int t = best;
    const double temp = sp->temperature;
    if (temp > 0) {
        float cut = -INFINITY;
        if (sp->top_p < 1.0) {
            old_ranked_ *r = malloc((size_t)V * sizeof *r);
            int m = 0;
            double sum = 0;
            for (int v = 0; v < V; v++)
                if (logits[v] >= cut) {
                    r[m++] = (old_ranked_){logits[v], v};
                    sum += exp((logits[v] - logits[best]) / temp);
                }
            qsort(r, (size_t)m, sizeof *r, old_desc_);
            double acc = 0;
            for (int k = 0; k < m; k++) {
                acc += exp((r[k].logit - logits[best]) / temp);
                cut = r[k].logit;
                if (acc >= sp->top_p * sum) break;
            }
            free(r);
        }
        double sum = 0;
        for (int v = 0; v < V; v++)
            sum += logits[v] >= cut ? exp((logits[v] - logits[best]) / temp) : 0.0;
        double u = (double)(zdp_splitmix64(rng) >> 11) * 0x1.0p-53 * sum, acc = 0;
        for (int v = 0; v < V; v++) {
            if (logits[v] < cut) continue;
            acc += exp((logits[v] - logits[best]) / temp);
            t = v;
            if (acc >= u) break;
        }
    }
    if (logprob != NULL) *logprob = zdp_logprob_of(logits, V, t);
    return t;
}

static int cmp_double_(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* --sampler V: CPU microseconds per row, new against old, alternating. */
static int sampler_bench_(int V, int reps) {
    enum { ROWS = 32 };
    if (V < 2 || reps > 256) {
        fprintf(stderr, "bench_sample: --sampler V needs V >= 2 (and --reps <= 256)\n");
        return 2;
    }
    float *lg = malloc((size_t)ROWS * V * sizeof *lg);
    uint64_t s = 5;
    for (int i = 0; i < ROWS * V; i++) { /* roughly normal, sd 2.5: a trained model's spread */
        double g = 0;
        for (int j = 0; j < 4; j++) g += (double)(zdp_splitmix64(&s) >> 11) * 0x1.0p-53 - 0.5;
        lg[i] = (float)(g * 2.5 * 1.732);
    }
    const struct {
        const char *name;
        zdp_sample_params sp;
    } cases[] = {{"t1_logprob", {1.0, 0, 1.0}},
                 {"t0.7_top_p0.9", {0.7, 0, 0.9}}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        double t_new[256], t_old[256];
        uint64_t rng = 1;
        long sink = 0;
        for (int r = 0; r < reps; r++)
            for (int which = 0; which < 2; which++) {
                float lp;
                const double c0 = cpu_now_();
                for (int row = 0; row < ROWS; row++)
                    sink += which == 0 ? zdp_sample_token(lg + (size_t)row * V, V, &cases[c].sp, &rng, &lp)
                                       : old_sample_token_(lg + (size_t)row * V, V, &cases[c].sp, &rng, &lp);
                (which == 0 ? t_new : t_old)[r] = (cpu_now_() - c0) / ROWS * 1e6;
            }
        qsort(t_new, (size_t)reps, sizeof *t_new, cmp_double_);
        qsort(t_old, (size_t)reps, sizeof *t_old, cmp_double_);
        printf("sampler V=%d case=%s new_cpu_us_per_row=%.1f old_cpu_us_per_row=%.1f ratio=%.2f (sink %ld)\n",
               V, cases[c].name, t_new[reps / 2], t_old[reps / 2], t_old[reps / 2] / t_new[reps / 2],
               sink % 10);
    }
    free(lg);
    return 0;
}

int main(int argc, char **argv) {
    const char *which = "gpt-m";
    int P = 64, N = 256, B = 1, reps = 2;
    uint64_t seed = 1;
    const char *gemm = NULL;
    int sampler = 0, S = 1, share = 1;
    double temperature = 0;
    if (argc == 2 && strcmp(argv[1], "--probe") == 0) { /* sgemm_gflops_'s child */
        double cpu;
        const double wall = sgemm_probe_(&cpu);
        printf("sgemm_gflops=%.1f sgemm_cpu_gflops=%.1f\n", wall, cpu);
        return 0;
    }
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0) which = argv[i + 1];
        else if (strcmp(argv[i], "--gemm") == 0) gemm = argv[i + 1];
        else if (strcmp(argv[i], "--prompt") == 0) P = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--new") == 0) N = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--batch") == 0) B = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0) reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--sampler") == 0) sampler = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--temperature") == 0) temperature = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--seed") == 0) seed = (uint64_t)atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--samples-per-prompt") == 0) S = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--share") == 0) share = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_sample: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    if (P < 1 || N < 1 || B < 1 || reps < 1) {
        fprintf(stderr, "bench_sample: --prompt, --new, --batch and --reps must be >= 1\n");
        return 2;
    }
    if (S < 1 || B % S != 0 || (share != 0 && share != 1)) {
        fprintf(stderr, "bench_sample: --samples-per-prompt %d: must divide --batch %d (and "
                "--share must be 0 or 1)\n", S, B);
        return 2;
    }
    if (gemm != NULL) return gemm_bench_(gemm, reps);
    if (sampler != 0) return sampler_bench_(sampler, reps < 3 ? 9 : reps);
    if (!(temperature >= 0)) {
        fprintf(stderr, "bench_sample: --temperature must be >= 0\n");
        return 2;
    }
    zdp_model m;
    zdp_error err;
    zdp_status st;
    int C, L, QD, KD, F, V;
    bool gpt = strcmp(which, "gpt-m") == 0;
    if (gpt) { /* docs/benchmarks-gpt.md's gpt-m, with room for prompt + new tokens */
        zdp_gpt_config c = {.n_layer = 6, .n_head = 6, .n_embd = 384, .vocab_size = 256,
                            .block_size = 512};
        st = zdp_gpt_create(&c, 1, &m, &err);
        C = 384, L = 6, QD = KD = 384, F = 4 * 384, V = 256;
    } else if (strcmp(which, "smollm2") == 0) { /* SmolLM2-135M's config.json */
        zdp_llama_config c = {.arch = ZDP_ARCH_LLAMA, .n_layer = 30, .hidden = 576, .n_head = 9,
                              .n_kv_head = 3, .head_dim = 64, .ffn = 1536, .vocab_size = 49152,
                              .block_size = 512, .max_position_embeddings = 8192,
                              .rms_norm_eps = 1e-5f, .rope_theta = 100000.0,
                              .tie_word_embeddings = 1, .initializer_range = 0.041666};
        st = zdp_llama_create(&c, 1, &m, &err);
        C = 576, L = 30, QD = 576, KD = 192, F = 1536, V = 49152;
    } else {
        fprintf(stderr, "bench_sample: --model gpt-m or smollm2\n");
        return 2;
    }
    if (st != ZDP_OK) {
        fprintf(stderr, "bench_sample: %s\n", err.msg);
        return 1;
    }
    if (P + N > m.block_size) {
        fprintf(stderr, "bench_sample: --prompt + --new must be <= %d\n", m.block_size);
        return 2;
    }
    float **p = calloc((size_t)m.n_params, sizeof *p);
    int64_t nparam = 0;
    for (int i = 0; i < m.n_params; i++) {
        int64_t n = m.params[i].shape[0] * (m.params[i].ndim == 2 ? m.params[i].shape[1] : 1);
        p[i] = zdp_big_alloc((size_t)n * sizeof(float)); /* as the engine's and the server's */
        nparam += n;
    }
    if (gpt) zdp_gpt_init_params(&m, p, seed);
    else zdp_llama_init_params(&m, p, seed);
    /* Bytes read per decode step: every weight matrix once (the token
     * embedding is a row lookup, but tied, it is the lm_head: read whole). */
    const double weight_bytes = 4.0 * (double)(nparam - (gpt ? 512LL * C : 0));
    /* Matmul FLOPs per token (2 per multiply-add): the layers' projections and
     * MLP, and the lm_head; attention adds 4 * L * QD per position attended. */
    const double mm_flops = 2.0 * L * ((double)C * (QD + 2 * KD) + (double)QD * C +
                                       (gpt ? 2.0 : 3.0) * C * F) + 2.0 * C * V;
    zdp_kv_cache *kv;
    if (zdp_kv_create(&m, B, P + N, &kv, &err) != ZDP_OK) {
        fprintf(stderr, "bench_sample: %s\n", err.msg);
        return 1;
    }
    const int G = B / S; /* prompts, each prefilled once into slot g*S */
    int32_t *slots = malloc((size_t)B * P * sizeof *slots), *tok = malloc((size_t)B * P * sizeof *tok);
    int32_t *dslots = malloc((size_t)B * sizeof *dslots); /* (B) a decode step's rows */
    uint8_t *want = malloc((size_t)B * P);
    for (int b = 0; b < B; b++) dslots[b] = b;
    float *logits = malloc((size_t)B * V * sizeof *logits);
    uint64_t s = seed;
    for (int b = 0; b < G; b++)
        for (int t = 0; t < P; t++) {
            slots[b * P + t] = b * S;
            tok[b * P + t] = (int32_t)(zdp_splitmix64(&s) % (uint64_t)V);
            want[b * P + t] = t == P - 1;
        }
    double best_pre = 1e30, best_dec = 1e30, first_dec = 0, best_cpu_dec = 1e30, best_cpu_pre = 1e30;
    const zdp_sample_params spar = {.temperature = temperature, .top_k = 0, .top_p = 1.0};
    float lp; /* at a temperature, each token's logprob too (the RL case) */
    for (int r = 0; r < reps; r++) {
        for (int b = 0; b < B; b++) zdp_kv_clear(kv, b);
        const double c0 = cpu_now_();
        double t0 = now_();
        if (zdp_lm_decode(kv, (const float *const *)p, slots, tok, G * P, want, logits, &err) != ZDP_OK) {
            fprintf(stderr, "bench_sample: %s\n", err.msg);
            return 1;
        }
        for (int b = 0; b < B; b++) /* a prompt's other samples */
            if (b % S != 0) (share ? zdp_kv_share_slot : zdp_kv_copy_slot)(kv, b, b - b % S);
        double t1 = now_();
        const double c1 = cpu_now_();
        int32_t next[4096];
        for (int step = 0; step < N; step++) {
            for (int b = 0; b < B; b++) /* the prefill's logits: one row per prompt */
                next[b] = zdp_sample_token(logits + (size_t)(step == 0 ? b / S : b) * V, V, &spar, &s,
                                           temperature > 0 ? &lp : NULL);
            if (step == N - 1) break; /* the last token needs no pass */
            if (zdp_lm_decode(kv, (const float *const *)p, dslots, next, B, NULL, logits, &err) != ZDP_OK) {
                fprintf(stderr, "bench_sample: %s\n", err.msg);
                return 1;
            }
        }
        double t2 = now_();
        const double c2 = cpu_now_();
        if (c1 - c0 < best_cpu_pre) best_cpu_pre = c1 - c0;
        if (c2 - c1 < best_cpu_dec) best_cpu_dec = c2 - c1;
        if (t1 - t0 < best_pre) best_pre = t1 - t0;
        if (t2 - t1 < best_dec) best_dec = t2 - t1;
        if (r == 0) first_dec = t2 - t1; /* includes packing the weights (a batch > 1) */
    }
    /* Decode: N - 1 passes of B rows (the first new token comes from the prefill). */
    const double pre_tok = (double)G * P, dec_tok = (double)B * (N - 1);
    const double att_pre = 4.0 * L * QD * (double)G * P * (P + 1) / 2;
    const double att_dec = 4.0 * L * QD * (double)B * ((double)(N - 1) * P + (double)N * (N - 1) / 2);
    double cpu_peak, read_cpu;
    const char *peak_core;
    const double copy = copy_gb_s_(), peak = sgemm_gflops_(&cpu_peak, &peak_core), rd = read_gb_s_(&read_cpu);
    /* Decode's roofline, per CPU second: the passes' FLOPs at the sgemm
     * probe's rate plus the bytes they must read at the read stream's rate,
     * every weight once per pass and each row its own slot's keys and values
     * (4 bytes x 2 x L x KD per position attended), added (a bound that
     * assumes no overlap of the two, as a pass that alternates products and
     * attention gets).  At batch 32 on gpt-m the cache's bytes are most of
     * it: its attention does 0.5 FLOP per byte read.  A shared prompt is
     * read once per group. */
    const double cache_bytes = 8.0 * L * KD * ((double)(share ? G : B) * (N - 1) * P + (double)B * N * (N - 1) / 2);
    const double dec_bytes = (double)(N - 1) * weight_bytes + cache_bytes;
    const double roof_cpu_s = (dec_tok * mm_flops + att_dec) / (cpu_peak * 1e9) + dec_bytes / (read_cpu * 1e9);
    printf("model=%s P=%d N=%d B=%d S=%d share=%d T=%g params=%lld prefill_tok_s=%.1f prefill_gflops=%.1f "
           "decode_tok_s=%.1f decode_gflops=%.1f weight_bytes=%.0f copy_gb_s=%.2f "
           "roofline_tok_s=%.1f sgemm_gflops=%.1f kv_mb=%.1f first_decode_tok_s=%.1f "
           "prefill_cpu_gflops=%.1f decode_cpu_gflops=%.1f sgemm_cpu_gflops=%.1f read_gb_s=%.2f "
           "read_cpu_gb_s=%.2f decode_cache_mb_per_pass=%.1f decode_cpu_tok_s=%.1f "
           "decode_roof_cpu_tok_s=%.1f decode_of_roof=%.2f sgemm_core=%s\n",
           which, P, N, B, S, S > 1 ? share : 0, temperature, (long long)nparam, pre_tok / best_pre,
           (pre_tok * mm_flops + att_pre) / best_pre / 1e9, dec_tok / best_dec,
           (dec_tok * mm_flops + att_dec) / best_dec / 1e9, weight_bytes, copy,
           copy * 1e9 / weight_bytes, peak, zdp_kv_bytes(kv) / 1e6, dec_tok / first_dec,
           (pre_tok * mm_flops + att_pre) / best_cpu_pre / 1e9,
           (dec_tok * mm_flops + att_dec) / best_cpu_dec / 1e9, cpu_peak, rd, read_cpu,
           N > 1 ? cache_bytes / (N - 1) / 1e6 : 0.0, dec_tok / best_cpu_dec, dec_tok / roof_cpu_s,
           roof_cpu_s / best_cpu_dec, peak_core);
    /* The last pass's logits, hashed: two builds that must compute the same
     * bits (a faster kernel that keeps the order of the sums) print the same. */
    uint64_t h = 1469598103934665603ULL;
    const unsigned char *lb = (const unsigned char *)logits;
    for (size_t i = 0; i < (size_t)B * V * sizeof(float); i++) h = (h ^ lb[i]) * 1099511628211ULL;
    printf("logits_fnv=%016llx\n", (unsigned long long)h);
    zdp_kv_destroy(kv);
    for (int i = 0; i < m.n_params; i++) free(p[i]);
    free(p), free(slots), free(dslots), free(tok), free(want), free(logits);
    zdp_model_destroy(&m);
    return 0;
}
