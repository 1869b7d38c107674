/*
 * bench_tokenizer.c -- encode speed of zdp's tokenizer on one core: loads
 * the tokenizer of DIR, reads FILE, encodes it RUNS times (with
 * ZDP_TOKENIZE_SPECIAL, as the reference comparison does) and prints one
 * line per run: "MB/s ids seconds".  bench/run_tokenizer_bench.sh runs it
 * alternately with the reference (transformers.js under Node.js) and
 * docs/benchmarks-tokenizer.md has the figures.
 *
 * usage: bench_tokenizer DIR FILE [RUNS]
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "zdp/zdp.h"

static double now_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenizer DIR FILE [RUNS]\n");
        return 2;
    }
    const int runs = argc > 3 ? atoi(argv[3]) : 5;
    zdp_tokenizer *tok = NULL;
    zdp_error err;
    const double t0 = now_();
    if (zdp_tokenizer_load(argv[1], &tok, &err) != ZDP_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "load %.3f s\n", now_() - t0);
    FILE *f = fopen(argv[2], "rb");
    if (f == NULL) {
        fprintf(stderr, "bench_tokenizer: cannot open %s\n", argv[2]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (text == NULL || fread(text, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "bench_tokenizer: cannot read %s\n", argv[2]);
        return 1;
    }
    fclose(f);
    for (int r = 0; r < runs; r++) {
        int32_t *ids = NULL;
        size_t k = 0;
        const double a = now_();
        if (zdp_tokenizer_encode(tok, text, (size_t)n, ZDP_TOKENIZE_SPECIAL, &ids, &k, &err) != ZDP_OK) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        const double s = now_() - a;
        printf("%.3f MB/s %zu ids %.3f s\n", (double)n / 1e6 / s, k, s);
        free(ids);
    }
    free(text);
    zdp_tokenizer_destroy(tok);
    return 0;
}
