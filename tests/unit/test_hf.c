/*
 * test_hf.c -- unit tests for src/io/hf_*.c (Hugging Face folders).
 *
 * config.json: transformers' defaults for absent keys (llama, qwen3, gpt2),
 * real checkpoints' configs (SmolLM2-135M, Llama-3.2-1B, Qwen3-0.6B, gpt2),
 * transformers 5's rope_parameters, and every refusal naming its key.
 * Weights: the F32 and BF16 round trips through zdp_hf_save /
 * zdp_hf_weights_load (single file and sharded, the index's total_size and
 * weight_map, stale files of an earlier save removed), the written
 * config.json parsed back to the model's config, and every bad folder: a
 * tensor missing, extra, of the wrong shape (and transposed) or dtype, NaN,
 * an index naming a missing shard, a shard holding a tensor the index does
 * not list, a tied lm_head equal (accepted) or different (refused), an
 * untied model without lm_head.  Each error must name the file, the tensor
 * or key, and leave the destination untouched.  zdp_hf_reader (stage 3's
 * loader): every slice of every tensor equals the whole load, the same
 * refusals at open, a NaN named when its slice is read, slices out of range
 * refused; zdp_hf_save_stream writes zdp_hf_save's bytes, file for file.
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/tmpdir.h"
#include "zdp/zdp.h"

/* ---- fixtures -------------------------------------------------------------- */

static char g_dir[256];

static void quiet_log(int level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

static int group_setup(void **state) {
    (void)state;
    zdp_set_log(quiet_log, NULL);
    return tmpdir_make(g_dir, sizeof g_dir, "hf");
}

static int group_teardown(void **state) {
    (void)state;
    (void)tmpdir_remove(g_dir);
    zdp_set_log(NULL, NULL);
    return 0;
}

static zdp_status parse_(const char *json, zdp_hf_config *c, zdp_error *err) {
    return zdp_hf_config_parse(json, strlen(json), "x/config.json", c, err);
}

/* ---- config.json ------------------------------------------------------------- */

static void test_llama_defaults(void **state) {
    (void)state;
    zdp_hf_config c;
    zdp_error err;
    assert_int_equal(parse_("{\"model_type\": \"llama\"}", &c, &err), ZDP_OK);
    assert_int_equal(c.family, ZDP_HF_LLAMA);
    const zdp_llama_config *l = &c.llama;
    /* configuration_llama.py's defaults. */
    assert_int_equal(l->arch, ZDP_ARCH_LLAMA);
    assert_int_equal(l->vocab_size, 32000);
    assert_int_equal(l->hidden, 4096);
    assert_int_equal(l->ffn, 11008);
    assert_int_equal(l->n_layer, 32);
    assert_int_equal(l->n_head, 32);
    assert_int_equal(l->n_kv_head, 32);
    assert_int_equal(l->head_dim, 128);
    assert_int_equal(l->max_position_embeddings, 2048);
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_true(l->rms_norm_eps == 1e-6f);
    assert_true(l->rope_theta == 10000.0);
    assert_int_equal(l->rope_type, ZDP_ROPE_DEFAULT);
    assert_int_equal(l->qk_norm, 0);
    assert_int_equal(l->attention_bias, 0);
    assert_int_equal(l->tie_word_embeddings, 0);
    assert_true(l->initializer_range == 0.02);
}

static void test_qwen3_defaults(void **state) {
    (void)state;
    zdp_hf_config c;
    zdp_error err;
    /* head_dim is 128 in Qwen3 whatever hidden/heads is. */
    assert_int_equal(parse_("{\"model_type\": \"qwen3\", \"hidden_size\": 64, "
                            "\"num_attention_heads\": 4}", &c, &err), ZDP_OK);
    const zdp_llama_config *l = &c.llama;
    assert_int_equal(l->arch, ZDP_ARCH_QWEN3);
    assert_int_equal(l->qk_norm, 1);
    assert_int_equal(l->head_dim, 128);
    assert_int_equal(l->vocab_size, 151936);
    assert_int_equal(l->ffn, 22016);
    assert_int_equal(l->n_kv_head, 4);
    assert_int_equal(l->max_position_embeddings, 32768);
    assert_int_equal(l->tie_word_embeddings, 0);
}

/* The configs of the smallest real models, as their folders hold them. */
static void test_real_configs(void **state) {
    (void)state;
    zdp_hf_config c;
    zdp_error err;
    const char *smol =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, "
        "\"attention_dropout\": 0.0, \"bos_token_id\": 0, \"eos_token_id\": 0, "
        "\"hidden_act\": \"silu\", \"hidden_size\": 576, \"initializer_range\": 0.041666666666666664, "
        "\"intermediate_size\": 1536, \"is_llama_config\": true, \"max_position_embeddings\": 8192, "
        "\"model_type\": \"llama\", \"num_attention_heads\": 9, \"num_hidden_layers\": 30, "
        "\"num_key_value_heads\": 3, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, "
        "\"rope_interleaved\": false, \"rope_scaling\": null, \"rope_theta\": 100000, "
        "\"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", "
        "\"transformers_version\": \"4.42.3\", \"use_cache\": true, \"vocab_size\": 49152}";
    assert_int_equal(parse_(smol, &c, &err), ZDP_OK);
    assert_int_equal(c.llama.n_layer, 30);
    assert_int_equal(c.llama.hidden, 576);
    assert_int_equal(c.llama.n_head, 9);
    assert_int_equal(c.llama.n_kv_head, 3);
    assert_int_equal(c.llama.head_dim, 64);
    assert_int_equal(c.llama.ffn, 1536);
    assert_int_equal(c.llama.vocab_size, 49152);
    assert_int_equal(c.llama.tie_word_embeddings, 1);
    assert_true(c.llama.rope_theta == 100000.0);
    assert_true(c.llama.rms_norm_eps == 1e-5f);
    assert_true(fabs(c.llama.initializer_range - 0.041666666666666664) < 1e-15);

    const char *llama32 =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, "
        "\"attention_dropout\": 0.0, \"bos_token_id\": 128000, \"eos_token_id\": 128001, "
        "\"head_dim\": 64, \"hidden_act\": \"silu\", \"hidden_size\": 2048, "
        "\"initializer_range\": 0.02, \"intermediate_size\": 8192, "
        "\"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\", "
        "\"num_attention_heads\": 32, \"num_hidden_layers\": 16, \"num_key_value_heads\": 8, "
        "\"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 32.0, "
        "\"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, "
        "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, "
        "\"rope_theta\": 500000.0, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", "
        "\"use_cache\": true, \"vocab_size\": 128256}";
    assert_int_equal(parse_(llama32, &c, &err), ZDP_OK);
    assert_int_equal(c.llama.rope_type, ZDP_ROPE_LLAMA3);
    assert_true(c.llama.rope_factor == 32.0);
    assert_true(c.llama.rope_low_freq_factor == 1.0);
    assert_true(c.llama.rope_high_freq_factor == 4.0);
    assert_int_equal(c.llama.rope_original_max_position, 8192);
    assert_true(c.llama.rope_theta == 500000.0);
    assert_int_equal(c.llama.max_position_embeddings, 131072);
    assert_int_equal(c.llama.vocab_size, 128256);

    const char *qwen06 =
        "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, "
        "\"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"eos_token_id\": 151645, "
        "\"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 1024, "
        "\"initializer_range\": 0.02, \"intermediate_size\": 3072, "
        "\"max_position_embeddings\": 40960, \"max_window_layers\": 28, "
        "\"model_type\": \"qwen3\", \"num_attention_heads\": 16, \"num_hidden_layers\": 28, "
        "\"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, "
        "\"rope_theta\": 1000000, \"sliding_window\": null, \"tie_word_embeddings\": true, "
        "\"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\", "
        "\"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";
    assert_int_equal(parse_(qwen06, &c, &err), ZDP_OK);
    assert_int_equal(c.llama.arch, ZDP_ARCH_QWEN3);
    assert_int_equal(c.llama.head_dim, 128);
    assert_int_equal(c.llama.hidden, 1024);
    assert_int_equal(c.llama.n_kv_head, 8);
    assert_int_equal(c.llama.max_position_embeddings, 40960);
    assert_true(c.llama.rope_theta == 1e6);

    const char *gpt2 =
        "{\"activation_function\": \"gelu_new\", \"architectures\": [\"GPT2LMHeadModel\"], "
        "\"attn_pdrop\": 0.1, \"bos_token_id\": 50256, \"embd_pdrop\": 0.1, "
        "\"eos_token_id\": 50256, \"initializer_range\": 0.02, \"layer_norm_epsilon\": 1e-05, "
        "\"model_type\": \"gpt2\", \"n_ctx\": 1024, \"n_embd\": 768, \"n_head\": 12, "
        "\"n_layer\": 12, \"n_positions\": 1024, \"resid_pdrop\": 0.1, "
        "\"summary_activation\": null, \"vocab_size\": 50257}";
    assert_int_equal(parse_(gpt2, &c, &err), ZDP_OK);
    assert_int_equal(c.family, ZDP_HF_GPT2);
    assert_int_equal(c.gpt.n_layer, 12);
    assert_int_equal(c.gpt.n_head, 12);
    assert_int_equal(c.gpt.n_embd, 768);
    assert_int_equal(c.gpt.vocab_size, 50257);
    assert_int_equal(c.gpt.block_size, 1024);
    assert_int_equal(c.max_position_embeddings, 1024);

    /* transformers 5 writes rope_parameters, with rope_theta inside. */
    assert_int_equal(parse_("{\"model_type\": \"llama\", \"rope_parameters\": {\"rope_type\": "
                            "\"linear\", \"factor\": 2.0, \"rope_theta\": 5000.0}}", &c, &err),
                     ZDP_OK);
    assert_int_equal(c.llama.rope_type, ZDP_ROPE_LINEAR);
    assert_true(c.llama.rope_factor == 2.0);
    assert_true(c.llama.rope_theta == 5000.0);
    /* Old configs say "type". */
    assert_int_equal(parse_("{\"model_type\": \"llama\", \"rope_scaling\": {\"type\": "
                            "\"linear\", \"factor\": 4}}", &c, &err), ZDP_OK);
    assert_int_equal(c.llama.rope_type, ZDP_ROPE_LINEAR);
    assert_true(c.llama.rope_factor == 4.0);
}

/* Every refusal names the key (and the value) in its message. */
static void test_config_refusals(void **state) {
    (void)state;
    static const struct {
        const char *json;
        zdp_status status;
        const char *msg1, *msg2;
    } cases[] = {
        {"{\"model_type\": ", ZDP_ERR_FORMAT, "not valid JSON", "x/config.json"},
        {"[1, 2]", ZDP_ERR_FORMAT, "top level", "an array"},
        {"{\"hidden_size\": 8}", ZDP_ERR_FORMAT, "\"model_type\" is missing", "llama"},
        {"{\"model_type\": \"mistral\"}", ZDP_ERR_UNSUPPORTED, "\"model_type\" = \"mistral\"", "qwen3"},
        {"{\"model_type\": 3}", ZDP_ERR_FORMAT, "\"model_type\"", "an integer"},
        {"{\"model_type\": \"llama\", \"architectures\": [\"LlamaForSequenceClassification\"]}",
         ZDP_ERR_UNSUPPORTED, "\"architectures\"[0]", "LlamaForSequenceClassification"},
        {"{\"model_type\": \"qwen3\", \"use_sliding_window\": true}", ZDP_ERR_UNSUPPORTED,
         "\"use_sliding_window\" = true", "sliding"},
        {"{\"model_type\": \"qwen3\", \"num_hidden_layers\": 2, \"layer_types\": "
         "[\"full_attention\", \"sliding_attention\"]}", ZDP_ERR_UNSUPPORTED,
         "\"layer_types\"[1]", "sliding_attention"},
        {"{\"model_type\": \"qwen3\", \"num_experts\": 128}", ZDP_ERR_UNSUPPORTED,
         "\"num_experts\" = 128", "mixture-of-experts"},
        {"{\"model_type\": \"llama\", \"num_local_experts\": 8}", ZDP_ERR_UNSUPPORTED,
         "\"num_local_experts\" = 8", "mixture-of-experts"},
        {"{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"dynamic\", "
         "\"factor\": 2}}", ZDP_ERR_UNSUPPORTED, "\"rope_scaling\".rope_type = \"dynamic\"", "linear"},
        {"{\"model_type\": \"llama\", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4}}",
         ZDP_ERR_UNSUPPORTED, "\"yarn\"", "llama3"},
        {"{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"llama3\", "
         "\"factor\": 8}}", ZDP_ERR_FORMAT, "low_freq_factor is missing", "rope_scaling"},
        {"{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"linear\"}}",
         ZDP_ERR_FORMAT, "\"rope_scaling\".factor is missing", "linear"},
        {"{\"model_type\": \"llama\", \"hidden_act\": \"gelu\"}", ZDP_ERR_UNSUPPORTED,
         "\"hidden_act\" = \"gelu\"", "silu"},
        {"{\"model_type\": \"llama\", \"mlp_bias\": true}", ZDP_ERR_UNSUPPORTED,
         "\"mlp_bias\" = true", "attention_bias"},
        {"{\"model_type\": \"llama\", \"pretraining_tp\": 2}", ZDP_ERR_UNSUPPORTED,
         "\"pretraining_tp\" = 2", "set it to 1"},
        {"{\"model_type\": \"llama\", \"attention_dropout\": 0.1}", ZDP_ERR_UNSUPPORTED,
         "\"attention_dropout\" = 0.1", "dropout"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 48, \"num_attention_heads\": 6, "
         "\"num_key_value_heads\": 4}",
         ZDP_ERR_CONFIG, "\"num_key_value_heads\" = 4", "\"num_attention_heads\" = 6"},
        {"{\"model_type\": \"llama\", \"hidden_size\": \"big\"}", ZDP_ERR_FORMAT,
         "\"hidden_size\"", "a string"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 0}", ZDP_ERR_CONFIG,
         "\"hidden_size\" = 0", "out of range"},
        {"{\"model_type\": \"llama\", \"rms_norm_eps\": -1}", ZDP_ERR_CONFIG,
         "\"rms_norm_eps\" = -1", "> 0"},
        {"{\"model_type\": \"llama\", \"rms_norm_eps\": 1e-65}", ZDP_ERR_CONFIG,
         "\"rms_norm_eps\" = 1e-65", "0 in fp32"},
        {"{\"model_type\": \"llama\", \"initializer_range\": -0.1}", ZDP_ERR_CONFIG,
         "\"initializer_range\" = -0.1", ">= 0"},
        {"{\"model_type\": \"llama\", \"tie_word_embeddings\": \"yes\"}", ZDP_ERR_FORMAT,
         "\"tie_word_embeddings\"", "true or false"},
        {"{\"model_type\": \"gpt2\", \"activation_function\": \"relu\"}", ZDP_ERR_UNSUPPORTED,
         "\"activation_function\" = \"relu\"", "gelu_new"},
        {"{\"model_type\": \"gpt2\", \"n_inner\": 100}", ZDP_ERR_UNSUPPORTED,
         "\"n_inner\" = 100", "4 x n_embd"},
        {"{\"model_type\": \"gpt2\", \"scale_attn_by_inverse_layer_idx\": true}",
         ZDP_ERR_UNSUPPORTED, "\"scale_attn_by_inverse_layer_idx\" = true", "false"},
        {"{\"model_type\": \"gpt2\", \"tie_word_embeddings\": false}", ZDP_ERR_UNSUPPORTED,
         "\"tie_word_embeddings\" = false", "true"},
        {"{\"model_type\": \"gpt2\", \"n_head\": 5}", ZDP_ERR_CONFIG, "\"n_head\" = 5",
         "\"n_embd\" = 768"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        zdp_hf_config c;
        zdp_error err = {0};
        zdp_status s = parse_(cases[i].json, &c, &err);
        if (s != cases[i].status || strstr(err.msg, cases[i].msg1) == NULL ||
            strstr(err.msg, cases[i].msg2) == NULL || strstr(err.msg, "x/config.json") == NULL)
            fail_msg("case %zu (%s): status %d, message \"%s\"", i, cases[i].json, (int)s, err.msg);
        assert_int_equal(c.family, 0); /* cleared on error */
        assert_int_equal(c.llama.hidden, 0);
    }
    /* Keys that do not change the math are ignored. */
    zdp_hf_config c;
    zdp_error err;
    assert_int_equal(parse_("{\"model_type\": \"llama\", \"use_cache\": false, \"torch_dtype\": "
                            "\"float16\", \"bos_token_id\": 1, \"sliding_window\": 4096, "
                            "\"num_experts\": 0, \"attention_dropout\": 0}", &c, &err), ZDP_OK);
    assert_int_equal(parse_("{\"model_type\": \"qwen3\", \"sliding_window\": 4096, "
                            "\"max_window_layers\": 28, \"layer_types\": [\"full_attention\"]}",
                            &c, &err), ZDP_OK);
}

static void test_config_read_errors(void **state) {
    (void)state;
    zdp_hf_config c;
    zdp_error err;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/noconfig", g_dir);
    assert_int_equal(zdp_hf_config_read(dir, &c, &err), ZDP_ERR_IO);
    assert_non_null(strstr(err.msg, dir));
    mkdir(dir, 0755);
    assert_int_equal(zdp_hf_config_read(dir, &c, &err), ZDP_ERR_IO);
    assert_non_null(strstr(err.msg, "noconfig/config.json"));
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"model_type\": \"llama\",,}", f);
    fclose(f);
    assert_int_equal(zdp_hf_config_read(dir, &c, &err), ZDP_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "noconfig/config.json: not valid JSON"));
}

/* ---- weights ---------------------------------------------------------------------- */

/* A tiny model of each kind, its parameters filled from a seed. */
typedef struct tiny_ {
    zdp_model model;
    float **p;
} tiny_;

static int64_t numel_(const zdp_param_info *pi) {
    int64_t n = 1;
    for (int d = 0; d < pi->ndim; d++) n *= pi->shape[d];
    return n;
}

static void tiny_make_(tiny_ *t, zdp_llama_arch arch, int tie, int bias) {
    zdp_llama_config c = {.arch = arch, .n_layer = 2, .hidden = 8, .n_head = 4, .n_kv_head = 2,
                          .head_dim = 4, .ffn = 12, .vocab_size = 19, .block_size = 6,
                          .max_position_embeddings = 32, .rms_norm_eps = 1e-5f,
                          .rope_theta = 10000.0, .rope_factor = 1.0,
                          .qk_norm = arch == ZDP_ARCH_QWEN3, .attention_bias = bias,
                          .tie_word_embeddings = tie, .initializer_range = 0.02};
    zdp_error err;
    assert_int_equal(zdp_llama_create(&c, 2, &t->model, &err), ZDP_OK);
    t->p = calloc((size_t)t->model.n_params, sizeof *t->p);
    for (int i = 0; i < t->model.n_params; i++)
        t->p[i] = calloc((size_t)numel_(&t->model.params[i]), sizeof(float));
    zdp_llama_init_params(&t->model, t->p, 7);
}

static void tiny_free_(tiny_ *t) {
    for (int i = 0; i < t->model.n_params; i++) free(t->p[i]);
    free(t->p);
    zdp_model_destroy(&t->model);
}

/* Fresh buffers of the model's shapes, filled with a sentinel. */
static float **sentinel_(const zdp_model *m) {
    float **d = calloc((size_t)m->n_params, sizeof *d);
    for (int i = 0; i < m->n_params; i++) {
        int64_t n = numel_(&m->params[i]);
        d[i] = malloc((size_t)n * sizeof(float));
        for (int64_t k = 0; k < n; k++) d[i][k] = 123.0f;
    }
    return d;
}

static void free_bufs_(const zdp_model *m, float **d) {
    for (int i = 0; i < m->n_params; i++) free(d[i]);
    free(d);
}

static void assert_untouched_(const zdp_model *m, float **d) {
    for (int i = 0; i < m->n_params; i++)
        for (int64_t k = 0; k < numel_(&m->params[i]); k++) assert_true(d[i][k] == 123.0f);
}

static bool exists_(const char *dir, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0;
}

static float bf16_round_(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    b += 0x7fffu + ((b >> 16) & 1u);
    b &= 0xffff0000u;
    memcpy(&f, &b, 4);
    return f;
}

/* A zdp_tensor_read_fn over whole tensors in memory (ctx: float **). */
static zdp_status read_mem_(void *ctx, int i, int64_t lo, int64_t hi, float *dst, zdp_error *err) {
    (void)err;
    memcpy(dst, ((float **)ctx)[i] + lo, (size_t)(hi - lo) * sizeof(float));
    return ZDP_OK;
}

/* Every file of a save, compared byte for byte with another save's. */
static void assert_same_file_(const char *a, const char *b, const char *name) {
    char pa[1024], pb[1024];
    snprintf(pa, sizeof pa, "%s/%s", a, name);
    snprintf(pb, sizeof pb, "%s/%s", b, name);
    FILE *fa = fopen(pa, "rb"), *fb = fopen(pb, "rb");
    assert_non_null(fa);
    assert_non_null(fb);
    int ca, cb;
    do {
        ca = fgetc(fa);
        cb = fgetc(fb);
        assert_int_equal(ca, cb);
    } while (ca != EOF);
    fclose(fa);
    fclose(fb);
}

static void test_round_trip(void **state) {
    (void)state;
    for (int variant = 0; variant < 4; variant++) {
        tiny_ t;
        tiny_make_(&t, variant % 2 ? ZDP_ARCH_QWEN3 : ZDP_ARCH_LLAMA, variant % 2, variant >= 2);
        const bool bf16 = variant == 3;
        const int64_t shard = variant >= 2 ? 600 : 0; /* small: many shards */
        char dir[512];
        snprintf(dir, sizeof dir, "%s/rt%d", g_dir, variant);
        zdp_error err;
        assert_int_equal(zdp_hf_save(dir, &t.model, (const float *const *)t.p,
                                     bf16 ? ZDP_DTYPE_BF16 : ZDP_DTYPE_F32, shard, &err), ZDP_OK);
        assert_true(exists_(dir, "config.json"));
        assert_int_equal(exists_(dir, "model.safetensors"), shard == 0);
        assert_int_equal(exists_(dir, "model.safetensors.index.json"), shard != 0);
        /* Tied models write no lm_head. */
        bool has_head = false;
        for (int i = 0; i < t.model.n_params; i++)
            has_head = has_head || strcmp(t.model.params[i].name, "lm_head.weight") == 0;
        assert_int_equal(has_head, !(variant % 2));

        /* The folder's config describes the same model. */
        zdp_hf_config hc;
        assert_int_equal(zdp_hf_config_read(dir, &hc, &err), ZDP_OK);
        zdp_llama_config want = *zdp_llama_config_of(&t.model);
        want.block_size = want.max_position_embeddings;
        assert_memory_equal(&hc.llama, &want, sizeof want);

        zdp_model m2;
        assert_int_equal(zdp_hf_model_create(&hc, 6, 2, &m2, &err), ZDP_OK);
        assert_int_equal(m2.n_params, t.model.n_params);
        float **d = sentinel_(&m2);
        assert_int_equal(zdp_hf_weights_load(dir, &m2, d, &err), ZDP_OK);
        for (int i = 0; i < m2.n_params; i++)
            for (int64_t k = 0; k < numel_(&m2.params[i]); k++)
                assert_true(d[i][k] == (bf16 ? bf16_round_(t.p[i][k]) : t.p[i][k]));
        /* The reader: any slice of any tensor is those elements (stage 3
         * reads a partition's slices), F32 and BF16, one shard or many. */
        zdp_hf_reader *r = NULL;
        assert_int_equal(zdp_hf_reader_open(dir, &m2, &r, &err), ZDP_OK);
        for (int i = 0; i < m2.n_params; i++) {
            const int64_t n = numel_(&m2.params[i]);
            const int64_t cut[4] = {0, n / 3, n / 3 + (n > 2 ? 1 : 0), n};
            float got[256];
            for (int c = 0; c < 3; c++) {
                assert_true(cut[c + 1] - cut[c] <= 256);
                assert_int_equal(zdp_hf_reader_read(r, i, cut[c], cut[c + 1], got, &err), ZDP_OK);
                for (int64_t k = cut[c]; k < cut[c + 1]; k++) assert_true(got[k - cut[c]] == d[i][k]);
            }
        }
        float one;
        assert_int_equal(zdp_hf_reader_read(r, 0, 2, 1, &one, &err), ZDP_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "elements [2, 1)"));
        assert_int_equal(zdp_hf_reader_read(r, m2.n_params, 0, 1, &one, &err), ZDP_ERR_INVALID_ARG);
        zdp_hf_reader_close(r);
        /* The streamed writer writes zdp_hf_save's bytes. */
        char dir2[560];
        snprintf(dir2, sizeof dir2, "%s-stream", dir);
        assert_int_equal(zdp_hf_save_stream(dir2, &t.model, read_mem_, t.p,
                                            bf16 ? ZDP_DTYPE_BF16 : ZDP_DTYPE_F32, shard, &err),
                         ZDP_OK);
        assert_same_file_(dir, dir2, "config.json");
        if (shard == 0) {
            assert_same_file_(dir, dir2, "model.safetensors");
        } else {
            assert_same_file_(dir, dir2, "model.safetensors.index.json");
            char name[64];
            int nsh = 2;
            for (; nsh < 1000; nsh++) {
                snprintf(name, sizeof name, "model-00001-of-%05d.safetensors", nsh);
                if (exists_(dir, name)) break;
            }
            assert_true(nsh < 1000);
            for (int k = 1; k <= nsh; k++) {
                snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k, nsh);
                assert_same_file_(dir, dir2, name);
            }
        }
        free_bufs_(&m2, d);
        zdp_model_destroy(&m2);
        tiny_free_(&t);
    }
}

/* The number of model-*-of-N shards in dir, checking they all say N. */
static int shard_count_(const char *dir) {
    DIR *dd = opendir(dir);
    assert_non_null(dd);
    struct dirent *e;
    int count = 0, n = -1;
    while ((e = readdir(dd)) != NULL) {
        int k, of;
        if (sscanf(e->d_name, "model-%5d-of-%5d.safetensors", &k, &of) != 2) continue;
        assert_true(n < 0 || of == n);
        n = of;
        count++;
    }
    closedir(dd);
    assert_true(count == 0 || count == n);
    return count;
}

/* Saving again into the same folder leaves no weight file of the old save. */
static void test_resave_removes_stale(void **state) {
    (void)state;
    tiny_ t;
    tiny_make_(&t, ZDP_ARCH_LLAMA, 0, 0);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/resave", g_dir);
    zdp_error err;
    assert_int_equal(zdp_hf_save(dir, &t.model, (const float *const *)t.p, ZDP_DTYPE_F32, 300,
                                 &err), ZDP_OK);
    const int shards = shard_count_(dir);
    assert_true(shards > 4);
    FILE *f = fopen(strcat(strcpy((char[600]){0}, dir), "/tokenizer.json"), "w");
    fputs("{}", f);
    fclose(f);
    /* Fewer, larger shards: the old ones must go. */
    assert_int_equal(zdp_hf_save(dir, &t.model, (const float *const *)t.p, ZDP_DTYPE_F32, 3000,
                                 &err), ZDP_OK);
    const int now = shard_count_(dir);
    assert_true(now >= 2 && now < shards);
    /* One file: the index and the shards go; the tokenizer stays. */
    assert_int_equal(zdp_hf_save(dir, &t.model, (const float *const *)t.p, ZDP_DTYPE_F32, 0,
                                 &err), ZDP_OK);
    DIR *dd = opendir(dir);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(dd)) != NULL) files += e->d_name[0] != '.';
    closedir(dd);
    assert_int_equal(files, 3);
    assert_true(exists_(dir, "model.safetensors"));
    assert_true(exists_(dir, "tokenizer.json"));
    assert_true(exists_(dir, "config.json"));
    float **d = sentinel_(&t.model);
    assert_int_equal(zdp_hf_weights_load(dir, &t.model, d, &err), ZDP_OK);
    free_bufs_(&t.model, d);
    tiny_free_(&t);
}

/* Writes the model's tensors to DIR/model.safetensors (with config.json)
 * after `edit` changed the list: the bad-folder cases. */
typedef void (*edit_fn_)(zdp_tensor *t, int *n, float *scratch);

static void write_folder_(const char *dir, tiny_ *t, edit_fn_ edit) {
    zdp_error err;
    assert_int_equal(zdp_hf_save(dir, &t->model, (const float *const *)t->p, ZDP_DTYPE_F32, 0,
                                 &err), ZDP_OK);
    int n = t->model.n_params;
    zdp_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    for (int i = 0; i < n; i++) {
        const zdp_param_info *pi = &t->model.params[i];
        ts[i] = (zdp_tensor){.name = (char *)pi->name, .dtype = ZDP_DTYPE_F32, .ndim = pi->ndim,
                             .data = t->p[i], .nbytes = (size_t)numel_(pi) * 4};
        memcpy(ts[i].shape, pi->shape, sizeof ts[i].shape);
    }
    static float scratch[4096];
    edit(ts, &n, scratch);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(zdp_safetensors_write(path, ts, n, &err), ZDP_OK);
    free(ts);
}

static int find_(zdp_tensor *t, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0) return i;
    fail_msg("no tensor %s", name);
    return -1;
}

static void edit_missing_(zdp_tensor *t, int *n, float *s) {
    (void)s;
    int i = find_(t, *n, "model.layers.1.mlp.up_proj.weight");
    memmove(&t[i], &t[i + 1], (size_t)(*n - i - 1) * sizeof *t);
    (*n)--;
}
static void edit_extra_(zdp_tensor *t, int *n, float *s) {
    t[*n] = (zdp_tensor){.name = "model.layers.0.mlp.gate_proj.bias", .dtype = ZDP_DTYPE_F32,
                         .ndim = 1, .shape = {12}, .data = s, .nbytes = 48};
    (*n)++;
}
static void edit_shape_(zdp_tensor *t, int *n, float *s) {
    (void)s;
    int i = find_(t, *n, "model.layers.0.self_attn.k_proj.weight");
    t[i].shape[0] = 4; /* [8, 8] -> [4, 8]: smaller, data shortened */
    t[i].nbytes = 4 * 8 * 4;
}
static void edit_transposed_(zdp_tensor *t, int *n, float *s) {
    (void)s;
    int i = find_(t, *n, "model.layers.0.mlp.down_proj.weight"); /* [8, 12] */
    t[i].shape[0] = 12;
    t[i].shape[1] = 8;
}
static void edit_dtype_(zdp_tensor *t, int *n, float *s) {
    (void)s;
    int i = find_(t, *n, "model.norm.weight");
    t[i].dtype = ZDP_DTYPE_I32;
}
static void edit_nan_(zdp_tensor *t, int *n, float *s) {
    int i = find_(t, *n, "model.layers.1.self_attn.o_proj.weight"); /* [8, 16] */
    memcpy(s, t[i].data, t[i].nbytes);
    s[2 * 16 + 5] = NAN;
    t[i].data = s;
}
static void edit_head_same_(zdp_tensor *t, int *n, float *s) {
    (void)s;
    t[*n] = t[0];
    t[*n].name = "lm_head.weight";
    (*n)++;
}
static void edit_head_diff_(zdp_tensor *t, int *n, float *s) {
    memcpy(s, t[0].data, t[0].nbytes);
    s[3] += 1.0f;
    t[*n] = t[0];
    t[*n].name = "lm_head.weight";
    t[*n].data = s;
    (*n)++;
}

static void test_bad_weights(void **state) {
    (void)state;
    static const struct {
        edit_fn_ edit;
        int tie;
        zdp_status status;
        const char *m1, *m2;
    } cases[] = {
        {edit_missing_, 0, ZDP_ERR_FORMAT, "\"model.layers.1.mlp.up_proj.weight\" is missing",
         "[12, 8]"},
        {edit_extra_, 0, ZDP_ERR_FORMAT, "\"model.layers.0.mlp.gate_proj.bias\" (shape [12]) is "
         "not a parameter", "config.json"},
        {edit_shape_, 0, ZDP_ERR_CONFIG, "\"model.layers.0.self_attn.k_proj.weight\": file shape "
         "[4, 8], model shape [8, 8]", "num_key_value_heads"},
        {edit_transposed_, 0, ZDP_ERR_CONFIG, "file shape [12, 8], model shape [8, 12]",
         "transposed"},
        {edit_dtype_, 0, ZDP_ERR_UNSUPPORTED, "\"model.norm.weight\" has dtype I32", "BF16"},
        {edit_nan_, 0, ZDP_ERR_FORMAT, "\"model.layers.1.self_attn.o_proj.weight\"[2, 5] = nan",
         "finite"},
        {edit_head_diff_, 1, ZDP_ERR_UNSUPPORTED, "\"lm_head.weight\"", "differs"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tiny_ t;
        tiny_make_(&t, ZDP_ARCH_LLAMA, cases[i].tie, 0);
        char dir[512];
        snprintf(dir, sizeof dir, "%s/bad%zu", g_dir, i);
        write_folder_(dir, &t, cases[i].edit);
        float **d = sentinel_(&t.model);
        zdp_error err = {0};
        zdp_status s = zdp_hf_weights_load(dir, &t.model, d, &err);
        if (s != cases[i].status || strstr(err.msg, cases[i].m1) == NULL ||
            strstr(err.msg, cases[i].m2) == NULL || strstr(err.msg, dir) == NULL)
            fail_msg("case %zu: status %d, message \"%s\"", i, (int)s, err.msg);
        assert_untouched_(&t.model, d);
        free_bufs_(&t.model, d);
        /* The reader runs the same checks at open; a NaN is found when its
         * slice is read, named by its element. */
        zdp_hf_reader *r = NULL;
        s = zdp_hf_reader_open(dir, &t.model, &r, &err);
        if (cases[i].edit == edit_nan_) {
            assert_int_equal(s, ZDP_OK);
            int o = 0;
            while (strcmp(t.model.params[o].name, "model.layers.1.self_attn.o_proj.weight") != 0) o++;
            float buf[128];
            assert_int_equal(zdp_hf_reader_read(r, o, 0, 32, buf, &err), ZDP_OK); /* before it */
            assert_int_equal(zdp_hf_reader_read(r, o, 32, 128, buf, &err), ZDP_ERR_FORMAT);
            assert_non_null(strstr(err.msg, cases[i].m1));
        } else {
            assert_int_equal(s, cases[i].status);
            assert_non_null(strstr(err.msg, cases[i].m1));
            assert_null(r);
        }
        zdp_hf_reader_close(r);
        tiny_free_(&t);
    }
    /* A tied model's lm_head equal to the embedding is accepted and skipped. */
    tiny_ t;
    tiny_make_(&t, ZDP_ARCH_LLAMA, 1, 0);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/headsame", g_dir);
    write_folder_(dir, &t, edit_head_same_);
    float **d = sentinel_(&t.model);
    zdp_error err;
    assert_int_equal(zdp_hf_weights_load(dir, &t.model, d, &err), ZDP_OK);
    assert_true(d[0][0] == t.p[0][0]);
    free_bufs_(&t.model, d);
    tiny_free_(&t);
    /* An untied model needs lm_head: the message says how to tie it. */
    tiny_make_(&t, ZDP_ARCH_LLAMA, 0, 0);
    tiny_ tied;
    tiny_make_(&tied, ZDP_ARCH_LLAMA, 1, 0);
    snprintf(dir, sizeof dir, "%s/nohead", g_dir);
    assert_int_equal(zdp_hf_save(dir, &tied.model, (const float *const *)tied.p, ZDP_DTYPE_F32,
                                 0, &err), ZDP_OK);
    d = sentinel_(&t.model);
    assert_int_equal(zdp_hf_weights_load(dir, &t.model, d, &err), ZDP_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "\"lm_head.weight\" is missing"));
    assert_non_null(strstr(err.msg, "tie_word_embeddings"));
    assert_untouched_(&t.model, d);
    free_bufs_(&t.model, d);
    tiny_free_(&t);
    tiny_free_(&tied);
}

static void write_text_(const char *dir, const char *name, const char *text) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_bad_index(void **state) {
    (void)state;
    tiny_ t;
    tiny_make_(&t, ZDP_ARCH_LLAMA, 1, 0);
    char dir[512], a[1024], b[1024];
    snprintf(dir, sizeof dir, "%s/idx", g_dir);
    zdp_error err;
    assert_int_equal(zdp_hf_save(dir, &t.model, (const float *const *)t.p, ZDP_DTYPE_F32, 700,
                                 &err), ZDP_OK);
    float **d = sentinel_(&t.model);
    const int n_shards = shard_count_(dir);
    assert_true(n_shards >= 3);
    /* A missing shard: named with a tensor the index puts there. */
    snprintf(a, sizeof a, "%s/model-00002-of-%05d.safetensors", dir, n_shards);
    snprintf(b, sizeof b, "%s/moved", dir);
    assert_int_equal(rename(a, b), 0);
    assert_int_equal(zdp_hf_weights_load(dir, &t.model, d, &err), ZDP_ERR_IO);
    assert_non_null(strstr(err.msg, "model.safetensors.index.json"));
    assert_non_null(strstr(err.msg, strrchr(a, '/') + 1));
    assert_non_null(strstr(err.msg, "does not exist"));
    assert_non_null(strstr(err.msg, "model.layers."));
    assert_int_equal(rename(b, a), 0);
    assert_int_equal(zdp_hf_weights_load(dir, &t.model, d, &err), ZDP_OK);
    for (int i = 0; i < t.model.n_params; i++) d[i][0] = 123.0f;
    /* A shard swapped for another: its tensors are not where the index says. */
    snprintf(b, sizeof b, "%s/model-00003-of-%05d.safetensors", dir, n_shards);
    char c[1024];
    snprintf(c, sizeof c, "%s/tmp", dir);
    assert_int_equal(rename(a, c), 0);
    assert_int_equal(rename(b, a), 0);
    assert_int_equal(rename(c, b), 0);
    assert_int_equal(zdp_hf_weights_load(dir, &t.model, d, &err), ZDP_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "model-0000"));
    assert_non_null(strstr(err.msg, "different saves"));
    for (int i = 0; i < t.model.n_params; i++) assert_true(d[i][0] == 123.0f);
    /* A tensor a shard holds that the index does not list. */
    char ipath[1024];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    FILE *fi = fopen(ipath, "r");
    char itext[8192];
    size_t ilen = fread(itext, 1, sizeof itext - 1, fi);
    fclose(fi);
    itext[ilen] = '\0';
    const char *entry = "    \"model.layers.0.input_layernorm.weight\": "; /* not the last */
    char *at = strstr(itext, entry);
    assert_non_null(at);
    char *eol = strchr(at, '\n');
    memmove(at, eol + 1, strlen(eol + 1) + 1);
    write_text_(dir, "model.safetensors.index.json", itext);
    zdp_error e1 = {0};
    zdp_status s1 = zdp_hf_weights_load(dir, &t.model, d, &e1);
    if (s1 != ZDP_ERR_FORMAT || strstr(e1.msg, "tensor \"model.layers.0.input_layernorm.weight\" is not listed") == NULL)
        fail_msg("unlisted tensor: status %d, \"%s\"", (int)s1, e1.msg);
    for (int i = 0; i < t.model.n_params; i++) assert_true(d[i][0] == 123.0f);
    /* Malformed index files. */
    static const struct { const char *text, *msg; } bad[] = {
        {"{\"weight_map\": ", "not valid JSON"},
        {"{\"metadata\": {}}", "\"weight_map\" is missing"},
        {"{\"weight_map\": {}}", "empty"},
        {"{\"weight_map\": {\"a\": \"../x.safetensors\"}}", "\"weight_map\".\"a\" = \"../x.safetensors\""},
        {"{\"weight_map\": {\"a\": 3}}", "\"weight_map\".\"a\" = an integer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text_(dir, "model.safetensors.index.json", bad[i].text);
        zdp_error e2 = {0};
        zdp_status s = zdp_hf_weights_load(dir, &t.model, d, &e2);
        if (s != ZDP_ERR_FORMAT || strstr(e2.msg, bad[i].msg) == NULL ||
            strstr(e2.msg, "model.safetensors.index.json") == NULL)
            fail_msg("index case %zu: status %d, \"%s\"", i, (int)s, e2.msg);
    }
    /* No weights at all. */
    char empty[600];
    snprintf(empty, sizeof empty, "%s/empty", g_dir);
    mkdir(empty, 0755);
    assert_int_equal(zdp_hf_weights_load(empty, &t.model, d, &err), ZDP_ERR_IO);
    assert_non_null(strstr(err.msg, "no model.safetensors and no model.safetensors.index.json"));
    free_bufs_(&t.model, d);
    tiny_free_(&t);
}

/* A GPT-2 folder: the factory crops the position table to the block size;
 * names load with or without "transformer."; the same one destroy. */
static void test_gpt2_folder(void **state) {
    (void)state;
    zdp_gpt_config g = {.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 11, .block_size = 10};
    zdp_model m;
    zdp_error err;
    assert_int_equal(zdp_gpt_create(&g, 1, &m, &err), ZDP_OK);
    float **p = sentinel_(&m);
    zdp_gpt_init_params(&m, p, 3);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/gpt", g_dir);
    assert_int_equal(zdp_hf_save(dir, &m, (const float *const *)p, ZDP_DTYPE_F32, 0, &err), ZDP_OK);
    zdp_hf_config hc;
    assert_int_equal(zdp_hf_config_read(dir, &hc, &err), ZDP_OK);
    assert_int_equal(hc.family, ZDP_HF_GPT2);
    assert_int_equal(hc.max_position_embeddings, 10);
    zdp_model m2;
    assert_int_equal(zdp_hf_model_create(&hc, 11, 1, &m2, &err), ZDP_ERR_CONFIG);
    assert_non_null(strstr(err.msg, "max_position_embeddings is 10"));
    assert_int_equal(zdp_hf_model_create(&hc, 4, 1, &m2, &err), ZDP_OK);
    assert_int_equal(m2.block_size, 4);
    float **d = sentinel_(&m2);
    assert_int_equal(zdp_hf_weights_load(dir, &m2, d, &err), ZDP_OK);
    for (int i = 0; i < m2.n_params; i++)
        for (int64_t k = 0; k < numel_(&m2.params[i]); k++) assert_true(d[i][k] == p[i][k]);
    free_bufs_(&m2, d);
    zdp_model_destroy(&m2);
    free_bufs_(&m, p);
    zdp_model_destroy(&m);
}

static void test_copy_tokenizer(void **state) {
    (void)state;
    char from[512], to[512];
    snprintf(from, sizeof from, "%s/tokfrom", g_dir);
    snprintf(to, sizeof to, "%s/tokto", g_dir);
    mkdir(from, 0755);
    mkdir(to, 0755);
    zdp_error err;
    int n = -1;
    assert_int_equal(zdp_hf_copy_tokenizer(from, to, &n, &err), ZDP_ERR_IO);
    assert_non_null(strstr(err.msg, "no tokenizer files"));
    write_text_(from, "tokenizer.json", "{\"model\": {}}");
    write_text_(from, "tokenizer_config.json", "{}");
    write_text_(from, "other.txt", "x");
    write_text_(from, "generation_config.json", "{\"eos_token_id\": 2}");
    assert_int_equal(zdp_hf_copy_tokenizer(from, to, &n, &err), ZDP_OK);
    assert_int_equal(n, 3);
    assert_true(exists_(to, "generation_config.json"));
    assert_true(exists_(to, "tokenizer.json"));
    assert_false(exists_(to, "other.txt"));

    /* The source config.json's token ids go into the saved one (a number
     * and a list, as Llama 3 instruct folders have); its other keys stay. */
    write_text_(from, "config.json", "{\"model_type\": \"llama\", \"bos_token_id\": 128000, "
                "\"eos_token_id\": [128001, 128009], \"pad_token_id\": 7}");
    write_text_(to, "config.json", "{\"model_type\": \"llama\", \"rms_norm_eps\": 1e-06}");
    assert_int_equal(zdp_hf_copy_tokenizer(from, to, &n, &err), ZDP_OK);
    assert_int_equal(n, 3);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", to);
    json_error_t je;
    json_t *c = json_load_file(path, 0, &je);
    assert_non_null(c);
    assert_int_equal(json_integer_value(json_object_get(c, "bos_token_id")), 128000);
    json_t *eos = json_object_get(c, "eos_token_id");
    assert_true(json_is_array(eos) && json_array_size(eos) == 2);
    assert_int_equal(json_integer_value(json_array_get(eos, 1)), 128009);
    assert_null(json_object_get(c, "pad_token_id"));
    assert_true(json_real_value(json_object_get(c, "rms_norm_eps")) == 1e-06);
    assert_string_equal(json_string_value(json_object_get(c, "model_type")), "llama");
    json_decref(c);
    /* A source with eos_token_id alone adds that alone. */
    char bare[512];
    snprintf(bare, sizeof bare, "%s/tokbare", g_dir);
    mkdir(bare, 0755);
    write_text_(bare, "config.json", "{\"model_type\": \"llama\"}");
    write_text_(from, "config.json", "{\"eos_token_id\": 2}");
    assert_int_equal(zdp_hf_copy_tokenizer(from, bare, &n, &err), ZDP_OK);
    snprintf(path, sizeof path, "%s/config.json", bare);
    assert_non_null(c = json_load_file(path, 0, &je));
    assert_int_equal(json_integer_value(json_object_get(c, "eos_token_id")), 2);
    assert_null(json_object_get(c, "bos_token_id"));
    json_decref(c);
    /* A source config.json that is not JSON is named. */
    write_text_(from, "config.json", "{\"eos_token_id\": ");
    assert_int_equal(zdp_hf_copy_tokenizer(from, bare, &n, &err), ZDP_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "tokfrom/config.json"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_defaults),
        cmocka_unit_test(test_qwen3_defaults),
        cmocka_unit_test(test_real_configs),
        cmocka_unit_test(test_config_refusals),
        cmocka_unit_test(test_config_read_errors),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_resave_removes_stale),
        cmocka_unit_test(test_bad_weights),
        cmocka_unit_test(test_bad_index),
        cmocka_unit_test(test_gpt2_folder),
        cmocka_unit_test(test_copy_tokenizer),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
