/*
 * lora_io.c -- the PEFT adapter folder (zdp/lora.h, docs/lora.md):
 * adapter_model.safetensors with PEFT's tensor names and
 * adapter_config.json, out and back in.
 *
 * target_modules holds module-name suffixes PEFT matches against the
 * model's module paths (a key matches when it equals an entry or ends with
 * "." + entry).  zdp writes the shortest suffixes that pick exactly its
 * targets: the Llama family's leaf names (q_proj, ..., down_proj), GPT-2's
 * "attn.c_proj" and "mlp.c_proj" (a bare "c_proj" would match both), and
 * "lm_head".  Reading maps each entry back to its target group, and a group
 * listed in part (PEFT's common ["q_proj", "v_proj"]) to the modules named
 * (zdp_lora_config.modules); writing lists the modules the model adapts.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io.h"
#include "zdp/gpt.h"
#include "zdp/io.h"
#include "zdp/lora.h"
#include "zdp/model.h"

#define PATH_MAX_ 4096

/* The module suffixes of each group, per family, as written. */
static const char *const llama_attn_[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
static const char *const llama_mlp_[] = {"gate_proj", "up_proj", "down_proj"};

/* Each family's module bits (zdp/lora.h), in the order written. */
static const int llama_bits_[] = {ZDP_LORA_Q_PROJ,    ZDP_LORA_K_PROJ,  ZDP_LORA_V_PROJ,
                                  ZDP_LORA_O_PROJ,    ZDP_LORA_GATE_PROJ, ZDP_LORA_UP_PROJ,
                                  ZDP_LORA_DOWN_PROJ, ZDP_LORA_LM_HEAD};
static const int gpt_bits_[] = {ZDP_LORA_C_ATTN, ZDP_LORA_ATTN_C_PROJ, ZDP_LORA_C_FC,
                                ZDP_LORA_MLP_C_PROJ, ZDP_LORA_LM_HEAD};

static zdp_status path_(char *buf, const char *dir, const char *file, zdp_error *err) {
    if (snprintf(buf, PATH_MAX_, "%s/%s", dir, file) >= PATH_MAX_)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: the folder path is too long", dir);
    return ZDP_OK;
}


zdp_status zdp_lora_save_adapter(const char *dir, const zdp_model *model,
                                 const float *const *adapter, const char *base_model_name,
                                 zdp_error *err) {
    const char *fn = "zdp_lora_save_adapter";
    const zdp_lora_config *c = zdp_lora_config_of(model);
    if (dir == NULL || c == NULL || adapter == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: dir, a LoRA model and its adapter must be set", fn);
    const int gpt = zdp_gpt_config_of(zdp_lora_base_of(model)) != NULL;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot create the folder: %s (its parent must "
                           "exist)", dir, strerror(errno));
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return zdp_err_set(err, ZDP_ERR_IO, "%s: exists and is not a directory; choose another "
                           "output folder", dir);
    char path[PATH_MAX_];
    zdp_status st = path_(path, dir, "adapter_model.safetensors", err);
    if (st != ZDP_OK) return st;
    const int n = model->n_params;
    zdp_tensor *t = calloc((size_t)n, sizeof *t);
    if (t == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", fn);
    for (int i = 0; i < n; i++) {
        const zdp_param_info *p = &model->params[i];
        t[i] = (zdp_tensor){.name = (char *)p->name, .dtype = ZDP_DTYPE_F32, .ndim = p->ndim,
                            .data = (void *)adapter[i],
                            .nbytes = (size_t)(p->shape[0] * p->shape[1]) * sizeof(float)};
        memcpy(t[i].shape, p->shape, sizeof t[i].shape);
    }
    const char *meta[2] = {"format", "pt"};
    st = zdp_safetensors_write_meta(path, t, n, meta, 1, err);
    free(t);
    if (st != ZDP_OK) return st;

    /* The modules adapted: those of the targeted groups, narrowed by modules. */
    json_t *mods = json_array();
    const int *bits = gpt ? gpt_bits_ : llama_bits_;
    const size_t nbits = gpt ? sizeof gpt_bits_ / sizeof gpt_bits_[0]
                             : sizeof llama_bits_ / sizeof llama_bits_[0];
    for (size_t k = 0; k < nbits; k++) {
        if (zdp_lora_adapts(c, bits[k]))
            json_array_append_new(mods, json_string(zdp_lora_module_name(bits[k])));
    }
    /* lora_alpha as PEFT writes it: an integer when it is one. */
    const double a = c->alpha;
    json_t *alpha = a == floor(a) && fabs(a) < 1e9 ? json_integer((json_int_t)a) : json_real(a);
    json_t *root = json_pack(
        "{s:s, s:s, s:i, s:o, s:o, s:o, s:b, s:s, s:f, s:b, s:b, s:n, s:b}", "peft_type", "LORA",
        "task_type", "CAUSAL_LM", "r", c->rank, "lora_alpha", alpha, "target_modules", mods,
        "base_model_name_or_path",
        base_model_name != NULL ? json_string(base_model_name) : json_null(), "fan_in_fan_out",
        gpt, "bias", "none", "lora_dropout", 0.0, "inference_mode", 1, "init_lora_weights", 1,
        "modules_to_save", "use_rslora", 0);
    if ((st = path_(path, dir, "adapter_config.json", err)) != ZDP_OK) {
        json_decref(root);
        return st;
    }
    return zdp_io_write_json(path, root, err);
}

/* The target group of a target_modules entry (0: not one zdp adapts). */
static int group_of_(const char *m) {
    for (size_t i = 0; i < 4; i++)
        if (strcmp(m, llama_attn_[i]) == 0) return ZDP_LORA_ATTN;
    for (size_t i = 0; i < 3; i++)
        if (strcmp(m, llama_mlp_[i]) == 0) return ZDP_LORA_MLP;
    if (strcmp(m, "c_attn") == 0 || strcmp(m, "attn.c_attn") == 0 ||
        strcmp(m, "attn.c_proj") == 0)
        return ZDP_LORA_ATTN;
    if (strcmp(m, "c_fc") == 0 || strcmp(m, "mlp.c_fc") == 0 || strcmp(m, "mlp.c_proj") == 0)
        return ZDP_LORA_MLP;
    if (strcmp(m, "c_proj") == 0) return ZDP_LORA_ATTN | ZDP_LORA_MLP; /* GPT-2: both */
    if (strcmp(m, "lm_head") == 0) return ZDP_LORA_UNEMBED;
    return 0;
}

/* Whether module path suffix `name` is picked by an entry of mods (PEFT's
 * match: the entry equals it or is a suffix after a '.'). */
static bool listed_(const json_t *mods, const char *name) {
    size_t i;
    const json_t *m;
    json_array_foreach(mods, i, m) {
        const char *v = json_string_value(m);
        if (v == NULL) continue;
        const size_t lv = strlen(v), ln = strlen(name);
        if (strcmp(v, name) == 0 ||
            (ln > lv && name[ln - lv - 1] == '.' && strcmp(name + ln - lv, v) == 0))
            return true;
    }
    return false;
}

zdp_status zdp_lora_read_adapter_config(const char *dir, zdp_lora_config *cfg, zdp_error *err) {
    if (dir == NULL || cfg == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_lora_read_adapter_config: dir and cfg must be set");
    char path[PATH_MAX_];
    zdp_status st = path_(path, dir, "adapter_config.json", err);
    if (st != ZDP_OK) return st;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (root == NULL)
        return zdp_err_set(err, ZDP_ERR_IO, "%s: %s (line %d); a PEFT adapter folder has "
                           "adapter_config.json", path, je.text, je.line);
    st = ZDP_OK;
    const json_t *pt = json_object_get(root, "peft_type");
    const json_t *r = json_object_get(root, "r");
    const json_t *alpha = json_object_get(root, "lora_alpha");
    const json_t *mods = json_object_get(root, "target_modules");
    const json_t *bias = json_object_get(root, "bias");
    const json_t *rs = json_object_get(root, "use_rslora");
    const json_t *mts = json_object_get(root, "modules_to_save");
    zdp_lora_config c = {.alpha = ZDP_LORA_DEFAULT_ALPHA};
    if (!json_is_object(root)) {
        st = zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: not a JSON object", path);
    } else if (!json_is_string(pt) || strcmp(json_string_value(pt), "LORA") != 0) {
        st = zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: peft_type = %s: zdp reads \"LORA\" "
                         "adapters", path, json_is_string(pt) ? json_string_value(pt) : "missing");
    } else if (!json_is_integer(r) || json_integer_value(r) < 1 ||
               json_integer_value(r) > 1 << 20) {
        st = zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: r: must be an integer >= 1 (the rank)",
                         path);
    } else if (alpha != NULL && !json_is_number(alpha)) {
        st = zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: lora_alpha: must be a number", path);
    } else if (bias != NULL && (!json_is_string(bias) || strcmp(json_string_value(bias), "none"))) {
        st = zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: bias = %s: zdp's adapters train no "
                         "biases; bias must be \"none\"", path,
                         json_is_string(bias) ? json_string_value(bias) : "(not a string)");
    } else if (json_is_true(rs)) {
        st = zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: use_rslora = true: zdp scales by "
                         "lora_alpha / r (use_rslora false)", path);
    } else if (mts != NULL && !json_is_null(mts) &&
               !(json_is_array(mts) && json_array_size(mts) == 0)) {
        st = zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: modules_to_save: zdp's adapters hold "
                         "LoRA tensors only; it must be null", path);
    } else if (json_is_string(mods) && strcmp(json_string_value(mods), "all-linear") == 0) {
        c.targets = ZDP_LORA_ATTN | ZDP_LORA_MLP; /* PEFT: every linear but the output layer */
    } else if (!json_is_array(mods) || json_array_size(mods) == 0) {
        st = zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: target_modules: must be a non-empty "
                         "list of module names", path);
    } else {
        size_t i;
        const json_t *m;
        json_array_foreach(mods, i, m) {
            const int g = json_is_string(m) ? group_of_(json_string_value(m)) : 0;
            if (g == 0) {
                st = zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                                 "%s: target_modules[%zu] = %s: not a module zdp adapts (Llama "
                                 "q/k/v/o_proj, gate/up/down_proj; GPT-2 c_attn, c_proj, c_fc; "
                                 "lm_head)",
                                 path, i, json_is_string(m) ? json_string_value(m) : "?");
                break;
            }
            c.targets |= g;
        }
        /* The family's modules the list picks (fan_in_fan_out marks GPT-2,
         * whose weights are Conv1D): a group in part adapts only those. */
        const bool gpt = json_is_true(json_object_get(root, "fan_in_fan_out"));
        const int *bits = gpt ? gpt_bits_ : llama_bits_;
        const size_t nbits = gpt ? sizeof gpt_bits_ / sizeof gpt_bits_[0]
                                 : sizeof llama_bits_ / sizeof llama_bits_[0];
        int listed = 0, whole = 0, picked = 0; /* module bits; groups */
        for (size_t k = 0; k < nbits && st == ZDP_OK; k++) {
            int group = 0;
            zdp_lora_module_bit(zdp_lora_module_name(bits[k]), &group);
            if (!(c.targets & group)) continue;
            whole |= bits[k];
            if (listed_(mods, zdp_lora_module_name(bits[k]))) listed |= bits[k], picked |= group;
        }
        const int missed = st == ZDP_OK ? c.targets & ~picked : 0;
        if (missed != 0)
            st = zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                             "%s: target_modules names no %s module of a %s adapter "
                             "(fan_in_fan_out %s): %s",
                             path, missed & ZDP_LORA_ATTN ? "attention" : "MLP",
                             gpt ? "GPT-2" : "Llama-family", gpt ? "true" : "false",
                             gpt ? "GPT-2 adapts attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj"
                                 : "the Llama family adapts q/k/v/o_proj, gate/up/down_proj");
        c.modules = listed != whole ? listed : 0;
    }
    if (st == ZDP_OK) {
        c.rank = (int)json_integer_value(r);
        if (alpha != NULL) c.alpha = (float)json_number_value(alpha);
        if (!(c.alpha > 0.0f) || !isfinite(c.alpha))
            st = zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: lora_alpha = %g: must be > 0", path,
                             (double)c.alpha);
    }
    json_decref(root);
    if (st == ZDP_OK) *cfg = c;
    return st;
}

static void shape_str_(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ndim && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", d ? ", " : "",
                                 (long long)shape[d]);
    if (used < size) snprintf(buf + used, size - used, "]");
}

zdp_status zdp_lora_load_adapter(const char *dir, const zdp_model *model, float *const *adapter,
                                 zdp_error *err) {
    if (dir == NULL || zdp_lora_config_of(model) == NULL || adapter == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "zdp_lora_load_adapter: dir, a LoRA model and adapter must be set");
    char path[PATH_MAX_];
    zdp_status st = path_(path, dir, "adapter_model.safetensors", err);
    if (st != ZDP_OK) return st;
    zdp_safetensors f;
    if ((st = zdp_safetensors_read(path, &f, err)) != ZDP_OK) return st;
    for (int i = 0; i < model->n_params && st == ZDP_OK; i++) {
        const zdp_param_info *p = &model->params[i];
        const zdp_tensor *t = zdp_safetensors_find(&f, p->name);
        char want[64], got[64];
        shape_str_(want, sizeof want, p->ndim, p->shape);
        if (t == NULL) {
            st = zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                             "%s: tensor %s %s is missing: the adapter was trained with other "
                             "targets (check adapter_config.json's target_modules)",
                             path, p->name, want);
        } else if (!zdp_io_dtype_float(t->dtype)) {
            st = zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: tensor %s is %s: must be F32, F16 "
                             "or BF16", path, p->name, zdp_dtype_name(t->dtype));
        } else if (t->ndim != p->ndim || memcmp(t->shape, p->shape,
                                                (size_t)p->ndim * sizeof(int64_t)) != 0) {
            shape_str_(got, sizeof got, t->ndim, t->shape);
            st = zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                             "%s: tensor %s has shape %s, this base and rank need %s: the "
                             "adapter is for another base model or rank",
                             path, p->name, got, want);
        } else {
            const int64_t n = p->shape[0] * p->shape[1];
            for (int64_t k = 0; k < n; k++) adapter[i][k] = zdp_io_f32_at(t, k);
        }
    }
    /* A tensor the model lacks: an adapter on modules this model does not adapt. */
    for (int k = 0; k < f.n && st == ZDP_OK; k++) {
        bool known = false;
        for (int i = 0; i < model->n_params && !known; i++)
            known = strcmp(model->params[i].name, f.tensors[k].name) == 0;
        if (!known)
            st = zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                             "%s: tensor %s is not one of this LoRA model's (%d tensors, rank "
                             "%d): the adapter is for another base or other targets",
                             path, f.tensors[k].name, model->n_params,
                             zdp_lora_config_of(model)->rank);
    }
    zdp_safetensors_free(&f);
    return st;
}
