/*
 * tokenize.c -- `zdp tokenize`: text on stdin -> token ids on stdout (one
 * line, separated by spaces), or ids -> text with --decode; the tool for
 * checking what a dataset becomes (docs/models.md, "Tokenizers").
 *
 *   zdp tokenize --tokenizer DIR [--special] < text.txt
 *   zdp tokenize --tokenizer DIR --decode < ids.txt
 *
 * Runs on rank 0 only; other ranks of an mpirun do nothing.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "zdp/zdp.h"

int cmd_tokenize(int argc, char **argv);

static void usage_tokenize_(void) {
    printf("usage: zdp tokenize --tokenizer DIR [--special] < TEXT   text -> ids (one line)\n"
           "       zdp tokenize --tokenizer DIR --decode < IDS      ids -> text\n"
           "\n"
           "  --tokenizer DIR   a folder with tokenizer.json (+ tokenizer_config.json), or\n"
           "                    GPT-2's encoder.json + vocab.bpe\n"
           "  --special         text such as <|endoftext|> becomes the special token\n"
           "                    (default: encoded as plain text)\n"
           "  --decode          read ids (separated by white space), write their text\n");
}

/* All of stdin; NULL (with cli_fail's message) on failure. */
static char *read_stdin_(size_t *n) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    while (buf != NULL) {
        size_t r = fread(buf + len, 1, cap - len, stdin);
        len += r;
        if (r == 0) break;
        if (len == cap) {
            char *g = realloc(buf, 2 * cap + 1);
            if (g == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = g;
            cap *= 2;
        }
    }
    if (buf == NULL) {
        cli_fail("tokenize: out of memory reading stdin");
        return NULL;
    }
    if (ferror(stdin)) {
        free(buf);
        cli_fail("tokenize: cannot read stdin");
        return NULL;
    }
    buf[len] = '\0';
    *n = len;
    return buf;
}

/* "12 7\n99" -> ids; 0 or cli_fail's code naming the bad entry. */
static int parse_ids_(char *s, int32_t **ids, size_t *n) {
    size_t cap = 1024, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (v == NULL) return cli_fail("tokenize: out of memory");
    for (char *w = strtok(s, " \t\r\n"); w != NULL; w = strtok(NULL, " \t\r\n")) {
        int64_t id;
        if (!cli_parse_i64(w, 0, INT32_MAX, &id)) {
            free(v);
            return cli_fail("tokenize --decode: stdin entry %zu = \"%.40s\": need a token id "
                            "(an integer >= 0), ids separated by white space", k + 1, w);
        }
        if (k == cap) {
            int32_t *g = realloc(v, 2 * cap * sizeof *g);
            if (g == NULL) {
                free(v);
                return cli_fail("tokenize: out of memory");
            }
            v = g;
            cap *= 2;
        }
        v[k++] = (int32_t)id;
    }
    *ids = v;
    *n = k;
    return 0;
}

static int encode_(const zdp_tokenizer *tok, const char *text, size_t len, int special) {
    int32_t *ids = NULL;
    size_t n = 0;
    zdp_error err;
    if (zdp_tokenizer_encode(tok, text, len, special ? ZDP_TOKENIZE_SPECIAL : 0, &ids, &n, &err) !=
        ZDP_OK)
        return cli_fail("tokenize: %s", err.msg);
    for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    return 0;
}

static int decode_(const zdp_tokenizer *tok, char *text) {
    int32_t *ids = NULL;
    size_t n = 0, len = 0;
    int rc = parse_ids_(text, &ids, &n);
    if (rc != 0) return rc;
    char *out = NULL;
    zdp_error err;
    if (zdp_tokenizer_decode(tok, ids, n, &out, &len, &err) != ZDP_OK)
        rc = cli_fail("tokenize --decode: stdin %s", err.msg);
    else if (fwrite(out, 1, len, stdout) != len)
        rc = cli_fail("tokenize --decode: cannot write stdout");
    free(out);
    free(ids);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL;
    int decode = 0, special = 0;
    const cli_opt opts[] = {
        CLI_STR("--tokenizer", &dir),
        CLI_FLAG("--decode", &decode, 1),
        CLI_FLAG("--special", &special, 1),
    };
    static const cli_command cmd = {.missing = "missing value (see zdp tokenize --help)",
                                    .unknown = " for tokenize (see zdp tokenize --help)",
                                    .dashes = true};
    int rc = cli_parse_options(&cmd, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv);
    if (rc == 1) {
        if (zdp_dist_rank() == 0) usage_tokenize_();
        return 0;
    }
    if (rc != 0) return rc;
    if (dir == NULL)
        return cli_fail("tokenize needs --tokenizer DIR (a folder with tokenizer.json, or "
                        "GPT-2's encoder.json + vocab.bpe)");
    if (zdp_dist_rank() != 0) return 0;
    zdp_tokenizer *tok = NULL;
    zdp_error err;
    if (zdp_tokenizer_load(dir, &tok, &err) != ZDP_OK) return cli_fail("--tokenizer: %s", err.msg);
    size_t len = 0;
    char *text = read_stdin_(&len);
    if (text == NULL) rc = 2;
    else if (decode) rc = decode_(tok, text);
    else rc = encode_(tok, text, len, special);
    free(text);
    zdp_tokenizer_destroy(tok);
    if (rc == 0 && fflush(stdout) != 0) rc = cli_fail("tokenize: cannot write stdout");
    return rc;
}
