/*
 * hf_config.c -- a Hugging Face folder's config.json (zdp/hf.h): read into a
 * zdp_hf_config, written back from a model, and the model it describes
 * (the factory, and zdp_model_destroy for whichever family it made).
 *
 * The reader's rule: every key that changes the math is read, with
 * transformers' default (configuration_llama.py, configuration_qwen3.py,
 * configuration_gpt2.py) when absent; a key that would change the math in a
 * way zdp does not compute is refused by name, so a folder either trains
 * exactly as transformers would run it or not at all.  Keys that do not
 * change the math (token ids, torch_dtype, use_cache) are ignored.
 *
 * The factory depends on the models (zdp_gpt_create, zdp_llama_create)
 * through the public API only; it lives here, next to the config it reads.
 *
 * Not here: the weights (hf_folder.c and hf_reader.c read them, hf_save.c
 * writes them and calls the writer here for config.json).
 */
#define _POSIX_C_SOURCE 200809L

#include "hf_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "../core/json.h"
#include "zdp/gpt.h"
#include "zdp/hf.h"
#include "zdp/llama.h"
#include "zdp/model.h"

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
    char *text = zdp_hf_slurp_(path, &len);
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


/* ---- config.json: writing ------------------------------------------------------ */

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

json_t *zdp_hf_config_json_(const zdp_model *model, zdp_dtype dtype) {
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
