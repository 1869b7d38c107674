/*
 * results.c -- the typed results an op leaves in its job on rank 0
 * (serve_impl.h): deep copies (a Tinker poll encodes a copy outside the
 * lock) and frees.  Each result is freed here, whoever made or holds it;
 * the encoders are the wire formats' (results_json.c, tinker/).
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdlib.h>
#include <string.h>

#include "serve_impl.h"

serve_fwd_result *serve_fwd_result_copy(const serve_fwd_result *r) {
    serve_fwd_result *c = malloc(sizeof *c);
    if (c == NULL) return NULL;
    const int64_t total = r->off[r->n];
    *c = (serve_fwd_result){.n = r->n, .loss_sum = r->loss_sum};
    c->off = malloc((size_t)(r->n + 1) * sizeof *c->off);
    c->logprobs = malloc(((size_t)total + 1) * sizeof *c->logprobs);
    c->elementwise = malloc(((size_t)total + 1) * sizeof *c->elementwise);
    if (c->off == NULL || c->logprobs == NULL || c->elementwise == NULL) {
        serve_fwd_result_free(c);
        return NULL;
    }
    memcpy(c->off, r->off, (size_t)(r->n + 1) * sizeof *c->off);
    memcpy(c->logprobs, r->logprobs, (size_t)total * sizeof *c->logprobs);
    memcpy(c->elementwise, r->elementwise, (size_t)total * sizeof *c->elementwise);
    return c;
}

void serve_fwd_result_free(serve_fwd_result *r) {
    if (r == NULL) return;
    free(r->off);
    free(r->logprobs);
    free(r->elementwise);
    free(r);
}

serve_sample_result *serve_sample_result_copy(const serve_sample_result *r) {
    serve_sample_result *c = calloc(1, sizeof *c);
    if (c == NULL) return NULL;
    const int64_t total = r->off[r->n];
    *c = (serve_sample_result){.n = r->n, .prompt_length = r->prompt_length};
    c->off = malloc((size_t)(r->n + 1) * sizeof *c->off);
    c->tokens = malloc(((size_t)total + 1) * sizeof *c->tokens);
    c->stopped = malloc(((size_t)r->n + 1) * sizeof *c->stopped);
    if (r->logprobs != NULL) c->logprobs = malloc(((size_t)total + 1) * sizeof *c->logprobs);
    if (c->off == NULL || c->tokens == NULL || c->stopped == NULL || (r->logprobs != NULL && c->logprobs == NULL)) {
        serve_sample_result_free(c);
        return NULL;
    }
    memcpy(c->off, r->off, (size_t)(r->n + 1) * sizeof *c->off);
    memcpy(c->tokens, r->tokens, (size_t)total * sizeof *c->tokens);
    memcpy(c->stopped, r->stopped, (size_t)r->n * sizeof *c->stopped);
    if (r->logprobs != NULL) memcpy(c->logprobs, r->logprobs, (size_t)total * sizeof *c->logprobs);
    if (r->prompt_logprobs != NULL) {
        c->prompt_logprobs = malloc(((size_t)r->n_prompt_logprobs + 1) * sizeof *c->prompt_logprobs);
        if (c->prompt_logprobs == NULL) {
            serve_sample_result_free(c);
            return NULL;
        }
        memcpy(c->prompt_logprobs, r->prompt_logprobs, (size_t)r->n_prompt_logprobs * sizeof *c->prompt_logprobs);
        c->n_prompt_logprobs = r->n_prompt_logprobs;
    }
    if (r->topk_k > 0) {
        const size_t nk = (size_t)(r->n_topk * r->topk_k);
        c->topk_ids = malloc((nk + 1) * sizeof *c->topk_ids);
        c->topk_logprobs = malloc((nk + 1) * sizeof *c->topk_logprobs);
        if (c->topk_ids == NULL || c->topk_logprobs == NULL) {
            serve_sample_result_free(c);
            return NULL;
        }
        memcpy(c->topk_ids, r->topk_ids, nk * sizeof *c->topk_ids);
        memcpy(c->topk_logprobs, r->topk_logprobs, nk * sizeof *c->topk_logprobs);
        c->topk_k = r->topk_k, c->n_topk = r->n_topk;
    }
    return c;
}

void serve_sample_result_free(serve_sample_result *r) {
    if (r == NULL) return;
    free(r->off);
    free(r->tokens);
    free(r->logprobs);
    free(r->stopped);
    free(r->prompt_logprobs);
    free(r->topk_ids);
    free(r->topk_logprobs);
    free(r);
}

/* strdup of s, or NULL for NULL; false when out of memory. */
static bool dup_(const char *s, char **out) {
    *out = s != NULL ? strdup(s) : NULL;
    return s == NULL || *out != NULL;
}

serve_save_result *serve_save_result_copy(const serve_save_result *r) {
    serve_save_result *c = malloc(sizeof *c);
    if (c == NULL) return NULL;
    *c = *r;
    c->path = c->name = c->session = NULL;
    if (!dup_(r->path, &c->path) || !dup_(r->name, &c->name) || !dup_(r->session, &c->session)) {
        serve_save_result_free(c);
        return NULL;
    }
    return c;
}

void serve_save_result_free(serve_save_result *r) {
    if (r == NULL) return;
    free(r->path);
    free(r->name);
    free(r->session);
    free(r);
}

void serve_info_result_free(serve_info_result *r) {
    if (r == NULL) return;
    for (int k = 0; r->models != NULL && k < r->n_models; k++) free(r->models[k].rows);
    free(r->models);
    free(r->rows);
    free(r);
}
