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

/* Records "..." as this rank's error and returns 2 (the exit code for bad
 * input).  Nothing is printed yet: a start-up failure may happen on one rank
 * only (its own files, its own working directory), so commands meet at
 * cli_agree, which prints what failed where; main() prints whatever is still
 * pending when a command returns an error without reaching one. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* COLLECTIVE.  Every rank passes its start-up result (0, or cli_fail's code
 * with its message recorded).  Returns 0 when every rank succeeded;
 * otherwise rank 0 prints "zdp: error: " and every failing rank's message
 * with its rank ("rank 1: --data ...", the rank left out when every rank
 * failed alike), and every rank returns non-zero (rc, or 2 where another
 * rank failed).  Every step that can fail on one rank goes before one. */
int cli_agree(int rc);
/* Rank 0 prints the pending cli_fail message, if any (main(), at exit). */
void cli_flush_error(void);
/* A failure after training started: the message, then MPI_Abort (no rank
 * may be left waiting in a collective). */
void cli_die(const char *what, const zdp_error *err) __attribute__((noreturn));
/* The same with a message of its own: the tool, not the library, ends the
 * job (zdp_dist_abort returns when MPI is not running). */
void cli_abort(const char *msg) __attribute__((noreturn));

bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
bool cli_parse_double(const char *s, double lo, double hi, double *out);
/* "2,5,3" -> counts >= 1; returns 0 or cli_fail's code. */
int cli_parse_schedule(const char *s, cli_schedule *out);
/* Micro-batches of optimizer step s: the schedule's entry, or G. */
int64_t cli_window(const cli_schedule *sch, bool managed, int64_t G, int64_t s);

/* ---- the option loop ----------------------------------------------------------- */

/* One command-line option: its flag, what its value is, where it goes and
 * its bounds.  A command lists its options in a table and parses argv with
 * cli_parse_options, so every command reads values, and words its errors,
 * the same way: a bad value fails with "FLAG VALUE: NEED". */
typedef enum cli_opt_kind {
    CLI_OPT_STR,      /* const char **: the argument itself */
    CLI_OPT_I64,      /* int64_t *, an integer in [lo, hi] */
    CLI_OPT_INT,      /* int *, an integer in [lo, hi] (hi <= INT_MAX) */
    CLI_OPT_U64,      /* uint64_t *, an integer in [lo, hi] (lo >= 0) */
    CLI_OPT_F64,      /* double *, a number in [dlo, dhi] */
    CLI_OPT_CHOICE,   /* int *: values[i] for the word choices[i]; ptr NULL: checked only */
    CLI_OPT_SCHEDULE, /* cli_schedule *: "2,5,3" (cli_parse_schedule's messages) */
    CLI_OPT_IGNORE,   /* taken, value unused (--model, which main() dispatched on) */
    CLI_OPT_WORD,     /* const char **: the argument, not empty, none of `reject`'s characters */
    CLI_OPT_LIST,     /* const char ***: repeatable; each argument (a WORD) is appended to a
                       * realloc'ed array (the caller frees it) of *count entries */
    CLI_OPT_FLAG,     /* int *: a switch without a value (--tie); sets *ptr = lo */
} cli_opt_kind;

typedef struct cli_opt {
    const char *flag;            /* "--steps" */
    cli_opt_kind kind;
    void *ptr;                   /* where the value goes, of the kind's type */
    int64_t lo, hi;              /* CLI_OPT_I64, _INT, _U64 */
    double dlo, dhi;             /* CLI_OPT_F64 */
    const char *need;            /* what a good value is: "need an integer >= 0" */
    const char *const *choices;  /* CLI_OPT_CHOICE: the words, NULL-terminated */
    const int *values;           /* CLI_OPT_CHOICE: what each word stores */
    int *count;                  /* CLI_OPT_LIST: the array's length */
    /* CLI_OPT_WORD, _LIST: characters a value may not contain (NULL: any);
     * an empty value fails with "FLAG: must not be empty". */
    const char *reject;
} cli_opt;

#define CLI_STR(f, p) {.flag = (f), .kind = CLI_OPT_STR, .ptr = (p)}
#define CLI_I64(f, p, l, h, n) {.flag = (f), .kind = CLI_OPT_I64, .ptr = (p), .lo = (l), .hi = (h), .need = (n)}
#define CLI_INT(f, p, l, h, n) {.flag = (f), .kind = CLI_OPT_INT, .ptr = (p), .lo = (l), .hi = (h), .need = (n)}
#define CLI_U64(f, p, l, h, n) {.flag = (f), .kind = CLI_OPT_U64, .ptr = (p), .lo = (l), .hi = (h), .need = (n)}
#define CLI_F64(f, p, l, h, n) {.flag = (f), .kind = CLI_OPT_F64, .ptr = (p), .dlo = (l), .dhi = (h), .need = (n)}
#define CLI_CHOICE(f, p, words, vals, n) \
    {.flag = (f), .kind = CLI_OPT_CHOICE, .ptr = (p), .choices = (words), .values = (vals), .need = (n)}
#define CLI_SCHEDULE(f, p) {.flag = (f), .kind = CLI_OPT_SCHEDULE, .ptr = (p)}
#define CLI_IGNORE(f) {.flag = (f), .kind = CLI_OPT_IGNORE}
#define CLI_FLAG(f, p, v) {.flag = (f), .kind = CLI_OPT_FLAG, .ptr = (p), .lo = (v)}
#define CLI_WORD(f, p, rej, n) {.flag = (f), .kind = CLI_OPT_WORD, .ptr = (p), .reject = (rej), .need = (n)}
#define CLI_LIST(f, p, cnt, rej, n) \
    {.flag = (f), .kind = CLI_OPT_LIST, .ptr = (p), .count = (cnt), .reject = (rej), .need = (n)}

/* How a command words the two errors that are not about one value. */
typedef struct cli_command {
    /* After "ARG: " when an option has no value (or, with dashes, an
     * argument is not an option): "missing value (see zdp sample --help)". */
    const char *missing;
    /* After "unknown option FLAG": " (see zdp train --help)". */
    const char *unknown;
    bool dashes; /* every option must start with "--" */
} cli_command;

/* Takes option a with value v if opts[0..n) has it: 1 taken, 0 not ours,
 * 2 bad value (cli_fail's message recorded). */
int cli_take_option(const cli_opt *opts, int n, const char *a, const char *v);
/* Parses argv[0..argc) as FLAG VALUE pairs against opts[0..n) (a
 * CLI_OPT_FLAG switch stands alone): 0 when all were taken, 1 at -h/--help
 * (the caller prints its usage), else cli_fail's code with its message
 * recorded. */
int cli_parse_options(const cli_command *cmd, const cli_opt *opts, int n, int argc,
                      char **argv);

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
/* The three as option rows, for a command's table (c: a cli_ckpt *). */
#define CLI_CKPT_ROWS(c)                                                        \
    CLI_STR("--save-dir", &(c)->save_dir), CLI_STR("--resume", &(c)->resume), \
    CLI_I64("--save-every", &(c)->save_every, 1, INT64_MAX / 4,                 \
            "need an integer >= 1 (optimizer steps)")
/* Checks that this rank can write output `path` (flag: the option, for the
 * message): a directory (is_dir) must be one, or be creatable under the
 * nearest existing directory above it; a file's directory must exist.  Both
 * must be writable.  Creates nothing.  0 or cli_fail's code. */
int cli_check_output(const char *flag, const char *path, bool is_dir);
/* With --save-dir: checks on this rank (every rank writes its own files
 * there) that DIR, or the nearest existing directory above it, is a
 * directory it can write, so an unusable DIR stops the job at start-up
 * instead of at the first save.  Creates nothing.  0 or cli_fail's code. */
int cli_ckpt_prepare(const cli_ckpt *c);
/* COLLECTIVE.  With --resume: loads DIR/latest into eng and returns the
 * saved sample cursor in *cursor; then agrees (cli_agree): 0 or non-zero on
 * every rank, the failing ranks' messages printed. */
int cli_ckpt_resume(zdp_engine *eng, const cli_ckpt *c, int64_t *cursor);
/* COLLECTIVE.  After an optimizer step: saves when the step is a multiple of
 * --save-every, or when `last` and --save-dir is set.  Failures end the job. */
void cli_ckpt_after_step(zdp_engine *eng, const cli_ckpt *c, int64_t cursor, bool last);

/* --max-skipped-steps K: `zdp train` stops with an error after K optimizer
 * steps in a row were skipped (a NaN/Inf gradient, or an update that would
 * make the weights non-finite): such a run learns nothing, and exiting 0
 * would hide it.  0 turns the check off. */
#define CLI_MAX_SKIPPED_DEFAULT 100
/* Parses the flag's value into *max: 1 taken, 2 bad value (cli_fail printed). */
int cli_max_skipped_option(const char *v, int64_t *max);
/* The option row (p: an int64_t *). */
#define CLI_MAX_SKIPPED_ROW(p)                                                  \
    CLI_I64("--max-skipped-steps", (p), 0, INT64_MAX,                           \
            "need an integer >= 0 (0 = never stop; default "                    \
            CLI_QUOTE_(CLI_MAX_SKIPPED_DEFAULT) ")")
#define CLI_QUOTE_(x) CLI_QUOTE2_(x)
#define CLI_QUOTE2_(x) #x
/* After each optimizer step: counts consecutive skipped steps in *run and
 * returns 1 (with the cause printed on rank 0) when they reach max > 0,
 * else 0.  Whether a step is skipped is decided by all ranks together, so
 * every rank returns the same. */
int cli_skip_guard(const zdp_engine *eng, int64_t max, int64_t *run);

/* The engine's parameters as whole tensors (views[i] for tensor i): at ZeRO
 * stages 0-2 the engine's own buffers; at stage 3 a copy gathered from the
 * partitions onto rank 0 (COLLECTIVE: every rank calls it, gather = true;
 * the other ranks' views all point at one tensor-sized scratch buffer, so
 * their values mean nothing: use them on rank 0 only) or a zeroed copy to
 * fill and push (gather = false, not collective).  NULL (message
 * printed) on failure.  cli_params_push writes the views back (every rank
 * alike) and syncs; cli_params_free frees a copy. */
float **cli_params_views(zdp_engine *eng, const zdp_model *model, bool gather);
int cli_params_push(zdp_engine *eng, const zdp_model *model, float **views);
void cli_params_free(zdp_engine *eng, float **views);

/* COLLECTIVE.  --memory-report: rank 0 prints every rank's engine memory,
 * one line per rank and category ("memory | rank R | CATEGORY | N B").
 * 0, or cli_fail's code. */
int cli_memory_report(zdp_engine *eng);
/* COLLECTIVE.  --memory-report at the end of a run: rank 0 prints each
 * rank's peak resident memory (VmHWM, "memory | rank R | peak_rss | N B";
 * -1 where /proc is missing) and the most bytes of weights its model-folder
 * loader held at once (zdp_hf_load_peak_bytes, "... | load_peak | N B").
 * 0. */
int cli_memory_peaks(void);
/* The --memory-report row: on or off (int *p: 1 or 0). */
#define CLI_MEMORY_REPORT_ROW(p) \
    CLI_CHOICE("--memory-report", (p), cli_on_off_words, cli_on_off_values, "on or off")
extern const char *const cli_on_off_words[];
extern const int cli_on_off_values[];

/* NaN or Inf in loaded data or weights is refused at load: 0 when all n
 * values are finite, else cli_fail's code with "FLAG PATH: NAME[row, col] =
 * VALUE" (cols > 0: a row-major matrix; 0: a flat index). */
int cli_check_finite(const char *flag, const char *path, const char *name, const float *v,
                     int64_t n, int64_t cols);

/* The GPT's shape flags, shared by train --model gpt and serve:
 * --n-layer --n-head --n-embd --vocab-size --block-size. */
#define CLI_GPT_DEFAULT {.n_layer = 4, .n_head = 4, .n_embd = 128, .vocab_size = 256, .block_size = 64}
/* Takes option a with value v if it is one of them: 1 taken, 0 not ours,
 * 2 bad value (cli_fail printed). */
int cli_gpt_option(const char *a, const char *v, zdp_gpt_config *c);
/* The five as option rows (c: a zdp_gpt_config *). */
#define CLI_GPT_ROWS(c)                                                         \
    CLI_INT("--n-layer", &(c)->n_layer, 1, 1 << 24, "need a positive integer"), \
    CLI_INT("--n-head", &(c)->n_head, 1, 1 << 24, "need a positive integer"),   \
    CLI_INT("--n-embd", &(c)->n_embd, 1, 1 << 24, "need a positive integer"),   \
    CLI_INT("--vocab-size", &(c)->vocab_size, 1, 1 << 24, "need a positive integer"), \
    CLI_INT("--block-size", &(c)->block_size, 1, 1 << 24, "need a positive integer")

/* Seconds on a monotonic clock. */
double cli_now(void);
/* "1h02m", "3m05s", "12s" */
void cli_format_eta(double seconds, char *out, int n);

#endif /* ZDP_TOOL_CLI_H */
