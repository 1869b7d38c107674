/*
 * plain_info.c -- GET /info's JSON (docs/server.md): the served model, the
 * server's mode and limits, and the numbers exec_info.c gathered from the
 * ranks (memory rows per rank, every live model, the requests so far).
 * Runs on the main thread as the job finishes (plain_api.c's encode_).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "serve_impl.h"

/* The bounds of docs/server.md's "Limits" and what is in use now. */
static json_t *limits_json_(server *s) {
    const union MHD_DaemonInfo *ci =
        s->daemon != NULL ? MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS) : NULL;
    return json_pack("{s:I,s:I,s:I,s:i,s:i,s:i,s:i,s:f,s:f,s:i,s:i}", "max_body_bytes", (json_int_t)s->opt.max_body,
                     "max_inflight_bytes", (json_int_t)s->opt.max_inflight, "inflight_bytes",
                     (json_int_t)serve_body_inflight(s), "max_connections", s->opt.max_connections,
                     "max_connections_per_ip", s->opt.max_connections_per_ip, "connections",
                     ci != NULL ? (int)ci->num_connections : -1, "idle_timeout_seconds",
                     s->opt.idle_timeout_s, "request_timeout_seconds", s->opt.request_timeout_s,
                     "health_timeout_seconds", s->opt.health_timeout_s, "max_sample_batch",
                     s->opt.max_sample_batch, "max_stop_bytes", s->opt.max_stop_bytes);
}

/* /info's model: its arch, the shape it records (zdp_model.shape_json, a
 * flat object: GPT's n_layer, n_head, n_embd; the Llama family's config),
 * vocab_size, block_size and the parameter count. */
static json_t *model_json_(server *s) {
    json_t *o = json_pack("{s:s}", "arch", s->opt.lm.arch);
    json_t *shape = s->model.shape_json != NULL ? json_loads(s->model.shape_json, 0, NULL) : NULL;
    if (json_is_object(shape)) {
        json_object_del(shape, "model");
        json_object_update(o, shape);
    }
    json_decref(shape);
    json_object_set_new(o, "vocab_size", json_integer(s->model.vocab_size));
    json_object_set_new(o, "block_size", json_integer(s->model.block_size));
    int64_t n = 0;
    for (int i = 0; i < s->model.n_params; i++) n += serve_numel(&s->model.params[i]);
    json_object_set_new(o, "n_params", json_integer((json_int_t)n));
    return o;
}

/* Server-side timing by request kind (the one being answered not yet
 * counted): how long requests waited in the FIFO and ran on the ranks. */
static json_t *requests_json_(const serve_op_stats *stats) {
    json_t *req = json_object();
    for (int op = 0; op < SERVE_N_OPS; op++) {
        if (stats[op].count == 0) continue;
        const double n = (double)stats[op].count;
        json_object_set_new(req, serve_ops[op].name,
                            json_pack("{s:I,s:f,s:f,s:f}", "count", (json_int_t)stats[op].count,
                                      "mean_queue_ms", 1e3 * stats[op].queue_s / n, "mean_exec_ms",
                                      1e3 * stats[op].exec_s / n, "max_exec_ms",
                                      1e3 * stats[op].exec_max_s));
        if (stats[op].batched > 0) /* asample: requests that shared decoding passes */
            json_object_set_new(json_object_get(req, serve_ops[op].name), "batched",
                                json_integer((json_int_t)stats[op].batched));
    }
    return req;
}

/* "models": every live model with its counters and its memory on each rank. */
static json_t *models_json_(const serve_info_result *r) {
    json_t *arr = json_array();
    for (int k = 0; arr != NULL && k < r->n_models; k++) {
        const serve_info_model *x = &r->models[k];
        json_t *mem = json_array();
        for (int q = 0; q < r->W; q++) {
            const int64_t *v = x->rows + SERVE_INFO_MODEL_COLS * q;
            json_array_append_new(mem, json_pack("{s:i,s:I,s:I,s:I,s:I,s:I,s:I}", "rank", q, "params_bytes",
                                                 (json_int_t)v[0], "grads_bytes", (json_int_t)v[1],
                                                 "optimizer_bytes", (json_int_t)v[2], "other_bytes",
                                                 (json_int_t)v[3], "total_bytes", (json_int_t)v[4],
                                                 "frozen_bytes", (json_int_t)v[5]));
        }
        json_t *o = json_pack("{s:i,s:I,s:I,s:I,s:I,s:o}", "slot", x->slot, "n_params", (json_int_t)x->n_params,
                              "step", (json_int_t)x->step, "pending_backwards", (json_int_t)x->pending_backwards,
                              "micro_steps", (json_int_t)x->micro_steps, "memory", mem);
        if (r->lora) {
            char targets[ZDP_LORA_TARGETS_NAME_MAX];
            zdp_lora_targets_name(x->lc.targets, x->lc.modules, targets, sizeof targets);
            json_object_set_new(o, "model_id", json_string(x->name));
            json_object_set_new(o, "lora", json_pack("{s:i,s:f,s:s,s:I}", "rank", x->lc.rank, "alpha",
                                                     (double)(x->lc.alpha != 0 ? x->lc.alpha : ZDP_LORA_DEFAULT_ALPHA),
                                                     "targets", targets, "seed", (json_int_t)x->lc.seed));
        }
        json_array_append_new(arr, o);
    }
    return arr;
}

static char *info_lora_json_(server *s, const serve_info_result *r, json_t *models) {
    json_t *mem = json_array();
    for (int q = 0; q < r->W; q++) {
        const int64_t *x = r->rows + SERVE_INFO_LORA_COLS * q;
        json_array_append_new(mem, json_pack("{s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "rank", q,
                                             "base_whole_bytes",
                                             (json_int_t)x[0], "base_partition_bytes", (json_int_t)x[1],
                                             "base_other_bytes", (json_int_t)x[2], "gathered_whole_bytes",
                                             (json_int_t)x[3], "kv_cache_peak_bytes", (json_int_t)x[4],
                                             "packed_weights_bytes", (json_int_t)x[5], "packed_weights_packs",
                                             (json_int_t)x[6], "sample_prefill_rows", (json_int_t)x[7],
                                             "sample_decode_rows", (json_int_t)x[8], "sample_shared_rows",
                                             (json_int_t)x[9]));
    }
    json_t *o = json_pack("{s:o,s:i,s:i,s:s,s:i,s:f,s:f,s:I,s:o,s:I}", "model", model_json_(s), "world_size", r->W,
                          "zero_stage", s->cfg.zero.stage, "mode", "lora", "max_models", s->opt.max_models,
                          "model_idle_timeout_seconds", s->opt.model_idle_timeout_s, "session_timeout_seconds",
                          s->opt.session_timeout_s, "base_bytes",
                          (json_int_t)r->base_bytes, "models", models, "max_body_bytes", (json_int_t)s->opt.max_body);
    json_object_set_new(o, "memory", mem);
    json_object_set_new(o, "requests", requests_json_(r->stats));
    json_object_set_new(o, "limits", limits_json_(s));
    return serve_dump(o);
}

char *serve_info_json(server *s, const serve_info_result *r) {
    json_t *models = models_json_(r);
    if (r->lora) return info_lora_json_(s, r, models);
    json_t *mem = json_array();
    for (int q = 0; q < r->W; q++) {
        const int64_t *x = r->rows + SERVE_INFO_FULL_COLS * q;
        json_array_append_new(mem, json_pack("{s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,"
                                             "s:I,s:I,s:I}", "rank", q,
                                             "params_bytes", (json_int_t)x[0], "grads_bytes", (json_int_t)x[1],
                                             "grad_partition_bytes", (json_int_t)x[2], "bucket_bytes",
                                             (json_int_t)x[3], "optimizer_bytes", (json_int_t)x[4],
                                             "master_bytes", (json_int_t)x[5], "other_bytes",
                                             (json_int_t)x[6], "total_bytes", (json_int_t)x[7],
                                             "sampler_weights_bytes", (json_int_t)x[8], "kv_cache_bytes",
                                             (json_int_t)x[9], "kv_cache_peak_bytes", (json_int_t)x[10],
                                             "gathered_whole_bytes", (json_int_t)x[11],
                                             "packed_weights_bytes", (json_int_t)x[12],
                                             "packed_weights_packs", (json_int_t)x[13], "sample_prefill_rows",
                                             (json_int_t)x[14], "sample_decode_rows", (json_int_t)x[15],
                                             "sample_shared_rows", (json_int_t)x[16]));
    }
    const zdp_optimizer_config *oc = &s->cfg.optimizer;
    const zdp_hparams hp = r->hp;
    const char *opt = oc->type == ZDP_OPTIMIZER_SGD ? "SGD" : oc->type == ZDP_OPTIMIZER_ADAMW ? "AdamW" : "Adam";
    json_t *o = json_pack(
        "{s:o,s:i,s:i,s:I,s:I,s:I,s:I,s:I,s:o,s:o,"
        "s:{s:s,s:f,s:f,s:f,s:f,s:f,s:f},s:o,s:I}",
        "model", model_json_(s), "world_size", r->W, "zero_stage", s->cfg.zero.stage, "step",
        (json_int_t)r->step, "global_samples", (json_int_t)r->global_samples, "micro_steps",
        (json_int_t)r->micro_steps, "skipped_steps", (json_int_t)r->skipped_steps, "pending_backwards",
        (json_int_t)r->pending_backwards, "lr", serve_jreal(r->lr), "last_grad_norm",
        serve_jreal(r->last_grad_norm), "optimizer", "type", opt, "lr",
        hp.lr, "beta1", hp.beta1, "beta2", hp.beta2, "eps", hp.eps, "weight_decay", hp.weight_decay,
        "gradient_clipping", hp.gradient_clipping, "memory", mem, "max_body_bytes",
        (json_int_t)s->opt.max_body);
    json_object_set_new(o, "mode", json_string("full_finetune"));
    json_object_set_new(o, "max_models", json_integer(s->opt.max_models));
    json_object_set_new(o, "models", models);
    json_object_set_new(o, "requests", requests_json_(r->stats));
    json_object_set_new(o, "limits", limits_json_(s));
    return serve_dump(o);
}
