/*
 * test_reduce_scatter.c -- the reduce-scatter backends of src/comm (CTest
 * runs it at -np 1, 2, 3, 4).
 *
 * Both backends, called directly on uneven pieces (one of them empty) of
 * integer-valued floats, give exactly the sums and leave *piece at this
 * rank's piece.  An engine takes its backend from ZDP_REDUCE_SCATTER once, at
 * creation: changing the variable afterwards changes nothing, the backend it
 * chose is the one its reductions go through (zdp_comm_rs_calls), and at
 * stages 1 and 2 both backends train to the same parameters (bit for bit
 * at W <= 2, where a sum of two terms has one order; to fp32 rounding
 * beyond).  And an error record names the rank zdp_dist_init gave core.
 *
 * Stage 0 (MPI_Allreduce of the whole gradient buffer): a 262,656-parameter
 * engine leaves bitwise-identical parameters on every rank after its steps,
 * and the same on a second run.  The all-reduce itself, in its 8 MiB pieces:
 * float and double buffers of two pieces and an odd tail give exactly the
 * sums, element for element.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "common/check.h"
#include "zdp/zdp.h"

static int W, R;

/* ---- stage 0: every rank the same ---------------------------------------------- */

/* Rank 0's n floats reach every rank (into `copy`); 1 if ours equal them bitwise. */
static int same_as_rank0_(const float *x, float *copy, int64_t n) {
    memcpy(copy, x, (size_t)n * sizeof(float));
    CHECK(n <= INT32_MAX);
    /* MPI itself: the library's internal broadcast is not exported from libzdp.so. */
    if (MPI_Bcast(copy, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD) != MPI_SUCCESS) CHECK_FAIL_("MPI_Bcast failed");
    return memcmp(copy, x, (size_t)n * sizeof(float)) == 0;
}

/* ---- the all-reduce in pieces ---------------------------------------------------- */

/* n = two 8 MiB pieces and an odd tail; element i on rank q is i % 1021 + q
 * (small integers: exact in any order), so the sum is W (i % 1021) +
 * W (W - 1) / 2 everywhere.  A piece skipped, summed twice or shifted
 * breaks it. */
static void test_allreduce_pieces(void) {
    zdp_error err = {0};
    zdp_comm_report stats = {0};
    const int64_t nf = 2 * ((8 << 20) / (int64_t)sizeof(float)) + 12345;
    float *f = malloc((size_t)nf * sizeof(float)); /* (nf) */
    CHECK(f != NULL);
    for (int64_t i = 0; i < nf; i++) f[i] = (float)(i % 1021 + R);
    if (zdp_comm_allreduce_sum_f32(f, nf, &stats, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    for (int64_t i = 0; i < nf; i++)
        if (f[i] != (float)(W * (i % 1021) + W * (W - 1) / 2))
            CHECK_FAIL_("all-reduce f32: element %lld of %lld is %g on rank %d", (long long)i,
                        (long long)nf, (double)f[i], R);
    free(f);
    const int64_t nd = 2 * ((8 << 20) / (int64_t)sizeof(double)) + 777;
    double *d = malloc((size_t)nd * sizeof(double)); /* (nd) */
    CHECK(d != NULL);
    for (int64_t i = 0; i < nd; i++) d[i] = (double)(i % 1021 + R);
    if (zdp_comm_allreduce_sum_f64(d, nd, &stats, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    for (int64_t i = 0; i < nd; i++)
        if (d[i] != (double)(W * (i % 1021) + W * (W - 1) / 2))
            CHECK_FAIL_("all-reduce f64: element %lld of %lld is %g on rank %d", (long long)i,
                        (long long)nd, d[i], R);
    free(d);
}

/* ---- the backends called directly ------------------------------------------- */

static void test_backend_sums(zdp_comm_rs_kind kind) {
    const zdp_comm_rs_backend *be = zdp_comm_rs_backend_get(kind);
    CHECK(be != NULL);
    CHECK(be->kind == kind);
    /* Piece r holds 2r + 1 floats, except piece 1 (when there is one): 0. */
    int counts[4], total = 0, mine_off = 0;
    for (int r = 0; r < W; r++) {
        counts[r] = r == 1 ? 0 : 2 * r + 1;
        if (r < R) mine_off += counts[r];
        total += counts[r];
    }
    float *buf = malloc((size_t)total * sizeof(float)); /* (total) */
    float *scratch = malloc(8 * sizeof(float));         /* the largest piece */
    /* Element i on rank q is q * 100 + i: small integers, exact in any order. */
    for (int i = 0; i < total; i++) buf[i] = (float)(R * 100 + i);
    const int64_t before[2] = {zdp_comm_rs_calls(ZDP_COMM_RS_RING), zdp_comm_rs_calls(ZDP_COMM_RS_MPI)};
    const float *piece = NULL;
    zdp_error err = {0};
    zdp_status st = be->reduce_scatter(buf, scratch, counts, &piece, NULL, &err);
    if (st != ZDP_OK) CHECK_FAIL_("%s reduce-scatter: %s", be->name, err.msg);
    CHECK(piece != NULL);
    for (int i = 0; i < counts[R]; i++) {
        const int idx = mine_off + i;
        const float want = (float)(100 * (W * (W - 1) / 2) + W * idx);
        if (piece[i] != want)
            CHECK_FAIL_("%s: rank %d element %d: %g, want %g", be->name, R, i, (double)piece[i],
                        (double)want);
    }
    CHECK_EQ_I64(zdp_comm_rs_calls(kind) - before[kind], 1);
    CHECK_EQ_I64(zdp_comm_rs_calls(1 - kind) - before[1 - kind], 0);
    free(buf);
    free(scratch);
}

static void test_backend_from_env(void) {
    unsetenv("ZDP_REDUCE_SCATTER");
    CHECK(zdp_comm_rs_backend_from_env()->kind == ZDP_COMM_RS_RING);
    setenv("ZDP_REDUCE_SCATTER", "ring", 1);
    CHECK(zdp_comm_rs_backend_from_env()->kind == ZDP_COMM_RS_RING);
    setenv("ZDP_REDUCE_SCATTER", "mpi", 1);
    CHECK(zdp_comm_rs_backend_from_env()->kind == ZDP_COMM_RS_MPI);
    CHECK(strcmp(zdp_comm_rs_backend_from_env()->name, "mpi") == 0);
    unsetenv("ZDP_REDUCE_SCATTER");
    CHECK(zdp_comm_rs_backend_get(ZDP_COMM_RS_COUNT) == NULL);
}

/* Core names the rank zdp_dist_init handed it (core never asks comm). */
static void test_error_names_rank(void) {
    zdp_error err = {0};
    zdp_config cfg;
    CHECK(zdp_config_load_string("{", "<test>", W, &cfg, &err) == ZDP_ERR_FORMAT);
    CHECK_EQ_I64(err.rank, R);
}

/* ---- an engine's backend ------------------------------------------------------ */

#define H_ 9 /* 2 layers of 9x9 + 9: 180 parameters, not a multiple of 2W */
#define L_ 2
#define STEPS_ 3

/* Trains STEPS_ unmanaged steps (2 backwards each) of the MLP at `stage`
 * with the backend the environment names at creation, then sets the
 * variable to the other backend before the steps (an engine must not look
 * again).  Returns the parameters (numel floats, malloc'd) and the
 * reduce-scatters each backend ran. */
static float *train_(int stage, const char *backend, int64_t *calls /* (2) */, int64_t *numel) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 1, "
             "\"steps_per_print\": 1, \"managed_gradient_accumulation\": false, "
             "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-2}}, "
             "\"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 40}}",
             stage);
    zdp_error err = {0};
    zdp_config cfg;
    if (zdp_config_load_string(json, "<test>", W, &cfg, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    zdp_model model;
    if (zdp_mlp_create(H_, L_, 2, &model, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    setenv("ZDP_REDUCE_SCATTER", backend, 1);
    zdp_engine *eng;
    if (zdp_engine_create(&cfg, &model, &eng, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    setenv("ZDP_REDUCE_SCATTER", strcmp(backend, "mpi") == 0 ? "ring" : "mpi", 1);
    float *views[8];
    for (int i = 0; i < model.n_params; i++) views[i] = zdp_engine_param_data(eng, i);
    zdp_mlp_init_params(&model, views, 7);
    if (zdp_engine_sync_params(eng, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);

    const int64_t before[2] = {zdp_comm_rs_calls(ZDP_COMM_RS_RING), zdp_comm_rs_calls(ZDP_COMM_RS_MPI)};
    uint64_t s = 11 + (uint64_t)R; /* each rank its own data */
    float x[2 * H_]; /* (2, H_) */
    int64_t y[2];    /* (2,) */
    for (int step = 0; step < STEPS_; step++) {
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < 2 * H_; i++)
                x[i] = (float)((double)(zdp_splitmix64(&s) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
            for (int i = 0; i < 2; i++) y[i] = (int64_t)(zdp_splitmix64(&s) % H_);
            zdp_mlp_batch b = {.x = x, .y = y, .n = 2};
            float loss;
            if (zdp_engine_forward(eng, &b, &loss, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
            if (zdp_engine_backward(eng, false, 0.5f, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
        }
        if (zdp_engine_step(eng, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
        CHECK(zdp_engine_was_step_applied(eng));
    }
    calls[0] = zdp_comm_rs_calls(ZDP_COMM_RS_RING) - before[0];
    calls[1] = zdp_comm_rs_calls(ZDP_COMM_RS_MPI) - before[1];
    unsetenv("ZDP_REDUCE_SCATTER");
    *numel = zdp_engine_numel(eng);
    float *out = malloc((size_t)*numel * sizeof(float));
    memcpy(out, zdp_engine_param_data(eng, 0), (size_t)*numel * sizeof(float));
    zdp_engine_destroy(eng);
    zdp_mlp_destroy(&model);
    return out;
}

static void test_engine_uses_its_backend(int stage) {
    int64_t ring_calls[2], mpi_calls[2], n_ring, n_mpi;
    float *p_ring = train_(stage, "ring", ring_calls, &n_ring);
    float *p_mpi = train_(stage, "mpi", mpi_calls, &n_mpi);
    CHECK_EQ_I64(n_ring, n_mpi);
    /* One process reduces nothing; otherwise every reduction went through
     * the backend chosen at creation, and only through it. */
    CHECK_EQ_I64(ring_calls[1], 0);
    CHECK_EQ_I64(mpi_calls[0], 0);
    if (W == 1) {
        CHECK_EQ_I64(ring_calls[0], 0);
        CHECK_EQ_I64(mpi_calls[1], 0);
    } else {
        CHECK(ring_calls[0] > 0);
        CHECK_EQ_I64(mpi_calls[1], ring_calls[0]);
    }
    if (W <= 2) {
        if (memcmp(p_ring, p_mpi, (size_t)n_ring * sizeof(float)) != 0)
            CHECK_FAIL_("stage %d: ring and mpi parameters differ at W = %d", stage, W);
    } else {
        CHECK_CLOSE(p_mpi, p_ring, n_ring, 1e-5, 1e-6, "mpi vs ring parameters");
    }
    free(p_ring);
    free(p_mpi);
}

/* Stage 0 on a 512 x 512 (+512) MLP layer: 262,656 gradients (a 1 MiB
 * all-reduce, not a multiple of W = 3 or 4). */
static float *train_stage0_(int64_t *numel) {
    const char *json =
        "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 1, "
        "\"steps_per_print\": 1, \"managed_gradient_accumulation\": false, "
        "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-2}}, "
        "\"zero_optimization\": {\"stage\": 0}}";
    enum { H = 512 };
    zdp_error err = {0};
    zdp_config cfg;
    if (zdp_config_load_string(json, "<test>", W, &cfg, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    zdp_model model;
    if (zdp_mlp_create(H, 1, 2, &model, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    zdp_engine *eng;
    if (zdp_engine_create(&cfg, &model, &eng, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    float *views[8];
    for (int i = 0; i < model.n_params; i++) views[i] = zdp_engine_param_data(eng, i);
    zdp_mlp_init_params(&model, views, 7);
    if (zdp_engine_sync_params(eng, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
    uint64_t s = 11 + (uint64_t)R; /* each rank its own data */
    float *x = malloc(2 * H * sizeof(float)); /* (2, H) */
    int64_t y[2];                             /* (2,) */
    CHECK(x != NULL);
    for (int step = 0; step < STEPS_; step++) {
        for (int i = 0; i < 2 * H; i++)
            x[i] = (float)((double)(zdp_splitmix64(&s) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
        for (int i = 0; i < 2; i++) y[i] = (int64_t)(zdp_splitmix64(&s) % H);
        zdp_mlp_batch b = {.x = x, .y = y, .n = 2};
        float loss;
        if (zdp_engine_forward(eng, &b, &loss, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
        if (zdp_engine_backward(eng, false, 1.0f, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
        if (zdp_engine_step(eng, &err) != ZDP_OK) CHECK_FAIL_("%s", err.msg);
        CHECK(zdp_engine_was_step_applied(eng));
    }
    free(x);
    *numel = zdp_engine_numel(eng);
    CHECK(*numel > ((int64_t)1 << 18));
    float *out = malloc((size_t)*numel * sizeof(float));
    memcpy(out, zdp_engine_param_data(eng, 0), (size_t)*numel * sizeof(float));
    zdp_engine_destroy(eng);
    zdp_mlp_destroy(&model);
    return out;
}

static void test_stage0_ranks_identical(void) {
    int64_t n1, n2;
    float *p1 = train_stage0_(&n1);
    float *p2 = train_stage0_(&n2);
    CHECK_EQ_I64(n1, n2);
    float *copy = malloc((size_t)n1 * sizeof(float));
    CHECK(copy != NULL);
    /* Every rank applied Adam to the whole model from the reduced gradients:
     * identical parameters mean identical gradients on every rank. */
    if (!same_as_rank0_(p1, copy, n1))
        CHECK_FAIL_("stage 0: rank %d's parameters differ from rank 0's", R);
    if (memcmp(p1, p2, (size_t)n1 * sizeof(float)) != 0)
        CHECK_FAIL_("stage 0: rank %d: two runs of the same steps differ", R);
    free(copy);
    free(p1);
    free(p2);
}

static void run_(void) {
    CHECK(W <= 4);
    test_error_names_rank();
    test_allreduce_pieces();
    test_backend_from_env();
    test_backend_sums(ZDP_COMM_RS_RING);
    test_backend_sums(ZDP_COMM_RS_MPI);
    test_engine_uses_its_backend(1);
    test_engine_uses_its_backend(2);
    test_stage0_ranks_identical();
}

int main(int argc, char **argv) { return check_dist_main(&argc, &argv, "test_reduce_scatter", &W, &R, run_); }
