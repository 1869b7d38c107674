/*
 * load.c -- reads a byte-level BPE tokenizer: a Hugging Face tokenizer.json
 * (+ tokenizer_config.json for BOS/EOS), or GPT-2's encoder.json + vocab.bpe.
 *
 * What it does: checks every key that changes the result and refuses what
 * zdp does not implement, naming the file and the JSON key (docs/models.md,
 * "Tokenizers"); builds the maps encode.c runs on: each vocabulary entry as
 * the bytes it stands for (GPT-2's byte-to-unicode mapping undone once, here,
 * so BPE runs on raw bytes), the merges as (left id, right id) -> rank and
 * merged id, the added tokens, and the pre-tokenizer's compiled regexes.
 * What it does not do: tokenizers other than byte-level BPE (WordPiece,
 * Unigram, Metaspace/SentencePiece-style BPE), post-processors (zdp adds no
 * BOS/EOS; callers use zdp_tokenizer_bos_id).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/core.h"
#include "core/json.h"
#include "tok_impl.h"

#define PATH_MAX_ 4096
/* The largest token id accepted: far above any real vocabulary (Qwen3:
 * 151,669), low enough that a corrupt file cannot make zdp allocate gigabytes. */
#define TOK_MAX_ID_ (1 << 24)

/* GPT-2's pre-tokenizer regex (ByteLevel with use_regex), as the reference writes it. */
static const char gpt2_pattern_[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- byte <-> unicode (GPT-2's bytes_to_unicode) ------------------------------- */

/* Byte b is written in tokenizer.json as the character byte_char_(b): the
 * printable Latin-1 bytes as themselves, the other 68 as U+0100 onwards in
 * byte order. */
static void byte_chars_(uint32_t cp_of[256]) {
    int k = 0;
    for (int b = 0; b < 256; b++) {
        const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        cp_of[b] = printable ? (uint32_t)b : 256u + (uint32_t)k++;
    }
}

/* Decodes one UTF-8 character of s[0..n): its length, or 0 when malformed. */
static size_t utf8_dec_(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    size_t k = (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (k == 0 || k > n) return 0;
    uint32_t v = s[0] & (0x7F >> k);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    *cp = v;
    return k;
}

/* The bytes a byte-level token string stands for, into out (capacity >= n):
 * the byte count, or -1 when a character is not one of the 256. */
static long token_bytes_(const int16_t *byte_of_cp, const char *s, size_t n, char *out) {
    size_t at = 0, o = 0;
    while (at < n) {
        uint32_t cp;
        size_t k = utf8_dec_((const unsigned char *)s + at, n - at, &cp);
        if (k == 0 || cp >= 512 || byte_of_cp[cp] < 0) return -1;
        out[o++] = (char)byte_of_cp[cp];
        at += k;
    }
    return (long)o;
}

/* ---- the vocabulary ------------------------------------------------------------------ */

int32_t zdp_tok_vocab_find_(const zdp_tokenizer *t, const void *s, size_t n) {
    const uint64_t mask = t->vocab.cap - 1;
    for (uint64_t i = tok_hash_(s, n) & mask;; i = (i + 1) & mask) {
        const int32_t id = t->vocab.slot[i];
        if (id < 0) return -1;
        if (t->tok_len[id] == n && memcmp(t->tok[id], s, n) == 0) return id;
    }
}

static uint64_t pow2_at_least_(uint64_t n) {
    uint64_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* Everything a loader builds, with where it came from for messages. */
typedef struct load_ctx_ {
    zdp_tokenizer *t;
    const char *file;     /* "DIR/tokenizer.json" */
    int16_t byte_of_cp[512];
    zdp_error *err;
} load_ctx_;

static zdp_status fmt_(load_ctx_ *L, const char *fmt, ...) ZDP_PRINTF(2, 3);
static zdp_status fmt_(load_ctx_ *L, const char *fmt, ...) {
    char msg[ZDP_ERROR_MSG_MAX - 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return zdp_err_set(L->err, ZDP_ERR_FORMAT, "%s: %s", L->file, msg);
}

static zdp_status unsupported_(load_ctx_ *L, const char *fmt, ...) ZDP_PRINTF(2, 3);
static zdp_status unsupported_(load_ctx_ *L, const char *fmt, ...) {
    char msg[ZDP_ERROR_MSG_MAX - 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return zdp_err_set(L->err, ZDP_ERR_UNSUPPORTED, "%s: %s", L->file, msg);
}

/* Makes room for ids up to max_id (the arrays grow, never shrink). */
static zdp_status reserve_ids_(load_ctx_ *L, int32_t max_id) {
    zdp_tokenizer *t = L->t;
    if (max_id < t->n_vocab) return ZDP_OK;
    int32_t n = max_id + 1;
    char **a = realloc(t->tok, (size_t)n * sizeof *a);
    if (a) t->tok = a;
    uint32_t *b = realloc(t->tok_len, (size_t)n * sizeof *b);
    if (b) t->tok_len = b;
    bool *c = realloc(t->tok_bpe, (size_t)n * sizeof *c);
    if (c) t->tok_bpe = c;
    if (!a || !b || !c) return zdp_err_set(L->err, ZDP_ERR_NOMEM, "%s: out of memory", L->file);
    for (int32_t i = t->n_vocab; i < n; i++) {
        t->tok[i] = NULL;
        t->tok_len[i] = 0;
        t->tok_bpe[i] = false;
    }
    t->n_vocab = n;
    return ZDP_OK;
}

/* Sets id's bytes (a copy of s[0..n)). */
static zdp_status set_token_(load_ctx_ *L, int32_t id, const char *s, size_t n, bool bpe) {
    zdp_status st = reserve_ids_(L, id);
    if (st != ZDP_OK) return st;
    char *copy = malloc(n + 1);
    if (copy == NULL) return zdp_err_set(L->err, ZDP_ERR_NOMEM, "%s: out of memory", L->file);
    memcpy(copy, s, n);
    copy[n] = '\0';
    free(L->t->tok[id]);
    L->t->tok[id] = copy;
    L->t->tok_len[id] = (uint32_t)n;
    L->t->tok_bpe[id] = bpe;
    return ZDP_OK;
}

/* model.vocab (an object token -> id): each entry's bytes, and the byte map. */
static zdp_status load_vocab_(load_ctx_ *L, json_t *vocab, const char *key) {
    zdp_tokenizer *t = L->t;
    if (!json_is_object(vocab))
        return fmt_(L, "%s: expected an object of token -> id, got %s", key,
                    zdp_json_type_name(vocab));
    const char *tok;
    json_t *v;
    char buf[1024];
    json_object_foreach(vocab, tok, v) {
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= TOK_MAX_ID_) {
            char seen[48];
            if (json_is_integer(v)) snprintf(seen, sizeof seen, "%lld", (long long)json_integer_value(v));
            else snprintf(seen, sizeof seen, "%s", zdp_json_type_name(v));
            return fmt_(L, "%s[\"%.64s\"] = %s: a token id must be an integer in 0..%d", key, tok,
                        seen, TOK_MAX_ID_ - 1);
        }
        size_t n = strlen(tok);
        char *bytes = n <= sizeof buf ? buf : malloc(n);
        if (bytes == NULL) return zdp_err_set(L->err, ZDP_ERR_NOMEM, "%s: out of memory", L->file);
        long nb = token_bytes_(L->byte_of_cp, tok, n, bytes);
        zdp_status st = ZDP_OK;
        if (nb <= 0)
            st = unsupported_(L, "%s[\"%.64s\"]: a character that is not one of byte-level "
                                 "BPE's 256 byte characters; zdp reads byte-level BPE only "
                                 "(GPT-2, Llama 3, Qwen3)", key, tok);
        else if ((int32_t)id < t->n_vocab && t->tok[id] != NULL)
            st = fmt_(L, "%s[\"%.64s\"] = %lld: id used twice; each token needs its own id", key,
                      tok, (long long)id);
        else
            st = set_token_(L, (int32_t)id, bytes, (size_t)nb, true);
        if (bytes != buf) free(bytes);
        if (st != ZDP_OK) return st;
    }
    t->vocab.cap = pow2_at_least_(2 * json_object_size(vocab) + 1);
    t->vocab.slot = malloc(t->vocab.cap * sizeof *t->vocab.slot);
    if (t->vocab.slot == NULL) return zdp_err_set(L->err, ZDP_ERR_NOMEM, "%s: out of memory", L->file);
    memset(t->vocab.slot, 0xFF, t->vocab.cap * sizeof *t->vocab.slot);
    const uint64_t mask = t->vocab.cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!t->tok_bpe[id]) continue;
        uint64_t i = tok_hash_(t->tok[id], t->tok_len[id]) & mask;
        bool dup = false;
        for (; t->vocab.slot[i] >= 0; i = (i + 1) & mask) {
            const int32_t o = t->vocab.slot[i];
            dup = dup || (t->tok_len[o] == t->tok_len[id] && memcmp(t->tok[o], t->tok[id], t->tok_len[id]) == 0);
        }
        if (dup) return fmt_(L, "%s: two entries (one with id %d) stand for the same bytes", key, id);
        t->vocab.slot[i] = id;
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = zdp_tok_vocab_find_(t, &c, 1);
        if (t->byte_id[b] < 0)
            return fmt_(L, "%s: no token for byte 0x%02X; a byte-level vocabulary has all 256", key, b);
    }
    return ZDP_OK;
}

/* One merge, "a b" or ["a", "b"], at rank `rank`. */
static zdp_status add_merge_(load_ctx_ *L, const char *key, size_t rank, const char *a, size_t na,
                             const char *b, size_t nb) {
    zdp_tokenizer *t = L->t;
    char ba[512], bb[512], both[1024];
    long la = na <= sizeof ba ? token_bytes_(L->byte_of_cp, a, na, ba) : -1;
    long lb = nb <= sizeof bb ? token_bytes_(L->byte_of_cp, b, nb, bb) : -1;
    int32_t ia = la > 0 ? zdp_tok_vocab_find_(t, ba, (size_t)la) : -1;
    int32_t ib = lb > 0 ? zdp_tok_vocab_find_(t, bb, (size_t)lb) : -1;
    int32_t im = -1;
    if (ia >= 0 && ib >= 0) {
        memcpy(both, ba, (size_t)la);
        memcpy(both + la, bb, (size_t)lb);
        im = zdp_tok_vocab_find_(t, both, (size_t)(la + lb));
    }
    if (ia < 0 || ib < 0 || im < 0)
        return fmt_(L, "%s[%zu] = \"%.*s %.*s\": %s is not in model.vocab; every merge's "
                       "parts and result must be tokens", key, rank, (int)(na > 64 ? 64 : na), a,
                    (int)(nb > 64 ? 64 : nb), b,
                    ia < 0 ? "the left part" : ib < 0 ? "the right part" : "the merged token");
    const uint64_t k = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib, mask = t->merge_cap - 1;
    uint64_t i = tok_pair_hash_(k) & mask;
    while (t->merges[i].key != UINT64_MAX && t->merges[i].key != k) i = (i + 1) & mask;
    /* A repeated pair keeps its first (lowest) rank, as a rank map built in order would. */
    if (t->merges[i].key == k) return ZDP_OK;
    t->merges[i] = (tok_merge_slot){k, (int32_t)rank, im};
    return ZDP_OK;
}

static zdp_status merges_alloc_(load_ctx_ *L, size_t n) {
    L->t->merge_cap = pow2_at_least_(2 * (uint64_t)n + 1);
    L->t->merges = malloc(L->t->merge_cap * sizeof *L->t->merges);
    if (L->t->merges == NULL) return zdp_err_set(L->err, ZDP_ERR_NOMEM, "%s: out of memory", L->file);
    for (uint64_t i = 0; i < L->t->merge_cap; i++) L->t->merges[i].key = UINT64_MAX;
    return ZDP_OK;
}

/* model.merges: "a b" strings (older files) or ["a", "b"] pairs (newer). */
static zdp_status load_merges_(load_ctx_ *L, json_t *merges, const char *key) {
    if (!json_is_array(merges))
        return fmt_(L, "%s: expected an array of merges, got %s", key, zdp_json_type_name(merges));
    if (json_array_size(merges) > (size_t)INT32_MAX) return fmt_(L, "%s: too many merges", key);
    zdp_status st = merges_alloc_(L, json_array_size(merges));
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        if (st != ZDP_OK) return st;
        if (json_is_string(m)) {
            const char *s = json_string_value(m);
            size_t n = json_string_length(m);
            const char *sp = memchr(s, ' ', n);
            if (sp == NULL || sp == s || sp + 1 == s + n || memchr(sp + 1, ' ', (size_t)(s + n - sp - 1)))
                return fmt_(L, "%s[%zu] = \"%.64s\": a merge string is two tokens with one space "
                               "between them", key, i, s);
            st = add_merge_(L, key, i, s, (size_t)(sp - s), sp + 1, (size_t)(s + n - sp - 1));
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            json_t *a = json_array_get(m, 0), *b = json_array_get(m, 1);
            st = add_merge_(L, key, i, json_string_value(a), json_string_length(a),
                            json_string_value(b), json_string_length(b));
        } else {
            return fmt_(L, "%s[%zu]: expected \"a b\" or [\"a\", \"b\"], got %s", key, i,
                        zdp_json_type_name(m));
        }
    }
    return st;
}

/* ---- regexes ----------------------------------------------------------------------- */

/* JavaScript's \s (WhiteSpace and LineTerminator): the reference's regexes
 * are JavaScript RegExps, and PCRE2's \s differs (U+0085 in, U+FEFF out). */
#define JS_SPACE_ "\\t\\n\\x0B\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
                  "\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}"

pcre2_code *zdp_tok_compile_(const char *pattern, size_t len, bool literal, char *why,
                             size_t why_n) {
    /* transformers.js rewrites this group, which JavaScript cannot write,
     * to an ASCII-only alternation; so does zdp (PCRE2's caseless match
     * would also take U+017F for s and U+212A for k). */
    static const char ci_[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
    static const char ci_js_[] = "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))";
    char *p = malloc(len * 64 + sizeof ci_js_ * (len / 8 + 1) + 1);
    if (p == NULL) {
        snprintf(why, why_n, "out of memory");
        return NULL;
    }
    size_t o = 0;
    bool in_class = false;
    for (size_t i = 0; i < len && !literal;) {
        if (!in_class && len - i >= sizeof ci_ - 1 && memcmp(pattern + i, ci_, sizeof ci_ - 1) == 0) {
            memcpy(p + o, ci_js_, sizeof ci_js_ - 1);
            o += sizeof ci_js_ - 1;
            i += sizeof ci_ - 1;
            continue;
        }
        const char c = pattern[i];
        if (c == '\\' && i + 1 < len) {
            const char e = pattern[i + 1];
            /* JavaScript's \d, \w are ASCII, as PCRE2's are without UCP;
             * \s and \S are spelled out. */
            const char *rep = NULL;
            if (e == 's') rep = in_class ? JS_SPACE_ : "[" JS_SPACE_ "]";
            else if (e == 'S' && !in_class) rep = "[^" JS_SPACE_ "]";
            else if (e == 'S') {
                snprintf(why, why_n, "\\S inside a character class is not supported");
                free(p);
                return NULL;
            }
            if (rep != NULL) {
                memcpy(p + o, rep, strlen(rep));
                o += strlen(rep);
            } else {
                p[o++] = c;
                p[o++] = e;
            }
            i += 2;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            p[o++] = c;
            i++;
            if (i < len && pattern[i] == '^') p[o++] = pattern[i++];
            if (i < len && pattern[i] == ']') p[o++] = pattern[i++]; /* a literal ] first */
            continue;
        }
        if (c == ']' && in_class) in_class = false;
        p[o++] = c;
        i++;
    }
    if (literal) {
        memcpy(p, pattern, len);
        o = len;
    }
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)p, o, PCRE2_UTF | (literal ? PCRE2_LITERAL : 0),
                                   &code, &off, NULL);
    free(p);
    if (re == NULL) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        snprintf(why, why_n, "%s (PCRE2)", (const char *)msg);
        return NULL;
    }
    /* JIT when this PCRE2 has it; the interpreter gives the same matches. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

/* ---- normalizer, pre-tokenizer, decoder ------------------------------------------------ */

static const char *str_key_(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool bool_key_(json_t *o, const char *k, bool dflt) {
    json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static zdp_status load_normalizer_(load_ctx_ *L, json_t *n, const char *key) {
    if (n == NULL || json_is_null(n)) return ZDP_OK;
    const char *type = json_is_object(n) ? str_key_(n, "type") : NULL;
    if (type == NULL) return fmt_(L, "%s: expected an object with a \"type\", got %s", key, zdp_json_type_name(n));
    if (strcmp(type, "NFC") == 0) {
        L->t->nfc = true;
        return ZDP_OK;
    }
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list)) return fmt_(L, "%s.normalizers: expected an array", key);
        size_t i;
        json_t *x;
        json_array_foreach(list, i, x) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", key, i);
            zdp_status st = load_normalizer_(L, x, sub);
            if (st != ZDP_OK) return st;
        }
        return ZDP_OK;
    }
    return unsupported_(L, "%s.type = \"%.64s\": not supported; zdp applies NFC or nothing "
                           "(Qwen3, Llama 3, GPT-2)", key, type);
}

static zdp_status add_stage_(load_ctx_ *L, const char *key, tok_stage s) {
    if (L->t->n_stages == TOK_MAX_STAGES) {
        pcre2_code_free(s.re);
        return unsupported_(L, "%s: more than %d pre-tokenizer steps", key, TOK_MAX_STAGES);
    }
    L->t->stages[L->t->n_stages++] = s;
    return ZDP_OK;
}

static zdp_status load_pretok_(load_ctx_ *L, json_t *p, const char *key, bool *byte_level) {
    if (p == NULL || json_is_null(p)) return ZDP_OK;
    const char *type = json_is_object(p) ? str_key_(p, "type") : NULL;
    if (type == NULL) return fmt_(L, "%s: expected an object with a \"type\", got %s", key, zdp_json_type_name(p));
    char why[300];
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list)) return fmt_(L, "%s.pretokenizers: expected an array", key);
        size_t i;
        json_t *x;
        json_array_foreach(list, i, x) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", key, i);
            zdp_status st = load_pretok_(L, x, sub, byte_level);
            if (st != ZDP_OK) return st;
        }
        return ZDP_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        tok_stage s = {.mode = TOK_SPLIT_MATCHES,
                       .add_prefix_space = bool_key_(p, "add_prefix_space", true)};
        if (bool_key_(p, "use_regex", true)) {
            s.re = zdp_tok_compile_(gpt2_pattern_, strlen(gpt2_pattern_), false, why, sizeof why);
            if (s.re == NULL) return zdp_err_set(L->err, ZDP_ERR_INTERNAL, "GPT-2 regex: %s", why);
        }
        *byte_level = true;
        return add_stage_(L, key, s);
    }
    if (strcmp(type, "Digits") == 0) {
        /* SmolLM2's: ASCII digits apart from the rest, each alone with
         * individual_digits, as the reference's pattern says. */
        const char *rx = bool_key_(p, "individual_digits", false) ? "[^0-9]+|[0-9]" : "[^0-9]+|[0-9]+";
        tok_stage s = {.mode = TOK_SPLIT_MATCHES};
        s.re = zdp_tok_compile_(rx, strlen(rx), false, why, sizeof why);
        if (s.re == NULL) return zdp_err_set(L->err, ZDP_ERR_INTERNAL, "Digits regex: %s", why);
        return add_stage_(L, key, s);
    }
    if (strcmp(type, "Split") == 0) {
        json_t *pat = json_object_get(p, "pattern");
        json_t *rx = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
        json_t *lit = json_is_object(pat) ? json_object_get(pat, "String") : NULL;
        json_t *src = json_is_string(rx) ? rx : lit;
        if (!json_is_string(src))
            return fmt_(L, "%s.pattern: expected {\"Regex\": \"...\"} or {\"String\": \"...\"}", key);
        const char *behavior = str_key_(p, "behavior");
        const bool invert = bool_key_(p, "invert", false);
        tok_stage s = {0};
        if (behavior != NULL && strcmp(behavior, "Isolated") == 0) s.mode = TOK_SPLIT_ALL;
        else if (behavior != NULL && strcmp(behavior, "Removed") == 0)
            s.mode = invert ? TOK_SPLIT_MATCHES : TOK_SPLIT_GAPS;
        else
            return unsupported_(L, "%s.behavior = \"%.64s\": not supported; zdp splits with "
                                   "\"Isolated\" or \"Removed\"", key, behavior ? behavior : "(missing)");
        s.re = zdp_tok_compile_(json_string_value(src), json_string_length(src), src == lit, why,
                                sizeof why);
        if (s.re == NULL)
            return fmt_(L, "%s.pattern = \"%.80s\": %s", key, json_string_value(src), why);
        return add_stage_(L, key, s);
    }
    return unsupported_(L, "%s.type = \"%.64s\": not supported; zdp reads byte-level BPE "
                           "(pre-tokenizers Split, Digits, ByteLevel and Sequence of them)", key, type);
}

/* ---- added tokens ------------------------------------------------------------------------ */

static zdp_status add_added_(load_ctx_ *L, const char *content, size_t len, int32_t id,
                             bool special, bool lstrip, bool rstrip) {
    zdp_tokenizer *t = L->t;
    if (t->n_added == TOK_MAX_ADDED) return fmt_(L, "added_tokens: more than %d", TOK_MAX_ADDED);
    tok_added *g = realloc(t->added, ((size_t)t->n_added + 1) * sizeof *g);
    char *text = malloc(len + 1);
    if (g) t->added = g;
    if (!g || !text) {
        free(text);
        return zdp_err_set(L->err, ZDP_ERR_NOMEM, "%s: out of memory", L->file);
    }
    memcpy(text, content, len);
    text[len] = '\0';
    t->added[t->n_added++] = (tok_added){text, len, id, special, lstrip, rstrip};
    t->added_first[(unsigned char)content[0]] = 1;
    if (len > t->added_max_len) t->added_max_len = len;
    /* An added token decodes to its text, also where model.vocab has the id. */
    return set_token_(L, id, content, len, id < t->n_vocab && t->tok_bpe[id]);
}

static zdp_status load_added_(load_ctx_ *L, json_t *list) {
    if (list == NULL || json_is_null(list)) return ZDP_OK;
    if (!json_is_array(list)) return fmt_(L, "added_tokens: expected an array, got %s", zdp_json_type_name(list));
    size_t i;
    json_t *a;
    json_array_foreach(list, i, a) {
        json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        if (!json_is_object(a) || !json_is_integer(id) || !json_is_string(content))
            return fmt_(L, "added_tokens[%zu]: expected {\"id\": integer, \"content\": string, ...}", i);
        if (json_integer_value(id) < 0 || json_integer_value(id) >= TOK_MAX_ID_)
            return fmt_(L, "added_tokens[%zu].id = %lld: need 0..%d", i,
                        (long long)json_integer_value(id), TOK_MAX_ID_ - 1);
        if (json_string_length(content) == 0 || memchr(json_string_value(content), '\0', json_string_length(content)))
            return fmt_(L, "added_tokens[%zu].content: empty (or holds NUL); an added token needs text", i);
        if (bool_key_(a, "single_word", false))
            return unsupported_(L, "added_tokens[%zu].single_word = true (\"%.64s\"): not "
                                   "supported by zdp", i, json_string_value(content));
        zdp_status st = add_added_(L, json_string_value(content), json_string_length(content),
                                   (int32_t)json_integer_value(id), bool_key_(a, "special", false),
                                   bool_key_(a, "lstrip", false), bool_key_(a, "rstrip", false));
        if (st != ZDP_OK) return st;
    }
    return ZDP_OK;
}

/* ---- tokenizer.json ------------------------------------------------------------------------ */

static zdp_status load_model_(load_ctx_ *L, json_t *model) {
    if (!json_is_object(model)) return fmt_(L, "model: expected an object, got %s", zdp_json_type_name(model));
    const char *type = str_key_(model, "type");
    if (type != NULL && strcmp(type, "BPE") != 0)
        return unsupported_(L, "model.type = \"%.64s\": not supported; zdp reads byte-level "
                               "\"BPE\" only", type);
    json_t *d = json_object_get(model, "dropout");
    if (d != NULL && !json_is_null(d) && !(json_is_number(d) && json_number_value(d) == 0))
        return unsupported_(L, "model.dropout: BPE dropout is for training tokenizers; set null");
    if (bool_key_(model, "byte_fallback", false))
        return unsupported_(L, "model.byte_fallback = true: SentencePiece-style byte fallback is "
                               "not byte-level BPE; not supported");
    const char *cs = str_key_(model, "continuing_subword_prefix"), *ew = str_key_(model, "end_of_word_suffix");
    if ((cs && cs[0]) || (ew && ew[0]))
        return unsupported_(L, "model.%s = \"%.32s\": not supported (byte-level BPE has none)",
                            cs && cs[0] ? "continuing_subword_prefix" : "end_of_word_suffix",
                            cs && cs[0] ? cs : ew);
    L->t->ignore_merges = bool_key_(model, "ignore_merges", false);
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (vocab == NULL) return fmt_(L, "model.vocab: missing; a BPE model needs its vocabulary");
    if (merges == NULL) return fmt_(L, "model.merges: missing; a BPE model needs its merges");
    zdp_status st = load_vocab_(L, vocab, "model.vocab");
    if (st == ZDP_OK) st = load_merges_(L, merges, "model.merges");
    return st;
}

static zdp_status load_tokenizer_json_(load_ctx_ *L, json_t *root) {
    if (!json_is_object(root)) return fmt_(L, "expected a JSON object, got %s", zdp_json_type_name(root));
    zdp_status st = load_model_(L, json_object_get(root, "model"));
    if (st != ZDP_OK) return st;
    st = load_normalizer_(L, json_object_get(root, "normalizer"), "normalizer");
    if (st != ZDP_OK) return st;
    bool byte_level = false;
    st = load_pretok_(L, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", &byte_level);
    if (st != ZDP_OK) return st;
    if (!byte_level)
        return unsupported_(L, "pre_tokenizer: no \"ByteLevel\" step; zdp reads byte-level BPE "
                               "only (GPT-2, Llama 3, Qwen3)");
    json_t *dec = json_object_get(root, "decoder");
    const char *dt = json_is_object(dec) ? str_key_(dec, "type") : NULL;
    if (dt == NULL || strcmp(dt, "ByteLevel") != 0)
        return unsupported_(L, "decoder%s%s: zdp decodes byte-level BPE (\"type\": \"ByteLevel\")",
                            dt ? ".type = " : "", dt ? dt : " missing");
    return load_added_(L, json_object_get(root, "added_tokens"));
}

static void init_(load_ctx_ *L, zdp_tokenizer *t, const char *file, zdp_error *err) {
    *L = (load_ctx_){.t = t, .file = file, .err = err};
    t->bos_id = t->eos_id = -1;
    uint32_t cp_of[256];
    byte_chars_(cp_of);
    memset(L->byte_of_cp, 0xFF, sizeof L->byte_of_cp);
    for (int b = 0; b < 256; b++) L->byte_of_cp[cp_of[b]] = (int16_t)b;
}

zdp_status zdp_tokenizer_load_json(const char *json, size_t len, const char *origin,
                                   zdp_tokenizer **out, zdp_error *err) {
    if (out) *out = NULL;
    if (json == NULL || out == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_tokenizer_load_json: NULL argument");
    if (origin == NULL) origin = "<tokenizer.json>";
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL)
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: not valid JSON at line %d, column %d: %s",
                           origin, je.line, je.column, je.text);
    zdp_tokenizer *t = calloc(1, sizeof *t);
    if (t == NULL) {
        json_decref(root);
        return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", origin);
    }
    load_ctx_ L;
    init_(&L, t, origin, err);
    zdp_status st = load_tokenizer_json_(&L, root);
    json_decref(root);
    if (st != ZDP_OK) {
        zdp_tokenizer_destroy(t);
        return st;
    }
    *out = t;
    return ZDP_OK;
}

/* ---- the folder: tokenizer_config.json, GPT-2's two files ---------------------------------- */

static char *read_all_(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            char *g = realloc(buf, cap + 1);
            if (g == NULL) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = g;
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (r == 0) break;
    }
    fclose(f);
    buf[len] = '\0';
    *n = len;
    return buf;
}

static bool exists_(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

int32_t zdp_tokenizer_token_id(const zdp_tokenizer *t, const char *token) {
    if (t == NULL || token == NULL) return -1;
    const size_t n = strlen(token);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->added[i].text, token, n) == 0) return t->added[i].id;
    uint32_t cp_of[256];
    int16_t byte_of_cp[512];
    byte_chars_(cp_of);
    memset(byte_of_cp, 0xFF, sizeof byte_of_cp);
    for (int b = 0; b < 256; b++) byte_of_cp[cp_of[b]] = (int16_t)b;
    char *bytes = malloc(n + 1);
    if (bytes == NULL) return -1;
    long nb = token_bytes_(byte_of_cp, token, n, bytes);
    int32_t id = nb > 0 ? zdp_tok_vocab_find_(t, bytes, (size_t)nb) : -1;
    free(bytes);
    return id;
}

/* bos_token / eos_token of tokenizer_config.json: a string, {"content": ...} or null. */
static zdp_status config_token_(load_ctx_ *L, json_t *root, const char *key, int32_t *id) {
    json_t *v = json_object_get(root, key);
    if (v == NULL || json_is_null(v)) return ZDP_OK;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v))
        return fmt_(L, "%s: expected a token string, {\"content\": string} or null", key);
    *id = zdp_tokenizer_token_id(L->t, json_string_value(v));
    if (*id < 0)
        return fmt_(L, "%s = \"%.64s\": not a token of the tokenizer; name one of its added "
                       "tokens", key, json_string_value(v));
    return ZDP_OK;
}

static zdp_status load_config_(zdp_tokenizer *t, const char *path, zdp_error *err) {
    size_t n;
    char *text = read_all_(path, &n);
    if (text == NULL) return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot read it", path);
    json_error_t je;
    /* Reals for integers: Llama 3's model_max_length (1e30) is no int64. */
    json_t *root = json_loadb(text, n, JSON_DECODE_INT_AS_REAL, &je);
    free(text);
    if (root == NULL)
        return zdp_err_set(err, ZDP_ERR_FORMAT, "%s: not valid JSON at line %d, column %d: %s",
                           path, je.line, je.column, je.text);
    load_ctx_ L = {.t = t, .file = path, .err = err};
    zdp_status st = json_is_object(root) ? ZDP_OK : fmt_(&L, "expected a JSON object");
    if (st == ZDP_OK) st = config_token_(&L, root, "bos_token", &t->bos_id);
    if (st == ZDP_OK) st = config_token_(&L, root, "eos_token", &t->eos_id);
    json_decref(root);
    return st;
}

/* GPT-2's encoder.json (token -> id) and vocab.bpe ("#version" line, then "a b" merges). */
static zdp_status load_gpt2_(load_ctx_ *L, const char *enc_path, const char *bpe_path) {
    size_t n;
    char *text = read_all_(enc_path, &n);
    if (text == NULL) return zdp_err_set(L->err, ZDP_ERR_IO, "%s: cannot read it", enc_path);
    json_error_t je;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (root == NULL)
        return zdp_err_set(L->err, ZDP_ERR_FORMAT, "%s: not valid JSON at line %d, column %d: %s",
                           enc_path, je.line, je.column, je.text);
    L->file = enc_path;
    /* <|endoftext|> is GPT-2's one special token: an added token, not a BPE word. */
    json_t *eot = json_object_get(root, "<|endoftext|>");
    json_int_t eot_id = json_is_integer(eot) ? json_integer_value(eot) : -1;
    if (eot != NULL) json_object_del(root, "<|endoftext|>");
    zdp_status st = load_vocab_(L, root, "encoder.json");
    json_decref(root);
    if (st != ZDP_OK) return st;
    text = read_all_(bpe_path, &n);
    if (text == NULL) return zdp_err_set(L->err, ZDP_ERR_IO, "%s: cannot read it", bpe_path);
    L->file = bpe_path;
    size_t lines = 1;
    for (size_t i = 0; i < n; i++) lines += text[i] == '\n';
    st = merges_alloc_(L, lines);
    size_t rank = 0, line_no = 0;
    for (char *s = text; st == ZDP_OK && s < text + n;) {
        char *e = memchr(s, '\n', (size_t)(text + n - s));
        if (e == NULL) e = text + n;
        size_t len = (size_t)(e - s);
        if (len > 0 && s[len - 1] == '\r') len--;
        line_no++;
        if (len > 0 && !(line_no == 1 && s[0] == '#')) {
            char *sp = memchr(s, ' ', len);
            if (sp == NULL || sp == s || sp + 1 == s + len)
                st = fmt_(L, "line %zu = \"%.*s\": a merge line is two tokens with one space", line_no,
                          (int)(len > 64 ? 64 : len), s);
            else
                st = add_merge_(L, "merges", rank, s, (size_t)(sp - s), sp + 1, (size_t)(s + len - sp - 1));
            rank++;
        }
        s = e + 1;
    }
    free(text);
    if (st != ZDP_OK) return st;
    tok_stage s = {.mode = TOK_SPLIT_MATCHES};
    char why[300];
    s.re = zdp_tok_compile_(gpt2_pattern_, strlen(gpt2_pattern_), false, why, sizeof why);
    if (s.re == NULL) return zdp_err_set(L->err, ZDP_ERR_INTERNAL, "GPT-2 regex: %s", why);
    st = add_stage_(L, "GPT-2", s);
    if (st == ZDP_OK && eot_id >= 0) {
        L->file = enc_path;
        st = add_added_(L, "<|endoftext|>", 13, (int32_t)eot_id, true, false, false);
        L->t->bos_id = L->t->eos_id = (int32_t)eot_id;
    }
    return st;
}

zdp_status zdp_tokenizer_load(const char *dir, zdp_tokenizer **out, zdp_error *err) {
    if (out) *out = NULL;
    if (dir == NULL || out == NULL)
        return zdp_err_set(err, ZDP_ERR_INVALID_ARG, "zdp_tokenizer_load: NULL argument");
    char tj[PATH_MAX_], cfg[PATH_MAX_], enc[PATH_MAX_], bpe[PATH_MAX_];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    zdp_status st;
    zdp_tokenizer *t = NULL;
    if (exists_(tj)) {
        size_t n;
        char *text = read_all_(tj, &n);
        if (text == NULL) return zdp_err_set(err, ZDP_ERR_IO, "%s: cannot read it", tj);
        st = zdp_tokenizer_load_json(text, n, tj, &t, err);
        free(text);
        if (st == ZDP_OK && exists_(cfg)) st = load_config_(t, cfg, err);
    } else {
        static const char *const pairs_[][2] = {{"encoder.json", "vocab.bpe"},
                                                {"vocab.json", "merges.txt"}};
        int found = -1;
        for (int i = 0; i < 2 && found < 0; i++) {
            snprintf(enc, sizeof enc, "%s/%s", dir, pairs_[i][0]);
            snprintf(bpe, sizeof bpe, "%s/%s", dir, pairs_[i][1]);
            if (exists_(enc) && exists_(bpe)) found = i;
        }
        if (found < 0)
            return zdp_err_set(err, ZDP_ERR_IO, "%s: no tokenizer here: zdp reads tokenizer.json, "
                               "or GPT-2's encoder.json + vocab.bpe (vocab.json + merges.txt); "
                               "fix: point at the model's folder", dir);
        t = calloc(1, sizeof *t);
        if (t == NULL) return zdp_err_set(err, ZDP_ERR_NOMEM, "%s: out of memory", dir);
        load_ctx_ L;
        init_(&L, t, enc, err);
        st = load_gpt2_(&L, enc, bpe);
    }
    if (st != ZDP_OK) {
        zdp_tokenizer_destroy(t);
        return st;
    }
    *out = t;
    return ZDP_OK;
}

void zdp_tokenizer_destroy(zdp_tokenizer *t) {
    if (t == NULL) return;
    for (int32_t i = 0; i < t->n_vocab; i++) free(t->tok[i]);
    free(t->tok);
    free(t->tok_len);
    free(t->tok_bpe);
    free(t->vocab.slot);
    free(t->merges);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].text);
    free(t->added);
    for (int i = 0; i < t->n_stages; i++) pcre2_code_free(t->stages[i].re);
    free(t);
}

int32_t zdp_tokenizer_vocab_size(const zdp_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t zdp_tokenizer_bos_id(const zdp_tokenizer *t) { return t ? t->bos_id : -1; }
int32_t zdp_tokenizer_eos_id(const zdp_tokenizer *t) { return t ? t->eos_id : -1; }
