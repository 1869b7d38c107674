/*
 * llama_bench.c -- tokens/s and memory of zdp training a Llama-family model
 * (default: SmolLM2-135M's shape, random weights) on random tokens; one
 * configuration per run (bench/run_llama_bench.sh alternates it with the
 * PyTorch reference, bench/torch/llama_bench.py, and takes medians).
 *
 *   mpirun -np W llama_bench [--layers 30] [--hidden 576] [--heads 9]
 *       [--kv-heads 3] [--ffn 1536] [--vocab 49152] [--T 256] [--micro 4]
 *       [--stage 0] [--steps 3] [--warmup 1] [--ga 1]
 *
 * One optimizer step per micro-batch by default (G = 1); --ga G accumulates
 * G micro-batches per optimizer step as real training of such a model does
 * (unmanaged mode: G forward + backward(loss / G), then step(); the gradient
 * all-reduce, clipping, the optimizer and the zeroing are paid once per G
 * micro-batches).  A "step" below is one optimizer step (G micro-batches
 * per rank).  AdamW (lr 3e-4, betas 0.9 / 0.95, weight decay 0.1),
 * gradient clipping 1.0, tied embeddings, RMSNorm
 * eps 1e-5, rope_theta 100000 (SmolLM2's).  Prints one line on rank 0:
 *   RESULT {"impl": "zdp", ... "ms_per_step_median": ..., "tokens_per_s": ...}
 * with the step times, the CPU time per step (all ranks' threads; the
 * system part and the minor page faults on their own), the
 * losses, the model's parameter count and FLOPs per token, the engine's
 * memory report and every rank's peak RSS.  Not a test.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "zdp/zdp.h"

#include "bench_common.h"

#include "core/core.h" /* zdp_pool_size: the threads the kernels use */

int main(int argc, char **argv) {
    int layers = 30, hidden = 576, heads = 9, kv = 3, ffn = 1536, vocab = 49152, T = 256;
    int micro = 4, stage = 0, steps = 3, warmup = 1, ga = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int *dst = !strcmp(a, "--layers")     ? &layers
                   : !strcmp(a, "--hidden")   ? &hidden
                   : !strcmp(a, "--heads")    ? &heads
                   : !strcmp(a, "--kv-heads") ? &kv
                   : !strcmp(a, "--ffn")      ? &ffn
                   : !strcmp(a, "--vocab")    ? &vocab
                   : !strcmp(a, "--T")        ? &T
                   : !strcmp(a, "--micro")    ? &micro
                   : !strcmp(a, "--stage")    ? &stage
                   : !strcmp(a, "--steps")    ? &steps
                   : !strcmp(a, "--warmup")   ? &warmup
                   : !strcmp(a, "--ga")       ? &ga
                                              : NULL;
        if (dst == NULL || i + 1 >= argc) {
            fprintf(stderr, "llama_bench: unknown option or missing value: %s\n", a);
            return 2;
        }
        *dst = atoi(argv[++i]);
    }
    if (ga < 1) {
        fprintf(stderr, "llama_bench: --ga %d: the micro-batches per optimizer step must be >= 1\n",
                ga);
        return 2;
    }
    zdp_error err;
    if (zdp_dist_init(&argc, &argv, &err) != ZDP_OK) bench_die("init", &err);
    zdp_set_log(NULL, NULL);
    const int W = zdp_dist_world_size(), R = zdp_dist_rank();

    /* G = 1 keeps the managed default the earlier figures were taken with (one
     * backward, one step: the same calls either way); G > 1 is unmanaged
     * mode, the caller's own boundary. */
    char json[640];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d, "
             "\"managed_gradient_accumulation\": %s, "
             "\"steps_per_print\": 1000000, \"gradient_clipping\": 1.0, "
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4, "
             "\"betas\": [0.9, 0.95], \"eps\": 1e-8, \"weight_decay\": 0.1}}, "
             "\"zero_optimization\": {\"stage\": %d}}",
             micro, ga, ga > 1 ? "false" : "true", stage);
    zdp_config cfg;
    if (zdp_config_load_string(json, "<bench>", W, &cfg, &err) != ZDP_OK) bench_die("config", &err);
    zdp_llama_config lc = {.arch = ZDP_ARCH_LLAMA, .n_layer = layers, .hidden = hidden,
                           .n_head = heads, .n_kv_head = kv, .head_dim = hidden / heads,
                           .ffn = ffn, .vocab_size = vocab, .block_size = T,
                           .max_position_embeddings = T > 8192 ? T : 8192,
                           .rms_norm_eps = 1e-5f, .rope_theta = 100000.0,
                           .rope_type = ZDP_ROPE_DEFAULT, .tie_word_embeddings = 1,
                           .initializer_range = 0.02};
    zdp_model model;
    if (zdp_llama_create(&lc, micro, &model, &err) != ZDP_OK) bench_die("model", &err);
    zdp_engine *eng;
    if (zdp_engine_create(&cfg, &model, &eng, &err) != ZDP_OK) bench_die("engine", &err);
    float **views = malloc((size_t)model.n_params * sizeof *views);
    int64_t n_params = 0;
    for (int i = 0; i < model.n_params; i++) {
        views[i] = zdp_engine_param_data(eng, i);
        const zdp_param_info *p = &model.params[i];
        n_params += p->ndim == 2 ? p->shape[0] * p->shape[1] : p->shape[0];
    }
    zdp_llama_init_params(&model, views, 1);
    if (zdp_engine_sync_params(eng, &err) != ZDP_OK) bench_die("sync", &err);

    /* Random tokens, different per rank and step. */
    const int64_t N = (int64_t)micro * T;
    int32_t *inputs = malloc((size_t)N * sizeof(int32_t));
    int32_t *targets = malloc((size_t)N * sizeof(int32_t));
    unsigned s = 1234u + 7919u * (unsigned)R;
    double *step_s = calloc((size_t)(steps > 0 ? steps : 1), sizeof(double));
    double *fwd_s = calloc((size_t)(steps > 0 ? steps : 1), sizeof(double));
    double *bwd_s = calloc((size_t)(steps > 0 ? steps : 1), sizeof(double));
    double *opt_s = calloc((size_t)(steps > 0 ? steps : 1), sizeof(double));
    double *cpu_s = calloc((size_t)(steps > 0 ? steps : 1), sizeof(double));
    double *flt = calloc((size_t)(steps > 0 ? steps : 1), sizeof(double));
    double *sys_s = calloc((size_t)(steps > 0 ? steps : 1), sizeof(double));
    float loss_first = 0.0f, loss_last = 0.0f;
    for (int it = 0; it < warmup + steps; it++) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = bench_now(), c0 = bench_cpu_s(), f0 = bench_minflt(),
                     s0 = bench_sys_s();
        /* The window's loss: the mean of its G micro-batches' losses.  The
         * tokens are drawn inside the timed region (rand_r over 2 x 1024
         * ints: microseconds against seconds of compute). */
        float loss = 0.0f;
        for (int g = 0; g < ga; g++) {
            for (int64_t i = 0; i < N; i++) {
                inputs[i] = (int32_t)(rand_r(&s) % (unsigned)vocab);
                targets[i] = (int32_t)(rand_r(&s) % (unsigned)vocab);
            }
            zdp_lm_batch batch = {.inputs = inputs, .targets = targets, .B = micro, .T = T};
            float l;
            if (zdp_engine_forward(eng, &batch, &l, &err) != ZDP_OK) bench_die("forward", &err);
            /* scale_wrt_gas: loss / G, the mean over the window. */
            if (zdp_engine_backward(eng, 1, 1.0f, &err) != ZDP_OK) bench_die("backward", &err);
            loss += l / (float)ga;
        }
        if (zdp_engine_step(eng, &err) != ZDP_OK) bench_die("step", &err);
        const double dt = bench_now() - t0, dc = bench_cpu_s() - c0;
        const double df = bench_minflt() - f0, ds = bench_sys_s() - s0;
        if (it >= warmup) {
            flt[it - warmup] = df;
            sys_s[it - warmup] = ds;
            step_s[it - warmup] = dt;
            cpu_s[it - warmup] = dc;
            zdp_step_timing tm;
            zdp_engine_step_timing(eng, &tm);
            fwd_s[it - warmup] = tm.forward_s;
            bwd_s[it - warmup] = tm.backward_s;
            opt_s[it - warmup] = tm.optimizer_s;
            if (it == warmup) loss_first = loss;
            loss_last = loss;
        }
    }
    /* The slowest rank's median decides the step time. */
    double med = bench_median(step_s, steps), fwd = bench_median(fwd_s, steps);
    double bwd = bench_median(bwd_s, steps), opt = bench_median(opt_s, steps);
    double med_max = 0.0;
    MPI_Allreduce(&med, &med_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    /* CPU seconds per step: each rank's median, summed over the ranks. */
    double cpu = bench_median(cpu_s, steps), cpu_sum = 0.0;
    MPI_Allreduce(&cpu, &cpu_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    /* Page faults and system CPU per step, the same way. */
    double fl = bench_median(flt, steps), fl_sum = 0.0;
    MPI_Allreduce(&fl, &fl_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double sy = bench_median(sys_s, steps), sy_sum = 0.0;
    MPI_Allreduce(&sy, &sy_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    long *all = bench_gather_rss(R, W);
    zdp_memory_report m;
    zdp_engine_memory_report(eng, &m);
    if (R == 0) {
        /* 6 N per token for the matmul weights (the tied lm_head counted
         * once as a matmul; the embedding lookup and RMSNorm weights are
         * not matmuls but are under 0.1% here) plus causal attention over
         * the full T x T square, forward and backward: 12 L T hd NH. */
        const double attn = 12.0 * layers * (double)T * (double)(hidden / heads) * heads;
        const double matmul_params = (double)n_params - (double)layers * 2 * hidden - hidden;
        const double fpt = 6.0 * matmul_params + attn;
        printf("RESULT {\"impl\": \"zdp\", \"world_size\": %d, \"threads\": %d, \"stage\": %d, "
               "\"micro_batch\": %d, \"ga\": %d, \"T\": %d, \"n_params\": %lld, \"flops_per_token\": %.6g, "
               "\"steps\": %d, \"warmup\": %d, \"ms_per_step_median\": %.1f, "
               "\"cpu_ms_per_step\": %.1f, \"sys_ms_per_step\": %.1f, "
               "\"minflt_per_step\": %.0f, "
               "\"tokens_per_s\": %.1f, \"forward_ms\": %.1f, \"backward_ms\": %.1f, "
               "\"optimizer_ms\": %.1f, \"loss_first\": %.6f, \"loss_last\": %.6f, "
               "\"mem_mib\": {\"params\": %.1f, \"grads\": %.1f, \"grad_partition\": %.1f, "
               "\"buckets\": %.1f, \"optimizer\": %.1f, \"other\": %.1f, \"engine_total\": %.1f, "
               "\"activations\": %.1f}, \"peak_rss_mib\": [",
               W, zdp_pool_size(), stage, micro, ga, T, (long long)n_params, fpt, steps,
               warmup, 1e3 * med_max, 1e3 * cpu_sum, 1e3 * sy_sum, fl_sum, (double)W * (double)N * ga / med_max, 1e3 * fwd, 1e3 * bwd, 1e3 * opt, loss_first, loss_last,
               m.params_bytes / 1048576.0, m.grads_bytes / 1048576.0,
               m.grad_partition_bytes / 1048576.0, m.bucket_bytes / 1048576.0,
               m.optimizer_bytes / 1048576.0, m.other_bytes / 1048576.0,
               m.total_bytes / 1048576.0, m.activation_bytes / 1048576.0);
        for (int r = 0; r < W; r++) printf("%s%.1f", r ? ", " : "", (double)all[r] / 1024.0);
        printf("]}\n");
        fflush(stdout);
    }
    free(all);
    free(step_s);
    free(fwd_s);
    free(bwd_s);
    free(opt_s);
    free(cpu_s);
    free(flt);
    free(sys_s);
    free(inputs);
    free(targets);
    free(views);
    zdp_engine_destroy(eng);
    zdp_llama_destroy(&model);
    zdp_dist_finalize();
    return 0;
}
