/*
 * fuzz_hf_config.c -- libFuzzer target for zdp_hf_config_parse (a model
 * folder's config.json) on arbitrary bytes.  It must return an error with a
 * message (and a zeroed config) or succeed; never crash, read out of bounds
 * or leak.  When it succeeds the config must be one zdp can build: sizes
 * >= 1, heads that divide, a positive eps and rope theta, a known rope type
 * with its keys; and parsing must be deterministic (a second parse gives
 * the same values).
 *
 * Built by tests/fuzz/CMakeLists.txt like the other targets.
 */
#include "fuzz_common.h"

#include <math.h>

#include "zdp/zdp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_hf_config: invariant violated: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    zdp_hf_config c, again;
    zdp_error err;
    memset(&err, 0, sizeof err);
    zdp_status s = zdp_hf_config_parse((const char *)data, size, "fuzz/config.json", &c, &err);
    if (s != ZDP_OK) {
        check_(s < 0 && err.code == s, "an error status is negative and matches err.code");
        check_(memchr(err.msg, '\0', sizeof err.msg) != NULL && err.msg[0] != '\0',
               "an error has a message");
        check_(strstr(err.msg, "fuzz/config.json") != NULL, "an error names the file");
        check_(c.family == 0 && c.max_position_embeddings == 0 && c.llama.hidden == 0,
               "on error the config is zeroed");
        return 0;
    }
    check_(c.max_position_embeddings >= 1, "max_position_embeddings >= 1");
    if (c.family == ZDP_HF_GPT2) {
        const zdp_gpt_config *g = &c.gpt;
        check_(g->n_layer >= 1 && g->n_head >= 1 && g->n_embd >= 1 && g->vocab_size >= 1,
               "GPT-2 sizes >= 1");
        check_(g->n_embd % g->n_head == 0, "n_head divides n_embd");
        check_(g->block_size == c.max_position_embeddings, "block_size = n_positions");
    } else {
        check_(c.family == ZDP_HF_LLAMA, "a known family");
        const zdp_llama_config *l = &c.llama;
        check_(l->n_layer >= 1 && l->hidden >= 1 && l->n_head >= 1 && l->n_kv_head >= 1 &&
                   l->head_dim >= 1 && l->ffn >= 1 && l->vocab_size >= 1,
               "Llama sizes >= 1");
        check_(l->n_head % l->n_kv_head == 0, "n_kv_head divides n_head");
        check_(l->rms_norm_eps > 0 && isfinite(l->rms_norm_eps), "rms_norm_eps > 0");
        check_(l->rope_theta > 0 && isfinite(l->rope_theta), "rope_theta > 0");
        check_(l->qk_norm == (l->arch == ZDP_ARCH_QWEN3), "q/k norm exactly for Qwen3");
        check_(l->rope_type == ZDP_ROPE_DEFAULT || l->rope_factor > 0, "a rope factor > 0");
        check_(l->rope_type != ZDP_ROPE_LLAMA3 ||
                   (l->rope_high_freq_factor > l->rope_low_freq_factor &&
                    l->rope_low_freq_factor > 0 && l->rope_original_max_position >= 1),
               "llama3 rope keys in range");
        check_(l->block_size == l->max_position_embeddings, "block_size = max positions");
    }
    check_(zdp_hf_config_parse((const char *)data, size, "fuzz/config.json", &again, &err) ==
                   ZDP_OK &&
               again.family == c.family &&
               again.max_position_embeddings == c.max_position_embeddings &&
               again.llama.hidden == c.llama.hidden && again.llama.head_dim == c.llama.head_dim &&
               again.llama.rope_theta == c.llama.rope_theta && again.gpt.n_embd == c.gpt.n_embd,
           "parsing is deterministic");
    return 0;
}
