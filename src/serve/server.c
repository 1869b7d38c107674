/*
 * server.c -- start-up and shut-down of the training server (serve.h): the
 * engine every rank builds, and on rank 0 the guards' files, the protocols
 * and the HTTP server.  The request path is in the other files of
 * src/serve/ (serve_impl.h lists them).
 */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "serve_impl.h"

static zdp_status fail_(zdp_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static zdp_status fail_(zdp_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->code = ZDP_ERR_INVALID_ARG;
    err->rank = zdp_dist_rank();
    return ZDP_ERR_INVALID_ARG;
}

/* --api-key-file: the key is the file's first line (surrounding blanks
 * dropped).  A missing, unreadable or empty file is an error; a file other
 * users may read is a warning. */
static zdp_status load_api_key_(server *s, zdp_error *err) {
    const char *f = s->opt.api_key_file;
    FILE *fp = fopen(f, "r");
    if (fp == NULL) return fail_(err, "--api-key-file %s: %s", f, strerror(errno));
    struct stat sb;
    if (fstat(fileno(fp), &sb) == 0 && (sb.st_mode & (S_IRGRP | S_IROTH)))
        fprintf(stderr, "zdp serve: warning: --api-key-file %s can be read by other users (mode %03o); "
                "chmod 600 %s\n", f, (unsigned)(sb.st_mode & 0777), f);
    char line[4096];
    const bool got = fgets(line, sizeof line, fp) != NULL;
    fclose(fp);
    char *k = line;
    size_t n = got ? strlen(line) : 0;
    while (n > 0 && (k[n - 1] == '\n' || k[n - 1] == '\r' || k[n - 1] == ' ' || k[n - 1] == '\t')) k[--n] = '\0';
    while (n > 0 && (*k == ' ' || *k == '\t')) k++, n--;
    if (n == 0) return fail_(err, "--api-key-file %s: empty; write the key on its first line", f);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)k[i] <= 0x20 || (unsigned char)k[i] >= 0x7f)
            return fail_(err, "--api-key-file %s: the key must be printable ASCII without blanks (byte %zu is "
                            "0x%02x)", f, i, (unsigned char)k[i]);
    if ((s->api_key = strdup(k)) == NULL) return fail_(err, "out of memory");
    s->api_key_len = n;
    memset(line, 0, sizeof line);
    return ZDP_OK;
}

/* --allow-path-root folders: each must exist; kept as real paths. */
static zdp_status load_roots_(server *s, zdp_error *err) {
    if (s->opt.n_allow_roots == 0) return ZDP_OK;
    s->roots_real = calloc((size_t)s->opt.n_allow_roots, sizeof *s->roots_real);
    if (s->roots_real == NULL) return fail_(err, "out of memory");
    for (int i = 0; i < s->opt.n_allow_roots; i++) {
        const char *r = s->opt.allow_roots[i];
        struct stat sb;
        if ((s->roots_real[i] = realpath(r, NULL)) == NULL)
            return fail_(err, "--allow-path-root %s: %s", r, strerror(errno));
        if (stat(s->roots_real[i], &sb) != 0 || !S_ISDIR(sb.st_mode))
            return fail_(err, "--allow-path-root %s: not a directory", r);
    }
    return ZDP_OK;
}

/* zdp_tensor_read_fn over whole tensors in memory (ctx: float **). */
static zdp_status base_read_(void *ctx, int i, int64_t lo, int64_t hi, float *dst, zdp_error *err) {
    (void)err;
    memcpy(dst, ((float *const *)ctx)[i] + lo, (size_t)(hi - lo) * sizeof(float));
    return ZDP_OK;
}

zdp_status zdp_server_create(const serve_opts *opt, zdp_server **out, zdp_error *err) {
    server *s = calloc(1, sizeof *s);
    *out = s;
    if (s == NULL) return fail_(err, "out of memory");
    s->opt = *opt;
    s->W = zdp_dist_world_size();
    s->R = zdp_dist_rank();
    s->busy_op = -1;
    s->ping_missing = -1;
    /* Every step that can fail on this rank alone (its own config or --init
     * file); the caller agrees across ranks before the first collective. */
    if (zdp_config_load_file(s->opt.config, s->W, &s->cfg, err) != ZDP_OK) return err->code;
    /* Every rank's own checkpoint folder (save_state writes a part on each). */
    if (serve_mkdirs(s->opt.checkpoint_dir) != 0 || (s->ckpt_root = realpath(s->opt.checkpoint_dir, NULL)) == NULL)
        return fail_(err, "--checkpoint-dir %s: cannot create or open it: %s", s->opt.checkpoint_dir,
                     strerror(errno));
    if (s->cfg.managed_gradient_accumulation)
        return fail_(err, "%s: zdp serve needs unmanaged gradient accumulation (each optim_step request "
                     "is the optimizer step); set \"managed_gradient_accumulation\": false",
                     s->opt.config);
    /* The caller's model (one datum per micro-batch: activation memory for
     * one sequence); a causal LM, since every request is token sequences. */
    zdp_status st = s->opt.lm.create(s->opt.lm.ctx, &s->model, err);
    if (st != ZDP_OK) return st;
    s->have_model = true;
    if (s->model.lm == NULL || s->model.vocab_size < 1 || s->model.block_size < 1)
        return fail_(err, "zdp serve: the model is not a causal language model");
    if (s->opt.max_models < 1 || (s->opt.full_finetune && s->opt.max_models != 1))
        return fail_(err, "--max-models %d: %s", s->opt.max_models,
                     s->opt.full_finetune ? "--full-finetune trains one model: drop --max-models or set it to 1"
                                          : "must be at least 1");
    s->slots = calloc((size_t)s->opt.max_models, sizeof *s->slots);
    if (s->slots == NULL) return fail_(err, "out of memory");
    if (s->opt.full_finetune) {
        /* The one model: every weight trains, in the engine from start-up. */
        if ((st = zdp_engine_create(&s->cfg, &s->model, &s->eng, err)) != ZDP_OK) return st;
        s->slots[0] = (serve_slot){.uid = 1, .model = &s->model, .eng = s->eng};
        s->cur = &s->model;
        /* Every rank initialises the same values (stage 3 keeps each rank's
         * slice of them); zdp_server_start syncs.  At stage 3 a reader
         * brings each rank its slices alone (docs/training.md, "Stage 3
         * loading"). */
        if (s->cfg.zero.stage == 3 && s->opt.lm.reader_open != NULL) {
            void *r = NULL;
            st = s->opt.lm.reader_open(s->opt.lm.ctx, &s->model, &r, err);
            if (st == ZDP_OK) st = zdp_engine_load_params(s->eng, s->opt.lm.read_slice, r, err);
            if (r != NULL) s->opt.lm.reader_close(r);
            return st;
        }
        float **v = serve_weights_get(s, false, err);
        if (v == NULL) return err->code;
        st = s->opt.lm.init(s->opt.lm.ctx, &s->model, v, err);
        if (st == ZDP_OK && s->cfg.zero.stage == 3)
            for (int i = 0; st == ZDP_OK && i < s->model.n_params; i++)
                st = zdp_engine_set_param(s->eng, i, v[i], err);
        serve_weights_free(s, v);
        return st;
    }
    /* LoRA: the base weights, loaded once on every rank and never written;
     * each model's engine holds its adapters alone.  At stage 3 the base is
     * partitioned once per rank, 1/W, in a store every model's engine
     * borrows (sampling gathers it whole for each batch, serve_base_get):
     * read a slice at a time where the model has a reader (a model folder:
     * no rank ever holds the whole base), else initialised whole, copied
     * in, and freed. */
    s->base = calloc((size_t)s->model.n_params, sizeof *s->base);
    if (s->base == NULL) return fail_(err, "out of memory");
    if (s->cfg.zero.stage == 3 && s->opt.lm.reader_open != NULL) {
        void *r = NULL;
        st = s->opt.lm.reader_open(s->opt.lm.ctx, &s->model, &r, err);
        const zdp_frozen fz = {.n_params = s->model.n_params, .params = s->model.params,
                               .read = s->opt.lm.read_slice, .read_ctx = r};
        if (st == ZDP_OK) st = zdp_frozen_store_create(&s->cfg, &fz, &s->store, err);
        if (r != NULL) s->opt.lm.reader_close(r);
        if (st != ZDP_OK) return st;
    } else {
        for (int i = 0; i < s->model.n_params; i++) {
            int64_t n = 1;
            for (int d = 0; d < s->model.params[i].ndim; d++) n *= s->model.params[i].shape[d];
            if ((s->base[i] = zdp_big_alloc((size_t)n * sizeof(float))) == NULL)
                return fail_(err, "out of memory for the base weights");
        }
        if ((st = s->opt.lm.init(s->opt.lm.ctx, &s->model, s->base, err)) != ZDP_OK) return st;
    }
    if (s->cfg.zero.stage == 3 && s->store == NULL) {
        const zdp_frozen fz = {.n_params = s->model.n_params, .params = s->model.params,
                               .read = base_read_, .read_ctx = s->base};
        if ((st = zdp_frozen_store_create(&s->cfg, &fz, &s->store, err)) != ZDP_OK) return st;
        for (int i = 0; i < s->model.n_params; i++) {
            free(s->base[i]);
            s->base[i] = NULL;
        }
    }
    /* A model LoRA cannot adapt is refused now, not at the first create_model. */
    zdp_model probe;
    const zdp_lora_config lc = {.rank = 1, .targets = ZDP_LORA_ALL};
    if (zdp_lora_create(&s->model, (const float *const *)s->base, &lc, &probe, err) != ZDP_OK)
        return fail_(err, "zdp serve trains LoRA models unless --full-finetune is given: %s", err->msg);
    zdp_lora_destroy(&probe);
    return ZDP_OK;
}

zdp_status zdp_server_start(zdp_server *s, zdp_error *err) {
    /* LoRA mode: every rank loaded the same base; each model syncs its own
     * adapters as it is created. */
    /* Collective steps: a failure on some ranks only leaves the others
     * waiting, so it is fatal (the caller aborts the job). */
    if (s->eng != NULL && zdp_engine_sync_params(s->eng, err) != ZDP_OK)
        return zdp_err_set(err, ZDP_ERR_FATAL, "sync params: %s", err->msg);
    if (zdp_channel_open(&s->ch, err) != ZDP_OK) return zdp_err_set(err, ZDP_ERR_FATAL, "serve: %s", err->msg);
    serve_install_signals();
    if (s->R != 0) return ZDP_OK;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->body_mu, NULL);
    pthread_mutex_init(&s->watch_mu, NULL);
    pthread_cond_init(&s->cv_job, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    s->started = true;
    char why[512];
    if (!serve_register_tinker(s, why, sizeof why)) return fail_(err, "%s", why);
    zdp_status st;
    if (s->opt.api_key_file != NULL && (st = load_api_key_(s, err)) != ZDP_OK) return st;
    if ((st = load_roots_(s, err)) != ZDP_OK) return st;
    int port = 0;
    if (!serve_http_start(s, why, sizeof why, &port)) return fail_(err, "%s", why);
    return ZDP_OK;
}

/* Rank 0 after its loop: stops HTTP and the protocol, frees what sampling
 * and the adapters held. */
static void leader_stop_(server *s) {
    serve_http_stop(s);
    if (s->proto.destroy != NULL) s->proto.destroy(s->proto.state);
    s->proto = (serve_protocol){0};
    s->tinker = NULL;
    serve_free_snapshot(s);
    serve_free_adapters(s);
}

zdp_status zdp_server_run(zdp_server *s, zdp_error *err) {
    jmp_buf fatal;
    if (setjmp(fatal) != 0) {
        /* serve_die: the ranks can no longer agree.  Rank 0 answers every
         * request (500, why) and closes HTTP; the caller ends the job. */
        serve_fatal_jmp = NULL;
        *err = serve_fatal_err;
        err->rank = s->R;
        if (s->R == 0) {
            pthread_mutex_lock(&s->mu);
            s->busy_op = -1;
            serve_fail_jobs(s, 500, err->msg);
            pthread_mutex_unlock(&s->mu);
            leader_stop_(s);
        }
        return ZDP_ERR_FATAL;
    }
    serve_fatal_jmp = &fatal;
    if (s->R != 0) {
        serve_worker_loop(s);
        serve_fatal_jmp = NULL;
        return ZDP_OK;
    }
    /* The pid: SIGTERM or SIGINT to rank 0 stops every rank cleanly (a
     * signal to mpirun makes it kill the ranks instead). */
    const int port = s->bound_port;
    printf("zdp serve: listening on http://%s%s%s:%d | %s | %d rank(s) | ZeRO stage %d | rank 0 pid %ld\n",
           strchr(s->opt.bind, ':') ? "[" : "", s->opt.bind, strchr(s->opt.bind, ':') ? "]" : "", port,
           s->opt.lm.summary, s->W, s->cfg.zero.stage, (long)getpid());
    if (s->api_key == NULL)
        fprintf(stderr, "zdp serve: warning: no --api-key-file: any program that can connect to %s port %d "
                "can train this model and write checkpoints in %s; on a shared machine give the server a "
                "key (docs/server.md, \"Threat model\")\n", s->opt.bind, port, s->opt.checkpoint_dir);
    fflush(stdout);
    serve_leader_loop(s);
    serve_fatal_jmp = NULL;
    leader_stop_(s);
    if (s->opt.full_finetune)
        printf("zdp serve: stopped at step %lld\n", (long long)zdp_engine_global_steps(s->slots[0].eng));
    else
        printf("zdp serve: stopped\n");
    fflush(stdout);
    return ZDP_OK;
}

void zdp_server_destroy(zdp_server *s) {
    if (s == NULL) return;
    serve_http_stop(s);
    if (s->proto.destroy != NULL) s->proto.destroy(s->proto.state);
    serve_free_snapshot(s);
    serve_free_adapters(s);
    zdp_kv_packs_destroy(s->packs);
    if (s->started) {
        pthread_mutex_destroy(&s->mu);
        pthread_mutex_destroy(&s->body_mu);
        pthread_mutex_destroy(&s->watch_mu);
        pthread_cond_destroy(&s->cv_job);
        pthread_cond_destroy(&s->cv_done);
    }
    zdp_channel_close(s->ch);
    for (int i = 0; s->roots_real != NULL && i < s->opt.n_allow_roots; i++) free(s->roots_real[i]);
    free(s->roots_real);
    if (s->api_key != NULL) memset(s->api_key, 0, s->api_key_len);
    free(s->api_key);
    free(s->ckpt_root);
    if (s->opt.full_finetune && s->slots != NULL) zdp_engine_destroy(s->slots[0].eng);
    for (int k = 0; s->slots != NULL && k < s->opt.max_models; k++) serve_slot_free(s, k);
    free(s->slots);
    zdp_frozen_store_destroy(s->store); /* after the last model that borrowed it */
    for (int i = 0; s->base != NULL && i < s->model.n_params; i++) free(s->base[i]);
    free(s->base);
    if (s->have_model) s->opt.lm.destroy(s->opt.lm.ctx, &s->model);
    free(s);
}
