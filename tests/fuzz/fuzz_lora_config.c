/*
 * fuzz_lora_config.c -- libFuzzer target for zdp_lora_read_adapter_config
 * (a PEFT adapter folder's adapter_config.json) on arbitrary bytes.  It must
 * return an error with a message naming the file, leaving *cfg as it was,
 * or succeed; never crash, read out of bounds or leak.  When it succeeds:
 *   - the config is one zdp_lora_create can judge: rank >= 1, alpha > 0 and
 *     finite, targets a non-empty subset of the three groups, modules only
 *     known bits, each in a targeted group;
 *   - a second read gives the same config (deterministic);
 *   - over a tiny base of each family (Llama, GPT-2) for which
 *     zdp_lora_create accepts it, zdp_lora_save_adapter writes a folder that
 *     reads back to a config adapting exactly the same modules, and whose
 *     tensors load back into the LoRA model.
 *
 * Built by tests/fuzz/CMakeLists.txt like the other targets.
 */
#include "fuzz_common.h"

#include <math.h>

#include "zdp/zdp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_lora_config: invariant violated: %s\n", what);
        abort();
    }
}

static int same_modules_(const zdp_lora_config *a, const zdp_lora_config *b) {
    for (int bit = 1; bit <= ZDP_LORA_LM_HEAD; bit <<= 1)
        if (zdp_lora_adapts(a, bit) != zdp_lora_adapts(b, bit)) return 0;
    return 1;
}

/* Over a tiny base of one family: create, save, read back, load back. */
static void round_trip_(const zdp_lora_config *c, int gpt) {
    zdp_model base, lora;
    zdp_error err;
    if (gpt) {
        const zdp_gpt_config g = {.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 11,
                                  .block_size = 4};
        check_(zdp_gpt_create(&g, 1, &base, &err) == ZDP_OK, "the GPT-2 base builds");
    } else {
        const zdp_llama_config l = {.arch = ZDP_ARCH_LLAMA, .n_layer = 1, .hidden = 8,
                                    .n_head = 2, .n_kv_head = 1, .head_dim = 4, .ffn = 12,
                                    .vocab_size = 11, .block_size = 4,
                                    .max_position_embeddings = 4, .rms_norm_eps = 1e-5f,
                                    .rope_theta = 10000.0, .initializer_range = 0.02};
        check_(zdp_llama_create(&l, 1, &base, &err) == ZDP_OK, "the Llama base builds");
    }
    float **bp = calloc((size_t)base.n_params, sizeof *bp);
    for (int i = 0; i < base.n_params; i++) {
        const zdp_param_info *p = &base.params[i];
        bp[i] = calloc((size_t)(p->shape[0] * (p->ndim == 2 ? p->shape[1] : 1)), sizeof(float));
    }
    if (zdp_lora_create(&base, (const float *const *)bp, c, &lora, &err) == ZDP_OK) {
        check_(lora.n_params >= 2 && lora.n_params % 2 == 0, "A and B per adapted module");
        float **ap = calloc((size_t)lora.n_params, sizeof *ap);
        for (int i = 0; i < lora.n_params; i++)
            ap[i] = calloc((size_t)(lora.params[i].shape[0] * lora.params[i].shape[1]),
                           sizeof(float));
        zdp_lora_init_params(&lora, ap);
        char dir[300];
        snprintf(dir, sizeof dir, "%s/out", fuzz_dir());
        check_(zdp_lora_save_adapter(dir, &lora, (const float *const *)ap, "fuzz", &err) ==
                   ZDP_OK,
               "a created adapter saves");
        zdp_lora_config back;
        check_(zdp_lora_read_adapter_config(dir, &back, &err) == ZDP_OK,
               "a saved adapter_config.json reads back");
        check_(back.rank == c->rank && back.alpha == zdp_lora_config_of(&lora)->alpha,
               "rank and alpha read back");
        check_(same_modules_(&back, c), "the saved folder adapts the same modules");
        zdp_model again;
        check_(zdp_lora_create(&base, (const float *const *)bp, &back, &again, &err) == ZDP_OK &&
                   again.n_params == lora.n_params,
               "the config read back builds the same adapter");
        check_(zdp_lora_load_adapter(dir, &again, ap, &err) == ZDP_OK,
               "the saved tensors load back");
        zdp_lora_destroy(&again);
        for (int i = 0; i < lora.n_params; i++) free(ap[i]);
        free(ap);
        zdp_lora_destroy(&lora);
    } else {
        check_(err.msg[0] != '\0' && lora.self == NULL, "a refused create says why");
    }
    for (int i = 0; i < base.n_params; i++) free(bp[i]);
    free(bp);
    zdp_model_destroy(&base);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[300];
    snprintf(path, sizeof path, "%s/adapter_config.json", fuzz_dir());
    fuzz_write_file(path, data, size);
    const zdp_lora_config sentinel = {.rank = -7, .alpha = -7.0f, .targets = -7, .modules = -7};
    zdp_lora_config c = sentinel;
    zdp_error err;
    memset(&err, 0, sizeof err);
    zdp_status s = zdp_lora_read_adapter_config(fuzz_dir(), &c, &err);
    if (s != ZDP_OK) {
        check_(s < 0 && err.code == s, "an error status is negative and matches err.code");
        check_(memchr(err.msg, '\0', sizeof err.msg) != NULL && err.msg[0] != '\0',
               "an error has a message");
        check_(strstr(err.msg, "adapter_config.json") != NULL, "an error names the file");
        check_(memcmp(&c, &sentinel, sizeof c) == 0, "on error the config is untouched");
        return 0;
    }
    check_(c.rank >= 1, "rank >= 1");
    check_(c.alpha > 0.0f && isfinite(c.alpha), "alpha > 0 and finite");
    check_(c.targets > 0 && (c.targets & ~ZDP_LORA_ALL) == 0, "targets: known groups");
    check_((c.modules & ~ZDP_LORA_MODULES_ALL) == 0, "modules: known bits");
    for (int bit = 1; bit <= ZDP_LORA_LM_HEAD; bit <<= 1) {
        int group = 0;
        zdp_lora_module_bit(zdp_lora_module_name(bit), &group);
        check_(!(c.modules & bit) || (c.targets & group), "each module in a targeted group");
    }
    zdp_lora_config again;
    check_(zdp_lora_read_adapter_config(fuzz_dir(), &again, &err) == ZDP_OK &&
               again.rank == c.rank && again.alpha == c.alpha && again.targets == c.targets &&
               again.modules == c.modules,
           "reading is deterministic");
    round_trip_(&c, 0);
    round_trip_(&c, 1);
    return 0;
}
