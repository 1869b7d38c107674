/*
 * gpt_io.c -- GPT-2 weights in the formats people have: Hugging Face
 * safetensors (GPT2LMHeadModel) and llm.c model checkpoints, read into the
 * model's parameter views; and a GPT2LMHeadModel-compatible safetensors
 * writer.
 *
 * zdp's GPT-2 parameters carry Hugging Face's names and layouts (zdp/gpt.h):
 * Conv1D weights are [in, out].  A safetensors file therefore copies in
 * tensor by tensor after a name lookup (with or without the "transformer."
 * prefix) and a dtype conversion to fp32.  An llm.c file holds
 * the same numbers in llm.c's order and torch.nn.Linear's (out, in) layout,
 * with wte padded to Vp rows; it is read sequentially, one layer slice at a
 * time, transposing the four matrix weights and dropping the padding rows.
 *
 * Invariants: every check (format, config against file, each tensor's
 * presence, shape and dtype, tensors the model lacks) runs before the first
 * write into the caller's views, so a mismatch leaves them untouched.  The
 * expected parameter list is derived from the config here, and the caller's
 * params must match it by name and shape (any order).
 *
 * Not here: writing llm.c checkpoints, untied lm_head weights; whole
 * Hugging Face folders (config.json, sharded model-00001-of-0000N files)
 * are the hf_*.c files'.
 */
#define _POSIX_C_SOURCE 200809L

#include "io.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "zdp/gpt.h"
#include "zdp/io.h"
#include "zdp/model.h"

#define GIO_PREFIX "transformer."
#define GIO_PREFIX_LEN 12
#define GIO_LLMC_MAGIC 20240326
#define GIO_LLMC_HEADER_INTS 256
#define GIO_NAME_MAX 96

/* ---- the expected parameter list ------------------------------------------ */

/* One tensor of zdp's GPT-2 as zdp/gpt.h lists it. */
typedef struct gio_param_ {
    char name[GIO_NAME_MAX]; /* "transformer.h.0.attn.c_attn.weight" */
    int ndim;
    int64_t shape[2];
} gio_param_;

/* Per-layer tensors in registration order: suffix after "transformer.h.{i}.",
 * and shape as multiples of C (cols 0 = a vector). */
static const struct {
    const char *suffix;
    int rows_c, cols_c;
} gio_layer_[] = {
    {"ln_1.weight", 1, 0},        {"ln_1.bias", 1, 0},
    {"attn.c_attn.weight", 1, 3}, {"attn.c_attn.bias", 3, 0},
    {"attn.c_proj.weight", 1, 1}, {"attn.c_proj.bias", 1, 0},
    {"ln_2.weight", 1, 0},        {"ln_2.bias", 1, 0},
    {"mlp.c_fc.weight", 1, 4},    {"mlp.c_fc.bias", 4, 0},
    {"mlp.c_proj.weight", 4, 1},  {"mlp.c_proj.bias", 1, 0},
};
#define GIO_PER_LAYER 12

static int gio_expected_count_(const zdp_gpt_config *cfg) {
    return 4 + GIO_PER_LAYER * cfg->n_layer;
}

static void gio_set_(gio_param_ *p, const char *name, int64_t d0, int64_t d1) {
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = d1 > 0 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1 > 0 ? d1 : 0;
}

/* Fills out[0 .. gio_expected_count_) in zdp/gpt.h's registration order. */
static void gio_expected_(const zdp_gpt_config *cfg, gio_param_ *out) {
    int64_t C = cfg->n_embd;
    gio_set_(&out[0], GIO_PREFIX "wte.weight", cfg->vocab_size, C);
    gio_set_(&out[1], GIO_PREFIX "wpe.weight", cfg->block_size, C);
    int k = 2;
    for (int l = 0; l < cfg->n_layer; l++) {
        for (int t = 0; t < GIO_PER_LAYER; t++, k++) {
            char name[GIO_NAME_MAX];
            snprintf(name, sizeof name, GIO_PREFIX "h.%d.%s", l, gio_layer_[t].suffix);
            gio_set_(&out[k], name, gio_layer_[t].rows_c * C,
                     gio_layer_[t].cols_c * C);
        }
    }
    gio_set_(&out[k], GIO_PREFIX "ln_f.weight", C, 0);
    gio_set_(&out[k + 1], GIO_PREFIX "ln_f.bias", C, 0);
}

static bool gio_same_shape_(const int64_t *a, int na, const int64_t *b, int nb) {
    if (na != nb) return false;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i]) return false;
    return true;
}

/* The name without the "transformer." prefix. */
static const char *gio_strip_(const char *name) {
    return strncmp(name, GIO_PREFIX, GIO_PREFIX_LEN) == 0 ? name + GIO_PREFIX_LEN : name;
}

/* Checks the config and that params are exactly the expected list (by name,
 * any order, with the expected shapes).  On success map[e] is the params
 * index of expected tensor e.  Both arrays have gio_expected_count_ entries. */
static zdp_status gio_check_params_(const char *path, const zdp_gpt_config *cfg,
                                    const zdp_param_info *params, int n_params,
                                    float *const *dst, gio_param_ *expected, int *map,
                                    zdp_error *err) {
    if (cfg->n_layer < 1 || cfg->n_head < 1 || cfg->n_embd < 1 || cfg->vocab_size < 1 ||
        cfg->block_size < 1 || cfg->n_embd % cfg->n_head != 0 || cfg->n_layer > 100000)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: config n_layer = %d, n_head = %d, n_embd = %d, vocab_size = "
                           "%d, block_size = %d is not a valid GPT-2 config (all >= 1, n_head "
                           "divides n_embd)", path, cfg->n_layer, cfg->n_head, cfg->n_embd,
                           cfg->vocab_size, cfg->block_size);
    int n_exp = gio_expected_count_(cfg);
    gio_expected_(cfg, expected);
    if (n_params != n_exp)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: %d parameter tensors given, but GPT-2 with n_layer = %d has "
                           "%d (2 + 12 * n_layer + 2); pass the model's own params",
                           path, n_params, cfg->n_layer, n_exp);
    for (int e = 0; e < n_exp; e++) map[e] = -1;
    char a[64], b[64];
    for (int i = 0; i < n_params; i++) {
        if (params[i].name == NULL || dst[i] == NULL)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: params[%d]: %s is NULL", path,
                               i, params[i].name == NULL ? "name" : "dst view");
        int e = 0;
        while (e < n_exp && strcmp(expected[e].name, params[i].name) != 0) e++;
        if (e == n_exp)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: params[%d] \"%s\" is not a GPT-2 parameter for n_layer = "
                               "%d (names as in zdp.h, e.g. \"%s\"); pass the model's own "
                               "params", path, i, params[i].name, cfg->n_layer,
                               expected[0].name);
        if (map[e] >= 0)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: params[%d] and params[%d] are both \"%s\"", path, map[e],
                               i, params[i].name);
        if (!gio_same_shape_(params[i].shape, params[i].ndim, expected[e].shape,
                             expected[e].ndim))
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: params[%d] \"%s\" has shape %s, but the config implies %s; "
                               "pass the params of a model created with this config", path, i,
                               params[i].name,
                               zdp_io_shape_str(params[i].shape, params[i].ndim, a, sizeof a),
                               zdp_io_shape_str(expected[e].shape, expected[e].ndim, b, sizeof b));
        map[e] = i;
    }
    return ZDP_OK;
}

static const char *gio_cfg_str_(const zdp_gpt_config *cfg, char *buf, size_t cap) {
    snprintf(buf, cap, "n_layer = %d, n_head = %d, n_embd = %d, vocab_size = %d, "
             "block_size = %d", cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->vocab_size,
             cfg->block_size);
    return buf;
}

/* ---- safetensors ----------------------------------------------------------- */

/* For "h.{i}.rest" (prefix stripped) sets *layer and *rest; false otherwise. */
static bool gio_parse_layer_(const char *name, long *layer, const char **rest) {
    if (strncmp(name, "h.", 2) != 0) return false;
    const char *p = name + 2;
    if (*p < '0' || *p > '9') return false;
    char *end;
    errno = 0;
    long l = strtol(p, &end, 10);
    if (errno != 0 || *end != '.') return false;
    *layer = l;
    *rest = end + 1;
    return true;
}

static bool gio_is_mask_buffer_(const char *stripped) {
    long l;
    const char *rest;
    return gio_parse_layer_(stripped, &l, &rest) &&
           (strcmp(rest, "attn.bias") == 0 || strcmp(rest, "attn.masked_bias") == 0);
}

/* Finds the file tensor for an expected (prefixed) name, accepting either
 * spelling; NULL if absent. */
static const zdp_tensor *gio_find_(const zdp_safetensors *st, const char *name) {
    const zdp_tensor *t = zdp_safetensors_find(st, name);
    return t != NULL ? t : zdp_safetensors_find(st, gio_strip_(name));
}

/* The checks on wte, wpe and the layer count, which give the most useful
 * fix for a file of another configuration. */
static zdp_status gio_st_check_config_(const char *path, const zdp_safetensors *st,
                                       const zdp_gpt_config *cfg, zdp_error *err) {
    char cs[192], a[64], b[64];
    const zdp_tensor *wte = gio_find_(st, GIO_PREFIX "wte.weight");
    const zdp_tensor *wpe = gio_find_(st, GIO_PREFIX "wpe.weight");
    int64_t want_wte[2] = {cfg->vocab_size, cfg->n_embd};
    int64_t want_wpe[2] = {cfg->block_size, cfg->n_embd};
    if (wte != NULL && wte->ndim == 2 && !gio_same_shape_(wte->shape, 2, want_wte, 2))
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "%s: tensor \"%s\": file shape %s, model shape %s; the file is for "
                           "vocab_size = %" PRId64 ", n_embd = %" PRId64 " (config: %s); set "
                           "vocab_size and n_embd to the file's", path, wte->name,
                           zdp_io_shape_str(wte->shape, 2, a, sizeof a),
                           zdp_io_shape_str(want_wte, 2, b, sizeof b), wte->shape[0],
                           wte->shape[1], gio_cfg_str_(cfg, cs, sizeof cs));
    if (wpe != NULL && wpe->ndim == 2 && !gio_same_shape_(wpe->shape, 2, want_wpe, 2))
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "%s: tensor \"%s\": file shape %s, model shape %s; the file is for "
                           "block_size = %" PRId64 ", n_embd = %" PRId64 " (config: %s); set "
                           "block_size to the file's (zdp does not crop or extend wpe)", path,
                           wpe->name, zdp_io_shape_str(wpe->shape, 2, a, sizeof a),
                           zdp_io_shape_str(want_wpe, 2, b, sizeof b), wpe->shape[0],
                           wpe->shape[1], gio_cfg_str_(cfg, cs, sizeof cs));
    long max_layer = -1;
    const char *max_name = NULL;
    for (int i = 0; i < st->n; i++) {
        long l;
        const char *rest;
        if (gio_parse_layer_(gio_strip_(st->tensors[i].name), &l, &rest) && l > max_layer) {
            max_layer = l;
            max_name = st->tensors[i].name;
        }
    }
    if (max_layer >= cfg->n_layer)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "%s: tensor \"%s\": the file has layers up to h.%ld (%ld layers) "
                           "but config n_layer = %d; set n_layer = %ld", path, max_name,
                           max_layer, max_layer + 1, cfg->n_layer, max_layer + 1);
    if (max_layer >= 0 && max_layer + 1 < cfg->n_layer)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "%s: the file has %ld layers (h.0..h.%ld) but config n_layer = %d "
                           "(tensor \"" GIO_PREFIX "h.%d.ln_1.weight\" is missing); set "
                           "n_layer = %ld", path, max_layer + 1, max_layer, cfg->n_layer,
                           cfg->n_layer - 1, max_layer + 1);
    return ZDP_OK;
}

/* Files zdp writes (a checkpoint's model.safetensors, zdp ckpt export,
 * --save-weights) carry the model's shape in __metadata__.zdp_model.  It is
 * the only place a safetensors file can say n_head, which no tensor's shape
 * shows, so that is checked here; files without it (Hugging Face's) cannot
 * be.
 * Anything unreadable is left to the safetensors reader to report. */
static zdp_status gio_check_zdp_model_(const char *path, FILE *f, int64_t file_bytes,
                                       const zdp_gpt_config *cfg, zdp_error *err) {
    unsigned char lb[8];
    if (fread(lb, 1, sizeof lb, f) != sizeof lb) return ZDP_OK;
    uint64_t n = 0;
    for (int b = 0; b < 8; b++) n |= (uint64_t)lb[b] << (8 * b);
    if (file_bytes < 8 || n > (uint64_t)(file_bytes - 8) || n > ((uint64_t)100 << 20)) return ZDP_OK;
    char *text = malloc((size_t)n + 1);
    if (text == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
    json_t *hdr = fread(text, 1, (size_t)n, f) == (size_t)n ? json_loadb(text, (size_t)n, 0, NULL)
                                                           : NULL;
    free(text);
    const char *s = json_string_value(json_object_get(json_object_get(hdr, "__metadata__"),
                                                      "zdp_model"));
    json_t *shape = s != NULL ? json_loads(s, 0, NULL) : NULL;
    zdp_status st = ZDP_OK;
    const char *kind = json_string_value(json_object_get(shape, "model"));
    if (kind != NULL && strcmp(kind, "gpt") != 0)
        st = zdp_err_set(err, ZDP_ERR_CONFIG,
                         "%s: zdp saved these weights for a model \"%s\" (__metadata__ "
                         "zdp_model), not a GPT", path, kind);
    /* n_head only: every other shape flag shows in a tensor's shape, and the
     * tensor checks name that tensor. */
    const struct { const char *key, *flag; int have; } k[] = {
        {"n_head", "n-head", cfg->n_head},
    };
    for (size_t i = 0; st == ZDP_OK && json_is_object(shape) && i < sizeof k / sizeof k[0]; i++) {
        json_t *v = json_object_get(shape, k[i].key);
        if (!json_is_integer(v) || json_integer_value(v) == k[i].have) continue;
        long long want = (long long)json_integer_value(v);
        st = zdp_err_set(err, ZDP_ERR_CONFIG,
                         "%s: zdp saved these weights for a GPT with %s = %lld (__metadata__ "
                         "zdp_model), but the config has %s = %d; set %s = %lld (the zdp "
                         "command: --%s %lld)", path, k[i].key, want, k[i].key, k[i].have,
                         k[i].key, want, k[i].flag, want);
    }
    json_decref(shape);
    json_decref(hdr);
    return st;
}

static zdp_status gio_load_safetensors_(const char *path, const zdp_gpt_config *cfg,
                                        const gio_param_ *expected, const int *map,
                                        float *const *dst, zdp_error *err) {
    zdp_safetensors st = {0};
    zdp_status s = zdp_safetensors_read(path, &st, err);
    if (s != ZDP_OK) return s;
    int n_exp = gio_expected_count_(cfg);
    char a[64], b[64], cs[192];
    int n_mask = 0;
    const zdp_tensor *lm_head = NULL;

    /* Every file tensor must be something we know, under one spelling. */
    for (int i = 0; i < st.n; i++) {
        const char *name = st.tensors[i].name;
        const char *bare = gio_strip_(name);
        if (bare != name && zdp_safetensors_find(&st, bare) != NULL) {
            s = zdp_err_set(err, ZDP_ERR_FORMAT,
                            "%s: tensor \"%s\" is present both with and without the \""
                            GIO_PREFIX "\" prefix; keep one", path, bare);
            goto done;
        }
        if (strcmp(bare, "lm_head.weight") == 0) {
            lm_head = &st.tensors[i];
            continue;
        }
        if (gio_is_mask_buffer_(bare)) {
            n_mask++;
            continue;
        }
        bool known = false;
        for (int e = 0; e < n_exp && !known; e++)
            known = strcmp(gio_strip_(expected[e].name), bare) == 0;
        if (!known) {
            s = gio_st_check_config_(path, &st, cfg, err);
            if (s == ZDP_OK)
                s = zdp_err_set(err, ZDP_ERR_FORMAT,
                                "%s: tensor \"%s\" (shape %s) is not a parameter of zdp's "
                                "GPT-2 (%s), so there is nowhere to load it; zdp reads "
                                "GPT2LMHeadModel files (names as in zdp.h, \"" GIO_PREFIX
                                "\" prefix optional)", path, name,
                                zdp_io_shape_str(st.tensors[i].shape, st.tensors[i].ndim, a,
                                               sizeof a), gio_cfg_str_(cfg, cs, sizeof cs));
            goto done;
        }
    }
    s = gio_st_check_config_(path, &st, cfg, err);
    if (s != ZDP_OK) goto done;

    /* Every expected tensor present, with its shape and a dtype we convert. */
    zdp_dtype seen = ZDP_DTYPE_F32;
    for (int e = 0; e < n_exp; e++) {
        const zdp_tensor *t = gio_find_(&st, expected[e].name);
        if (t == NULL) {
            s = zdp_err_set(err, ZDP_ERR_FORMAT,
                            "%s: tensor \"%s\" (or \"%s\") is missing; the model needs it with "
                            "shape %s (config: %s); the file has %d tensors and is not a "
                            "complete GPT2LMHeadModel checkpoint for this config", path,
                            expected[e].name, gio_strip_(expected[e].name),
                            zdp_io_shape_str(expected[e].shape, expected[e].ndim, a, sizeof a),
                            gio_cfg_str_(cfg, cs, sizeof cs), st.n);
            goto done;
        }
        if (!gio_same_shape_(t->shape, t->ndim, expected[e].shape, expected[e].ndim)) {
            bool linear = t->ndim == 2 && expected[e].ndim == 2 &&
                          t->shape[0] == expected[e].shape[1] &&
                          t->shape[1] == expected[e].shape[0];
            s = zdp_err_set(err, ZDP_ERR_CONFIG,
                            "%s: tensor \"%s\": file shape %s, model shape %s (config: %s); %s",
                            path, t->name, zdp_io_shape_str(t->shape, t->ndim, a, sizeof a),
                            zdp_io_shape_str(expected[e].shape, expected[e].ndim, b, sizeof b),
                            gio_cfg_str_(cfg, cs, sizeof cs),
                            linear ? "the file stores it transposed, as torch.nn.Linear "
                                     "[out, in] (nanoGPT); zdp and GPT2LMHeadModel use Conv1D "
                                     "[in, out]: transpose the c_attn, c_proj and c_fc "
                                     "weights before saving"
                                   : "the file was saved for another configuration: set the "
                                     "config to match it");
            goto done;
        }
        if (!zdp_io_dtype_float(t->dtype)) {
            s = zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                            "%s: tensor \"%s\": dtype %s; zdp loads F32, F16 and BF16 weights "
                            "(convert with torch: model.float().save_pretrained(...))", path,
                            t->name, zdp_dtype_name(t->dtype));
            goto done;
        }
        if (t->dtype != ZDP_DTYPE_F32) seen = t->dtype;
    }

    /* The model ties lm_head to wte: an equal head is redundant, a different
     * one is a model zdp cannot represent. */
    const zdp_tensor *wte = gio_find_(&st, expected[0].name);
    if (lm_head != NULL) {
        if (!gio_same_shape_(lm_head->shape, lm_head->ndim, wte->shape, wte->ndim) ||
            !zdp_io_dtype_float(lm_head->dtype)) {
            s = zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                            "%s: tensor \"%s\": shape %s dtype %s, but zdp ties lm_head to "
                            "\"%s\" (shape %s); an untied or resized head is not supported",
                            path, lm_head->name,
                            zdp_io_shape_str(lm_head->shape, lm_head->ndim, a, sizeof a),
                            zdp_dtype_name(lm_head->dtype), wte->name,
                            zdp_io_shape_str(wte->shape, wte->ndim, b, sizeof b));
            goto done;
        }
        int64_t n = zdp_io_numel(wte->shape, wte->ndim);
        for (int64_t i = 0; i < n; i++) {
            float x = zdp_io_f32_at(lm_head, i), y = zdp_io_f32_at(wte, i);
            if (memcmp(&x, &y, sizeof x) != 0) {
                s = zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                                "%s: tensor \"%s\" differs from \"%s\" (first at element %"
                                PRId64 ": %g vs %g); zdp's GPT-2 ties lm_head to wte, so an "
                                "untied head cannot be loaded", path, lm_head->name,
                                wte->name, i, (double)x, (double)y);
                goto done;
            }
        }
    }

    /* Everything checked: copy. */
    for (int e = 0; e < n_exp; e++) {
        const zdp_tensor *t = gio_find_(&st, expected[e].name);
        float *out = dst[map[e]];
        int64_t n = zdp_io_numel(t->shape, t->ndim);
        if (t->dtype == ZDP_DTYPE_F32) {
            memcpy(out, t->data, (size_t)n * sizeof(float));
        } else {
            for (int64_t i = 0; i < n; i++) out[i] = zdp_io_f32_at(t, i);
        }
    }
    zdp_log(0, "%s: loaded %d GPT-2 tensors from safetensors (%s%s)%s%s", path, n_exp,
            zdp_dtype_name(seen), seen != ZDP_DTYPE_F32 ? " converted to F32" : "",
            n_mask > 0 ? "; ignored the attention-mask buffers" : "",
            lm_head != NULL ? "; lm_head.weight equals wte (tied), skipped" : "");

done:
    zdp_safetensors_free(&st);
    return s;
}

/* ---- llm.c checkpoints ----------------------------------------------------- */

/* llm.c's 16 tensors in file order.  Shapes are (rows, cols) as multiples of
 * C (cols 0 = a vector), per layer when per_layer; rows_c < 0 marks wte (Vp
 * rows) and wpe (maxT rows).  transpose: an (out, in) matrix that zdp holds
 * as [in, out]. */
static const struct {
    const char *llmc;   /* llm.c's name, for messages */
    const char *zdp;    /* zdp's name (after "transformer." / "transformer.h.{i}.") */
    bool per_layer;
    int rows_c, cols_c;
    bool transpose;
} gio_llmc_[] = {
    {"wte", "wte.weight", false, -1, 1, false},
    {"wpe", "wpe.weight", false, -2, 1, false},
    {"ln1w", "ln_1.weight", true, 1, 0, false},
    {"ln1b", "ln_1.bias", true, 1, 0, false},
    {"qkvw", "attn.c_attn.weight", true, 3, 1, true},
    {"qkvb", "attn.c_attn.bias", true, 3, 0, false},
    {"attprojw", "attn.c_proj.weight", true, 1, 1, true},
    {"attprojb", "attn.c_proj.bias", true, 1, 0, false},
    {"ln2w", "ln_2.weight", true, 1, 0, false},
    {"ln2b", "ln_2.bias", true, 1, 0, false},
    {"fcw", "mlp.c_fc.weight", true, 4, 1, true},
    {"fcb", "mlp.c_fc.bias", true, 4, 0, false},
    {"fcprojw", "mlp.c_proj.weight", true, 1, 4, true},
    {"fcprojb", "mlp.c_proj.bias", true, 1, 0, false},
    {"lnfw", "ln_f.weight", false, 1, 0, false},
    {"lnfb", "ln_f.bias", false, 1, 0, false},
};
#define GIO_LLMC_NTENSORS 16

typedef struct gio_llmc_hdr_ {
    int version, maxT, V, L, NH, C, Vp;
} gio_llmc_hdr_;

/* Elements tensor t of llm.c's list holds per layer (or in all, if not per
 * layer), for header h. */
static int64_t gio_llmc_slice_(int t, const gio_llmc_hdr_ *h, int64_t *rows, int64_t *cols) {
    int64_t C = h->C;
    *rows = gio_llmc_[t].rows_c == -1 ? h->Vp
            : gio_llmc_[t].rows_c == -2 ? h->maxT
                                        : gio_llmc_[t].rows_c * C;
    *cols = gio_llmc_[t].cols_c == 0 ? 1 : gio_llmc_[t].cols_c * C;
    return *rows * *cols;
}

/* Reads n elements (fp32 or bf16) as floats into out; false on a short read. */
static bool gio_read_floats_(FILE *f, bool bf16, void *raw, float *out, int64_t n) {
    if (!bf16) return fread(out, sizeof(float), (size_t)n, f) == (size_t)n;
    if (fread(raw, 2, (size_t)n, f) != (size_t)n) return false;
    const zdp_tensor t = {.dtype = ZDP_DTYPE_BF16, .data = raw};
    for (int64_t i = 0; i < n; i++) out[i] = zdp_io_f32_at(&t, i);
    return true;
}

static zdp_status gio_llmc_check_header_(const char *path, const int32_t *hd,
                                         const zdp_gpt_config *cfg, gio_llmc_hdr_ *h,
                                         zdp_error *err) {
    h->version = hd[1];
    h->maxT = hd[2];
    h->V = hd[3];
    h->L = hd[4];
    h->NH = hd[5];
    h->C = hd[6];
    h->Vp = hd[7];
    if (h->version != 3 && h->version != 5)
        return zdp_err_set(err, ZDP_ERR_UNSUPPORTED,
                           "%s: llm.c checkpoint version %d; zdp reads version 3 (fp32) and 5 "
                           "(bf16); re-export it with llm.c's train_gpt2.py", path, h->version);
    if (h->maxT < 1 || h->V < 1 || h->L < 1 || h->NH < 1 || h->C < 1 || h->Vp < h->V ||
        h->C % h->NH != 0)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: llm.c header maxT = %d, V = %d, L = %d, NH = %d, C = %d, Vp = "
                           "%d is not a valid GPT-2 (all >= 1, Vp >= V, NH divides C); the "
                           "file is corrupt", path, h->maxT, h->V, h->L, h->NH, h->C, h->Vp);
    char cs[400];
    zdp_gpt_config fc = {.n_layer = h->L, .n_head = h->NH, .n_embd = h->C,
                         .vocab_size = h->V, .block_size = h->maxT};
    size_t len = strlen(gio_cfg_str_(cfg, cs, sizeof cs));
    snprintf(cs + len, sizeof cs - len, "; the file's: ");
    len = strlen(cs);
    gio_cfg_str_(&fc, cs + len, sizeof cs - len);
    if (h->V != cfg->vocab_size || h->C != cfg->n_embd)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "%s: tensor wte (\"" GIO_PREFIX "wte.weight\"): file shape [%d, %d] "
                           "(padded to %d rows), model shape [%d, %d]; the llm.c header says "
                           "V = %d, C = %d (config: %s); set vocab_size = %d and n_embd = %d",
                           path, h->V, h->C, h->Vp, cfg->vocab_size, cfg->n_embd, h->V, h->C,
                           cs, h->V, h->C);
    if (h->maxT != cfg->block_size)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "%s: tensor wpe (\"" GIO_PREFIX "wpe.weight\"): file shape [%d, %d], "
                           "model shape [%d, %d]; the llm.c header says maxT = %d (config: "
                           "%s); set block_size = %d (zdp does not crop or extend wpe)", path,
                           h->maxT, h->C, cfg->block_size, cfg->n_embd, h->maxT, cs, h->maxT);
    if (h->L != cfg->n_layer)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "%s: tensor ln1w (\"" GIO_PREFIX "h.{i}.ln_1.weight\"): file shape "
                           "[%d, %d] (L = %d layers), model [%d, %d] (config: %s); set "
                           "n_layer = %d", path, h->L, h->C, h->L, cfg->n_layer, cfg->n_embd,
                           cs, h->L);
    if (h->NH != cfg->n_head)
        return zdp_err_set(err, ZDP_ERR_CONFIG,
                           "%s: tensor qkvw (\"" GIO_PREFIX "h.0.attn.c_attn.weight\", shape "
                           "[%d, %d] either way): the llm.c header says NH = %d heads, the "
                           "config n_head = %d (config: %s); set n_head = %d", path, h->C,
                           3 * h->C, h->NH, cfg->n_head, cs, h->NH);
    return ZDP_OK;
}

static zdp_status gio_load_llmc_(const char *path, FILE *f, int64_t file_bytes,
                                 const zdp_gpt_config *cfg, const gio_param_ *expected,
                                 const int *map, float *const *dst, zdp_error *err) {
    int32_t hd[GIO_LLMC_HEADER_INTS];
    if (file_bytes < (int64_t)sizeof hd ||
        fread(hd, sizeof hd[0], GIO_LLMC_HEADER_INTS, f) != GIO_LLMC_HEADER_INTS)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: %" PRId64 " bytes, shorter than llm.c's 1024-byte header; the "
                           "file is truncated", path, file_bytes);
    gio_llmc_hdr_ h;
    zdp_status s = gio_llmc_check_header_(path, hd, cfg, &h, err);
    if (s != ZDP_OK) return s;

    bool bf16 = h.version == 5;
    int64_t esize = bf16 ? 2 : 4, total = 0, max_slice = 0, rows, cols;
    for (int t = 0; t < GIO_LLMC_NTENSORS; t++) {
        int64_t n = gio_llmc_slice_(t, &h, &rows, &cols);
        total += n * (gio_llmc_[t].per_layer ? h.L : 1);
        if (gio_llmc_[t].transpose && n > max_slice) max_slice = n;
    }
    int64_t want = (int64_t)sizeof hd + total * esize;
    if (file_bytes != want)
        return zdp_err_set(err, ZDP_ERR_FORMAT,
                           "%s: %" PRId64 " bytes, but an llm.c version %d checkpoint with "
                           "maxT = %d, V = %d (Vp = %d), L = %d, C = %d has 1024 + %" PRId64
                           " x %" PRId64 " = %" PRId64 " bytes; the file is %s", path,
                           file_bytes, h.version, h.maxT, h.V, h.Vp, h.L, h.C, total, esize,
                           want, file_bytes < want ? "truncated" : "corrupt (extra bytes)");

    /* Non-transposed tensors stream through the same scratch in chunks. */
    int64_t cap = max_slice > 65536 ? max_slice : 65536;
    float *scratch = malloc((size_t)cap * sizeof(float));
    void *raw = bf16 ? malloc((size_t)cap * 2) : NULL;
    if (scratch == NULL || (bf16 && raw == NULL)) {
        free(scratch);
        free(raw);
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for a %" PRId64
                           "-element read buffer", path, cap);
    }
    int n_exp = gio_expected_count_(cfg);
    for (int t = 0; t < GIO_LLMC_NTENSORS && s == ZDP_OK; t++) {
        int64_t n = gio_llmc_slice_(t, &h, &rows, &cols);
        int layers = gio_llmc_[t].per_layer ? h.L : 1;
        for (int l = 0; l < layers && s == ZDP_OK; l++) {
            char name[GIO_NAME_MAX];
            if (gio_llmc_[t].per_layer)
                snprintf(name, sizeof name, GIO_PREFIX "h.%d.%s", l, gio_llmc_[t].zdp);
            else
                snprintf(name, sizeof name, GIO_PREFIX "%s", gio_llmc_[t].zdp);
            int e = 0;
            while (e < n_exp && strcmp(expected[e].name, name) != 0) e++;
            if (e == n_exp) { /* cannot happen: the tables agree */
                s = zdp_err_set(err, ZDP_ERR_INTERNAL, "%s: no zdp tensor %s", path, name);
                break;
            }
            float *out = dst[map[e]];
            bool ok = true;
            if (gio_llmc_[t].transpose) {
                /* (out=rows, in=cols) -> [in, out] */
                ok = gio_read_floats_(f, bf16, raw, scratch, n);
                for (int64_t o = 0; ok && o < rows; o++)
                    for (int64_t i = 0; i < cols; i++) out[i * rows + o] = scratch[o * cols + i];
            } else {
                /* wte keeps only its first V rows. */
                int64_t keep = gio_llmc_[t].rows_c == -1 ? (int64_t)h.V * cols : n;
                for (int64_t done = 0; ok && done < n;) {
                    int64_t chunk = n - done < cap ? n - done : cap;
                    ok = gio_read_floats_(f, bf16, raw, scratch, chunk);
                    if (ok && done < keep)
                        memcpy(out + done, scratch,
                               (size_t)(keep - done < chunk ? keep - done : chunk) *
                                   sizeof(float));
                    done += chunk;
                }
            }
            if (!ok)
                s = zdp_err_set(err, ZDP_ERR_IO, "%s: reading tensor %s (\"%s\"): %s", path,
                                gio_llmc_[t].llmc, name,
                                ferror(f) ? strerror(errno)
                                          : "unexpected end of file (was the file changed "
                                            "while it was read?)");
        }
    }
    free(scratch);
    free(raw);
    if (s == ZDP_OK)
        zdp_log(0, "%s: loaded llm.c checkpoint (version %d, %s; maxT %d, V %d padded to %d, "
                "L %d, NH %d, C %d)", path, h.version, bf16 ? "bf16 converted to F32" : "fp32",
                h.maxT, h.V, h.Vp, h.L, h.NH, h.C);
    return s;
}

/* ---- entry points ---------------------------------------------------------- */

/* NaN or Inf in a weights file is refused at load: a model that starts
 * non-finite skips every step (or, at inference, answers garbage). */
static zdp_status gio_check_finite_(const char *path, const zdp_param_info *params, int n_params,
                                    float *const *dst, zdp_error *err) {
    for (int i = 0; i < n_params; i++) {
        const zdp_param_info *p = &params[i];
        const int64_t n = zdp_io_numel(p->shape, p->ndim);
        const int64_t cols = p->ndim == 2 ? p->shape[1] : n;
        for (int64_t k = 0; k < n; k++) {
            if (isfinite(dst[i][k])) continue;
            char at[64];
            if (p->ndim == 2)
                snprintf(at, sizeof at, "[%lld, %lld]", (long long)(k / cols), (long long)(k % cols));
            else
                snprintf(at, sizeof at, "[%lld]", (long long)k);
            return zdp_err_set(err, ZDP_ERR_FORMAT,
                               "%s: tensor %s%s = %g: weights must be finite (NaN or Inf would "
                               "make every step skip); fix: load a file saved from a healthy run",
                               path, p->name, at, (double)dst[i][k]);
        }
    }
    return ZDP_OK;
}

zdp_status zdp_gpt_weights_load(const char *path, const zdp_gpt_config *cfg,
                                const zdp_param_info *params, int n_params,
                                float *const *dst, zdp_error *err) {
    if (path == NULL || cfg == NULL || params == NULL || dst == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_gpt_weights_load: path, cfg, params and dst must not be NULL");
    if (cfg->n_layer < 1 || cfg->n_layer > 100000)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: config n_layer = %d, expected 1..100000", path, cfg->n_layer);
    int n_exp = gio_expected_count_(cfg);
    gio_param_ *expected = malloc((size_t)n_exp * sizeof *expected);
    int *map = malloc((size_t)n_exp * sizeof *map);
    FILE *f = NULL;
    zdp_status s;
    if (expected == NULL || map == NULL) {
        s = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    s = gio_check_params_(path, cfg, params, n_params, dst, expected, map, err);
    if (s != ZDP_OK) goto done;

    f = fopen(path, "rb");
    if (f == NULL) {
        s = zdp_err_set(err, ZDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto done;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        s = zdp_err_set(err, ZDP_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto done;
    }
    unsigned char head[16] = {0};
    size_t got = fread(head, 1, sizeof head, f);
    rewind(f);
    int32_t magic = (int32_t)((uint32_t)head[0] | (uint32_t)head[1] << 8 |
                              (uint32_t)head[2] << 16 | (uint32_t)head[3] << 24);
    if (got >= 4 && magic == GIO_LLMC_MAGIC) {
        s = gio_load_llmc_(path, f, (int64_t)sb.st_size, cfg, expected, map, dst, err);
    } else if (got >= 9 && head[8] == '{') {
        s = gio_check_zdp_model_(path, f, (int64_t)sb.st_size, cfg, err);
        fclose(f);
        f = NULL;
        if (s == ZDP_OK) s = gio_load_safetensors_(path, cfg, expected, map, dst, err);
    } else {
        const char *hint = magic == 20240520 ? " (it is an llm.c token shard, not a model)"
                           : magic == 20240327 ? " (it is an llm.c debug state, not a model)"
                           : magic == 20240527 ? " (it is an llm.c training state; load the "
                                                 "model .bin written next to it)"
                                               : "";
        s = zdp_err_set(err, ZDP_ERR_FORMAT,
                        "%s: not a GPT-2 weights file%s: the first bytes are neither llm.c's "
                        "magic 20240326 nor a safetensors header (8-byte length, then '{'); "
                        "zdp reads GPT2LMHeadModel .safetensors and llm.c model .bin files",
                        path, hint);
    }
    if (s == ZDP_OK) s = gio_check_finite_(path, params, n_params, dst, err);
done:
    if (f != NULL) fclose(f);
    free(expected);
    free(map);
    return s;
}

static zdp_status gio_save_(const char *path, const zdp_param_info *params, int n_params,
                            const float *const *src, const char *shape_json, zdp_error *err) {
    if (path == NULL || params == NULL || src == NULL || n_params < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_gpt_weights_save: path, params and src must not be NULL and "
                           "n_params (%d) >= 1", n_params);
    zdp_tensor *t = calloc((size_t)n_params, sizeof *t);
    if (t == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < n_params; i++) {
        if (params[i].ndim < 1 || params[i].ndim > ZDP_MAX_DIMS || src[i] == NULL) {
            free(t);
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: params[%d] \"%s\": ndim %d (expected 1..%d) or src NULL",
                               path, i, params[i].name ? params[i].name : "(null)",
                               params[i].ndim, ZDP_MAX_DIMS);
        }
        /* The writer only reads the data; zdp_tensor is shared with the
         * reader, hence the non-const pointer. */
        t[i].name = (char *)params[i].name;
        t[i].dtype = ZDP_DTYPE_F32;
        t[i].ndim = params[i].ndim;
        memcpy(t[i].shape, params[i].shape, sizeof t[i].shape);
        t[i].data = (void *)src[i];
        t[i].nbytes = (size_t)zdp_io_numel(params[i].shape, params[i].ndim) * sizeof(float);
        for (int d = 0; d < params[i].ndim; d++) {
            if (params[i].shape[d] < 0) {
                free(t);
                return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                                   "%s: params[%d] \"%s\": shape[%d] = %" PRId64 " < 0", path,
                                   i, params[i].name ? params[i].name : "(null)", d,
                                   params[i].shape[d]);
            }
        }
    }
    const char *const meta[] = {"format", "pt", "zdp_model", shape_json};
    zdp_status s = zdp_safetensors_write_meta(path, t, n_params, meta, shape_json ? 2 : 1, err);
    free(t);
    return s;
}

zdp_status zdp_gpt_weights_save(const char *path, const zdp_param_info *params, int n_params,
                                const float *const *src, zdp_error *err) {
    return gio_save_(path, params, n_params, src, NULL, err);
}

zdp_status zdp_gpt_weights_save_model(const char *path, const zdp_model *model,
                                      const float *const *src, zdp_error *err) {
    if (model == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_gpt_weights_save_model: model is NULL");
    return gio_save_(path, model->params, model->n_params, src, model->shape_json, err);
}
