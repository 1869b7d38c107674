/*
 * test_checkpoint.c -- checkpoints at the engine level (CTest runs it at -np
 * 1, 2, 3, 4): exact (bitwise) resume for ZeRO stages 0/1/2, managed and
 * unmanaged, at a step boundary and in the middle of a window; loading into
 * another stage; set hyperparameters are not saved and a reset optimizer
 * state round-trips; a failed load leaves the engine unchanged; a mid-window
 * checkpoint refuses another stage; meta.json's own checksum refuses a
 * one-digit change of each counter, and the recorded model shape refuses a
 * model of another shape (engine unchanged).  The command-line side (other world
 * sizes, crashes during save, corrupt files) is tests/cli/test_checkpoint.sh.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "common/check.h"
#include "zdp/zdp.h"

static int W, R;
static char root_[256]; /* a directory shared by all ranks */

enum { H = 5, L = 3, N_ROWS = 400 };

typedef struct run {
    zdp_config cfg;
    zdp_model model;
    zdp_engine *eng;
} run;

static void run_init_(run *rn, int stage, bool managed) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 3, "
             "\"managed_gradient_accumulation\": %s, "
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-2, \"weight_decay\": 0.01}}, "
             "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 4, "
             "\"warmup_type\": \"linear\"}}, "
             "\"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 7, \"overlap_comm\": %s}}",
             managed ? "true" : "false", stage, stage == 2 ? "true" : "false");
    zdp_error err = {0};
    if (zdp_config_load_string(json, "<test>", W, &rn->cfg, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    CHECK_OK(zdp_mlp_create(H, L, 2, &rn->model, &e_));
    if (zdp_engine_create(&rn->cfg, &rn->model, &rn->eng, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    float *views[16];
    for (int i = 0; i < rn->model.n_params; i++) views[i] = zdp_engine_param_data(rn->eng, i);
    zdp_mlp_init_params(&rn->model, views, 7);
    CHECK_OK(zdp_engine_sync_params(rn->eng, &e_));
}

static void run_free_(run *rn) {
    zdp_engine_destroy(rn->eng);
    zdp_mlp_destroy(&rn->model);
}

static float x_[N_ROWS * H];
static int64_t y_[N_ROWS];

/* One micro-batch (global index j) through forward and backward. */
static void micro_(run *rn, int64_t j, int n_window, bool managed) {
    int64_t row = ((j * W + R) * 2) % N_ROWS;
    zdp_mlp_batch b = {.x = x_ + row * H, .y = y_ + row, .n = 2};
    float loss;
    CHECK_OK(zdp_engine_forward(rn->eng, &b, &loss, &e_));
    CHECK_OK(zdp_engine_backward(rn->eng, managed, managed ? 1.0f : 1.0f / (float)n_window, &e_));
}

static const int windows_[6] = {2, 3, 1, 3, 2, 4};

/* Steps [s0, s1) of the standard run; micro-batch counter *j. With
 * stop_after_backwards >= 0, stops inside step s1-1 after that many backward
 * calls (a window left open). */
static void train_(run *rn, bool managed, int s0, int s1, int64_t *j, int stop_after_backwards) {
    for (int s = s0; s < s1; s++) {
        int n = managed ? 3 : windows_[s];
        for (int k = 0; k < n; k++) {
            if (s == s1 - 1 && k == stop_after_backwards) return;
            micro_(rn, (*j)++, n, managed);
            if (managed) CHECK_OK(zdp_engine_step(rn->eng, &e_));
        }
        if (!managed) CHECK_OK(zdp_engine_step(rn->eng, &e_));
    }
}

static void finish_window_(run *rn, bool managed, int s, int done, int64_t *j) {
    int n = managed ? 3 : windows_[s];
    for (int k = done; k < n; k++) {
        micro_(rn, (*j)++, n, managed);
        if (managed) CHECK_OK(zdp_engine_step(rn->eng, &e_));
    }
    if (!managed) CHECK_OK(zdp_engine_step(rn->eng, &e_));
}

static float *params_(run *rn) {
    int64_t n = zdp_engine_numel(rn->eng);
    float *p = malloc((size_t)n * sizeof(float));
    memcpy(p, zdp_engine_param_data(rn->eng, 0), (size_t)n * sizeof(float));
    return p;
}

static void same_counters_(run *a, run *b) {
    CHECK_EQ_I64(zdp_engine_global_steps(a->eng), zdp_engine_global_steps(b->eng));
    CHECK_EQ_I64(zdp_engine_global_samples(a->eng), zdp_engine_global_samples(b->eng));
    CHECK_EQ_I64(zdp_engine_micro_steps(a->eng), zdp_engine_micro_steps(b->eng));
    CHECK_EQ_I64(zdp_engine_skipped_steps(a->eng), zdp_engine_skipped_steps(b->eng));
    CHECK(zdp_engine_lr(a->eng) == zdp_engine_lr(b->eng));
}

/* Straight 6 steps == 3 steps, save, a new engine loads, 3 more: bit for bit.
 * mid >= 0: save inside step 4 after `mid` backward calls instead. */
static void test_exact_resume(int stage, bool managed, int mid) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/exact_s%d_m%d_%d", root_, stage, managed, mid);
    run a, b;
    int64_t ja = 0, jb = 0;
    run_init_(&a, stage, managed);
    train_(&a, managed, 0, 6, &ja, -1);

    run_init_(&b, stage, managed);
    if (mid < 0) {
        train_(&b, managed, 0, 3, &jb, -1);
    } else {
        train_(&b, managed, 0, 4, &jb, mid); /* step index 3 left open after `mid` backwards */
        CHECK_EQ_I64(zdp_engine_pending_backwards(b.eng), mid);
    }
    CHECK_OK(zdp_engine_save_checkpoint(b.eng, dir, "t", "{\"j\": 1}", &e_));
    run_free_(&b);

    run c;
    run_init_(&c, stage, managed);
    char *client = NULL;
    CHECK_OK(zdp_engine_load_checkpoint(c.eng, dir, NULL, &client, &e_));
    CHECK(client != NULL && strstr(client, "\"j\"") != NULL);
    free(client);
    int64_t jc = jb;
    if (mid < 0) {
        train_(&c, managed, 3, 6, &jc, -1);
    } else {
        CHECK_EQ_I64(zdp_engine_pending_backwards(c.eng), mid);
        finish_window_(&c, managed, 3, mid, &jc);
        train_(&c, managed, 4, 6, &jc, -1);
    }
    float *pa = params_(&a), *pc = params_(&c);
    if (memcmp(pa, pc, (size_t)zdp_engine_numel(a.eng) * sizeof(float)) != 0)
        CHECK_FAIL_("stage %d managed %d mid %d: resumed parameters differ", stage, managed, mid);
    same_counters_(&a, &c);
    free(pa);
    free(pc);
    run_free_(&a);
    run_free_(&c);
}

/* A step-boundary checkpoint of stage 2 continues at stages 0 and 1 as a run
 * that was at that stage all along (fp32 tolerance: the stages round
 * differently). */
static void test_other_stage(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/cross", root_);
    run src;
    int64_t j = 0;
    run_init_(&src, 2, false);
    train_(&src, false, 0, 3, &j, -1);
    CHECK_OK(zdp_engine_save_checkpoint(src.eng, dir, "s2", NULL, &e_));
    run_free_(&src);
    for (int stage = 0; stage < 2; stage++) {
        run ref, dst;
        int64_t jr = 0, jd = j;
        run_init_(&ref, stage, false);
        train_(&ref, false, 0, 6, &jr, -1);
        run_init_(&dst, stage, false);
        char *client = NULL;
        CHECK_OK(zdp_engine_load_checkpoint(dst.eng, dir, "s2", &client, &e_));
        CHECK(strcmp(client, "{}") == 0);
        free(client);
        train_(&dst, false, 3, 6, &jd, -1);
        float *pr = params_(&ref), *pd = params_(&dst);
        CHECK_CLOSE(pd, pr, zdp_engine_numel(ref.eng), 1e-5, 1e-6, "stage 2 checkpoint at another stage");
        same_counters_(&ref, &dst);
        free(pr);
        free(pd);
        run_free_(&ref);
        run_free_(&dst);
    }
}

/* Hyperparameters set with zdp_engine_set_hparams are not saved: a loaded
 * engine uses its config's again (and the schedule's lr at the loaded
 * iteration), whatever was set on it before the load.  An optimizer state
 * reset before the save (zeros, step count 0) round-trips: the loaded engine
 * takes the same next step as the saving one given the same values. */
static void test_hparams_and_reset(int stage) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/hparams_s%d", root_, stage);
    const zdp_hparams x = {3e-3, 0.7, 0.95, 1e-5, 0.2, 0.1}, y = {0.5, 0.1, 0.2, 1e-2, 0.0, 0.0};
    run a, b;
    int64_t ja = 0;
    run_init_(&a, stage, false);
    train_(&a, false, 0, 2, &ja, -1);
    CHECK_OK(zdp_engine_set_hparams(a.eng, &x, &e_));
    train_(&a, false, 2, 3, &ja, -1);
    zdp_engine_reset_optimizer_state(a.eng);
    CHECK_OK(zdp_engine_save_checkpoint(a.eng, dir, "t", NULL, &e_));

    run_init_(&b, stage, false);
    CHECK_OK(zdp_engine_set_hparams(b.eng, &y, &e_));
    CHECK_OK(zdp_engine_load_checkpoint(b.eng, dir, "t", NULL, &e_));
    const zdp_config *cfg = &b.cfg;
    zdp_hparams h;
    zdp_engine_get_hparams(b.eng, &h);
    /* Three applied updates: the schedule's iteration is 2. */
    CHECK(h.lr == zdp_scheduler_lr(&cfg->scheduler, cfg->optimizer.lr, 2));
    CHECK(h.beta1 == cfg->optimizer.beta1 && h.beta2 == cfg->optimizer.beta2);
    CHECK(h.eps == cfg->optimizer.eps && h.weight_decay == cfg->optimizer.weight_decay);
    CHECK(h.gradient_clipping == cfg->gradient_clipping);
    CHECK(zdp_engine_last_lr(b.eng) == x.lr);

    /* One more step on both, with the same values. */
    CHECK_OK(zdp_engine_set_hparams(a.eng, &h, &e_));
    int64_t jb = ja;
    train_(&a, false, 3, 4, &ja, -1);
    train_(&b, false, 3, 4, &jb, -1);
    float *pa = params_(&a), *pb = params_(&b);
    if (memcmp(pa, pb, (size_t)zdp_engine_numel(a.eng) * sizeof(float)) != 0)
        CHECK_FAIL_("stage %d: the step after loading a reset optimizer state differs", stage);
    CHECK_EQ_I64(zdp_engine_global_steps(b.eng), 4);
    CHECK_EQ_I64(zdp_engine_global_samples(b.eng), zdp_engine_global_samples(a.eng));
    /* B follows the schedule again; A keeps its set lr. */
    CHECK(zdp_engine_lr(b.eng) == zdp_scheduler_lr(&cfg->scheduler, cfg->optimizer.lr, 3));
    CHECK(zdp_engine_lr(a.eng) == h.lr);
    free(pa);
    free(pb);
    run_free_(&a);
    run_free_(&b);
}

/* Errors leave the engine as it was, on every rank. */
static void test_failures_change_nothing(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/fail", root_);
    run a;
    int64_t j = 0;
    run_init_(&a, 1, false);
    train_(&a, false, 0, 4, &j, 1); /* a window left open */
    CHECK_OK(zdp_engine_save_checkpoint(a.eng, dir, "open", NULL, &e_));
    run_free_(&a);

    run b;
    run_init_(&b, 2, false);
    float *before = params_(&b);
    zdp_error err = {0};
    /* Mid-window gradients belong to stage 1's layout. */
    CHECK_ERR(zdp_engine_load_checkpoint(b.eng, dir, "open", NULL, &err), ZDP_ERR_UNSUPPORTED, err,
              "middle of an accumulation window");
    /* No such directory. */
    char missing[600];
    snprintf(missing, sizeof missing, "%s/none", root_);
    CHECK_ERR(zdp_engine_load_checkpoint(b.eng, missing, NULL, NULL, &err), ZDP_ERR_IO, err, "latest");
    /* A corrupted rank file: checksum. */
    if (R == 0) {
        char path[700];
        snprintf(path, sizeof path, "%s/open/optim_rank0.safetensors", dir);
        FILE *f = fopen(path, "r+b");
        CHECK(f != NULL);
        fseek(f, -3, SEEK_END);
        int c = fgetc(f);
        fseek(f, -3, SEEK_END);
        fputc(c ^ 0x5a, f);
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    run c;
    run_init_(&c, 1, false);
    CHECK_ERR(zdp_engine_load_checkpoint(c.eng, dir, "open", NULL, &err), ZDP_ERR_FORMAT, err,
              "optim_rank0.safetensors");
    float *after = params_(&b);
    CHECK(memcmp(before, after, (size_t)zdp_engine_numel(b.eng) * sizeof(float)) == 0);
    CHECK_EQ_I64(zdp_engine_global_steps(b.eng), 0);
    /* Bad arguments. */
    CHECK_ERR(zdp_engine_save_checkpoint(b.eng, dir, "a/b", NULL, &err), ZDP_ERR_INVALID_ARG, err, "tag");
    CHECK_ERR(zdp_engine_save_checkpoint(b.eng, dir, "x", "[1]", &err), ZDP_ERR_INVALID_ARG, err,
              "client_json");
    free(before);
    free(after);
    run_free_(&b);
    run_free_(&c);
}

/* Rank 0 adds 1 (mod 10) to the last digit of "key": N in path. */
static void flip_digit_(const char *path, const char *key) {
    if (R == 0) {
        FILE *f = fopen(path, "rb");
        CHECK(f != NULL);
        static char text[1 << 16];
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = '\0';
        char pat[64];
        snprintf(pat, sizeof pat, "\"%s\": ", key);
        char *p = strstr(text, pat);
        CHECK(p != NULL);
        p += strlen(pat);
        while (p[1] >= '0' && p[1] <= '9') p++;
        CHECK(*p >= '0' && *p <= '9');
        *p = (char)('0' + (*p - '0' + 1) % 10);
        f = fopen(path, "wb");
        CHECK(f != NULL && fwrite(text, 1, n, f) == n);
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void copy_file_(const char *from, const char *to) {
    if (R == 0) {
        static char buf[1 << 16];
        FILE *f = fopen(from, "rb");
        CHECK(f != NULL);
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        f = fopen(to, "wb");
        CHECK(f != NULL && fwrite(buf, 1, n, f) == n);
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void test_meta_integrity(void) {
    char dir[512], meta[600], saved[600];
    snprintf(dir, sizeof dir, "%s/integrity", root_);
    snprintf(meta, sizeof meta, "%s/t/meta.json", dir);
    snprintf(saved, sizeof saved, "%s/meta.json.orig", dir);
    run a;
    int64_t j = 0;
    run_init_(&a, 2, true);
    train_(&a, true, 0, 2, &j, -1);
    CHECK_OK(zdp_engine_save_checkpoint(a.eng, dir, "t", "{\"samples_consumed\": 12}", &e_));
    copy_file_(meta, saved);

    run b;
    run_init_(&b, 1, true);
    float *before = params_(&b);
    zdp_error err = {0};
    /* One digit of any counter, or of the client state: refused. */
    static const char *const keys[] = {"global_steps", "global_samples", "optimizer_step",
                                       "micro_steps", "scheduler_iteration", "samples_consumed"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        flip_digit_(meta, keys[k]);
        CHECK_ERR(zdp_engine_load_checkpoint(b.eng, dir, "t", NULL, &err), ZDP_ERR_FORMAT, err,
                  "checksum mismatch");
        CHECK(strstr(err.msg, meta) != NULL);
        copy_file_(saved, meta);
    }
    /* Another shape that no tensor shows (the GPT's n_head is the real case):
     * the recorded shape names the key and both values. */
    const char *own = b.model.shape_json;
    b.model.shape_json = "{\"model\":\"mlp\",\"hidden\":5,\"layers\":3,\"n_head\":4}";
    CHECK_ERR(zdp_engine_load_checkpoint(b.eng, dir, "t", NULL, &err), ZDP_ERR_CONFIG, err,
              "the checkpoint's model has n_head = (none), this model has n_head = 4");
    b.model.shape_json = "{\"model\":\"mlp\",\"hidden\":5,\"layers\":4}";
    CHECK_ERR(zdp_engine_load_checkpoint(b.eng, dir, "t", NULL, &err), ZDP_ERR_CONFIG, err,
              "layers = 3, this model has layers = 4");
    float *after = params_(&b);
    CHECK(memcmp(before, after, (size_t)zdp_engine_numel(b.eng) * sizeof(float)) == 0);
    CHECK_EQ_I64(zdp_engine_global_steps(b.eng), 0);
    b.model.shape_json = "[1]";
    CHECK_ERR(zdp_engine_save_checkpoint(b.eng, dir, "u", NULL, &err), ZDP_ERR_INVALID_ARG, err,
              "shape_json");
    /* The untouched file loads. */
    b.model.shape_json = own;
    CHECK_OK(zdp_engine_load_checkpoint(b.eng, dir, "t", NULL, &e_));
    CHECK_EQ_I64(zdp_engine_global_steps(b.eng), 2);
    free(before);
    free(after);
    run_free_(&a);
    run_free_(&b);
}

int main(int argc, char **argv) {
    zdp_error err;
    if (zdp_dist_init(&argc, &argv, &err) != ZDP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    W = zdp_dist_world_size();
    R = zdp_dist_rank();
    if (R == 0) {
        snprintf(root_, sizeof root_, "/tmp/zdp_test_ckpt_XXXXXX");
        CHECK(mkdtemp(root_) != NULL);
    }
    MPI_Bcast(root_, sizeof root_, MPI_CHAR, 0, MPI_COMM_WORLD);
    uint64_t s = 99;
    for (int i = 0; i < N_ROWS * H; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        x_[i] = (float)((double)(s >> 11) * 0x1.0p-53 * 4.0 - 2.0);
    }
    for (int i = 0; i < N_ROWS; i++) y_[i] = i % H;
    int n = 0;
    for (int stage = 0; stage < 3; stage++)
        for (int managed = 0; managed < 2; managed++) {
            test_exact_resume(stage, managed, -1), n++;
            test_exact_resume(stage, managed, 1), n++; /* mid-window */
        }
    for (int stage = 0; stage < 3; stage++) test_hparams_and_reset(stage), n++;
    test_other_stage(), n++;
    test_failures_change_nothing(), n++;
    test_meta_integrity(), n++;
    MPI_Barrier(MPI_COMM_WORLD);
    if (R == 0) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root_);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root_);
        printf("test_checkpoint: %d tests passed at world size %d\n", n, W);
    }
    zdp_dist_finalize();
    return 0;
}
