/*
 * cli.h -- what the zdp commands share: error exits, number parsing, the
 * unmanaged --schedule list, the per-step line, the progress line.
 */
#ifndef ZDP_TOOL_CLI_H
#define ZDP_TOOL_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "zdp/zdp.h"

#define CLI_MAX_SCHEDULE 1024

/* The generated arithmetic corpus: "a+b=c" with a, b in [0, 99] (the sum's
 * digits reversed, zdp.h), this many lines, the last tenth of them the
 * held-out problems; the GPT trainer's default data (at its default
 * --val-fraction) and `zdp gen-data --corpus arith` produce the same bytes
 * for the same seed. */
#define CLI_ARITH_MAX_OPERAND 99
#define CLI_ARITH_LINES 200000
#define CLI_ARITH_VAL_FRACTION 0.1

typedef struct cli_schedule {
    int64_t n[CLI_MAX_SCHEDULE];
    int len; /* 0: no --schedule */
} cli_schedule;

/* Rank 0 prints "zdp: error: ..." to stderr; returns 2 (the exit code for bad
 * input).  Arguments and files are the same on every rank, so every rank
 * reaches the same error and leaves with the same code. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A failure after training started: the message, then MPI_Abort (no rank
 * may be left waiting in a collective). */
void cli_die(const char *what, const zdp_error *err) __attribute__((noreturn));

bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
bool cli_parse_double(const char *s, double lo, double hi, double *out);
/* "2,5,3" -> counts >= 1; returns 0 or cli_fail's code. */
int cli_parse_schedule(const char *s, cli_schedule *out);
/* Micro-batches of optimizer step s: the schedule's entry, or G. */
int64_t cli_window(const cli_schedule *sch, bool managed, int64_t G, int64_t s);

/* --save-dir DIR --save-every K --resume DIR (issue contract: every K
 * optimizer steps DIR/global_step{N}/ and DIR/latest; --resume continues
 * from DIR/latest; --steps counts resumed steps too). */
typedef struct cli_ckpt {
    const char *save_dir, *resume;
    int64_t save_every;
} cli_ckpt;

/* Takes option a with value v if it is one of the three: 1 taken, 0 not
 * ours, 2 bad value (cli_fail printed). */
int cli_ckpt_option(const char *a, const char *v, cli_ckpt *c);
/* COLLECTIVE.  With --resume: loads DIR/latest into eng and returns the
 * saved sample cursor in *cursor; 0 or cli_fail's code. */
int cli_ckpt_resume(zdp_engine *eng, const cli_ckpt *c, int64_t *cursor);
/* COLLECTIVE.  After an optimizer step: saves when the step is a multiple of
 * --save-every, or when `last` and --save-dir is set.  Failures end the job. */
void cli_ckpt_after_step(zdp_engine *eng, const cli_ckpt *c, int64_t cursor, bool last);

/* The GPT's shape flags, shared by train --model gpt and serve:
 * --n-layer --n-head --n-embd --vocab-size --block-size. */
#define CLI_GPT_DEFAULT {.n_layer = 4, .n_head = 4, .n_embd = 128, .vocab_size = 256, .block_size = 64}
/* Takes option a with value v if it is one of them: 1 taken, 0 not ours,
 * 2 bad value (cli_fail printed). */
int cli_gpt_option(const char *a, const char *v, zdp_gpt_config *c);

/* Seconds on a monotonic clock. */
double cli_now(void);
/* "1h02m", "3m05s", "12s" */
void cli_format_eta(double seconds, char *out, int n);

#endif /* ZDP_TOOL_CLI_H */
