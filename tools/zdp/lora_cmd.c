/*
 * lora_cmd.c -- `zdp lora merge`: a base model folder and a PEFT adapter
 * folder into one merged model folder (docs/lora.md).
 *
 *   zdp lora merge --model-dir BASE --adapter DIR --out OUT [--dtype F32|BF16]
 *
 * Each targeted weight becomes W + (alpha / r) B A in the base's layout
 * (GPT-2's Conv1D weights take the transpose, as PEFT merges them with
 * fan_in_fan_out).  An lm_head adapter on a tied Llama-family base unties
 * the head: the folder gets lm_head.weight = embedding + product and
 * tie_word_embeddings false, the embedding unchanged.  GPT-2 always ties
 * its head, so an lm_head adapter on it is refused.  One process: ranks > 0
 * do nothing.  A GPT-2 base is built with block_size n_positions (its wpe
 * has that many rows), so its activations for one sequence of that length
 * are allocated, if never used.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "zdp/zdp.h"

int cmd_lora(int argc, char **argv);

static void usage_(void) {
    printf("usage: zdp lora merge --model-dir BASE --adapter DIR --out OUT [--dtype F32|BF16]\n"
           "\n"
           "Writes BASE with the PEFT adapter in DIR (adapter_config.json,\n"
           "adapter_model.safetensors) merged in, W + (lora_alpha / r) B A on each targeted\n"
           "weight, as a Hugging Face folder OUT with BASE's tokenizer (docs/lora.md).\n"
           "\n"
           "  --model-dir BASE          the base model folder the adapter was trained on\n"
           "  --adapter DIR             the adapter folder (zdp train --save-adapter-dir)\n"
           "  --out OUT                 the merged folder (created; its parent must exist)\n"
           "  --dtype F32|BF16 (F32)    the dtype written\n");
}

static float **alloc_(const zdp_model *m) {
    float **p = calloc((size_t)m->n_params, sizeof *p);
    for (int i = 0; p != NULL && i < m->n_params; i++) {
        int64_t n = 1;
        for (int d = 0; d < m->params[i].ndim; d++) n *= m->params[i].shape[d];
        if ((p[i] = malloc((size_t)n * sizeof(float))) == NULL) return p; /* caller checks */
    }
    return p;
}

static bool complete_(float **p, const zdp_model *m) {
    for (int i = 0; p != NULL && i < m->n_params; i++)
        if (p[i] == NULL) return false;
    return p != NULL;
}

static void free_(float **p, const zdp_model *m) {
    for (int i = 0; p != NULL && i < m->n_params; i++) free(p[i]);
    free(p);
}

static int merge_(const char *base_dir, const char *adapter_dir, const char *out, int dtype) {
    zdp_error err;
    zdp_hf_config hc;
    zdp_model base = {0}, lora = {0}, untied = {0};
    float **bp = NULL, **ap = NULL, **merged = NULL;
    int rc = 0;
    if (zdp_hf_config_read(base_dir, &hc, &err) != ZDP_OK)
        return cli_fail("--model-dir %s", err.msg);
    /* Nothing runs: the model only holds the parameter list, so one token of
     * activations -- except GPT-2, whose wpe has block_size rows: all of the
     * folder's n_positions, so that the merged folder keeps every row. */
    const int block = hc.family == ZDP_HF_GPT2 ? hc.max_position_embeddings : 1;
    if (zdp_hf_model_create(&hc, block, 1, &base, &err) != ZDP_OK)
        return cli_fail("--model-dir %s: %s", base_dir, err.msg);
    bp = alloc_(&base);
    if (!complete_(bp, &base)) rc = cli_fail("out of memory for the base weights");
    if (rc == 0 && zdp_hf_weights_load(base_dir, &base, bp, &err) != ZDP_OK)
        rc = cli_fail("--model-dir %s", err.msg);
    zdp_lora_config lc;
    if (rc == 0 && zdp_lora_read_adapter_config(adapter_dir, &lc, &err) != ZDP_OK)
        rc = cli_fail("--adapter %s", err.msg);
    if (rc == 0 && zdp_lora_create(&base, (const float *const *)bp, &lc, &lora, &err) != ZDP_OK)
        rc = cli_fail("--adapter %s: %s", adapter_dir, err.msg);
    if (rc == 0) {
        ap = alloc_(&lora);
        if (!complete_(ap, &lora)) rc = cli_fail("out of memory for the adapter");
    }
    if (rc == 0 && zdp_lora_load_adapter(adapter_dir, &lora, ap, &err) != ZDP_OK)
        rc = cli_fail("--adapter %s", err.msg);
    /* A tied Llama-family head with an adapter: write an untied model. */
    const zdp_llama_config *llc = zdp_llama_config_of(&base);
    const bool untie = rc == 0 && (lc.targets & ZDP_LORA_UNEMBED) && llc != NULL &&
                       llc->tie_word_embeddings;
    const zdp_model *outm = &base;
    if (rc == 0 && untie) {
        zdp_llama_config uc = *llc;
        uc.tie_word_embeddings = 0;
        if (zdp_llama_create(&uc, 1, &untied, &err) != ZDP_OK) rc = cli_fail("%s", err.msg);
        outm = &untied;
    }
    if (rc == 0) {
        merged = alloc_(outm);
        if (!complete_(merged, outm)) rc = cli_fail("out of memory for the merged weights");
    }
    if (rc == 0 &&
        zdp_lora_merge(&lora, (const float *const *)ap, merged,
                       untie ? merged[outm->n_params - 1] : NULL, &err) != ZDP_OK)
        rc = cli_fail("--adapter %s: %s", adapter_dir, err.msg);
    if (rc == 0 && zdp_hf_save(out, outm, (const float *const *)merged, (zdp_dtype)dtype, 0,
                               &err) != ZDP_OK)
        rc = cli_fail("--out %s", err.msg);
    int copied = 0;
    if (rc == 0) (void)zdp_hf_copy_tokenizer(base_dir, out, &copied, &err);
    if (rc == 0) {
        char tn[ZDP_LORA_TARGETS_NAME_MAX];
        zdp_lora_targets_name(lc.targets, lc.modules, tn, sizeof tn);
        printf("merged %s (rank %d, alpha %g, %s) into %s: %s (%s%s%s)\n", adapter_dir, lc.rank,
               (double)lc.alpha, tn, base_dir, out, zdp_dtype_name((zdp_dtype)dtype),
               untie ? ", lm_head untied" : "", copied > 0 ? ", with the tokenizer" : "");
    }
    free_(merged, outm);
    free_(ap, &lora);
    zdp_lora_destroy(&lora);
    free_(bp, &base);
    zdp_model_destroy(&untied);
    zdp_model_destroy(&base);
    return rc;
}

int cmd_lora(int argc, char **argv) {
    if (argc < 1 || strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0) {
        usage_();
        return argc < 1 ? cli_fail("expected a subcommand: merge (see zdp lora --help)") : 0;
    }
    if (strcmp(argv[0], "merge") != 0)
        return cli_fail("lora %s: unknown subcommand; the one there is: merge", argv[0]);
    const char *base = NULL, *adapter = NULL, *out = NULL;
    int dtype = ZDP_DTYPE_F32;
    static const char *const dtypes[] = {"F32", "BF16", NULL};
    static const int dtype_values[] = {ZDP_DTYPE_F32, ZDP_DTYPE_BF16};
    const cli_opt opts[] = {
        CLI_WORD("--model-dir", &base, NULL, NULL),
        CLI_WORD("--adapter", &adapter, NULL, NULL),
        CLI_WORD("--out", &out, NULL, NULL),
        CLI_CHOICE("--dtype", &dtype, dtypes, dtype_values, "F32 or BF16"),
    };
    static const cli_command cmd = {.missing = "expected an option (see zdp lora --help)",
                                    .unknown = " (see zdp lora --help)", .dashes = true};
    int rc = cli_parse_options(&cmd, opts, (int)(sizeof opts / sizeof opts[0]), argc - 1,
                               argv + 1);
    if (rc == 1) {
        usage_();
        return 0;
    }
    if (rc != 0) return rc;
    if (base == NULL || adapter == NULL || out == NULL)
        return cli_fail("lora merge needs --model-dir BASE, --adapter DIR and --out OUT");
    if (zdp_dist_rank() != 0) return 0;
    if ((rc = cli_check_output("--out", out, true)) != 0) return rc;
    return merge_(base, adapter, out, dtype);
}
