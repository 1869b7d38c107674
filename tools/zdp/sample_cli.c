/*
 * sample_cli.c -- the tool's text generation (sample_cli.h): temperature, top-k
 * and top-p over one sequence.
 */
#define _POSIX_C_SOURCE 200809L
#include "sample_cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "lm_dir.h"

int sample_next_p(const zdp_model *model, const float *const *params, const int32_t *tokens, int n,
                  double temperature, int top_k, double top_p, uint64_t *rng, float *logits,
                  float *logprob) {
    const int V = model->vocab_size;
    /* The model sees at most block_size tokens: keep the most recent. */
    int start = n > model->block_size ? n - model->block_size : 0;
    zdp_error err;
    if (zdp_lm_next_logits(model, params, tokens + start, n - start, logits, &err) != ZDP_OK) {
        fprintf(stderr, "zdp: error: sampling: %s\n", err.msg);
        return -1;
    }
    const zdp_sample_params sp = {.temperature = temperature, .top_k = top_k, .top_p = top_p};
    int t = zdp_sample_token(logits, V, &sp, rng, logprob);
    if (t < 0) fprintf(stderr, "zdp: error: sampling: out of memory\n");
    return t;
}

int sample_next(const zdp_model *model, const float *const *params, const int32_t *tokens,
                int n, double temperature, int top_k, uint64_t *rng, float *logits) {
    return sample_next_p(model, params, tokens, n, temperature, top_k, 1.0, rng, logits, NULL);
}

/* Prints a byte-level model's tokens as bytes (ids >= 256 as '?'). */
static int print_bytes_(void *user, const int32_t *t, int n) {
    (void)user;
    for (int i = 0; i < n; i++) putchar(t[i] < 256 ? t[i] : '?');
    return 0;
}

/* Prints a tokenizer's tokens as their text (byte-level BPE: the tokens'
 * bytes, so a character split across tokens comes out whole). */
static int print_text_(void *user, const int32_t *t, int n) {
    char *text = NULL;
    size_t len = 0;
    zdp_error err;
    if (zdp_tokenizer_decode(user, t, (size_t)n, &text, &len, &err) != ZDP_OK)
        return cli_fail("decoding the sample: %s", err.msg);
    fwrite(text, 1, len, stdout);
    free(text);
    return 0;
}

/* num_samples continuations of prompt[0..n) (sample i draws with seed + i),
 * `batch` of them decoding together (zdp_generate: the KV cache, continuous
 * batching).  Each is printed after `prompt_text` by print(), without a
 * final eos; then the speed goes to stderr.  max_tokens < 0: up to 200, as
 * the context allows.  0 or cli_fail's code. */
static int generate_print_(const zdp_model *model, const float *const *params,
                           const zdp_model *lora, const float *const *adapter, const int32_t *prompt,
                           int n, int max_tokens, const zdp_sample_params *sp, uint64_t seed,
                           int num_samples, int batch, int32_t eos, const char *prompt_text,
                           int (*print)(void *, const int32_t *, int), void *user) {
    const int room = model->block_size - n;
    if (n > model->block_size)
        return cli_fail("--prompt: %d tokens, longer than the model's context (block_size %d); "
                        "shorten it or give a larger --block-size", n, model->block_size);
    if (max_tokens < 0) max_tokens = room < 200 ? room : 200;
    if (max_tokens > room)
        return cli_fail("--max-tokens %d: the prompt's %d tokens plus --max-tokens must fit the "
                        "model's context (block_size %d): give at most %d",
                        max_tokens, n, model->block_size, room);
    zdp_gen_seq *g = calloc((size_t)num_samples, sizeof *g);
    int32_t *out = malloc(((size_t)num_samples * (size_t)max_tokens + 1) * sizeof *out);
    if (g == NULL || out == NULL) {
        free(g), free(out);
        return cli_fail("out of memory for %d samples of %d tokens", num_samples, max_tokens);
    }
    for (int i = 0; i < num_samples; i++)
        g[i] = (zdp_gen_seq){.prompt = prompt, .prompt_len = n, .max_tokens = max_tokens,
                             .sp = *sp, .seed = seed + (uint64_t)i,
                             .stop_ids = eos >= 0 ? &eos : NULL, .n_stop_ids = eos >= 0,
                             .lora = lora, .adapter = adapter,
                             .out = out + (size_t)i * max_tokens};
    zdp_gen_stats stats;
    zdp_error err;
    int rc = 0;
    if (zdp_generate(model, params, NULL, g, num_samples, batch, &stats, &err) != ZDP_OK)
        rc = cli_fail("sampling: %s", err.msg);
    int64_t made = 0;
    for (int i = 0; rc == 0 && i < num_samples; i++) {
        if (num_samples > 1) printf("--- sample %d of %d (seed %llu) ---\n", i + 1, num_samples,
                                    (unsigned long long)(seed + (uint64_t)i));
        fputs(prompt_text, stdout);
        made += g[i].n_out;
        const int k = g[i].stopped && eos >= 0 && g[i].n_out > 0 && g[i].out[g[i].n_out - 1] == eos
                          ? g[i].n_out - 1 : g[i].n_out;
        rc = print(user, g[i].out, k);
        printf("\n---\n");
    }
    fflush(stdout);
    if (rc == 0)
        fprintf(stderr,
                "zdp sample: %d sample(s), %lld new tokens in %.3f s: %.1f tokens/s (batch %d, "
                "prefill %lld tokens, %lld passes, KV cache %.1f MB)\n",
                num_samples, (long long)made, stats.seconds,
                stats.seconds > 0 ? (double)made / stats.seconds : 0.0, batch,
                (long long)stats.prefill_tokens, (long long)stats.passes, stats.kv_bytes / 1e6);
    free(g);
    free(out);
    return rc;
}

void sample_print(const zdp_model *model, const float *const *params, const char *prompt,
                  int max_tokens, double temperature, int top_k, uint64_t seed) {
    int n = (int)strlen(prompt);
    int32_t *tok = malloc((size_t)(n + 1) * sizeof *tok);
    if (tok == NULL) return;
    for (int i = 0; i < n; i++) tok[i] = (unsigned char)prompt[i];
    if (n == 0) tok[n++] = '\n';
    /* The most recent block_size bytes of a long prompt, and as many new ones as fit. */
    const int start = n > model->block_size - 1 ? n - (model->block_size - 1) : 0;
    const int room = model->block_size - (n - start);
    const zdp_sample_params sp = {.temperature = temperature, .top_k = top_k, .top_p = 1.0};
    printf("--- sample (temperature %.2f, top-k %d) ---\n", temperature, top_k);
    generate_print_(model, params, NULL, NULL, tok + start, n - start, max_tokens < room ? max_tokens : room, &sp,
                    seed, 1, 1, -1, prompt, print_bytes_, NULL);
    free(tok);
}

/* The decimal value of digits p[0..n), least significant first when
 * `reversed`; -1 if one is not a digit or there are none. */
static long long arith_value_(const char *p, int n, bool reversed) {
    long long v = 0;
    for (int i = 0; i < n; i++) {
        char c = p[reversed ? n - 1 - i : i];
        if (c < '0' || c > '9' || v > 100000000000000000LL) return -1;
        v = 10 * v + (c - '0');
    }
    return n > 0 ? v : -1;
}

void sample_arith_report(const zdp_model *model, const float *const *params,
                         const zdp_dataset *ds, int n_problems) {
    const int32_t *val = zdp_dataset_tokens(ds, ZDP_SPLIT_VAL);
    int64_t nv = zdp_dataset_n_tokens(ds, ZDP_SPLIT_VAL);
    const zdp_gpt_config *c = zdp_gpt_config_of(model);
    float *logits = malloc((size_t)c->vocab_size * sizeof *logits);
    int64_t *seen = malloc((size_t)(n_problems > 0 ? n_problems : 1) * sizeof *seen);
    int32_t ctx[64];
    int tried = 0, right = 0;
    uint64_t rng = 0;
    printf("--- held-out arithmetic problems (never in training), greedy answers ---\n"
           "  (the sum is written least significant digit first: 07+45=250 is 7 + 45 = 52)\n");
    /* The val split starts at a line (zdp_dataset_create_arith) and each
     * distinct problem counts once.  The prompt is the line up to '=' at
     * position 0, as a line that starts a training window is seen. */
    for (int64_t line = 0; logits != NULL && seen != NULL && line < nv && tried < n_problems;) {
        int64_t eq = line;
        while (eq < nv && val[eq] != '=' && val[eq] != '\n') eq++;
        int64_t end = eq;
        while (end < nv && val[end] != '\n') end++;
        if (end >= nv || val[eq] != '=' || eq - line > 40 || end - eq > 20) break;
        char prompt[48], want[24], got[24];
        int n = 0, w = 0, g = 0;
        for (int64_t k = line; k <= eq; k++) prompt[n++] = (char)val[k];
        prompt[n] = '\0';
        for (int64_t k = eq + 1; k < end; k++) want[w++] = (char)val[k];
        want[w] = '\0';
        const int64_t next = end + 1;
        const char *plus = strchr(prompt, '+');
        long long a = plus ? arith_value_(prompt, (int)(plus - prompt), false) : -1;
        long long b = plus ? arith_value_(plus + 1, (int)(prompt + n - 1 - (plus + 1)), false) : -1;
        /* Operands are at most 10^9 (zdp_corpus_arith), so the key cannot overflow. */
        const bool in_range = a >= 0 && b >= 0 && a <= 1000000000 && b <= 1000000000;
        int64_t key = in_range ? a * 2000000001LL + b : -1;
        bool repeat = false;
        for (int k = 0; k < tried && !repeat; k++) repeat = seen[k] == key;
        if (key < 0 || repeat) {
            line = next;
            continue;
        }
        for (int k = 0; k < n; k++) ctx[k] = (unsigned char)prompt[k];
        while (g < 12) {
            int t = sample_next(model, params, ctx, n, 0.0, 0, &rng, logits);
            if (t < 0 || t == '\n') break;
            got[g++] = (char)t;
            if (n < 63) ctx[n++] = t;
        }
        got[g] = '\0';
        bool ok = strcmp(got, want) == 0;
        right += ok;
        if (tried < 8) {
            char says[80];
            long long sum = arith_value_(got, g, true);
            for (int k = 0; k < g; k++) /* an untrained model answers any byte */
                if (got[k] < 0x20 || got[k] > 0x7e) got[k] = '?';
            if (sum >= 0) snprintf(says, sizeof says, "%lld + %lld = %lld", a, b, sum);
            else snprintf(says, sizeof says, "%lld + %lld = ?", a, b);
            printf("  %s%-*s  %-18s %s%s\n", prompt, w + 1, got, says,
                   ok ? "right" : "wrong, want ", ok ? "" : want);
        }
        seen[tried++] = key;
        line = next;
    }
    if (tried > 0)
        printf("accuracy on %d held-out problems: %d/%d = %.0f%%\n", tried, right, tried,
               100.0 * right / tried);
    free(seen);
    free(logits);
}

/* ---- zdp sample --------------------------------------------------------------- */

/* The config from the weight file's shapes; n_head from the flag or C/64
 * (GPT-2's head size).  Reads "transformer."-prefixed or bare names. */
static int infer_config_(const zdp_safetensors *st, int n_head, zdp_gpt_config *c) {
    const zdp_tensor *wte = zdp_safetensors_find(st, "transformer.wte.weight");
    const zdp_tensor *wpe = zdp_safetensors_find(st, "transformer.wpe.weight");
    const char *pre = "transformer.";
    if (wte == NULL) {
        wte = zdp_safetensors_find(st, "wte.weight");
        wpe = zdp_safetensors_find(st, "wpe.weight");
        pre = "";
    }
    if (wte == NULL || wpe == NULL || wte->ndim != 2 || wpe->ndim != 2)
        return cli_fail("--weights: no [V, C] wte.weight and [T, C] wpe.weight: not a GPT-2 "
                        "safetensors file");
    int L = 0;
    for (;; L++) {
        char name[96];
        snprintf(name, sizeof name, "%sh.%d.ln_1.weight", pre, L);
        if (zdp_safetensors_find(st, name) == NULL) break;
    }
    *c = (zdp_gpt_config){.n_layer = L, .n_embd = (int)wte->shape[1],
                          .vocab_size = (int)wte->shape[0], .block_size = (int)wpe->shape[0]};
    c->n_head = n_head > 0 ? n_head : (c->n_embd % 64 == 0 ? c->n_embd / 64 : 0);
    if (c->n_head == 0)
        return cli_fail("--weights: n_embd %d is not a multiple of 64, so the head count cannot "
                        "be guessed; give --n-head", c->n_embd);
    return 0;
}

/* `zdp sample --model-dir DIR [--adapter ADIR]`: the prompt through the
 * folder's tokenizer (no BOS added, special tokens' text recognised), then
 * num_samples continuations of up to max_tokens tokens, printed as text;
 * the tokenizer's EOS ends one.  With a PEFT adapter folder, every sample
 * decodes with the adapter applied (docs/lora.md).  0 or cli_fail's code. */
static int sample_dir_(const char *dir, const char *adapter_dir, int block_size, const char *prompt,
                       int max_tokens, const zdp_sample_params *sp, uint64_t seed, int num_samples,
                       int batch) {
    lm_dir d;
    int rc = lm_dir_open(dir, block_size, true, true, &d);
    zdp_model model = {0}, lora = {0};
    float **views = NULL, **ad = NULL;
    int32_t *ids = NULL;
    zdp_error err;
    if (rc == 0 && lm_dir_create(&d, 1, &model, &err) != ZDP_OK) rc = cli_fail("--model-dir %s: %s", dir, err.msg);
    if (rc == 0 && (views = lm_views_alloc(&model)) == NULL) rc = cli_fail("out of memory for the weights");
    if (rc == 0 && zdp_hf_weights_load(dir, &model, views, &err) != ZDP_OK) rc = cli_fail("--model-dir %s", err.msg);
    zdp_lora_config lc;
    if (rc == 0 && adapter_dir != NULL) {
        if (zdp_lora_read_adapter_config(adapter_dir, &lc, &err) != ZDP_OK)
            rc = cli_fail("--adapter %s", err.msg);
        else if (zdp_lora_create(&model, (const float *const *)views, &lc, &lora, &err) != ZDP_OK)
            rc = cli_fail("--adapter %s: %s", adapter_dir, err.msg);
        else if ((ad = lm_views_alloc(&lora)) == NULL)
            rc = cli_fail("out of memory for the adapter");
        else if (zdp_lora_load_adapter(adapter_dir, &lora, ad, &err) != ZDP_OK)
            rc = cli_fail("--adapter %s", err.msg);
    }
    size_t n = 0;
    if (rc == 0 && zdp_tokenizer_encode(d.tok, prompt, strlen(prompt), ZDP_TOKENIZE_SPECIAL, &ids, &n, &err) != ZDP_OK)
        rc = cli_fail("--prompt: %s", err.msg);
    if (rc == 0 && n == 0) rc = cli_fail("--prompt: empty; give some text to continue");
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (ids[i] >= model.vocab_size)
            rc = cli_fail("--prompt: token %zu is id %d, outside the model's vocabulary [0, %d)", i, (int)ids[i],
                          model.vocab_size);
    if (rc == 0) {
        char with[64] = "";
        if (ad != NULL) snprintf(with, sizeof with, ", LoRA adapter rank %d alpha %g", lc.rank, (double)lc.alpha);
        printf("--- sample (%s%s, temperature %.2f, top-k %d, top-p %.2f) ---\n", d.summary, with,
               sp->temperature, sp->top_k, sp->top_p);
        rc = generate_print_(&model, (const float *const *)views, ad != NULL ? &lora : NULL,
                             (const float *const *)ad, ids, (int)n, max_tokens, sp, seed, num_samples,
                             batch, zdp_tokenizer_eos_id(d.tok), prompt, print_text_, d.tok);
    }
    free(ids);
    lm_views_free(&lora, ad);
    zdp_lora_destroy(&lora);
    lm_views_free(&model, views);
    if (model.self != NULL) zdp_model_destroy(&model);
    lm_dir_close(&d);
    return rc;
}

int cmd_sample(int argc, char **argv) {
    const char *weights = NULL, *model_dir = NULL, *adapter = NULL, *prompt = "\n";
    int64_t n_head = 0, max_tokens = -1, top_k = 40, seed = 1, block_size = 0, num_samples = 1,
            batch = 0;
    double temperature = 0.8, top_p = 1.0;
    const cli_opt opts[] = {
        CLI_STR("--weights", &weights),
        CLI_STR("--model-dir", &model_dir),
        CLI_STR("--adapter", &adapter),
        CLI_I64("--block-size", &block_size, 1, 1 << 24, "need a positive integer"),
        CLI_F64("--top-p", &top_p, 1e-9, 1.0, "need a number in (0, 1]"),
        CLI_STR("--prompt", &prompt),
        CLI_I64("--n-head", &n_head, 1, 4096, "need 1..4096"),
        CLI_I64("--max-tokens", &max_tokens, 0, 1 << 20, "need 0..1048576"),
        CLI_I64("--top-k", &top_k, 0, 1 << 24, "need an integer >= 0"),
        CLI_I64("--seed", &seed, 0, INT64_MAX, "need an integer >= 0"),
        CLI_F64("--temperature", &temperature, 0.0, 100.0, "need a number in [0, 100]"),
        CLI_I64("--num-samples", &num_samples, 1, 1 << 20, "need 1..1048576"),
        CLI_I64("--batch", &batch, 1, 4096, "need 1..4096 (sequences decoding together)"),
    };
    static const cli_command cmd = {.missing = "missing value (see zdp sample --help)",
                                    .unknown = " (see zdp sample --help)"};
    int prc = cli_parse_options(&cmd, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv);
    if (prc == 1) {
        printf("usage: zdp sample --model-dir DIR [--prompt TEXT] [--block-size T] [options]\n"
               "       zdp sample --weights W.safetensors [--prompt TEXT] [--n-head H] [options]\n"
               "  --model-dir DIR    a Hugging Face folder (config.json, safetensors, tokenizer):\n"
               "                     Llama 3, Qwen3, SmolLM2, GPT-2; the prompt goes through its\n"
               "                     tokenizer (docs/models.md, \"Sampling and serving\")\n"
               "  --adapter ADIR     with --model-dir: a PEFT LoRA adapter folder (zdp train\n"
               "                     --save-adapter-dir, Tinker's checkpoint download) applied\n"
               "                     while decoding (docs/lora.md)\n"
               "  --block-size T     the longest context (default: min(max_position_embeddings, 1024))\n"
               "  --weights W        GPT-2 weights of a byte-level model (vocab 256): the prompt is\n"
               "                     read as bytes; --n-head H (default n_embd/64)\n"
               "  --max-tokens N (200, or what the context leaves)  --temperature T (0.8; 0 = greedy)\n"
               "  --top-k K (40; 0 = all)  --top-p P (1: off)  --seed N (1; sample i uses N + i)\n"
               "  --num-samples N (1)   continuations of the prompt\n"
               "  --batch B (all)       of them decoding together (KV cache, continuous batching);\n"
               "                        tokens/s goes to stderr (docs/sampling.md)\n");
        return 0;
    }
    if (prc != 0) return prc;
    if (model_dir != NULL && weights != NULL)
        return cli_fail("--model-dir and --weights: give one (a model folder, or a byte-level GPT's weights)");
    if (adapter != NULL && model_dir == NULL)
        return cli_fail("--adapter %s: needs --model-dir (the base model folder the adapter was "
                        "trained on)", adapter);
    if (batch == 0) batch = num_samples < 4096 ? num_samples : 4096;
    const zdp_sample_params sp = {.temperature = temperature, .top_k = (int)top_k, .top_p = top_p};
    if (model_dir != NULL)
        return sample_dir_(model_dir, adapter, (int)block_size, prompt, (int)max_tokens, &sp, (uint64_t)seed,
                           (int)num_samples, (int)batch);
    if (weights == NULL) return cli_fail("--model-dir DIR or --weights W.safetensors is required");
    zdp_safetensors st;
    zdp_error err;
    if (zdp_safetensors_read(weights, &st, &err) != ZDP_OK) return cli_fail("--weights %s", err.msg);
    zdp_gpt_config c;
    int rc = infer_config_(&st, (int)n_head, &c);
    zdp_safetensors_free(&st);
    if (rc) return rc;
    if (c.vocab_size != 256)
        return cli_fail("--weights: vocab_size %d: zdp sample reads prompts as bytes and needs a "
                        "byte-level model (vocab 256); zdp has no BPE tokenizer", c.vocab_size);
    zdp_model model;
    if (zdp_gpt_create(&c, 1, &model, &err) != ZDP_OK) return cli_fail("%s", err.msg);
    float **views = calloc((size_t)model.n_params, sizeof *views);
    rc = views == NULL ? cli_fail("out of memory") : 0;
    for (int i = 0; rc == 0 && i < model.n_params; i++) {
        int64_t n = 1;
        for (int d = 0; d < model.params[i].ndim; d++) n *= model.params[i].shape[d];
        if ((views[i] = zdp_big_alloc((size_t)n * sizeof(float))) == NULL) rc = cli_fail("out of memory");
    }
    if (rc == 0 && zdp_gpt_weights_load(weights, &c, model.params, model.n_params, views, &err) != ZDP_OK)
        rc = cli_fail("--weights %s", err.msg);
    int32_t *ids = rc == 0 ? malloc((strlen(prompt) + 1) * sizeof *ids) : NULL;
    if (rc == 0 && ids == NULL) rc = cli_fail("out of memory");
    if (rc == 0) {
        int n = 0;
        for (const char *q = prompt; *q != '\0'; q++) ids[n++] = (unsigned char)*q;
        if (n == 0) ids[n++] = '\n';
        printf("--- sample (temperature %.2f, top-k %d, top-p %.2f) ---\n", temperature, (int)top_k, top_p);
        rc = generate_print_(&model, (const float *const *)views, NULL, NULL, ids, n, (int)max_tokens, &sp, (uint64_t)seed,
                             (int)num_samples, (int)batch, -1, prompt, print_bytes_, NULL);
    }
    free(ids);
    for (int i = 0; views != NULL && i < model.n_params; i++) free(views[i]);
    free(views);
    zdp_gpt_destroy(&model);
    return rc;
}
