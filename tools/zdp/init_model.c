/*
 * init_model.c -- `zdp init-model`: a randomly initialised Llama-family
 * model of any shape, written as a Hugging Face folder (no weights can be
 * downloaded where zdp is tested: tests and demos make their own).
 *
 *   zdp init-model --arch llama|qwen3 --layers N --hidden H --heads NH
 *       [--kv-heads KV] [--head-dim HD] --ffn F --vocab V [--max-pos P]
 *       [--tie | --no-tie] [--attention-bias] [--rope-theta R]
 *       [--rope-scaling llama3:factor,low,high,orig | linear:factor]
 *       [--rms-norm-eps E] [--seed S] [--dtype F32|BF16]
 *       [--max-shard-bytes N] [--tokenizer DIR] --out DIR
 *
 * The weights are transformers' initialisation (zdp_llama_init_params,
 * seeded); the folder is zdp_hf_save's (docs/models.md).  One process: under
 * mpirun every rank would write the same folder, so ranks > 0 do nothing.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "zdp/zdp.h"

int cmd_init_model(int argc, char **argv);

typedef struct init_opts_ {
    zdp_llama_config cfg;
    int tie, bias, dtype;
    const char *rope_scaling, *tokenizer, *out;
    double rope_theta, eps;
    uint64_t seed;
    int64_t max_shard;
} init_opts_;

static void usage_(void) {
    printf("usage: zdp init-model --arch llama|qwen3 --layers N --hidden H --heads NH --ffn F\n"
           "                      --vocab V --out DIR [options]\n"
           "\n"
           "Writes a randomly initialised model (transformers' initialisation, seeded) as a\n"
           "Hugging Face folder: config.json + model.safetensors (docs/models.md).\n"
           "\n"
           "  --arch llama|qwen3        llama: Llama 3, SmolLM2; qwen3: per-head q/k RMSNorm\n"
           "  --layers N  --hidden H  --heads NH  --ffn F  --vocab V   (required)\n"
           "  --kv-heads KV             key/value heads, dividing NH (default NH)\n"
           "  --head-dim HD             (default H / NH)\n"
           "  --max-pos P               max_position_embeddings (default 2048)\n"
           "  --tie | --no-tie          lm_head tied to the embedding (default --no-tie)\n"
           "  --attention-bias          biases on q, k, v and o projections\n"
           "  --rope-theta R            (default 10000)\n"
           "  --rope-scaling llama3:FACTOR,LOW,HIGH,ORIG | linear:FACTOR   (default none)\n"
           "  --rms-norm-eps E          (default 1e-6)\n"
           "  --seed S (42)  --dtype F32|BF16 (F32)\n"
           "  --max-shard-bytes N       shard the safetensors above N bytes (default 5e9)\n"
           "  --tokenizer DIR           copy DIR's tokenizer files into the folder\n"
           "  --out DIR                 the folder (created, with missing parents)\n");
}

/* "llama3:8,1,4,8192" or "linear:2" into cfg.  0 or cli_fail's code. */
static int parse_rope_scaling_(const char *v, zdp_llama_config *c) {
    double f = 0, lo = 0, hi = 0, orig = 0;
    char tail;
    if (sscanf(v, "linear:%lf%c", &f, &tail) == 1 && f > 0) {
        c->rope_type = ZDP_ROPE_LINEAR;
        c->rope_factor = f;
        return 0;
    }
    if (sscanf(v, "llama3:%lf,%lf,%lf,%lf%c", &f, &lo, &hi, &orig, &tail) == 4 && f > 0 &&
        lo > 0 && hi > lo && orig >= 1 && orig <= 1e9 && orig == (double)(int)orig) {
        c->rope_type = ZDP_ROPE_LLAMA3;
        c->rope_factor = f;
        c->rope_low_freq_factor = lo;
        c->rope_high_freq_factor = hi;
        c->rope_original_max_position = (int)orig;
        return 0;
    }
    return cli_fail("--rope-scaling %s: need llama3:FACTOR,LOW,HIGH,ORIG (e.g. "
                    "llama3:8,1,4,8192: factor > 0, 0 < low < high, ORIG an integer >= 1) or "
                    "linear:FACTOR (factor > 0)", v);
}

static int parse_(int argc, char **argv, init_opts_ *o) {
    *o = (init_opts_){.tie = 0, .dtype = ZDP_DTYPE_F32, .rope_theta = 10000.0, .eps = 1e-6,
                      .seed = 42, .max_shard = ZDP_HF_MAX_SHARD_BYTES};
    o->cfg = (zdp_llama_config){.max_position_embeddings = 2048, .initializer_range = 0.02,
                                .rope_factor = 1.0};
    int arch = -1;
    static const char *const archs[] = {"llama", "qwen3", NULL};
    static const int arch_values[] = {ZDP_ARCH_LLAMA, ZDP_ARCH_QWEN3};
    static const char *const dtypes[] = {"F32", "BF16", NULL};
    static const int dtype_values[] = {ZDP_DTYPE_F32, ZDP_DTYPE_BF16};
    const int big = 1 << 24;
    zdp_llama_config *c = &o->cfg;
    const cli_opt opts[] = {
        CLI_CHOICE("--arch", &arch, archs, arch_values, "llama or qwen3"),
        CLI_INT("--layers", &c->n_layer, 1, 100000, "need a positive integer"),
        CLI_INT("--hidden", &c->hidden, 1, big, "need a positive integer"),
        CLI_INT("--heads", &c->n_head, 1, big, "need a positive integer"),
        CLI_INT("--kv-heads", &c->n_kv_head, 1, big, "need a positive integer dividing --heads"),
        CLI_INT("--head-dim", &c->head_dim, 1, big, "need a positive integer"),
        CLI_INT("--ffn", &c->ffn, 1, big, "need a positive integer"),
        CLI_INT("--vocab", &c->vocab_size, 1, INT32_MAX, "need a positive integer"),
        CLI_INT("--max-pos", &c->max_position_embeddings, 1, INT32_MAX, "need a positive integer"),
        CLI_FLAG("--tie", &o->tie, 1),
        CLI_FLAG("--no-tie", &o->tie, 0),
        CLI_FLAG("--attention-bias", &o->bias, 1),
        CLI_F64("--rope-theta", &o->rope_theta, 1e-9, 1e30, "need a number > 0"),
        CLI_WORD("--rope-scaling", &o->rope_scaling, NULL, NULL),
        CLI_F64("--rms-norm-eps", &o->eps, 1e-30, 1.0, "need a number in (0, 1]"),
        CLI_U64("--seed", &o->seed, 0, INT64_MAX, "need an integer >= 0"),
        CLI_CHOICE("--dtype", &o->dtype, dtypes, dtype_values, "F32 or BF16"),
        CLI_I64("--max-shard-bytes", &o->max_shard, 1, INT64_MAX, "need an integer >= 1"),
        CLI_WORD("--tokenizer", &o->tokenizer, NULL, NULL),
        CLI_WORD("--out", &o->out, NULL, NULL),
    };
    static const cli_command cmd = {.missing = "expected an option (see zdp init-model --help)",
                                    .unknown = " (see zdp init-model --help)", .dashes = true};
    int rc = cli_parse_options(&cmd, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv);
    if (rc == 1) usage_();
    if (rc != 0) return rc;
    static const struct { const char *flag; int set; } need[] = {{"--arch", 0}, {"--layers", 0},
        {"--hidden", 0}, {"--heads", 0}, {"--ffn", 0}, {"--vocab", 0}, {"--out", 0}};
    const int have[] = {arch >= 0, c->n_layer > 0, c->hidden > 0, c->n_head > 0, c->ffn > 0,
                        c->vocab_size > 0, o->out != NULL};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!have[i]) return cli_fail("%s is required (see zdp init-model --help)", need[i].flag);
    c->arch = (zdp_llama_arch)arch;
    c->qk_norm = arch == ZDP_ARCH_QWEN3;
    if (c->n_kv_head == 0) c->n_kv_head = c->n_head;
    if (c->head_dim == 0) {
        if (c->hidden % c->n_head != 0)
            return cli_fail("--hidden %d is not a multiple of --heads %d: give --head-dim",
                            c->hidden, c->n_head);
        c->head_dim = c->hidden / c->n_head;
    }
    if (c->n_head % c->n_kv_head != 0)
        return cli_fail("--kv-heads %d: must divide --heads %d (grouped-query attention)",
                        c->n_kv_head, c->n_head);
    c->tie_word_embeddings = o->tie;
    c->attention_bias = o->bias;
    c->rope_theta = o->rope_theta;
    c->rms_norm_eps = (float)o->eps;
    if (o->rope_scaling != NULL && (rc = parse_rope_scaling_(o->rope_scaling, c)) != 0) return rc;
    /* Activations for one token only: nothing runs, the model only holds
     * the parameter list. */
    c->block_size = 1;
    return 0;
}

int cmd_init_model(int argc, char **argv) {
    init_opts_ o;
    int rc = parse_(argc, argv, &o);
    if (rc == 1) return 0;
    if (rc != 0) return rc;
    if (zdp_dist_rank() != 0) return 0;
    zdp_error err;
    zdp_model model = {0};
    if (zdp_llama_create(&o.cfg, 1, &model, &err) != ZDP_OK) return cli_fail("%s", err.msg);
    float **views = calloc((size_t)model.n_params, sizeof *views);
    int64_t total = 0;
    for (int i = 0; views != NULL && i < model.n_params; i++) {
        int64_t n = 1;
        for (int d = 0; d < model.params[i].ndim; d++) n *= model.params[i].shape[d];
        total += n;
        views[i] = malloc((size_t)n * sizeof(float));
        if (views[i] == NULL) rc = cli_fail("out of memory for %s", model.params[i].name);
    }
    if (views == NULL) rc = cli_fail("out of memory");
    if (rc == 0) {
        zdp_llama_init_params(&model, views, o.seed);
        if (zdp_hf_save(o.out, &model, (const float *const *)views, (zdp_dtype)o.dtype,
                        o.max_shard, &err) != ZDP_OK)
            rc = cli_fail("--out %s", err.msg);
    }
    int copied = 0;
    if (rc == 0 && o.tokenizer != NULL &&
        zdp_hf_copy_tokenizer(o.tokenizer, o.out, &copied, &err) != ZDP_OK)
        rc = cli_fail("--tokenizer %s", err.msg);
    if (rc == 0)
        printf("wrote %s: %s, %d layers, hidden %d, %d heads (%d KV, head_dim %d), ffn %d, "
               "vocab %d, %s; %lld parameters in %s%s\n", o.out,
               o.cfg.arch == ZDP_ARCH_QWEN3 ? "qwen3" : "llama", o.cfg.n_layer, o.cfg.hidden,
               o.cfg.n_head, o.cfg.n_kv_head, o.cfg.head_dim, o.cfg.ffn, o.cfg.vocab_size,
               o.cfg.tie_word_embeddings ? "tied" : "untied", (long long)total,
               zdp_dtype_name((zdp_dtype)o.dtype), copied > 0 ? ", with the tokenizer" : "");
    for (int i = 0; views != NULL && i < model.n_params; i++) free(views[i]);
    free(views);
    zdp_model_destroy(&model);
    return rc;
}
