/*
 * report.h -- what `zdp train` writes besides its printed lines: a metrics
 * CSV with DeepSpeed's monitor keys, and a loss-curve picture (SVG).
 * Rank 0 only; no MPI here.
 */
#ifndef ZDP_TOOL_REPORT_H
#define ZDP_TOOL_REPORT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* One optimizer step's row.  Times are this rank's, in milliseconds. */
typedef struct metrics_row {
    int64_t step, samples, tokens;
    double train_loss, val_loss; /* val_loss: NaN when not evaluated this step */
    double lr, grad_norm, tokens_per_s;
    bool skipped;
    double fwd_ms, bwd_ms, comm_wait_ms, opt_ms, step_ms;
} metrics_row;

typedef struct metrics_log {
    FILE *csv;
    /* Kept for the picture. */
    int64_t n, cap;
    double *step, *train, *val;
} metrics_log;

/* Opens path for writing (creating its directory) and writes the header.
 * Returns 0, or -1 with errno set. */
int metrics_open(metrics_log *m, const char *path);
void metrics_add(metrics_log *m, const metrics_row *r);
void metrics_close(metrics_log *m);
/* Writes the train (and val) loss against the step as an SVG line chart.
 * Returns 0, or -1 with errno set. */
int metrics_plot_svg(const metrics_log *m, const char *path, const char *title);

#endif /* ZDP_TOOL_REPORT_H */
