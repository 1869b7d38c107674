/*
 * exec_sample.c -- the sampling ops on every rank (docs/sampling.md): POST
 * /sample from the live weights, Tinker's asample from a sampler weights
 * file or a LoRA model's PEFT adapter folder, and a batch of asample jobs
 * that decode together.  It picks the weights (the file read last stays in
 * memory; adapters in a small cache) and hands the sequences to
 * sampling.c, which leaves each job's typed result.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/core.h"
#include "serve_impl.h"

/* Whether text[0..n) holds one of the n_str NUL-terminated strings at strs. */
static bool has_stop_(const char *text, size_t n, const char *strs, int64_t n_str) {
    for (int64_t q = 0; q < n_str; q++, strs += strlen(strs) + 1) {
        const size_t m = strlen(strs);
        for (size_t i = 0; m <= n && i <= n - m; i++)
            if (memcmp(text + i, strs, m) == 0) return true;
    }
    return false;
}

int64_t serve_stop_cut(server *s, const int32_t *gen, int64_t n, const char *strs, int64_t n_str) {
    for (int64_t m = n; m >= 0; m--) {
        size_t len = 0;
        char *text = s->opt.lm.decode(s->opt.lm.ctx, gen, m, &len);
        if (text == NULL) {
            fprintf(stderr, "zdp serve: sampling: cannot decode %lld generated tokens for the stop strings\n",
                    (long long)m);
            return -2;
        }
        const bool hit = has_stop_(text, len, strs, n_str);
        free(text);
        if (!hit) return m == n ? -1 : m;
    }
    return 0;
}

/* POST /sample: one sequence from the live weights (whole on every rank), through the
 * sampler (sampling.c): rank 0 runs it, the others join its gather. */
void serve_exec_sample(server *s, job *j) {
    serve_sample_req rq;
    if (!serve_sample_req_view(j, &rq))
        serve_die("sample", &(zdp_error){.msg = "a malformed request (a bug in zdp)"});
    const sample_req r = rq.r;
    zdp_error err = {0};
    /* A LoRA server samples its base (at stage 3 gathered for this request). */
    const bool lora = serve_lora(s);
    float **v = lora ? serve_base_get(s, err.msg, sizeof err.msg) : serve_weights_get(s, true, &err);
    verr why = {.status = 500};
    if (v == NULL) snprintf(why.msg, sizeof why.msg, "%s", err.msg);
    const serve_sample_spec sp = {.j = j, .prompt = rq.prompt, .n_prompt = r.n, .num_samples = 1,
                                  .max_tokens = r.max_tokens, .top_k = r.top_k, .n_stop = r.n_stop,
                                  .n_stop_str = r.n_stop_str, .temperature = r.temperature, .top_p = 1.0,
                                  .seed = (uint64_t)r.seed, .stop = rq.stop, .stop_str = rq.stop_str,
                                  .prompt_length = r.n};
    serve_sampler_run(s, (const float *const *)v, &sp, v == NULL ? &why : NULL);
    if (lora) serve_base_free(s, v);
    else serve_weights_free(s, v);
}

void serve_free_snapshot(server *s) {
    s->wgen++; /* the packed copies of these weights are stale */
    for (int i = 0; s->snap != NULL && i < s->model.n_params; i++) free(s->snap[i]);
    free(s->snap);
    free(s->snap_path);
    s->snap = NULL;
    s->snap_path = NULL;
}

static void adapter_free_(serve_adapter *a) {
    for (int i = 0; a->ad != NULL && i < a->lora.n_params; i++) free(a->ad[i]);
    free(a->ad);
    zdp_lora_destroy(&a->lora);
    free(a->path);
    *a = (serve_adapter){0};
}

void serve_free_adapters(server *s) {
    for (int k = 0; k < SERVE_AD_CACHE; k++) adapter_free_(&s->ad_cache[k]);
}

/* The modification time of path (zero when it cannot be read). */
static struct timespec mtime_(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? sb.st_mtim : (struct timespec){0};
}

static bool same_time_(struct timespec a, struct timespec b) {
    return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

/* A LoRA model's sampler weights, a PEFT adapter folder (docs/lora.md): its
 * LoRA model over the base weights and its adapter tensors, from the cache
 * (unless the folder was written again since) or read into the least
 * recently used entry not used at or after ad_clock `pin` (the running
 * batch's).  Every rank reads it.  NULL with err set on failure. */
static serve_adapter *adapter_of_(server *s, const char *dir, int64_t pin, zdp_error *err) {
    char file[4200];
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", dir);
    const struct timespec t = mtime_(file);
    serve_adapter *a = NULL;
    for (int k = 0; k < SERVE_AD_CACHE && a == NULL; k++)
        if (s->ad_cache[k].path != NULL && !strcmp(s->ad_cache[k].path, dir)) a = &s->ad_cache[k];
    if (a != NULL && same_time_(a->mtime, t)) {
        a->used = ++s->ad_clock;
        return a;
    }
    for (int k = 0; k < SERVE_AD_CACHE && a == NULL; k++) {
        serve_adapter *c = &s->ad_cache[k];
        if (c->path != NULL && c->used >= pin) continue; /* the running batch's */
        if (a == NULL || c->path == NULL || (a->path != NULL && c->used < a->used)) a = c;
    }
    if (a == NULL) {
        zdp_err_set(err, ZDP_ERR_INTERNAL, "more adapters in one batch than the cache holds (a bug in zdp)");
        return NULL;
    }
    adapter_free_(a);
    zdp_lora_config lc;
    zdp_status st = zdp_lora_read_adapter_config(dir, &lc, err);
    if (st == ZDP_OK) st = zdp_lora_create(&s->model, (const float *const *)s->base, &lc, &a->lora, err);
    if (st == ZDP_OK && (a->ad = calloc((size_t)a->lora.n_params, sizeof *a->ad)) == NULL)
        st = zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory for the adapter");
    for (int i = 0; st == ZDP_OK && i < a->lora.n_params; i++)
        if ((a->ad[i] = malloc((size_t)serve_numel(&a->lora.params[i]) * sizeof(float))) == NULL)
            st = zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory for the adapter");
    if (st == ZDP_OK) st = zdp_lora_load_adapter(dir, &a->lora, a->ad, err);
    if (st == ZDP_OK && (a->path = strdup(dir)) == NULL)
        st = zdp_err_set(err, ZDP_ERR_NOMEM, "out of memory for the adapter");
    if (st != ZDP_OK) {
        adapter_free_(a);
        return NULL;
    }
    a->mtime = t;
    a->used = ++s->ad_clock;
    return a;
}

/* Whether an asample job's weights are a LoRA model's adapter folder (a
 * model folder, --model-dir's base_model, is not: it has no
 * adapter_config.json). */
static bool on_adapter_(const server *s, const char *path) {
    char conf[4200];
    struct stat sb;
    return s->base != NULL &&
           snprintf(conf, sizeof conf, "%s/adapter_config.json", path) < (int)sizeof conf &&
           stat(conf, &sb) == 0 && S_ISREG(sb.st_mode);
}

static serve_sample_spec sample_file_spec_(job *j, const serve_sample_file_req *rq, const serve_adapter *a) {
    const sample_file_header h = rq->h;
    return (serve_sample_spec){.j = j, .prompt = rq->prompt, .n_prompt = h.n_prompt,
                               .num_samples = h.num_samples, .max_tokens = h.max_tokens, .top_k = h.top_k,
                               .n_stop = h.n_stop, .n_stop_str = h.n_stop_str, .temperature = h.temperature,
                               .top_p = h.top_p, .seed = h.seed, .stop = rq->stop, .stop_str = rq->stop_str,
                               .logprobs = true, .prompt_logprobs = h.prompt_logprobs != 0,
                               .topk_prompt = h.topk_prompt, .prompt_length = -1,
                               .lora = a != NULL ? &a->lora : NULL,
                               .adapter = a != NULL ? (const float *const *)a->ad : NULL};
}

static verr adapter_why_(const zdp_error *err) {
    verr why = {.status = serve_status_of(err->code), .field = "model_path"};
    snprintf(why.msg, sizeof why.msg, "%s", err->msg);
    return why;
}

/* The sampler weights file at path as s->snap: read unless it is the one
 * read last and unchanged since (every rank reads it); on failure *why
 * names model_path and s->snap is NULL. */
static void snap_load_(server *s, const char *path, verr *why) {
    const int np = s->model.n_params;
    const struct timespec t = mtime_(path);
    if (s->snap_path != NULL && strcmp(s->snap_path, path) == 0 && same_time_(s->snap_mtime, t)) return;
    serve_free_snapshot(s);
    zdp_error err = {0};
    s->snap_path = strdup(path);
    s->snap_mtime = t;
    s->snap = calloc((size_t)np, sizeof *s->snap);
    bool ok = s->snap_path != NULL && s->snap != NULL;
    for (int i = 0; ok && i < np; i++)
        ok = (s->snap[i] = zdp_big_alloc((size_t)serve_numel(&s->model.params[i]) * sizeof(float))) != NULL;
    zdp_status st = ok ? s->opt.lm.load(s->opt.lm.ctx, path, &s->model, s->snap, &err) : ZDP_ERR_NOMEM;
    if (st != ZDP_OK) {
        serve_free_snapshot(s);
        why->status = serve_status_of(st);
        snprintf(why->field, sizeof why->field, "model_path");
        snprintf(why->msg, sizeof why->msg, "%s", ok ? err.msg : "out of memory for the sampler weights");
    }
}

/* Tinker's asample: num_samples continuations of the prompt from the
 * weights in a sampler file (save_weights_for_sampler), not from the live
 * ones, so training between save and sample changes nothing.  Every rank
 * reads the file (the one read last stays in memory) and samples its share
 * (sampling.c).  Each token comes with the model's log p (what
 * importance-sampling losses take as the sampler's logprobs). */
void serve_exec_sample_file(server *s, job *j) {
    serve_sample_file_req rq;
    if (!serve_sample_file_req_view(j, &rq))
        serve_die("asample", &(zdp_error){.msg = "a malformed request (a bug in zdp)"});
    const char *path = rq.path;
    zdp_error err = {0};
    verr why = {0};
    /* A folder is a LoRA model's PEFT adapter (over the base weights). */
    if (on_adapter_(s, path)) {
        const serve_adapter *a = adapter_of_(s, path, s->ad_clock + 1, &err);
        if (a == NULL) why = adapter_why_(&err);
        const serve_sample_spec sp = sample_file_spec_(j, &rq, a);
        char bwhy[ZDP_ERROR_MSG_MAX];
        float **base = serve_base_get(s, bwhy, sizeof bwhy);
        if (base == NULL && a != NULL) {
            why = (verr){.status = 500, .field = "model_path"};
            snprintf(why.msg, sizeof why.msg, "%s", bwhy);
        }
        serve_sampler_run(s, (const float *const *)base, &sp, a == NULL || base == NULL ? &why : NULL);
        serve_base_free(s, base);
        return;
    }
    snap_load_(s, path, &why);
    const serve_sample_spec sp = sample_file_spec_(j, &rq, NULL);
    serve_sampler_run(s, (const float *const *)s->snap, &sp, why.msg[0] != '\0' ? &why : NULL);
}

void serve_exec_sample_batch(server *s, job **jobs, int n) {
    serve_sample_spec sps[SERVE_SAMPLE_BATCH] = {{0}};
    verr whys[SERVE_SAMPLE_BATCH];
    const verr *wp[SERVE_SAMPLE_BATCH] = {0};
    int m = 0;
    serve_sample_file_req rq[SERVE_SAMPLE_BATCH];
    bool done[SERVE_SAMPLE_BATCH] = {0};
    if (n > SERVE_SAMPLE_BATCH) n = SERVE_SAMPLE_BATCH;
    for (int k = 0; k < n; k++) {
        if (!serve_sample_file_req_view(jobs[k], &rq[k]))
            serve_die("asample", &(zdp_error){.msg = "a malformed request (a bug in zdp)"});
        jobs[k]->status = 500; /* until the sampler answers it */
    }
    /* Requests on one sampler weights file decode together, as one batch
     * per file (the file is read, and its weights packed, once for all of
     * them); every rank groups them alike: by the path the jobs carry. */
    for (int k = 0; k < n; k++) {
        if (done[k] || on_adapter_(s, rq[k].path)) continue;
        verr why = {0};
        snap_load_(s, rq[k].path, &why);
        m = 0;
        for (int i = k; i < n; i++)
            if (!done[i] && strcmp(rq[i].path, rq[k].path) == 0) {
                sps[m] = sample_file_spec_(jobs[i], &rq[i], NULL);
                wp[m++] = why.msg[0] != '\0' ? &why : NULL;
                done[i] = true;
            }
        serve_sampler_run_many(s, (const float *const *)s->snap, sps, wp, m);
        if (s->R == 0 && m > 1) s->stats[OP_SAMPLE_FILE].batched += m;
    }
    /* LoRA models' sampler weights: every adapter's requests in one batch
     * over the base (zdp_generate groups each adapter's rows). */
    m = 0;
    const int64_t pin = s->ad_clock + 1; /* the adapters this batch uses stay in the cache */
    for (int k = 0; k < n; k++) {
        if (done[k]) continue;
        zdp_error err = {0};
        const serve_adapter *a = adapter_of_(s, rq[k].path, pin, &err);
        if (a == NULL) whys[m] = adapter_why_(&err);
        sps[m] = sample_file_spec_(jobs[k], &rq[k], a);
        wp[m] = a == NULL ? &whys[m] : NULL;
        m++;
    }
    char bwhy[ZDP_ERROR_MSG_MAX];
    float **base = m > 0 ? serve_base_get(s, bwhy, sizeof bwhy) : NULL;
    for (int i = 0; m > 0 && base == NULL && i < m; i++) /* every rank alike: nothing samples */
        if (wp[i] == NULL) {
            whys[i] = (verr){.status = 500, .field = "model_path"};
            snprintf(whys[i].msg, sizeof whys[i].msg, "%s", bwhy);
            wp[i] = &whys[i];
        }
    serve_sampler_run_many(s, (const float *const *)base, sps, wp, m);
    serve_base_free(s, base);
    if (s->R == 0 && m > 1) s->stats[OP_SAMPLE_FILE].batched += m;
}
