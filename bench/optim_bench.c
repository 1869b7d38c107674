/*
 * optim_bench.c -- the optimizer step alone: zdp's AdamW update over this
 * rank's partition, timed by the engine itself (zdp_engine_step_timing's
 * optimizer_s), through the public API only.
 *
 * A stand-in model with one parameter tensor of N elements (N = a GPT's
 * parameter count) whose forward costs nothing and whose backward adds a
 * constant gradient, so each step() is the reduction, the norm, the update
 * and (stage 2) the all-gather; optimizer_s is the update alone.
 *
 *   mpirun -np W optim_bench --numel N [--stage 0|2] [--steps 20]
 *
 * Prints on rank 0:
 *   optim numel=N stage=S W=W partition=P update_ms=median step_ms=median
 *   update_ns_per_elem=... update_GBps=...
 * update_GBps counts 28 bytes per element (read p, g, m, v; write p, m, v).
 * Build: mpicc -O2 -Iinclude bench/optim_bench.c build/libzdp.a -ljansson -lopenblas -lm -lpthread
 * (bench/run_gpt_bench.sh does this).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "zdp/zdp.h"

typedef struct dummy {
    int64_t n;
    zdp_param_info info;
} dummy;

static zdp_status fwd_(void *self, zdp_param_source *params, const void *batch, float *loss,
                       zdp_error *err) {
    (void)self;
    (void)params;
    (void)batch;
    (void)err;
    *loss = 0.0f;
    return ZDP_OK;
}

static zdp_status bwd_(void *self, zdp_param_source *params, float dloss, zdp_grad_sink *sink,
                       zdp_error *err) {
    (void)params;
    dummy *d = self;
    float *g = zdp_grad_acquire(sink, 0);
    if (g == NULL) {
        if (err != NULL) snprintf(err->msg, sizeof err->msg, "grad_acquire failed");
        return ZDP_ERR_INTERNAL;
    }
    for (int64_t i = 0; i < d->n; i++) g[i] += dloss * 1e-3f * (float)((i % 97) - 48);
    zdp_grad_release(sink, 0);
    return ZDP_OK;
}

static const zdp_model_ops ops_ = {.forward = fwd_, .backward = bwd_};

int main(int argc, char **argv) {
    long long numel = 3257856;
    int stage = 2, steps = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--numel")) numel = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--stage")) stage = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: optim_bench --numel N [--stage 0|2] [--steps S]\n");
            return 2;
        }
    }
    zdp_error err;
    if (zdp_dist_init(&argc, &argv, &err) != ZDP_OK) bench_die("init", &err);
    zdp_set_log(NULL, NULL);
    const int W = zdp_dist_world_size(), R = zdp_dist_rank();
    char json[512];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 1, "
             "\"gradient_clipping\": 1.0, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
             "{\"lr\": 1e-4, \"weight_decay\": 0.1}}, \"zero_optimization\": {\"stage\": %d}}",
             stage);
    zdp_config cfg;
    if (zdp_config_load_string(json, "<optim_bench>", W, &cfg, &err) != ZDP_OK) bench_die("config", &err);
    dummy d = {.n = numel, .info = {.name = "w", .ndim = 1, .shape = {numel}}};
    zdp_model model = {.self = &d, .ops = &ops_, .n_params = 1, .params = &d.info};
    zdp_engine *eng;
    if (zdp_engine_create(&cfg, &model, &eng, &err) != ZDP_OK) bench_die("engine_create", &err);
    float *p = zdp_engine_param_data(eng, 0);
    for (int64_t i = 0; i < numel; i++) p[i] = 0.01f * (float)(i % 13);
    if (zdp_engine_sync_params(eng, &err) != ZDP_OK) bench_die("sync", &err);

    double *upd = malloc((size_t)steps * sizeof(double)), *stp = malloc((size_t)steps * sizeof(double));
    int warm = 2;
    for (int s = 0; s < warm + steps; s++) {
        float loss;
        if (zdp_engine_forward(eng, NULL, &loss, &err) != ZDP_OK) bench_die("forward", &err);
        if (zdp_engine_backward(eng, true, 1.0f, &err) != ZDP_OK) bench_die("backward", &err);
        if (zdp_engine_step(eng, &err) != ZDP_OK) bench_die("step", &err);
        zdp_step_timing t;
        zdp_engine_step_timing(eng, &t);
        if (s >= warm) {
            upd[s - warm] = t.optimizer_s;
            stp[s - warm] = t.step_s;
        }
    }
    double u = bench_median(upd, steps), st = bench_median(stp, steps);
    int64_t part = stage == 0 ? zdp_engine_numel(eng) : zdp_engine_partition_numel(eng);
    if (R == 0) {
        printf("optim numel=%lld stage=%d W=%d partition=%lld update_ms=%.3f step_ms=%.3f "
               "update_ns_per_elem=%.3f update_GBps=%.2f\n",
               numel, stage, W, (long long)part, u * 1e3, st * 1e3, u * 1e9 / (double)part,
               28.0 * (double)part / u * 1e-9);
    }
    free(upd);
    free(stp);
    zdp_engine_destroy(eng);
    zdp_dist_finalize();
    return 0;
}
