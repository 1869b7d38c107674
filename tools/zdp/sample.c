/*
 * sample.c -- generation with temperature, top-k and top-p (see sample.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "lm_dir.h"

static const float *g_sort_logits; /* qsort has no context argument */
static int by_logit_desc_(const void *a, const void *b) {
    float x = g_sort_logits[*(const int *)a], y = g_sort_logits[*(const int *)b];
    return x > y ? -1 : x < y ? 1 : 0;
}

/* The smallest logit kept by nucleus sampling: the most likely tokens (of
 * those at or above cut) whose probabilities at this temperature first reach
 * top_p.  Ties with the last one are kept, as top-k keeps them. */
static float top_p_cut_(const float *logits, int V, float cut, int best, double temperature,
                        double top_p) {
    int *idx = malloc((size_t)V * sizeof *idx);
    if (idx == NULL) return cut;
    int m = 0;
    double sum = 0;
    for (int v = 0; v < V; v++)
        if (logits[v] >= cut) {
            idx[m++] = v;
            sum += exp((logits[v] - logits[best]) / temperature);
        }
    g_sort_logits = logits;
    qsort(idx, (size_t)m, sizeof *idx, by_logit_desc_);
    double acc = 0;
    float out = cut;
    for (int k = 0; k < m; k++) {
        acc += exp((logits[idx[k]] - logits[best]) / temperature);
        out = logits[idx[k]];
        if (acc >= top_p * sum) break;
    }
    free(idx);
    return out;
}

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
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    int t = best;
    if (temperature > 0) {
        /* Top-k: the k-th largest logit is the cut-off (ties kept). */
        float cut = -INFINITY;
        if (top_k > 0 && top_k < V) {
            float *tmp = malloc((size_t)V * sizeof *tmp);
            if (tmp == NULL) return best;
            memcpy(tmp, logits, (size_t)V * sizeof *tmp);
            for (int k = 0; k < top_k; k++) { /* partial selection: k small */
                int m = k;
                for (int v = k + 1; v < V; v++)
                    if (tmp[v] > tmp[m]) m = v;
                float x = tmp[k];
                tmp[k] = tmp[m];
                tmp[m] = x;
            }
            cut = tmp[top_k - 1];
            free(tmp);
        }
        if (top_p < 1.0) cut = top_p_cut_(logits, V, cut, best, temperature, top_p);
        double sum = 0;
        for (int v = 0; v < V; v++)
            sum += logits[v] >= cut ? exp((logits[v] - logits[best]) / temperature) : 0.0;
        double u = (double)(zdp_splitmix64(rng) >> 11) * 0x1.0p-53 * sum, acc = 0;
        for (int v = 0; v < V; v++) {
            if (logits[v] < cut) continue;
            acc += exp((logits[v] - logits[best]) / temperature);
            t = v;
            if (acc >= u) break;
        }
    }
    if (logprob != NULL) {
        /* The model's own log-probability (temperature 1, no top-k/top-p): what
         * a learner computes for the same token, so the two agree at equal weights. */
        double z = 0;
        for (int v = 0; v < V; v++) z += exp((double)logits[v] - logits[best]);
        *logprob = (float)((double)logits[t] - logits[best] - log(z));
    }
    return t;
}

int sample_next(const zdp_model *model, const float *const *params, const int32_t *tokens,
                int n, double temperature, int top_k, uint64_t *rng, float *logits) {
    return sample_next_p(model, params, tokens, n, temperature, top_k, 1.0, rng, logits, NULL);
}

void sample_print(const zdp_model *model, const float *const *params, const char *prompt,
                  int max_tokens, double temperature, int top_k, uint64_t seed) {
    const zdp_gpt_config *c = zdp_gpt_config_of(model);
    int n = (int)strlen(prompt);
    int32_t *tok = malloc((size_t)(n + max_tokens + 1) * sizeof *tok);
    float *logits = malloc((size_t)c->vocab_size * sizeof *logits);
    if (tok == NULL || logits == NULL) goto out;
    for (int i = 0; i < n; i++) tok[i] = (unsigned char)prompt[i];
    if (n == 0) tok[n++] = '\n';
    uint64_t rng = seed;
    printf("--- sample (temperature %.2f, top-k %d) ---\n%s", temperature, top_k, prompt);
    for (int i = 0; i < max_tokens; i++) {
        int t = sample_next(model, params, tok, n, temperature, top_k, &rng, logits);
        if (t < 0) break;
        tok[n++] = t;
        putchar(t < 256 ? t : '?');
    }
    printf("\n---\n");
out:
    free(tok);
    free(logits);
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

/* `zdp sample --model-dir DIR`: the prompt through the folder's tokenizer
 * (no BOS added, special tokens' text recognised), then up to max_tokens
 * tokens, each printed as its text as it comes; the tokenizer's EOS ends
 * the text.  0 or cli_fail's code. */
static int sample_dir_(const char *dir, int block_size, const char *prompt, int max_tokens,
                       double temperature, int top_k, double top_p, uint64_t seed) {
    lm_dir d;
    int rc = lm_dir_open(dir, block_size, true, &d);
    zdp_model model = {0};
    float **views = NULL;
    int32_t *ids = NULL, *tok = NULL;
    float *logits = NULL;
    zdp_error err;
    if (rc == 0 && lm_dir_create(&d, 1, &model, &err) != ZDP_OK) rc = cli_fail("--model-dir %s: %s", dir, err.msg);
    if (rc == 0 && (views = lm_views_alloc(&model)) == NULL) rc = cli_fail("out of memory for the weights");
    if (rc == 0 && zdp_hf_weights_load(dir, &model, views, &err) != ZDP_OK) rc = cli_fail("--model-dir %s", err.msg);
    size_t n = 0;
    if (rc == 0 && zdp_tokenizer_encode(d.tok, prompt, strlen(prompt), ZDP_TOKENIZE_SPECIAL, &ids, &n, &err) != ZDP_OK)
        rc = cli_fail("--prompt: %s", err.msg);
    if (rc == 0 && n == 0) rc = cli_fail("--prompt: empty; give some text to continue");
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (ids[i] >= model.vocab_size)
            rc = cli_fail("--prompt: token %zu is id %d, outside the model's vocabulary [0, %d)", i, (int)ids[i],
                          model.vocab_size);
    if (rc == 0) {
        tok = malloc((n + (size_t)max_tokens + 1) * sizeof *tok);
        logits = malloc((size_t)model.vocab_size * sizeof *logits);
        if (tok == NULL || logits == NULL) rc = cli_fail("out of memory");
    }
    if (rc == 0) {
        memcpy(tok, ids, n * sizeof *tok);
        const int32_t eos = zdp_tokenizer_eos_id(d.tok);
        uint64_t rng = seed;
        printf("--- sample (%s, temperature %.2f, top-k %d, top-p %.2f) ---\n%s", d.summary, temperature, top_k,
               top_p, prompt);
        for (int i = 0; i < max_tokens; i++) {
            int t = sample_next_p(&model, (const float *const *)views, tok, (int)n, temperature, top_k, top_p,
                                  &rng, logits, NULL);
            if (t < 0) {
                rc = cli_fail("sampling failed (see above)");
                break;
            }
            if (t == eos) break;
            tok[n++] = t;
            char *text = NULL;
            size_t len = 0;
            /* Byte-level BPE: a token's text is its bytes, so printing token by
             * token gives the sequence's text (a character split across
             * tokens comes out whole once both are printed). */
            if (zdp_tokenizer_decode(d.tok, &tok[n - 1], 1, &text, &len, &err) != ZDP_OK) {
                rc = cli_fail("decoding token %d: %s", t, err.msg);
                break;
            }
            fwrite(text, 1, len, stdout);
            fflush(stdout);
            free(text);
        }
        printf("\n---\n");
    }
    free(ids), free(tok), free(logits);
    lm_views_free(&model, views);
    if (model.self != NULL) zdp_model_destroy(&model);
    lm_dir_close(&d);
    return rc;
}

int cmd_sample(int argc, char **argv) {
    const char *weights = NULL, *model_dir = NULL, *prompt = "\n";
    int64_t n_head = 0, max_tokens = 200, top_k = 40, seed = 1, block_size = 0;
    double temperature = 0.8, top_p = 1.0;
    const cli_opt opts[] = {
        CLI_STR("--weights", &weights),
        CLI_STR("--model-dir", &model_dir),
        CLI_I64("--block-size", &block_size, 1, 1 << 24, "need a positive integer"),
        CLI_F64("--top-p", &top_p, 1e-9, 1.0, "need a number in (0, 1]"),
        CLI_STR("--prompt", &prompt),
        CLI_I64("--n-head", &n_head, 1, 4096, "need 1..4096"),
        CLI_I64("--max-tokens", &max_tokens, 0, 1 << 20, "need 0..1048576"),
        CLI_I64("--top-k", &top_k, 0, 1 << 24, "need an integer >= 0"),
        CLI_I64("--seed", &seed, 0, INT64_MAX, "need an integer >= 0"),
        CLI_F64("--temperature", &temperature, 0.0, 100.0, "need a number in [0, 100]"),
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
               "  --block-size T     the longest context (default: min(max_position_embeddings, 1024))\n"
               "  --weights W        GPT-2 weights of a byte-level model (vocab 256): the prompt is\n"
               "                     read as bytes; --n-head H (default n_embd/64)\n"
               "  --max-tokens N (200)  --temperature T (0.8; 0 = greedy)  --top-k K (40; 0 = all)\n"
               "  --top-p P (1: off)    --seed N (1)\n");
        return 0;
    }
    if (prc != 0) return prc;
    if (model_dir != NULL && weights != NULL)
        return cli_fail("--model-dir and --weights: give one (a model folder, or a byte-level GPT's weights)");
    if (model_dir != NULL)
        return sample_dir_(model_dir, (int)block_size, prompt, (int)max_tokens, temperature, (int)top_k, top_p,
                           (uint64_t)seed);
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
        if ((views[i] = malloc((size_t)n * sizeof(float))) == NULL) rc = cli_fail("out of memory");
    }
    if (rc == 0 && zdp_gpt_weights_load(weights, &c, model.params, model.n_params, views, &err) != ZDP_OK)
        rc = cli_fail("--weights %s", err.msg);
    if (rc == 0)
        sample_print(&model, (const float *const *)views, prompt, (int)max_tokens, temperature,
                     (int)top_k, (uint64_t)seed);
    for (int i = 0; views != NULL && i < model.n_params; i++) free(views[i]);
    free(views);
    zdp_gpt_destroy(&model);
    return rc;
}
