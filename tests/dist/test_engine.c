/*
 * test_engine.c -- the engine under MPI (run by CTest at -np 1, 2, 3, 4).
 *
 * Covers DeepSpeed's TestUnmanaged* scenarios (docs/deepspeed.md §9) for ZeRO
 * stages 0, 1 and 2, the managed trace and counters (§2.6, §3.3), stage
 * 0 == 1 == 2 at every world size against an independent double-precision
 * reference of SimpleModel + AdamW + clipping (parameter counts that do not
 * divide by W, buckets smaller than one tensor), per-step hyperparameters
 * (zdp_engine_set_hparams against the same reference, get, rejections) and
 * optimizer state reset, NaN/Inf skipping, the partition layout table (§4.2),
 * the memory report, and call-time rejections.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "zdp/zdp.h"

static int W, R;

/* ---- fixtures ------------------------------------------------------------------ */

typedef struct run {
    zdp_config cfg;
    zdp_model model;
    zdp_engine *eng;
    int H, L;
} run;

static void config_(zdp_config *cfg, const char *json) {
    zdp_error err = {0};
    zdp_status st = zdp_config_load_string(json, "<test>", W, cfg, &err);
    if (st != ZDP_OK) CHECK_FAIL_("config: %s", err.msg);
}

/* Writes all parameters from a flat copy (unpadded, registration order)
 * and syncs. */
static void params_set_(run *rn, const float *flat) {
    for (int i = 0; i < rn->model.n_params; i++)
        CHECK_OK(zdp_engine_set_param(rn->eng, i, flat + zdp_engine_param_offset(rn->eng, i), &e_));
    CHECK_OK(zdp_engine_sync_params(rn->eng, &e_));
}

/* Seeded weights, the same on every rank; parameters start identical for
 * every engine built with the same H, L and seed. */
static void run_init_(run *rn, const char *json, int H, int L, int64_t max_batch, uint64_t seed) {
    zdp_error err = {0};
    rn->H = H;
    rn->L = L;
    config_(&rn->cfg, json);
    if (zdp_mlp_create(H, L, max_batch, &rn->model, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    if (zdp_engine_create(&rn->cfg, &rn->model, &rn->eng, &err) != ZDP_OK)
        CHECK_FAIL_("engine: %s", err.msg);
    /* Through set_param, which every stage has (stage 3 holds no whole
     * tensor for zdp_engine_param_data to show). */
    const int64_t n = zdp_engine_numel(rn->eng);
    float *flat = malloc((size_t)n * sizeof(float)), *views[64];
    for (int i = 0; i < rn->model.n_params; i++)
        views[i] = flat + zdp_engine_param_offset(rn->eng, i);
    zdp_mlp_init_params(&rn->model, views, seed);
    params_set_(rn, flat);
    free(flat);
}

static void run_free_(run *rn) {
    zdp_engine_destroy(rn->eng);
    zdp_mlp_destroy(&rn->model);
}

/* Flat copy of all parameters (unpadded). */
static float *params_copy_(run *rn) {
    int64_t n = zdp_engine_numel(rn->eng);
    float *out = malloc((size_t)n * sizeof(float));
    for (int i = 0; i < rn->model.n_params; i++)
        CHECK_OK(zdp_engine_get_param(rn->eng, i, out + zdp_engine_param_offset(rn->eng, i), &e_));
    return out;
}

/* Deterministic data, the same on every rank. */
typedef struct data {
    float *x;
    int64_t *y;
    int64_t N;
    int H;
} data;

static uint64_t rng_(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static data data_make_(int H, int64_t N, uint64_t seed) {
    data d = {.N = N, .H = H};
    d.x = malloc((size_t)(N * H) * sizeof(float));
    d.y = malloc((size_t)N * sizeof(int64_t));
    uint64_t s = seed;
    for (int64_t i = 0; i < N * H; i++) d.x[i] = (float)((double)(rng_(&s) >> 11) * 0x1.0p-53 * 4.0 - 2.0);
    for (int64_t i = 0; i < N; i++) d.y[i] = (int64_t)(rng_(&s) % (uint64_t)H);
    return d;
}

static void data_free_(data *d) {
    free(d->x);
    free(d->y);
}

/* The micro-batch rank R uses as global micro-batch j: rows (j*W + R)*b + k. */
static zdp_mlp_batch batch_(const data *d, int64_t j, int64_t b) {
    int64_t start = ((j * W + R) * b) % d->N;
    CHECK(start + b <= d->N);
    return (zdp_mlp_batch){.x = d->x + start * d->H, .y = d->y + start, .n = b};
}

static void fwd_(run *rn, const zdp_mlp_batch *b) {
    float loss;
    CHECK_OK(zdp_engine_forward(rn->eng, b, &loss, &e_));
    bool finite_input = true;
    for (int64_t i = 0; i < b->n * rn->H; i++) finite_input &= isfinite(b->x[i]) != 0;
    CHECK(isfinite(loss) || !finite_input);
}

static const char *stage_json_(int stage, int G, bool managed, const char *extra) {
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": %d, "
             "\"steps_per_print\": 1, \"managed_gradient_accumulation\": %s, "
             "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-3}}, "
             "\"zero_optimization\": {\"stage\": %d%s %s}}",
             G, managed ? "true" : "false", stage,
             /* Stage 3 with every tensor partitioned and gathered per layer. */
             stage == 3 && strstr(extra, "persistence") == NULL
                 ? ", \"stage3_param_persistence_threshold\": 0"
                 : "",
             extra);
    return buf;
}

#define FP32_RTOL 1.3e-6
#define FP32_ATOL 1e-5

/* ---- DeepSpeed's TestUnmanagedGradientAccumulation ------------------------------ */

static void test_step_always_applies_update(int stage) {
    run rn;
    run_init_(&rn, stage_json_(stage, 4, false, ""), 4, 2, 1, 42);
    data d = data_make_(4, 8 * W, 7);
    for (int j = 0; j < 8; j++) {
        zdp_mlp_batch b = batch_(&d, j, 1);
        int64_t before = zdp_engine_global_steps(rn.eng);
        fwd_(&rn, &b);
        CHECK(!zdp_engine_is_gradient_accumulation_boundary(rn.eng));
        CHECK_OK(zdp_engine_backward(rn.eng, true, 1.0f, &e_));
        CHECK(!zdp_engine_is_gradient_accumulation_boundary(rn.eng));
        CHECK_OK(zdp_engine_step(rn.eng, &e_));
        CHECK(!zdp_engine_is_gradient_accumulation_boundary(rn.eng));
        CHECK(zdp_engine_was_step_applied(rn.eng));
        CHECK_EQ_I64(zdp_engine_global_steps(rn.eng), before + 1);
        CHECK_EQ_I64(zdp_engine_global_samples(rn.eng), (int64_t)(j + 1) * W);
        CHECK_EQ_I64(zdp_engine_micro_steps(rn.eng), j + 1);
    }
    data_free_(&d);
    run_free_(&rn);
}

/* docs/deepspeed.md §2.6: G=4, 8 symmetric micro-steps. */
static void test_managed_baseline_applies_only_on_boundary(int stage) {
    run rn;
    run_init_(&rn, stage_json_(stage, 4, true, ""), 4, 2, 1, 42);
    data d = data_make_(4, 8 * W, 7);
    const bool want[8] = {false, false, false, true, false, false, false, true};
    const int64_t B = 4 * W;
    for (int j = 0; j < 8; j++) {
        zdp_mlp_batch b = batch_(&d, j, 1);
        CHECK(zdp_engine_is_gradient_accumulation_boundary(rn.eng) == want[j]);
        fwd_(&rn, &b);
        CHECK_OK(zdp_engine_backward(rn.eng, true, 1.0f, &e_));
        CHECK_OK(zdp_engine_step(rn.eng, &e_));
        CHECK(zdp_engine_was_step_applied(rn.eng) == want[j]);
        CHECK_EQ_I64(zdp_engine_global_steps(rn.eng), (j + 1) / 4);
        CHECK_EQ_I64(zdp_engine_global_samples(rn.eng), (j + 1) / 4 * B);
        CHECK_EQ_I64(zdp_engine_micro_steps(rn.eng), j + 1);
    }
    data_free_(&d);
    run_free_(&rn);
}

static void test_unmanaged_matches_managed(int stage) {
    run m, u;
    run_init_(&m, stage_json_(stage, 4, true, ""), 4, 2, 1, 42);
    run_init_(&u, stage_json_(stage, 4, false, ""), 4, 2, 1, 42);
    data d = data_make_(4, 12 * W, 11);
    for (int cycle = 0; cycle < 3; cycle++) {
        for (int k = 0; k < 4; k++) {
            zdp_mlp_batch b = batch_(&d, cycle * 4 + k, 1);
            fwd_(&m, &b);
            CHECK_OK(zdp_engine_backward(m.eng, true, 1.0f, &e_));
            CHECK_OK(zdp_engine_step(m.eng, &e_));
            fwd_(&u, &b);
            CHECK_OK(zdp_engine_backward(u.eng, true, 1.0f, &e_));
        }
        CHECK_OK(zdp_engine_step(u.eng, &e_));
        CHECK(zdp_engine_was_step_applied(u.eng));
    }
    float *pm = params_copy_(&m), *pu = params_copy_(&u);
    CHECK_CLOSE(pu, pm, zdp_engine_numel(m.eng), FP32_RTOL, FP32_ATOL, "unmanaged vs managed");
    CHECK_EQ_I64(zdp_engine_global_samples(u.eng), zdp_engine_global_samples(m.eng));
    free(pm);
    free(pu);
    data_free_(&d);
    run_free_(&m);
    run_free_(&u);
}

static void test_unmanaged_varying_backward_count(int stage) {
    run m, u;
    run_init_(&m, stage_json_(stage, 4, true, ""), 4, 2, 1, 42);
    run_init_(&u, stage_json_(stage, 4, false, ""), 4, 2, 1, 42);
    data d = data_make_(4, 10 * W, 13);
    const int windows[3] = {2, 5, 3};
    const int64_t want_samples[3] = {2 * W, 7 * W, 10 * W}; /* (B//G)*N summed, b=1 */
    int64_t j = 0;
    for (int w = 0; w < 3; w++) {
        int n = windows[w];
        for (int k = 0; k < n; k++, j++) {
            zdp_mlp_batch b = batch_(&d, j, 1);
            CHECK_OK(zdp_engine_set_gradient_accumulation_boundary(m.eng, k == n - 1, &e_));
            fwd_(&m, &b);
            CHECK_OK(zdp_engine_backward(m.eng, false, 1.0f / (float)n, &e_));
            fwd_(&u, &b);
            CHECK_OK(zdp_engine_backward(u.eng, false, 1.0f / (float)n, &e_));
            CHECK_EQ_I64(zdp_engine_pending_backwards(u.eng), k + 1);
        }
        CHECK_OK(zdp_engine_step(m.eng, &e_));
        CHECK(zdp_engine_was_step_applied(m.eng));
        CHECK_OK(zdp_engine_step(u.eng, &e_));
        CHECK(zdp_engine_was_step_applied(u.eng));
        CHECK_EQ_I64(zdp_engine_global_samples(u.eng), want_samples[w]);
        CHECK_EQ_I64(zdp_engine_global_steps(u.eng), w + 1);
        CHECK_EQ_I64(zdp_engine_pending_backwards(u.eng), 0);
    }
    float *pm = params_copy_(&m), *pu = params_copy_(&u);
    CHECK_CLOSE(pu, pm, zdp_engine_numel(m.eng), FP32_RTOL, FP32_ATOL, "varying N");
    free(pm);
    free(pu);
    data_free_(&d);
    run_free_(&m);
    run_free_(&u);
}

/* DeepSpeed #2223: ranks that make different numbers of backward() calls
 * before step().  Rank 0 makes `first` calls, every other rank `others`.
 * Stages 0/1: every rank's step() fails.  Stage 2: the ranks with more
 * calls meet the others' step() inside backward() -- that backward fails
 * instead of hanging in its reduce-scatter, and so does the others' step().
 * Either way every rank reports every rank's count, nothing is applied, and
 * a correct window afterwards trains normally.  (A hang here is a CTest
 * timeout.) */
static void test_backward_count_mismatch(int stage, bool managed, int first, int others) {
    if (W < 2) return;
    run rn;
    /* managed with G = 1: every step() is a boundary, so a second backward
     * before it is the same mistake. */
    run_init_(&rn, stage_json_(stage, managed ? 1 : 4, managed, ""), 4, 2, 1, 42);
    data d = data_make_(4, 8 * W, 17);
    float *before = params_copy_(&rn);
    const int mine = R == 0 ? first : others;
    zdp_error err = {0};
    zdp_status st = ZDP_OK;
    int made = 0;
    for (int k = 0; k < mine && st == ZDP_OK; k++) {
        zdp_mlp_batch b = batch_(&d, k, 1);
        float loss;
        st = zdp_engine_forward(rn.eng, &b, &loss, &err);
        if (st == ZDP_OK) st = zdp_engine_backward(rn.eng, true, 1.0f, &err);
        made++;
    }
    const bool in_step = st == ZDP_OK;
    if (in_step) st = zdp_engine_step(rn.eng, &err);
    /* Only stages 2 and 3 can stop a rank inside backward (stage 3: inside
     * forward, which gathers), and only a rank with more calls. */
    CHECK(in_step || (stage >= 2 && mine > (R == 0 ? others : first)));
    CHECK_ERR(st, ZDP_ERR_STATE, err, "different numbers of backward() calls");
    const char *pass = stage == 3 ? "forward()" : "backward()";
    char want[64];
    snprintf(want, sizeof want, "%s:", in_step ? "step()" : pass);
    CHECK_ERR(st, ZDP_ERR_STATE, err, want);
    /* At stages 2/3 a rank with more calls stops at the first one past the
     * others' count. */
    const int seen0 = stage >= 2 && first > others ? others + 1 : first;
    const int seen1 = stage >= 2 && others > first ? first + 1 : others;
    CHECK_EQ_I64(made, R == 0 ? seen0 : seen1);
    snprintf(want, sizeof want, "rank 0: %d (in %s", seen0, seen0 > seen1 && stage >= 2 ? pass : "step()");
    CHECK_ERR(st, ZDP_ERR_STATE, err, want);
    snprintf(want, sizeof want, "rank %d: %d (in %s", W - 1, seen1, seen1 > seen0 && stage >= 2 ? pass : "step()");
    CHECK_ERR(st, ZDP_ERR_STATE, err, want);
    float *after = params_copy_(&rn);
    CHECK(memcmp(before, after, (size_t)zdp_engine_numel(rn.eng) * sizeof(float)) == 0);
    CHECK_EQ_I64(zdp_engine_global_steps(rn.eng), 0);
    CHECK_EQ_I64(zdp_engine_skipped_steps(rn.eng), 0);
    CHECK_EQ_I64(zdp_engine_pending_backwards(rn.eng), 0);
    CHECK(!zdp_engine_was_step_applied(rn.eng));
    /* The same number of calls everywhere now: a normal step, and the
     * parameters agree across ranks (all ranks log the same norm). */
    for (int k = 0; k < 2; k++) {
        zdp_mlp_batch b = batch_(&d, 4 + k, 1);
        fwd_(&rn, &b);
        CHECK_OK(zdp_engine_backward(rn.eng, true, 1.0f, &e_));
        if (managed && k == 0) {
            /* G = 1: the first backward's step() is the boundary. */
            CHECK_OK(zdp_engine_step(rn.eng, &e_));
            CHECK(zdp_engine_was_step_applied(rn.eng));
            break;
        }
    }
    if (!managed) {
        CHECK_OK(zdp_engine_step(rn.eng, &e_));
        CHECK(zdp_engine_was_step_applied(rn.eng));
    }
    CHECK_EQ_I64(zdp_engine_global_steps(rn.eng), 1);
    CHECK(isfinite(zdp_engine_last_grad_norm(rn.eng)));
    free(before);
    free(after);
    data_free_(&d);
    run_free_(&rn);
}

static void test_call_time_rejections(int stage) {
    run u;
    run_init_(&u, stage_json_(stage, 4, false, ""), 4, 2, 1, 42);
    zdp_error err = {0};
    CHECK_ERR(zdp_engine_set_gradient_accumulation_boundary(u.eng, true, &err), ZDP_ERR_STATE, err,
              "set_gradient_accumulation_boundary");
    CHECK_ERR(zdp_engine_coalesce_grad_reduction(u.eng, &err), ZDP_ERR_STATE, err,
              "coalesce_grad_reduction");
    /* step() with no backward(): an error, and nothing moves. */
    float *before = params_copy_(&u);
    CHECK_ERR(zdp_engine_step(u.eng, &err), ZDP_ERR_STATE, err, "no backward()");
    CHECK_EQ_I64(zdp_engine_global_steps(u.eng), 0);
    CHECK_EQ_I64(zdp_engine_micro_steps(u.eng), 0);
    float *after = params_copy_(&u);
    CHECK(memcmp(before, after, (size_t)zdp_engine_numel(u.eng) * sizeof(float)) == 0);
    /* backward() without forward(). */
    CHECK_ERR(zdp_engine_backward(u.eng, true, 1.0f, &err), ZDP_ERR_STATE, err, "forward()");
    free(before);
    free(after);
    run_free_(&u);
}

/* ---- stage equivalence against an independent reference ------------------------- */

/* Double-precision SimpleModel forward+backward over rows [0, n) of x/y,
 * adding d(mean CE)/dparams * scale into g (layout as the engine's flat). */
static double ref_grad_(const double *p, int H, int L, const float *x, const int64_t *y,
                        int64_t n, double scale, double *g) {
    const int64_t P = (int64_t)H * H + H;
    double *acts = calloc((size_t)((L + 1) * n * H), sizeof(double));
    double *dx = calloc((size_t)(n * H), sizeof(double)), *dn = calloc((size_t)(n * H), sizeof(double));
    for (int64_t i = 0; i < n * H; i++) acts[i] = x[i];
    for (int l = 0; l < L; l++) {
        int use[2] = {L > 1 ? l / 2 : 0, l};
        for (int u = 0; u < (L > 1 ? 2 : 1); u++) {
            const double *Wt = p + use[u] * P, *bias = Wt + (int64_t)H * H;
            for (int64_t r = 0; r < n; r++)
                for (int o = 0; o < H; o++) {
                    double s = bias[o];
                    for (int c = 0; c < H; c++) s += Wt[o * H + c] * acts[(l * n + r) * H + c];
                    acts[((l + 1) * n + r) * H + o] += s;
                }
        }
    }
    double loss = 0.0;
    for (int64_t r = 0; r < n; r++) {
        const double *z = acts + (L * n + r) * H;
        double mx = z[0], se = 0.0;
        for (int c = 1; c < H; c++) mx = z[c] > mx ? z[c] : mx;
        for (int c = 0; c < H; c++) se += exp(z[c] - mx);
        loss += log(se) + mx - z[y[r]];
        for (int c = 0; c < H; c++) dx[r * H + c] = exp(z[c] - mx) / se / (double)n * scale;
        dx[r * H + y[r]] -= scale / (double)n;
    }
    for (int l = L - 1; l >= 0; l--) {
        memset(dn, 0, (size_t)(n * H) * sizeof(double));
        int use[2] = {L > 1 ? l / 2 : 0, l};
        for (int u = 0; u < (L > 1 ? 2 : 1); u++) {
            const double *Wt = p + use[u] * P;
            double *gw = g + use[u] * P, *gb = gw + (int64_t)H * H;
            for (int64_t r = 0; r < n; r++)
                for (int o = 0; o < H; o++) {
                    double d = dx[r * H + o];
                    gb[o] += d;
                    for (int c = 0; c < H; c++) {
                        gw[o * H + c] += d * acts[(l * n + r) * H + c];
                        dn[r * H + c] += d * Wt[o * H + c];
                    }
                }
        }
        double *t = dx;
        dx = dn;
        dn = t;
    }
    free(acts);
    free(dx);
    free(dn);
    return loss / (double)n;
}

/* Global micro-batch j is rows [j*12, j*12+12) whatever W is (b = 12/W), so
 * every world size trains on the same data; G windows per step. */
static void test_stages_match_reference(int H, int L, int64_t bucket, bool managed) {
    const int G = 3, steps = 4, global_b = 12;
    const int64_t b = global_b / W;
    data d = data_make_(H, (int64_t)steps * G * global_b, 99);
    /* Reference: AdamW lr 1e-2 wd 0.01, clipping 0.5, in double. */
    const int64_t n = (int64_t)L * (H * H + H);
    double *p = malloc((size_t)n * sizeof(double)), *g = calloc((size_t)n, sizeof(double));
    double *m1 = calloc((size_t)n, sizeof(double)), *v1 = calloc((size_t)n, sizeof(double));
    {
        run tmp;
        run_init_(&tmp, stage_json_(0, 1, true, ""), H, L, 1, 5);
        for (int64_t i = 0; i < n; i++) p[i] = zdp_engine_param_data(tmp.eng, 0)[i];
        run_free_(&tmp);
    }
    for (int s = 0; s < steps; s++) {
        memset(g, 0, (size_t)n * sizeof(double));
        for (int k = 0; k < G; k++) {
            int64_t row = ((int64_t)s * G + k) * global_b;
            ref_grad_(p, H, L, d.x + row * H, d.y + row, global_b, 1.0 / G, g);
        }
        double sq = 0.0;
        for (int64_t i = 0; i < n; i++) sq += g[i] * g[i];
        double c = (sqrt(sq) + 1e-6) / 0.5, scale = c > 1.0 ? 1.0 / c : 1.0;
        double bc1 = 1.0 - pow(0.9, s + 1), bc2 = 1.0 - pow(0.999, s + 1);
        for (int64_t i = 0; i < n; i++) {
            double gi = g[i] * scale;
            m1[i] = 0.9 * m1[i] + 0.1 * gi;
            v1[i] = 0.999 * v1[i] + 0.001 * gi * gi;
            p[i] -= 1e-2 * ((m1[i] / bc1) / (sqrt(v1[i] / bc2) + 1e-8) + 0.01 * p[i]);
        }
    }
    float *ref = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) ref[i] = (float)p[i];

    float *got[4];
    for (int stage = 0; stage < 4; stage++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": %lld, "
                 "\"gradient_clipping\": 0.5, \"managed_gradient_accumulation\": %s, "
                 "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-2, "
                 "\"weight_decay\": 0.01}}, \"zero_optimization\": {\"stage\": %d, "
                 "\"reduce_bucket_size\": %lld, \"allgather_bucket_size\": 10%s}}",
                 global_b * G, (long long)b, managed ? "true" : "false", stage, (long long)bucket,
                 stage == 3 ? ", \"stage3_param_persistence_threshold\": 0" : "");
        run rn;
        run_init_(&rn, json, H, L, b, 5);
        for (int s = 0; s < steps; s++) {
            for (int k = 0; k < G; k++) {
                zdp_mlp_batch mb = batch_(&d, (int64_t)s * G + k, b);
                fwd_(&rn, &mb);
                CHECK_OK(zdp_engine_backward(rn.eng, managed, managed ? 1.0f : 1.0f / G, &e_));
                if (managed) CHECK_OK(zdp_engine_step(rn.eng, &e_));
            }
            if (!managed) CHECK_OK(zdp_engine_step(rn.eng, &e_));
            CHECK(zdp_engine_was_step_applied(rn.eng));
        }
        CHECK_EQ_I64(zdp_engine_global_steps(rn.eng), steps);
        CHECK_EQ_I64(zdp_engine_global_samples(rn.eng), (int64_t)steps * G * global_b);
        got[stage] = params_copy_(&rn);
        run_free_(&rn);
    }
    for (int stage = 0; stage < 4; stage++)
        CHECK_CLOSE(got[stage], ref, n, 1e-4, 2e-5, "stage vs double reference");
    /* fp32 stages against each other: tighter; stage 3 does stage 2's
     * reductions and update, so bitwise. */
    CHECK_CLOSE(got[1], got[0], n, 1e-5, 1e-6, "stage 1 vs stage 0");
    CHECK_CLOSE(got[2], got[0], n, 1e-5, 1e-6, "stage 2 vs stage 0");
    CHECK(memcmp(got[3], got[2], (size_t)n * sizeof(float)) == 0);
    for (int stage = 0; stage < 4; stage++) free(got[stage]);
    free(ref);
    free(p);
    free(g);
    free(m1);
    free(v1);
    data_free_(&d);
}

/* ---- per-step hyperparameters and optimizer reset ------------------------------------ */

/* One hyperparameter set per step of test_hparams_match_reference; set = false
 * keeps whatever the engine has (the config's, or the last set). */
typedef struct hp_step {
    bool set;
    int after_backward; /* set after this many of the window's backwards */
    zdp_hparams h;
} hp_step;

#define HP_LR0 1e-3 /* warmup_min_lr */
#define HP_LR1 1e-2 /* warmup_max_lr */

/* The WarmupLR config's lr at scheduler iteration n (linear, 4 steps),
 * computed here rather than by zdp_scheduler_lr. */
static double hp_sched_lr_(int64_t n) {
    if (n < 0) return HP_LR0;
    return n < 4 ? HP_LR0 + (HP_LR1 - HP_LR0) * (double)n / 4.0 : HP_LR1;
}

static bool hp_same_(const zdp_hparams *a, const zdp_hparams *b) {
    return a->lr == b->lr && a->beta1 == b->beta1 && a->beta2 == b->beta2 && a->eps == b->eps &&
           a->weight_decay == b->weight_decay && a->gradient_clipping == b->gradient_clipping;
}

static void check_hp_(const zdp_hparams *got, const zdp_hparams *want, const char *what) {
    if (!hp_same_(got, want))
        CHECK_FAIL_("%s: get_hparams = {lr %.17g, betas %.17g %.17g, eps %.17g, wd %.17g, clip "
                    "%.17g}, want {%.17g, %.17g %.17g, %.17g, %.17g, %.17g}",
                    what, got->lr, got->beta1, got->beta2, got->eps, got->weight_decay,
                    got->gradient_clipping, want->lr, want->beta1, want->beta2, want->eps,
                    want->weight_decay, want->gradient_clipping);
}

/* zdp_engine_set_hparams between steps (and once in the middle of a
 * window) changes lr, betas, eps, weight decay and clipping of the later
 * updates, sticky until set again, and a set lr replaces the WarmupLR
 * schedule: stages 0, 1, 2 against a double-precision Adam computed here
 * with each step's values, for decoupled (AdamW) and L2 (Adam with
 * adam_w_mode false) decay.  Clipping triggers under the config's value and
 * under a set one; a later clip of 0 must really turn it off. */
static void test_hparams_match_reference(bool decoupled) {
    const int H = 5, L = 3, G = 2, steps = 6, global_b = 12;
    const int64_t b = global_b / W;
    const double clip0 = 0.3;
    const hp_step plan[6] = {
        {.set = false},
        {.set = false},
        {.set = true, .after_backward = 1, .h = {2e-2, 0.8, 0.99, 1e-6, 0.05, 0.05}},
        {.set = true, .after_backward = 0, .h = {5e-3, 0.95, 0.9, 1e-3, 0.0, 0.0}},
        {.set = false},
        {.set = true, .after_backward = 0, .h = {1e-2, 0.0, 0.5, 1e-8, 0.1, 1e3}},
    };
    data d = data_make_(H, (int64_t)steps * G * global_b, 77);
    const int64_t n = (int64_t)L * (H * H + H);
    double *p = malloc((size_t)n * sizeof(double)), *g = calloc((size_t)n, sizeof(double));
    double *m1 = calloc((size_t)n, sizeof(double)), *v1 = calloc((size_t)n, sizeof(double));
    {
        run tmp;
        run_init_(&tmp, stage_json_(0, 1, true, ""), H, L, 1, 9);
        for (int64_t i = 0; i < n; i++) p[i] = zdp_engine_param_data(tmp.eng, 0)[i];
        run_free_(&tmp);
    }
    /* The reference, and what each update must have used. */
    zdp_hparams used[6];
    zdp_hparams cur = {HP_LR0, 0.9, 0.999, 1e-8, 0.01, clip0};
    bool clipped[6];
    double norms[6];
    for (int s = 0; s < steps; s++) {
        /* Nothing set yet: the config's values and the schedule's lr; after
         * a set, its values stay (step 4 keeps step 3's). */
        if (plan[s].set) cur = plan[s].h;
        else if (s < 2) cur.lr = hp_sched_lr_(s - 1);
        used[s] = cur;
        memset(g, 0, (size_t)n * sizeof(double));
        for (int k = 0; k < G; k++) {
            int64_t row = ((int64_t)s * G + k) * global_b;
            ref_grad_(p, H, L, d.x + row * H, d.y + row, global_b, 1.0 / G, g);
        }
        double sq = 0.0;
        for (int64_t i = 0; i < n; i++) sq += g[i] * g[i];
        norms[s] = sqrt(sq);
        double scale = 1.0;
        if (cur.gradient_clipping > 0.0) {
            double c = (norms[s] + 1e-6) / cur.gradient_clipping;
            if (c > 1.0) scale = 1.0 / c;
        }
        clipped[s] = scale < 1.0;
        const double b1 = cur.beta1, b2 = cur.beta2, wd = cur.weight_decay;
        const double bc1 = 1.0 - pow(b1, s + 1), bc2 = 1.0 - pow(b2, s + 1);
        for (int64_t i = 0; i < n; i++) {
            double gi = g[i] * scale + (decoupled ? 0.0 : wd * p[i]);
            m1[i] = b1 * m1[i] + (1.0 - b1) * gi;
            v1[i] = b2 * v1[i] + (1.0 - b2) * gi * gi;
            double u = (m1[i] / bc1) / (sqrt(v1[i] / bc2) + cur.eps);
            if (decoupled) u += wd * p[i];
            p[i] -= cur.lr * u;
        }
    }
    /* The scenario must exercise what it claims: the config's clipping and a
     * set one both trigger, and step 3's clip 0 would have clipped at 0.05. */
    CHECK(clipped[0] || clipped[1]);
    CHECK(clipped[2]);
    CHECK(!clipped[3] && norms[3] > 0.05 + 1e-6);
    float *ref = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) ref[i] = (float)p[i];

    float *got[3];
    for (int stage = 0; stage < 3; stage++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": %lld, "
                 "\"gradient_clipping\": %g, \"managed_gradient_accumulation\": false, "
                 "\"optimizer\": {\"type\": \"%s\", \"params\": {\"lr\": 0.5, "
                 "\"betas\": [0.9, 0.999], \"eps\": 1e-8, \"weight_decay\": 0.01, "
                 "\"adam_w_mode\": %s}}, "
                 "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": %g, "
                 "\"warmup_max_lr\": %g, \"warmup_num_steps\": 4, \"warmup_type\": \"linear\"}}, "
                 "\"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 7, "
                 "\"allgather_bucket_size\": 10}}",
                 global_b * G, (long long)b, clip0, decoupled ? "AdamW" : "Adam",
                 decoupled ? "true" : "false", HP_LR0, HP_LR1, stage);
        run rn;
        run_init_(&rn, json, H, L, b, 9);
        zdp_hparams h;
        zdp_engine_get_hparams(rn.eng, &h);
        check_hp_(&h, &used[0], "before any set: the config and the schedule");
        for (int s = 0; s < steps; s++) {
            for (int k = 0; k < G; k++) {
                if (plan[s].set && plan[s].after_backward == k)
                    CHECK_OK(zdp_engine_set_hparams(rn.eng, &plan[s].h, &e_));
                zdp_mlp_batch mb = batch_(&d, (int64_t)s * G + k, b);
                fwd_(&rn, &mb);
                CHECK_OK(zdp_engine_backward(rn.eng, false, 1.0f / G, &e_));
            }
            zdp_engine_get_hparams(rn.eng, &h);
            check_hp_(&h, &used[s], "before the step");
            CHECK(zdp_engine_lr(rn.eng) == used[s].lr);
            CHECK_OK(zdp_engine_step(rn.eng, &e_));
            CHECK(zdp_engine_was_step_applied(rn.eng));
            CHECK(zdp_engine_last_lr(rn.eng) == used[s].lr);
            if (fabs(zdp_engine_last_grad_norm(rn.eng) - norms[s]) > 1e-5 * norms[s])
                CHECK_FAIL_("step %d: grad norm %.9g, reference %.9g", s,
                            zdp_engine_last_grad_norm(rn.eng), norms[s]);
        }
        /* Set values stay after the last update; the config is untouched. */
        zdp_engine_get_hparams(rn.eng, &h);
        check_hp_(&h, &plan[5].h, "after the last step");
        CHECK(zdp_engine_config(rn.eng)->gradient_clipping == clip0);
        CHECK(zdp_engine_config(rn.eng)->optimizer.beta2 == 0.999);
        got[stage] = params_copy_(&rn);
        run_free_(&rn);
    }
    for (int stage = 0; stage < 3; stage++)
        CHECK_CLOSE(got[stage], ref, n, 1e-4, 2e-5, "set_hparams: stage vs double reference");
    CHECK_CLOSE(got[1], got[0], n, 1e-5, 1e-6, "set_hparams: stage 1 vs stage 0");
    CHECK_CLOSE(got[2], got[0], n, 1e-5, 1e-6, "set_hparams: stage 2 vs stage 0");
    for (int stage = 0; stage < 3; stage++) free(got[stage]);
    free(ref);
    free(p);
    free(g);
    free(m1);
    free(v1);
    data_free_(&d);
}

/* get_hparams follows the schedule until a set; every invalid field is
 * ZDP_ERR_INVALID_ARG naming the field, its value and the range, and
 * changes nothing (before a set: the lr still follows the schedule). */
static void test_hparams_rejections(int stage) {
    char json[768];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 1, "
             "\"managed_gradient_accumulation\": false, \"gradient_clipping\": 0.25, "
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.5, "
             "\"betas\": [0.8, 0.99], \"eps\": 1e-7, \"weight_decay\": 0.02}}, "
             "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": %g, "
             "\"warmup_max_lr\": %g, \"warmup_num_steps\": 4, \"warmup_type\": \"linear\"}}, "
             "\"zero_optimization\": {\"stage\": %d}}", HP_LR0, HP_LR1, stage);
    run rn;
    run_init_(&rn, json, 4, 2, 1, 42);
    data d = data_make_(4, 8 * W, 3);
    const zdp_hparams good = {HP_LR0, 0.8, 0.99, 1e-7, 0.02, 0.25};
    const struct {
        const char *field, *range;
        zdp_hparams h;
    } bad[] = {
        {"lr = -0.001", "in [0, 100]", {-1e-3, 0.9, 0.999, 1e-8, 0.0, 1.0}},
        {"lr = nan", "in [0, 100]", {NAN, 0.9, 0.999, 1e-8, 0.0, 1.0}},
        {"lr = inf", "in [0, 100]", {INFINITY, 0.9, 0.999, 1e-8, 0.0, 1.0}},
        {"beta1 = -0.5", "[0, 1)", {1e-3, -0.5, 0.999, 1e-8, 0.0, 1.0}},
        {"beta1 = 1:", "[0, 1)", {1e-3, 1.0, 0.999, 1e-8, 0.0, 1.0}},
        {"beta1 = nan", "[0, 1)", {1e-3, NAN, 0.999, 1e-8, 0.0, 1.0}},
        {"beta2 = 1:", "[0, 1)", {1e-3, 0.9, 1.0, 1e-8, 0.0, 1.0}},
        {"beta2 = -1e-09", "[0, 1)", {1e-3, 0.9, -1e-9, 1e-8, 0.0, 1.0}},
        {"beta2 = nan", "[0, 1)", {1e-3, 0.9, NAN, 1e-8, 0.0, 1.0}},
        {"eps = 0:", "in (0, 1]", {1e-3, 0.9, 0.999, 0.0, 0.0, 1.0}},
        {"eps = -1e-08", "in (0, 1]", {1e-3, 0.9, 0.999, -1e-8, 0.0, 1.0}},
        {"eps = inf", "in (0, 1]", {1e-3, 0.9, 0.999, INFINITY, 0.0, 1.0}},
        {"eps = nan", "in (0, 1]", {1e-3, 0.9, 0.999, NAN, 0.0, 1.0}},
        {"weight_decay = -0.01", "in [0, 10]", {1e-3, 0.9, 0.999, 1e-8, -0.01, 1.0}},
        {"weight_decay = nan", "in [0, 10]", {1e-3, 0.9, 0.999, 1e-8, NAN, 1.0}},
        {"weight_decay = inf", "in [0, 10]", {1e-3, 0.9, 0.999, 1e-8, INFINITY, 1.0}},
        /* Finite but absurd: lr = 1e308 once turned the weights into NaN. */
        {"lr = 1e+308", "in [0, 100]", {1e308, 0.9, 0.999, 1e-8, 0.0, 1.0}},
        {"lr = 100.5", "in [0, 100]", {100.5, 0.9, 0.999, 1e-8, 0.0, 1.0}},
        {"eps = 2:", "in (0, 1]", {1e-3, 0.9, 0.999, 2.0, 0.0, 1.0}},
        {"weight_decay = 11", "in [0, 10]", {1e-3, 0.9, 0.999, 1e-8, 11.0, 1.0}},
        {"gradient_clipping = -1", ">= 0", {1e-3, 0.9, 0.999, 1e-8, 0.0, -1.0}},
        {"gradient_clipping = nan", ">= 0", {1e-3, 0.9, 0.999, 1e-8, 0.0, NAN}},
        {"gradient_clipping = inf", ">= 0", {1e-3, 0.9, 0.999, 1e-8, 0.0, INFINITY}},
    };
    const int nbad = (int)(sizeof bad / sizeof bad[0]);
    CHECK_OK(zdp_hparams_check(&good, &e_));
    const zdp_hparams edge = {ZDP_HPARAM_LR_MAX, 0.0, 0.0, ZDP_HPARAM_EPS_MAX,
                              ZDP_HPARAM_WEIGHT_DECAY_MAX, 0.0};
    CHECK_OK(zdp_hparams_check(&edge, &e_)); /* the bounds themselves are allowed */
    zdp_hparams h, set = {7e-3, 0.5, 0.75, 1e-4, 0.3, 2.0};
    for (int phase = 0; phase < 2; phase++) {
        /* phase 0: nothing set yet; phase 1: after a valid set. */
        const zdp_hparams *want = phase == 0 ? &good : &set;
        for (int i = 0; i < nbad; i++) {
            zdp_error err = {0};
            CHECK_ERR(zdp_engine_set_hparams(rn.eng, &bad[i].h, &err), ZDP_ERR_INVALID_ARG, err,
                      bad[i].field);
            CHECK(strstr(err.msg, "nothing was changed") != NULL);
            zdp_error cerr = {0}; /* the same verdict without an engine */
            CHECK_ERR(zdp_hparams_check(&bad[i].h, &cerr), ZDP_ERR_INVALID_ARG, cerr, bad[i].field);
            if (strstr(err.msg, bad[i].range) == NULL)
                CHECK_FAIL_("message \"%s\" lacks the range \"%s\"", err.msg, bad[i].range);
            zdp_engine_get_hparams(rn.eng, &h);
            check_hp_(&h, want, bad[i].field);
        }
        zdp_error err = {0};
        CHECK_ERR(zdp_engine_set_hparams(rn.eng, NULL, &err), ZDP_ERR_INVALID_ARG, err, "NULL");
        zdp_engine_get_hparams(NULL, &h); /* a no-op, not a crash */
        /* Two steps: a rejected set must not have pinned the lr. */
        for (int s = 0; s < 2; s++) {
            zdp_mlp_batch mb = batch_(&d, phase * 2 + s, 1);
            fwd_(&rn, &mb);
            CHECK_OK(zdp_engine_backward(rn.eng, false, 1.0f, &e_));
            CHECK_OK(zdp_engine_step(rn.eng, &e_));
        }
        zdp_engine_get_hparams(rn.eng, &h);
        if (phase == 0) {
            zdp_hparams after = good;
            after.lr = hp_sched_lr_(1);
            CHECK(after.lr != HP_LR0);
            check_hp_(&h, &after, "two steps after the rejections, nothing set");
            CHECK_OK(zdp_engine_set_hparams(rn.eng, &set, &e_));
            zdp_engine_get_hparams(rn.eng, &h);
            check_hp_(&h, &set, "right after a set");
            CHECK(zdp_engine_lr(rn.eng) == set.lr);
        } else {
            check_hp_(&h, &set, "two steps after the rejections, set values");
            CHECK(zdp_engine_last_lr(rn.eng) == set.lr);
        }
    }
    data_free_(&d);
    run_free_(&rn);
}

/* After some steps, reset_optimizer_state with a window open, then one more
 * step, equals (bitwise) a fresh engine with the same parameters,
 * hyperparameters and gradient.  SGD's dampening 0.3 makes its first update
 * (buf = d) differ from a later one (buf = mom*buf + 0.7 d), so the step
 * count must restart as well as the buffers. */
static void test_reset_optimizer_state(int stage, bool sgd) {
    char json[768];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 1, "
             "\"managed_gradient_accumulation\": false, \"gradient_clipping\": 0.5, "
             "\"zero_allow_untested_optimizer\": true, \"optimizer\": %s, "
             "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 1e-3, "
             "\"warmup_max_lr\": 1e-2, \"warmup_num_steps\": 3}}, "
             "\"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 7}}",
             sgd ? "{\"type\": \"SGD\", \"params\": {\"lr\": 0.05, \"momentum\": 0.9, "
                   "\"dampening\": 0.3, \"weight_decay\": 0.01}}"
                 : "{\"type\": \"AdamW\", \"params\": {\"lr\": 1e-2, \"weight_decay\": 0.01}}",
             stage);
    run a, fresh;
    run_init_(&a, json, 5, 3, 1, 42);
    data d = data_make_(5, 8 * W, 19);
    for (int s = 0; s < 3; s++) {
        if (s == 1) { /* a set lr too, so both engines must agree on it */
            zdp_hparams h;
            zdp_engine_get_hparams(a.eng, &h);
            h.lr = 2e-2;
            h.beta2 = 0.99;
            CHECK_OK(zdp_engine_set_hparams(a.eng, &h, &e_));
        }
        zdp_mlp_batch mb = batch_(&d, s, 1);
        fwd_(&a, &mb);
        CHECK_OK(zdp_engine_backward(a.eng, false, 1.0f, &e_));
        CHECK_OK(zdp_engine_step(a.eng, &e_));
    }
    /* The window of the step after the reset is open while it resets. */
    zdp_mlp_batch mb = batch_(&d, 3, 1);
    fwd_(&a, &mb);
    CHECK_OK(zdp_engine_backward(a.eng, false, 1.0f, &e_));
    float *before = params_copy_(&a);
    zdp_hparams ha, hb;
    zdp_engine_get_hparams(a.eng, &ha);
    zdp_engine_reset_optimizer_state(a.eng);
    zdp_engine_get_hparams(a.eng, &hb);
    check_hp_(&hb, &ha, "reset keeps the hyperparameters");
    float *after = params_copy_(&a);
    CHECK(memcmp(before, after, (size_t)zdp_engine_numel(a.eng) * sizeof(float)) == 0);
    CHECK_EQ_I64(zdp_engine_global_steps(a.eng), 3);
    CHECK_EQ_I64(zdp_engine_micro_steps(a.eng), 3);
    CHECK_EQ_I64(zdp_engine_pending_backwards(a.eng), 1);
    CHECK(zdp_engine_last_lr(a.eng) == 2e-2);
    CHECK_OK(zdp_engine_step(a.eng, &e_));
    CHECK(zdp_engine_was_step_applied(a.eng));

    /* A fresh engine from the same config, given A's parameters and
     * hyperparameters from before that step, and the same micro-batch. */
    run_init_(&fresh, json, 5, 3, 1, 42);
    params_set_(&fresh, before);
    CHECK_OK(zdp_engine_set_hparams(fresh.eng, &ha, &e_));
    fwd_(&fresh, &mb);
    CHECK_OK(zdp_engine_backward(fresh.eng, false, 1.0f, &e_));
    CHECK_OK(zdp_engine_step(fresh.eng, &e_));
    float *pa = params_copy_(&a), *pf = params_copy_(&fresh);
    const int64_t n = zdp_engine_numel(a.eng);
    if (memcmp(pa, pf, (size_t)n * sizeof(float)) != 0)
        CHECK_CLOSE(pa, pf, n, 0.0, 1e-6, sgd ? "SGD: reset vs fresh" : "AdamW: reset vs fresh");
    /* The step actually moved the parameters (the comparison means something). */
    CHECK(memcmp(pa, before, (size_t)n * sizeof(float)) != 0);
    free(before);
    free(after);
    free(pa);
    free(pf);
    data_free_(&d);
    run_free_(&a);
    run_free_(&fresh);
}

/* zdp_engine_drop_window: two backward()s dropped, then one more and a
 * step, equals a fresh engine's one backward and step -- bitwise, at every
 * stage (with overlap_comm at 2/3 the dropped reductions are in flight). */
static void test_drop_window(int stage) {
    const char *json = stage_json_(stage, 1, false, stage >= 2 ? ", \"overlap_comm\": true, "
                                                                  "\"reduce_bucket_size\": 7" : "");
    run a, fresh;
    run_init_(&a, json, 5, 3, 1, 42);
    run_init_(&fresh, json, 5, 3, 1, 42);
    data d = data_make_(5, 8 * W, 23);
    for (int j = 0; j < 2; j++) {
        zdp_mlp_batch mb = batch_(&d, j, 1);
        fwd_(&a, &mb);
        CHECK_OK(zdp_engine_backward(a.eng, false, 1.0f, &e_));
    }
    CHECK_EQ_I64(zdp_engine_pending_backwards(a.eng), 2);
    CHECK_OK(zdp_engine_drop_window(a.eng, &e_));
    CHECK_EQ_I64(zdp_engine_pending_backwards(a.eng), 0);
    CHECK_EQ_I64(zdp_engine_global_steps(a.eng), 0);
    zdp_mlp_batch mb = batch_(&d, 2, 1);
    for (run *rn = &a; rn != NULL; rn = rn == &a ? &fresh : NULL) {
        fwd_(rn, &mb);
        CHECK_OK(zdp_engine_backward(rn->eng, false, 1.0f, &e_));
        CHECK_OK(zdp_engine_step(rn->eng, &e_));
    }
    float *pa = params_copy_(&a), *pf = params_copy_(&fresh);
    CHECK(memcmp(pa, pf, (size_t)zdp_engine_numel(a.eng) * sizeof(float)) == 0);
    free(pa);
    free(pf);
    data_free_(&d);
    run_free_(&a);
    run_free_(&fresh);
}

/* docs/deepspeed.md §4.5: the result does not depend on reduce_bucket_size,
 * contiguous_gradients, reduce_scatter or overlap_comm; overlap_comm only
 * changes scheduling, so with it on and off the bits are the same.  Also
 * DeepSpeed's OverlapCommStage2 case (unmanaged == managed with overlap_comm)
 * and its disabled-offload-blocks case. */
static void test_averaging_invariance(int stage, bool managed) {
    const char *variants[] = {
        "",
        ", \"reduce_bucket_size\": 7",
        ", \"reduce_bucket_size\": 7, \"reduce_scatter\": false",
        ", \"contiguous_gradients\": false",
        ", \"overlap_comm\": true, \"contiguous_gradients\": true",
        ", \"overlap_comm\": true, \"reduce_bucket_size\": 7",
        ", \"offload_optimizer\": {\"device\": \"none\"}, \"offload_param\": {\"device\": \"none\"}",
    };
    const int nv = stage == 2 ? 7 : 4; /* overlap_comm needs stage 2 in unmanaged mode */
    data d = data_make_(5, 12 * W, 31);
    float *base = NULL;
    float *overlap_small = NULL, *plain_small = NULL;
    for (int v = 0; v < nv; v++) {
        run rn;
        run_init_(&rn, stage_json_(stage, 4, managed, variants[v]), 5, 3, 1, 42);
        for (int j = 0; j < 12; j++) {
            zdp_mlp_batch b = batch_(&d, j, 1);
            fwd_(&rn, &b);
            CHECK_OK(zdp_engine_backward(rn.eng, true, 1.0f, &e_));
            if (managed || j % 4 == 3) CHECK_OK(zdp_engine_step(rn.eng, &e_));
        }
        CHECK_EQ_I64(zdp_engine_global_steps(rn.eng), 3);
        float *p = params_copy_(&rn);
        if (v == 0) base = p;
        else CHECK_CLOSE(p, base, zdp_engine_numel(rn.eng), FP32_RTOL, FP32_ATOL, variants[v]);
        if (v == 1) plain_small = p;
        if (v == 5) overlap_small = p;
        if (v != 0 && v != 1 && v != 5) free(p);
        run_free_(&rn);
    }
    if (overlap_small != NULL)
        CHECK(memcmp(overlap_small, plain_small, 90 * sizeof(float)) == 0);
    free(base);
    free(plain_small);
    free(overlap_small);
    data_free_(&d);
}

/* ---- non-finite gradients --------------------------------------------------------- */

/* A NaN in the last rank's micro-batch of step 1 skips that step on every
 * rank: parameters byte-identical, counters as DeepSpeed, and training goes
 * on exactly as a run that never saw the bad window (so the optimizer state
 * did not move either). */
static void test_nonfinite_skips_everywhere(int stage, bool managed, float poison) {
    const char *json = stage_json_(stage, 2, managed, "");
    run a, ref;
    run_init_(&a, json, 4, 2, 1, 42);
    run_init_(&ref, json, 4, 2, 1, 42);
    data d = data_make_(4, 8 * W, 17);
    data bad = data_make_(4, 8 * W, 17);
    if (R == W - 1) bad.x[(2 * W + R) * 4 + 1] = poison; /* global micro-batch 2 = step 1 */
    for (int s = 0; s < 4; s++) {
        bool poisoned_step = s == 1;
        float *before = params_copy_(&a);
        for (int k = 0; k < 2; k++) {
            zdp_mlp_batch mb = batch_(poisoned_step ? &bad : &d, s * 2 + k, 1);
            fwd_(&a, &mb);
            CHECK_OK(zdp_engine_backward(a.eng, true, 1.0f, &e_));
            if (managed) CHECK_OK(zdp_engine_step(a.eng, &e_));
            if (!poisoned_step) {
                fwd_(&ref, &mb);
                CHECK_OK(zdp_engine_backward(ref.eng, true, 1.0f, &e_));
                if (managed) CHECK_OK(zdp_engine_step(ref.eng, &e_));
            }
        }
        if (!managed) {
            CHECK_OK(zdp_engine_step(a.eng, &e_));
            if (!poisoned_step) CHECK_OK(zdp_engine_step(ref.eng, &e_));
        }
        float *after = params_copy_(&a);
        if (poisoned_step) {
            CHECK(!zdp_engine_was_step_applied(a.eng));
            CHECK(!isfinite(zdp_engine_last_grad_norm(a.eng)));
            CHECK(memcmp(before, after, (size_t)zdp_engine_numel(a.eng) * sizeof(float)) == 0);
        } else {
            CHECK(zdp_engine_was_step_applied(a.eng));
        }
        free(before);
        free(after);
    }
    CHECK_EQ_I64(zdp_engine_skipped_steps(a.eng), 1);
    CHECK_EQ_I64(zdp_engine_global_steps(a.eng), 4);
    CHECK_EQ_I64(zdp_engine_global_samples(a.eng), 4 * 2 * W);
    CHECK_EQ_I64(zdp_engine_skipped_steps(ref.eng), 0);
    float *pa = params_copy_(&a), *pr = params_copy_(&ref);
    CHECK(memcmp(pa, pr, (size_t)zdp_engine_numel(a.eng) * sizeof(float)) == 0);
    free(pa);
    free(pr);
    data_free_(&d);
    data_free_(&bad);
    run_free_(&a);
    run_free_(&ref);
}

/* The schedule advances once per applied update (the k-th uses lr(k-2)),
 * never on a skipped step; an update with lr 0 leaves the parameters. */
/* Issue 10: a finite gradient whose update is not finite (here Adam's
 * second moment: g ~ 1e30 squares past FLT_MAX, with clipping off) is
 * refused like a NaN gradient: the step is skipped, parameters and
 * optimizer state are untouched (the run ends bit-identical to one that
 * never saw that window), and the next window applies normally.  Before,
 * the update ran and the weights became NaN. */
static void test_nonfinite_update_refused(int stage) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 1, "
             "\"managed_gradient_accumulation\": false, \"gradient_clipping\": 0, "
             "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-2}}, "
             "\"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 7}}", stage);
    run a, ref;
    run_init_(&a, json, 4, 2, 1, 42);
    run_init_(&ref, json, 4, 2, 1, 42);
    data d = data_make_(4, 8 * W, 19);
    for (int s = 0; s < 3; s++) {
        const bool poisoned = s == 1;
        float *before = params_copy_(&a);
        zdp_mlp_batch mb = batch_(&d, s, 1);
        fwd_(&a, &mb);
        CHECK_OK(zdp_engine_backward(a.eng, false, poisoned ? 1e30f : 1.0f, &e_));
        CHECK_OK(zdp_engine_step(a.eng, &e_));
        if (!poisoned) {
            fwd_(&ref, &mb);
            CHECK_OK(zdp_engine_backward(ref.eng, false, 1.0f, &e_));
            CHECK_OK(zdp_engine_step(ref.eng, &e_));
        }
        float *after = params_copy_(&a);
        const int64_t n = zdp_engine_numel(a.eng);
        for (int64_t i = 0; i < n; i++) CHECK(isfinite(after[i]));
        if (poisoned) {
            CHECK(!zdp_engine_was_step_applied(a.eng));
            /* The gradient itself was finite: this is the update's refusal. */
            CHECK(isfinite(zdp_engine_last_grad_norm(a.eng)));
            CHECK(zdp_engine_last_grad_norm(a.eng) > 1e20);
            CHECK(memcmp(before, after, (size_t)n * sizeof(float)) == 0);
        } else {
            CHECK(zdp_engine_was_step_applied(a.eng));
        }
        free(before);
        free(after);
    }
    CHECK_EQ_I64(zdp_engine_skipped_steps(a.eng), 1);
    CHECK_EQ_I64(zdp_engine_global_steps(a.eng), 3);
    float *pa = params_copy_(&a), *pr = params_copy_(&ref);
    CHECK(memcmp(pa, pr, (size_t)zdp_engine_numel(a.eng) * sizeof(float)) == 0);
    free(pa);
    free(pr);
    data_free_(&d);
    run_free_(&a);
    run_free_(&ref);
}

static void test_scheduler_cadence(int stage) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 1, "
             "\"managed_gradient_accumulation\": false, "
             "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1}}, "
             "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0, "
             "\"warmup_max_lr\": 0.01, \"warmup_num_steps\": 4, \"warmup_type\": \"linear\"}}, "
             "\"zero_optimization\": {\"stage\": %d}}", stage);
    run rn;
    run_init_(&rn, json, 4, 2, 1, 42);
    data d = data_make_(4, 8 * W, 61);
    if (R == 0) d.x[(3 * W) * 4] = NAN; /* global micro-batch 3: the 4th step is skipped */
    /* docs/deepspeed.md §7.2's worked example: the lr of applied updates 1, 2, ... */
    const double lrs[6] = {0, 0, 0.0025, 0.005, 0.0075, 0.01};
    int applied = 0;
    for (int s = 0; s < 7; s++) {
        CHECK(fabs(zdp_engine_lr(rn.eng) - lrs[applied]) < 1e-12);
        float *before = params_copy_(&rn);
        zdp_mlp_batch b = batch_(&d, s, 1);
        fwd_(&rn, &b);
        CHECK_OK(zdp_engine_backward(rn.eng, false, 1.0f, &e_));
        CHECK_OK(zdp_engine_step(rn.eng, &e_));
        float *after = params_copy_(&rn);
        bool same = memcmp(before, after, (size_t)zdp_engine_numel(rn.eng) * sizeof(float)) == 0;
        CHECK(zdp_engine_was_step_applied(rn.eng) == (s != 3));
        if (s != 3) {
            CHECK(same == (lrs[applied] == 0.0)); /* lr 0 moves nothing */
            applied++;
        }
        CHECK(fabs(zdp_engine_last_lr(rn.eng) - (applied > 0 ? lrs[applied - 1] : -1)) < 1e-12);
        free(before);
        free(after);
    }
    data_free_(&d);
    run_free_(&rn);
}

/* ---- layout, memory, grad norm -------------------------------------------------- */

static void test_partition_layout(void) {
    /* docs/deepspeed.md §4.2: SimpleModel(4, 2), 40 elements. */
    const int64_t padded[5] = {0, 40, 40, 42, 40}, part[5] = {0, 40, 20, 14, 10};
    run rn;
    run_init_(&rn, stage_json_(2, 1, true, ""), 4, 2, 1, 1);
    CHECK_EQ_I64(zdp_engine_numel(rn.eng), 40);
    if (W <= 4) {
        CHECK_EQ_I64(zdp_engine_padded_numel(rn.eng), padded[W]);
        CHECK_EQ_I64(zdp_engine_partition_numel(rn.eng), part[W]);
    }
    const int64_t offs[4] = {0, 16, 20, 36};
    for (int i = 0; i < 4; i++) CHECK_EQ_I64(zdp_engine_param_offset(rn.eng, i), offs[i]);
    run_free_(&rn);
}

/* The ZeRO memory model (docs/deepspeed.md §4.7), byte for byte, plus the bucket terms:
 * stage 0: 4Ψ params + 4Ψ grads + 8Ψ optimizer; stage 1: 4Ψ + 4Ψ + 4Ψ/N
 * partition + 8Ψ/N; stage 2: 4Ψ + 4Ψ/N + buckets + 8Ψ/N (Ψ padded). */
static void check_memory_(int H, int L, int64_t bucket, bool overlap) {
    for (int stage = 0; stage < 3; stage++) {
        char extra[128];
        snprintf(extra, sizeof extra, ", \"reduce_bucket_size\": %lld, \"overlap_comm\": %s",
                 (long long)bucket, overlap && stage == 2 ? "true" : "false");
        run rn;
        run_init_(&rn, stage_json_(stage, 1, true, extra), H, L, 1, 1);
        zdp_memory_report m;
        zdp_engine_memory_report(rn.eng, &m);
        const int64_t padded = zdp_engine_padded_numel(rn.eng), P = zdp_engine_partition_numel(rn.eng);
        CHECK_EQ_I64(P * W, padded);
        CHECK_EQ_I64(m.params_bytes, 4 * padded);
        CHECK_EQ_I64(m.grads_bytes, stage < 2 ? 4 * padded : 0);
        CHECK_EQ_I64(m.grad_partition_bytes, stage >= 1 ? 4 * P : 0);
        CHECK_EQ_I64(m.optimizer_bytes, stage == 0 ? 8 * padded : 8 * P);
        CHECK_EQ_I64(m.master_bytes, 0);
        /* The largest bucket: a weight alone when the cap is below it. */
        int64_t maxb = bucket >= (int64_t)L * (H * H + H) ? (int64_t)L * (H * H + H)
                       : bucket >= H * H + H               ? H * H + H
                                                           : H * H;
        int64_t scratch = maxb < P ? maxb : P;
        int64_t buffers = stage == 2 ? (overlap && maxb < (int64_t)L * (H * H + H) ? 2 : 1) : 0;
        CHECK_EQ_I64(m.bucket_bytes, stage == 0 ? 0 : 4 * (buffers * maxb + scratch));
        /* Stage 2 holds no full-size gradient. */
        if (stage == 2) CHECK(m.grads_bytes + m.grad_partition_bytes <= 4 * padded / W);
        CHECK(m.other_bytes > 0 && m.other_bytes < 4096 + 64 * L);
        CHECK_EQ_I64(m.total_bytes, m.params_bytes + m.grads_bytes + m.grad_partition_bytes +
                                        m.bucket_bytes + m.optimizer_bytes + m.master_bytes +
                                        m.other_bytes);
        run_free_(&rn);
    }
}

static void test_memory_report(void) {
    check_memory_(16, 3, 100, false);
    check_memory_(16, 3, 100, true);
    check_memory_(16, 3, 1 << 20, true);
    check_memory_(1024, 3, 500000, true); /* Ψ = 3,148,800: a few million parameters */
    check_memory_(1024, 3, 1 << 22, false);
}

/* Bytes by collective against the formulas: stage 0 all-reduces Ψ; stages
 * 1/2 reduce-scatter Ψ (stage 2 once per backward) and all-gather Ψ; each
 * step also all-reduces one double (the norm). */
static void test_comm_report(int stage, bool managed) {
    const int G = 3, H = 7, L = 3;
    run rn;
    run_init_(&rn, stage_json_(stage, G, managed, ", \"reduce_bucket_size\": 20, \"allgather_bucket_size\": 30"),
              H, L, 1, 2);
    data d = data_make_(H, 6 * W, 41);
    for (int s = 0; s < 2; s++) {
        for (int k = 0; k < G; k++) {
            zdp_mlp_batch b = batch_(&d, s * G + k, 1);
            fwd_(&rn, &b);
            CHECK_OK(zdp_engine_backward(rn.eng, true, 1.0f, &e_));
            if (managed) CHECK_OK(zdp_engine_step(rn.eng, &e_));
        }
        if (!managed) CHECK_OK(zdp_engine_step(rn.eng, &e_));
    }
    zdp_comm_report c, total;
    zdp_engine_comm_report(rn.eng, true, &c);
    zdp_engine_comm_report(rn.eng, false, &total);
    const int64_t n = zdp_engine_numel(rn.eng), padded = zdp_engine_padded_numel(rn.eng);
    const int64_t P = zdp_engine_partition_numel(rn.eng);
    /* Elements of [0, n) owned by rank q: the real (unpadded) part of q's partition. */
    int64_t own[4];
    for (int q = 0; q < W && q < 4; q++) {
        int64_t lo = q * P, hi = (q + 1) * P < n ? (q + 1) * P : n;
        own[q] = hi > lo ? hi - lo : 0;
    }
    /* The norm's all-reduce carries the backward-count agreement: 4 doubles;
     * at stage 2 (W > 1) every backward adds one more of the same. */
    const int64_t norm_wire = 2 * (W - 1) * 32 / W;
    if (stage == 0) {
        CHECK_EQ_I64(c.payload_bytes[ZDP_COLL_ALLREDUCE], W > 1 ? 4 * n + 32 : 32);
        CHECK_EQ_I64(c.sent_bytes[ZDP_COLL_ALLREDUCE], (W > 1 ? 2 * (W - 1) * 4 * n / W : 0) + norm_wire);
        CHECK_EQ_I64(c.calls[ZDP_COLL_REDUCE_SCATTER], 0);
        CHECK_EQ_I64(c.calls[ZDP_COLL_ALLGATHER], 0);
    } else if (W > 1) {
        const int64_t reductions = stage == 2 ? G : 1; /* stage 2 reduces every backward */
        CHECK_EQ_I64(c.payload_bytes[ZDP_COLL_REDUCE_SCATTER], reductions * 4 * n);
        CHECK_EQ_I64(c.sent_bytes[ZDP_COLL_REDUCE_SCATTER], reductions * 4 * (n - own[R]));
        CHECK_EQ_I64(c.received_bytes[ZDP_COLL_REDUCE_SCATTER],
                     reductions * 4 * (n - own[(R + W - 1) % W]));
        CHECK_EQ_I64(c.payload_bytes[ZDP_COLL_ALLGATHER], 4 * padded);
        CHECK_EQ_I64(c.sent_bytes[ZDP_COLL_ALLGATHER], 4 * (padded - P));
        CHECK_EQ_I64(c.received_bytes[ZDP_COLL_ALLGATHER], 4 * (padded - P));
        CHECK(c.calls[ZDP_COLL_ALLGATHER] >= 2); /* sharded by allgather_bucket_size */
        /* Plus one double: the ranks' verdict on a finite update (each
         * updates its own partition). */
        const int64_t agreements = stage == 2 ? 1 + G : 1;
        CHECK_EQ_I64(c.payload_bytes[ZDP_COLL_ALLREDUCE], 32 * agreements + 8);
        CHECK_EQ_I64(c.sent_bytes[ZDP_COLL_ALLREDUCE],
                     norm_wire * agreements + 2 * (W - 1) * 8 / W);
        /* Half an all-reduce each way: RS + AG carry what stage 0's all-reduce would. */
        int64_t allreduce_wire = 2 * (W - 1) * 4 * padded / W;
        int64_t zero_wire = c.sent_bytes[ZDP_COLL_REDUCE_SCATTER] / reductions +
                            c.sent_bytes[ZDP_COLL_ALLGATHER];
        CHECK(llabs(zero_wire - allreduce_wire) <= 4 * 2 * P);
    }
    /* Two identical windows: the total is twice the last step, plus the
     * initial broadcast of the parameters. */
    CHECK_EQ_I64(total.payload_bytes[ZDP_COLL_REDUCE_SCATTER], 2 * c.payload_bytes[ZDP_COLL_REDUCE_SCATTER]);
    CHECK_EQ_I64(total.payload_bytes[ZDP_COLL_BROADCAST], W > 1 ? 4 * n : 0);
    zdp_step_timing t;
    zdp_engine_step_timing(rn.eng, &t);
    CHECK(t.forward_s > 0 && t.backward_s > 0 && t.step_s > 0 && t.optimizer_s > 0);
    CHECK(t.comm_wait_s >= 0 && t.comm_wait_s <= t.backward_s + t.step_s);
    data_free_(&d);
    run_free_(&rn);
}

/* overlap_comm changes scheduling only: the same operations in the same
 * order, so the same bits, with buckets smaller than one tensor and larger
 * than the model, managed and unmanaged, over several steps. */
/* Stage 2 and stage 3 (with and without prefetch), overlap_comm off and
 * on: all bitwise equal. */
static void test_overlap_comm_bitwise(bool managed, int64_t bucket) {
    float *p[6];
    for (int v = 0; v < 6; v++) {
        const int stage = v < 2 ? 2 : 3, overlap = v % 2;
        char extra[256];
        snprintf(extra, sizeof extra,
                 ", \"reduce_bucket_size\": %lld, \"overlap_comm\": %s, "
                 "\"stage3_param_persistence_threshold\": %d, \"stage3_prefetch_bucket_size\": %d",
                 (long long)bucket, overlap ? "true" : "false", v >= 4 ? 10 : 0, v >= 4 ? 100 : 0);
        run rn;
        run_init_(&rn, stage_json_(stage, 3, managed, extra), 9, 4, 2, 8);
        data d = data_make_(9, 24 * W, 51);
        for (int s = 0; s < 4; s++) {
            int n = managed ? 3 : 1 + s % 3;
            for (int k = 0; k < n; k++) {
                zdp_mlp_batch b = batch_(&d, s * 3 + k, 2);
                fwd_(&rn, &b);
                CHECK_OK(zdp_engine_backward(rn.eng, managed, managed ? 1.0f : 1.0f / n, &e_));
                if (managed) CHECK_OK(zdp_engine_step(rn.eng, &e_));
            }
            if (!managed) CHECK_OK(zdp_engine_step(rn.eng, &e_));
        }
        p[v] = params_copy_(&rn);
        data_free_(&d);
        run_free_(&rn);
    }
    for (int v = 1; v < 6; v++) {
        if (memcmp(p[0], p[v], (size_t)(4 * (81 + 9)) * sizeof(float)) != 0)
            CHECK_FAIL_("overlap_comm bitwise (managed %d, bucket %lld): variant %d (stage %d, "
                        "overlap %d) differs from stage 2 without overlap",
                        (int)managed, (long long)bucket, v, v < 2 ? 2 : 3, v % 2);
        free(p[v]);
    }
    free(p[0]);
}

/* The reported norm is the single-process norm of the averaged gradient.  H = 5
 * keeps every one of the norm's 64 parts shorter than its 16 lanes (the
 * serial tail alone); H = 32 (3,168 parameters) runs the lanes. */
static void test_grad_norm_is_global(int stage, int H) {
    const int L = 3;
    const int64_t b = 12 / W;
    data d = data_make_(H, 12, 23);
    char json[512];
    snprintf(json, sizeof json,
             "{\"train_batch_size\": 12, \"train_micro_batch_size_per_gpu\": %lld, "
             "\"gradient_clipping\": 0, \"optimizer\": {\"type\": \"Adam\"}, "
             "\"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 7}}",
             (long long)b, stage);
    run rn;
    run_init_(&rn, json, H, L, b, 3);
    const int64_t n = zdp_engine_numel(rn.eng);
    double *p = calloc((size_t)n, sizeof(double)), *g = calloc((size_t)n, sizeof(double));
    float *p0 = params_copy_(&rn);
    for (int64_t i = 0; i < n; i++) p[i] = p0[i];
    free(p0);
    ref_grad_(p, H, L, d.x, d.y, 12, 1.0, g);
    double sq = 0.0;
    for (int64_t i = 0; i < n; i++) sq += g[i] * g[i];
    zdp_mlp_batch mb = batch_(&d, 0, b);
    fwd_(&rn, &mb);
    CHECK_OK(zdp_engine_backward(rn.eng, true, 1.0f, &e_));
    CHECK_OK(zdp_engine_step(rn.eng, &e_));
    double norm = zdp_engine_last_grad_norm(rn.eng);
    if (fabs(norm - sqrt(sq)) > 1e-5 * sqrt(sq))
        CHECK_FAIL_("grad norm %.9g, reference %.9g", norm, sqrt(sq));
    /* Identical on every rank, bit for bit. */
    double mean = zdp_dist_mean(norm);
    CHECK(zdp_dist_all_ok(mean == norm || W == 1));
    free(p);
    free(g);
    data_free_(&d);
    run_free_(&rn);
}

static void test_create_rejections(void) {
    zdp_config cfg;
    zdp_model model;
    zdp_engine *eng = NULL;
    zdp_error err = {0};
    config_(&cfg, stage_json_(2, 1, true, ""));
    CHECK_OK(zdp_mlp_create(4, 2, 1, &model, &e_));
    zdp_config bad = cfg;
    bad.zero.stage = 3;
    bad.zero.stage3_param_persistence_threshold = -1;
    CHECK_ERR(zdp_engine_create(&bad, &model, &eng, &err), ZDP_ERR_CONFIG, err,
              "stage3_param_persistence_threshold");
    CHECK(eng == NULL);
    bad = cfg;
    bad.world_size = W + 1;
    bad.train_batch_size = bad.micro_batch_size * bad.gradient_accumulation_steps * (W + 1);
    CHECK_ERR(zdp_engine_create(&bad, &model, &eng, &err), ZDP_ERR_CONFIG, err, "world size");
    bad = cfg;
    bad.managed_gradient_accumulation = false;
    bad.zero.stage = 1;
    bad.zero.overlap_comm = true;
    CHECK_ERR(zdp_engine_create(&bad, &model, &eng, &err), ZDP_ERR_CONFIG, err,
              "managed_gradient_accumulation=False supports ZeRO overlap_comm only with ZeRO stage 2");
    zdp_mlp_destroy(&model);
}

int main(int argc, char **argv) {
    zdp_error err;
    if (zdp_dist_init(&argc, &argv, &err) != ZDP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    zdp_set_log(NULL, NULL);
    W = zdp_dist_world_size();
    R = zdp_dist_rank();
    /* Keep the test output to the verdicts. */
    if (getenv("ZDP_TEST_VERBOSE") == NULL) zdp_set_log(check_quiet_log, NULL);
    int n = 0;
    for (int stage = 0; stage < 4; stage++) {
        test_step_always_applies_update(stage), n++;
        test_managed_baseline_applies_only_on_boundary(stage), n++;
        test_unmanaged_matches_managed(stage), n++;
        test_unmanaged_varying_backward_count(stage), n++;
        test_call_time_rejections(stage), n++;
        for (int managed = 0; managed < 2; managed++) {
            test_backward_count_mismatch(stage, managed, 1, 2), n++;
            test_backward_count_mismatch(stage, managed, 2, 1), n++;
            test_backward_count_mismatch(stage, managed, 3, 1), n++;
            test_backward_count_mismatch(stage, managed, 0, 1), n++; /* a step() with none */
        }
        test_grad_norm_is_global(stage, 5), n++;
        test_grad_norm_is_global(stage, 32), n++;
        test_averaging_invariance(stage, true), n++;
        test_scheduler_cadence(stage), n++;
        test_nonfinite_update_refused(stage), n++;
        test_hparams_rejections(stage), n++;
        test_reset_optimizer_state(stage, false), n++;
        test_reset_optimizer_state(stage, true), n++;
        test_drop_window(stage), n++;
        test_averaging_invariance(stage, false), n++;
        for (int managed = 0; managed < 2; managed++) {
            test_nonfinite_skips_everywhere(stage, managed, NAN), n++;
            test_nonfinite_skips_everywhere(stage, managed, INFINITY), n++;
        }
    }
    for (int managed = 0; managed < 2; managed++) {
        test_stages_match_reference(5, 3, 7, managed), n++;       /* 90 params, bucket < tensor */
        test_stages_match_reference(7, 2, 1 << 20, managed), n++; /* 112 params, one bucket */
    }
    test_hparams_match_reference(true), n++;  /* AdamW: decoupled decay */
    test_hparams_match_reference(false), n++; /* Adam, adam_w_mode false: L2 decay */
    for (int managed = 0; managed < 2; managed++) {
        test_overlap_comm_bitwise(managed, 5), n++;       /* smaller than one tensor */
        test_overlap_comm_bitwise(managed, 40), n++;      /* a few tensors per bucket */
        test_overlap_comm_bitwise(managed, 1 << 20), n++; /* larger than the model */
        for (int stage = 0; stage < 3; stage++) test_comm_report(stage, managed), n++;
    }
    test_partition_layout(), n++;
    test_memory_report(), n++;
    test_create_rejections(), n++;
    if (R == 0) printf("test_engine: %d tests passed at world size %d\n", n, W);
    zdp_dist_finalize();
    return 0;
}
