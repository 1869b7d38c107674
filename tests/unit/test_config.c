/*
 * test_config.c -- unit tests for src/config/ (ds_config.json ->
 * zdp_config): defaults, DeepSpeed's batch derivation (docs/deepspeed.md §1.2)
 * at W = 1, 2, 3, type errors naming JSON paths, malformed JSON positions,
 * duplicate keys, the single unknown-key warning, every validate rejection,
 * optimizer blocks and file loading.
 *
 * Not here: anything that needs MPI ranks (the world size is an argument) or
 * an engine.  Messages are checked by substring so that wording around the
 * asserted core (DeepSpeed's text, the JSON path, the fix) may evolve.
 *
 * Build by hand: gcc -std=c11 -Iinclude -Isrc src/config/config_*.c
 *   src/core/core.c src/comm/comm_mpi.c tests/unit/test_config.c
 *   $(pkg-config --cflags --libs jansson) -lmpi -lcmocka -lm
 */
#define _POSIX_C_SOURCE 200809L /* mkstemp, unlink */

#include <setjmp.h> /* cmocka needs these three first */
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zdp/zdp.h"

/* ---- helpers ---------------------------------------------------------- */

/* Log capture: counts warnings and keeps them all, so a test can assert
 * "exactly one warning, and it lists these keys". */
typedef struct log_capture {
    int n_warn;
    int n_info;
    char text[8192];
} log_capture;

static log_capture g_log;

static void capture_log_(int level, const char *msg, void *user) {
    log_capture *c = user;
    if (level > 0) c->n_warn++;
    else c->n_info++;
    size_t len = strlen(c->text);
    snprintf(c->text + len, sizeof c->text - len, "%s\n", msg);
}

static int setup_(void **state) {
    (void)state;
    memset(&g_log, 0, sizeof g_log);
    zdp_set_log(capture_log_, &g_log);
    return 0;
}

static int teardown_(void **state) {
    (void)state;
    zdp_set_log(NULL, NULL);
    return 0;
}

#define OPT_ADAM "\"optimizer\": {\"type\": \"Adam\"}"

static zdp_status load_(const char *json, int world_size, zdp_config *cfg, zdp_error *err) {
    memset(err, 0, sizeof *err);
    return zdp_config_load_string(json, "t.json", world_size, cfg, err);
}

static void assert_has_(const char *haystack, const char *needle, const char *file, int line) {
    if (strstr(haystack, needle) == NULL) {
        print_error("%s:%d: message\n  \"%s\"\ndoes not contain\n  \"%s\"\n", file, line,
                    haystack, needle);
        fail();
    }
}
#define ASSERT_HAS(hay, needle) assert_has_((hay), (needle), __FILE__, __LINE__)

/* Loads json and expects failure with `code` and `needle` in the message. */
static void expect_fail_(const char *json, int world_size, zdp_status code, const char *needle,
                         const char *file, int line) {
    zdp_config cfg;
    zdp_error err;
    zdp_status st = load_(json, world_size, &cfg, &err);
    if (st != code) {
        print_error("%s:%d: status %s (%s), expected %s, for\n  %s\n", file, line,
                    zdp_status_name(st), err.msg, zdp_status_name(code), json);
        fail();
    }
    assert_int_equal(err.code, code);
    assert_has_(err.msg, needle, file, line);
}
#define EXPECT_FAIL(json, w, code, needle) expect_fail_((json), (w), (code), (needle), __FILE__, __LINE__)

static void expect_ok_(const char *json, int world_size, zdp_config *cfg, const char *file,
                       int line) {
    zdp_error err;
    zdp_status st = load_(json, world_size, cfg, &err);
    if (st != ZDP_OK) {
        print_error("%s:%d: status %s: %s\nfor %s\n", file, line, zdp_status_name(st), err.msg,
                    json);
        fail();
    }
}
#define EXPECT_OK(json, w, cfg) expect_ok_((json), (w), (cfg), __FILE__, __LINE__)

/* ---- defaults ----------------------------------------------------------- */

static void test_defaults(void **state) {
    (void)state;
    zdp_config d;
    zdp_config_default(&d);
    assert_int_equal(d.train_batch_size, 0);
    assert_int_equal(d.micro_batch_size, 0);
    assert_int_equal(d.gradient_accumulation_steps, 0);

    zdp_config c;
    EXPECT_OK("{\"train_batch_size\": 8, " OPT_ADAM "}", 1, &c);
    assert_int_equal(c.world_size, 1);
    assert_int_equal(c.train_batch_size, 8);
    assert_int_equal(c.micro_batch_size, 8);
    assert_int_equal(c.gradient_accumulation_steps, 1);
    assert_true(c.managed_gradient_accumulation);
    assert_int_equal(c.steps_per_print, 10);
    assert_true(c.gradient_clipping == 1.0);
    assert_false(c.zero_allow_untested_optimizer);
    assert_int_equal(c.optimizer.type, ZDP_OPTIMIZER_ADAM);
    assert_true(c.optimizer.lr == 1e-3);
    assert_true(c.optimizer.beta1 == 0.9 && c.optimizer.beta2 == 0.999);
    assert_true(c.optimizer.eps == 1e-8);
    assert_true(c.optimizer.weight_decay == 0.0);
    assert_true(c.optimizer.adam_w_mode);
    assert_true(c.optimizer.bias_correction);
    assert_int_equal(c.zero.stage, 0);
    assert_false(c.zero.overlap_comm);
    assert_int_equal(c.zero.reduce_bucket_size, 262144);
    assert_int_equal(c.zero.allgather_bucket_size, 500000000);
    /* Stage 3: DeepSpeed's defaults. */
    assert_int_equal(c.zero.stage3_prefetch_bucket_size, 50000000);
    assert_int_equal(c.zero.stage3_param_persistence_threshold, 100000);
    assert_int_equal(c.zero.stage3_max_live_parameters, 1000000000);
    assert_int_equal(c.zero.stage3_max_reuse_distance, 1000000000);
    assert_true(c.zero.contiguous_gradients);
    assert_true(c.zero.reduce_scatter);
    assert_int_equal(c.zero.offload_optimizer, ZDP_OFFLOAD_NONE);
    assert_int_equal(c.zero.offload_param, ZDP_OFFLOAD_NONE);
    assert_false(c.has_pipeline || c.amp_enabled || c.fp16_enabled || c.bf16_enabled);
    assert_int_equal(g_log.n_warn, 0);
}

static void test_world_size_recorded(void **state) {
    (void)state;
    zdp_config c;
    EXPECT_OK("{\"train_micro_batch_size_per_gpu\": 2, " OPT_ADAM "}", 3, &c);
    assert_int_equal(c.world_size, 3);
    assert_int_equal(c.train_batch_size, 6);
    EXPECT_FAIL("{\"train_batch_size\": 8, " OPT_ADAM "}", 0, ZDP_ERR_INVALID_ARG,
                "world_size = 0: must be >= 1");
}

/* ---- batch derivation (docs/deepspeed.md §1.2) -------------------------- */

typedef struct batch_row {
    int W;
    long long B, b, G;    /* -1: key absent */
    long long eB, eb, eG; /* expected on success */
    const char *err;      /* expected substring on failure, NULL for success */
} batch_row;

#define EITHER_ "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided"
#define MICRO0_ "Micro batch size per gpu: 0 has to be greater than 0"
#define GAS0_ "Gradient accumulation steps: 0 has to be greater than 0"
#define CHECK4_ "Check batch related parameters. train_batch_size is not equal to " \
                "micro_batch_per_gpu * gradient_acc_step * world_size "

static const batch_row batch_rows_[] = {
    /* W = 1 */
    {1, 32, 4, 8, 32, 4, 8, NULL},
    {1, 32, 4, -1, 32, 4, 8, NULL},
    {1, 32, -1, 4, 32, 8, 4, NULL},
    {1, -1, 4, 4, 16, 4, 4, NULL},
    {1, 32, -1, -1, 32, 32, 1, NULL},
    {1, -1, 4, -1, 4, 4, 1, NULL},
    {1, -1, -1, 4, 0, 0, 0, EITHER_},
    {1, -1, -1, -1, 0, 0, 0, EITHER_},
    {1, 32, 4, 4, 0, 0, 0, CHECK4_ "32 != 4 * 4 * 1"},
    {1, 30, 4, -1, 0, 0, 0, CHECK4_ "30 != 4 * 7 * 1"},
    {1, 2, -1, 4, 0, 0, 0, MICRO0_},
    {1, 8, 16, -1, 0, 0, 0, GAS0_},
    /* W = 2: the worked examples of docs/deepspeed.md §1.2 */
    {2, 32, 4, 4, 32, 4, 4, NULL},
    {2, 32, 4, -1, 32, 4, 4, NULL},
    {2, 32, -1, 4, 32, 4, 4, NULL},
    {2, -1, 4, 4, 32, 4, 4, NULL},
    {2, 32, -1, -1, 32, 16, 1, NULL},
    {2, -1, 1, 4, 8, 1, 4, NULL},
    {2, -1, 4, -1, 8, 4, 1, NULL},
    {2, 30, 4, -1, 0, 0, 0, CHECK4_ "30 != 4 * 3 * 2"},
    {2, 1, -1, -1, 0, 0, 0, MICRO0_},
    {2, 8, 8, -1, 0, 0, 0, GAS0_},
    {2, -1, -1, 4, 0, 0, 0, EITHER_},
    {2, 32, 4, 8, 0, 0, 0, CHECK4_ "32 != 4 * 8 * 2"},
    /* W = 3 */
    {3, 48, 4, 4, 48, 4, 4, NULL},
    {3, 48, 4, -1, 48, 4, 4, NULL},
    {3, 48, -1, 4, 48, 4, 4, NULL},
    {3, -1, 4, 4, 48, 4, 4, NULL},
    {3, 48, -1, -1, 48, 16, 1, NULL},
    {3, -1, 5, -1, 15, 5, 1, NULL},
    {3, 32, -1, -1, 0, 0, 0, CHECK4_ "32 != 10 * 1 * 3"},
    {3, 32, 4, -1, 0, 0, 0, CHECK4_ "32 != 4 * 2 * 3"},
    {3, 32, -1, 4, 0, 0, 0, CHECK4_ "32 != 2 * 4 * 3"},
    {3, 2, -1, -1, 0, 0, 0, MICRO0_},
    {3, 8, 4, -1, 0, 0, 0, GAS0_},
    {3, -1, -1, -1, 0, 0, 0, EITHER_},
    {3, -1, -1, 2, 0, 0, 0, EITHER_},
};

static void test_batch_derivation_table(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof batch_rows_ / sizeof batch_rows_[0]; i++) {
        const batch_row *r = &batch_rows_[i];
        char json[512];
        int n = snprintf(json, sizeof json, "{" OPT_ADAM);
        if (r->B >= 0) n += snprintf(json + n, sizeof json - n, ", \"train_batch_size\": %lld", r->B);
        if (r->b >= 0)
            n += snprintf(json + n, sizeof json - n, ", \"train_micro_batch_size_per_gpu\": %lld", r->b);
        if (r->G >= 0)
            n += snprintf(json + n, sizeof json - n, ", \"gradient_accumulation_steps\": %lld", r->G);
        snprintf(json + n, sizeof json - n, "}");
        if (r->err != NULL) {
            EXPECT_FAIL(json, r->W, ZDP_ERR_CONFIG, r->err);
            continue;
        }
        zdp_config c;
        EXPECT_OK(json, r->W, &c);
        if (c.train_batch_size != r->eB || c.micro_batch_size != r->eb ||
            c.gradient_accumulation_steps != r->eG) {
            print_error("row %zu (W=%d): got B=%lld b=%lld G=%lld, expected %lld %lld %lld\n", i,
                        r->W, (long long)c.train_batch_size, (long long)c.micro_batch_size,
                        (long long)c.gradient_accumulation_steps, r->eB, r->eb, r->eG);
            fail();
        }
        assert_int_equal(c.world_size, r->W);
    }
}

static void test_batch_messages_name_derived_values(void **state) {
    (void)state;
    const char *j = "{\"train_batch_size\": 30, \"train_micro_batch_size_per_gpu\": 4, " OPT_ADAM "}";
    EXPECT_FAIL(j, 2, ZDP_ERR_CONFIG,
                "train_batch_size = 30, train_micro_batch_size_per_gpu = 4, "
                "gradient_accumulation_steps = 3 (derived), world size 2");
    EXPECT_FAIL(j, 2, ZDP_ERR_CONFIG, "MPI world size");
    EXPECT_FAIL(j, 2, ZDP_ERR_CONFIG, "fix: ");
    EXPECT_FAIL("{\"train_batch_size\": 1, " OPT_ADAM "}", 2, ZDP_ERR_CONFIG,
                "train_micro_batch_size_per_gpu = 0 (derived), gradient_accumulation_steps = 1 "
                "(derived), world size 2");
    EXPECT_FAIL("{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 8, " OPT_ADAM "}",
                2, ZDP_ERR_CONFIG, "must be at least train_micro_batch_size_per_gpu * world size = 16");
    EXPECT_FAIL("{\"gradient_accumulation_steps\": 4, " OPT_ADAM "}", 2, ZDP_ERR_CONFIG,
                "gradient_accumulation_steps = 4 alone");
}

static void test_batch_present_keys_must_be_positive_integers(void **state) {
    (void)state;
    EXPECT_FAIL("{\"train_batch_size\": 0, " OPT_ADAM "}", 1, ZDP_ERR_CONFIG,
                "train_batch_size = 0: must be an integer >= 1");
    EXPECT_FAIL("{\"train_micro_batch_size_per_gpu\": -4, " OPT_ADAM "}", 1, ZDP_ERR_CONFIG,
                "train_micro_batch_size_per_gpu = -4: must be an integer >= 1");
    EXPECT_FAIL("{\"train_batch_size\": 8, \"gradient_accumulation_steps\": 2.5, " OPT_ADAM "}", 1,
                ZDP_ERR_CONFIG, "gradient_accumulation_steps = 2.5: expected a whole number");
    EXPECT_FAIL("{\"train_batch_size\": \"32\", " OPT_ADAM "}", 1, ZDP_ERR_CONFIG,
                "train_batch_size = \"32\": expected an integer, got a string");
    EXPECT_FAIL("{\"train_batch_size\": \"auto\", " OPT_ADAM "}", 1, ZDP_ERR_CONFIG,
                "Hugging Face");
    EXPECT_FAIL("{\"train_batch_size\": true, " OPT_ADAM "}", 1, ZDP_ERR_CONFIG,
                "train_batch_size = true: expected an integer, got a boolean");
    EXPECT_FAIL("{\"train_batch_size\": null, " OPT_ADAM "}", 1, ZDP_ERR_CONFIG,
                "train_batch_size = null: expected an integer, got null");
    /* b * G * W past int64 */
    EXPECT_FAIL("{\"train_micro_batch_size_per_gpu\": 4611686018427387904, "
                "\"gradient_accumulation_steps\": 4, " OPT_ADAM "}", 1, ZDP_ERR_CONFIG,
                "overflows");
    EXPECT_FAIL("{\"train_batch_size\": 1e30, " OPT_ADAM "}", 1, ZDP_ERR_CONFIG,
                "train_batch_size = 1e30: expected a whole number");
}

/* ---- types and paths ---------------------------------------------------- */

typedef struct type_case {
    const char *body; /* inserted after train_batch_size and the optimizer */
    const char *needle;
} type_case;

static const type_case type_cases_[] = {
    {"\"managed_gradient_accumulation\": \"false\"",
     "managed_gradient_accumulation = \"false\": expected a JSON boolean, got a string"},
    {"\"steps_per_print\": 0", "steps_per_print = 0: must be an integer >= 1"},
    {"\"steps_per_print\": 1.5", "steps_per_print = 1.5: expected a whole number"},
    {"\"gradient_clipping\": -1", "gradient_clipping = -1: out of range; fix: write a number >= 0"},
    {"\"gradient_clipping\": \"1.0\"", "gradient_clipping = \"1.0\": expected a number >= 0, got a string"},
    {"\"zero_allow_untested_optimizer\": 1", "zero_allow_untested_optimizer = 1: expected a JSON boolean"},
    {"\"zero_optimization\": \"2\"", "zero_optimization = \"2\": expected an object"},
    {"\"zero_optimization\": {\"stage\": \"2\"}", "zero_optimization.stage = \"2\": expected an integer"},
    {"\"zero_optimization\": {\"stage\": 2.5}", "zero_optimization.stage = 2.5: expected a whole number"},
    {"\"zero_optimization\": {\"overlap_comm\": 1}", "zero_optimization.overlap_comm = 1: expected a JSON boolean"},
    {"\"zero_optimization\": {\"reduce_bucket_size\": 1.5}", "zero_optimization.reduce_bucket_size = 1.5: expected a whole number"},
    {"\"zero_optimization\": {\"reduce_bucket_size\": 0}", "zero_optimization.reduce_bucket_size = 0: must be an integer >= 1"},
    {"\"zero_optimization\": {\"allgather_bucket_size\": -2}", "zero_optimization.allgather_bucket_size = -2: must be an integer >= 1"},
    {"\"zero_optimization\": {\"allgather_bucket_size\": 5}",
     "zero_optimization.allgather_bucket_size = 5: allgather_bucket_size must be a multiple of nccl_start_alignment_factor, 2"},
    {"\"zero_optimization\": {\"contiguous_gradients\": null}", "zero_optimization.contiguous_gradients = null: expected a JSON boolean"},
    {"\"zero_optimization\": {\"reduce_scatter\": \"yes\"}", "zero_optimization.reduce_scatter = \"yes\": expected a JSON boolean"},
    {"\"zero_optimization\": {\"cpu_offload\": 1}", "zero_optimization.cpu_offload = 1: expected a JSON boolean"},
    {"\"zero_optimization\": {\"offload_optimizer\": \"cpu\"}", "zero_optimization.offload_optimizer = \"cpu\": expected an object"},
    {"\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"gpu\"}}",
     "zero_optimization.offload_optimizer.device = \"gpu\": expected \"none\", \"cpu\" or \"nvme\""},
    {"\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"none\", \"pin_memory\": 1}}",
     "zero_optimization.offload_optimizer.pin_memory = 1: expected a JSON boolean"},
    {"\"zero_optimization\": {\"offload_optimizer\": {\"ratio\": 2}}", "zero_optimization.offload_optimizer.ratio = 2: out of range"},
    {"\"zero_optimization\": {\"offload_param\": {\"buffer_size\": -1}}", "zero_optimization.offload_param.buffer_size = -1: must be an integer >= 0"},
    {"\"zero_optimization\": {\"offload_param\": {\"device\": 0}}", "zero_optimization.offload_param.device = 0: expected \"none\""},
    {"\"fp16\": {\"enabled\": 1}", "fp16.enabled = 1: expected a JSON boolean"},
    {"\"fp16\": true", "fp16 = true: expected an object"},
    {"\"bf16\": {\"enabled\": \"auto\"}", "bf16.enabled = \"auto\": expected a JSON boolean"},
    {"\"bfloat16\": {\"enabled\": 0}", "bfloat16.enabled = 0: expected a JSON boolean"},
    {"\"amp\": {\"enabled\": \"no\"}", "amp.enabled = \"no\": expected a JSON boolean"},
};

static void test_type_errors_name_json_path(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof type_cases_ / sizeof type_cases_[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, "{\"train_batch_size\": 8, " OPT_ADAM ", %s}",
                 type_cases_[i].body);
        EXPECT_FAIL(json, 1, ZDP_ERR_CONFIG, type_cases_[i].needle);
        EXPECT_FAIL(json, 1, ZDP_ERR_CONFIG, "fix: ");
    }
}

static void test_optimizer_type_errors(void **state) {
    (void)state;
    static const type_case cases[] = {
        {"\"optimizer\": 5", "optimizer = 5: expected an object"},
        {"\"optimizer\": {\"params\": {}}", "optimizer.type: missing"},
        {"\"optimizer\": {\"type\": 5}", "optimizer.type = 5: expected a string"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": []}", "optimizer.params = []: expected an object"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": \"0.1\"}}", "optimizer.params.lr = \"0.1\": expected a number in [0, 100]"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": -0.1}}", "optimizer.params.lr = -0.1: out of range"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.9]}}", "optimizer.params.betas = [0.9]: expected a list of two numbers"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.9, 1.0]}}", "optimizer.params.betas[1] = 1.0: expected a number with 0 <= beta < 1"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [-0.1, 0.9]}}", "optimizer.params.betas[0] = -0.1"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"eps\": -1e-8}}", "optimizer.params.eps = -1e-8: out of range"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"weight_decay\": -0.1}}", "optimizer.params.weight_decay = -0.1: out of range"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": 0}}", "optimizer.params.adam_w_mode = 0: expected a JSON boolean"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"bias_correction\": \"true\"}}", "optimizer.params.bias_correction = \"true\": expected a JSON boolean"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"torch_adam\": 1}}", "optimizer.params.torch_adam = 1: expected a JSON boolean"},
        {"\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1, \"momentum\": -0.5}}", "optimizer.params.momentum = -0.5: out of range"},
        {"\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1, \"nesterov\": \"yes\"}}", "optimizer.params.nesterov = \"yes\": expected a JSON boolean"},
        /* Finite but absurd values (issue 10: lr = 1e308 turned the weights
         * into NaN): the JSON path, the value and the range to write. */
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e308}}", "optimizer.params.lr = 1e308: out of range; fix: write a number in [0, 100]"},
        {"\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 100.5}}", "optimizer.params.lr = 100.5: out of range"},
        {"\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 1e300}}", "optimizer.params.lr = 1e300: out of range"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"eps\": 2}}", "optimizer.params.eps = 2: out of range; fix: write a number in [0, 1]"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"eps\": 0}}", "optimizer.params.eps = 0: must be a number in (0, 1]; fix: write 1e-8"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"weight_decay\": 1e10}}", "optimizer.params.weight_decay = 10000000000.0: out of range; fix: write a number in [0, 10]"},
        {"\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1, \"weight_decay\": 11}}", "optimizer.params.weight_decay = 11: out of range"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-3}}, \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 1e308}}", "scheduler.params.warmup_min_lr = 1e308: out of range; fix: write a number in [0, 100]"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-3}}, \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_max_lr\": 1000}}", "scheduler.params.warmup_max_lr = 1000: out of range"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-3}}, \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 1e15}}", "scheduler.params.warmup_num_steps = 1e15: must be an integer <= 1000000000000"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-3}}, \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"total_num_steps\": 2e12}}", "scheduler.params.total_num_steps = 2000000000000.0: must be an integer <= 1000000000000"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-3}}, \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": 10, \"cos_min_ratio\": 1.5}}", "scheduler.params.cos_min_ratio = 1.5: out of range"},
        {"\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-3}}, \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": 10, \"warmup_min_ratio\": -1}}", "scheduler.params.warmup_min_ratio = -1: out of range"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, "{\"train_batch_size\": 8, %s}", cases[i].body);
        EXPECT_FAIL(json, 1, ZDP_ERR_CONFIG, cases[i].needle);
    }
}

static void test_stage_out_of_range(void **state) {
    (void)state;
    EXPECT_FAIL("{\"train_batch_size\": 8, " OPT_ADAM ", \"zero_optimization\": {\"stage\": 4}}", 1,
                ZDP_ERR_CONFIG,
                "zero_optimization.stage = 4: supported values are 0, 1, 2, 3; set 2 for "
                "optimizer+gradient sharding, 3 to partition the parameters too");
    EXPECT_FAIL("{\"train_batch_size\": 8, " OPT_ADAM ", \"zero_optimization\": {\"stage\": -1}}", 1,
                ZDP_ERR_CONFIG, "zero_optimization.stage = -1: supported values are 0, 1, 2");
}

/* ---- syntax ------------------------------------------------------------ */

static void test_malformed_json_line_column(void **state) {
    (void)state;
    EXPECT_FAIL("{\n  \"train_batch_size\": 8,\n  \"steps_per_print\": ,\n}", 1, ZDP_ERR_FORMAT,
                "t.json:3:22: invalid JSON: ");
    EXPECT_FAIL("{\"train_batch_size\": 8,}", 1, ZDP_ERR_FORMAT, "t.json:1:24: invalid JSON: ");
    EXPECT_FAIL("{\"a\": 1} // comment", 1, ZDP_ERR_FORMAT, "t.json:1:");
    EXPECT_FAIL("", 1, ZDP_ERR_FORMAT, "t.json:1:0: invalid JSON: '[' or '{' expected");
    EXPECT_FAIL("42", 1, ZDP_ERR_FORMAT, "invalid JSON");
    EXPECT_FAIL("{\"train_batch_size\": 99999999999999999999}", 1, ZDP_ERR_FORMAT,
                "too big integer");
    EXPECT_FAIL("{\"gradient_clipping\": 1e400}", 1, ZDP_ERR_FORMAT, "real number overflow");
}

static void test_top_level_must_be_object(void **state) {
    (void)state;
    EXPECT_FAIL("[{\"train_batch_size\": 8}]", 1, ZDP_ERR_CONFIG,
                "t.json: the top level is an array; expected a JSON object");
    EXPECT_FAIL("{}", 1, ZDP_ERR_CONFIG, "optimizer: missing; add");
}

static void test_duplicate_key(void **state) {
    (void)state;
    EXPECT_FAIL("{\"train_batch_size\": 8, " OPT_ADAM ",\n \"zero_optimization\": {\"stage\": 1, "
                "\"stage\": 2}}", 1, ZDP_ERR_CONFIG, "t.json:2:");
    EXPECT_FAIL("{\"train_batch_size\": 8, " OPT_ADAM ",\n \"zero_optimization\": {\"stage\": 1, "
                "\"stage\": 2}}", 1, ZDP_ERR_CONFIG, "duplicate object key near '\"stage\"'");
    EXPECT_FAIL("{\"train_batch_size\": 8, \"train_batch_size\": 16, " OPT_ADAM "}", 1,
                ZDP_ERR_CONFIG, "\"train_batch_size\"");
}

/* ---- unknown keys -------------------------------------------------------- */

static void test_unknown_keys_one_warning(void **state) {
    (void)state;
    zdp_config c;
    EXPECT_OK("{\"train_batch_size\": 8, \"gradient_clipp1ng\": 1, \"foo_bar_baz\": 2,"
              " \"optimizer\": {\"type\": \"AdamW\", \"paramz\": {}, \"params\": {\"lr\": 0.1, "
              "\"bogus_param\": 1}},"
              " \"zero_optimization\": {\"stage\": 2, \"stge\": 2, \"allgather_partitions\": true,"
              "   \"offload_optimizer\": {\"device\": \"none\", \"colour\": 1},"
              "   \"offload_param\": {\"device\": \"none\", \"max_in_cpux\": 1}},"
              " \"fp16\": {\"enabled\": false, \"loss_scale\": 0, \"whatever\": 1}}",
              1, &c);
    assert_int_equal(g_log.n_warn, 1);
    const char *w = g_log.text;
    ASSERT_HAS(w, "t.json: ignoring config keys zdp does not read: ");
    ASSERT_HAS(w, "gradient_clipp1ng (did you mean gradient_clipping?)");
    ASSERT_HAS(w, "foo_bar_baz");
    ASSERT_HAS(w, "optimizer.paramz (did you mean params?)");
    ASSERT_HAS(w, "optimizer.params.bogus_param");
    ASSERT_HAS(w, "zero_optimization.stge (did you mean stage?)");
    ASSERT_HAS(w, "zero_optimization.allgather_partitions (a DeepSpeed key zdp does not use)");
    ASSERT_HAS(w, "zero_optimization.offload_optimizer.colour");
    ASSERT_HAS(w, "zero_optimization.offload_param.max_in_cpux (did you mean max_in_cpu?)");
    assert_null(strstr(w, "fp16"));
    assert_null(strstr(w, "foo_bar_baz (did you mean")); /* nothing within distance 2 */
    assert_int_equal(c.zero.stage, 2);
    assert_true(c.gradient_clipping == 1.0); /* the typo did not set it */
}

static void test_unknown_key_warned_even_when_load_fails(void **state) {
    (void)state;
    /* The typo is why the batch is missing: the warning must still appear. */
    EXPECT_FAIL("{\"train_batch_sizee\": 8, " OPT_ADAM "}", 1, ZDP_ERR_CONFIG, EITHER_);
    assert_int_equal(g_log.n_warn, 1);
    ASSERT_HAS(g_log.text, "train_batch_sizee (did you mean train_batch_size?)");
}

static void test_known_ignored_keys_are_silent(void **state) {
    (void)state;
    zdp_config c;
    EXPECT_OK("{\"train_batch_size\": 8, " OPT_ADAM ", \"wall_clock_breakdown\": false,"
              " \"dump_state\": false, \"tensorboard\": {}, \"csv_monitor\": {}, \"wandb\": {},"
              " \"flops_profiler\": {},"
              " \"zero_force_ds_cpu_optimizer\": false, \"memory_breakdown\": false,"
              " \"amp\": {\"enabled\": false, \"opt_level\": \"O1\"},"
              " \"bf16\": {\"enabled\": false, \"immediate_grad_update\": true},"
              " \"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": \"none\","
              "   \"nvme_path\": null, \"pin_memory\": true, \"buffer_count\": 4, \"ratio\": 1.0,"
              "   \"fast_init\": false}, \"offload_param\": {\"device\": \"none\", \"nvme_path\": \"/x\","
              "   \"pin_memory\": true, \"buffer_count\": 5, \"buffer_size\": 1e8, \"max_in_cpu\": 1e9}}}",
              1, &c);
    assert_int_equal(g_log.n_warn, 0);
}

/* Keys that would change the numbers if honoured are named in the warning. */
static void test_numerics_keys_zdp_ignores_are_warned(void **state) {
    (void)state;
    zdp_config c;
    EXPECT_OK("{\"train_batch_size\": 8, " OPT_ADAM ","
              " \"prescale_gradients\": false,"
              " \"gradient_predivide_factor\": 1.0, \"communication_data_type\": \"fp32\","
              " \"checkpoint\": {}, \"data_types\": {}, \"seed\": 42}",
              1, &c);
    assert_int_equal(g_log.n_warn, 1);
    const char *names[] = {"prescale_gradients", "gradient_predivide_factor",
                           "communication_data_type", "checkpoint", "data_types", "seed"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        assert_non_null(strstr(g_log.text, names[i]));
}

/* ---- coercion and bare-bool zero ------------------------------------------ */

static void test_whole_reals_coerced(void **state) {
    (void)state;
    zdp_config c;
    EXPECT_OK("{\"train_batch_size\": 3.2e1, " OPT_ADAM ", \"zero_optimization\": {\"stage\": 2.0,"
              " \"reduce_bucket_size\": 5e8, \"allgather_bucket_size\": 2e8}}", 2, &c);
    assert_int_equal(c.train_batch_size, 32);
    assert_int_equal(c.micro_batch_size, 16);
    assert_int_equal(c.zero.stage, 2);
    assert_int_equal(c.zero.reduce_bucket_size, 500000000);
    assert_int_equal(c.zero.allgather_bucket_size, 200000000);
    EXPECT_FAIL("{\"train_batch_size\": 8, " OPT_ADAM ", \"zero_optimization\": "
                "{\"reduce_bucket_size\": 1e19}}", 1, ZDP_ERR_CONFIG,
                "zero_optimization.reduce_bucket_size = 1e19: expected a whole number");
}

static void test_bare_bool_zero_optimization(void **state) {
    (void)state;
    zdp_config c;
    EXPECT_OK("{\"train_batch_size\": 8, " OPT_ADAM ", \"zero_optimization\": true}", 1, &c);
    assert_int_equal(c.zero.stage, 1);
    assert_int_equal(g_log.n_warn, 1);
    ASSERT_HAS(g_log.text, "deprecated");
    EXPECT_OK("{\"train_batch_size\": 8, " OPT_ADAM ", \"zero_optimization\": false}", 1, &c);
    assert_int_equal(c.zero.stage, 0);
    assert_int_equal(g_log.n_warn, 2);
}

/* ---- optimizers --------------------------------------------------------- */

static void test_optimizer_adam_params(void **state) {
    (void)state;
    zdp_config c;
    EXPECT_OK("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"adam\", \"params\": {"
              "\"lr\": 0.01, \"betas\": [0.8, 0.99], \"eps\": 1e-6, \"weight_decay\": 0.1,"
              " \"adam_w_mode\": false, \"bias_correction\": false, \"torch_adam\": true,"
              " \"amsgrad\": false}}}", 1, &c);
    assert_int_equal(c.optimizer.type, ZDP_OPTIMIZER_ADAM);
    assert_true(c.optimizer.lr == 0.01);
    assert_true(c.optimizer.beta1 == 0.8 && c.optimizer.beta2 == 0.99);
    assert_true(c.optimizer.eps == 1e-6);
    assert_true(c.optimizer.weight_decay == 0.1);
    assert_false(c.optimizer.adam_w_mode);
    assert_false(c.optimizer.bias_correction);
    assert_int_equal(g_log.n_warn, 0);

    EXPECT_OK("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"ADAM\"}}", 1, &c);
    assert_int_equal(c.optimizer.type, ZDP_OPTIMIZER_ADAM);
    assert_true(c.optimizer.adam_w_mode);

    /* AdamW is always decoupled, whatever adam_w_mode says. */
    EXPECT_OK("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": {"
              "\"lr\": 3e-4, \"adam_w_mode\": false}}}", 1, &c);
    assert_int_equal(c.optimizer.type, ZDP_OPTIMIZER_ADAMW);
    assert_true(c.optimizer.adam_w_mode);
    assert_true(c.optimizer.lr == 3e-4);
    EXPECT_OK("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"adamw\"}}", 1, &c);
    assert_int_equal(c.optimizer.type, ZDP_OPTIMIZER_ADAMW);

    EXPECT_FAIL("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adam\", \"params\": "
                "{\"amsgrad\": true}}}", 1, ZDP_ERR_CONFIG,
                "optimizer.params.amsgrad = true: FusedAdam does not support the AMSGrad variant");
}

static void test_optimizer_sgd_params(void **state) {
    (void)state;
    zdp_config c;
    EXPECT_OK("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"SGD\", \"params\": {"
              "\"lr\": 0.1, \"momentum\": 0.9, \"dampening\": 0, \"weight_decay\": 1e-4,"
              " \"nesterov\": true}}}", 1, &c);
    assert_int_equal(c.optimizer.type, ZDP_OPTIMIZER_SGD);
    assert_true(c.optimizer.lr == 0.1);
    assert_true(c.optimizer.momentum == 0.9);
    assert_true(c.optimizer.dampening == 0.0);
    assert_true(c.optimizer.weight_decay == 1e-4);
    assert_true(c.optimizer.nesterov);

    EXPECT_FAIL("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"SGD\"}}", 1,
                ZDP_ERR_CONFIG, "optimizer.params.lr: missing");
    EXPECT_FAIL("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"SGD\", \"params\": "
                "{\"momentum\": 0.9}}}", 1, ZDP_ERR_CONFIG, "optimizer.params.lr: missing");
    EXPECT_FAIL("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"SGD\", \"params\": "
                "{\"lr\": 0.1, \"nesterov\": true}}}", 1, ZDP_ERR_CONFIG,
                "Nesterov momentum requires a momentum and zero dampening");
    EXPECT_FAIL("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"SGD\", \"params\": "
                "{\"lr\": 0.1, \"momentum\": 0.9, \"dampening\": 0.1, \"nesterov\": true}}}", 1,
                ZDP_ERR_CONFIG, "Nesterov momentum requires a momentum and zero dampening");
    /* torch names are case-sensitive, as in DeepSpeed */
    EXPECT_FAIL("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"sgd\", \"params\": "
                "{\"lr\": 0.1}}}", 1, ZDP_ERR_CONFIG,
                "sgd is not a supported DeepSpeed Optimizer; fix: did you mean \"SGD\"?");
    /* Adam-only params under SGD are unknown keys */
    EXPECT_OK("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"SGD\", \"params\": "
              "{\"lr\": 0.1, \"betas\": [0.9, 0.99]}}}", 1, &c);
    assert_int_equal(g_log.n_warn, 1);
    ASSERT_HAS(g_log.text, "optimizer.params.betas");
}

static void test_optimizer_names(void **state) {
    (void)state;
    static const char *const unimplemented[] = {"Lion", "lamb", "OneBitAdam", "Adagrad", "muon",
                                                "RMSprop"};
    for (size_t i = 0; i < sizeof unimplemented / sizeof unimplemented[0]; i++) {
        char json[256];
        snprintf(json, sizeof json, "{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"%s\"}}",
                 unimplemented[i]);
        EXPECT_FAIL(json, 1, ZDP_ERR_UNSUPPORTED, "not implemented in zdp yet");
        EXPECT_FAIL(json, 1, ZDP_ERR_UNSUPPORTED, "optimizer.type = \"");
    }
    EXPECT_FAIL("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Frobnicator\"}}", 1,
                ZDP_ERR_CONFIG,
                "optimizer.type = \"Frobnicator\": Frobnicator is not a supported DeepSpeed Optimizer");
    EXPECT_FAIL("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adamm\"}}", 1,
                ZDP_ERR_CONFIG, "did you mean \"Adam\"?");
    EXPECT_FAIL("{\"train_batch_size\": 8}", 1, ZDP_ERR_CONFIG,
                "optimizer: missing; add \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-3}}");
}

static void test_max_grad_norm_rejected(void **state) {
    (void)state;
    EXPECT_FAIL("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adam\", \"params\": "
                "{\"max_grad_norm\": 1.0}}}", 1, ZDP_ERR_CONFIG,
                "optimizer.params.max_grad_norm = 1.0: 'max_grad_norm' is not supported as an "
                "optimizer parameter");
    EXPECT_FAIL("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"SGD\", \"params\": "
                "{\"lr\": 0.1, \"max_grad_norm\": 1.0}}}", 1, ZDP_ERR_CONFIG,
                "\"gradient_clipping\"");
}

/* ---- validate rejections, through load ---------------------------------- */

#define BASE_ "\"train_batch_size\": 8, " OPT_ADAM

typedef struct reject_case {
    const char *body;
    zdp_status code;
    const char *needle;
} reject_case;

static const reject_case reject_cases_[] = {
    /* Stage 3's keys: a wrong type or range names the key and the fix. */
    {"\"zero_optimization\": {\"stage\": 3, \"stage3_max_live_parameters\": -1}", ZDP_ERR_CONFIG,
     "zero_optimization.stage3_max_live_parameters"},
    {"\"zero_optimization\": {\"stage\": 3, \"stage3_prefetch_bucket_size\": \"big\"}",
     ZDP_ERR_CONFIG, "zero_optimization.stage3_prefetch_bucket_size"},
    {"\"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 1.5}",
     ZDP_ERR_CONFIG, "zero_optimization.stage3_param_persistence_threshold"},
    {"\"zero_optimization\": {\"stage\": 3, \"stage3_max_reuse_distance\": -5}", ZDP_ERR_CONFIG,
     "zero_optimization.stage3_max_reuse_distance"},
    /* Offload stays rejected at stage 3. */
    {"\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"cpu\"}}",
     ZDP_ERR_UNSUPPORTED, "offload"},
    {"\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}",
     ZDP_ERR_UNSUPPORTED,
     "zero_optimization.offload_optimizer.device = \"cpu\": optimizer offload is not implemented "
     "in zdp; remove the block or set \"device\": \"none\""},
    {"\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"nvme\", "
     "\"nvme_path\": \"/nvme\"}}", ZDP_ERR_UNSUPPORTED,
     "zero_optimization.offload_optimizer.device = \"nvme\""},
    {"\"zero_optimization\": {\"stage\": 2, \"offload_param\": {\"device\": \"nvme\"}}",
     ZDP_ERR_UNSUPPORTED,
     "zero_optimization.offload_param.device = \"nvme\": parameter offload is not implemented in "
     "zdp; remove the block or set \"device\": \"none\""},
    {"\"zero_optimization\": {\"stage\": 2, \"cpu_offload\": true}", ZDP_ERR_UNSUPPORTED,
     "offload_optimizer.device = \"cpu\""},
    {"\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}", ZDP_ERR_CONFIG,
     "bfloat16 and fp16 modes cannot be simultaneously enabled"},
    {"\"fp16\": {\"enabled\": true, \"loss_scale\": 0}", ZDP_ERR_UNSUPPORTED,
     "fp16.enabled = true: fp16 training is not implemented in zdp yet"},
    {"\"bf16\": {\"enabled\": true}", ZDP_ERR_UNSUPPORTED,
     "bf16.enabled = true: bf16 training is not implemented in zdp yet"},
    {"\"bfloat16\": {\"enabled\": true}", ZDP_ERR_UNSUPPORTED, "bf16.enabled = true"},
    {"\"bf16\": {\"enabled\": false}, \"bfloat16\": {\"enabled\": false}", ZDP_ERR_CONFIG,
     "keep only \"bf16\""},
    /* the batch check comes first of all */
    {"\"fp16\": {\"enabled\": true}, \"gradient_accumulation_steps\": 3", ZDP_ERR_CONFIG,
     "8 != 2 * 3 * 1"},
    {"\"managed_gradient_accumulation\": false, \"zero_optimization\": {\"stage\": 0, "
     "\"overlap_comm\": true}", ZDP_ERR_CONFIG,
     "managed_gradient_accumulation=False supports ZeRO overlap_comm only with ZeRO stage 2; "
     "fix: set \"overlap_comm\": false or use \"stage\": 2"},
    {"\"managed_gradient_accumulation\": false, \"zero_optimization\": {\"stage\": 1, "
     "\"overlap_comm\": true}, \"pipeline\": {}", ZDP_ERR_CONFIG,
     "zero_optimization.stage = 1: managed_gradient_accumulation=False supports ZeRO overlap_comm "
     "only with ZeRO stage 2"},
    {"\"managed_gradient_accumulation\": false, \"pipeline\": {\"stages\": 2}, \"amp\": "
     "{\"enabled\": true}", ZDP_ERR_CONFIG,
     "managed_gradient_accumulation=False is not supported with pipeline parallelism"},
    {"\"managed_gradient_accumulation\": false, \"amp\": {\"enabled\": true}", ZDP_ERR_CONFIG,
     "managed_gradient_accumulation=False is not supported with Apex AMP"},
    {"\"amp\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 1}", ZDP_ERR_CONFIG,
     "Amp and ZeRO are not currently compatible"},
    {"\"amp\": {\"enabled\": true}", ZDP_ERR_UNSUPPORTED,
     "amp.enabled = true: Apex AMP is not implemented in zdp"},
    {"\"pipeline\": null", ZDP_ERR_UNSUPPORTED, "pipeline parallelism is not implemented in zdp"},
};

static void test_validate_rejections(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof reject_cases_ / sizeof reject_cases_[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, "{" BASE_ ", %s}", reject_cases_[i].body);
        EXPECT_FAIL(json, 1, reject_cases_[i].code, reject_cases_[i].needle);
    }
}

static void test_sgd_with_zero_needs_untested_flag(void **state) {
    (void)state;
    const char *sgd = "\"train_batch_size\": 8, \"optimizer\": {\"type\": \"SGD\", \"params\": "
                      "{\"lr\": 0.1}}";
    char json[512];
    snprintf(json, sizeof json, "{%s, \"zero_optimization\": {\"stage\": 1}}", sgd);
    EXPECT_FAIL(json, 1, ZDP_ERR_CONFIG, "set \"zero_allow_untested_optimizer\": true");
    EXPECT_FAIL(json, 1, ZDP_ERR_CONFIG, "You are using an untested ZeRO Optimizer");
    zdp_config c;
    snprintf(json, sizeof json, "{%s, \"zero_optimization\": {\"stage\": 2}, "
             "\"zero_allow_untested_optimizer\": true}", sgd);
    EXPECT_OK(json, 1, &c);
    assert_true(c.zero_allow_untested_optimizer);
    snprintf(json, sizeof json, "{%s, \"zero_optimization\": {\"stage\": 0}}", sgd);
    EXPECT_OK(json, 1, &c);
}

static void test_unmanaged_accepts_disabled_offload_blocks(void **state) {
    (void)state;
    zdp_config c;
    EXPECT_OK("{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 4,"
              " \"managed_gradient_accumulation\": false, " OPT_ADAM ","
              " \"zero_optimization\": {\"stage\": 2, \"overlap_comm\": true,"
              "   \"offload_optimizer\": {\"device\": \"none\"},"
              "   \"offload_param\": {\"device\": \"none\"}}}", 2, &c);
    assert_false(c.managed_gradient_accumulation);
    assert_int_equal(c.zero.stage, 2);
    assert_true(c.zero.overlap_comm);
    assert_int_equal(c.zero.offload_optimizer, ZDP_OFFLOAD_NONE);
    assert_int_equal(c.zero.offload_param, ZDP_OFFLOAD_NONE);
    assert_int_equal(c.train_batch_size, 8);
    assert_int_equal(g_log.n_warn, 0);
    /* a block without "device" is "none" too */
    EXPECT_OK("{\"train_batch_size\": 8, " OPT_ADAM ", \"managed_gradient_accumulation\": false,"
              " \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {}}}", 1, &c);
    assert_int_equal(c.zero.offload_optimizer, ZDP_OFFLOAD_NONE);
}

/* ---- validate on hand-built structs ------------------------------------- */

static void hand_built_(zdp_config *c) {
    zdp_config_default(c);
    c->world_size = 2;
    c->train_batch_size = 16;
    c->micro_batch_size = 4;
    c->gradient_accumulation_steps = 2;
}

static void expect_validate_(const zdp_config *c, zdp_status code, const char *needle,
                             const char *file, int line) {
    zdp_error err;
    memset(&err, 0, sizeof err);
    zdp_status st = zdp_config_validate(c, &err);
    if (st != code) {
        print_error("%s:%d: validate gave %s (%s), expected %s\n", file, line,
                    zdp_status_name(st), err.msg, zdp_status_name(code));
        fail();
    }
    if (needle != NULL) assert_has_(err.msg, needle, file, line);
}
#define EXPECT_VALIDATE(c, code, needle) expect_validate_((c), (code), (needle), __FILE__, __LINE__)

static void test_validate_hand_built(void **state) {
    (void)state;
    zdp_config c;
    hand_built_(&c);
    EXPECT_VALIDATE(&c, ZDP_OK, NULL);
    EXPECT_VALIDATE(NULL, ZDP_ERR_INVALID_ARG, "NULL");

    /* Hyperparameters held to zdp_hparams_check's ranges in hand-built
     * structs too, scheduler included. */
    hand_built_(&c);
    c.optimizer.lr = 1e308;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "optimizer.params.lr = 1e+308: must be a number in [0, 100]");
    hand_built_(&c);
    c.optimizer.weight_decay = NAN;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "optimizer.params.weight_decay = nan");
    hand_built_(&c);
    c.scheduler.type = ZDP_SCHEDULER_WARMUP_DECAY_LR;
    c.scheduler.warmup_max_lr = 1e-3;
    c.scheduler.warmup_num_steps = 10;
    c.scheduler.total_num_steps = 100;
    EXPECT_VALIDATE(&c, ZDP_OK, NULL);
    c.scheduler.warmup_min_lr = INFINITY;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "scheduler.params.warmup_min_lr = inf: must be a number in [0, 100]");
    c.scheduler.warmup_min_lr = 0.0;
    c.scheduler.total_num_steps = 0;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "scheduler.params.total_num_steps = 0: must be an integer in [1, 1e12]");
    c.scheduler.total_num_steps = 100;
    c.scheduler.cos_min_ratio = NAN;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "scheduler.params.cos_min_ratio = nan");
    hand_built_(&c);
    c.world_size = 0;
    EXPECT_VALIDATE(&c, ZDP_ERR_INVALID_ARG, "world_size = 0: must be >= 1");
    hand_built_(&c);
    c.train_batch_size = 0;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "Train batch size: 0 has to be greater than 0");
    hand_built_(&c);
    c.micro_batch_size = -1;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "Micro batch size per gpu: -1 has to be greater than 0");
    hand_built_(&c);
    c.gradient_accumulation_steps = 0;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, GAS0_);
    hand_built_(&c);
    c.world_size = 3;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, CHECK4_ "16 != 4 * 2 * 3");
    hand_built_(&c);
    c.micro_batch_size = INT64_MAX / 2;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "overflows");

    hand_built_(&c);
    c.zero.stage = 7;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "zero_optimization.stage = 7: supported values are 0, 1, 2");
    hand_built_(&c);
    c.zero.stage = 3;
    c.zero.stage3_max_live_parameters = -2;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "zero_optimization.stage3_max_live_parameters = -2: must be >= 0");
    hand_built_(&c);
    c.zero.allgather_bucket_size = 3;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "multiple of nccl_start_alignment_factor, 2");
    hand_built_(&c);
    c.zero.reduce_bucket_size = 0;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "zero_optimization.reduce_bucket_size = 0");
    hand_built_(&c);
    c.gradient_clipping = -0.5;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "gradient_clipping = -0.5");
    hand_built_(&c);
    c.optimizer.beta2 = 1.0;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "optimizer.params.betas = [0.9, 1]");
    hand_built_(&c);
    c.optimizer.type = ZDP_OPTIMIZER_SGD;
    c.optimizer.nesterov = true;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "Nesterov momentum requires a momentum and zero dampening");
    hand_built_(&c);
    c.optimizer.type = ZDP_OPTIMIZER_SGD;
    c.zero.stage = 2;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "zero_allow_untested_optimizer");
    hand_built_(&c);
    c.zero.offload_param = ZDP_OFFLOAD_CPU;
    EXPECT_VALIDATE(&c, ZDP_ERR_UNSUPPORTED, "offload_param.device = \"cpu\"");
    hand_built_(&c);
    c.managed_gradient_accumulation = false;
    c.zero.overlap_comm = true;
    c.zero.stage = 1;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "overlap_comm only with ZeRO stage 2");
    c.zero.stage = 2;
    EXPECT_VALIDATE(&c, ZDP_OK, NULL);
    c.has_pipeline = true;
    EXPECT_VALIDATE(&c, ZDP_ERR_CONFIG, "not supported with pipeline parallelism");
    hand_built_(&c);
    c.has_pipeline = true;
    EXPECT_VALIDATE(&c, ZDP_ERR_UNSUPPORTED, "pipeline parallelism is not implemented in zdp");
    /* validate accepts what load produced */
    zdp_error err;
    assert_int_equal(load_("{\"train_batch_size\": 12, " OPT_ADAM "}", 3, &c, &err), ZDP_OK);
    EXPECT_VALIDATE(&c, ZDP_OK, NULL);
}

/* ---- files and bad arguments -------------------------------------------- */

static void write_file_(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

/* A config built by hand: derivation and validation, *cfg untouched on error. */
static void test_finalize_hand_built(void **state) {
    (void)state;
    zdp_config cfg;
    zdp_error err;
    zdp_config_default(&cfg);
    cfg.train_batch_size = 32;
    cfg.micro_batch_size = 4;
    assert_int_equal(zdp_config_finalize(&cfg, 2, &err), ZDP_OK);
    assert_int_equal(cfg.gradient_accumulation_steps, 4);
    assert_int_equal(cfg.world_size, 2);
    zdp_config_default(&cfg);
    cfg.train_batch_size = 30;
    cfg.micro_batch_size = 4;
    assert_int_equal(zdp_config_finalize(&cfg, 2, &err), ZDP_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "30 != 4 * 3 * 2"));
    assert_int_equal(cfg.gradient_accumulation_steps, 0);
    assert_int_equal(cfg.world_size, 1);
    assert_int_equal(zdp_config_finalize(&cfg, 0, &err), ZDP_ERR_INVALID_ARG);
}

static void test_load_file(void **state) {
    (void)state;
    char path[] = "/tmp/zdp_test_config_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    zdp_config c;
    zdp_error err;

    write_file_(path, "{\n  \"train_micro_batch_size_per_gpu\": 2,\n  \"gradient_accumulation_steps\": 2,\n"
                      "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}},\n"
                      "  \"zero_optimization\": {\"stage\": 2}\n}\n");
    assert_int_equal(zdp_config_load_file(path, 2, &c, &err), ZDP_OK);
    assert_int_equal(c.train_batch_size, 8);
    assert_int_equal(c.zero.stage, 2);
    assert_int_equal(c.optimizer.type, ZDP_OPTIMIZER_ADAMW);

    write_file_(path, "{\n  \"train_batch_size\": 8,\n  \"optimizer\": {\"type\": \"Adam\"},\n}\n");
    assert_int_equal(zdp_config_load_file(path, 1, &c, &err), ZDP_ERR_FORMAT);
    char want[128];
    snprintf(want, sizeof want, "%s:4:1: invalid JSON: ", path);
    ASSERT_HAS(err.msg, want);
    /* a failed load leaves the defaults, never half a config */
    assert_int_equal(c.train_batch_size, 0);

    write_file_(path, "");
    assert_int_equal(zdp_config_load_file(path, 1, &c, &err), ZDP_ERR_FORMAT);
    ASSERT_HAS(err.msg, path);

    assert_int_equal(unlink(path), 0);
    assert_int_equal(zdp_config_load_file(path, 1, &c, &err), ZDP_ERR_IO);
    ASSERT_HAS(err.msg, path);
    ASSERT_HAS(err.msg, "No such file or directory");

    assert_int_equal(zdp_config_load_file("/tmp", 1, &c, &err), ZDP_ERR_IO);
    ASSERT_HAS(err.msg, "/tmp: read failed: Is a directory");
    assert_int_equal(zdp_config_load_file(NULL, 1, &c, &err), ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_config_load_file(NULL, 1, &c, NULL), ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_config_load_file("/nonexistent/x.json", 1, NULL, &err), ZDP_ERR_INVALID_ARG);
}

static void test_bad_arguments(void **state) {
    (void)state;
    zdp_config c;
    zdp_error err;
    assert_int_equal(zdp_config_load_string(NULL, NULL, 1, &c, &err), ZDP_ERR_INVALID_ARG);
    ASSERT_HAS(err.msg, "<string>");
    assert_int_equal(zdp_config_load_string("{}", "x", 1, NULL, &err), ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_config_load_string("{\"train_batch_size\": 8}", NULL, -3, &c, NULL),
                     ZDP_ERR_INVALID_ARG);
    zdp_config_default(NULL); /* no crash */
    /* success clears the error record */
    assert_int_equal(zdp_config_load_string("{" BASE_ "}", NULL, 1, &c, &err), ZDP_OK);
    assert_int_equal(err.code, ZDP_OK);
    assert_string_equal(err.msg, "");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_defaults, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_world_size_recorded, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_batch_derivation_table, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_batch_messages_name_derived_values, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_batch_present_keys_must_be_positive_integers, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_type_errors_name_json_path, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_optimizer_type_errors, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_stage_out_of_range, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_malformed_json_line_column, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_top_level_must_be_object, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_duplicate_key, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_unknown_keys_one_warning, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_unknown_key_warned_even_when_load_fails, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_known_ignored_keys_are_silent, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_numerics_keys_zdp_ignores_are_warned, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_whole_reals_coerced, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_bare_bool_zero_optimization, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_optimizer_adam_params, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_optimizer_sgd_params, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_optimizer_names, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_max_grad_norm_rejected, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_validate_rejections, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_sgd_with_zero_needs_untested_flag, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_unmanaged_accepts_disabled_offload_blocks, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_validate_hand_built, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_finalize_hand_built, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_load_file, setup_, teardown_),
        cmocka_unit_test_setup_teardown(test_bad_arguments, setup_, teardown_),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
