/*
 * hf.c -- Hugging Face checkpoint folders (zdp/hf.h): config.json into a
 * zdp config and back, the model a folder describes, and (sharded)
 * safetensors weights in and out.
 *
 * The config reader's rule: every key that changes the math is read, with
 * transformers' default (configuration_llama.py, configuration_qwen3.py,
 * configuration_gpt2.py) when absent; a key that would change the math in a
 * way zdp does not compute is refused by name, so a folder either trains
 * exactly as transformers would run it or not at all.  Keys that do not
 * change the math (token ids, torch_dtype, use_cache) are ignored.
 *
 * The weights reader keeps every shard in memory until all checks passed,
 * so a bad folder leaves the caller's parameters untouched.
 *
 * Depends on the models (zdp_gpt_create, zdp_llama_create) through the
 * public API only: the factory lives here, next to the reader that needs it.
 */
#define _POSIX_C_SOURCE 200809L

#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "../core/json.h"

#define HF_CONFIG "config.json"
#define HF_SINGLE "model.safetensors"
#define HF_INDEX "model.safetensors.index.json"
#define HF_PATH_MAX 4096
#define HF_GPT_PREFIX "transformer."

/* ---- config.json: reading keys -------------------------------------------- */

/* The parse state: the file's name for messages and its root object. */
typedef struct hf_cfg_ {
    const char *path;
    json_t *root;
} hf_cfg_;

static bool hf_present_(const hf_cfg_ *c, const char *key) {
    json_t *v = json_object_get(c->root, key);
    return v != NULL && !json_is_null(v);
}

/* An integer key in [lo, hi], `def` when absent or null. */
static zdp_status hf_int_(const hf_cfg_ *c, json_t *obj, const char *key, long long def,
                          long long lo, long long hi, int *out, zdp_error *err) {
    json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        *out = (int)def;
        return ZDP_OK;
    }
    /* 4.0 is an integer too (some exporters write floats). */
    double d = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : NAN;
    if (!json_is_number(v) || d != floor(d))
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: key \"%s\" is %s, expected an integer; fix the file", c->path, key,
                           zdp_json_type_name(v));
    if (d < (double)lo || d > (double)hi)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "%s: key \"%s\" = %.0f is out of range: expected %lld..%lld; fix the "
                           "file", c->path, key, d, lo, hi);
    *out = (int)d;
    return ZDP_OK;
}

/* A number key, `def` when absent or null; must be > 0 when positive. */
static zdp_status hf_num_(const hf_cfg_ *c, json_t *obj, const char *key, double def,
                          bool positive, double *out, zdp_error *err) {
    json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        *out = def;
        return ZDP_OK;
    }
    if (!json_is_number(v))
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: key \"%s\" is %s, expected a number; fix "
                           "the file", c->path, key, zdp_json_type_name(v));
    *out = json_number_value(v);
    if (!isfinite(*out) || (positive && !(*out > 0)))
        return zdp_err_set(err, ZDP_ERR_CONFIG, "%s: key \"%s\" = %g: expected a number > 0; "
                           "fix the file", c->path, key, *out);
    return ZDP_OK;
}

static zdp_status hf_bool_(const hf_cfg_ *c, const char *key, bool def, bool *out,
                           zdp_error *err) {
    json_t *v = json_object_get(c->root, key);
    if (v == NULL || json_is_null(v)) {
        *out = def;
        return ZDP_OK;
    }
    if (!json_is_boolean(v))
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: key \"%s\" is %s, expected true or false; "
                           "fix the file", c->path, key, zdp_json_type_name(v));
    *out = json_is_true(v);
    return ZDP_OK;
}

/* A string key; `def` when absent or null. */
static zdp_status hf_str_(const hf_cfg_ *c, json_t *obj, const char *key, const char *def,
                          const char **out, zdp_error *err) {
    json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        *out = def;
        return ZDP_OK;
    }
    if (!json_is_string(v))
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: key \"%s\" is %s, expected a string; fix "
                           "the file", c->path, key, zdp_json_type_name(v));
    *out = json_string_value(v);
    return ZDP_OK;
}

/* ---- config.json: what zdp refuses ------------------------------------------ */

/* Keys of mixture-of-experts models (Mixtral, Qwen3-MoE, DeepSeek): a
 * positive value means experts, which zdp does not compute. */
static const char *const hf_moe_keys_[] = {
    "num_experts", "num_local_experts", "num_experts_per_tok", "n_routed_experts",
    "moe_intermediate_size", "n_shared_experts",
};

static zdp_status hf_refuse_moe_(const hf_cfg_ *c, zdp_error *err) {
    for (size_t i = 0; i < sizeof hf_moe_keys_ / sizeof hf_moe_keys_[0]; i++) {
        json_t *v = json_object_get(c->root, hf_moe_keys_[i]);
        if (v == NULL || json_is_null(v) || (json_is_number(v) && json_number_value(v) == 0))
            continue;
        char buf[64];
        snprintf(buf, sizeof buf, "%g", json_is_number(v) ? json_number_value(v) : NAN);
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                           "%s: key \"%s\" = %s: a mixture-of-experts model; zdp trains dense "
                           "Llama, Qwen3 and GPT-2 models only (Qwen3-MoE, Mixtral and the like "
                           "cannot be loaded)", c->path, hf_moe_keys_[i],
                           json_is_number(v) ? buf : zdp_json_type_name(v));
    }
    return ZDP_OK;
}

/* Qwen3's sliding-window attention (use_sliding_window, layer_types). */
static zdp_status hf_refuse_sliding_(const hf_cfg_ *c, zdp_error *err) {
    bool sliding = false;
    zdp_status s = hf_bool_(c, "use_sliding_window", false, &sliding, err);
    if (s != ZDP_OK) return s;
    if (sliding)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                           "%s: key \"use_sliding_window\" = true: zdp's attention is full "
                           "causal attention, not a sliding window; set it to false only if "
                           "the model was trained without one", c->path);
    json_t *lt = json_object_get(c->root, "layer_types");
    if (lt == NULL || json_is_null(lt)) return ZDP_OK;
    if (!json_is_array(lt))
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: key \"layer_types\" is %s, expected an "
                           "array of strings", c->path, zdp_json_type_name(lt));
    for (size_t i = 0; i < json_array_size(lt); i++) {
        const char *t = json_string_value(json_array_get(lt, i));
        if (t == NULL || strcmp(t, "full_attention") != 0)
            return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                               "%s: key \"layer_types\"[%zu] = \"%s\": zdp computes only "
                               "\"full_attention\" layers (no sliding windows)", c->path, i,
                               t != NULL ? t : zdp_json_type_name(json_array_get(lt, i)));
    }
    return ZDP_OK;
}

/* ---- config.json: the Llama family ---------------------------------------- */

/* The rope keys: rope_scaling (transformers 4) or rope_parameters
 * (transformers 5, which moves rope_theta inside it). */
static zdp_status hf_rope_(const hf_cfg_ *c, zdp_llama_config *m, zdp_error *err) {
    double theta = 10000.0;
    zdp_status s = hf_num_(c, c->root, "rope_theta", 10000.0, true, &theta, err);
    if (s != ZDP_OK) return s;
    m->rope_theta = theta;
    m->rope_type = ZDP_ROPE_DEFAULT;
    const char *key = "rope_scaling";
    json_t *r = json_object_get(c->root, key);
    if (r == NULL || json_is_null(r)) {
        key = "rope_parameters";
        r = json_object_get(c->root, key);
    }
    if (r == NULL || json_is_null(r)) return ZDP_OK;
    if (!json_is_object(r))
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: key \"%s\" is %s, expected an object or "
                           "null", c->path, key, zdp_json_type_name(r));
    if (json_object_get(r, "rope_theta") != NULL) {
        s = hf_num_(c, r, "rope_theta", theta, true, &m->rope_theta, err);
        if (s != ZDP_OK) return s;
    }
    const char *type = NULL;
    s = hf_str_(c, r, "rope_type", NULL, &type, err);
    if (s == ZDP_OK && type == NULL) s = hf_str_(c, r, "type", "default", &type, err);
    if (s != ZDP_OK) return s;
    if (strcmp(type, "default") == 0) return ZDP_OK;
    if (strcmp(type, "linear") != 0 && strcmp(type, "llama3") != 0)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                           "%s: key \"%s\".rope_type = \"%s\": zdp computes rotary embeddings "
                           "of type default, linear and llama3 only (not dynamic, yarn, "
                           "longrope, ...)", c->path, key, type);
    json_t *f = json_object_get(r, "factor");
    if (f == NULL || json_is_null(f))
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: key \"%s\".factor is missing; rope type "
                           "\"%s\" needs it", c->path, key, type);
    s = hf_num_(c, r, "factor", 1.0, true, &m->rope_factor, err);
    if (s != ZDP_OK) return s;
    m->rope_type = strcmp(type, "linear") == 0 ? ZDP_ROPE_LINEAR : ZDP_ROPE_LLAMA3;
    if (m->rope_type == ZDP_ROPE_LINEAR) return ZDP_OK;
    static const char *const need[] = {"low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings"};
    for (int i = 0; i < 3; i++) {
        json_t *v = json_object_get(r, need[i]);
        if (v == NULL || json_is_null(v))
            return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: key \"%s\".%s is missing; rope type "
                               "\"llama3\" needs factor, low_freq_factor, high_freq_factor and "
                               "original_max_position_embeddings", c->path, key, need[i]);
    }
    s = hf_num_(c, r, "low_freq_factor", 1.0, true, &m->rope_low_freq_factor, err);
    if (s == ZDP_OK) s = hf_num_(c, r, "high_freq_factor", 4.0, true, &m->rope_high_freq_factor, err);
    if (s == ZDP_OK)
        s = hf_int_(c, r, "original_max_position_embeddings", 8192, 1, INT32_MAX,
                    &m->rope_original_max_position, err);
    if (s == ZDP_OK && m->rope_high_freq_factor <= m->rope_low_freq_factor)
        s = zdp_err_set(err, ZDP_ERR_CONFIG, "%s: key \"%s\": high_freq_factor = %g must be "
                        "greater than low_freq_factor = %g (llama3 rope divides by their "
                        "difference)", c->path, key, m->rope_high_freq_factor,
                        m->rope_low_freq_factor);
    return s;
}

static zdp_status hf_parse_llama_(const hf_cfg_ *c, bool qwen3, zdp_hf_config *out,
                                  zdp_error *err) {
    zdp_llama_config *m = &out->llama;
    *m = (zdp_llama_config){.arch = qwen3 ? ZDP_ARCH_QWEN3 : ZDP_ARCH_LLAMA, .qk_norm = qwen3};
    json_t *root = c->root;
    const int big = 1 << 24;
    /* transformers' defaults: configuration_llama.py / configuration_qwen3.py. */
    zdp_status s = hf_int_(c, root, "vocab_size", qwen3 ? 151936 : 32000, 1, INT32_MAX,
                           &m->vocab_size, err);
    if (s == ZDP_OK) s = hf_int_(c, root, "hidden_size", 4096, 1, big, &m->hidden, err);
    if (s == ZDP_OK)
        s = hf_int_(c, root, "intermediate_size", qwen3 ? 22016 : 11008, 1, big, &m->ffn, err);
    if (s == ZDP_OK) s = hf_int_(c, root, "num_hidden_layers", 32, 1, 100000, &m->n_layer, err);
    if (s == ZDP_OK) s = hf_int_(c, root, "num_attention_heads", 32, 1, big, &m->n_head, err);
    if (s == ZDP_OK)
        s = hf_int_(c, root, "num_key_value_heads", m->n_head, 1, big, &m->n_kv_head, err);
    /* Llama: hidden / heads; Qwen3: 128 (its head_dim is not derived). */
    if (s == ZDP_OK)
        s = hf_int_(c, root, "head_dim", qwen3 ? 128 : m->hidden / m->n_head, 1, big,
                    &m->head_dim, err);
    if (s == ZDP_OK)
        s = hf_int_(c, root, "max_position_embeddings", qwen3 ? 32768 : 2048, 1, INT32_MAX,
                    &m->max_position_embeddings, err);
    double d = 0;
    if (s == ZDP_OK) s = hf_num_(c, root, "rms_norm_eps", 1e-6, true, &d, err);
    m->rms_norm_eps = (float)d;
    /* zdp computes in fp32: an eps that rounds to 0 or overflows is no eps. */
    if (s == ZDP_OK && !(m->rms_norm_eps > 0 && isfinite(m->rms_norm_eps)))
        s = zdp_err_set(err, ZDP_ERR_CONFIG, "%s: key \"rms_norm_eps\" = %g is %s in fp32; fix "
                        "the file", c->path, d, m->rms_norm_eps > 0 ? "infinite" : "0");
    if (s == ZDP_OK) s = hf_num_(c, root, "initializer_range", 0.02, false, &m->initializer_range, err);
    if (s == ZDP_OK && m->initializer_range < 0)
        s = zdp_err_set(err, ZDP_ERR_CONFIG, "%s: key \"initializer_range\" = %g: expected a "
                        "number >= 0 (a standard deviation); fix the file", c->path,
                        m->initializer_range);
    if (s == ZDP_OK) s = hf_rope_(c, m, err);
    bool b = false;
    if (s == ZDP_OK) s = hf_bool_(c, "attention_bias", false, &b, err);
    m->attention_bias = b;
    if (s == ZDP_OK) s = hf_bool_(c, "tie_word_embeddings", false, &b, err);
    m->tie_word_embeddings = b;
    if (s != ZDP_OK) return s;
    if (m->hidden % m->n_head != 0 && !hf_present_(c, "head_dim") && !qwen3)
        return zdp_err_set(err, ZDP_ERR_CONFIG, "%s: key \"hidden_size\" = %d is not a multiple "
                           "of \"num_attention_heads\" = %d, and no \"head_dim\" is given; fix "
                           "the file", c->path, m->hidden, m->n_head);
    if (m->n_head % m->n_kv_head != 0)
        return zdp_err_set(err, ZDP_ERR_CONFIG, "%s: key \"num_key_value_heads\" = %d does not "
                           "divide \"num_attention_heads\" = %d (grouped-query attention shares "
                           "each KV head among NH / KV query heads); fix the file", c->path,
                           m->n_kv_head, m->n_head);
    if (m->rope_type == ZDP_ROPE_DEFAULT) m->rope_factor = 1.0;

    /* What zdp does not compute. */
    const char *act = NULL;
    s = hf_str_(c, root, "hidden_act", "silu", &act, err);
    if (s != ZDP_OK) return s;
    if (strcmp(act, "silu") != 0)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED, "%s: key \"hidden_act\" = \"%s\": zdp's "
                           "Llama-family MLP is SwiGLU with \"silu\" only", c->path, act);
    if (s == ZDP_OK) s = hf_bool_(c, "mlp_bias", false, &b, err);
    if (s != ZDP_OK) return s;
    if (b)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED, "%s: key \"mlp_bias\" = true: zdp's MLP "
                           "projections have no biases (only attention_bias is supported)",
                           c->path);
    int tp = 1;
    s = hf_int_(c, root, "pretraining_tp", 1, 0, INT32_MAX, &tp, err);
    if (s != ZDP_OK) return s;
    if (tp > 1)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED, "%s: key \"pretraining_tp\" = %d: zdp "
                           "computes the projections whole (pretraining_tp 1); set it to 1 if "
                           "the sliced computation is not needed", c->path, tp);
    s = hf_num_(c, root, "attention_dropout", 0.0, false, &d, err);
    if (s != ZDP_OK) return s;
    if (d != 0.0)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED, "%s: key \"attention_dropout\" = %g: zdp "
                           "trains without dropout; set it to 0.0", c->path, d);
    s = hf_refuse_moe_(c, err);
    if (s == ZDP_OK && qwen3) s = hf_refuse_sliding_(c, err);
    if (s != ZDP_OK) return s;
    m->block_size = m->max_position_embeddings;
    out->family = ZDP_HF_LLAMA;
    out->max_position_embeddings = m->max_position_embeddings;
    return ZDP_OK;
}

/* ---- config.json: GPT-2 ------------------------------------------------------ */

static zdp_status hf_parse_gpt2_(const hf_cfg_ *c, zdp_hf_config *out, zdp_error *err) {
    zdp_gpt_config *g = &out->gpt;
    json_t *root = c->root;
    const int big = 1 << 24;
    /* configuration_gpt2.py's defaults. */
    zdp_status s = hf_int_(c, root, "vocab_size", 50257, 1, INT32_MAX, &g->vocab_size, err);
    if (s == ZDP_OK) s = hf_int_(c, root, "n_embd", 768, 1, big, &g->n_embd, err);
    if (s == ZDP_OK) s = hf_int_(c, root, "n_layer", 12, 1, 100000, &g->n_layer, err);
    if (s == ZDP_OK) s = hf_int_(c, root, "n_head", 12, 1, big, &g->n_head, err);
    if (s == ZDP_OK) s = hf_int_(c, root, "n_positions", 1024, 1, INT32_MAX, &g->block_size, err);
    if (s != ZDP_OK) return s;
    if (g->n_embd % g->n_head != 0)
        return zdp_err_set(err, ZDP_ERR_CONFIG, "%s: key \"n_head\" = %d does not divide "
                           "\"n_embd\" = %d; fix the file", c->path, g->n_head, g->n_embd);
    const char *act = NULL;
    s = hf_str_(c, root, "activation_function", "gelu_new", &act, err);
    if (s != ZDP_OK) return s;
    if (strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED, "%s: key \"activation_function\" = \"%s\": "
                           "zdp's GPT-2 computes the tanh GELU (\"gelu_new\") only", c->path, act);
    int inner = 0;
    s = hf_int_(c, root, "n_inner", 4 * (long long)g->n_embd, 1, INT32_MAX, &inner, err);
    if (s != ZDP_OK) return s;
    if (inner != 4 * g->n_embd)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED, "%s: key \"n_inner\" = %d: zdp's GPT-2 MLP "
                           "is 4 x n_embd = %d wide", c->path, inner, 4 * g->n_embd);
    double eps;
    s = hf_num_(c, root, "layer_norm_epsilon", 1e-5, true, &eps, err);
    if (s != ZDP_OK) return s;
    if (eps != 1e-5)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED, "%s: key \"layer_norm_epsilon\" = %g: zdp's "
                           "LayerNorm uses 1e-05", c->path, eps);
    /* Switches whose non-default value changes the math. */
    static const struct { const char *key; bool def; } sw[] = {
        {"scale_attn_weights", true}, {"scale_attn_by_inverse_layer_idx", false},
        {"add_cross_attention", false}, {"tie_word_embeddings", true},
    };
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++) {
        bool v = sw[i].def;
        s = hf_bool_(c, sw[i].key, sw[i].def, &v, err);
        if (s != ZDP_OK) return s;
        if (v != sw[i].def)
            return zdp_err_set(err, ZDP_ERR_UNSUPPORTED, "%s: key \"%s\" = %s: zdp's GPT-2 "
                               "computes only %s = %s", c->path, sw[i].key, v ? "true" : "false",
                               sw[i].key, sw[i].def ? "true" : "false");
    }
    s = hf_refuse_moe_(c, err);
    if (s != ZDP_OK) return s;
    out->family = ZDP_HF_GPT2;
    out->max_position_embeddings = g->block_size;
    return ZDP_OK;
}

/* ---- config.json: entry points -------------------------------------------------- */

static const struct {
    const char *model_type, *arch;
} hf_types_[] = {
    {"llama", "LlamaForCausalLM"},
    {"qwen3", "Qwen3ForCausalLM"},
    {"gpt2", "GPT2LMHeadModel"},
};
#define HF_NTYPES ((int)(sizeof hf_types_ / sizeof hf_types_[0]))

zdp_status zdp_hf_config_parse(const char *text, size_t len, const char *path,
                               zdp_hf_config *out, zdp_error *err) {
    if (text == NULL || out == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_config_parse: text and out must "
                           "not be NULL");
    if (path == NULL) path = HF_CONFIG;
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL)
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d); "
                           "a model folder's config.json is what save_pretrained writes", path,
                           je.text, je.line, je.column);
    hf_cfg_ c = {.path = path, .root = root};
    zdp_status s = ZDP_OK;
    const char *mt = NULL;
    int t = 0;
    if (!json_is_object(root)) {
        s = zdp_err_set(err, ZDP_ERR_FORMAT, "%s: the top level is %s, expected an object", path,
                        zdp_json_type_name(root));
        goto done;
    }
    s = hf_str_(&c, root, "model_type", NULL, &mt, err);
    if (s != ZDP_OK) goto done;
    if (mt == NULL) {
        s = zdp_err_set(err, ZDP_ERR_FORMAT, "%s: key \"model_type\" is missing; zdp reads "
                        "\"llama\", \"qwen3\" and \"gpt2\" folders (add the key as "
                        "save_pretrained writes it)", path);
        goto done;
    }
    while (t < HF_NTYPES && strcmp(hf_types_[t].model_type, mt) != 0) t++;
    if (t == HF_NTYPES) {
        s = zdp_err_set(err, ZDP_ERR_UNSUPPORTED, "%s: key \"model_type\" = \"%s\": zdp loads "
                        "\"llama\" (Llama 3, SmolLM2), \"qwen3\" and \"gpt2\" models only", path,
                        mt);
        goto done;
    }
    json_t *archs = json_object_get(root, "architectures");
    if (archs != NULL && !json_is_null(archs)) {
        if (!json_is_array(archs)) {
            s = zdp_err_set(err, ZDP_ERR_FORMAT, "%s: key \"architectures\" is %s, expected an "
                            "array of strings", path, zdp_json_type_name(archs));
            goto done;
        }
        for (size_t i = 0; i < json_array_size(archs); i++) {
            const char *a = json_string_value(json_array_get(archs, i));
            if (a == NULL || strcmp(a, hf_types_[t].arch) != 0) {
                s = zdp_err_set(err, ZDP_ERR_UNSUPPORTED, "%s: key \"architectures\"[%zu] = "
                                "\"%s\": for model_type \"%s\" zdp builds \"%s\" (a causal LM) "
                                "only", path, i, a != NULL ? a : "(not a string)", mt,
                                hf_types_[t].arch);
                goto done;
            }
        }
    }
    s = strcmp(mt, "gpt2") == 0 ? hf_parse_gpt2_(&c, out, err)
                                : hf_parse_llama_(&c, strcmp(mt, "qwen3") == 0, out, err);
done:
    json_decref(root);
    if (s != ZDP_OK) memset(out, 0, sizeof *out);
    return s;
}

/* Reads a whole small file into a NUL-terminated buffer; errno on failure. */
static char *hf_slurp_(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    size_t cap = 1 << 14, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf != NULL && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *nb = cap < ((size_t)256 << 20) ? realloc(buf, cap * 2) : NULL;
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                errno = EFBIG;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (buf != NULL && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf != NULL) buf[n] = '\0';
    *len = n;
    return buf;
}

zdp_status zdp_hf_config_read(const char *dir, zdp_hf_config *out, zdp_error *err) {
    if (dir == NULL || out == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_config_read: dir and out must not "
                           "be NULL");
    char path[HF_PATH_MAX];
    snprintf(path, sizeof path, "%s/" HF_CONFIG, dir);
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot open the model folder: %s (zdp "
                           "init-model writes one)", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return zdp_err_set(err, ZDP_ERR_IO, "%s: not a directory; a model folder holds "
                           "config.json and model.safetensors (zdp init-model writes one)", dir);
    size_t len = 0;
    char *text = hf_slurp_(path, &len);
    if (text == NULL)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot read: %s; a model folder needs the "
                           "config.json save_pretrained writes", path, strerror(errno));
    zdp_status s = zdp_hf_config_parse(text, len, path, out, err);
    free(text);
    return s;
}

/* ---- the model factory ---------------------------------------------------------- */

zdp_status zdp_hf_model_create(const zdp_hf_config *cfg, int block_size, int max_batch,
                               zdp_model *out, zdp_error *err) {
    if (cfg == NULL || out == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_model_create: cfg and out must not "
                           "be NULL");
    const int maxpos = cfg->max_position_embeddings;
    if (block_size < 0 || block_size > maxpos)
        return zdp_err_set(err, ZDP_ERR_CONFIG, "block size %d: the model's "
                           "max_position_embeddings is %d; use a block size in 1..%d",
                           block_size, maxpos, maxpos);
    if (block_size == 0) block_size = maxpos < ZDP_HF_DEFAULT_BLOCK ? maxpos : ZDP_HF_DEFAULT_BLOCK;
    if (cfg->family == ZDP_HF_GPT2) {
        zdp_gpt_config g = cfg->gpt;
        g.block_size = block_size;
        return zdp_gpt_create(&g, max_batch, out, err);
    }
    zdp_llama_config l = cfg->llama;
    l.block_size = block_size;
    return zdp_llama_create(&l, max_batch, out, err);
}

void zdp_model_destroy(zdp_model *model) {
    if (model == NULL || model->self == NULL) return;
    if (zdp_gpt_config_of(model) != NULL) zdp_gpt_destroy(model);
    else if (zdp_llama_config_of(model) != NULL) zdp_llama_destroy(model);
}

/* ---- model.safetensors.index.json ------------------------------------------------ */

void zdp_hf_index_free(zdp_hf_index *idx) {
    if (idx == NULL) return;
    for (int i = 0; i < idx->n; i++) {
        free(idx->names ? idx->names[i] : NULL);
        free(idx->shards ? idx->shards[i] : NULL);
    }
    for (int i = 0; i < idx->n_files; i++) free(idx->files[i]);
    free(idx->names);
    free(idx->shards);
    free(idx->files);
    memset(idx, 0, sizeof *idx);
    idx->total_size = -1;
}

/* A shard file name must stay inside the folder. */
static bool hf_plain_name_(const char *f) {
    size_t n = strlen(f), ext = strlen(".safetensors");
    return n > ext && strchr(f, '/') == NULL && strchr(f, '\\') == NULL && f[0] != '.' &&
           strcmp(f + n - ext, ".safetensors") == 0;
}

zdp_status zdp_hf_index_parse(const char *text, size_t len, const char *path, zdp_hf_index *out,
                              zdp_error *err) {
    if (text == NULL || out == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_index_parse: text and out must not "
                           "be NULL");
    if (path == NULL) path = HF_INDEX;
    memset(out, 0, sizeof *out);
    out->total_size = -1;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL)
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)",
                           path, je.text, je.line, je.column);
    zdp_status s = ZDP_OK;
    json_t *wm = json_object_get(root, "weight_map");
    json_t *meta = json_object_get(root, "metadata");
    json_t *ts = json_is_object(meta) ? json_object_get(meta, "total_size") : NULL;
    if (!json_is_object(wm)) {
        s = zdp_err_set(err, ZDP_ERR_FORMAT, "%s: key \"weight_map\" is %s, expected an object "
                        "{tensor name: shard file}", path,
                        wm == NULL ? "missing" : zdp_json_type_name(wm));
        goto done;
    }
    if (json_object_size(wm) == 0) {
        s = zdp_err_set(err, ZDP_ERR_FORMAT, "%s: \"weight_map\" is empty: the index names no "
                        "tensor", path);
        goto done;
    }
    if (ts != NULL && json_is_integer(ts) && json_integer_value(ts) >= 0)
        out->total_size = (int64_t)json_integer_value(ts);
    size_t n = json_object_size(wm);
    out->names = calloc(n, sizeof *out->names);
    out->shards = calloc(n, sizeof *out->shards);
    out->files = calloc(n, sizeof *out->files);
    if (out->names == NULL || out->shards == NULL || out->files == NULL) {
        s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const char *f = json_string_value(v);
        if (f == NULL || !hf_plain_name_(f)) {
            s = zdp_err_set(err, ZDP_ERR_FORMAT, "%s: \"weight_map\".\"%s\" = %s%s%s: expected "
                            "a shard file name in the folder (\"model-00001-of-00002"
                            ".safetensors\"; no '/', ending in .safetensors)", path, key,
                            f ? "\"" : "", f ? f : zdp_json_type_name(v), f ? "\"" : "");
            goto done;
        }
        int i = out->n;
        out->names[i] = strdup(key);
        out->shards[i] = strdup(f);
        out->n++;
        if (out->names[i] == NULL || out->shards[i] == NULL) {
            s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        int k = 0;
        while (k < out->n_files && strcmp(out->files[k], f) != 0) k++;
        if (k == out->n_files) {
            out->files[k] = strdup(f);
            if (out->files[k] == NULL) {
                s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
                goto done;
            }
            out->n_files++;
        }
    }
done:
    json_decref(root);
    if (s != ZDP_OK) zdp_hf_index_free(out);
    return s;
}

/* ---- weights in ------------------------------------------------------------------ */

/* The folder's weight files (their headers: no tensor is read here) and the
 * index when sharded. */
typedef struct hf_folder_ {
    const char *dir;
    int n;                 /* files */
    char **paths;          /* DIR/file */
    zdp_safetensors *st;   /* one per file, headers only (data NULL) */
    uint64_t **off;        /* (n) per file: the file offset of each tensor's bytes */
    zdp_hf_index idx;      /* n == 0: a single model.safetensors */
    char index_path[HF_PATH_MAX];
} hf_folder_;

static void hf_folder_free_(hf_folder_ *f) {
    for (int i = 0; i < f->n; i++) {
        if (f->paths) free(f->paths[i]);
        if (f->st) zdp_safetensors_free(&f->st[i]);
        if (f->off) free(f->off[i]);
    }
    free(f->paths);
    free(f->st);
    free(f->off);
    zdp_hf_index_free(&f->idx);
}

static bool hf_exists_(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Finds the weight files and reads their headers; checks the index against
 * the shards. */
static zdp_status hf_folder_open_(const char *dir, hf_folder_ *f, zdp_error *err) {
    *f = (hf_folder_){.dir = dir};
    f->idx.total_size = -1;
    char single[HF_PATH_MAX];
    snprintf(single, sizeof single, "%s/" HF_SINGLE, dir);
    snprintf(f->index_path, sizeof f->index_path, "%s/" HF_INDEX, dir);
    int n = 1;
    zdp_status s = ZDP_OK;
    if (!hf_exists_(single)) {
        size_t len = 0;
        char *text = hf_slurp_(f->index_path, &len);
        if (text == NULL) {
            char bin[HF_PATH_MAX];
            snprintf(bin, sizeof bin, "%s/pytorch_model.bin", dir);
            return zdp_err_set(err, ZDP_ERR_IO, "%s: no " HF_SINGLE " and no " HF_INDEX
                               " (%s)%s", dir, strerror(errno),
                               hf_exists_(bin) ? "; the folder has pytorch_model.bin: zdp reads "
                                                 "safetensors only (save it again with "
                                                 "save_pretrained(safe_serialization=True))"
                                               : "; a model folder holds its weights as "
                                                 "save_pretrained writes them");
        }
        s = zdp_hf_index_parse(text, len, f->index_path, &f->idx, err);
        free(text);
        if (s != ZDP_OK) return s;
        n = f->idx.n_files;
    }
    f->paths = calloc((size_t)n, sizeof *f->paths);
    f->st = calloc((size_t)n, sizeof *f->st);
    f->off = calloc((size_t)n, sizeof *f->off);
    if (f->paths == NULL || f->st == NULL || f->off == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory");
    f->n = n;
    for (int k = 0; k < n; k++) {
        const char *name = f->idx.n > 0 ? f->idx.files[k] : HF_SINGLE;
        size_t need = strlen(dir) + strlen(name) + 2;
        f->paths[k] = malloc(need);
        if (f->paths[k] == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory");
        snprintf(f->paths[k], need, "%s/%s", dir, name);
        if (f->idx.n > 0 && !hf_exists_(f->paths[k])) {
            int e = 0;
            while (strcmp(f->idx.shards[e], name) != 0) e++;
            return zdp_err_set(err, ZDP_ERR_IO, "%s: \"weight_map\" puts tensor \"%s\" in shard "
                               "\"%s\", but %s does not exist (%s); fix: copy the whole folder "
                               "(every shard the index names)", f->index_path, f->idx.names[e],
                               name, f->paths[k], strerror(errno));
        }
    }
    for (int k = 0; k < n && s == ZDP_OK; k++)
        s = zdp_safetensors_read_header(f->paths[k], &f->st[k], &f->off[k], err);
    if (s != ZDP_OK || f->idx.n == 0) return s;
    /* Each shard holds exactly what the index says it does. */
    for (int k = 0; k < n; k++) {
        for (int j = 0; j < f->st[k].n; j++) {
            const char *t = f->st[k].tensors[j].name;
            int e = 0;
            while (e < f->idx.n && strcmp(f->idx.names[e], t) != 0) e++;
            if (e == f->idx.n)
                return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: tensor \"%s\" is not listed in "
                                   "%s's \"weight_map\"; the index and the shards are from "
                                   "different saves: save the folder again", f->paths[k], t,
                                   f->index_path);
            if (strcmp(f->idx.shards[e], f->idx.files[k]) != 0)
                return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: tensor \"%s\" is here, but %s puts "
                                   "it in \"%s\"; the index and the shards are from different "
                                   "saves: save the folder again", f->paths[k], t,
                                   f->index_path, f->idx.shards[e]);
        }
    }
    for (int e = 0; e < f->idx.n; e++) {
        int k = 0;
        while (strcmp(f->idx.files[k], f->idx.shards[e]) != 0) k++;
        if (zdp_safetensors_find(&f->st[k], f->idx.names[e]) == NULL)
            return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: \"weight_map\" puts tensor \"%s\" in "
                               "\"%s\", but that shard (%d tensors) does not hold it; the index "
                               "and the shards are from different saves: save the folder again",
                               f->index_path, f->idx.names[e], f->idx.shards[e], f->st[k].n);
    }
    return ZDP_OK;
}

/* Buffers a model may meet in a file and ignore: not parameters. */
static bool hf_ignored_(const char *name, bool gpt) {
    size_t n = strlen(name);
    const char *inv = ".rotary_emb.inv_freq";
    if (n >= strlen(inv) && strcmp(name + n - strlen(inv), inv) == 0) return true;
    if (!gpt) return false;
    const char *b1 = ".attn.bias", *b2 = ".attn.masked_bias";
    return (n >= strlen(b1) && strcmp(name + n - strlen(b1), b1) == 0) ||
           (n >= strlen(b2) && strcmp(name + n - strlen(b2), b2) == 0);
}

/* GPT-2 files spell names with or without "transformer.". */
static const char *hf_bare_(const char *name, bool gpt) {
    size_t p = strlen(HF_GPT_PREFIX);
    return gpt && strncmp(name, HF_GPT_PREFIX, p) == 0 ? name + p : name;
}

/* Where each model parameter is found: file k, tensor t, its bytes at file
 * offset off. */
typedef struct hf_loc_ {
    int file;
    const zdp_tensor *t;
    uint64_t off;
} hf_loc_;

/* Maps every file tensor to a parameter (or an ignored buffer, or the tied
 * lm_head), refusing extras and duplicates. */
static zdp_status hf_map_(const hf_folder_ *f, const zdp_model *model, bool gpt, hf_loc_ *loc,
                          hf_loc_ *lm_head, zdp_error *err) {
    char a[64];
    for (int p = 0; p < model->n_params; p++) loc[p] = (hf_loc_){.file = -1};
    *lm_head = (hf_loc_){.file = -1};
    for (int k = 0; k < f->n; k++) {
        for (int j = 0; j < f->st[k].n; j++) {
            const zdp_tensor *t = &f->st[k].tensors[j];
            const char *bare = hf_bare_(t->name, gpt);
            int p = 0;
            while (p < model->n_params && strcmp(hf_bare_(model->params[p].name, gpt), bare) != 0)
                p++;
            hf_loc_ *slot = p < model->n_params ? &loc[p] : NULL;
            if (slot == NULL && strcmp(bare, "lm_head.weight") == 0) slot = lm_head;
            if (slot == NULL) {
                if (hf_ignored_(bare, gpt)) continue;
                return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: tensor \"%s\" (shape %s) is not a "
                                   "parameter of the model config.json describes (%d tensors, "
                                   "e.g. \"%s\"); the weights are of another architecture or "
                                   "config.json is wrong: fix config.json or remove the tensor",
                                   f->paths[k], t->name, zdp_io_shape_str(t->shape, t->ndim, a,
                                   sizeof a), model->n_params, model->params[0].name);
            }
            if (slot->file >= 0)
                return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: tensor \"%s\" is also in %s (as "
                                   "\"%s\"); keep one", f->paths[k], t->name,
                                   f->paths[slot->file], slot->t->name);
            *slot = (hf_loc_){.file = k, .t = t, .off = f->off[k][j]};
        }
    }
    return ZDP_OK;
}

/* Presence, shape and dtype of each parameter's tensor (finiteness is
 * checked as it is read). */
static zdp_status hf_check_(const hf_folder_ *f, const zdp_model *model, bool gpt,
                            const hf_loc_ *loc, zdp_error *err) {
    char a[64], b[64];
    const char *where = f->idx.n > 0 ? f->index_path : f->n > 0 ? f->paths[0] : f->dir;
    for (int p = 0; p < model->n_params; p++) {
        const zdp_param_info *pi = &model->params[p];
        if (loc[p].file < 0)
            return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: tensor \"%s\" is missing; the model "
                               "config.json describes needs it with shape %s%s", where, pi->name,
                               zdp_io_shape_str(pi->shape, pi->ndim, a, sizeof a),
                               strcmp(pi->name, "lm_head.weight") == 0
                                   ? " (config.json says tie_word_embeddings false: set it to "
                                     "true if lm_head is the embedding)"
                                   : ": the folder is incomplete or of another configuration");
        const zdp_tensor *t = loc[p].t;
        const char *file = f->paths[loc[p].file];
        /* GPT-2's learned positions: the first block_size rows of the file's
         * (a prefix of its bytes, so element i of the model's tensor is
         * element i of the file's). */
        bool crop = gpt && strcmp(hf_bare_(pi->name, true), "wpe.weight") == 0 && t->ndim == 2 &&
                    pi->ndim == 2 && t->shape[1] == pi->shape[1] && t->shape[0] >= pi->shape[0];
        bool same = t->ndim == pi->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == pi->shape[d];
        if (!same && !crop) {
            bool transposed = t->ndim == 2 && pi->ndim == 2 && t->shape[0] == pi->shape[1] &&
                              t->shape[1] == pi->shape[0];
            return zdp_err_set(err, ZDP_ERR_CONFIG, "%s: tensor \"%s\": file shape %s, model "
                               "shape %s; %s", file, t->name,
                               zdp_io_shape_str(t->shape, t->ndim, a, sizeof a),
                               zdp_io_shape_str(pi->shape, pi->ndim, b, sizeof b),
                               transposed ? "the file's is transposed: transformers saves "
                                            "Linear weights [out, in]; write them that way"
                                          : "config.json does not describe these weights: fix "
                                            "its sizes (hidden_size, num_key_value_heads, "
                                            "head_dim, ...) to the weights'");
        }
        if (!zdp_io_dtype_float(t->dtype))
            return zdp_err_set(err, ZDP_ERR_UNSUPPORTED, "%s: tensor \"%s\" has dtype %s; zdp "
                               "loads F32, F16 and BF16 weights (convert the file)", file,
                               t->name, zdp_dtype_name(t->dtype));
    }
    return ZDP_OK;
}

/* ---- the reader: a tensor, or a slice of one, at a time ------------------------------ */

/* The staging buffer: raw file bytes are read in pieces of this size and
 * converted into the caller's floats, so a read holds no more than this
 * beyond its destination. */
#define HF_CHUNK ((size_t)1 << 20)

struct zdp_hf_reader {
    hf_folder_ f;
    hf_loc_ *loc;       /* (n_params) */
    hf_loc_ lm;         /* a tied model's lm_head.weight in the file, file -1: none */
    int *fds;           /* (f.n) one per weight file, -1 until opened */
    int n_params;
    const zdp_param_info *params;
    unsigned char *buf; /* (HF_CHUNK) staging */
    zdp_dtype seen;     /* a dtype other than F32 met, for the log */
};

/* The most bytes of weights one load call held at once (its destination,
 * and the raw bytes staged for it), over the process's life:
 * zdp_hf_load_peak_bytes. */
static _Atomic int64_t hf_peak_ = 0;

static void hf_note_(int64_t bytes) {
    int64_t cur = atomic_load(&hf_peak_);
    while (bytes > cur && !atomic_compare_exchange_weak(&hf_peak_, &cur, bytes)) {
    }
}

int64_t zdp_hf_load_peak_bytes(void) { return atomic_load(&hf_peak_); }

static bool hf_pread_full_(int fd, void *buf, size_t len, uint64_t at) {
    unsigned char *p = buf;
    while (len > 0) {
        ssize_t got = pread(fd, p, len, (off_t)at);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return false;
        p += got;
        len -= (size_t)got;
        at += (uint64_t)got;
    }
    return true;
}

/* Elements [lo, lo + n) of a located tensor, converted, into dst (the
 * staging buffer's part `stage`, cap bytes). */
static zdp_status hf_read_raw_(zdp_hf_reader *r, const hf_loc_ *l, int64_t lo, int64_t n,
                               float *dst, unsigned char *stage, size_t cap, zdp_error *err) {
    const size_t es = zdp_dtype_size(l->t->dtype);
    const int64_t per = (int64_t)(cap / es);
    const char *path = r->f.paths[l->file];
    if (r->fds[l->file] < 0 && (r->fds[l->file] = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot open for reading: %s", path,
                           strerror(errno));
    zdp_tensor tmp = {.dtype = l->t->dtype, .data = stage};
    for (int64_t done = 0; done < n;) {
        const int64_t k = n - done < per ? n - done : per;
        if (!hf_pread_full_(r->fds[l->file], stage, (size_t)k * es,
                            l->off + (uint64_t)(lo + done) * es))
            return zdp_err_set(err, ZDP_ERR_IO, "%s: tensor \"%s\": cannot read %lld bytes at "
                               "offset %llu (%s); the file is truncated or unreadable",
                               path, l->t->name, (long long)k * (long long)es,
                               (unsigned long long)(l->off + (uint64_t)(lo + done) * es),
                               errno != 0 ? strerror(errno) : "end of file");
        for (int64_t j = 0; j < k; j++) dst[done + j] = zdp_io_f32_at(&tmp, j);
        done += k;
    }
    return ZDP_OK;
}

/* A tied model's lm_head.weight must be the embedding, or it is a trained
 * head that loading would silently drop.  Compared a staging buffer at a
 * time (each half holds one tensor's piece). */
static zdp_status hf_check_lm_head_(zdp_hf_reader *r, const zdp_model *model, zdp_error *err) {
    const hf_loc_ *lm = &r->lm;
    if (lm->file < 0) return ZDP_OK;
    const zdp_tensor *h = lm->t, *e = r->loc[0].t;
    char a[64], b[64];
    bool same = h->ndim == e->ndim && h->ndim == 2 && h->shape[0] == e->shape[0] &&
                h->shape[1] == e->shape[1] && zdp_io_dtype_float(h->dtype);
    const int64_t n = same ? zdp_io_numel(h->shape, 2) : 0;
    const size_t half = HF_CHUNK / 2;
    const int64_t per = (int64_t)(half / 2 / sizeof(float)); /* floats, after raw bytes */
    float *fh = (float *)(void *)(r->buf + half / 2), *fe = (float *)(void *)(r->buf + half + half / 2);
    /* Two pieces of raw bytes and their floats. */
    hf_note_(2 * (n < per ? n : per) * (int64_t)(zdp_dtype_size(h->dtype) + sizeof(float)));
    for (int64_t i = 0; same && i < n; i += per) {
        const int64_t k = n - i < per ? n - i : per;
        zdp_status s = hf_read_raw_(r, lm, i, k, fh, r->buf, half / 2, err);
        if (s == ZDP_OK) s = hf_read_raw_(r, &r->loc[0], i, k, fe, r->buf + half, half / 2, err);
        if (s != ZDP_OK) return s;
        for (int64_t j = 0; same && j < k; j++) same = fh[j] == fe[j];
    }
    if (same) return ZDP_OK;
    return zdp_err_set(err, ZDP_ERR_UNSUPPORTED, "%s: tensor \"%s\" (shape %s) differs from "
                       "\"%s\" (shape %s)%s, but the model ties them (config.json: GPT-2, or "
                       "tie_word_embeddings true); loading would drop a trained head: set "
                       "tie_word_embeddings false in config.json if the head is untied",
                       r->f.paths[lm->file], h->name, zdp_io_shape_str(h->shape, h->ndim, a, sizeof a),
                       model->params[0].name, zdp_io_shape_str(e->shape, e->ndim, b, sizeof b),
                       n > 0 ? " in value" : "");
}

void zdp_hf_reader_close(zdp_hf_reader *r) {
    if (r == NULL) return;
    for (int k = 0; r->fds != NULL && k < r->f.n; k++)
        if (r->fds[k] >= 0) close(r->fds[k]);
    free(r->fds);
    free(r->loc);
    free(r->buf);
    hf_folder_free_(&r->f);
    free(r);
}

zdp_status zdp_hf_reader_open(const char *dir, const zdp_model *model, zdp_hf_reader **out,
                              zdp_error *err) {
    if (out != NULL) *out = NULL;
    if (dir == NULL || model == NULL || out == NULL || model->n_params < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_reader_open: dir, model and out "
                           "must not be NULL");
    const bool gpt = zdp_gpt_config_of(model) != NULL;
    if (!gpt && zdp_llama_config_of(model) == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_reader_open: the model is neither "
                           "GPT-2 nor of the Llama family");
    zdp_hf_reader *r = calloc(1, sizeof *r);
    if (r == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", dir);
    r->n_params = model->n_params;
    r->params = model->params;
    r->seen = ZDP_DTYPE_F32;
    r->loc = calloc((size_t)model->n_params, sizeof *r->loc);
    r->buf = malloc(HF_CHUNK);
    zdp_status s = r->loc == NULL || r->buf == NULL
                       ? zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", dir)
                       : hf_folder_open_(dir, &r->f, err);
    if (s == ZDP_OK && (r->fds = malloc((size_t)r->f.n * sizeof *r->fds)) == NULL)
        s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", dir);
    for (int k = 0; s == ZDP_OK && k < r->f.n; k++) r->fds[k] = -1;
    if (s == ZDP_OK) s = hf_map_(&r->f, model, gpt, r->loc, &r->lm, err);
    if (s == ZDP_OK) s = hf_check_(&r->f, model, gpt, r->loc, err);
    if (s == ZDP_OK) s = hf_check_lm_head_(r, model, err);
    if (s != ZDP_OK) {
        zdp_hf_reader_close(r);
        return s;
    }
    *out = r;
    return ZDP_OK;
}

zdp_status zdp_hf_reader_read(void *reader, int i, int64_t lo, int64_t hi, float *dst,
                              zdp_error *err) {
    zdp_hf_reader *r = reader;
    if (r == NULL || dst == NULL || i < 0 || i >= r->n_params)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_reader_read: reader and dst must "
                           "not be NULL and tensor %d must be in [0, %d)", i,
                           r != NULL ? r->n_params : 0);
    const zdp_param_info *pi = &r->params[i];
    const int64_t n = zdp_io_numel(pi->shape, pi->ndim);
    if (lo < 0 || hi < lo || hi > n)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_reader_read: tensor \"%s\": "
                           "elements [%lld, %lld) are not inside its %lld", pi->name,
                           (long long)lo, (long long)hi, (long long)n);
    const hf_loc_ *l = &r->loc[i];
    /* The destination and the raw bytes staged for it. */
    const int64_t raw = (hi - lo) * (int64_t)zdp_dtype_size(l->t->dtype);
    hf_note_((hi - lo) * (int64_t)sizeof(float) + (raw < (int64_t)HF_CHUNK ? raw : (int64_t)HF_CHUNK));
    zdp_status s = hf_read_raw_(r, l, lo, hi - lo, dst, r->buf, HF_CHUNK, err);
    if (s != ZDP_OK) return s;
    if (l->t->dtype != ZDP_DTYPE_F32) r->seen = l->t->dtype;
    const int64_t cols = pi->ndim == 2 ? pi->shape[1] : n;
    for (int64_t j = 0; j < hi - lo; j++) {
        if (isfinite(dst[j])) continue;
        const int64_t at = lo + j;
        char where[64];
        if (pi->ndim == 2)
            snprintf(where, sizeof where, "[%" PRId64 ", %" PRId64 "]", at / cols, at % cols);
        else
            snprintf(where, sizeof where, "[%" PRId64 "]", at);
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: tensor \"%s\"%s = %g: weights must be "
                           "finite (NaN or Inf would make every step skip); load a folder "
                           "saved from a healthy run", r->f.paths[l->file], l->t->name, where,
                           (double)dst[j]);
    }
    return ZDP_OK;
}

zdp_status zdp_hf_weights_load(const char *dir, const zdp_model *model, float *const *dst,
                               zdp_error *err) {
    if (dir == NULL || model == NULL || dst == NULL || model->n_params < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_weights_load: dir, model and dst "
                           "must not be NULL");
    zdp_hf_reader *r = NULL;
    zdp_status s = zdp_hf_reader_open(dir, model, &r, err);
    /* Every tensor whole: the whole model at once, in the caller's arrays. */
    int64_t total = 0;
    for (int p = 0; s == ZDP_OK && p < model->n_params; p++)
        total += zdp_io_numel(model->params[p].shape, model->params[p].ndim);
    if (s == ZDP_OK) hf_note_(total * (int64_t)sizeof(float));
    /* Every tensor checked finite before the first write into dst (a
     * staging buffer at a time: raw bytes in the first half, floats in the
     * second), so a failed load changes nothing. */
    const int64_t per = (int64_t)(HF_CHUNK / 2 / sizeof(float));
    float *chk = r != NULL ? (float *)(void *)(r->buf + HF_CHUNK / 2) : NULL;
    for (int p = 0; s == ZDP_OK && p < model->n_params; p++) {
        const zdp_param_info *pi = &model->params[p];
        const int64_t n = zdp_io_numel(pi->shape, pi->ndim);
        for (int64_t i = 0; s == ZDP_OK && i < n; i += per) {
            const int64_t k = n - i < per ? n - i : per;
            s = hf_read_raw_(r, &r->loc[p], i, k, chk, r->buf, HF_CHUNK / 2, err);
            for (int64_t j = 0; s == ZDP_OK && j < k; j++)
                if (!isfinite(chk[j])) s = zdp_hf_reader_read(r, p, i + j, i + j + 1, chk, err);
        }
    }
    for (int p = 0; s == ZDP_OK && p < model->n_params; p++)
        s = zdp_hf_reader_read(r, p, 0, zdp_io_numel(model->params[p].shape, model->params[p].ndim),
                               dst[p], err);
    if (s == ZDP_OK)
        zdp_log(0, "%s: loaded %d tensors from %d file(s)%s%s%s", dir, model->n_params, r->f.n,
                r->seen != ZDP_DTYPE_F32 ? ", " : "", r->seen != ZDP_DTYPE_F32 ? zdp_dtype_name(r->seen) : "",
                r->seen != ZDP_DTYPE_F32 ? " converted to F32" : "");
    zdp_hf_reader_close(r);
    return s;
}

/* ---- weights out ------------------------------------------------------------------- */

/* Writes len bytes to path atomically: path.tmp.XXXXXX, fsync, rename. */
static zdp_status hf_write_atomic_(const char *path, const void *data, size_t len,
                                   zdp_error *err) {
    char tmp[HF_PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot create a temporary file next to it: %s",
                           path, strerror(errno));
    const char *p = data;
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, p + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    int e = done == len ? 0 : errno;
    if (e == 0 && fsync(fd) != 0) e = errno;
    if (close(fd) != 0 && e == 0) e = errno;
    /* mkstemp makes it 0600; a model folder is for sharing. */
    if (e == 0 && chmod(tmp, 0644) != 0) e = errno;
    if (e == 0 && rename(tmp, path) != 0) e = errno;
    if (e != 0) {
        unlink(tmp);
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot write: %s", path, strerror(e));
    }
    return ZDP_OK;
}

/* json_dumps with 15 significant digits, so 1e-06 stays 1e-06. */
static zdp_status hf_write_json_(const char *path, json_t *root, zdp_error *err) {
    if (root == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
    json_decref(root);
    if (text == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
    size_t len = strlen(text);
    char *withnl = realloc(text, len + 2);
    if (withnl == NULL) {
        free(text);
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
    }
    withnl[len] = '\n';
    zdp_status s = hf_write_atomic_(path, withnl, len + 1, err);
    free(withnl);
    return s;
}

zdp_status zdp_io_write_json(const char *path, json_t *root, zdp_error *err) {
    return hf_write_json_(path, root, err);
}

/* A float as the shortest decimal that reads back as the same float (rms
 * eps 1e-6f is written 1e-06, not 9.99999997e-07). */
static double hf_short_(float f) {
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)f);
        if ((float)strtod(buf, NULL) == f) break;
    }
    return strtod(buf, NULL);
}

static json_t *hf_config_json_(const zdp_model *model, zdp_dtype dtype) {
    json_t *o = json_object();
    const char *torch_dtype = dtype == ZDP_DTYPE_BF16 ? "bfloat16" : "float32";
    const zdp_gpt_config *g = zdp_gpt_config_of(model);
    const zdp_llama_config *l = zdp_llama_config_of(model);
    if (g != NULL) {
        json_object_set_new(o, "architectures", json_pack("[s]", "GPT2LMHeadModel"));
        json_object_set_new(o, "model_type", json_string("gpt2"));
        json_object_set_new(o, "vocab_size", json_integer(g->vocab_size));
        json_object_set_new(o, "n_embd", json_integer(g->n_embd));
        json_object_set_new(o, "n_layer", json_integer(g->n_layer));
        json_object_set_new(o, "n_head", json_integer(g->n_head));
        /* zdp's position table has block_size rows: that is what was saved. */
        json_object_set_new(o, "n_positions", json_integer(g->block_size));
        json_object_set_new(o, "n_ctx", json_integer(g->block_size));
        json_object_set_new(o, "n_inner", json_null());
        json_object_set_new(o, "activation_function", json_string("gelu_new"));
        json_object_set_new(o, "layer_norm_epsilon", json_real(1e-5));
        json_object_set_new(o, "initializer_range", json_real(0.02));
        json_object_set_new(o, "tie_word_embeddings", json_true());
        json_object_set_new(o, "torch_dtype", json_string(torch_dtype));
        return o;
    }
    const bool qwen3 = l->arch == ZDP_ARCH_QWEN3;
    json_object_set_new(o, "architectures",
                        json_pack("[s]", qwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM"));
    json_object_set_new(o, "model_type", json_string(qwen3 ? "qwen3" : "llama"));
    json_object_set_new(o, "vocab_size", json_integer(l->vocab_size));
    json_object_set_new(o, "hidden_size", json_integer(l->hidden));
    json_object_set_new(o, "intermediate_size", json_integer(l->ffn));
    json_object_set_new(o, "num_hidden_layers", json_integer(l->n_layer));
    json_object_set_new(o, "num_attention_heads", json_integer(l->n_head));
    json_object_set_new(o, "num_key_value_heads", json_integer(l->n_kv_head));
    json_object_set_new(o, "head_dim", json_integer(l->head_dim));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "max_position_embeddings", json_integer(l->max_position_embeddings));
    json_object_set_new(o, "initializer_range", json_real(l->initializer_range));
    json_object_set_new(o, "rms_norm_eps", json_real(hf_short_(l->rms_norm_eps)));
    json_object_set_new(o, "rope_theta", json_real(l->rope_theta));
    json_t *rs = json_null();
    if (l->rope_type == ZDP_ROPE_LINEAR) {
        rs = json_pack("{s:s, s:f}", "rope_type", "linear", "factor", l->rope_factor);
    } else if (l->rope_type == ZDP_ROPE_LLAMA3) {
        rs = json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                       l->rope_factor, "low_freq_factor", l->rope_low_freq_factor,
                       "high_freq_factor", l->rope_high_freq_factor,
                       "original_max_position_embeddings", l->rope_original_max_position);
    }
    json_object_set_new(o, "rope_scaling", rs);
    json_object_set_new(o, "attention_bias", json_boolean(l->attention_bias));
    json_object_set_new(o, "attention_dropout", json_real(0.0));
    if (qwen3) {
        json_object_set_new(o, "use_sliding_window", json_false());
    } else {
        json_object_set_new(o, "mlp_bias", json_false());
        json_object_set_new(o, "pretraining_tp", json_integer(1));
    }
    json_object_set_new(o, "tie_word_embeddings", json_boolean(l->tie_word_embeddings));
    json_object_set_new(o, "torch_dtype", json_string(torch_dtype));
    return o;
}

/* "model-00001-of-00002.safetensors" (save_pretrained's names); k from 1. */
static void hf_shard_name_(int k, int n, char *buf, size_t cap) {
    snprintf(buf, cap, "model-%05d-of-%05d.safetensors", k, n);
}

static bool hf_is_shard_name_(const char *name) {
    int k, n, used = 0;
    return strlen(name) == strlen("model-00001-of-00002.safetensors") &&
           sscanf(name, "model-%5d-of-%5d.safetensors%n", &k, &n, &used) == 2 &&
           used == (int)strlen(name);
}

/* Removes DIR's weight files that this save did not write (keep_single:
 * model.safetensors is this save's; n_shards: model-*-of-{n_shards}). */
static zdp_status hf_remove_stale_(const char *dir, bool keep_single, int n_shards,
                                   zdp_error *err) {
    DIR *d = opendir(dir);
    if (d == NULL) return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    struct dirent *ent;
    zdp_status s = ZDP_OK;
    while ((ent = readdir(d)) != NULL && s == ZDP_OK) {
        const char *name = ent->d_name;
        bool stale = false;
        if (strcmp(name, HF_SINGLE) == 0) stale = !keep_single;
        else if (strcmp(name, HF_INDEX) == 0) stale = keep_single;
        else if (hf_is_shard_name_(name)) {
            int k = 0, n = 0;
            sscanf(name, "model-%5d-of-%5d", &k, &n);
            stale = keep_single || n != n_shards || k < 1 || k > n;
        }
        if (!stale) continue;
        char path[HF_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (unlink(path) != 0 && errno != ENOENT)
            s = zdp_err_set(err, ZDP_ERR_IO, "%s: cannot remove this weight file of an earlier "
                            "save: %s; remove it by hand", path, strerror(errno));
    }
    closedir(d);
    return s;
}

/* Writes tensors [first, last) of t as one safetensors file. */
/* zdp_hf_save_stream's tensors: read one, converted to the file's dtype. */
typedef struct hf_fill_ {
    const zdp_model *model;
    zdp_tensor_read_fn read;
    void *ctx;
    zdp_dtype dtype;
    float *f;  /* (largest numel) BF16: the floats before rounding */
    int first; /* the shard's first tensor */
} hf_fill_;

static zdp_status hf_fill_one_(void *ctx, int i, void *buf, zdp_error *err) {
    hf_fill_ *h = ctx;
    const int p = h->first + i;
    const int64_t n = zdp_io_numel(h->model->params[p].shape, h->model->params[p].ndim);
    float *dst = h->dtype == ZDP_DTYPE_F32 ? buf : h->f;
    zdp_status s = h->read(h->ctx, p, 0, n, dst, err);
    if (s != ZDP_OK || h->dtype == ZDP_DTYPE_F32) return s;
    uint16_t *b = buf;
    for (int64_t k = 0; k < n; k++) b[k] = zdp_io_f32_to_bf16(dst[k]);
    return ZDP_OK;
}

static zdp_status hf_write_shard_(const char *path, const zdp_tensor *t, int first, int last,
                                  hf_fill_ *fill, zdp_error *err) {
    static const char *const meta[] = {"format", "pt"};
    if (fill == NULL) return zdp_safetensors_write_meta(path, t + first, last - first, meta, 1, err);
    fill->first = first;
    return zdp_safetensors_write_fill(path, t + first, last - first, meta, 1, hf_fill_one_, fill, err);
}

static zdp_status hf_save_(const char *dir, const zdp_model *model, const float *const *src,
                           hf_fill_ *fill, zdp_dtype dtype, int64_t max_shard_bytes,
                           zdp_error *err);

zdp_status zdp_hf_save(const char *dir, const zdp_model *model, const float *const *src,
                       zdp_dtype dtype, int64_t max_shard_bytes, zdp_error *err) {
    if (dir == NULL || model == NULL || src == NULL || model->n_params < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_save: dir, model and src must not "
                           "be NULL");
    return hf_save_(dir, model, src, NULL, dtype, max_shard_bytes, err);
}

zdp_status zdp_hf_save_stream(const char *dir, const zdp_model *model, zdp_tensor_read_fn read,
                              void *ctx, zdp_dtype dtype, int64_t max_shard_bytes,
                              zdp_error *err) {
    if (dir == NULL || model == NULL || read == NULL || model->n_params < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_save_stream: dir, model and read "
                           "must not be NULL");
    hf_fill_ fill = {.model = model, .read = read, .ctx = ctx, .dtype = dtype};
    int64_t largest = 1;
    for (int i = 0; i < model->n_params; i++) {
        const int64_t n = zdp_io_numel(model->params[i].shape, model->params[i].ndim);
        if (n > largest) largest = n;
    }
    if (dtype == ZDP_DTYPE_BF16 && (fill.f = malloc((size_t)largest * sizeof(float))) == NULL)
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for one tensor", dir);
    zdp_status s = hf_save_(dir, model, NULL, &fill, dtype, max_shard_bytes, err);
    free(fill.f);
    return s;
}

/* zdp_hf_save from whole tensors (src) or tensor by tensor (fill). */
static zdp_status hf_save_(const char *dir, const zdp_model *model, const float *const *src,
                           hf_fill_ *fill, zdp_dtype dtype, int64_t max_shard_bytes,
                           zdp_error *err) {
    if (zdp_gpt_config_of(model) == NULL && zdp_llama_config_of(model) == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_save: the model is neither GPT-2 "
                           "nor of the Llama family; only those have a Hugging Face folder");
    if (dtype != ZDP_DTYPE_F32 && dtype != ZDP_DTYPE_BF16)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_save: dtype %s: zdp writes F32 or "
                           "BF16", zdp_dtype_name(dtype));
    if (max_shard_bytes <= 0) max_shard_bytes = ZDP_HF_MAX_SHARD_BYTES;
    if (zdp_mkdirs(dir) != 0)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot create the folder: %s", dir,
                           strerror(errno));
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return zdp_err_set(err, ZDP_ERR_IO, "%s: exists and is not a directory; choose another "
                           "output folder", dir);

    const int n = model->n_params;
    const size_t esize = zdp_dtype_size(dtype);
    zdp_tensor *t = calloc((size_t)n, sizeof *t);
    int *shard_of = calloc((size_t)n, sizeof *shard_of);
    zdp_status s = ZDP_OK;
    int n_shards = 1;
    int64_t total = 0, in_shard = 0;
    if (t == NULL || shard_of == NULL) {
        s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    for (int i = 0; i < n && s == ZDP_OK; i++) {
        const zdp_param_info *p = &model->params[i];
        const int64_t numel = zdp_io_numel(p->shape, p->ndim);
        t[i] = (zdp_tensor){.name = (char *)p->name, .dtype = dtype, .ndim = p->ndim,
                            .nbytes = (size_t)numel * esize};
        memcpy(t[i].shape, p->shape, sizeof t[i].shape);
        if (fill != NULL) {
            t[i].data = NULL; /* read as it is written */
        } else if (dtype == ZDP_DTYPE_F32) {
            t[i].data = (void *)src[i]; /* the writer only reads it */
        } else {
            uint16_t *h = malloc(t[i].nbytes > 0 ? t[i].nbytes : 1);
            if (h == NULL) {
                s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for tensor %s", dir,
                                p->name);
                break;
            }
            for (int64_t k = 0; k < numel; k++) h[k] = zdp_io_f32_to_bf16(src[i][k]);
            t[i].data = h;
        }
        /* save_pretrained's rule: a new shard when this tensor would pass the limit. */
        if (in_shard > 0 && in_shard + (int64_t)t[i].nbytes > max_shard_bytes) {
            n_shards++;
            in_shard = 0;
        }
        shard_of[i] = n_shards - 1;
        in_shard += (int64_t)t[i].nbytes;
        total += (int64_t)t[i].nbytes;
    }
    if (s != ZDP_OK) goto done;

    char path[HF_PATH_MAX], name[64];
    json_t *wm = n_shards > 1 ? json_object() : NULL;
    for (int k = 0, first = 0; k < n_shards && s == ZDP_OK; k++) {
        int last = first;
        while (last < n && shard_of[last] == k) last++;
        if (n_shards == 1) snprintf(name, sizeof name, HF_SINGLE);
        else hf_shard_name_(k + 1, n_shards, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        s = hf_write_shard_(path, t, first, last, fill, err);
        for (int i = first; wm != NULL && i < last; i++)
            json_object_set_new(wm, t[i].name, json_string(name));
        first = last;
    }
    if (s == ZDP_OK) {
        snprintf(path, sizeof path, "%s/" HF_CONFIG, dir);
        s = hf_write_json_(path, hf_config_json_(model, dtype), err);
    }
    /* The index last, once every shard it names is in place (and the old
     * single file gone, which readers would prefer). */
    if (s == ZDP_OK && n_shards > 1) s = hf_remove_stale_(dir, false, n_shards, err);
    if (s == ZDP_OK && n_shards > 1) {
        snprintf(path, sizeof path, "%s/" HF_INDEX, dir);
        s = hf_write_json_(path, json_pack("{s:{s:I}, s:O}", "metadata", "total_size",
                                           (json_int_t)total, "weight_map", wm), err);
    }
    if (s == ZDP_OK && n_shards == 1) s = hf_remove_stale_(dir, true, 1, err);
    json_decref(wm);
done:
    for (int i = 0; t != NULL && dtype != ZDP_DTYPE_F32 && fill == NULL && i < n; i++) free(t[i].data);
    free(t);
    free(shard_of);
    return s;
}

/* ---- tokenizer files ---------------------------------------------------------------- */

static const char *const hf_tokenizer_files_[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt", "added_tokens.json", "encoder.json", "vocab.bpe",
    /* Not the tokenizer's, but its eos/bos ids are what generate() stops on. */
    "generation_config.json",
};

/* The token ids of from/config.json (bos_token_id, eos_token_id: a number, a
 * list or null, as transformers writes them) into to/config.json, which
 * zdp_hf_save wrote without them (the model does not know them): without
 * them generate() of a folder with no generation_config.json never stops
 * on eos.  Nothing to do when either config.json is missing or the source
 * has neither key. */
static zdp_status hf_copy_token_ids_(const char *from, const char *to, zdp_error *err) {
    static const char *const keys[] = {"bos_token_id", "eos_token_id"};
    char src[HF_PATH_MAX], dst[HF_PATH_MAX];
    snprintf(src, sizeof src, "%s/%s", from, HF_CONFIG);
    snprintf(dst, sizeof dst, "%s/%s", to, HF_CONFIG);
    if (!hf_exists_(src) || !hf_exists_(dst)) return ZDP_OK;
    json_error_t je = {.line = 0};
    json_t *a = json_load_file(src, JSON_REJECT_DUPLICATES, &je);
    json_t *b = json_is_object(a) ? json_load_file(dst, JSON_REJECT_DUPLICATES, &je) : NULL;
    if (!json_is_object(b)) {
        const char *bad = json_is_object(a) ? dst : src;
        const bool parsed = json_is_object(a) ? b != NULL : a != NULL;
        json_decref(a);
        json_decref(b);
        if (parsed)
            return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: not a JSON object; a config.json is "
                               "one ({\"model_type\": ...})", bad);
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: line %d: %s; fix the JSON", bad, je.line,
                           je.text);
    }
    bool added = false;
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        json_t *v = json_object_get(a, keys[k]);
        if (v == NULL || json_object_get(b, keys[k]) != NULL) continue;
        json_object_set(b, keys[k], v);
        added = true;
    }
    json_decref(a);
    if (!added) {
        json_decref(b);
        return ZDP_OK;
    }
    return hf_write_json_(dst, b, err); /* takes b */
}

zdp_status zdp_hf_copy_tokenizer(const char *from, const char *to, int *n_copied,
                                 zdp_error *err) {
    if (from == NULL || to == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_hf_copy_tokenizer: from and to must "
                           "not be NULL");
    int copied = 0;
    zdp_status s = ZDP_OK;
    for (size_t i = 0; i < sizeof hf_tokenizer_files_ / sizeof hf_tokenizer_files_[0]; i++) {
        char src[HF_PATH_MAX], dst[HF_PATH_MAX];
        snprintf(src, sizeof src, "%s/%s", from, hf_tokenizer_files_[i]);
        snprintf(dst, sizeof dst, "%s/%s", to, hf_tokenizer_files_[i]);
        if (!hf_exists_(src)) continue;
        size_t len = 0;
        char *data = hf_slurp_(src, &len);
        if (data == NULL) {
            s = zdp_err_set(err, ZDP_ERR_IO, "%s: cannot read: %s", src, strerror(errno));
            break;
        }
        s = hf_write_atomic_(dst, data, len, err);
        free(data);
        if (s != ZDP_OK) break;
        copied++;
    }
    if (s == ZDP_OK) s = hf_copy_token_ids_(from, to, err);
    if (s == ZDP_OK && copied == 0)
        s = zdp_err_set(err, ZDP_ERR_IO, "%s: no tokenizer files (tokenizer.json, "
                        "tokenizer_config.json, vocab.json + merges.txt, encoder.json + "
                        "vocab.bpe, ...); give a folder that holds a tokenizer", from);
    if (n_copied != NULL) *n_copied = copied;
    return s;
}
