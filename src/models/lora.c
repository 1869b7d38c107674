/*
 * lora.c -- LoRA (zdp/lora.h, docs/lora.md): a zdp_model whose parameters
 * are only the adapters, running a GPT-2 or Llama-family base over its
 * frozen weights through adapter.h's hooks.
 *
 * At each targeted site the base computes y = W x (+ b) and the hook adds
 *   xa = s * (x A^T)  (N, r),   y += xa B^T,   s = alpha / rank
 * Backward gets the site's output gradient dy and input x from the base
 * (which keeps x for its own input gradient), recomputes xa (N*in*r
 * products, small beside the base's, so nothing per site is stored) and
 *   dB += dy^T xa,   dxa = s * (dy B),   dA += dxa^T x,   dx += dxa A
 * The engine sees only A and B: it partitions their parameters, gradients
 * and optimizer state; the base's weights are borrowed, never written.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/core.h"
#include "../nn/nn.h"
#include "adapter.h"
#include "zdp/gpt.h"

#define NAME_MAX_ (ZDP_ADAPTER_MODULE_MAX + 48)

typedef struct lora {
    zdp_lora_config cfg;
    float scale;                      /* alpha / rank */
    const zdp_model *base;
    const float *const *base_params;
    zdp_param_source *base_src;       /* dense, over base_params; at ZeRO stage 3
                                         the engine's, over its partition */
    zdp_frozen frozen;                /* the base, as the engine sees it */
    int n_params;                     /* the adapters' tensors */
    int nsites;
    zdp_adapter_site *sites;          /* (nsites) the base's, in its order */
    int *param_of;                    /* (nsites) index of the site's A (B follows), -1: not targeted */
    zdp_adapter ad;                   /* the hooks, ctx = this */
    const float *const *params;       /* the adapters of the call in progress */
    float *xa, *dxa;                  /* (max_rows, rank) scratch */
    char *names;                      /* n_params * NAME_MAX_ */
    zdp_param_info *info;             /* (n_params) */
    char shape_json[512];
} lora;

static const zdp_model_ops lora_ops_;
static const zdp_lm_ops lora_lm_ops_;

static lora *lora_of_(const zdp_model *model) {
    return model != NULL && model->ops == &lora_ops_ ? model->self : NULL;
}

int zdp_adapter_sites(const zdp_model *base, zdp_adapter_site *sites, int cap,
                      int64_t *max_rows) {
    int n = zdp_gpt_adapter_sites_(base, sites, cap, max_rows);
    return n >= 0 ? n : zdp_llama_adapter_sites_(base, sites, cap, max_rows);
}

void zdp_adapter_attach(const zdp_model *base, const zdp_adapter *ad) {
    if (zdp_gpt_adapter_attach_(base, ad) < 0) zdp_llama_adapter_attach_(base, ad);
}

/* ---- the hooks ---------------------------------------------------------------------- */

/* xa (N, r) = s * inp A^T for the site whose A is tensor p. */
static void down_(const lora *m, const zdp_adapter_site *s, int p, const float *inp, int64_t N) {
    const int64_t r = m->cfg.rank;
    zdp_nn_linear_forward(m->xa, inp, m->params[p], NULL, N, s->in, r, 0);
    for (int64_t i = 0; i < N * r; i++) m->xa[i] *= m->scale;
}

static void hook_forward_(void *ctx, int site, float *out, const float *inp, int64_t N) {
    const lora *m = ctx;
    const int p = m->param_of[site];
    if (p < 0) return;
    const zdp_adapter_site *s = &m->sites[site];
    down_(m, s, p, inp, N);
    zdp_nn_linear_forward(out, m->xa, m->params[p + 1], NULL, N, m->cfg.rank, s->out, 1);
}

static zdp_status hook_backward_(void *ctx, int site, float *dinp, const float *dout,
                                 const float *inp, int64_t N, zdp_grad_sink *sink,
                                 zdp_error *err) {
    const lora *m = ctx;
    const int p = m->param_of[site];
    if (p < 0) return ZDP_OK;
    const zdp_adapter_site *s = &m->sites[site];
    const int64_t r = m->cfg.rank;
    float *dA = zdp_grad_acquire(sink, p);
    float *dB = zdp_grad_acquire(sink, p + 1);
    if (dA == NULL || dB == NULL)
        return zdp_err_set(err, ZDP_ERR_INTERNAL, "lora backward: the grad sink refused %s",
                           m->info[dA == NULL ? p : p + 1].name);
    down_(m, s, p, inp, N);
    /* dxa = dy B, dB += dy^T xa */
    zdp_nn_linear_backward(m->dxa, dB, NULL, dout, m->xa, m->params[p + 1], N, r, s->out,
                           ZDP_NN_SET_DINP);
    zdp_grad_release(sink, p + 1);
    for (int64_t i = 0; i < N * r; i++) m->dxa[i] *= m->scale;
    /* dinp += dxa A, dA += dxa^T x */
    zdp_nn_linear_backward(dinp, dA, NULL, m->dxa, inp, m->params[p], N, s->in, r, 0);
    zdp_grad_release(sink, p);
    return ZDP_OK;
}

/* ---- the model ops: the base's, with the hooks attached for the call ------------------ */

/* The adapters from the engine's source (all of them, for the whole call)
 * into m->params; the base runs over base_src: a dense source over its
 * borrowed weights, or at ZeRO stage 3 the engine's source over its
 * partition of them (zdp_frozen), gathered layer by layer. */
static zdp_status fetch_(lora *m, zdp_param_source *src, zdp_error *err) {
    if (m->base_src == NULL)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "LoRA model: its base exists only in a ZeRO stage-3 engine's "
                           "partitions (zdp_lora_create_partitioned) and none holds it: run it "
                           "through an engine created with zero_optimization.stage 3, or create "
                           "it with zdp_lora_create and whole base weights");
    return zdp_param_fetch(src, 0, m->n_params, &m->params, err);
}

static zdp_status lora_forward_(void *self, zdp_param_source *src, const void *batch,
                                float *loss, zdp_error *err) {
    lora *m = self;
    zdp_status st = fetch_(m, src, err);
    if (st != ZDP_OK) return st;
    zdp_adapter_attach(m->base, &m->ad);
    st = m->base->ops->forward(m->base->self, m->base_src, batch, loss, err);
    zdp_adapter_attach(m->base, NULL);
    zdp_param_release(src, 0, m->n_params);
    return st;
}

static zdp_status lora_backward_(void *self, zdp_param_source *src, float dloss,
                                 zdp_grad_sink *sink, zdp_error *err) {
    lora *m = self;
    zdp_status st = fetch_(m, src, err);
    if (st != ZDP_OK) return st;
    zdp_adapter_attach(m->base, &m->ad);
    st = m->base->ops->backward(m->base->self, m->base_src, dloss, sink, err);
    zdp_adapter_attach(m->base, NULL);
    zdp_param_release(src, 0, m->n_params);
    return st;
}

static const zdp_model_ops lora_ops_ = {.forward = lora_forward_, .backward = lora_backward_};

static zdp_status lora_set_loss_weights_(void *self, const float *w, int64_t n, zdp_error *err) {
    lora *m = self;
    zdp_adapter_attach(m->base, &m->ad);
    zdp_status st = m->base->lm->set_loss_weights(m->base->self, w, n, err);
    zdp_adapter_attach(m->base, NULL);
    return st;
}

static zdp_status lora_next_logits_(void *self, zdp_param_source *src, const int32_t *tokens,
                                    int T, float *logits, zdp_error *err) {
    lora *m = self;
    zdp_status st = fetch_(m, src, err);
    if (st != ZDP_OK) return st;
    zdp_adapter_attach(m->base, &m->ad);
    st = m->base->lm->next_logits(m->base->self, m->base_src, tokens, T, logits, err);
    zdp_adapter_attach(m->base, NULL);
    zdp_param_release(src, 0, m->n_params);
    return st;
}

static const zdp_lm_ops lora_lm_ops_ = {.set_loss_weights = lora_set_loss_weights_,
                                        .next_logits = lora_next_logits_};

/* ---- single modules ------------------------------------------------------------------ */

/* Every module zdp adapts, by the name transformers' module paths end with. */
static const struct { const char *name; int bit, group; } modules_[] = {
    {"q_proj", ZDP_LORA_Q_PROJ, ZDP_LORA_ATTN},
    {"k_proj", ZDP_LORA_K_PROJ, ZDP_LORA_ATTN},
    {"v_proj", ZDP_LORA_V_PROJ, ZDP_LORA_ATTN},
    {"o_proj", ZDP_LORA_O_PROJ, ZDP_LORA_ATTN},
    {"gate_proj", ZDP_LORA_GATE_PROJ, ZDP_LORA_MLP},
    {"up_proj", ZDP_LORA_UP_PROJ, ZDP_LORA_MLP},
    {"down_proj", ZDP_LORA_DOWN_PROJ, ZDP_LORA_MLP},
    {"attn.c_attn", ZDP_LORA_C_ATTN, ZDP_LORA_ATTN},
    {"attn.c_proj", ZDP_LORA_ATTN_C_PROJ, ZDP_LORA_ATTN},
    {"mlp.c_fc", ZDP_LORA_C_FC, ZDP_LORA_MLP},
    {"mlp.c_proj", ZDP_LORA_MLP_C_PROJ, ZDP_LORA_MLP},
    {"lm_head", ZDP_LORA_LM_HEAD, ZDP_LORA_UNEMBED}};
#define N_MODULES_ ((int)(sizeof modules_ / sizeof modules_[0]))

int zdp_lora_module_bit(const char *name, int *group) {
    for (int k = 0; name != NULL && k < N_MODULES_; k++)
        if (strcmp(name, modules_[k].name) == 0) {
            if (group != NULL) *group = modules_[k].group;
            return modules_[k].bit;
        }
    return 0;
}

const char *zdp_lora_module_name(int bit) {
    for (int k = 0; k < N_MODULES_; k++)
        if (modules_[k].bit == bit) return modules_[k].name;
    return NULL;
}

/* The module bit of a site: its path equals a module's name or ends with
 * "." + it. */
static int site_bit_(const zdp_adapter_site *s) {
    const size_t lp = strlen(s->module);
    for (int k = 0; k < N_MODULES_; k++) {
        const size_t ln = strlen(modules_[k].name);
        if (strcmp(s->module, modules_[k].name) == 0 ||
            (lp > ln && s->module[lp - ln - 1] == '.' &&
             strcmp(s->module + lp - ln, modules_[k].name) == 0))
            return modules_[k].bit;
    }
    return 0;
}

static const char *group_name_(int group) {
    return group == ZDP_LORA_ATTN ? "attn" : group == ZDP_LORA_MLP ? "mlp" : "unembed";
}

/* Every module bit of a group (both families'). */
static int group_modules_(int group) {
    int bits = 0;
    for (int k = 0; k < N_MODULES_; k++)
        if (modules_[k].group == group) bits |= modules_[k].bit;
    return bits;
}

int zdp_lora_adapts(const zdp_lora_config *c, int bit) {
    int group = 0;
    if (c == NULL || zdp_lora_module_bit(zdp_lora_module_name(bit), &group) == 0) return 0;
    if (!(c->targets & group)) return 0;
    return !(c->modules & group_modules_(group)) || (c->modules & bit) != 0;
}

/* ---- targets ------------------------------------------------------------------------ */

static const struct { const char *name; int bit; } targets_[] = {
    {"attn", ZDP_LORA_ATTN}, {"mlp", ZDP_LORA_MLP}, {"unembed", ZDP_LORA_UNEMBED}};

zdp_status zdp_lora_targets_parse(const char *list, int *targets, int *modules, zdp_error *err) {
    const char *fn = "lora targets";
    if (list == NULL || targets == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "%s: list and targets must be set", fn);
    int bits = 0, mods = 0;
    const char *p = list;
    while (1) {
        const char *e = strchr(p, ',');
        const size_t len = e != NULL ? (size_t)(e - p) : strlen(p);
        int bit = 0;
        if (len == 3 && strncmp(p, "all", 3) == 0) bit = ZDP_LORA_ALL;
        for (size_t k = 0; k < sizeof targets_ / sizeof targets_[0]; k++)
            if (strlen(targets_[k].name) == len && strncmp(p, targets_[k].name, len) == 0)
                bit = targets_[k].bit;
        for (int k = 0; bit == 0 && modules != NULL && k < N_MODULES_; k++)
            if (strlen(modules_[k].name) == len && strncmp(p, modules_[k].name, len) == 0)
                bit = modules_[k].group, mods |= modules_[k].bit;
        if (bit == 0)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: '%.*s' in \"%s\": unknown target; use a comma-separated list "
                               "of attn, mlp, unembed (or all)%s",
                               fn, (int)(len > 40 ? 40 : len), p, list,
                               modules != NULL ? ", or single modules (q_proj, k_proj, v_proj, "
                                                 "o_proj, gate_proj, up_proj, down_proj; GPT-2's "
                                                 "attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj; "
                                                 "lm_head)"
                                               : "");
        bits |= bit;
        if (e == NULL) break;
        p = e + 1;
    }
    *targets = bits;
    if (modules != NULL) *modules = mods;
    return ZDP_OK;
}

void zdp_lora_targets_name(int targets, int modules, char *buf, size_t size) {
    if (buf == NULL || size == 0) return;
    buf[0] = '\0';
    size_t used = 0;
    for (size_t k = 0; k < sizeof targets_ / sizeof targets_[0]; k++) {
        if (!(targets & targets_[k].bit)) continue;
        const int part = modules & group_modules_(targets_[k].bit);
        for (int j = 0; j < N_MODULES_; j++) {
            const char *name = part == 0 ? targets_[k].name
                               : (part & modules_[j].bit) ? modules_[j].name : NULL;
            if (name != NULL) {
                int w = snprintf(buf + used, size - used, "%s%s", used > 0 ? "," : "", name);
                if (w < 0 || (size_t)w >= size - used) return;
                used += (size_t)w;
            }
            if (part == 0) break;
        }
    }
}

/* cfg->modules against the base's sites: every bit a module of this base
 * and of a targeted group. */
static zdp_status check_modules_(const zdp_lora_config *c, const zdp_adapter_site *sites,
                                 int nsites, int gpt, zdp_error *err) {
    const char *fn = "zdp_lora_create";
    if (c->modules == 0) return ZDP_OK;
    if ((c->modules & ~ZDP_LORA_MODULES_ALL) != 0)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: modules = %#x: unknown module bits (ZDP_LORA_Q_PROJ .. "
                           "ZDP_LORA_LM_HEAD, or 0 for whole groups)",
                           fn, (unsigned)c->modules);
    int have = 0; /* the base's module bits */
    for (int i = 0; i < nsites; i++) have |= site_bit_(&sites[i]);
    for (int k = 0; k < N_MODULES_; k++) {
        if (!(c->modules & modules_[k].bit)) continue;
        if (!(have & modules_[k].bit))
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: modules: %s is not a module of this %s base (it adapts %s)",
                               fn, modules_[k].name, gpt ? "GPT-2" : "Llama-family",
                               gpt ? "attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj, lm_head"
                                   : "q/k/v/o_proj, gate/up/down_proj, lm_head");
        if (!(c->targets & modules_[k].group))
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: modules: %s is in group %s, which targets leaves out; add "
                               "the group to targets or drop the module",
                               fn, modules_[k].name, group_name_(modules_[k].group));
    }
    return ZDP_OK;
}

/* ---- create / destroy ------------------------------------------------------------------ */

static zdp_status check_config_(const zdp_lora_config *c, zdp_error *err) {
    const char *fn = "zdp_lora_create";
    if (c->rank < 1)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: rank = %d: must be at least 1 (PEFT's r, Tinker's "
                           "LoraConfig.rank; 8 to 64 is usual)",
                           fn, c->rank);
    if (!(c->alpha >= 0.0f) || !isfinite(c->alpha))
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: alpha = %g: must be finite and > 0 (PEFT's lora_alpha; 0 for the "
                           "default %g)",
                           fn, (double)c->alpha, (double)ZDP_LORA_DEFAULT_ALPHA);
    if (c->targets <= 0 || (c->targets & ~ZDP_LORA_ALL) != 0)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: targets = %d: must be a non-empty set of ZDP_LORA_ATTN (1), "
                           "ZDP_LORA_MLP (2), ZDP_LORA_UNEMBED (4)",
                           fn, c->targets);
    return ZDP_OK;
}

/* The frozen base's zdp_tensor_read_fn over whole tensors in memory. */
static zdp_status read_whole_(void *ctx, int i, int64_t lo, int64_t hi, float *dst,
                              zdp_error *err) {
    (void)err;
    const lora *m = ctx;
    memcpy(dst, m->base_params[i] + lo, (size_t)(hi - lo) * sizeof(float));
    return ZDP_OK;
}

static zdp_status create_(const char *fn, const zdp_model *base, const float *const *base_params,
                          zdp_tensor_read_fn read, void *read_ctx, const zdp_lora_config *cfg,
                          zdp_model *out, zdp_error *err);

zdp_status zdp_lora_create(const zdp_model *base, const float *const *base_params,
                           const zdp_lora_config *cfg, zdp_model *out, zdp_error *err) {
    const char *fn = "zdp_lora_create";
    if (out == NULL || base == NULL || base_params == NULL || cfg == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: base, base_params, cfg and out must be set", fn);
    return create_(fn, base, base_params, NULL, NULL, cfg, out, err);
}

zdp_status zdp_lora_create_partitioned(const zdp_model *base, zdp_tensor_read_fn read,
                                       void *read_ctx, const zdp_lora_config *cfg,
                                       zdp_model *out, zdp_error *err) {
    const char *fn = "zdp_lora_create_partitioned";
    if (out == NULL || base == NULL || read == NULL || cfg == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: base, read, cfg and out must be set", fn);
    return create_(fn, base, NULL, read, read_ctx, cfg, out, err);
}

static zdp_status create_(const char *fn, const zdp_model *base, const float *const *base_params,
                          zdp_tensor_read_fn read, void *read_ctx, const zdp_lora_config *cfg,
                          zdp_model *out, zdp_error *err) {
    memset(out, 0, sizeof *out);
    int64_t max_rows = 0;
    const int nsites = zdp_adapter_sites(base, NULL, 0, &max_rows);
    if (nsites < 0)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: the base model is neither GPT-2 nor of the Llama family (LoRA "
                           "adapts those two)",
                           fn);
    zdp_status st = check_config_(cfg, err);
    if (st != ZDP_OK) return st;
    lora *m = calloc(1, sizeof *m);
    if (m == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", fn);
    m->cfg = *cfg;
    if (m->cfg.alpha == 0.0f) m->cfg.alpha = ZDP_LORA_DEFAULT_ALPHA;
    m->scale = m->cfg.alpha / (float)cfg->rank;
    m->base = base;
    m->base_params = base_params;
    m->nsites = nsites;
    m->sites = calloc((size_t)nsites, sizeof *m->sites);
    m->param_of = calloc((size_t)nsites, sizeof *m->param_of);
    if (m->sites == NULL || m->param_of == NULL) goto nomem;
    zdp_adapter_sites(base, m->sites, nsites, NULL);
    if ((st = check_modules_(cfg, m->sites, nsites, zdp_gpt_config_of(base) != NULL, err)) !=
        ZDP_OK)
        goto fail;

    int n_params = 0, lowest = INT32_MAX;
    for (int i = 0; i < nsites; i++) {
        const zdp_adapter_site *s = &m->sites[i];
        m->param_of[i] = -1;
        if (!zdp_lora_adapts(cfg, site_bit_(s))) continue;
        const int64_t lim = s->in < s->out ? s->in : s->out;
        if (cfg->rank > lim) {
            st = zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                             "%s: rank = %d: larger than %s's dimensions (in %lld, out %lld); "
                             "rank must be at most %lld, or leave its target out",
                             fn, cfg->rank, s->module, (long long)s->in, (long long)s->out,
                             (long long)lim);
            goto fail;
        }
        m->param_of[i] = n_params;
        n_params += 2;
        /* lm_head (layer -1) sits above every block: no block below needs backward. */
        const int layer = s->layer >= 0 ? s->layer : INT32_MAX;
        if (layer < lowest) lowest = layer;
    }
    /* Only lm_head targeted: backward stops above the blocks. */
    int n_layer = 0;
    for (int i = 0; i < nsites; i++)
        if (m->sites[i].layer + 1 > n_layer) n_layer = m->sites[i].layer + 1;
    m->ad = (zdp_adapter){.ctx = m, .forward = hook_forward_, .backward = hook_backward_,
                          .lowest_layer = lowest < n_layer ? lowest : n_layer};

    m->names = calloc((size_t)n_params, NAME_MAX_);
    m->info = calloc((size_t)n_params, sizeof *m->info);
    const int64_t scratch = max_rows * cfg->rank;
    m->xa = malloc((size_t)scratch * sizeof(float));
    m->dxa = malloc((size_t)scratch * sizeof(float));
    m->n_params = n_params;
    /* Partitioned (no base_params): no source until a stage-3 engine sets its own. */
    m->base_src = base_params != NULL ? zdp_param_source_create_dense(base_params, base->n_params)
                                      : NULL;
    if (m->names == NULL || m->info == NULL || m->xa == NULL || m->dxa == NULL ||
        (base_params != NULL && m->base_src == NULL))
        goto nomem;
    for (int i = 0; i < nsites; i++) {
        const int p = m->param_of[i];
        if (p < 0) continue;
        const zdp_adapter_site *s = &m->sites[i];
        char *a = m->names + (size_t)p * NAME_MAX_, *b = a + NAME_MAX_;
        snprintf(a, NAME_MAX_, "base_model.model.%s.lora_A.weight", s->module);
        snprintf(b, NAME_MAX_, "base_model.model.%s.lora_B.weight", s->module);
        m->info[p] = (zdp_param_info){.name = a, .ndim = 2, .shape = {cfg->rank, s->in}};
        m->info[p + 1] = (zdp_param_info){.name = b, .ndim = 2, .shape = {s->out, cfg->rank}};
    }
    /* The checkpoint's shape: the adapter's keys, then the base's (its
     * "model" key folded into ours), so a checkpoint of another rank, targets
     * or base is refused naming the key. */
    char tnames[ZDP_LORA_TARGETS_NAME_MAX];
    zdp_lora_targets_name(cfg->targets, cfg->modules, tnames, sizeof tnames);
    const char *bj = base->shape_json != NULL ? base->shape_json : "{}";
    const char *model_end = strstr(bj, "\",");
    const char *base_model = strstr(bj, "\"model\":\"");
    char bname[32] = "unknown";
    if (base_model != NULL && model_end != NULL && model_end > base_model + 9 &&
        model_end - (base_model + 9) < (ptrdiff_t)sizeof bname)
        snprintf(bname, sizeof bname, "%.*s", (int)(model_end - (base_model + 9)),
                 base_model + 9);
    snprintf(m->shape_json, sizeof m->shape_json,
             "{\"model\":\"lora-%s\",\"lora_rank\":%d,\"lora_alpha\":\"%g\",\"lora_targets\":"
             "\"%s\"%s%s",
             bname, cfg->rank, (double)m->cfg.alpha, tnames, model_end != NULL ? "," : "}",
             model_end != NULL ? model_end + 2 : "");
    m->frozen = (zdp_frozen){.n_params = base->n_params, .params = base->params,
                             .read = base_params != NULL ? read_whole_ : read,
                             .read_ctx = base_params != NULL ? (void *)m : read_ctx,
                             .src = &m->base_src};
    *out = (zdp_model){.self = m, .ops = &lora_ops_, .lm = &lora_lm_ops_,
                       .vocab_size = base->vocab_size, .block_size = base->block_size,
                       .n_params = n_params, .params = m->info, .shape_json = m->shape_json,
                       .activation_bytes = 2 * scratch * (int64_t)sizeof(float),
                       .frozen = &m->frozen};
    return ZDP_OK;
nomem:
    st = zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory for rank %d", fn, cfg->rank);
fail:
    out->self = m;
    out->ops = &lora_ops_;
    zdp_lora_destroy(out);
    return st;
}

void zdp_lora_destroy(zdp_model *model) {
    lora *m = lora_of_(model);
    if (m == NULL) return;
    free(m->sites);
    free(m->param_of);
    free(m->names);
    free(m->info);
    free(m->xa);
    free(m->dxa);
    free(m->base_src);
    free(m);
    memset(model, 0, sizeof *model);
}

const zdp_lora_config *zdp_lora_config_of(const zdp_model *model) {
    const lora *m = lora_of_(model);
    return m != NULL ? &m->cfg : NULL;
}

const zdp_model *zdp_lora_base_of(const zdp_model *model) {
    const lora *m = lora_of_(model);
    return m != NULL ? m->base : NULL;
}

int zdp_lora_site_param_(const zdp_model *model, int site) {
    const lora *m = lora_of_(model);
    return m != NULL && site >= 0 && site < m->nsites ? m->param_of[site] : -1;
}

int zdp_lora_fits_(const zdp_model *model, const zdp_model *base, zdp_error *err) {
    const lora *m = lora_of_(model);
    if (m == NULL) {
        zdp_err_set(err, ZDP_ERR_INVALID_ARG, "not a LoRA model (make one with zdp_lora_create)");
        return 0;
    }
    if (base == m->base) return 1;
    const int n = zdp_adapter_sites(base, NULL, 0, NULL);
    if (n != m->nsites) {
        zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                    "the LoRA model's base has %d adaptable linears, this model %d: the adapter "
                    "is for another base",
                    m->nsites, n);
        return 0;
    }
    zdp_adapter_site *s = malloc((size_t)n * sizeof *s);
    if (s == NULL) {
        zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory");
        return 0;
    }
    zdp_adapter_sites(base, s, n, NULL);
    int ok = 1;
    for (int i = 0; i < n && ok; i++)
        if (strcmp(s[i].module, m->sites[i].module) != 0 || s[i].in != m->sites[i].in ||
            s[i].out != m->sites[i].out) {
            zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                        "the LoRA model's %s is (in %lld, out %lld), this model's %s (in %lld, "
                        "out %lld): the adapter is for another base",
                        m->sites[i].module, (long long)m->sites[i].in,
                        (long long)m->sites[i].out, s[i].module, (long long)s[i].in,
                        (long long)s[i].out);
            ok = 0;
        }
    free(s);
    return ok;
}

void zdp_lora_init_params(const zdp_model *model, float *const *params) {
    const lora *m = lora_of_(model);
    if (m == NULL || params == NULL) return;
    uint64_t s = m->cfg.seed;
    for (int p = 0; p < model->n_params; p += 2) {
        const int64_t r = model->params[p].shape[0], in = model->params[p].shape[1];
        const int64_t out = model->params[p + 1].shape[0];
        /* nn.Linear's default: kaiming_uniform_(a = sqrt(5)) on [r, in] gives
         * bound = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + 5)): 1/sqrt(in). */
        const double bound = 1.0 / sqrt((double)in);
        for (int64_t k = 0; k < r * in; k++) {
            const double u = (double)(zdp_splitmix64(&s) >> 11) * 0x1.0p-53; /* [0,1) */
            params[p][k] = (float)((2.0 * u - 1.0) * bound);
        }
        memset(params[p + 1], 0, (size_t)(out * r) * sizeof(float));
    }
}

/* ---- merge --------------------------------------------------------------------------- */

zdp_status zdp_lora_merge(const zdp_model *model, const float *const *adapter,
                          float *const *merged, float *merged_head, zdp_error *err) {
    const char *fn = "zdp_lora_merge";
    const lora *m = lora_of_(model);
    if (m == NULL || adapter == NULL || merged == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                           "%s: a LoRA model, its adapter and merged must be set", fn);
    for (int i = 0; i < m->nsites; i++)
        if (m->param_of[i] >= 0 && m->sites[i].tied && merged_head == NULL)
            return zdp_err_set(err, ZDP_ERR_INVALID_ARG,
                               "%s: the adapter targets lm_head, which is tied to the token "
                               "embedding in this base: merging would change the embedding too "
                               "(write an untied lm_head, or train without the unembed target)",
                               fn);
    if (m->base_params == NULL)
        return zdp_err_set(err, ZDP_ERR_STATE,
                           "%s: the base exists only in a stage-3 engine's partitions "
                           "(zdp_lora_create_partitioned); merge from a model made with "
                           "zdp_lora_create and whole base weights", fn);
    const zdp_model *base = m->base;
    for (int i = 0; i < base->n_params; i++) {
        const zdp_param_info *p = &base->params[i];
        int64_t n = 1;
        for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
        memcpy(merged[i], m->base_params[i], (size_t)n * sizeof(float));
    }
    const int64_t r = m->cfg.rank;
    int64_t widest = 1;
    for (int i = 0; i < m->nsites; i++)
        if (m->sites[i].in > widest) widest = m->sites[i].in;
    float *row = malloc((size_t)widest * sizeof(float)); /* (in) one row of B A */
    if (row == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", fn);
    for (int i = 0; i < m->nsites; i++) {
        const int p = m->param_of[i];
        if (p < 0) continue;
        const zdp_adapter_site *s = &m->sites[i];
        const float *A = adapter[p], *B = adapter[p + 1]; /* [r, in], [out, r] */
        float *W = merged[s->weight];
        if (s->tied) {
            memcpy(merged_head, m->base_params[s->weight],
                   (size_t)(s->out * s->in) * sizeof(float));
            W = merged_head;
        }
        /* W[o][c] (a Conv1D's W[c][o]) += s * (B A)[o][c], as PEFT: the product
         * first, scaled, then added. */
        for (int64_t o = 0; o < s->out; o++) {
            memset(row, 0, (size_t)s->in * sizeof(float));
            for (int64_t k = 0; k < r; k++) {
                const float b = B[o * r + k];
                const float *a = A + k * s->in;
                for (int64_t c = 0; c < s->in; c++) row[c] += b * a[c];
            }
            if (s->conv1d)
                for (int64_t c = 0; c < s->in; c++) W[c * s->out + o] += row[c] * m->scale;
            else
                for (int64_t c = 0; c < s->in; c++) W[o * s->in + c] += row[c] * m->scale;
        }
    }
    free(row);
    return ZDP_OK;
}
