/* The reports' charts: inline SVG of the fault experiment's loss curves,
 * of the islands' membership over time and of compute utilisation, and the
 * line charts of a training run's report. One file: every chart draws with
 * the same frame, axes, ticks and legend helpers. */
#include "report/report_internal.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ---------------------------------------------------------------- SVG */

static const char *const C_BASE = "#1f77b4", *const C_FAULT = "#d62728", *const C_IN = "#2ca02c",
                         *const C_SUSPECT = "#ff7f0e", *const C_LATE = "#bcbd22",
                         *const C_JOIN = "#1f77b4", *const C_GRID = "#e5e5e5",
                         *const C_DIV = "#9467bd";

typedef struct {
    double x0, x1, y0, y1;  /* data ranges */
    double left, top, w, h; /* plot area in pixels */
} frame;

static double px(const frame *f, double x) {
    return f->left + (x - f->x0) / (f->x1 - f->x0) * f->w;
}
static double py(const frame *f, double y) {
    return f->top + (f->y1 - y) / (f->y1 - f->y0) * f->h;
}

/* A round tick spacing (1, 2 or 5 times a power of ten) for ~target ticks. */
static double nice_step(double range, int target) {
    double raw = range / target;
    double p = pow(10, floor(log10(raw)));
    double m = raw / p;
    return (m < 1.5 ? 1 : m < 3 ? 2 : m < 7 ? 5 : 10) * p;
}

static void tick_label(char *buf, size_t cap, double v, double step) {
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    if (fabs(v) < step * 1e-6)
        v = 0;
    snprintf(buf, cap, "%.*f", dec, v);
}

static void svg_begin(sbuf *b, int w, int h, const char *title) {
    report_sb_printf(b,
              "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
              "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\" role=\"img\" "
              "aria-label=\"",
              w, h, w, h);
    report_sb_html(b, title);
    report_sb_puts(b, "\">\n<title>");
    report_sb_html(b, title);
    report_sb_printf(b, "</title>\n<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", w, h);
    report_sb_printf(b,
              "<text x=\"%d\" y=\"16\" text-anchor=\"middle\" font-size=\"13\" "
              "font-weight=\"bold\">",
              w / 2);
    report_sb_html(b, title);
    report_sb_puts(b, "</text>\n");
}

static void svg_text(sbuf *b, double x, double y, const char *anchor, const char *extra,
                     const char *text) {
    report_sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s%s>", x, y, anchor,
              extra ? " " : "", extra ? extra : "");
    report_sb_html(b, text);
    report_sb_puts(b, "</text>\n");
}

/* Grid, ticks and labels of both axes; y_ticks false leaves the y axis bare. */
static void svg_axes(sbuf *b, const frame *f, const char *xlabel, const char *ylabel,
                     bool y_ticks) {
    char lab[64];
    double xs = nice_step(f->x1 - f->x0, 8);
    for (double x = ceil(f->x0 / xs - 1e-9) * xs; x <= f->x1 + xs * 1e-9; x += xs) {
        double X = px(f, x);
        report_sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", X,
                  f->top, X, f->top + f->h, C_GRID);
        report_sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                  X, f->top + f->h, X, f->top + f->h + 4);
        tick_label(lab, sizeof lab, x, xs);
        svg_text(b, X, f->top + f->h + 16, "middle", NULL, lab);
    }
    if (y_ticks) {
        double ys = nice_step(f->y1 - f->y0, 6);
        for (double y = ceil(f->y0 / ys - 1e-9) * ys; y <= f->y1 + ys * 1e-9; y += ys) {
            double Y = py(f, y);
            report_sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n",
                      f->left, Y, f->left + f->w, Y, C_GRID);
            report_sb_printf(b,
                      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                      f->left - 4, Y, f->left, Y);
            tick_label(lab, sizeof lab, y, ys);
            svg_text(b, f->left - 6, Y + 4, "end", NULL, lab);
        }
    }
    report_sb_printf(b,
              "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
              "stroke=\"black\"/>\n",
              f->left, f->top, f->w, f->h);
    svg_text(b, f->left + f->w / 2, f->top + f->h + 32, "middle", NULL, xlabel);
    if (ylabel) {
        char rot[96];
        snprintf(rot, sizeof rot, "transform=\"rotate(-90 14 %.1f)\"", f->top + f->h / 2);
        svg_text(b, 14, f->top + f->h / 2, "middle", rot, ylabel);
    }
}

/* A polyline through the finite points, broken where a step gap is over
 * three times the usual spacing, decimated to REPORT_MAX_POINTS. */
static void svg_series(sbuf *b, const frame *f, const int64_t *xs, const double *ys, size_t xstride,
                       size_t ystride, int n, const char *color, double width, double opacity) {
    int stride = n > REPORT_MAX_POINTS ? (n + REPORT_MAX_POINTS - 1) / REPORT_MAX_POINTS : 1;
    int64_t gap = INT64_MAX;
    int64_t prev = INT64_MIN;
    for (int i = 0; i < n; i++) {
        int64_t x = *(const int64_t *)((const char *)xs + (size_t)i * xstride);
        if (prev != INT64_MIN && x - prev < gap && x > prev)
            gap = x - prev;
        prev = x;
    }
    gap = gap == INT64_MAX ? 1 : gap * 3 * stride;
    bool open = false;
    int64_t last = 0;
    for (int i = 0; i < n; i += stride) {
        int64_t x = *(const int64_t *)((const char *)xs + (size_t)i * xstride);
        double y = *(const double *)((const char *)ys + (size_t)i * ystride);
        if (isnan(y))
            continue;
        if (open && x - last > gap) {
            report_sb_puts(b, "\"/>\n");
            open = false;
        }
        if (!open) {
            report_sb_printf(b,
                      "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" "
                      "stroke-opacity=\"%.2f\" points=\"",
                      color, width, opacity);
            open = true;
        } else {
            report_sb_puts(b, " ");
        }
        report_sb_printf(b, "%.1f,%.1f", px(f, (double)x), py(f, y));
        last = x;
    }
    if (open)
        report_sb_puts(b, "\"/>\n");
}

static void svg_marker(sbuf *b, const char *shape, double x, double y, const char *color,
                       const char *tip) {
    report_sb_puts(b, "<g>");
    if (tip) {
        report_sb_puts(b, "<title>");
        report_sb_html(b, tip);
        report_sb_puts(b, "</title>");
    }
    if (!strcmp(shape, "circle"))
        report_sb_printf(b,
                  "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\" stroke=\"black\" "
                  "stroke-width=\"0.5\"/>",
                  x, y, color);
    else if (!strcmp(shape, "square"))
        report_sb_printf(b,
                  "<rect x=\"%.1f\" y=\"%.1f\" width=\"7\" height=\"7\" fill=\"%s\" "
                  "stroke=\"black\" stroke-width=\"0.5\"/>",
                  x - 3.5, y - 3.5, color);
    else if (!strcmp(shape, "diamond"))
        report_sb_printf(b,
                  "<path d=\"M%.1f %.1fl5 5l-5 5l-5 -5z\" fill=\"%s\" stroke=\"black\" "
                  "stroke-width=\"0.5\"/>",
                  x, y - 5, color);
    else if (!strcmp(shape, "cross"))
        report_sb_printf(b,
                  "<path d=\"M%.1f %.1fl10 10m0 -10l-10 10\" stroke=\"%s\" "
                  "stroke-width=\"2.5\"/>",
                  x - 5, y - 5, color);
    else if (!strcmp(shape, "tick"))
        report_sb_printf(b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                  "stroke-width=\"1.5\"/>",
                  x, y - 6, x, y + 6, color);
    report_sb_puts(b, "</g>\n");
}

/* A legend below a chart: swatch and text per entry, wrapped to the width. */
typedef struct {
    sbuf *b;
    double x, y, left, right;
} legend;

static void legend_item(legend *l, const char *shape, const char *color, const char *text) {
    double width = 30 + 6.5 * (double)strlen(text);
    if (l->x + width > l->right && l->x > l->left) {
        l->x = l->left;
        l->y += 16;
    }
    double x = l->x, y = l->y;
    sbuf *b = l->b;
    if (!strcmp(shape, "line"))
        report_sb_printf(b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                  "stroke-width=\"2\"/>\n",
                  x, y, x + 18, y, color);
    else if (!strcmp(shape, "thin"))
        report_sb_printf(b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                  "stroke-width=\"0.8\" stroke-opacity=\"0.45\"/>\n",
                  x, y, x + 18, y, color);
    else if (!strcmp(shape, "dashed"))
        report_sb_printf(b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                  "stroke-width=\"1.5\" stroke-dasharray=\"5 3\"/><circle cx=\"%.1f\" "
                  "cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                  x, y, x + 18, y, color, x + 9, y, color);
    else if (!strcmp(shape, "bar"))
        report_sb_printf(b,
                  "<rect x=\"%.1f\" y=\"%.1f\" width=\"18\" height=\"8\" fill=\"%s\" "
                  "fill-opacity=\"0.6\"/>\n",
                  x, y - 4, color);
    else
        svg_marker(b, shape, x + 9, y, color, NULL);
    svg_text(b, x + 22, y + 4, "start", NULL, text);
    l->x += width;
}

/* Chart 1: loss against step, both runs. */
void report_chart_loss(sbuf *b, const run_data *f, const run_data *base) {
    const int W = 760, H = 380;
    const run_data *runs[2] = {base, f};
    frame fr = {INFINITY, -INFINITY, INFINITY, -INFINITY, 64, 30, W - 64 - 20, H - 30 - 80};
    for (int r = 0; r < 2; r++) {
        for (int s = 0; s < runs[r]->nsites; s++) {
            const site_data *sd = &runs[r]->sites[s];
            for (int i = 0; i < sd->nm; i++) {
                const double v[2] = {sd->m[i].loss, sd->m[i].val};
                for (int k = 0; k < 2; k++) {
                    if (isnan(v[k]))
                        continue;
                    fr.x0 = fmin(fr.x0, (double)sd->m[i].step);
                    fr.x1 = fmax(fr.x1, (double)sd->m[i].step);
                    fr.y0 = fmin(fr.y0, v[k]);
                    fr.y1 = fmax(fr.y1, v[k]);
                }
            }
        }
    }
    svg_begin(b, W, H, "Training loss against step");
    if (!isfinite(fr.x0)) {
        svg_text(b, W / 2.0, H / 2.0, "middle", NULL, "no loss values in either run");
        report_sb_puts(b, "</svg>\n");
        return;
    }
    if (fr.x1 <= fr.x0)
        fr.x0 -= 1, fr.x1 += 1;
    double pad = fr.y1 > fr.y0 ? 0.05 * (fr.y1 - fr.y0) : 0.5;
    fr.y0 -= pad;
    fr.y1 += pad;
    svg_axes(b, &fr, "step", "loss", true);
    if (f->nsites > 1)
        for (int s = 0; s < f->nsites; s++) {
            const site_data *sd = &f->sites[s];
            svg_series(b, &fr, &sd->m[0].step, &sd->m[0].loss, sizeof(mpoint), sizeof(mpoint),
                       sd->nm, C_FAULT, 0.8, 0.35);
        }
    svg_series(b, &fr, base->mean.step, base->mean.loss, sizeof(int64_t), sizeof(double),
               base->mean.n, C_BASE, 2, 1);
    svg_series(b, &fr, f->mean.step, f->mean.loss, sizeof(int64_t), sizeof(double), f->mean.n,
               C_FAULT, 2, 1);
    for (int r = 0; r < 2; r++) {
        const series *m = &runs[r]->mean;
        for (int i = 0; i < m->n; i++)
            if (!isnan(m->val[i])) {
                char tip[128];
                snprintf(tip, sizeof tip, "%s val loss %.4f at step %lld", runs[r]->label,
                         m->val[i], (long long)m->step[i]);
                svg_marker(b, r ? "square" : "circle", px(&fr, (double)m->step[i]),
                           py(&fr, m->val[i]), r ? C_FAULT : C_BASE, tip);
            }
    }
    legend l = {b, fr.left, fr.top + fr.h + 52, fr.left, W - 10};
    legend_item(&l, "line", C_BASE, "baseline (mean over islands)");
    legend_item(&l, "line", C_FAULT, "fault run (mean over islands)");
    if (f->nsites > 1)
        legend_item(&l, "thin", C_FAULT, "fault run, each island");
    if (report_has_val(base))
        legend_item(&l, "circle", C_BASE, "baseline validation loss");
    if (report_has_val(f))
        legend_item(&l, "square", C_FAULT, "fault run validation loss");
    report_sb_puts(b, "</svg>\n");
}

static int site_row(const run_data *r, const char *site) {
    for (int i = 0; i < r->nsites; i++)
        if (report_streq(r->sites[i].name, site))
            return i;
    return -1;
}

/* Chart 2: who was in the quorum when, with faults, suspicions and joins. */
void report_chart_membership(sbuf *b, const run_data *r) {
    const int W = 760, row_h = 26, rows = r->nsites + 1;
    const int H = 30 + rows * row_h + 80;
    frame fr = {0, r->t1 - r->t0, 0, rows, 100, 30, W - 100 - 20, rows * row_h};
    if (fr.x1 <= 0)
        fr.x1 = 1;
    svg_begin(b, W, H, "Membership against time (fault run)");
    svg_axes(b, &fr, "seconds since start", NULL, false);
    for (int i = 0; i < rows; i++) {
        double y = fr.top + (i + 0.5) * row_h;
        svg_text(b, fr.left - 6, y + 4, "end", NULL,
                 i < r->nsites ? r->sites[i].name : "coordinator");
        report_sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n",
                  fr.left, fr.top + (i + 1) * row_h, fr.left + fr.w, fr.top + (i + 1) * row_h,
                  C_GRID);
    }
    /* in-quorum bars: everyone of the start event in at first; a quorum
     * event sets the membership, a suspect takes one out, a join puts one in */
    double since[REPORT_MAX_SITES];
    bool in[REPORT_MAX_SITES];
    for (int i = 0; i < r->nsites; i++)
        in[i] = true, since[i] = r->t0;
    for (int e = 0; e <= r->rd.nev; e++) {
        const cJSON *ev = e < r->rd.nev ? r->rd.ev[e] : NULL;
        double t = ev ? report_jt(ev) : r->t1;
        bool quorum = ev && report_jkind(ev, "quorum");
        for (int i = 0; i < r->nsites; i++) {
            bool now = in[i];
            if (!ev || report_jkind(ev, "end"))
                now = false;
            else if (quorum)
                now = report_jmembers_has(ev, r->sites[i].name);
            else if ((report_jkind(ev, "suspect") || report_jkind(ev, "late")) &&
                     report_streq(report_jstr(ev, "site"), r->sites[i].name))
                now = false;
            else if (report_jkind(ev, "join") && report_streq(report_jstr(ev, "site"), r->sites[i].name))
                now = true;
            if (in[i] && !now && t > since[i]) {
                double y = fr.top + i * row_h + 6;
                report_sb_printf(b,
                          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"%s\" "
                          "fill-opacity=\"0.6\"><title>",
                          px(&fr, since[i] - r->t0), y,
                          px(&fr, t - r->t0) - px(&fr, since[i] - r->t0), row_h - 12, C_IN);
                report_sb_html(b, r->sites[i].name);
                report_sb_printf(b, " in the quorum %.2f-%.2f s</title></rect>\n", since[i] - r->t0,
                          t - r->t0);
            }
            if (!in[i] && now)
                since[i] = t;
            in[i] = now;
        }
        if (!ev || report_jkind(ev, "end"))
            break;
    }
    for (int e = 0; e < r->rd.nev; e++) {
        const cJSON *ev = r->rd.ev[e];
        double t = report_jt(ev) - r->t0, X = px(&fr, t);
        const char *site = report_jstr(ev, "site");
        int row = site ? site_row(r, site) : -1;
        char tip[256];
        if (report_jkind(ev, "fault")) {
            const char *k = report_jstr(ev, "fault");
            snprintf(tip, sizeof tip, "%s %s%s%s at %.2f s", k ? k : "fault", site ? site : "",
                     report_jstr(ev, "peer") ? " / " : "", report_jstr(ev, "peer") ? report_jstr(ev, "peer") : "", t);
            bool mend = report_streq(k, "restart") || report_streq(k, "heal") || report_streq(k, "restart_coordinator");
            const char *shape = mend ? "tick" : "cross";
            int prow = site_row(r, report_jstr(ev, "peer") ? report_jstr(ev, "peer") : "");
            if (row < 0 && prow < 0)
                row = r->nsites;
            if (row >= 0)
                svg_marker(b, shape, X, fr.top + (row + 0.5) * row_h, C_FAULT, tip);
            if (prow >= 0)
                svg_marker(b, shape, X, fr.top + (prow + 0.5) * row_h, C_FAULT, tip);
        } else if (report_jkind(ev, "suspect") && row >= 0) {
            snprintf(tip, sizeof tip, "%s suspected at %.2f s (%s)", site, t,
                     report_jstr(ev, "reason") ? report_jstr(ev, "reason") : "no reason given");
            svg_marker(b, "circle", X, fr.top + (row + 0.5) * row_h, C_SUSPECT, tip);
        } else if (report_jkind(ev, "late") && row >= 0) {
            snprintf(tip, sizeof tip, "outer step %.0f went without %s (late) at %.2f s",
                     report_jnum(ev, "outer_step"), site, t);
            svg_marker(b, "circle", X, fr.top + (row + 0.5) * row_h, C_LATE, tip);
        } else if (report_jkind(ev, "join") && row >= 0) {
            snprintf(tip, sizeof tip, "%s joined at %.2f s", site, t);
            svg_marker(b, "diamond", X, fr.top + (row + 0.5) * row_h, C_JOIN, tip);
        } else if (report_jkind(ev, "commit")) {
            snprintf(tip, sizeof tip, "outer step %.0f committed at %.2f s", report_jnum(ev, "outer_step"),
                     t);
            svg_marker(b, "tick", X, fr.top + (r->nsites + 0.5) * row_h, "#333333", tip);
        } else if (report_jkind(ev, "divergence")) {
            report_sb_printf(b,
                      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                      "stroke-width=\"2\" stroke-dasharray=\"4 3\"><title>divergence at %.2f "
                      "s</title></line>\n",
                      X, fr.top, X, fr.top + fr.h, C_DIV, t);
        }
    }
    legend l = {b, fr.left, fr.top + fr.h + 52, fr.left, W - 10};
    legend_item(&l, "bar", C_IN, "in the quorum");
    legend_item(&l, "cross", C_FAULT, "fault injected");
    legend_item(&l, "tick", C_FAULT, "restart / heal");
    legend_item(&l, "circle", C_SUSPECT, "suspected");
    legend_item(&l, "circle", C_LATE, "late (quorum)");
    legend_item(&l, "diamond", C_JOIN, "joined");
    legend_item(&l, "tick", "#333333", "commit");
    report_sb_puts(b, "</svg>\n");
}

/* Chart 3: compute utilisation against outer step, both runs. */
void report_chart_utilisation(sbuf *b, const run_data *f, const run_data *base) {
    const int W = 760, H = 300;
    const run_data *runs[2] = {base, f};
    frame fr = {INFINITY, -INFINITY, 0, 100, 64, 30, W - 64 - 20, H - 30 - 80};
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < runs[r]->nutil; i++) {
            fr.x0 = fmin(fr.x0, (double)runs[r]->util_step[i]);
            fr.x1 = fmax(fr.x1, (double)runs[r]->util_step[i]);
        }
    svg_begin(b, W, H, "Compute utilisation against outer step");
    if (!isfinite(fr.x0)) {
        svg_text(b, W / 2.0, H / 2.0, "middle", NULL, "utilisation not recorded in either run");
        report_sb_puts(b, "</svg>\n");
        return;
    }
    if (fr.x1 <= fr.x0)
        fr.x0 -= 1, fr.x1 += 1;
    svg_axes(b, &fr, "outer step", "utilisation (%)", true);
    /* percent: the series are fractions, so draw them on a 0..1 frame */
    frame unit = fr;
    unit.y1 = 1;
    if (f->nsites > 1)
        for (int s = 0; s < f->nsites; s++) {
            const site_data *sd = &f->sites[s];
            if (sd->util.n)
                svg_series(b, &unit, &sd->o[0].outer_step, &sd->o[0].util, sizeof(opoint),
                           sizeof(opoint), sd->no, C_FAULT, 0.8, 0.35);
        }
    for (int r = 0; r < 2; r++) {
        const run_data *rd = runs[r];
        const char *color = r ? C_FAULT : C_BASE;
        svg_series(b, &unit, rd->util_step, rd->util, sizeof(int64_t), sizeof(double), rd->nutil,
                   color, 2, 1);
        for (int i = 0; rd->nutil <= REPORT_MAX_MARKS && i < rd->nutil; i++) {
            char tip[128];
            snprintf(tip, sizeof tip, "%s: %.1f%% at outer step %lld", rd->label, 100 * rd->util[i],
                     (long long)rd->util_step[i]);
            svg_marker(b, r ? "square" : "circle", px(&unit, (double)rd->util_step[i]),
                       py(&unit, rd->util[i]), color, tip);
        }
    }
    legend l = {b, fr.left, fr.top + fr.h + 52, fr.left, W - 10};
    if (base->nutil)
        legend_item(&l, base->nutil <= REPORT_MAX_MARKS ? "circle" : "line", C_BASE,
                    "baseline (mean over records)");
    if (f->nutil)
        legend_item(&l, f->nutil <= REPORT_MAX_MARKS ? "square" : "line", C_FAULT,
                    "fault run (mean over records)");
    if (f->nsites > 1 && f->nutil)
        legend_item(&l, "thin", C_FAULT, "fault run, each island");
    report_sb_puts(b, "</svg>\n");
}

/* ------------------------------------------- charts of a training run */

static const char *const PALETTE[REPORT_PALETTE] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                    "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                                                    "#bcbd22", "#17becf"};

const char *report_color(int i) {
    return PALETTE[((i % REPORT_PALETTE) + REPORT_PALETTE) % REPORT_PALETTE];
}

static double series_x(const report_series *s, int i) {
    return *(const double *)((const char *)s->x + (size_t)i * s->stride);
}

/* y of point i as drawn: log10 on a log axis; NAN where it cannot be. */
static double series_y(const report_series *s, int i, bool log_y) {
    double y = *(const double *)((const char *)s->y + (size_t)i * s->stride);
    if (!isfinite(y) || (log_y && y <= 0))
        return NAN;
    return log_y ? log10(y) : y;
}

/* Ticks of a log10 axis (f->y0, f->y1 are exponents): each decade, and 2
 * and 5 times it when the axis spans under three decades. */
static void svg_log_ticks(sbuf *b, const frame *f) {
    static const double mult[3] = {1, 2, 5};
    bool fine = f->y1 - f->y0 < 3;
    for (int k = (int)floor(f->y0); k <= (int)ceil(f->y1); k++)
        for (int m = 0; m < (fine ? 3 : 1); m++) {
            double v = mult[m] * pow(10, k), e = log10(v);
            if (e < f->y0 - 1e-9 || e > f->y1 + 1e-9)
                continue;
            double Y = py(f, e);
            char lab[32];
            snprintf(lab, sizeof lab, "%g", v);
            report_sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n",
                             f->left, Y, f->left + f->w, Y, C_GRID);
            report_sb_printf(b,
                             "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                             f->left - 4, Y, f->left, Y);
            svg_text(b, f->left - 6, Y + 4, "end", NULL, lab);
        }
}

/* The exponent of the 1-2-5 tick (fine) or the decade at or below e (at
 * or above it when up), so that a log axis begins and ends on a tick. */
static double log_tick(double e, bool fine, bool up) {
    static const double mult[4] = {1, 2, 5, 10};
    double k = floor(e + 1e-9);
    if (!fine)
        return up ? ceil(e - 1e-9) : k;
    if (up) {
        for (int m = 0; m < 4; m++)
            if (log10(mult[m]) + k >= e - 1e-9)
                return log10(mult[m]) + k;
        return k + 1;
    }
    for (int m = 2; m >= 0; m--)
        if (log10(mult[m]) + k <= e + 1e-9)
            return log10(mult[m]) + k;
    return k;
}

/* One series: polylines broken at points that cannot be drawn, decimated
 * to REPORT_MAX_POINTS (the last point always kept), and for a dashed one
 * a circle per point up to REPORT_MAX_MARKS. */
static void svg_lines(sbuf *b, const frame *f, const report_series *s, bool log_y) {
    const char *color = report_color(s->color);
    int stride = s->n > REPORT_MAX_POINTS ? (s->n + REPORT_MAX_POINTS - 1) / REPORT_MAX_POINTS : 1;
    bool open = false;
    for (int i = 0; i < s->n; i = i == s->n - 1 ? s->n : (i + stride < s->n ? i + stride : s->n - 1)) {
        double x = series_x(s, i), y = series_y(s, i, log_y);
        if (!isfinite(x) || isnan(y)) {
            if (open)
                report_sb_puts(b, "\"/>\n");
            open = false;
            continue;
        }
        if (!open) {
            report_sb_puts(b, "<polyline class=\"series\" data-label=\"");
            report_sb_html(b, s->label);
            report_sb_printf(b, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s points=\"", color,
                             s->style == REPORT_DASHED ? "1.5" : "1.8",
                             s->style == REPORT_DASHED ? " stroke-dasharray=\"5 3\"" : "");
            open = true;
        } else {
            report_sb_puts(b, " ");
        }
        report_sb_printf(b, "%.1f,%.1f", px(f, x), py(f, y));
    }
    if (open)
        report_sb_puts(b, "\"/>\n");
    if (s->style != REPORT_DASHED || s->n > REPORT_MAX_MARKS)
        return;
    for (int i = 0; i < s->n; i++) {
        double x = series_x(s, i), y = series_y(s, i, log_y);
        if (!isfinite(x) || isnan(y))
            continue;
        char tip[256];
        snprintf(tip, sizeof tip, "%s: %.4g at %g", s->label,
                 log_y ? pow(10, y) : y, x);
        svg_marker(b, "circle", px(f, x), py(f, y), color, tip);
    }
}

void report_chart_lines(sbuf *b, const report_chart *c) {
    const int W = 760;
    /* the legend's rows, as legend_item wraps them */
    double lx = 64, right = W - 10;
    int rows = c->ns ? 1 : 0;
    for (int i = 0; i < c->ns; i++) {
        double width = 30 + 6.5 * (double)strlen(c->s[i].label);
        if (lx + width > right && lx > 64)
            lx = 64, rows++;
        lx += width;
    }
    const int H = 30 + 240 + 52 + 16 * rows;
    frame fr = {INFINITY, -INFINITY, INFINITY, -INFINITY, 64, 30, W - 64 - 20, 240};
    for (int k = 0; k < c->ns; k++)
        for (int i = 0; i < c->s[k].n; i++) {
            double x = series_x(&c->s[k], i), y = series_y(&c->s[k], i, c->log_y);
            if (!isfinite(x) || isnan(y))
                continue;
            fr.x0 = fmin(fr.x0, x);
            fr.x1 = fmax(fr.x1, x);
            fr.y0 = fmin(fr.y0, y);
            fr.y1 = fmax(fr.y1, y);
        }
    svg_begin(b, W, H, c->title);
    if (!isfinite(fr.x0)) {
        svg_text(b, W / 2.0, H / 2.0, "middle", NULL, c->empty ? c->empty : "no values");
        report_sb_puts(b, "</svg>\n");
        return;
    }
    if (fr.x1 <= fr.x0)
        fr.x0 -= 1, fr.x1 += 1;
    if (c->log_y) {
        fr.y0 = log_tick(fr.y0, fr.y1 - fr.y0 < 3, false);
        fr.y1 = log_tick(fr.y1, fr.y1 - fr.y0 < 3, true);
        if (fr.y1 <= fr.y0)
            fr.y0 -= log10(2), fr.y1 += log10(2);
    } else {
        double pad = fr.y1 > fr.y0 ? 0.05 * (fr.y1 - fr.y0) : (fr.y0 != 0 ? 0.05 * fabs(fr.y0) : 0.5);
        fr.y0 -= pad;
        fr.y1 += pad;
    }
    svg_axes(b, &fr, c->xlabel, c->ylabel, !c->log_y);
    if (c->log_y)
        svg_log_ticks(b, &fr);
    for (int k = 0; k < c->ns; k++)
        svg_lines(b, &fr, &c->s[k], c->log_y);
    legend l = {b, fr.left, fr.top + fr.h + 52, fr.left, W - 10};
    for (int k = 0; k < c->ns; k++)
        legend_item(&l, c->s[k].style == REPORT_DASHED ? "dashed" : "line",
                    report_color(c->s[k].color), c->s[k].label);
    report_sb_puts(b, "</svg>\n");
}
