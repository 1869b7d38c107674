/*
 * test_gpt_io.c -- unit tests for src/io/gpt_io.c (GPT-2 weight files).
 *
 * A tiny GPT-2 (L 2, NH 2, C 4, V 11, T 5) whose parameter list is written
 * out here from zdp.h's comment, independently of src/models.  Covered: the
 * safetensors save/load round trip; a file in the original gpt2 layout (no
 * "transformer." prefix, attn.bias / attn.masked_bias buffers, a tied
 * lm_head); F16 and BF16 conversion; llm.c checkpoints built byte by byte
 * (fp32 and bf16, padded vocab, (out, in) weights) with every value checked
 * against the transposes; and every mismatch: the error must name the tensor
 * and leave the destination untouched.  Files live in a mkdtemp directory
 * that teardown removes.
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/unit_io.h"
#include "zdp/zdp.h"

/* ---- fixtures -------------------------------------------------------------- */

static void quiet_log(int level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

static int group_setup(void **state) {
    (void)state;
    zdp_set_log(quiet_log, NULL);
    return tmpdir_make(g_dir, sizeof g_dir, "gptio");
}

static int group_teardown(void **state) {
    (void)state;
    zdp_set_log(NULL, NULL);
    return tmpdir_remove(g_dir);
}

/* ---- the tiny model, listed from zdp.h ------------------------------------- */

enum { L = 2, NH = 2, C = 4, V = 11, T = 5, VP = 16 };
#define NPARAMS (4 + 12 * L)

static const zdp_gpt_config k_cfg = {.n_layer = L, .n_head = NH, .n_embd = C,
                                     .vocab_size = V, .block_size = T};

typedef struct model_ {
    zdp_param_info info[NPARAMS];
    char names[NPARAMS][96];
    float *data[NPARAMS];
    int64_t numel[NPARAMS];
} model_;

static void add_(model_ *m, int *k, const char *name, int64_t d0, int64_t d1) {
    snprintf(m->names[*k], sizeof m->names[*k], "%s", name);
    m->info[*k].name = m->names[*k];
    m->info[*k].ndim = d1 ? 2 : 1;
    m->info[*k].shape[0] = d0;
    m->info[*k].shape[1] = d1;
    m->numel[*k] = d0 * (d1 ? d1 : 1);
    m->data[*k] = calloc((size_t)m->numel[*k], sizeof(float));
    assert_non_null(m->data[*k]);
    (*k)++;
}

/* zdp.h's list: wte [V, C], wpe [T, C], per layer the 12 tensors, ln_f. */
static void model_init(model_ *m) {
    memset(m, 0, sizeof *m);
    int k = 0;
    char n[96];
    add_(m, &k, "transformer.wte.weight", V, C);
    add_(m, &k, "transformer.wpe.weight", T, C);
    for (int l = 0; l < L; l++) {
#define LAYER_(suffix, d0, d1)                                                      \
    snprintf(n, sizeof n, "transformer.h.%d." suffix, l);                           \
    add_(m, &k, n, d0, d1)
        LAYER_("ln_1.weight", C, 0);
        LAYER_("ln_1.bias", C, 0);
        LAYER_("attn.c_attn.weight", C, 3 * C);
        LAYER_("attn.c_attn.bias", 3 * C, 0);
        LAYER_("attn.c_proj.weight", C, C);
        LAYER_("attn.c_proj.bias", C, 0);
        LAYER_("ln_2.weight", C, 0);
        LAYER_("ln_2.bias", C, 0);
        LAYER_("mlp.c_fc.weight", C, 4 * C);
        LAYER_("mlp.c_fc.bias", 4 * C, 0);
        LAYER_("mlp.c_proj.weight", 4 * C, C);
        LAYER_("mlp.c_proj.bias", C, 0);
#undef LAYER_
    }
    add_(m, &k, "transformer.ln_f.weight", C, 0);
    add_(m, &k, "transformer.ln_f.bias", C, 0);
    assert_int_equal(k, NPARAMS);
}

static void model_free(model_ *m) {
    for (int i = 0; i < NPARAMS; i++) free(m->data[i]);
}

static int model_find(const model_ *m, const char *name) {
    for (int i = 0; i < NPARAMS; i++)
        if (strcmp(m->names[i], name) == 0) return i;
    fail_msg("no tensor %s", name);
    return -1;
}

/* Distinct values, exact in F16 and BF16: (i*97 + e) % 200 * 0.25 - 25. */
static float val_(int i, int64_t e) {
    return (float)((i * 97 + e) % 200) * 0.25f - 25.0f;
}

static void model_fill(model_ *m, float bias) {
    for (int i = 0; i < NPARAMS; i++)
        for (int64_t e = 0; e < m->numel[i]; e++) m->data[i][e] = val_(i, e) + bias;
}

static void model_fill_const(model_ *m, float x) {
    for (int i = 0; i < NPARAMS; i++)
        for (int64_t e = 0; e < m->numel[i]; e++) m->data[i][e] = x;
}

static void assert_model_const(const model_ *m, float x) {
    for (int i = 0; i < NPARAMS; i++)
        for (int64_t e = 0; e < m->numel[i]; e++)
            if (m->data[i][e] != x) fail_msg("%s[%lld] was written", m->names[i], (long long)e);
}

static void assert_models_equal(const model_ *a, const model_ *b) {
    for (int i = 0; i < NPARAMS; i++)
        if (memcmp(a->data[i], b->data[i], (size_t)a->numel[i] * sizeof(float)) != 0)
            fail_msg("tensor %s differs", a->names[i]);
}

static zdp_status load(const char *path, model_ *m, zdp_error *e) {
    return zdp_gpt_weights_load(path, &k_cfg, m->info, NPARAMS, m->data, e);
}

/* ---- building safetensors files from the model ------------------------------ */

enum { ST_MAX = NPARAMS + 8 };

typedef struct stfile_ {
    zdp_tensor t[ST_MAX];
    char names[ST_MAX][96];
    void *owned[ST_MAX];
    int n;
} stfile_;

/* The model's tensors as F32, with or without the "transformer." prefix. */
static void st_from_model(stfile_ *f, const model_ *m, bool prefix) {
    memset(f, 0, sizeof *f);
    for (int i = 0; i < NPARAMS; i++) {
        const char *n = m->names[i];
        snprintf(f->names[i], sizeof f->names[i], "%s", prefix ? n : n + strlen("transformer."));
        f->t[i].name = f->names[i];
        f->t[i].dtype = ZDP_DTYPE_F32;
        f->t[i].ndim = m->info[i].ndim;
        memcpy(f->t[i].shape, m->info[i].shape, sizeof f->t[i].shape);
        f->t[i].data = m->data[i];
        f->t[i].nbytes = (size_t)m->numel[i] * sizeof(float);
    }
    f->n = NPARAMS;
}

/* Appends a tensor of the given dtype and shape, data zero-filled (owned). */
static zdp_tensor *st_add(stfile_ *f, const char *name, zdp_dtype dt, int ndim,
                          const int64_t *shape) {
    assert_true(f->n < ST_MAX);
    zdp_tensor *t = &f->t[f->n];
    snprintf(f->names[f->n], sizeof f->names[f->n], "%s", name);
    t->name = f->names[f->n];
    t->dtype = dt;
    t->ndim = ndim;
    size_t n = 1;
    for (int d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        n *= (size_t)shape[d];
    }
    t->nbytes = n * zdp_dtype_size(dt);
    f->owned[f->n] = t->data = calloc(n ? n : 1, zdp_dtype_size(dt));
    f->n++;
    return t;
}

static void st_remove(stfile_ *f, const char *name) {
    for (int i = 0; i < f->n; i++) {
        if (strcmp(f->t[i].name, name) != 0) continue;
        free(f->owned[i]);
        for (int j = i; j + 1 < f->n; j++) {
            f->t[j] = f->t[j + 1];
            memcpy(f->names[j], f->names[j + 1], sizeof f->names[j]);
            f->t[j].name = f->names[j];
            f->owned[j] = f->owned[j + 1];
        }
        f->n--;
        return;
    }
    fail_msg("no tensor %s to remove", name);
}

static zdp_tensor *st_get(stfile_ *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    fail_msg("no tensor %s", name);
    return NULL;
}

static void st_write(stfile_ *f, const char *path) {
    zdp_error e = {0};
    zdp_status s = zdp_safetensors_write(path, f->t, f->n, &e);
    if (s != ZDP_OK) fail_msg("%s", e.msg);
}

static void st_free(stfile_ *f) {
    for (int i = 0; i < f->n; i++) free(f->owned[i]);
}

/* ---- round trips ----------------------------------------------------------- */

static void test_save_load_round_trip(void **state) {
    (void)state;
    model_ a, b;
    model_init(&a);
    model_init(&b);
    model_fill(&a, 0.125f);
    zdp_error e = {0};
    const char *p = path_in("rt.safetensors");
    assert_int_equal(zdp_gpt_weights_save(p, a.info, NPARAMS, (const float *const *)a.data, &e),
                     ZDP_OK);

    /* The file is a plain state dict: our names, F32, in order, no lm_head. */
    zdp_safetensors st;
    assert_int_equal(zdp_safetensors_read(p, &st, &e), ZDP_OK);
    assert_int_equal(st.n, NPARAMS);
    for (int i = 0; i < NPARAMS; i++) {
        assert_string_equal(st.tensors[i].name, a.names[i]);
        assert_int_equal(st.tensors[i].dtype, ZDP_DTYPE_F32);
    }
    assert_null(zdp_safetensors_find(&st, "lm_head.weight"));
    zdp_safetensors_free(&st);

    assert_int_equal(load(p, &b, &e), ZDP_OK);
    assert_models_equal(&a, &b);

    /* Params in another order load by name. */
    model_ c;
    model_init(&c);
    zdp_param_info info[NPARAMS];
    float *views[NPARAMS];
    for (int i = 0; i < NPARAMS; i++) {
        info[i] = c.info[NPARAMS - 1 - i];
        views[i] = c.data[NPARAMS - 1 - i];
    }
    assert_int_equal(zdp_gpt_weights_load(p, &k_cfg, info, NPARAMS, views, &e), ZDP_OK);
    assert_models_equal(&a, &c);
    model_free(&a);
    model_free(&b);
    model_free(&c);
}

/* The original gpt2 layout: no prefix, mask buffers, a tied lm_head. */
static void test_load_without_prefix(void **state) {
    (void)state;
    model_ a, b;
    model_init(&a);
    model_init(&b);
    model_fill(&a, 0.0f);
    stfile_ f;
    st_from_model(&f, &a, false);
    for (int l = 0; l < L; l++) {
        char n[64];
        snprintf(n, sizeof n, "h.%d.attn.bias", l);
        int64_t mask[4] = {1, 1, T, T};
        st_add(&f, n, ZDP_DTYPE_F32, 4, mask);
        snprintf(n, sizeof n, "h.%d.attn.masked_bias", l);
        st_add(&f, n, ZDP_DTYPE_F32, 0, NULL);
    }
    zdp_tensor *head = st_add(&f, "lm_head.weight", ZDP_DTYPE_F32, 2, a.info[0].shape);
    memcpy(head->data, a.data[0], head->nbytes);
    const char *p = path_in("noprefix.safetensors");
    st_write(&f, p);
    zdp_error e = {0};
    assert_int_equal(load(p, &b, &e), ZDP_OK);
    assert_models_equal(&a, &b);

    /* An untied head is refused, naming it. */
    ((float *)head->data)[3] += 1.0f;
    st_write(&f, p);
    model_fill_const(&b, 7.0f);
    assert_int_equal(load(p, &b, &e), ZDP_ERR_UNSUPPORTED);
    ASSERT_MSG_HAS(e, "lm_head.weight");
    ASSERT_MSG_HAS(e, "element 3");
    assert_model_const(&b, 7.0f);
    st_free(&f);
    model_free(&a);
    model_free(&b);
}

static uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)(u >> 16); /* exact for the test's values */
}

static uint16_t to_f16(float x) { /* normal values exact in half only */
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) == 0) return (uint16_t)(u >> 16);
    uint32_t exp = (u >> 23) & 0xff;
    return (uint16_t)(((u >> 16) & 0x8000u) | ((exp - 112u) << 10) | ((u >> 13) & 0x3ffu));
}

static void test_load_f16_bf16(void **state) {
    (void)state;
    model_ a, b;
    model_init(&a);
    model_init(&b);
    model_fill(&a, 0.0f);
    stfile_ f;
    memset(&f, 0, sizeof f);
    for (int i = 0; i < NPARAMS; i++) {
        zdp_dtype dt = i % 2 ? ZDP_DTYPE_F16 : ZDP_DTYPE_BF16;
        zdp_tensor *t = st_add(&f, a.names[i], dt, a.info[i].ndim, a.info[i].shape);
        uint16_t *h = t->data;
        for (int64_t k = 0; k < a.numel[i]; k++)
            h[k] = dt == ZDP_DTYPE_F16 ? to_f16(a.data[i][k]) : to_bf16(a.data[i][k]);
    }
    /* Half specials in wpe (index 1, F16): the smallest subnormal, -0, inf
     * (then the largest finite half). */
    uint16_t *wpe = f.t[1].data;
    wpe[0] = 0x0001;
    wpe[1] = 0x8000;
    wpe[2] = 0x7c00;
    wpe[3] = 0x83ff; /* largest negative subnormal: -1023 * 2^-24 */
    a.data[1][0] = ldexpf(1.0f, -24);
    a.data[1][1] = -0.0f;
    a.data[1][2] = INFINITY;
    a.data[1][3] = -1023.0f * ldexpf(1.0f, -24);
    const char *p = path_in("half.safetensors");
    st_write(&f, p);
    zdp_error e = {0};
    /* Inf converts to inf, and a non-finite weight is refused at load,
     * naming the tensor, the element and the value. */
    assert_int_equal(load(p, &b, &e), ZDP_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "[0, 2] = inf: weights must be finite"));
    assert_non_null(strstr(e.msg, b.info[1].name));
    /* The largest finite half instead: everything else converts exactly. */
    wpe[2] = 0x7bff;
    a.data[1][2] = 65504.0f;
    st_write(&f, p);
    assert_int_equal(load(p, &b, &e), ZDP_OK);
    assert_models_equal(&a, &b);
    st_free(&f);
    model_free(&a);
    model_free(&b);
}

/* ---- llm.c checkpoints ----------------------------------------------------- */

/* llm.c's 16 tensors: (rows, cols) per slice and whether per layer. */
static const struct {
    int rows, cols, per_layer;
} k_llmc[16] = {
    {VP, C, 0},    {T, C, 0},     {C, 1, 1}, {C, 1, 1}, {3 * C, C, 1}, {3 * C, 1, 1},
    {C, C, 1},     {C, 1, 1},     {C, 1, 1}, {C, 1, 1}, {4 * C, C, 1}, {4 * C, 1, 1},
    {C, 4 * C, 1}, {C, 1, 1},     {C, 1, 0}, {C, 1, 0},
};

/* The value llm.c's file holds at global element g (after the header). */
static float llmc_val(int64_t g, bool bf16) {
    return bf16 ? (float)(g % 251) - 125.0f : (float)g * 0.5f;
}

/* Writes an llm.c checkpoint for the tiny model; hdr overrides (index, value)
 * pairs, extra adds (or with a negative count removes) trailing bytes. */
static void write_llmc(const char *path, int version, const int *overrides, int n_over,
                       long extra) {
    int32_t hd[256] = {20240326, version, T, V, L, NH, C, VP};
    for (int i = 0; i < n_over; i++) hd[overrides[2 * i]] = overrides[2 * i + 1];
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(hd, 4, 256, f), 256);
    bool bf16 = version == 5;
    int64_t g = 0, total = 0;
    for (int t = 0; t < 16; t++)
        total += (int64_t)k_llmc[t].rows * k_llmc[t].cols * (k_llmc[t].per_layer ? L : 1);
    if (extra < 0) total += extra;
    for (; g < total; g++) {
        float x = llmc_val(g, bf16);
        if (bf16) {
            uint16_t h = to_bf16(x);
            assert_int_equal(fwrite(&h, 2, 1, f), 1);
        } else {
            assert_int_equal(fwrite(&x, 4, 1, f), 1);
        }
    }
    for (long i = 0; i < extra; i++) fputc(0, f);
    assert_int_equal(fclose(f), 0);
}

static void check_llmc_values(const model_ *m, bool bf16) {
    static const char *const names[16] = {
        "wte.weight",         "wpe.weight",         "ln_1.weight",      "ln_1.bias",
        "attn.c_attn.weight", "attn.c_attn.bias",   "attn.c_proj.weight", "attn.c_proj.bias",
        "ln_2.weight",        "ln_2.bias",          "mlp.c_fc.weight",  "mlp.c_fc.bias",
        "mlp.c_proj.weight",  "mlp.c_proj.bias",    "ln_f.weight",      "ln_f.bias"};
    int64_t g = 0;
    int checked = 0;
    for (int t = 0; t < 16; t++) {
        int rows = k_llmc[t].rows, cols = k_llmc[t].cols;
        for (int l = 0; l < (k_llmc[t].per_layer ? L : 1); l++) {
            char n[96];
            if (k_llmc[t].per_layer)
                snprintf(n, sizeof n, "transformer.h.%d.%s", l, names[t]);
            else
                snprintf(n, sizeof n, "transformer.%s", names[t]);
            const float *d = m->data[model_find(m, n)];
            checked++;
            for (int r = 0; r < rows; r++) {
                for (int c = 0; c < cols; c++, g++) {
                    float want = llmc_val(g, bf16);
                    if (t == 0 && r >= V) continue; /* padded vocab row: dropped */
                    /* Matrices (cols > 1) other than wte/wpe are (out, in) in
                     * llm.c and [in, out] in zdp. */
                    bool tr = cols > 1 && t >= 2;
                    float got = tr ? d[(int64_t)c * rows + r] : d[(int64_t)r * cols + c];
                    if (got != want)
                        fail_msg("%s (llm.c %d, row %d col %d): got %g, want %g", n, t, r, c,
                                 (double)got, (double)want);
                }
            }
        }
    }
    assert_int_equal(checked, NPARAMS);
}

static void test_llmc_fp32(void **state) {
    (void)state;
    model_ m;
    model_init(&m);
    const char *p = path_in("gpt2_tiny.bin");
    write_llmc(p, 3, NULL, 0, 0);
    zdp_error e = {0};
    assert_int_equal(load(p, &m, &e), ZDP_OK);
    check_llmc_values(&m, false);
    model_free(&m);
}

static void test_llmc_bf16(void **state) {
    (void)state;
    model_ m;
    model_init(&m);
    const char *p = path_in("gpt2_tiny_bf16.bin");
    write_llmc(p, 5, NULL, 0, 0);
    zdp_error e = {0};
    assert_int_equal(load(p, &m, &e), ZDP_OK);
    check_llmc_values(&m, true);
    model_free(&m);
}

static void test_llmc_errors(void **state) {
    (void)state;
    model_ m;
    model_init(&m);
    model_fill_const(&m, 3.0f);
    const char *p = path_in("bad.bin");
    zdp_error e;
    static const struct {
        int ov[4]; /* header (index, value) pairs; index 0 = unused */
        zdp_status code;
        const char *has[3];
    } cases[] = {
        {{3, 50257, 7, 50304}, ZDP_ERR_CONFIG, {"wte", "[50257, 4]", "[11, 4]"}},
        {{6, 8}, ZDP_ERR_CONFIG, {"wte", "n_embd = 8", "[11, 4]"}},
        {{2, 1024}, ZDP_ERR_CONFIG, {"wpe", "[1024, 4]", "[5, 4]"}},
        {{4, 12}, ZDP_ERR_CONFIG, {"ln1w", "n_layer = 12", "L = 12"}},
        {{5, 4}, ZDP_ERR_CONFIG, {"qkvw", "n_head = 4", "NH = 4"}},
        {{1, 4}, ZDP_ERR_UNSUPPORTED, {"version 4", "3 (fp32)", "5 (bf16)"}},
        {{7, 8}, ZDP_ERR_FORMAT, {"Vp = 8", "corrupt", "maxT"}},
        {{5, 3}, ZDP_ERR_FORMAT, {"NH = 3", "corrupt", "NH divides C"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_llmc(p, 3, cases[i].ov, cases[i].ov[2] ? 2 : 1, 0);
        memset(&e, 0, sizeof e);
        zdp_status s = load(p, &m, &e);
        if (s != cases[i].code)
            fail_msg("case %zu: %s, want %s: %s", i, zdp_status_name(s),
                     zdp_status_name(cases[i].code), e.msg);
        ASSERT_MSG_HAS(e, p);
        for (int k = 0; k < 3; k++) ASSERT_MSG_HAS(e, cases[i].has[k]);
    }
    /* Truncated and over-long files. */
    write_llmc(p, 3, NULL, 0, -1);
    assert_int_equal(load(p, &m, &e), ZDP_ERR_FORMAT);
    ASSERT_MSG_HAS(e, "truncated");
    write_llmc(p, 3, NULL, 0, 4);
    assert_int_equal(load(p, &m, &e), ZDP_ERR_FORMAT);
    ASSERT_MSG_HAS(e, "extra bytes");
    /* Just the magic. */
    FILE *f = fopen(p, "wb");
    int32_t magic = 20240326;
    fwrite(&magic, 4, 1, f);
    fclose(f);
    assert_int_equal(load(p, &m, &e), ZDP_ERR_FORMAT);
    ASSERT_MSG_HAS(e, "1024-byte header");
    assert_model_const(&m, 3.0f);
    model_free(&m);
}

/* ---- safetensors mismatches ------------------------------------------------ */

typedef void (*mutate_fn)(stfile_ *f);

static void mut_vocab(stfile_ *f) {
    st_remove(f, "transformer.wte.weight");
    int64_t s[2] = {50257, C};
    st_add(f, "transformer.wte.weight", ZDP_DTYPE_F32, 2, s);
}
static void mut_block(stfile_ *f) {
    st_remove(f, "transformer.wpe.weight");
    int64_t s[2] = {1024, C};
    st_add(f, "transformer.wpe.weight", ZDP_DTYPE_F32, 2, s);
}
static void mut_missing(stfile_ *f) {
    st_remove(f, "transformer.h.1.mlp.c_fc.bias");
}
static void mut_extra(stfile_ *f) {
    int64_t s[1] = {C};
    st_add(f, "transformer.h.0.attn.q_norm.weight", ZDP_DTYPE_F32, 1, s);
}
static void mut_linear(stfile_ *f) {
    st_remove(f, "transformer.h.0.attn.c_attn.weight");
    int64_t s[2] = {3 * C, C};
    st_add(f, "transformer.h.0.attn.c_attn.weight", ZDP_DTYPE_F32, 2, s);
}
static void mut_shape(stfile_ *f) {
    st_remove(f, "transformer.h.1.ln_2.bias");
    int64_t s[1] = {C + 1};
    st_add(f, "transformer.h.1.ln_2.bias", ZDP_DTYPE_F32, 1, s);
}
static void mut_dtype(stfile_ *f) {
    zdp_tensor *t = st_get(f, "transformer.ln_f.bias");
    t->dtype = ZDP_DTYPE_I32; /* same size as F32 */
}
static void mut_more_layers(stfile_ *f) {
    int64_t s[1] = {C};
    st_add(f, "transformer.h.2.ln_1.weight", ZDP_DTYPE_F32, 1, s);
}
static void mut_fewer_layers(stfile_ *f) {
    static const char *const sfx[] = {
        "ln_1.weight",       "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",       "ln_2.bias",
        "mlp.c_fc.weight",   "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
    for (int i = 0; i < 12; i++) {
        char n[96];
        snprintf(n, sizeof n, "transformer.h.1.%s", sfx[i]);
        st_remove(f, n);
    }
}
static void mut_both_spellings(stfile_ *f) {
    int64_t s[1] = {C};
    st_add(f, "ln_f.weight", ZDP_DTYPE_F32, 1, s);
}
static void mut_head_shape(stfile_ *f) {
    int64_t s[2] = {V + 1, C};
    st_add(f, "lm_head.weight", ZDP_DTYPE_F32, 2, s);
}

static void test_safetensors_mismatches(void **state) {
    (void)state;
    static const struct {
        const char *what;
        mutate_fn fn;
        zdp_status code;
        const char *has[3];
    } cases[] = {
        {"vocab", mut_vocab, ZDP_ERR_CONFIG, {"transformer.wte.weight", "[50257, 4]", "[11, 4]"}},
        {"block", mut_block, ZDP_ERR_CONFIG, {"transformer.wpe.weight", "[1024, 4]", "block_size"}},
        {"missing", mut_missing, ZDP_ERR_FORMAT, {"transformer.h.1.mlp.c_fc.bias", "missing", "[16]"}},
        {"extra", mut_extra, ZDP_ERR_FORMAT, {"transformer.h.0.attn.q_norm.weight", "[4]", "not a parameter"}},
        {"linear", mut_linear, ZDP_ERR_CONFIG, {"transformer.h.0.attn.c_attn.weight", "[12, 4]", "[4, 12]"}},
        {"shape", mut_shape, ZDP_ERR_CONFIG, {"transformer.h.1.ln_2.bias", "[5]", "[4]"}},
        {"dtype", mut_dtype, ZDP_ERR_UNSUPPORTED, {"transformer.ln_f.bias", "I32", "F16"}},
        {"more layers", mut_more_layers, ZDP_ERR_CONFIG, {"transformer.h.2.ln_1.weight", "n_layer = 3", "3 layers"}},
        {"fewer layers", mut_fewer_layers, ZDP_ERR_CONFIG, {"h.1.ln_1.weight", "n_layer = 1", "1 layers"}},
        {"both spellings", mut_both_spellings, ZDP_ERR_FORMAT, {"ln_f.weight", "prefix", "keep one"}},
        {"head shape", mut_head_shape, ZDP_ERR_UNSUPPORTED, {"lm_head.weight", "[12, 4]", "[11, 4]"}},
    };
    model_ a, b;
    model_init(&a);
    model_init(&b);
    model_fill(&a, 0.0f);
    model_fill_const(&b, 5.0f);
    const char *p = path_in("mismatch.safetensors");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        stfile_ f;
        st_from_model(&f, &a, true);
        cases[i].fn(&f);
        st_write(&f, p);
        st_free(&f);
        zdp_error e = {0};
        zdp_status s = load(p, &b, &e);
        if (s != cases[i].code)
            fail_msg("%s: %s, want %s: %s", cases[i].what, zdp_status_name(s),
                     zdp_status_name(cases[i].code), e.msg);
        ASSERT_MSG_HAS(e, p);
        for (int k = 0; k < 3; k++) ASSERT_MSG_HAS(e, cases[i].has[k]);
        assert_model_const(&b, 5.0f);
    }
    model_free(&a);
    model_free(&b);
}

static void test_bad_files_and_args(void **state) {
    (void)state;
    model_ m;
    model_init(&m);
    zdp_error e = {0};
    /* Missing file. */
    assert_int_equal(load(path_in("nope.bin"), &m, &e), ZDP_ERR_IO);
    ASSERT_MSG_HAS(e, "nope.bin");
    /* A token shard and a text file. */
    const char *p = path_in("shard.bin");
    int32_t hd[256] = {20240520, 1, 0};
    FILE *f = fopen(p, "wb");
    fwrite(hd, 4, 256, f);
    fclose(f);
    assert_int_equal(load(p, &m, &e), ZDP_ERR_FORMAT);
    ASSERT_MSG_HAS(e, "token shard");
    p = path_in("text.txt");
    f = fopen(p, "wb");
    fputs("hello world, not weights\n", f);
    fclose(f);
    assert_int_equal(load(p, &m, &e), ZDP_ERR_FORMAT);
    ASSERT_MSG_HAS(e, "not a GPT-2 weights file");
    /* A corrupt safetensors file: the reader's error comes through. */
    p = path_in("corrupt.safetensors");
    f = fopen(p, "wb");
    fwrite("\x10\0\0\0\0\0\0\0{\"a\":", 1, 13, f);
    fclose(f);
    assert_int_equal(load(p, &m, &e), ZDP_ERR_FORMAT);

    /* Params that do not match the config. */
    model_fill(&m, 0.0f);
    p = path_in("ok.safetensors");
    assert_int_equal(zdp_gpt_weights_save(p, m.info, NPARAMS, (const float *const *)m.data, &e),
                     ZDP_OK);
    zdp_gpt_config big = k_cfg;
    big.n_embd = 8;
    assert_int_equal(zdp_gpt_weights_load(p, &big, m.info, NPARAMS, m.data, &e),
                     ZDP_ERR_INVALID_ARG);
    ASSERT_MSG_HAS(e, "transformer.wte.weight");
    big = k_cfg;
    big.n_layer = 3;
    assert_int_equal(zdp_gpt_weights_load(p, &big, m.info, NPARAMS, m.data, &e),
                     ZDP_ERR_INVALID_ARG);
    ASSERT_MSG_HAS(e, "40");
    big = k_cfg;
    big.n_head = 3;
    assert_int_equal(zdp_gpt_weights_load(p, &big, m.info, NPARAMS, m.data, &e),
                     ZDP_ERR_INVALID_ARG);
    zdp_param_info renamed[NPARAMS];
    memcpy(renamed, m.info, sizeof renamed);
    renamed[5].name = "transformer.h.0.attn.c_attn.weight"; /* a duplicate */
    assert_int_equal(zdp_gpt_weights_load(p, &k_cfg, renamed, NPARAMS, m.data, &e),
                     ZDP_ERR_INVALID_ARG);
    ASSERT_MSG_HAS(e, "both");
    assert_int_equal(zdp_gpt_weights_load(NULL, &k_cfg, m.info, NPARAMS, m.data, &e),
                     ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_gpt_weights_save(p, m.info, 0, (const float *const *)m.data, &e),
                     ZDP_ERR_INVALID_ARG);
    assert_int_equal(zdp_gpt_weights_save(path_in("no/such/dir.st"), m.info, NPARAMS,
                                          (const float *const *)m.data, &e),
                     ZDP_ERR_IO);
    model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_save_load_round_trip),
        cmocka_unit_test(test_load_without_prefix),
        cmocka_unit_test(test_load_f16_bf16),
        cmocka_unit_test(test_llmc_fp32),
        cmocka_unit_test(test_llmc_bf16),
        cmocka_unit_test(test_llmc_errors),
        cmocka_unit_test(test_safetensors_mismatches),
        cmocka_unit_test(test_bad_files_and_args),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
