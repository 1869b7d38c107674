/*
 * job.c -- a job as it passes from the wire formats to the ranks and back:
 * its payload's layouts, read back only through the typed views below
 * (which check the layout), its outcome on rank 0, and its end.
 *
 * Payload layouts (what every rank receives; the parsers lay them out):
 *   forward_backward / forward: fwd_header h; int32 len[h.n]; int32
 *     tokens[total]; int32 targets[total]; float weights[total], logprobs[total],
 *     advantages[total]   (total = sum of len)
 *   optim_step: optim_payload
 *   save_weights / save_state / load_state / load_weights: the path, NUL-terminated
 *   sample: sample_req; int32 prompt[n]; int32 stop[n_stop]; n_stop_str strings
 *   asample: sample_file_header; int32 prompt[n_prompt]; int32 stop[n_stop]; path
 *   create_model: create_payload; the model_id, NUL-terminated
 *   delete_checkpoint: the path relative to --checkpoint-dir, NUL-terminated
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_impl.h"

const char *const serve_adam_keys[N_ADAM] = {"learning_rate", "beta1", "beta2", "eps",
                                             "weight_decay", "grad_clip_norm"};

void serve_job_clear(job *j) {
    free(j->payload);
    free(j->body);
    free(j->tinker_path);
    free(j->sampling_session);
    serve_fwd_result_free(j->fwd);
    serve_sample_result_free(j->sample);
    serve_save_result_free(j->saved);
    serve_info_result_free(j->info);
    j->payload = NULL, j->body = NULL, j->tinker_path = j->sampling_session = NULL;
    j->fwd = NULL, j->sample = NULL, j->saved = NULL, j->info = NULL;
}

void serve_job_free(job *j) {
    if (j == NULL) return;
    serve_job_clear(j);
    free(j);
}

void serve_job_fail(job *j, int status, const char *field, const char *msg) {
    j->status = status;
    snprintf(j->err_field, sizeof j->err_field, "%s", field != NULL ? field : "");
    snprintf(j->err_msg, sizeof j->err_msg, "%s", msg);
}

/* ---- typed views of payloads ------------------------------------------------------- */

/* Bytes [at, at + n) of the payload, or NULL when they are not all there. */
static const unsigned char *take_(const job *j, int64_t *at, int64_t n) {
    if (n < 0 || *at > j->nbytes || n > j->nbytes - *at) return NULL;
    const unsigned char *p = j->payload + *at;
    *at += n;
    return p;
}

bool serve_fwd_req_view(const job *j, serve_fwd_req *out) {
    int64_t at = 0;
    const unsigned char *h = take_(j, &at, (int64_t)sizeof out->h);
    if (h == NULL) return false;
    memcpy(&out->h, h, sizeof out->h);
    const int64_t n = out->h.n;
    if (n < 0 || n > j->nbytes / (int64_t)sizeof(int32_t)) return false;
    out->len = (const int32_t *)take_(j, &at, n * (int64_t)sizeof(int32_t));
    if (out->len == NULL) return false;
    out->total = 0;
    for (int64_t i = 0; i < n; i++) out->total += out->len[i];
    const int64_t t4 = out->total * 4;
    out->tokens = (const int32_t *)take_(j, &at, t4);
    out->targets = (const int32_t *)take_(j, &at, t4);
    out->weights = (const float *)take_(j, &at, t4);
    out->logprobs = (const float *)take_(j, &at, t4);
    out->advantages = (const float *)take_(j, &at, t4);
    return out->advantages != NULL && at == j->nbytes;
}

/* n NUL-terminated strings from at: the first one's address, at past the
 * last; NULL when they are not all there. */
static const char *take_strings_(const job *j, int64_t *at, int64_t n) {
    if (n < 0 || n > j->nbytes || *at > j->nbytes) return NULL;
    const char *first = (const char *)(j->payload + *at);
    for (int64_t k = 0; k < n; k++) {
        const unsigned char *end =
            *at < j->nbytes ? memchr(j->payload + *at, '\0', (size_t)(j->nbytes - *at)) : NULL;
        if (end == NULL) return NULL;
        *at = end - j->payload + 1;
    }
    return first;
}

bool serve_sample_req_view(const job *j, serve_sample_req *out) {
    int64_t at = 0;
    const unsigned char *h = take_(j, &at, (int64_t)sizeof out->r);
    if (h == NULL) return false;
    memcpy(&out->r, h, sizeof out->r);
    if (out->r.n < 0 || out->r.n > j->nbytes || out->r.n_stop < 0 || out->r.n_stop > j->nbytes) return false;
    out->prompt = (const int32_t *)take_(j, &at, out->r.n * (int64_t)sizeof(int32_t));
    out->stop = (const int32_t *)take_(j, &at, out->r.n_stop * (int64_t)sizeof(int32_t));
    out->stop_str = take_strings_(j, &at, out->r.n_stop_str);
    return out->prompt != NULL && out->stop != NULL && out->stop_str != NULL && at == j->nbytes;
}

bool serve_sample_file_req_view(const job *j, serve_sample_file_req *out) {
    int64_t at = 0;
    const unsigned char *h = take_(j, &at, (int64_t)sizeof out->h);
    if (h == NULL) return false;
    memcpy(&out->h, h, sizeof out->h);
    const int64_t np = out->h.n_prompt, ns = out->h.n_stop;
    if (np < 0 || ns < 0 || np > j->nbytes || ns > j->nbytes) return false;
    out->prompt = (const int32_t *)take_(j, &at, np * (int64_t)sizeof(int32_t));
    out->stop = (const int32_t *)take_(j, &at, ns * (int64_t)sizeof(int32_t));
    if (out->prompt == NULL || out->stop == NULL) return false;
    if ((out->stop_str = take_strings_(j, &at, out->h.n_stop_str)) == NULL) return false;
    out->path = (const char *)(j->payload + at);
    /* The path runs to the payload's last byte, a NUL. */
    return out->stop != NULL && at < j->nbytes && j->payload[j->nbytes - 1] == '\0' &&
           memchr(out->path, '\0', (size_t)(j->nbytes - at)) == j->payload + j->nbytes - 1;
}
