/*
 * bench_train.c -- step time, communication-wait share and peak RSS of the
 * engine training the MLP, for one configuration per run (bench/run_zero2.sh
 * runs the grid, alternating configurations, and takes medians).
 *
 *   mpirun -np 2 bench_train --stage 2 --overlap 1 --managed 1
 *       [--hidden 1024] [--layers 4] [--micro 64] [--gas 4] [--steps 6]
 *       [--warmup 1] [--bucket N]
 *
 * Prints one line on rank 0:
 *   stage=2 overlap=1 managed=1 step_ms=... comm_wait_ms=... comm_share=...
 *   fwd_ms=... bwd_ms=... opt_ms=... rss_mib=r0,r1,...
 * step_ms is wall time per optimizer step (median over the measured steps);
 * comm_wait_ms is the time the training thread was blocked on the comm
 * stream in that step (backward's reductions, the step's reductions, norm
 * and all-gather).  Not a test: no assertions beyond "it ran".
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "bench_common.h"
#include "zdp/zdp.h"

int main(int argc, char **argv) {
    int stage = 2, overlap = 0, managed = 1, hidden = 1024, layers = 4, micro = 64, gas = 4;
    int steps = 6, warmup = 1;
    long long bucket = 500000000;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i];
        long long v = atoll(argv[i + 1]);
        if (!strcmp(a, "--stage")) stage = (int)v;
        else if (!strcmp(a, "--overlap")) overlap = (int)v;
        else if (!strcmp(a, "--managed")) managed = (int)v;
        else if (!strcmp(a, "--hidden")) hidden = (int)v;
        else if (!strcmp(a, "--layers")) layers = (int)v;
        else if (!strcmp(a, "--micro")) micro = (int)v;
        else if (!strcmp(a, "--gas")) gas = (int)v;
        else if (!strcmp(a, "--steps")) steps = (int)v;
        else if (!strcmp(a, "--warmup")) warmup = (int)v;
        else if (!strcmp(a, "--bucket")) bucket = v;
        else {
            fprintf(stderr, "bench_train: unknown option %s\n", a);
            return 2;
        }
    }
    zdp_error err;
    if (zdp_dist_init(&argc, &argv, &err) != ZDP_OK) bench_die("init", &err);
    zdp_set_log(NULL, NULL);
    const int W = zdp_dist_world_size(), R = zdp_dist_rank();

    char json[512];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d, "
             "\"managed_gradient_accumulation\": %s, \"steps_per_print\": 1000000, "
             "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-4}}, "
             "\"zero_optimization\": {\"stage\": %d, \"overlap_comm\": %s, "
             "\"reduce_bucket_size\": %lld}}",
             micro, gas, managed ? "true" : "false", stage, overlap ? "true" : "false", bucket);
    zdp_config cfg;
    if (zdp_config_load_string(json, "<bench>", W, &cfg, &err) != ZDP_OK) bench_die("config", &err);
    zdp_model model;
    if (zdp_mlp_create(hidden, layers, micro, &model, &err) != ZDP_OK) bench_die("model", &err);
    zdp_engine *eng;
    if (zdp_engine_create(&cfg, &model, &eng, &err) != ZDP_OK) bench_die("engine", &err);
    float *views[2048];
    for (int i = 0; i < model.n_params; i++) views[i] = zdp_engine_param_data(eng, i);
    zdp_mlp_init_params(&model, views, 1);
    if (zdp_engine_sync_params(eng, &err) != ZDP_OK) bench_die("sync", &err);

    /* Random inputs and labels, different per rank. */
    float *x = malloc((size_t)micro * (size_t)hidden * sizeof(float));
    int64_t *y = malloc((size_t)micro * sizeof(int64_t));
    unsigned s = 1234u + (unsigned)R;
    for (long i = 0; i < (long)micro * hidden; i++) x[i] = (float)((int)(rand_r(&s) % 2001) - 1000) / 1000.0f;
    for (int i = 0; i < micro; i++) y[i] = rand_r(&s) % hidden;
    zdp_mlp_batch batch = {.x = x, .y = y, .n = micro};

    double *step_s = calloc((size_t)steps, sizeof(double));
    double *wait_s = calloc((size_t)steps, sizeof(double));
    double fwd = 0, bwd = 0, opt = 0;
    /* Unmanaged: window sizes cycle around G (G-1, G, G+1). */
    for (int it = 0; it < warmup + steps; it++) {
        int n = managed ? gas : gas - 1 + it % 3;
        if (n < 1) n = 1;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = bench_now();
        for (int k = 0; k < n; k++) {
            float loss;
            if (zdp_engine_forward(eng, &batch, &loss, &err) != ZDP_OK) bench_die("forward", &err);
            if (zdp_engine_backward(eng, managed, managed ? 1.0f : 1.0f / (float)n, &err) != ZDP_OK)
                bench_die("backward", &err);
            if (managed && zdp_engine_step(eng, &err) != ZDP_OK) bench_die("step", &err);
        }
        if (!managed && zdp_engine_step(eng, &err) != ZDP_OK) bench_die("step", &err);
        double dt = bench_now() - t0;
        if (it >= warmup) {
            zdp_step_timing t;
            zdp_engine_step_timing(eng, &t);
            step_s[it - warmup] = dt;
            wait_s[it - warmup] = t.comm_wait_s;
            fwd += t.forward_s;
            bwd += t.backward_s;
            opt += t.optimizer_s;
        }
    }
    double share_sum = 0;
    for (int i = 0; i < steps; i++) share_sum += wait_s[i] / step_s[i];
    double step_med = bench_median(step_s, steps), wait_med = bench_median(wait_s, steps);

    long *all = bench_gather_rss(R, W); /* peak RSS, KiB, on rank 0 */
    /* The slowest rank decides the step time. */
    double step_max = 0, wait_of_max = 0;
    MPI_Allreduce(&step_med, &step_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double share = share_sum / steps, share_mean = 0;
    MPI_Allreduce(&share, &share_mean, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    share_mean /= W;
    MPI_Allreduce(&wait_med, &wait_of_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    zdp_memory_report m;
    zdp_engine_memory_report(eng, &m);
    if (R == 0) {
        printf("stage=%d overlap=%d managed=%d step_ms=%.1f comm_wait_ms=%.1f comm_share=%.3f "
               "fwd_ms=%.1f bwd_ms=%.1f opt_ms=%.1f engine_mib=%.1f rss_mib=",
               stage, overlap, managed, 1e3 * step_max, 1e3 * wait_of_max, share_mean,
               1e3 * fwd / steps, 1e3 * bwd / steps, 1e3 * opt / steps,
               (double)m.total_bytes / 1048576.0);
        for (int r = 0; r < W; r++) printf("%s%.1f", r ? "," : "", (double)all[r] / 1024.0);
        printf("\n");
        fflush(stdout);
    }
    free(all);
    free(step_s);
    free(wait_s);
    free(x);
    free(y);
    zdp_engine_destroy(eng);
    zdp_mlp_destroy(&model);
    zdp_dist_finalize();
    return 0;
}
