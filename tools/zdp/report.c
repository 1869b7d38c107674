/*
 * report.c -- the metrics CSV and the SVG loss curve of `zdp train`.
 *
 * The CSV has one row per optimizer step and one column per metric, named
 * with DeepSpeed's monitor keys where DeepSpeed has one (Train/Samples/...,
 * docs.deepspeed.ai "Monitor") and in the same style where it has not.
 */
#define _POSIX_C_SOURCE 200809L
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int mkdirs_(const char *path) {
    char buf[4096];
    if (strlen(path) >= sizeof buf) return errno = ENAMETOOLONG, -1;
    strcpy(buf, path);
    char *slash = strrchr(buf, '/');
    if (slash == NULL || slash == buf) return 0;
    *slash = '\0';
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
    return 0;
}

int metrics_open(metrics_log *m, const char *path) {
    memset(m, 0, sizeof *m);
    if (mkdirs_(path) != 0) return -1;
    m->csv = fopen(path, "w");
    if (m->csv == NULL) return -1;
    fprintf(m->csv,
            "step,samples,tokens,Train/Samples/train_loss,Train/Samples/val_loss,"
            "Train/Samples/lr,Train/Samples/grad_norm,Train/Samples/skipped,"
            "Train/Samples/tokens_per_sec,Train/Samples/elapsed_time_ms_forward,"
            "Train/Samples/elapsed_time_ms_backward,Train/Samples/elapsed_time_ms_comm_wait,"
            "Train/Samples/elapsed_time_ms_step,Train/Samples/elapsed_time_ms_total\n");
    return 0;
}

void metrics_add(metrics_log *m, const metrics_row *r) {
    if (m->csv != NULL) {
        fprintf(m->csv, "%lld,%lld,%lld,%.6f,", (long long)r->step, (long long)r->samples,
                (long long)r->tokens, r->train_loss);
        if (isnan(r->val_loss)) fprintf(m->csv, ",");
        else fprintf(m->csv, "%.6f,", r->val_loss);
        fprintf(m->csv, "%.6g,%.6f,%d,%.1f,%.3f,%.3f,%.3f,%.3f,%.3f\n", r->lr, r->grad_norm,
                r->skipped ? 1 : 0, r->tokens_per_s, r->fwd_ms, r->bwd_ms, r->comm_wait_ms,
                r->opt_ms, r->step_ms);
        fflush(m->csv);
    }
    if (m->n == m->cap) {
        int64_t cap = m->cap ? 2 * m->cap : 256;
        double *s = realloc(m->step, (size_t)cap * sizeof *s);
        if (s == NULL) return;
        m->step = s;
        double *t = realloc(m->train, (size_t)cap * sizeof *t);
        if (t == NULL) return;
        m->train = t;
        double *v = realloc(m->val, (size_t)cap * sizeof *v);
        if (v == NULL) return;
        m->val = v;
        m->cap = cap;
    }
    m->step[m->n] = (double)r->step;
    m->train[m->n] = r->train_loss;
    m->val[m->n] = r->val_loss;
    m->n++;
}

void metrics_close(metrics_log *m) {
    if (m->csv != NULL) fclose(m->csv);
    free(m->step);
    free(m->train);
    free(m->val);
    memset(m, 0, sizeof *m);
}

/* ---- the picture ------------------------------------------------------------ */

#define W_ 720.0
#define H_ 420.0
#define L_ 70.0 /* margins */
#define R_ 20.0
#define T_ 40.0
#define B_ 50.0

static void polyline_(FILE *f, const metrics_log *m, const double *y, double x0, double x1,
                      double y0, double y1, const char *color, double width) {
    bool open = false;
    for (int64_t i = 0; i < m->n; i++) {
        if (!isfinite(y[i])) continue;
        double px = L_ + (m->step[i] - x0) / (x1 - x0) * (W_ - L_ - R_);
        double py = H_ - B_ - (y[i] - y0) / (y1 - y0) * (H_ - T_ - B_);
        fprintf(f, "%s%.1f,%.1f", open ? " " : "<polyline fill=\"none\" points=\"", px, py);
        open = true;
    }
    if (open) fprintf(f, "\" stroke=\"%s\" stroke-width=\"%.1f\"/>\n", color, width);
}

int metrics_plot_svg(const metrics_log *m, const char *path, const char *title) {
    if (mkdirs_(path) != 0) return -1;
    FILE *f = fopen(path, "w");
    if (f == NULL) return -1;
    double x0 = m->n ? m->step[0] : 0, x1 = m->n ? m->step[m->n - 1] : 1;
    if (x1 <= x0) x1 = x0 + 1;
    double y0 = INFINITY, y1 = -INFINITY;
    for (int64_t i = 0; i < m->n; i++) {
        const double v[2] = {m->train[i], m->val[i]};
        for (int k = 0; k < 2; k++)
            if (isfinite(v[k])) {
                if (v[k] < y0) y0 = v[k];
                if (v[k] > y1) y1 = v[k];
            }
    }
    if (!isfinite(y0)) y0 = 0, y1 = 1;
    if (y1 - y0 < 1e-9) y1 = y0 + 1;
    double pad = 0.05 * (y1 - y0);
    y0 -= pad;
    y1 += pad;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n", W_, H_);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.0f\" y=\"24\" font-size=\"15\">", L_);
    for (const char *c = title; *c; c++) {
        if (*c == '<') fputs("&lt;", f);
        else if (*c == '&') fputs("&amp;", f);
        else fputc(*c, f);
    }
    fprintf(f, "</text>\n");
    /* Axes, ticks and grid. */
    for (int k = 0; k <= 5; k++) {
        double yv = y0 + (y1 - y0) * k / 5.0, py = H_ - B_ - (H_ - T_ - B_) * k / 5.0;
        double xv = x0 + (x1 - x0) * k / 5.0, px = L_ + (W_ - L_ - R_) * k / 5.0;
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L_,
                py, W_ - R_, py);
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n", L_ - 6,
                py + 4, yv);
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.0f</text>\n", px,
                H_ - B_ + 18, xv);
    }
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
               "stroke=\"black\"/>\n", L_, T_, W_ - L_ - R_, H_ - T_ - B_);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">optimizer step</text>\n",
            (W_ + L_) / 2, H_ - 12);
    fprintf(f, "<text x=\"16\" y=\"%.0f\" transform=\"rotate(-90 16 %.0f)\" "
               "text-anchor=\"middle\">loss</text>\n", (H_ + T_) / 2, (H_ + T_) / 2);
    polyline_(f, m, m->train, x0, x1, y0, y1, "#1f77b4", 1.5);
    polyline_(f, m, m->val, x0, x1, y0, y1, "#d62728", 2.0);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" fill=\"#1f77b4\">train</text>\n", W_ - R_ - 90, T_ + 16);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" fill=\"#d62728\">val</text>\n", W_ - R_ - 40, T_ + 16);
    fprintf(f, "</svg>\n");
    return fclose(f) == 0 ? 0 : -1;
}
