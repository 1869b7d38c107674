/*
 * train_lm.c -- `zdp train --model gpt` and `zdp train --model-dir DIR`: a
 * causal LM (GPT-2 from flags, or any model a Hugging Face folder describes:
 * GPT-2, Llama, Qwen3, through zdp_hf_model_create) trained on text, token
 * shards, .npy token arrays or zdp's own arithmetic corpus.  One code path
 * for every model: only start-up (which model, which weights) and the
 * optional folder written at the end differ.
 *
 *   mpirun -np W zdp train --model gpt --n-layer L --n-head H --n-embd C
 *       --vocab-size V --block-size T --config CFG.json [--init INIT.safetensors]
 *       [--data FILE] [--data-format auto|llmc|bytes] [--data-order sequential]
 *       [--steps S] [--schedule n1,...]
 *       [--save-weights OUT.safetensors] [--val-every N] [--val-batches K]
 *       [--val-fraction F] [--out-dir DIR] [--seed N]
 *   mpirun -np W zdp train --model-dir DIR --config CFG.json --data FILE
 *       [--block-size T] [--save-model-dir OUT] [--save-dtype F32|BF16] [...]
 *       [--lora-rank r [--lora-alpha a] [--lora-targets attn,mlp,unembed]
 *        [--save-adapter-dir OUT]]   (LoRA over the folder's frozen weights)
 *       [--adapter DIR [--save-adapter-dir OUT]]  (LoRA from a PEFT adapter folder)
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
#include "sample_cli.h"
#include "zdp/zdp.h"

typedef struct lm_opts {
    zdp_gpt_config model;
    const char *config, *init, *data, *save_weights, *out_dir;
    const char *model_dir, *save_model_dir; /* Hugging Face folders in and out */
    int save_dtype;                         /* a zdp_dtype: F32 or BF16 */
    /* LoRA (docs/lora.md): lora_rank 0 trains every weight. */
    int64_t lora_rank;
    double lora_alpha;
    const char *lora_targets, *save_adapter_dir;
    const char *adapter; /* --adapter: start from this PEFT folder (its config is the LoRA's) */
    int64_t steps, val_every, val_batches, arith_lines, max_skipped;
    double val_fraction; /* < 0: the default for the data kind */
    int progress;        /* -1 auto, 0 plain lines, 1 progress line */
    int memory_report;   /* --memory-report on: every rank's memory after the first step */
    int data_format;     /* a zdp_token_format (--data-format): ZDP_TOKENS_AUTO by default */
    cli_ckpt ckpt;
    uint64_t seed;
    cli_schedule schedule;
} lm_opts;

static void usage_(void) {
    printf("usage: mpirun -np W zdp train --model gpt --config CFG.json [options]\n"
           "\n"
           "model (defaults: the demo model on the arithmetic corpus):\n"
           "  --n-layer L (4)  --n-head H (4)  --n-embd C (128)  --vocab-size V (256)\n"
           "  --block-size T (64)\n"
           "  --model-dir DIR           a Hugging Face folder (config.json + safetensors:\n"
           "                            llama, qwen3, gpt2) instead of the flags above; its\n"
           "                            weights are the start; --block-size T (default\n"
           "                            min(max_position_embeddings, 1024)) must be <= its\n"
           "                            max_position_embeddings\n"
           "data:\n"
           "  --data FILE               an llm.c token shard (magic 20240520), a .npy 1-D\n"
           "                            uint16/int32/uint32 token array, or any file, read\n"
           "                            as bytes (vocab 256) -- with --model-dir, as text\n"
           "                            through the folder's tokenizer; default: zdp's\n"
           "                            generated arithmetic corpus (lines \"a+b=c\")\n"
           "  --data-format auto|llmc|npy|bytes|text   how --data is read (auto): llmc = a\n"
           "                            token shard; npy = a NumPy array; bytes (or text) =\n"
           "                            one token per byte, or with --model-dir text tokenized\n"
           "                            by its tokenizer; auto = .npy or a shard by their\n"
           "                            magic, an error\n"
           "                            if it looks like a damaged shard (a .bin name, or a\n"
           "                            shard's header with a damaged magic), bytes otherwise\n"
           "  --data-order sequential   the only order (window w = tokens [wT, wT+T])\n"
           "  --val-fraction F          tokens at the end kept for val loss (default 0.1;\n"
           "                            0 for token shards, whose val data is another file)\n"
           "training:\n"
           "  --steps S (200)  --schedule n1,n2,... (unmanaged)  --seed N (42)\n"
           "  --max-skipped-steps K (100) stop with an error after K skipped steps in a row\n"
           "                            (NaN/Inf gradient or update; 0 = never)\n"
           "  --memory-report on|off     every rank's memory by category after the first step;\n"
           "                             at the end its peak RSS and the loader's peak\n"
           "  --init FILE                GPT2LMHeadModel safetensors or llm.c .bin weights\n"
           "  --save-weights FILE        GPT2LMHeadModel safetensors (rank 0; GPT flags only)\n"
           "  --save-model-dir OUT       at the end, a Hugging Face folder (config.json,\n"
           "                            safetensors, the tokenizer of --model-dir) (rank 0)\n"
           "  --save-dtype F32|BF16 (F32) the dtype --save-model-dir writes\n"
           "LoRA (with --model-dir; docs/lora.md):\n"
           "  --lora-rank r             train rank-r adapters over the folder's frozen\n"
           "                            weights instead of every weight\n"
           "  --lora-alpha a (32)       scaling a / r\n"
           "  --lora-targets LIST (all) attn, mlp, unembed, comma-separated; or single\n"
           "                            modules (q_proj,v_proj; GPT-2's attn.c_attn, ...)\n"
           "  --save-adapter-dir OUT    at the end, a PEFT adapter folder (rank 0); merge\n"
           "                            it with zdp lora merge\n"
           "  --adapter DIR             start from a PEFT adapter folder instead (its\n"
           "                            adapter_config.json gives rank, alpha and targets)\n"
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

static int parse_(int argc, char **argv, lm_opts *o) {
    *o = (lm_opts){.model = CLI_GPT_DEFAULT,
                    .steps = 200, .val_every = 50, .val_batches = 8, .arith_lines = CLI_ARITH_LINES,
                    .val_fraction = -1, .seed = 42, .out_dir = "zdp-out", .progress = -1,
                    .data_format = ZDP_TOKENS_AUTO, .max_skipped = CLI_MAX_SKIPPED_DEFAULT,
                    .lora_alpha = ZDP_LORA_DEFAULT_ALPHA, .lora_targets = "all"};
    /* text: bytes, which --model-dir reads through its tokenizer. */
    static const char *const formats[] = {"auto", "llmc", "npy", "bytes", "text", NULL};
    static const int format_values[] = {ZDP_TOKENS_AUTO, ZDP_TOKENS_SHARD, ZDP_TOKENS_NPY,
                                        ZDP_TOKENS_BYTES, ZDP_TOKENS_BYTES};
    static const char *const dtypes[] = {"F32", "BF16", NULL};
    static const int dtype_values[] = {ZDP_DTYPE_F32, ZDP_DTYPE_BF16};
    o->save_dtype = ZDP_DTYPE_F32;
    /* With a folder the shape is its config.json's, the block size the
     * factory's default unless given. */
    bool folder = false;
    for (int i = 0; i < argc; i++) folder = folder || strcmp(argv[i], "--model-dir") == 0;
    if (folder) o->model.block_size = 0;
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
                   "auto, llmc (an llm.c token shard), npy (a NumPy token array), bytes (one "
                   "token per byte) or text (bytes; with --model-dir, its tokenizer's tokens)"),
        CLI_WORD("--model-dir", &o->model_dir, NULL, NULL),
        CLI_WORD("--save-model-dir", &o->save_model_dir, NULL, NULL),
        CLI_CHOICE("--save-dtype", &o->save_dtype, dtypes, dtype_values, "F32 or BF16"),
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
        CLI_I64("--lora-rank", &o->lora_rank, 1, 1 << 20, "need an integer >= 1"),
        CLI_F64("--lora-alpha", &o->lora_alpha, 1e-30, 1e30, "need a number > 0"),
        CLI_WORD("--lora-targets", &o->lora_targets, NULL, NULL),
        CLI_WORD("--save-adapter-dir", &o->save_adapter_dir, NULL, NULL),
        CLI_WORD("--adapter", &o->adapter, NULL, NULL),
    };
    static const cli_command cmd = {
        .missing = "expected an option with a value (see zdp train --model gpt --help)",
        .unknown = " (see zdp train --model gpt --help)", .dashes = true};
    int rc = cli_parse_options(&cmd, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv);
    if (rc == 1 && zdp_dist_rank() == 0) usage_();
    if (rc != 0) return rc;
    if (o->config == NULL) return cli_fail("--config CFG.json is required");
    bool lora_flag = false, save_flag = false;
    for (int i = 0; i < argc; i++) {
        lora_flag = lora_flag || strncmp(argv[i], "--lora-", 7) == 0;
        save_flag = save_flag || strcmp(argv[i], "--save-adapter-dir") == 0;
    }
    if (o->adapter != NULL && lora_flag)
        return cli_fail("--adapter %s: its adapter_config.json sets rank, alpha and targets; "
                        "drop --lora-rank, --lora-alpha and --lora-targets", o->adapter);
    if (o->adapter != NULL) {
        zdp_lora_config ac;
        zdp_error aerr;
        if (zdp_lora_read_adapter_config(o->adapter, &ac, &aerr) != ZDP_OK)
            return cli_fail("--adapter %s", aerr.msg);
        o->lora_rank = ac.rank;
        o->lora_alpha = ac.alpha;
        static char tn[ZDP_LORA_TARGETS_NAME_MAX]; /* one parse per run */
        zdp_lora_targets_name(ac.targets, ac.modules, tn, sizeof tn);
        o->lora_targets = tn;
    }
    if ((lora_flag || save_flag) && o->lora_rank == 0)
        return cli_fail("--lora-alpha, --lora-targets and --save-adapter-dir need --lora-rank r "
                        "(or --adapter DIR)");
    if (o->lora_rank > 0 && o->model_dir == NULL)
        return cli_fail("--lora-rank: LoRA adapts a pretrained model; give its folder with "
                        "--model-dir DIR");
    if (o->lora_rank > 0 && o->save_model_dir != NULL)
        return cli_fail("--save-model-dir with --lora-rank: save the adapter with "
                        "--save-adapter-dir OUT, then write the merged model with zdp lora "
                        "merge --model-dir %s --adapter OUT --out DIR", o->model_dir);
    int targets, modules;
    zdp_error terr;
    if (zdp_lora_targets_parse(o->lora_targets, &targets, &modules, &terr) != ZDP_OK)
        return cli_fail("--lora-targets %s", terr.msg);
    if (o->model_dir == NULL) return 0;
    /* The folder's config.json is the shape and its safetensors the weights. */
    static const char *const shape_flags[] = {"--n-layer", "--n-head", "--n-embd", "--vocab-size",
                                              "--init"};
    for (int i = 0; i < argc; i++)
        for (size_t k = 0; k < sizeof shape_flags / sizeof shape_flags[0]; k++)
            if (strcmp(argv[i], shape_flags[k]) == 0)
                return cli_fail("%s: the model comes from --model-dir %s (its config.json and "
                                "weights); drop %s", shape_flags[k], o->model_dir, shape_flags[k]);
    if (o->save_weights != NULL)
        return cli_fail("--save-weights: with --model-dir, save a folder with --save-model-dir "
                        "OUT");
    return 0;
}

typedef struct run_state {
    zdp_config cfg;
    zdp_engine *eng;
    zdp_model model;
    zdp_hf_config hf; /* --model-dir's config.json */
    /* With --lora-rank: model is the LoRA model over base, whose weights
     * (base_params, one array per tensor) the engine never sees. */
    zdp_model base;
    float **base_params;   /* stages 0-2: the base, whole, on every rank */
    zdp_hf_reader *reader; /* stage 3: the folder, read into the partitions */
    int vocab;        /* the model's vocabulary, known before the model exists */
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
    float **views;      /* whole tensors: the start-up's to push, the end's gathered
                           (NULL where nothing needs them: stage 3 reads the folder
                           into the partitions) */
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

/* Text as --data for a model folder: a file read as bytes (--data-format
 * text, or auto finding no shard or .npy magic) is tokenized with the
 * folder's tokenizer, on every rank alike (no BOS/EOS added; special
 * tokens' text stays plain text, docs/models.md "Training on text").  0 or
 * cli_fail's code. */
static int open_text_data_(const lm_opts *o, run_state *st, double val_fraction) {
    zdp_tokenizer *tok = NULL;
    zdp_error err;
    if (zdp_tokenizer_load(o->model_dir, &tok, &err) != ZDP_OK)
        return cli_fail("--data %s is text, which needs --model-dir %s's tokenizer: %s; copy the model's "
                        "tokenizer into the folder (zdp init-model --tokenizer DIR does), or give token ids "
                        "(an llm.c shard or a .npy array)", o->data, o->model_dir, err.msg);
    int32_t *ids = NULL;
    size_t n = 0;
    const double t0 = cli_now();
    zdp_status s = zdp_tokenizer_encode_file(tok, o->data, 0, &ids, &n, &err);
    zdp_tokenizer_destroy(tok);
    if (s != ZDP_OK) return cli_fail("--data %s", err.msg);
    if (st->R == 0)
        printf("--data %s: text, %lld tokens with --model-dir %s's tokenizer (%.1f s)\n", o->data, (long long)n,
               o->model_dir, cli_now() - t0);
    s = zdp_dataset_create(ids, (int64_t)n, val_fraction, &st->ds, &err);
    free(ids);
    return s != ZDP_OK ? cli_fail("--data %s: %s", o->data, err.msg) : 0;
}

/* The first token of the dataset outside [0, V): -1 if none, else its
 * position in the file (train split first, then val). */
static int64_t first_outside_(const zdp_dataset *ds, int V, int32_t *tok) {
    int64_t base = 0;
    for (int sp = 0; sp < 2; sp++) {
        const zdp_split split = sp == 0 ? ZDP_SPLIT_TRAIN : ZDP_SPLIT_VAL;
        const int32_t *t = zdp_dataset_tokens(ds, split);
        const int64_t n = zdp_dataset_n_tokens(ds, split);
        for (int64_t i = 0; i < n; i++) {
            if (t[i] >= V) {
                *tok = t[i];
                return base + i;
            }
        }
        base += n;
    }
    return -1;
}

/* The data, checked against the model's vocabulary and block size: the
 * generated arithmetic corpus without --data.  0 or cli_fail's code. */
static int open_data_(const lm_opts *o, run_state *st) {
    zdp_error err;
    st->fmt = st->arith ? ZDP_TOKENS_BYTES : (zdp_token_format)o->data_format;
    if (st->fmt == ZDP_TOKENS_AUTO && zdp_tokens_detect(o->data, &st->fmt, &err) != ZDP_OK)
        return cli_fail("--data: %s", err.msg);
    if (o->model_dir != NULL && st->arith)
        return cli_fail("--model-dir %s needs --data FILE (token ids in its vocabulary); the "
                        "arithmetic corpus is for byte-level models", o->model_dir);
    double vf = o->val_fraction >= 0 ? o->val_fraction
                : (st->fmt == ZDP_TOKENS_SHARD || st->fmt == ZDP_TOKENS_NPY ? 0.0 : 0.1);
    if (o->model_dir != NULL && st->fmt == ZDP_TOKENS_BYTES) {
        int rc = open_text_data_(o, st, vf);
        if (rc != 0) return rc;
    }
    zdp_status s = st->ds != NULL ? ZDP_OK
                   : st->arith ? zdp_dataset_create_arith(o->seed, o->arith_lines,
                                                        CLI_ARITH_MAX_OPERAND, vf, &st->ds, &err)
                             : zdp_dataset_open(o->data, st->fmt, vf, &st->ds, &err);
    if (s != ZDP_OK) return cli_fail("--data: %s", err.msg);
    int32_t tok = 0;
    const int64_t at = first_outside_(st->ds, st->vocab, &tok);
    if (at >= 0 && o->model_dir != NULL)
        return cli_fail("--data %s: token %d at position %lld is outside the vocabulary of "
                        "--model-dir %s (vocab_size %d); fix: tokenize the data with that "
                        "model's tokenizer", o->data, tok, (long long)at, o->model_dir,
                        st->vocab);
    if (at >= 0)
        return cli_fail("--data %s: token %d at position %lld is outside the vocabulary "
                        "(--vocab-size %d); fix: raise --vocab-size%s",
                        st->arith ? "(generated)" : o->data, tok, (long long)at, st->vocab,
                        st->fmt == ZDP_TOKENS_BYTES ? " to 256 for byte-level text" : "");
    if (zdp_dataset_n_windows(st->ds, ZDP_SPLIT_TRAIN, st->T) == 0)
        return cli_fail("--data %s: the train split has %lld tokens, fewer than --block-size + 1 "
                        "= %d; fix: more data or a smaller --block-size",
                        st->arith ? "(generated)" : o->data,
                        (long long)zdp_dataset_n_tokens(st->ds, ZDP_SPLIT_TRAIN), st->T + 1);
    return 0;
}

/* The engine's parameters: the folder's, --init's weights, or a fresh
 * initialisation. */
static int init_params_(lm_opts *o, run_state *st) {
    if (o->model_dir != NULL && o->lora_rank <= 0 && o->adapter == NULL) {
        /* Read tensor by tensor into the engine: at stage 3 each rank reads
         * only its partition's slice of each (docs/training.md). */
        zdp_error err;
        zdp_hf_reader *r = NULL;
        int rc = 0;
        if (zdp_hf_reader_open(o->model_dir, &st->model, &r, &err) != ZDP_OK ||
            zdp_engine_load_params(st->eng, zdp_hf_reader_read, r, &err) != ZDP_OK)
            rc = cli_fail("--model-dir %s", err.msg);
        zdp_hf_reader_close(r);
        return rc;
    }
    /* Filled here, pushed into the engine after the start-up agreement. */
    float **views = st->views = cli_params_views(st->eng, &st->model, false);
    if (views == NULL) return 1;
    int rc = 0;
    if (o->adapter != NULL) {
        zdp_error err;
        if (zdp_lora_load_adapter(o->adapter, &st->model, views, &err) != ZDP_OK)
            rc = cli_fail("--adapter %s", err.msg);
    } else if (o->lora_rank > 0) {
        zdp_lora_init_params(&st->model, views); /* the folder's weights are the base's */
    } else if (o->init != NULL) {
        zdp_error err;
        if (zdp_gpt_weights_load(o->init, &o->model, st->model.params, st->model.n_params,
                                 views, &err) != ZDP_OK)
            rc = cli_fail("--init %s", err.msg);
    } else {
        zdp_gpt_init_params(&st->model, views, o->seed);
    }
    return rc;
}

/* --lora-rank: the folder's model becomes the frozen base, its weights
 * loaded outside the engine, and st->model the LoRA model over it.  0 or
 * cli_fail's code. */
static int lora_start_(const lm_opts *o, run_state *st) {
    zdp_error err;
    st->base = st->model;
    memset(&st->model, 0, sizeof st->model);
    zdp_lora_config lc = {.rank = (int)o->lora_rank, .alpha = (float)o->lora_alpha,
                          .seed = o->seed};
    if (zdp_lora_targets_parse(o->lora_targets, &lc.targets, &lc.modules, &err) != ZDP_OK)
        return cli_fail("--lora-rank %d: %s", lc.rank, err.msg);
    if (st->cfg.zero.stage == 3) {
        /* The engine reads each rank's slice of the base at create; the
         * reader is closed after it (startup_). */
        if (zdp_hf_reader_open(o->model_dir, &st->base, &st->reader, &err) != ZDP_OK)
            return cli_fail("--model-dir %s", err.msg);
        if (zdp_lora_create_partitioned(&st->base, zdp_hf_reader_read, st->reader, &lc,
                                        &st->model, &err) != ZDP_OK)
            return cli_fail("--lora-rank %d: %s", lc.rank, err.msg);
        return 0;
    }
    st->base_params = calloc((size_t)st->base.n_params, sizeof *st->base_params);
    if (st->base_params == NULL) return cli_fail("out of memory");
    for (int i = 0; i < st->base.n_params; i++) {
        const zdp_param_info *p = &st->base.params[i];
        int64_t n = 1;
        for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
        if ((st->base_params[i] = zdp_big_alloc((size_t)n * sizeof(float))) == NULL)
            return cli_fail("out of memory for the base weights");
    }
    if (zdp_hf_weights_load(o->model_dir, &st->base, st->base_params, &err) != ZDP_OK)
        return cli_fail("--model-dir %s", err.msg);
    if (zdp_lora_create(&st->base, (const float *const *)st->base_params, &lc, &st->model,
                        &err) != ZDP_OK)
        return cli_fail("--lora-rank %d: %s", lc.rank, err.msg);
    return 0;
}

static void lora_free_(run_state *st) {
    if (st->base_params != NULL)
        for (int i = 0; i < st->base.n_params; i++) free(st->base_params[i]);
    free(st->base_params);
    zdp_hf_reader_close(st->reader);
    zdp_lora_destroy(&st->model);
    zdp_model_destroy(&st->base);
}

/* Everything that can fail on one rank alone (its own copy of the config,
 * the data or the weights, on nodes without a shared file system): each
 * step runs only while this rank is fine.  0 or cli_fail's code; the caller
 * agrees before the first collective. */
static int startup_(lm_opts *o, run_state *st, int rc) {
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
    /* The outputs before anything large is read: a model folder can be GBs. */
    if (rc == 0) rc = cli_ckpt_prepare(&o->ckpt);
    if (rc == 0 && o->save_weights != NULL && st->R == 0) /* only rank 0 writes it */
        rc = cli_check_output("--save-weights", o->save_weights, false);
    if (rc == 0 && o->save_model_dir != NULL && st->R == 0)
        rc = cli_check_output("--save-model-dir", o->save_model_dir, true);
    if (rc == 0 && o->save_adapter_dir != NULL && st->R == 0)
        rc = cli_check_output("--save-adapter-dir", o->save_adapter_dir, true);
    st->b = rc == 0 ? (int)st->cfg.micro_batch_size : 0;
    st->T = o->model.block_size;
    st->vocab = o->model.vocab_size;
    if (rc == 0 && o->model_dir != NULL) {
        if (zdp_hf_config_read(o->model_dir, &st->hf, &err) != ZDP_OK)
            rc = cli_fail("--model-dir %s", err.msg);
        else
            st->vocab = st->hf.family == ZDP_HF_GPT2 ? st->hf.gpt.vocab_size
                                                     : st->hf.llama.vocab_size;
        if (rc == 0 && st->T > st->hf.max_position_embeddings)
            rc = cli_fail("--block-size %d: --model-dir %s's max_position_embeddings is %d; "
                          "use --block-size <= %d", st->T, o->model_dir,
                          st->hf.max_position_embeddings, st->hf.max_position_embeddings);
        if (rc == 0 && st->T == 0)
            st->T = st->hf.max_position_embeddings < ZDP_HF_DEFAULT_BLOCK
                        ? st->hf.max_position_embeddings : ZDP_HF_DEFAULT_BLOCK;
    }
    /* Data first: its vocabulary must fit the model. */
    st->arith = o->data == NULL;
    if (rc == 0) rc = open_data_(o, st);
    zdp_status ms = ZDP_OK;
    if (rc == 0)
        ms = o->model_dir != NULL ? zdp_hf_model_create(&st->hf, st->T, st->b, &st->model, &err)
                                  : zdp_gpt_create(&o->model, st->b, &st->model, &err);
    if (rc == 0 && ms != ZDP_OK) rc = cli_fail("%s", err.msg);
    if (rc == 0 && o->lora_rank > 0) rc = lora_start_(o, st);
    if (rc == 0) st->T = st->model.block_size;
    if (rc == 0 && zdp_engine_create(&st->cfg, &st->model, &st->eng, &err) != ZDP_OK)
        rc = cli_fail("%s", err.msg);
    zdp_hf_reader_close(st->reader); /* the engine has read its slices */
    st->reader = NULL;
    if (rc == 0) rc = init_params_(o, st);
    return rc;
}

/* Rank 0: metrics.csv's row and the step's line (or the progress line). */
static void report_step_(const lm_opts *o, run_state *st, int64_t step, int64_t n,
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
static int train_loop_(const lm_opts *o, run_state *st, int64_t cursor) {
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

/* "gpt L=4 H=4 C=128 V=256" or "llama L=2 H=64 NH=4 KV=2 hd=16 F=128 V=512". */
static const char *model_shape_(const run_state *st, char *buf, size_t cap) {
    const zdp_model *m = st->base.self != NULL ? &st->base : &st->model;
    const zdp_gpt_config *g = zdp_gpt_config_of(m);
    const zdp_llama_config *l = zdp_llama_config_of(m);
    if (g != NULL)
        snprintf(buf, cap, "gpt L=%d H=%d C=%d V=%d", g->n_layer, g->n_head, g->n_embd,
                 g->vocab_size);
    else if (l != NULL)
        snprintf(buf, cap, "%s L=%d H=%d NH=%d KV=%d hd=%d F=%d V=%d",
                 l->arch == ZDP_ARCH_QWEN3 ? "qwen3" : "llama", l->n_layer, l->hidden, l->n_head,
                 l->n_kv_head, l->head_dim, l->ffn, l->vocab_size);
    else
        snprintf(buf, cap, "model");
    return buf;
}

/* Rank 0, after training: the loss curve, and what the model learned, in
 * words (a sample; for the arithmetic corpus, held-out accuracy). */
static void report_end_(const lm_opts *o, run_state *st) {
    char title[160], shape[96];
    snprintf(title, sizeof title, "zdp %s T=%d, %d rank(s), ZeRO-%d",
             model_shape_(st, shape, sizeof shape), st->T, st->W, st->cfg.zero.stage);
    if (st->log.n > 0 && metrics_plot_svg(&st->log, st->svg_path, title) == 0)
        printf("metrics: %s, loss curve: %s\n", st->csv_path, st->svg_path);
    metrics_close(&st->log);
    float **views = st->views;
    if (views != NULL) {
        if (st->arith && zdp_gpt_config_of(&st->model) != NULL)
            sample_arith_report(&st->model, (const float *const *)views, st->ds, 200);
        else if (zdp_gpt_config_of(&st->model) != NULL && st->vocab == 256)
            sample_print(&st->model, (const float *const *)views, "\n", 200, 0.8, 40, o->seed);
    }
    fflush(stdout);
}

/* COLLECTIVE.  --save-weights, written by rank 0: 0, or 1 on every rank
 * when it failed. */
static int save_weights_(const lm_opts *o, run_state *st) {
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

/* Stage 3's --save-model-dir: tensor i gathered (every rank alike) just
 * before rank 0 writes it; next counts the tensors gathered so far. */
typedef struct gather_read_ctx {
    zdp_engine *eng;
    int next;
} gather_read_ctx;

static zdp_status gather_read_(void *ctx, int i, int64_t lo, int64_t hi, float *dst,
                               zdp_error *err) {
    (void)lo; /* zdp_hf_save_stream reads whole tensors, in order */
    (void)hi;
    gather_read_ctx *g = ctx;
    g->next = i + 1;
    return zdp_engine_get_param(g->eng, i, dst, err);
}

/* COLLECTIVE.  Stage 3: the folder streamed a tensor at a time (no rank
 * holds the whole model: rank 0 one tensor, the others one gather buffer).
 * Every rank runs the same gathers, in order, to the last tensor even when
 * rank 0's write stopped early.  0 or 1 (rank 0's write failed). */
static int save_model_dir_stream_(const lm_opts *o, run_state *st, zdp_error *err) {
    int64_t largest = 1;
    for (int i = 0; i < st->model.n_params; i++) {
        int64_t n = 1;
        for (int d = 0; d < st->model.params[i].ndim; d++) n *= st->model.params[i].shape[d];
        if (n > largest) largest = n;
    }
    float *one = malloc((size_t)largest * sizeof(float));
    if (!zdp_dist_all_ok(one != NULL)) {
        free(one);
        snprintf(err->msg, sizeof err->msg, "%s: out of memory for one tensor", o->save_model_dir);
        return 1;
    }
    gather_read_ctx g = {.eng = st->eng};
    int mine = 0;
    if (st->R == 0 &&
        zdp_hf_save_stream(o->save_model_dir, &st->model, gather_read_, &g,
                           (zdp_dtype)o->save_dtype, 0, err) != ZDP_OK)
        mine = 1;
    zdp_error ignored;
    for (int i = g.next; i < st->model.n_params; i++)
        (void)zdp_engine_get_param(st->eng, i, one, &ignored); /* failures agree on every rank */
    free(one);
    return mine;
}

/* COLLECTIVE.  --save-model-dir, written by rank 0: the folder, with
 * --model-dir's tokenizer files when it has any.  0, or 1 on every rank
 * when it failed. */
static int save_model_dir_(const lm_opts *o, run_state *st) {
    int mine = 0;
    zdp_error err;
    const bool stream = st->cfg.zero.stage == 3;
    if (stream) mine = save_model_dir_stream_(o, st, &err);
    if (stream && mine != 0 && st->R == 0)
        fprintf(stderr, "zdp: error: --save-model-dir %s\n", err.msg);
    if (st->R == 0) {
        float **views = st->views; /* stages 0-2: the engine's own tensors */
        if (!stream && views == NULL) mine = 1;
        if (!stream && views != NULL &&
            zdp_hf_save(o->save_model_dir, &st->model, (const float *const *)views,
                        (zdp_dtype)o->save_dtype, 0, &err) != ZDP_OK) {
            fprintf(stderr, "zdp: error: --save-model-dir %s\n", err.msg);
            mine = 1;
        }
        int copied = 0;
        /* A folder without a tokenizer has nothing to copy; that is fine. */
        if (mine == 0 && o->model_dir != NULL)
            (void)zdp_hf_copy_tokenizer(o->model_dir, o->save_model_dir, &copied, &err);
        if (mine == 0)
            printf("saved the model to %s (%s%s)\n", o->save_model_dir,
                   zdp_dtype_name((zdp_dtype)o->save_dtype), copied > 0 ? ", with the tokenizer" : "");
    }
    return zdp_dist_all_ok(mine == 0) ? 0 : 1;
}

/* COLLECTIVE.  --save-adapter-dir, written by rank 0: the PEFT folder.  0,
 * or 1 on every rank when it failed. */
static int save_adapter_dir_(const lm_opts *o, run_state *st) {
    int mine = 0;
    if (st->R == 0) {
        zdp_error err;
        float **views = st->views; /* the whole model, gathered at stage 3 */
        if (views == NULL) mine = 1;
        if (views != NULL &&
            zdp_lora_save_adapter(o->save_adapter_dir, &st->model, (const float *const *)views,
                                  o->model_dir, &err) != ZDP_OK) {
            fprintf(stderr, "zdp: error: --save-adapter-dir %s\n", err.msg);
            mine = 1;
        }
        if (mine == 0) printf("saved the adapter to %s\n", o->save_adapter_dir);
    }
    return zdp_dist_all_ok(mine == 0) ? 0 : 1;
}

int cmd_train_lm(int argc, char **argv) {
    lm_opts o;
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
        char shape[96];
        printf("zdp train: %s T=%d | %d rank(s) | ZeRO stage %d | %s "
               "accumulation | B %lld = b %d x G %lld x W %d | data %s: %lld train tokens, %lld val\n",
               model_shape_(&st, shape, sizeof shape), st.T, st.W,
               st.cfg.zero.stage, managed ? "managed" : "unmanaged",
               (long long)st.cfg.train_batch_size, st.b,
               (long long)st.cfg.gradient_accumulation_steps, st.W,
               st.arith ? "arithmetic corpus" : o.data,
               (long long)zdp_dataset_n_tokens(st.ds, ZDP_SPLIT_TRAIN),
               (long long)zdp_dataset_n_tokens(st.ds, ZDP_SPLIT_VAL));
        if (st.base.self != NULL) {
            const zdp_lora_config *lc = zdp_lora_config_of(&st.model);
            char tn[ZDP_LORA_TARGETS_NAME_MAX];
            zdp_lora_targets_name(lc->targets, lc->modules, tn, sizeof tn);
            printf("LoRA: rank %d, alpha %g, targets %s: %lld adapter parameters train, the "
                   "base's %d tensors are frozen\n",
                   lc->rank, (double)lc->alpha, tn, (long long)zdp_engine_numel(st.eng),
                   st.base.n_params);
        }
        fflush(stdout);
    }

    if ((rc = train_loop_(&o, &st, cursor)) != 0) goto done;
    /* The whole model for the report's sample and the saves (at stage 3
     * every rank takes part in gathering it), only where one needs it. */
    const bool sample = zdp_gpt_config_of(&st.model) != NULL && (st.arith || st.vocab == 256);
    const bool need = sample || o.save_weights != NULL || o.save_adapter_dir != NULL ||
                      (o.save_model_dir != NULL && st.cfg.zero.stage < 3); /* 3 streams it */
    if (need && (st.views = cli_params_views(st.eng, &st.model, true)) == NULL) {
        rc = 1;
        goto done;
    }
    if (st.R == 0) report_end_(&o, &st);
    if (o.save_weights != NULL) rc = save_weights_(&o, &st);
    if (rc == 0 && o.save_model_dir != NULL) rc = save_model_dir_(&o, &st);
    if (rc == 0 && o.save_adapter_dir != NULL) rc = save_adapter_dir_(&o, &st);
    if (rc == 0 && o.memory_report) rc = cli_memory_peaks();
done:
    free(st.inputs);
    free(st.targets);
    if (st.eng != NULL) cli_params_free(st.eng, st.views);
    zdp_engine_destroy(st.eng);
    if (st.base.self != NULL) lora_free_(&st);
    else zdp_model_destroy(&st.model);
    zdp_dataset_destroy(st.ds);
    return rc;
}
