/*
 * main.c -- the `zdp` command.  The only code in the project that may exit().
 *
 *   mpirun -np W zdp train --model mlp --hidden H --layers L --config CFG.json
 *       [--init INIT.safetensors] [--data DATA.safetensors] [--steps S]
 *       [--schedule n1,n2,...] [--save-weights OUT.safetensors]
 *       [--seed N] [--samples N]
 *   zdp gen-data --hidden H [--samples N] [--seed N] --out DATA.safetensors
 *
 * Contract (stable; outside checks drive zdp through it):
 *   - INIT and OUT hold linears.{i}.weight F32 [H,H] and linears.{i}.bias F32 [H].
 *   - DATA holds x F32 [N,H] and y I64 (or I32) [N].  Without --data, a
 *     seeded teacher-labelled dataset of --samples rows is generated.
 *   - Rank r's j-th micro-batch (j counts from 0 across all steps) is rows
 *     ((j*W + r)*b + k) mod N, k < b.
 *   - Managed: S steps of G micro-batches, each forward / backward / step.
 *   - Unmanaged: step s makes n = schedule[s mod len] micro-batches (default
 *     G), each backward with loss scale 1/n and scale_wrt_gas off, then step.
 *   - Rank 0 prints one line per optimizer step: step, mean loss, global_samples.
 *   - Bad input exits non-zero with one message, printed by rank 0, never a
 *     hang; when the input is bad on some ranks only (their own files or
 *     working directory), the message names those ranks.
 */
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "sample_cli.h"
#include "zdp/zdp.h"

int cmd_train_lm(int argc, char **argv); /* train_lm.c */
int cmd_serve(int argc, char **argv);     /* serve.c */
int cmd_tokenize(int argc, char **argv);  /* tokenize.c */
int cmd_init_model(int argc, char **argv); /* init_model.c */
int cmd_lora(int argc, char **argv);       /* lora_cmd.c */

/* ---- options ---------------------------------------------------------------- */

typedef struct train_opts {
    const char *model, *config, *init, *data, *save_weights;
    int hidden, layers;
    int64_t steps, samples, max_skipped;
    int memory_report; /* --memory-report on: every rank's memory after the first step */
    uint64_t seed;
    cli_schedule schedule;
    cli_ckpt ckpt;
} train_opts;

/* `zdp --help`: one line per command, as git does; each command has its own
 * --help. */
static const struct {
    const char *name, *what;
} commands_[] = {
    {"train", "train the MLP, a GPT or a model folder on W ranks with ZeRO 0-3 (--model mlp|gpt, --model-dir DIR)"},
    {"sample", "generate text from GPT-2 weights or a model folder (--model-dir, --adapter)"},
    {"serve", "a training server: forward_backward / optim_step over HTTP"},
    {"gen-data", "write the MLP dataset or the arithmetic corpus to a file"},
    {"init-model", "write a randomly initialised Llama/Qwen3 model as a Hugging Face folder"},
    {"ckpt", "describe a checkpoint, or export its full fp32 weights"},
    {"lora", "merge a PEFT LoRA adapter folder into its base model folder (lora merge)"},
    {"tokenize", "text -> token ids, or ids -> text (--decode), with a model folder's tokenizer"},
};

static void usage_commands_(FILE *f) {
    fprintf(f, "usage: zdp <command> [options]       (on W ranks: mpirun -np W zdp ...)\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof commands_ / sizeof commands_[0]; i++)
        fprintf(f, "   %-10s %s\n", commands_[i].name, commands_[i].what);
    fprintf(f, "\n'zdp <command> --help' lists a command's options (the GPT trainer's:\n"
               "'zdp train --model gpt --help'); 'zdp --version' prints the version.\n");
}

static void usage_train_(void) {
    printf("usage: mpirun -np W zdp train --model mlp --config CFG.json [options]\n"
           "\n"
           "  --model mlp               DeepSpeed's SimpleModel\n"
           "                            (--model gpt: see zdp train --model gpt --help)\n"
           "  --hidden H                hidden size = number of classes (default 64)\n"
           "  --layers L                number of Linear(H,H) layers (default 4)\n"
           "  --config CFG.json         DeepSpeed ds_config (required)\n"
           "  --init INIT.safetensors   initial weights (default: seeded initialiser)\n"
           "  --data DATA.safetensors   x F32 [N,H], y I64|I32 [N] (default: generated)\n"
           "  --samples N               rows of generated data (default 4096)\n"
           "  --steps S                 optimizer steps (default 20)\n"
           "  --schedule n1,n2,...      unmanaged mode: micro-batches per step, cycled\n"
           "  --save-weights OUT        write the final weights (rank 0)\n"
           "  --seed N                  seed for weights and generated data (default 42)\n"
           "  --max-skipped-steps K     stop with an error after K skipped steps in a row\n"
           "                            (NaN/Inf gradient or update; default 100, 0 = never)\n"
           "  --memory-report on|off    every rank's memory by category after the first step\n"
           "  --save-dir DIR            write checkpoints DIR/global_step{N}/ and DIR/latest\n"
           "  --save-every K            ... every K optimizer steps (and after the last)\n"
           "  --resume DIR              continue from DIR/latest (--steps counts all steps)\n");
}

static void usage_gen_data_(void) {
    printf("usage: zdp gen-data --hidden H --out DATA.safetensors [--samples N] [--seed N]\n"
           "  writes the generated MLP dataset (x F32 [N,H], y I64 [N]) that train uses\n"
           "  when --data is not given\n"
           "       zdp gen-data --corpus arith --out TOKENS.bin [--lines N] [--seed N]\n"
           "  writes the GPT trainer's arithmetic corpus (\"a+b=c\\n\" lines, bytes) as an\n"
           "  llm.c token shard\n");
}

static void usage_ckpt_(void) {
    printf("usage: zdp ckpt inspect DIR [--tag T]      what a checkpoint holds, in words\n"
           "       zdp ckpt export DIR --to OUT.safetensors [--tag T]   its full fp32 weights\n"
           "  DIR is a --save-dir; the tag defaults to the one DIR/latest names\n");
}

static bool is_help_(const char *a) { return strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0; }

static int parse_train_args_(int argc, char **argv, train_opts *o) {
    *o = (train_opts){.hidden = 64, .layers = 4, .steps = 20, .samples = 4096, .seed = 42,
                      .max_skipped = CLI_MAX_SKIPPED_DEFAULT};
    const cli_opt opts[] = {
        CLI_CKPT_ROWS(&o->ckpt),
        CLI_STR("--model", &o->model),
        CLI_STR("--config", &o->config),
        CLI_STR("--init", &o->init),
        CLI_STR("--data", &o->data),
        CLI_STR("--save-weights", &o->save_weights),
        CLI_MAX_SKIPPED_ROW(&o->max_skipped),
        CLI_MEMORY_REPORT_ROW(&o->memory_report),
        CLI_SCHEDULE("--schedule", &o->schedule),
        CLI_INT("--hidden", &o->hidden, 1, 65536, "need an integer in 1..65536"),
        CLI_INT("--layers", &o->layers, 1, 1024, "need an integer in 1..1024"),
        CLI_I64("--steps", &o->steps, 0, INT64_MAX / 2, "need an integer >= 0"),
        CLI_I64("--samples", &o->samples, 1, (int64_t)1 << 26, "need an integer in 1..67108864"),
        CLI_U64("--seed", &o->seed, 0, INT64_MAX, "need an integer >= 0"),
    };
    static const cli_command cmd = {
        .missing = "expected an option with a value (see zdp train --help)",
        .unknown = " (see zdp train --help)", .dashes = true};
    int rc = cli_parse_options(&cmd, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv);
    if (rc == 1 && zdp_dist_rank() == 0) usage_train_();
    if (rc != 0) return rc;
    if (o->model == NULL) return cli_fail("--model is required (--model mlp)");
    if (strcmp(o->model, "mlp") != 0)
        return cli_fail("--model %s: unknown model; available: mlp, gpt", o->model);
    if (o->config == NULL) return cli_fail("--config CFG.json is required");
    return 0;
}

/* ---- data ------------------------------------------------------------------- */

typedef struct dataset {
    float *x;   /* (N, H) */
    int64_t *y; /* (N) */
    int64_t N;
} dataset;

static double uniform_(uint64_t *s) { return ((double)(zdp_splitmix64(s) >> 11) + 0.5) * 0x1.0p-53; }

static double normal_(uint64_t *s) {
    return sqrt(-2.0 * log(uniform_(s))) * cos(6.283185307179586 * uniform_(s));
}

/* Gaussian inputs labelled by a random linear teacher: y = argmax(T x).
 * The MLP can learn it, so the loss visibly falls. */
static int generate_data_(dataset *d, int H, int64_t N, uint64_t seed) {
    d->N = N;
    d->x = malloc((size_t)N * (size_t)H * sizeof(float));
    d->y = malloc((size_t)N * sizeof(int64_t));
    float *teacher = malloc((size_t)H * (size_t)H * sizeof(float));
    if (d->x == NULL || d->y == NULL || teacher == NULL) {
        free(teacher);
        return cli_fail("generated data: out of memory for %lld rows", (long long)N);
    }
    uint64_t s = seed ^ 0x5eedda7aULL;
    for (int64_t i = 0; i < (int64_t)H * H; i++) teacher[i] = (float)normal_(&s);
    for (int64_t n = 0; n < N; n++) {
        float *x = d->x + n * H;
        for (int h = 0; h < H; h++) x[h] = (float)normal_(&s);
        int64_t best = 0;
        double bestv = -INFINITY;
        for (int c = 0; c < H; c++) {
            double v = 0.0;
            for (int h = 0; h < H; h++) v += (double)teacher[(int64_t)c * H + h] * x[h];
            if (v > bestv) bestv = v, best = c;
        }
        d->y[n] = best;
    }
    free(teacher);
    return 0;
}

static int tensor_cli_fail(const char *path, const char *name, const zdp_tensor *t, const char *want) {
    char shape[128] = "";
    for (int d = 0; t != NULL && d < t->ndim; d++) {
        char part[32];
        snprintf(part, sizeof part, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        strncat(shape, part, sizeof shape - strlen(shape) - 1);
    }
    if (t == NULL) return cli_fail("%s: tensor \"%s\" is missing; expected %s", path, name, want);
    return cli_fail("%s: tensor \"%s\" is %s [%s]; expected %s", path, name, zdp_dtype_name(t->dtype),
                 shape, want);
}

static int load_data_(dataset *d, const char *path, int H) {
    zdp_safetensors st;
    zdp_error err;
    if (zdp_safetensors_read(path, &st, &err) != ZDP_OK) return cli_fail("--data %s", err.msg);
    int rc = 0;
    const zdp_tensor *x = zdp_safetensors_find(&st, "x"), *y = zdp_safetensors_find(&st, "y");
    char want[96];
    snprintf(want, sizeof want, "F32 [N, %d] (rows of the hidden size)", H);
    if (x == NULL || x->dtype != ZDP_DTYPE_F32 || x->ndim != 2 || x->shape[1] != H || x->shape[0] < 1) {
        rc = tensor_cli_fail(path, "x", x, want);
        goto done;
    }
    int64_t N = x->shape[0];
    snprintf(want, sizeof want, "I64 or I32 [%lld] (one label per row of x)", (long long)N);
    if (y == NULL || (y->dtype != ZDP_DTYPE_I64 && y->dtype != ZDP_DTYPE_I32) || y->ndim != 1 ||
        y->shape[0] != N) {
        rc = tensor_cli_fail(path, "y", y, want);
        goto done;
    }
    d->N = N;
    d->x = malloc((size_t)N * (size_t)H * sizeof(float));
    d->y = malloc((size_t)N * sizeof(int64_t));
    if (d->x == NULL || d->y == NULL) {
        rc = cli_fail("%s: out of memory for %lld rows", path, (long long)N);
        goto done;
    }
    memcpy(d->x, x->data, (size_t)N * (size_t)H * sizeof(float));
    if ((rc = cli_check_finite("--data", path, "x", d->x, N * H, H)) != 0) goto done;
    for (int64_t n = 0; n < N; n++) {
        int64_t v = y->dtype == ZDP_DTYPE_I64 ? ((const int64_t *)y->data)[n]
                                              : ((const int32_t *)y->data)[n];
        if (v < 0 || v >= H) {
            rc = cli_fail("%s: y[%lld] = %lld: labels must be in [0, %d) (the hidden size is the "
                       "number of classes)",
                       path, (long long)n, (long long)v, H);
            goto done;
        }
        d->y[n] = v;
    }
done:
    zdp_safetensors_free(&st);
    return rc;
}

/* Copies INIT's linears.* tensors into the engine, checking names and shapes. */
static int load_init_(float *const *views, const zdp_model *model, const char *path) {
    zdp_safetensors st;
    zdp_error err;
    if (zdp_safetensors_read(path, &st, &err) != ZDP_OK) return cli_fail("--init %s", err.msg);
    int rc = 0;
    for (int i = 0; i < model->n_params && rc == 0; i++) {
        const zdp_param_info *p = &model->params[i];
        const zdp_tensor *t = zdp_safetensors_find(&st, p->name);
        bool ok = t != NULL && t->dtype == ZDP_DTYPE_F32 && t->ndim == p->ndim;
        for (int d = 0; ok && d < p->ndim; d++) ok = t->shape[d] == p->shape[d];
        if (!ok) {
            char want[64];
            if (p->ndim == 2)
                snprintf(want, sizeof want, "F32 [%lld, %lld]", (long long)p->shape[0], (long long)p->shape[1]);
            else
                snprintf(want, sizeof want, "F32 [%lld]", (long long)p->shape[0]);
            rc = tensor_cli_fail(path, p->name, t, want);
        } else {
            memcpy(views[i], t->data, t->nbytes);
            rc = cli_check_finite("--init", path, p->name, views[i],
                                  (int64_t)(t->nbytes / sizeof(float)),
                                  p->ndim == 2 ? p->shape[1] : 0);
        }
    }
    /* A tensor the model does not have means the file is for another model. */
    for (int k = 0; k < st.n && rc == 0; k++) {
        bool known = false;
        for (int i = 0; i < model->n_params && !known; i++)
            known = strcmp(st.tensors[k].name, model->params[i].name) == 0;
        if (!known)
            rc = cli_fail("%s: tensor \"%s\" is not a parameter of this model (--layers %d); check "
                       "--hidden/--layers against the file",
                       path, st.tensors[k].name, model->n_params / 2);
    }
    zdp_safetensors_free(&st);
    return rc;
}

static int save_weights_(float *const *views, const zdp_model *model, const char *path) {
    zdp_tensor *ts = calloc((size_t)model->n_params, sizeof *ts);
    if (ts == NULL) return cli_fail("--save-weights: out of memory");
    for (int i = 0; i < model->n_params; i++) {
        const zdp_param_info *p = &model->params[i];
        int64_t n = 1;
        for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
        ts[i] = (zdp_tensor){.name = (char *)p->name, .dtype = ZDP_DTYPE_F32, .ndim = p->ndim,
                             .data = views[i],
                             .nbytes = (size_t)n * sizeof(float)};
        memcpy(ts[i].shape, p->shape, sizeof p->shape);
    }
    zdp_error err;
    /* With the model's shape, as a checkpoint's model.safetensors has it. */
    const char *const meta[] = {"format", "pt", "zdp_model", model->shape_json};
    zdp_status st = zdp_safetensors_write_meta(path, ts, model->n_params, meta,
                                               model->shape_json != NULL ? 2 : 1, &err);
    free(ts);
    if (st != ZDP_OK) {
        fprintf(stderr, "zdp: error: --save-weights %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* ---- training ------------------------------------------------------------------ */

/* Samples are consumed in one global order: in a step, rank r's j-th
 * micro-batch holds rows cursor + (j*W + r)*b + k (mod N), and the cursor
 * (samples consumed so far) advances by W*b per micro-batch.  The cursor is
 * saved in checkpoints, so a resumed run, at any world size, continues with
 * the next unseen samples. */
static int train_loop_(zdp_engine *eng, const train_opts *o, const dataset *d, int64_t cursor) {
    const zdp_config *cfg = zdp_engine_config(eng);
    const int W = zdp_dist_world_size(), r = zdp_dist_rank();
    const int64_t b = cfg->micro_batch_size, G = cfg->gradient_accumulation_steps;
    const bool managed = cfg->managed_gradient_accumulation;
    float *xb = malloc((size_t)b * (size_t)o->hidden * sizeof(float));
    int64_t *yb = malloc((size_t)b * sizeof(int64_t));
    if (xb == NULL || yb == NULL) cli_abort("out of memory for a micro-batch");
    zdp_error err;
    int rc = 0;
    int64_t skipped_run = 0;
    const int64_t first = zdp_engine_global_steps(eng);
    for (int64_t s = first; s < o->steps && rc == 0; s++) {
        int64_t n = cli_window(&o->schedule, managed, G, s);
        double loss_sum = 0.0;
        for (int64_t k = 0; k < n; k++, cursor += W * b) {
            for (int64_t i = 0; i < b; i++) {
                int64_t row = (cursor + (int64_t)r * b + i) % d->N;
                memcpy(xb + i * o->hidden, d->x + row * o->hidden, (size_t)o->hidden * sizeof(float));
                yb[i] = d->y[row];
            }
            zdp_mlp_batch batch = {.x = xb, .y = yb, .n = b};
            float loss;
            if (zdp_engine_forward(eng, &batch, &loss, &err) != ZDP_OK) cli_die("forward", &err);
            loss_sum += loss;
            bool ok = managed ? zdp_engine_backward(eng, true, 1.0f, &err) == ZDP_OK
                              : zdp_engine_backward(eng, false, 1.0f / (float)n, &err) == ZDP_OK;
            if (!ok) cli_die("backward", &err);
            if (managed && zdp_engine_step(eng, &err) != ZDP_OK) cli_die("step", &err);
        }
        if (!managed && zdp_engine_step(eng, &err) != ZDP_OK) cli_die("step", &err);
        if (o->memory_report && s == first && (rc = cli_memory_report(eng)) != 0) break;
        double mean_loss = zdp_dist_mean(loss_sum / (double)n);
        if (r == 0) {
            printf("step %lld | loss %.6f | global_samples %lld | grad_norm %.6f%s\n",
                   (long long)zdp_engine_global_steps(eng), mean_loss,
                   (long long)zdp_engine_global_samples(eng), zdp_engine_last_grad_norm(eng),
                   zdp_engine_was_step_applied(eng) ? "" : " | SKIPPED: non-finite gradient or update");
            fflush(stdout);
        }
        if (cli_skip_guard(eng, o->max_skipped, &skipped_run)) rc = 1;
        else cli_ckpt_after_step(eng, &o->ckpt, cursor, s + 1 == o->steps);
    }
    free(xb);
    free(yb);
    return rc;
}

static int cmd_train_(int argc, char **argv) {
    train_opts o;
    int rc = parse_train_args_(argc, argv, &o);
    if (rc == 1) return 0; /* --help */

    /* Start-up.  Each step can fail on one rank alone (its own copy of the
     * config or the data, on nodes without a shared file system), so each
     * runs only while this rank is fine, and all ranks meet at cli_agree
     * before the first collective: rank 0 then prints what failed on which
     * rank, and nobody waits for a rank that gave up. */
    zdp_error err;
    zdp_config cfg;
    zdp_model model = {0};
    zdp_engine *eng = NULL;
    dataset data = {0};
    const int W = zdp_dist_world_size();
    if (rc == 0 && zdp_config_load_file(o.config, W, &cfg, &err) != ZDP_OK) rc = cli_fail("%s", err.msg);
    if (rc == 0 && o.schedule.len > 0 && cfg.managed_gradient_accumulation)
        rc = cli_fail("--schedule needs unmanaged accumulation: set "
                      "\"managed_gradient_accumulation\": false in %s, or drop --schedule",
                      o.config);
    if (rc == 0 && cfg.micro_batch_size > ((int64_t)1 << 20))
        rc = cli_fail("train_micro_batch_size_per_gpu = %lld: the MLP trainer takes at most "
                      "1048576 rows per micro-batch",
                      (long long)cfg.micro_batch_size);
    if (rc == 0 && zdp_mlp_create(o.hidden, o.layers, cfg.micro_batch_size, &model, &err) != ZDP_OK)
        rc = cli_fail("%s", err.msg);
    if (rc == 0 && zdp_engine_create(&cfg, &model, &eng, &err) != ZDP_OK) rc = cli_fail("%s", err.msg);
    /* Filled here, pushed into the engine after the start-up agreement. */
    float **views = NULL;
    if (rc == 0 && (views = cli_params_views(eng, &model, false)) == NULL) rc = 1;
    if (rc == 0 && o.init != NULL)
        rc = load_init_(views, &model, o.init);
    else if (rc == 0)
        zdp_mlp_init_params(&model, views, o.seed);
    if (rc == 0)
        rc = o.data != NULL ? load_data_(&data, o.data, o.hidden)
                            : generate_data_(&data, o.hidden, o.samples, o.seed);
    if (rc == 0) rc = cli_ckpt_prepare(&o.ckpt);
    if (rc == 0 && o.save_weights != NULL && zdp_dist_rank() == 0)
        rc = cli_check_output("--save-weights", o.save_weights, false);
    if ((rc = cli_agree(rc)) != 0) goto done;
    if (cli_params_push(eng, &model, views) != 0) cli_die("sync params", &err);
    cli_params_free(eng, views);
    views = NULL;
    int64_t cursor = 0;
    if ((rc = cli_ckpt_resume(eng, &o.ckpt, &cursor)) != 0) goto done;
    if (zdp_dist_rank() == 0)
        printf("zdp train: mlp hidden %d layers %d | %d rank(s) | ZeRO stage %d | %s accumulation "
               "| B %lld = b %lld x G %lld x W %d | %lld samples\n",
               o.hidden, o.layers, W, cfg.zero.stage,
               cfg.managed_gradient_accumulation ? "managed" : "unmanaged",
               (long long)cfg.train_batch_size, (long long)cfg.micro_batch_size,
               (long long)cfg.gradient_accumulation_steps, W, (long long)data.N);

    if ((rc = train_loop_(eng, &o, &data, cursor)) != 0) goto done;

    if (o.save_weights != NULL) {
        /* At stage 3 every rank takes part in gathering the whole model. */
        if ((views = cli_params_views(eng, &model, true)) == NULL) {
            rc = 1;
            goto done;
        }
        int mine = zdp_dist_rank() == 0 ? save_weights_(views, &model, o.save_weights) : 0;
        if (!zdp_dist_all_ok(mine == 0)) rc = 1;
    }
done:
    if (eng != NULL) cli_params_free(eng, views);
    free(data.x);
    free(data.y);
    zdp_engine_destroy(eng);
    zdp_mlp_destroy(&model);
    return rc;
}

/* zdp gen-data --corpus arith: the GPT trainer's default corpus as an llm.c
 * token shard, so other programs (PyTorch) can train on the same bytes: the
 * held-out problems are its last tenth of lines, as in the trainer. */
static int gen_arith_(int64_t lines, int64_t seed, const char *out) {
    if (zdp_dist_rank() != 0) return 0;
    int32_t *tokens = NULL;
    int64_t n = 0;
    zdp_error err;
    int rc = 0;
    if (zdp_corpus_arith((uint64_t)seed, lines, CLI_ARITH_MAX_OPERAND, CLI_ARITH_VAL_FRACTION,
                         &tokens, &n, &err) != ZDP_OK ||
        zdp_tokens_write_shard(out, tokens, n, &err) != ZDP_OK)
        rc = cli_fail("gen-data: %s", err.msg);
    zdp_tokens_free(tokens);
    return rc;
}

/* zdp gen-data: the generated dataset as a file, for --data. */
static int cmd_gen_data_(int argc, char **argv) {
    int64_t H = 0, N = 4096, seed = 42, lines = 0;
    const char *out = NULL;
    static const char *const corpora[] = {"arith", NULL};
    static const int corpus_on[] = {1};
    int arith = 0;
    const cli_opt opts[] = {
        CLI_I64("--hidden", &H, 1, 65536, "need an integer in 1..65536"),
        CLI_I64("--samples", &N, 1, (int64_t)1 << 26, "need 1..67108864"),
        CLI_I64("--seed", &seed, 0, INT64_MAX, "need an integer >= 0"),
        CLI_STR("--out", &out),
        CLI_CHOICE("--corpus", &arith, corpora, corpus_on, "the only corpus is arith"),
        CLI_I64("--lines", &lines, 1, (int64_t)1 << 28, "need 1..268435456"),
    };
    static const cli_command cmd = {.missing = "missing value (see zdp gen-data --help)",
                                    .unknown = " for gen-data (see zdp gen-data --help)"};
    int rc = cli_parse_options(&cmd, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv);
    if (rc == 1) {
        if (zdp_dist_rank() == 0) usage_gen_data_();
        return 0;
    }
    if (rc != 0) return rc;
    if (arith && lines == 0) lines = CLI_ARITH_LINES;
    if (out == NULL) return cli_fail("gen-data needs --out FILE");
    if (lines > 0) return gen_arith_(lines, seed, out);
    if (H == 0) return cli_fail("gen-data needs --hidden H (MLP data) or --corpus arith (GPT tokens)");
    if (zdp_dist_rank() != 0) return 0;
    dataset d = {0};
    rc = generate_data_(&d, (int)H, N, (uint64_t)seed);
    if (rc == 0) {
        zdp_tensor ts[2] = {
            {.name = "x", .dtype = ZDP_DTYPE_F32, .ndim = 2, .shape = {N, H}, .data = d.x,
             .nbytes = (size_t)(N * H) * sizeof(float)},
            {.name = "y", .dtype = ZDP_DTYPE_I64, .ndim = 1, .shape = {N}, .data = d.y,
             .nbytes = (size_t)N * sizeof(int64_t)},
        };
        zdp_error err;
        if (zdp_safetensors_write(out, ts, 2, &err) != ZDP_OK) rc = cli_fail("gen-data: %s", err.msg);
    }
    free(d.x);
    free(d.y);
    return rc;
}

/* zdp ckpt inspect DIR [--tag T] | zdp ckpt export DIR --to OUT [--tag T] */
static int cmd_ckpt_(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (is_help_(argv[i])) {
            if (zdp_dist_rank() == 0) usage_ckpt_();
            return 0;
        }
    if (argc < 2 || (strcmp(argv[0], "inspect") != 0 && strcmp(argv[0], "export") != 0))
        return cli_fail("usage: zdp ckpt inspect DIR [--tag T] | zdp ckpt export DIR --to "
                        "OUT.safetensors [--tag T]  (DIR is a --save-dir; the tag defaults to "
                        "DIR/latest)");
    const char *dir = argv[1], *tag = NULL, *to = NULL;
    const cli_opt opts[] = {CLI_STR("--tag", &tag), CLI_STR("--to", &to)};
    static const cli_command cmd = {.missing = "missing value", .unknown = " for zdp ckpt"};
    /* --help was answered above, so the loop returns 0 or an error. */
    int rc = cli_parse_options(&cmd, opts, 2, argc - 2, argv + 2);
    if (rc != 0) return rc;
    if (zdp_dist_rank() != 0) return 0;
    zdp_error err;
    if (strcmp(argv[0], "inspect") == 0) {
        char *text = NULL;
        if (zdp_checkpoint_inspect(dir, tag, &text, &err) != ZDP_OK) return cli_fail("%s", err.msg);
        fputs(text, stdout);
        free(text);
        return 0;
    }
    if (to == NULL) return cli_fail("zdp ckpt export needs --to OUT.safetensors");
    if (zdp_checkpoint_export(dir, tag, to, &err) != ZDP_OK) return cli_fail("%s", err.msg);
    printf("wrote the full fp32 weights to %s\n", to);
    return 0;
}

int main(int argc, char **argv) {
    zdp_error err;
    /* Line-buffered even into a pipe (mpirun's, a log file): each progress
     * line leaves whole and at once, so stderr's lines (warnings, skipped
     * steps) can never land inside one, and a killed job loses none. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0)) {
        printf("zdp %s\n", ZDP_VERSION);
        return 0;
    }
    if (argc < 2 || is_help_(argv[1]) || strcmp(argv[1], "help") == 0) {
        usage_commands_(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    bool known = false;
    for (size_t i = 0; i < sizeof commands_ / sizeof commands_[0]; i++)
        known = known || strcmp(argv[1], commands_[i].name) == 0;
    if (!known) {
        /* Before MPI starts, so no rank waits for another; under mpirun only
         * the first rank says it. */
        const char *r = getenv("OMPI_COMM_WORLD_RANK");
        if (r == NULL) r = getenv("PMI_RANK");
        if (r == NULL || strcmp(r, "0") == 0) {
            fprintf(stderr, "zdp: error: unknown command \"%s\"\n\n", argv[1]);
            usage_commands_(stderr);
        }
        return 2;
    }
    if (zdp_dist_init(&argc, &argv, &err) != ZDP_OK) {
        fprintf(stderr, "zdp: error: %s\n", err.msg);
        return 1;
    }
    int rc;
    /* --model picks the trainer; the causal-LM trainer (--model gpt, or a
     * --model-dir folder) parses its own options. */
    bool gpt = false;
    for (int i = 2; i + 1 < argc; i++)
        if ((strcmp(argv[i], "--model") == 0 && strcmp(argv[i + 1], "gpt") == 0) ||
            strcmp(argv[i], "--model-dir") == 0)
            gpt = true;
    if (strcmp(argv[1], "train") == 0 && gpt)
        rc = cmd_train_lm(argc - 2, argv + 2);
    else if (strcmp(argv[1], "train") == 0)
        rc = cmd_train_(argc - 2, argv + 2);
    else if (strcmp(argv[1], "sample") == 0)
        rc = cmd_sample(argc - 2, argv + 2);
    else if (strcmp(argv[1], "ckpt") == 0)
        rc = cmd_ckpt_(argc - 2, argv + 2);
    else if (strcmp(argv[1], "gen-data") == 0)
        rc = cmd_gen_data_(argc - 2, argv + 2);
    else if (strcmp(argv[1], "tokenize") == 0)
        rc = cmd_tokenize(argc - 2, argv + 2);
    else if (strcmp(argv[1], "init-model") == 0)
        rc = cmd_init_model(argc - 2, argv + 2);
    else if (strcmp(argv[1], "lora") == 0)
        rc = cmd_lora(argc - 2, argv + 2);
    else
        rc = cmd_serve(argc - 2, argv + 2);
    /* A command that failed without meeting the others (one that runs on
     * rank 0 only, or bad arguments, the same on every rank) says why here. */
    if (rc != 0) cli_flush_error();
    zdp_dist_finalize();
    return rc;
}
