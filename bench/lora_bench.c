/*
 * lora_bench.c -- LoRA's step time against full fine-tuning of the same
 * model, and the memory of the adapter state (docs/benchmarks-lora.md).
 *
 *   mpirun -np 1 lora_bench --model gpt|llama [--rank 16] [--targets all]
 *       [--layers 6] [--hidden 384] [--heads 6] [--kv-heads 2] [--ffn 1024]
 *       [--vocab 8192] [--block 128] [--micro 4] [--steps 5] [--rounds 5]
 *
 * One base model and its weights; per round, a full fine-tuning engine
 * (every weight a parameter) and a LoRA engine (the adapters only, over the
 * same base weights) each take 1 warm-up step and --steps timed steps of
 * Adam on the same micro-batches, alternating which goes first; per mode,
 * the medians over all timed steps of all rounds of the calling thread's
 * CPU time for the step, its forward and its backward (the figure to quote
 * on a shared machine, with OPENBLAS_NUM_THREADS=1 at -np 1), and of the
 * wall times the engine reports.
 * Memory: the engine's bytes (parameters, gradients, optimizer state) of
 * each mode, the LoRA model's own scratch, and the base weights the LoRA
 * models share.  Not a test: no assertions beyond "it ran".
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zdp/zdp.h"

static double now_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* This thread's CPU time: with single-threaded BLAS the work a call did,
 * whatever else the machine runs (wall time on a shared machine is not). */
static double cpu_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die_(const char *what, const zdp_error *err) {
    fprintf(stderr, "lora_bench: %s: %s\n", what, err->msg);
    exit(1);
}

typedef struct timing {
    double *step, *fwd, *bwd, *opt; /* wall ms */
    double *cstep, *cfwd, *cbwd;    /* CPU ms of the calling thread */
    int n;
    zdp_memory_report mem;
    int64_t numel;
} timing;

/* warm-up + steps Adam steps of model (whose params are set by init) on the batches. */
static void run_(const zdp_config *cfg, const zdp_model *m, float *const *src, int steps,
                 const zdp_lm_batch *batches, timing *t) {
    zdp_engine *eng;
    zdp_error err;
    if (zdp_engine_create(cfg, m, &eng, &err) != ZDP_OK) die_("engine", &err);
    for (int i = 0; i < m->n_params; i++) {
        int64_t n = 1;
        for (int d = 0; d < m->params[i].ndim; d++) n *= m->params[i].shape[d];
        memcpy(zdp_engine_param_data(eng, i), src[i], (size_t)n * sizeof(float));
    }
    if (zdp_engine_sync_params(eng, &err) != ZDP_OK) die_("sync", &err);
    zdp_engine_memory_report(eng, &t->mem);
    t->numel = zdp_engine_numel(eng);
    for (int s = 0; s < steps + 1; s++) {
        const double t0 = now_(), c0 = cpu_();
        float loss;
        if (zdp_engine_forward(eng, &batches[s], &loss, &err) != ZDP_OK) die_("forward", &err);
        const double c1 = cpu_();
        if (zdp_engine_backward(eng, true, 1.0f, &err) != ZDP_OK) die_("backward", &err);
        const double c2 = cpu_();
        if (zdp_engine_step(eng, &err) != ZDP_OK) die_("step", &err);
        const double dt = now_() - t0, c3 = cpu_();
        if (s == 0) continue; /* warm-up */
        t->cstep[t->n] = 1e3 * (c3 - c0);
        t->cfwd[t->n] = 1e3 * (c1 - c0);
        t->cbwd[t->n] = 1e3 * (c2 - c1);
        zdp_step_timing st;
        zdp_engine_step_timing(eng, &st);
        t->step[t->n] = 1e3 * dt;
        t->fwd[t->n] = 1e3 * st.forward_s;
        t->bwd[t->n] = 1e3 * st.backward_s;
        t->opt[t->n] = 1e3 * st.optimizer_s;
        t->n++;
    }
    zdp_engine_destroy(eng);
}

static float **alloc_(const zdp_model *m) {
    float **p = calloc((size_t)m->n_params, sizeof *p);
    for (int i = 0; i < m->n_params; i++) {
        int64_t n = 1;
        for (int d = 0; d < m->params[i].ndim; d++) n *= m->params[i].shape[d];
        p[i] = malloc((size_t)n * sizeof(float));
        if (p[i] == NULL) {
            fprintf(stderr, "lora_bench: out of memory\n");
            exit(1);
        }
    }
    return p;
}

int main(int argc, char **argv) {
    zdp_error err;
    if (zdp_dist_init(&argc, &argv, &err) != ZDP_OK) die_("init", &err);
    const char *model = "llama", *targets = "all";
    int rank = 16, L = 6, H = 384, NH = 6, KV = 2, F = 1024, V = 8192, T = 128, b = 4;
    int steps = 5, rounds = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--model")) model = v;
        else if (!strcmp(k, "--targets")) targets = v;
        else if (!strcmp(k, "--rank")) rank = atoi(v);
        else if (!strcmp(k, "--layers")) L = atoi(v);
        else if (!strcmp(k, "--hidden")) H = atoi(v);
        else if (!strcmp(k, "--heads")) NH = atoi(v);
        else if (!strcmp(k, "--kv-heads")) KV = atoi(v);
        else if (!strcmp(k, "--ffn")) F = atoi(v);
        else if (!strcmp(k, "--vocab")) V = atoi(v);
        else if (!strcmp(k, "--block")) T = atoi(v);
        else if (!strcmp(k, "--micro")) b = atoi(v);
        else if (!strcmp(k, "--steps")) steps = atoi(v);
        else if (!strcmp(k, "--rounds")) rounds = atoi(v);
        else {
            fprintf(stderr, "lora_bench: unknown option %s\n", k);
            return 2;
        }
    }
    const int W = zdp_dist_world_size();
    char json[512];
    snprintf(json, sizeof json,
             "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": %d, "
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}}, "
             "\"zero_optimization\": {\"stage\": 1}}",
             b * W, b);
    zdp_config cfg;
    if (zdp_config_load_string(json, "<bench>", W, &cfg, &err) != ZDP_OK) die_("config", &err);

    zdp_model base;
    const int gpt = strcmp(model, "gpt") == 0;
    if (gpt) {
        zdp_gpt_config g = {.n_layer = L, .n_head = NH, .n_embd = H, .vocab_size = V,
                            .block_size = T};
        if (zdp_gpt_create(&g, b, &base, &err) != ZDP_OK) die_("gpt", &err);
    } else {
        zdp_llama_config c = {.arch = ZDP_ARCH_LLAMA, .n_layer = L, .hidden = H, .n_head = NH,
                              .n_kv_head = KV, .head_dim = H / NH, .ffn = F, .vocab_size = V,
                              .block_size = T, .max_position_embeddings = T,
                              .rms_norm_eps = 1e-5f, .rope_theta = 10000.0,
                              .tie_word_embeddings = 1, .initializer_range = 0.02};
        if (zdp_llama_create(&c, b, &base, &err) != ZDP_OK) die_("llama", &err);
    }
    float **bp = alloc_(&base);
    if (gpt) zdp_gpt_init_params(&base, bp, 1);
    else zdp_llama_init_params(&base, bp, 1);
    zdp_lora_config lc = {.rank = rank, .alpha = ZDP_LORA_DEFAULT_ALPHA, .seed = 2};
    if (zdp_lora_targets_parse(targets, &lc.targets, &lc.modules, &err) != ZDP_OK) die_("--targets", &err);
    zdp_model lora;
    if (zdp_lora_create(&base, (const float *const *)bp, &lc, &lora, &err) != ZDP_OK)
        die_("lora", &err);
    float **ap = alloc_(&lora);
    zdp_lora_init_params(&lora, ap);

    const int nb = steps + 1;
    zdp_lm_batch *batches = calloc((size_t)nb, sizeof *batches);
    int32_t *tok = malloc((size_t)nb * 2 * b * T * sizeof(int32_t));
    uint64_t s = 9;
    for (int64_t i = 0; i < (int64_t)nb * 2 * b * T; i++)
        tok[i] = (int32_t)(zdp_splitmix64(&s) % (uint64_t)V);
    for (int k = 0; k < nb; k++)
        batches[k] = (zdp_lm_batch){.inputs = tok + (int64_t)k * 2 * b * T,
                                    .targets = tok + ((int64_t)k * 2 + 1) * b * T, .B = b, .T = T};
    const int cap = rounds * steps;
    timing t[2];
    for (int k = 0; k < 2; k++)
        t[k] = (timing){.step = calloc((size_t)cap, sizeof(double)),
                        .fwd = calloc((size_t)cap, sizeof(double)),
                        .bwd = calloc((size_t)cap, sizeof(double)),
                        .opt = calloc((size_t)cap, sizeof(double)),
                        .cstep = calloc((size_t)cap, sizeof(double)),
                        .cfwd = calloc((size_t)cap, sizeof(double)),
                        .cbwd = calloc((size_t)cap, sizeof(double))};
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < 2; k++) {
            const int mode = (r + k) % 2; /* alternate which goes first */
            if (mode == 0) run_(&cfg, &base, bp, steps, batches, &t[0]);
            else run_(&cfg, &lora, ap, steps, batches, &t[1]);
        }
    if (zdp_dist_rank() == 0) {
        printf("%s L=%d H=%d NH=%d KV=%d F=%d V=%d T=%d b=%d W=%d, LoRA rank %d targets %s; "
               "%d rounds x %d steps, medians\n",
               gpt ? "gpt" : "llama", L, H, NH, gpt ? NH : KV, gpt ? 4 * H : F, V, T, b, W, rank,
               targets, rounds, steps);
        const char *names[2] = {"full", "lora"};
        double med[2][4], cmed[2][3];
        for (int k = 0; k < 2; k++) {
            med[k][0] = median_(t[k].step, t[k].n);
            med[k][1] = median_(t[k].fwd, t[k].n);
            med[k][2] = median_(t[k].bwd, t[k].n);
            med[k][3] = median_(t[k].opt, t[k].n);
            cmed[k][0] = median_(t[k].cstep, t[k].n);
            cmed[k][1] = median_(t[k].cfwd, t[k].n);
            cmed[k][2] = median_(t[k].cbwd, t[k].n);
            printf("%s: cpu: step_ms=%.1f fwd_ms=%.1f bwd_ms=%.1f | wall: step_ms=%.1f "
                   "fwd_ms=%.1f bwd_ms=%.1f opt_ms=%.1f\n",
                   names[k], cmed[k][0], cmed[k][1], cmed[k][2], med[k][0], med[k][1],
                   med[k][2], med[k][3]);
            printf("%s: params=%lld "
                   "engine_mib=%.2f (params %.2f, grads %.2f, optimizer %.2f) "
                   "model_scratch_mib=%.2f\n",
                   names[k], (long long)t[k].numel,
                   t[k].mem.total_bytes / 1048576.0, t[k].mem.params_bytes / 1048576.0,
                   (t[k].mem.grads_bytes + t[k].mem.grad_partition_bytes) / 1048576.0,
                   t[k].mem.optimizer_bytes / 1048576.0,
                   (k == 0 ? base.activation_bytes : lora.activation_bytes) / 1048576.0);
        }
        int64_t base_bytes = 0;
        for (int i = 0; i < base.n_params; i++) {
            int64_t n = 1;
            for (int d = 0; d < base.params[i].ndim; d++) n *= base.params[i].shape[d];
            base_bytes += n * 4;
        }
        printf("ratio lora/full (cpu): step %.3f, forward %.3f, backward %.3f; (wall) step "
               "%.3f\n",
               cmed[1][0] / cmed[0][0], cmed[1][1] / cmed[0][1], cmed[1][2] / cmed[0][2],
               med[1][0] / med[0][0]);
        printf("base weights (shared by every LoRA model) %.2f MiB, base activations (shared) "
               "%.2f MiB\n",
               base_bytes / 1048576.0, base.activation_bytes / 1048576.0);
    }
    zdp_lora_destroy(&lora);
    zdp_model_destroy(&base);
    zdp_dist_finalize();
    return 0;
}
