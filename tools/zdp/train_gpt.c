/*
 * train_gpt.c -- `zdp train --model gpt`: a GPT-2 family model trained on
 * text, token shards or zdp's own arithmetic corpus.
 *
 *   mpirun -np W zdp train --model gpt --n-layer L --n-head H --n-embd C
 *       --vocab-size V --block-size T --config CFG.json [--init INIT.safetensors]
 *       [--data FILE] [--data-format auto|llmc|bytes] [--data-order sequential]
 *       [--steps S] [--schedule n1,...]
 *       [--save-weights OUT.safetensors] [--val-every N] [--val-batches K]
 *       [--val-fraction F] [--out-dir DIR] [--seed N]
 *
 * Contract (stable; see docs/training.md): INIT/OUT use GPT2LMHeadModel
 * names and layouts; --data is an llm.c token shard or any file read as
 * bytes (--data-format; auto refuses a file that looks like a damaged
 * shard rather than read it as bytes); with --data-order sequential (the only order), window w is tokens
 * [w*T, w*T+T] and rank r's j-th micro-batch holds windows (j*W + r)*b + k;
 * managed and unmanaged stepping and the printed lines are the MLP's.
 *
 * Output: on rank 0 one line per optimizer step ("step N | loss X |
 * global_samples M | grad_norm G | lr ... | tok/s ... | ms/step ..."), or
 * with --progress on a progress line rewritten in place (step, loss, lr,
 * tokens/s, ms/step, ETA) and a plain line every steps_per_print steps.  Val loss every --val-every steps.  DIR/metrics.csv
 * (DeepSpeed's monitor keys) and DIR/loss.svg.  At the end a sample, and for
 * the arithmetic corpus the accuracy of greedy answers on held-out problems.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "report.h"
#include "sample.h"
#include "zdp/zdp.h"

typedef struct gpt_opts {
    zdp_gpt_config model;
    const char *config, *init, *data, *save_weights, *out_dir;
    int64_t steps, val_every, val_batches, arith_lines, max_skipped;
    double val_fraction; /* < 0: the default for the data kind */
    int progress;        /* -1 auto, 0 plain lines, 1 progress line */
    int memory_report;   /* --memory-report on: every rank's memory after the first step */
    int data_format;     /* a zdp_token_format (--data-format): ZDP_TOKENS_AUTO by default */
    cli_ckpt ckpt;
    uint64_t seed;
    cli_schedule schedule;
} gpt_opts;

static void usage_(void) {
    printf("usage: mpirun -np W zdp train --model gpt --config CFG.json [options]\n"
           "\n"
           "model (defaults: the demo model on the arithmetic corpus):\n"
           "  --n-layer L (4)  --n-head H (4)  --n-embd C (128)  --vocab-size V (256)\n"
           "  --block-size T (64)\n"
           "data:\n"
           "  --data FILE               an llm.c token shard (magic 20240520) or any file,\n"
           "                            read as bytes (vocab 256); default: zdp's generated\n"
           "                            arithmetic corpus (lines \"a+b=c\")\n"
           "  --data-format auto|llmc|bytes   how --data is read (auto): llmc = a token\n"
           "                            shard; bytes = one token per byte; auto = a shard if\n"
           "                            it starts with the magic, an error if it looks like a\n"
           "                            damaged shard (a .bin name, or a shard's header with\n"
           "                            a damaged magic), bytes otherwise\n"
           "  --data-order sequential   the only order (window w = tokens [wT, wT+T])\n"
           "  --val-fraction F          tokens at the end kept for val loss (default 0.1;\n"
           "                            0 for token shards, whose val data is another file)\n"
           "training:\n"
           "  --steps S (200)  --schedule n1,n2,... (unmanaged)  --seed N (42)\n"
           "  --max-skipped-steps K (100) stop with an error after K skipped steps in a row\n"
           "                            (NaN/Inf gradient or update; 0 = never)\n"
           "  --memory-report on|off     every rank's memory by category after the first step\n"
           "  --init FILE                GPT2LMHeadModel safetensors or llm.c .bin weights\n"
           "  --save-weights FILE        GPT2LMHeadModel safetensors (rank 0)\n"
           "  --val-every N (50)  --val-batches K (8, per rank)\n"
           "  --out-dir DIR (zdp-out)    metrics.csv and loss.svg\n"
           "  --save-dir DIR --save-every K   checkpoints DIR/global_step{N}/, DIR/latest\n"
           "  --resume DIR              continue from DIR/latest (--steps counts all steps)\n"
           "  --progress on|off|auto     a progress line rewritten in place (on), or one plain\n"
           "                            line per step (off).  auto: on when stdout is a\n"
           "                            terminal and zdp was not started by mpirun (Open MPI\n"
           "                            gives every rank a pseudo-terminal, so under mpirun\n"
           "                            zdp cannot tell; say on)\n");
}

static int parse_(int argc, char **argv, gpt_opts *o) {
    *o = (gpt_opts){.model = CLI_GPT_DEFAULT,
                    .steps = 200, .val_every = 50, .val_batches = 8, .arith_lines = CLI_ARITH_LINES,
                    .val_fraction = -1, .seed = 42, .out_dir = "zdp-out", .progress = -1,
                    .data_format = ZDP_TOKENS_AUTO, .max_skipped = CLI_MAX_SKIPPED_DEFAULT};
    static const char *const formats[] = {"auto", "llmc", "bytes", NULL};
    static const int format_values[] = {ZDP_TOKENS_AUTO, ZDP_TOKENS_SHARD, ZDP_TOKENS_BYTES};
    static const char *const orders[] = {"sequential", NULL};
    static const char *const progress[] = {"on", "off", "auto", NULL};
    static const int progress_values[] = {1, 0, -1};
    const cli_opt opts[] = {
        CLI_CKPT_ROWS(&o->ckpt),
        CLI_GPT_ROWS(&o->model),
        CLI_IGNORE("--model"), /* main() dispatched on it */
        CLI_STR("--config", &o->config),
        CLI_STR("--init", &o->init),
        CLI_STR("--data", &o->data),
        CLI_CHOICE("--data-format", &o->data_format, formats, format_values,
                   "auto, llmc (an llm.c token shard) or bytes (one token per byte)"),
        CLI_STR("--save-weights", &o->save_weights),
        CLI_STR("--out-dir", &o->out_dir),
        CLI_CHOICE("--data-order", NULL, orders, NULL,
                   "only \"sequential\" exists (window w = tokens [w*T, w*T+T], rank r's j-th "
                   "micro-batch = windows (j*W+r)*b+k)"),
        CLI_SCHEDULE("--schedule", &o->schedule),
        CLI_I64("--steps", &o->steps, 0, INT64_MAX / 4, "need an integer >= 0"),
        CLI_I64("--val-every", &o->val_every, 0, INT64_MAX / 4, "need an integer >= 0 (0: never)"),
        CLI_I64("--val-batches", &o->val_batches, 1, 1 << 20, "need an integer >= 1"),
        CLI_F64("--val-fraction", &o->val_fraction, 0.0, 0.5, "need a number in [0, 0.5]"),
        CLI_U64("--seed", &o->seed, 0, INT64_MAX, "need an integer >= 0"),
        CLI_MAX_SKIPPED_ROW(&o->max_skipped),
        CLI_CHOICE("--progress", &o->progress, progress, progress_values, "on, off or auto"),
        CLI_MEMORY_REPORT_ROW(&o->memory_report),
    };
    static const cli_command cmd = {
        .missing = "expected an option with a value (see zdp train --model gpt --help)",
        .unknown = " (see zdp train --model gpt --help)", .dashes = true};
    int rc = cli_parse_options(&cmd, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv);
    if (rc == 1 && zdp_dist_rank() == 0) usage_();
    if (rc != 0) return rc;
    if (o->config == NULL) return cli_fail("--config CFG.json is required");
    return 0;
}

typedef struct run_state {
    zdp_config cfg;
    zdp_engine *eng;
    zdp_model model;
    zdp_dataset *ds;
    bool arith;           /* the generated arithmetic corpus (no --data) */
    zdp_token_format fmt; /* how the data is read */
    int32_t *inputs, *targets; /* (b, T) */
    int W, R;
    int b, T;
    /* Rank 0's reporting. */
    bool tty; /* the progress line instead of one line per step */
    metrics_log log;
    char csv_path[4096], svg_path[4096];
    double t_start;     /* when the loop started, for the ETA */
    int64_t first_step; /* the step it started at (resumed runs: > 0) */
    float **views;      /* whole tensors: the start-up's to push, the end's gathered */
} run_state;

/* Mean val loss over val_batches micro-batches per rank, all ranks. */
static double val_loss_(run_state *st, int64_t val_batches) {
    if (zdp_dataset_n_windows(st->ds, ZDP_SPLIT_VAL, st->T) == 0) return NAN;
    zdp_error err;
    double sum = 0;
    for (int64_t j = 0; j < val_batches; j++) {
        if (zdp_dataset_batch(st->ds, ZDP_SPLIT_VAL, j, st->R, st->W, st->b, st->T, st->inputs,
                              st->targets, &err) != ZDP_OK)
            cli_die("val batch", &err);
        zdp_lm_batch batch = {.inputs = st->inputs, .targets = st->targets, .B = st->b, .T = st->T};
        float loss;
        if (zdp_engine_forward(st->eng, &batch, &loss, &err) != ZDP_OK) cli_die("val forward", &err);
        sum += loss;
    }
    return zdp_dist_mean(sum / (double)val_batches);
}

/* The data, checked against the model's vocabulary and block size: the
 * generated arithmetic corpus without --data.  0 or cli_fail's code. */
static int open_data_(const gpt_opts *o, run_state *st) {
    zdp_error err;
    st->fmt = st->arith ? ZDP_TOKENS_BYTES : (zdp_token_format)o->data_format;
    if (st->fmt == ZDP_TOKENS_AUTO && zdp_tokens_detect(o->data, &st->fmt, &err) != ZDP_OK)
        return cli_fail("--data: %s", err.msg);
    double vf = o->val_fraction >= 0 ? o->val_fraction : (st->fmt == ZDP_TOKENS_SHARD ? 0.0 : 0.1);
    zdp_status s = st->arith ? zdp_dataset_create_arith(o->seed, o->arith_lines,
                                                        CLI_ARITH_MAX_OPERAND, vf, &st->ds, &err)
                             : zdp_dataset_open(o->data, st->fmt, vf, &st->ds, &err);
    if (s != ZDP_OK) return cli_fail("--data: %s", err.msg);
    if (zdp_dataset_max_token(st->ds) >= o->model.vocab_size)
        return cli_fail("--data %s: token %d is outside the vocabulary (--vocab-size %d); fix: "
                        "raise --vocab-size%s", st->arith ? "(generated)" : o->data,
                        zdp_dataset_max_token(st->ds), o->model.vocab_size,
                        st->fmt == ZDP_TOKENS_BYTES ? " to 256 for byte-level text" : "");
    if (zdp_dataset_n_windows(st->ds, ZDP_SPLIT_TRAIN, st->T) == 0)
        return cli_fail("--data %s: the train split has %lld tokens, fewer than --block-size + 1 "
                        "= %d; fix: more data or a smaller --block-size",
                        st->arith ? "(generated)" : o->data,
                        (long long)zdp_dataset_n_tokens(st->ds, ZDP_SPLIT_TRAIN), st->T + 1);
    return 0;
}

/* The engine's parameters: --init's weights, or a fresh initialisation. */
static int init_params_(gpt_opts *o, run_state *st) {
    /* Filled here, pushed into the engine after the start-up agreement. */
    float **views = st->views = cli_params_views(st->eng, &st->model, false);
    if (views == NULL) return 1;
    int rc = 0;
    if (o->init != NULL) {
        zdp_error err;
        if (zdp_gpt_weights_load(o->init, &o->model, st->model.params, st->model.n_params,
                                 views, &err) != ZDP_OK)
            rc = cli_fail("--init %s", err.msg);
    } else {
        zdp_gpt_init_params(&st->model, views, o->seed);
    }
    return rc;
}

/* Everything that can fail on one rank alone (its own copy of the config,
 * the data or the weights, on nodes without a shared file system): each
 * step runs only while this rank is fine.  0 or cli_fail's code; the caller
 * agrees before the first collective. */
static int startup_(gpt_opts *o, run_state *st, int rc) {
    zdp_error err;
    if (rc == 0 && zdp_config_load_file(o->config, st->W, &st->cfg, &err) != ZDP_OK)
        rc = cli_fail("%s", err.msg);
    if (rc == 0 && o->schedule.len > 0 && st->cfg.managed_gradient_accumulation)
        rc = cli_fail("--schedule needs unmanaged accumulation: set "
                      "\"managed_gradient_accumulation\": false in %s, or drop --schedule",
                      o->config);
    if (rc == 0 && st->cfg.micro_batch_size > 4096)
        rc = cli_fail("train_micro_batch_size_per_gpu = %lld: the GPT trainer takes at most "
                      "4096 sequences per micro-batch", (long long)st->cfg.micro_batch_size);
    st->b = rc == 0 ? (int)st->cfg.micro_batch_size : 0;
    st->T = o->model.block_size;
    /* Data first: its vocabulary must fit the model. */
    st->arith = o->data == NULL;
    if (rc == 0) rc = open_data_(o, st);
    if (rc == 0 && zdp_gpt_create(&o->model, st->b, &st->model, &err) != ZDP_OK)
        rc = cli_fail("%s", err.msg);
    if (rc == 0 && zdp_engine_create(&st->cfg, &st->model, &st->eng, &err) != ZDP_OK)
        rc = cli_fail("%s", err.msg);
    if (rc == 0) rc = init_params_(o, st);
    if (rc == 0) rc = cli_ckpt_prepare(&o->ckpt);
    if (rc == 0 && o->save_weights != NULL && st->R == 0) /* only rank 0 writes it */
        rc = cli_check_output("--save-weights", o->save_weights, false);
    return rc;
}

/* Rank 0: metrics.csv's row and the step's line (or the progress line). */
static void report_step_(const gpt_opts *o, run_state *st, int64_t step, int64_t n,
                         double mean_loss, double dt, double val) {
    const int64_t gstep = zdp_engine_global_steps(st->eng);
    const double tokens = (double)n * st->b * st->T * st->W;
    zdp_step_timing t;
    zdp_engine_step_timing(st->eng, &t);
    metrics_row row = {.step = gstep, .samples = zdp_engine_global_samples(st->eng),
                       .tokens = zdp_engine_global_samples(st->eng) * st->T,
                       .train_loss = mean_loss, .val_loss = val, .lr = zdp_engine_last_lr(st->eng),
                       .grad_norm = zdp_engine_last_grad_norm(st->eng),
                       .tokens_per_s = tokens / dt, .skipped = !zdp_engine_was_step_applied(st->eng),
                       .fwd_ms = 1e3 * t.forward_s, .bwd_ms = 1e3 * t.backward_s,
                       .comm_wait_ms = 1e3 * t.comm_wait_s, .opt_ms = 1e3 * t.optimizer_s,
                       .step_ms = 1e3 * dt};
    metrics_add(&st->log, &row);
    char eta[32];
    cli_format_eta((cli_now() - st->t_start) / (double)(step + 1 - st->first_step) *
                       (double)(o->steps - step - 1), eta, sizeof eta);
    char line[512];
    int len = snprintf(line, sizeof line,
                       "step %lld | loss %.6f | global_samples %lld | grad_norm %.4f | lr %.3e "
                       "| tok/s %.0f | ms/step %.1f",
                       (long long)gstep, mean_loss, (long long)row.samples, row.grad_norm,
                       row.lr, row.tokens_per_s, row.step_ms);
    if (!isnan(val)) len += snprintf(line + len, sizeof line - (size_t)len, " | val_loss %.4f", val);
    if (row.skipped)
        snprintf(line + len, sizeof line - (size_t)len, " | SKIPPED: non-finite gradient or update");
    if (!st->tty) {
        printf("%s\n", line);
    } else {
        bool plain = st->cfg.steps_per_print > 0 && gstep % st->cfg.steps_per_print == 0;
        if (plain || !isnan(val) || row.skipped)
            printf("\r\033[K%s\n", line);
        printf("\r\033[Kstep %lld/%lld | loss %.4f | lr %.2e | %.0f tok/s | %.0f ms/step | ETA %s",
               (long long)gstep, (long long)o->steps, mean_loss, row.lr, row.tokens_per_s,
               row.step_ms, eta);
    }
    fflush(stdout);
}

/* One optimizer step's micro-batches, from window *cursor on; the mean
 * loss over all ranks.  Failures end the job. */
static double train_step_(run_state *st, int64_t n, int64_t *cursor) {
    const bool managed = st->cfg.managed_gradient_accumulation;
    zdp_error err;
    double loss_sum = 0;
    for (int64_t k = 0; k < n; k++, *cursor += (int64_t)st->W * st->b) {
        /* Rank r's j-th micro-batch of the step: windows cursor + (j*W + r)*b + k. */
        if (zdp_dataset_windows(st->ds, ZDP_SPLIT_TRAIN, *cursor + (int64_t)st->R * st->b, st->b,
                                st->T, st->inputs, st->targets, &err) != ZDP_OK)
            cli_die("data", &err);
        zdp_lm_batch batch = {.inputs = st->inputs, .targets = st->targets, .B = st->b, .T = st->T};
        float loss;
        if (zdp_engine_forward(st->eng, &batch, &loss, &err) != ZDP_OK) cli_die("forward", &err);
        loss_sum += loss;
        zdp_status bs = managed ? zdp_engine_backward(st->eng, true, 1.0f, &err)
                                : zdp_engine_backward(st->eng, false, 1.0f / (float)n, &err);
        if (bs != ZDP_OK) cli_die("backward", &err);
        if (managed && zdp_engine_step(st->eng, &err) != ZDP_OK) cli_die("step", &err);
    }
    if (!managed && zdp_engine_step(st->eng, &err) != ZDP_OK) cli_die("step", &err);
    return zdp_dist_mean(loss_sum / (double)n);
}

/* The steps from the engine's (resumed) step to --steps: 0, or 1 when the
 * skipped-step guard stopped the run (on every rank alike). */
static int train_loop_(const gpt_opts *o, run_state *st, int64_t cursor) {
    const bool managed = st->cfg.managed_gradient_accumulation;
    const int64_t G = st->cfg.gradient_accumulation_steps;
    st->t_start = cli_now();
    st->first_step = zdp_engine_global_steps(st->eng);
    int64_t skipped_run = 0;
    int rc = 0;
    for (int64_t step = st->first_step; step < o->steps && rc == 0; step++) {
        const int64_t n = cli_window(&o->schedule, managed, G, step);
        const double t0 = cli_now();
        const double mean_loss = train_step_(st, n, &cursor);
        const double dt = cli_now() - t0;
        if (o->memory_report && step == st->first_step && (rc = cli_memory_report(st->eng)) != 0)
            break;
        const int64_t gstep = zdp_engine_global_steps(st->eng);
        double val = NAN;
        if (o->val_every > 0 && (gstep % o->val_every == 0 || step + 1 == o->steps))
            val = val_loss_(st, o->val_batches);
        /* Every rank sees the same skipped steps, so every rank stops here. */
        if (cli_skip_guard(st->eng, o->max_skipped, &skipped_run)) rc = 1;
        else cli_ckpt_after_step(st->eng, &o->ckpt, cursor, step + 1 == o->steps);
        if (st->R == 0) report_step_(o, st, step, n, mean_loss, dt, val);
    }
    if (st->R == 0 && st->tty) printf("\n");
    return rc;
}

/* Rank 0, after training: the loss curve, and what the model learned, in
 * words (a sample; for the arithmetic corpus, held-out accuracy). */
static void report_end_(const gpt_opts *o, run_state *st) {
    char title[160];
    snprintf(title, sizeof title, "zdp gpt L=%d C=%d T=%d, %d rank(s), ZeRO-%d", o->model.n_layer,
             o->model.n_embd, st->T, st->W, st->cfg.zero.stage);
    if (st->log.n > 0 && metrics_plot_svg(&st->log, st->svg_path, title) == 0)
        printf("metrics: %s, loss curve: %s\n", st->csv_path, st->svg_path);
    metrics_close(&st->log);
    float **views = st->views;
    if (views != NULL) {
        if (st->arith)
            sample_arith_report(&st->model, (const float *const *)views, st->ds, 200);
        else if (o->model.vocab_size == 256)
            sample_print(&st->model, (const float *const *)views, "\n", 200, 0.8, 40, o->seed);
    }
    fflush(stdout);
}

/* COLLECTIVE.  --save-weights, written by rank 0: 0, or 1 on every rank
 * when it failed. */
static int save_weights_(const gpt_opts *o, run_state *st) {
    int mine = 0;
    if (st->R == 0) {
        zdp_error err;
        float **views = st->views;
        if (views == NULL) mine = 1;
        if (views != NULL &&
            zdp_gpt_weights_save_model(o->save_weights, &st->model, (const float *const *)views,
                                       &err) != ZDP_OK) {
            fprintf(stderr, "zdp: error: --save-weights %s\n", err.msg);
            mine = 1;
        }
    }
    return zdp_dist_all_ok(mine == 0) ? 0 : 1;
}

int cmd_train_gpt(int argc, char **argv) {
    gpt_opts o;
    int rc = parse_(argc, argv, &o);
    if (rc == 1) return 0; /* --help */

    /* Start-up: all ranks meet at cli_agree before the first collective:
     * rank 0 then prints what failed on which rank, and nobody waits for a
     * rank that gave up. */
    zdp_error err;
    run_state st = {.W = zdp_dist_world_size(), .R = zdp_dist_rank()};
    rc = startup_(&o, &st, rc);
    if ((rc = cli_agree(rc)) != 0) goto done;
    if (cli_params_push(st.eng, &st.model, st.views) != 0) cli_die("sync params", &err);
    cli_params_free(st.eng, st.views);
    st.views = NULL;
    /* Windows consumed so far, over all ranks (the checkpoint's data position). */
    int64_t cursor = 0;
    if ((rc = cli_ckpt_resume(st.eng, &o.ckpt, &cursor)) != 0) goto done;
    st.inputs = malloc((size_t)st.b * (size_t)st.T * sizeof(int32_t));
    st.targets = malloc((size_t)st.b * (size_t)st.T * sizeof(int32_t));
    if (st.inputs == NULL || st.targets == NULL) cli_die("micro-batch buffers", &(zdp_error){.msg = "out of memory"});

    const bool managed = st.cfg.managed_gradient_accumulation;
    st.tty = o.progress == 1 ||
             (o.progress == -1 && isatty(STDOUT_FILENO) &&
              getenv("OMPI_COMM_WORLD_SIZE") == NULL && getenv("PMI_SIZE") == NULL);
    snprintf(st.csv_path, sizeof st.csv_path, "%s/metrics.csv", o.out_dir);
    snprintf(st.svg_path, sizeof st.svg_path, "%s/loss.svg", o.out_dir);
    if (st.R == 0) {
        if (metrics_open(&st.log, st.csv_path) != 0)
            fprintf(stderr, "zdp: warning: cannot write %s (%s); metrics go only to stdout\n",
                    st.csv_path, strerror(errno));
        printf("zdp train: gpt L=%d H=%d C=%d V=%d T=%d | %d rank(s) | ZeRO stage %d | %s "
               "accumulation | B %lld = b %d x G %lld x W %d | data %s: %lld train tokens, %lld val\n",
               o.model.n_layer, o.model.n_head, o.model.n_embd, o.model.vocab_size, st.T, st.W,
               st.cfg.zero.stage, managed ? "managed" : "unmanaged",
               (long long)st.cfg.train_batch_size, st.b,
               (long long)st.cfg.gradient_accumulation_steps, st.W,
               st.arith ? "arithmetic corpus" : o.data,
               (long long)zdp_dataset_n_tokens(st.ds, ZDP_SPLIT_TRAIN),
               (long long)zdp_dataset_n_tokens(st.ds, ZDP_SPLIT_VAL));
        fflush(stdout);
    }

    if ((rc = train_loop_(&o, &st, cursor)) != 0) goto done;
    /* The whole model for the report and --save-weights (at stage 3 every
     * rank takes part in gathering it). */
    if ((st.views = cli_params_views(st.eng, &st.model, true)) == NULL) {
        rc = 1;
        goto done;
    }
    if (st.R == 0) report_end_(&o, &st);
    if (o.save_weights != NULL) rc = save_weights_(&o, &st);
done:
    free(st.inputs);
    free(st.targets);
    if (st.eng != NULL) cli_params_free(st.eng, st.views);
    zdp_engine_destroy(st.eng);
    zdp_gpt_destroy(&st.model);
    zdp_dataset_destroy(st.ds);
    return rc;
}
