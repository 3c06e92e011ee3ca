/* The report of an ordinary training run: `loco train`'s run directory
 * (metrics.jsonl) or `loco launch`'s (events.jsonl, <site>/metrics.jsonl,
 * <site>/outer.jsonl), read by rundir.c, as one self-contained report.html
 * with inline SVG charts and a summary table (docs/REPORTS.md). */
#include "report/report_internal.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* One line of outer.jsonl, for the charts. */
typedef struct {
    double outer_step, step;
    double sent_mb, recv_mb; /* bytes_sent, bytes_received / 1e6 */
    double wall_s;
    double t; /* seconds of training at its end: the sum of wall_s so far */
} xpoint;

/* An island: what the reader found, one point per step, and its summary. */
typedef struct {
    const report_site *in; /* name ("" for a single-site run), dir, has_outer */
    report_mline *tp;      /* training lines (with "loss"), one per step */
    int ntp;
    report_mline *vp; /* validation lines (with "val_loss"), one per step */
    int nvp;
    xpoint *xp;
    int nxp;
    /* summary */
    double final_loss; /* mean of the last REPORT_FINAL_WINDOW losses */
    double final_val, final_val_step;
    double tokens, train_s, sent, recv; /* sums (bytes for sent, recv) */
} tsite;

typedef struct {
    report_rundir rd; /* dir, timeline (multi-site), the islands read */
    bool multi;
    tsite *sites; /* (nsites) as rd.sites */
    int nsites;
    bool has_cfg;
    loco_config cfg; /* the first island's newest checkpoint's config.ini */
} trun;

static const char *site_label(const tsite *s, const char *what, char *buf, size_t cap) {
    if (s->in->name[0])
        snprintf(buf, cap, "%s %s", s->in->name, what);
    else
        snprintf(buf, cap, "%s", what);
    return buf;
}

/* ------------------------------------------------------------ the islands */

static int cmp_mline(const void *a, const void *b) {
    const report_mline *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return x->seq - y->seq;
}

/* The lines of in that name "loss" (val false) or "val_loss" (val true),
 * sorted by step, one per step: the last one written (a resumed run
 * appends to the same file, so steps may repeat). */
static int step_lines(const report_site *in, bool val, report_mline **out, int *n) {
    *out = loco_alloc((size_t)(in->nm > 0 ? in->nm : 1) * sizeof(report_mline));
    if (!*out)
        return LOCO_ERR(LOCO_ENOMEM, "report: %d metrics lines", in->nm);
    int k = 0;
    for (int i = 0; i < in->nm; i++)
        if (val ? in->m[i].has_val : in->m[i].has_loss)
            (*out)[k++] = in->m[i];
    qsort(*out, (size_t)k, sizeof(report_mline), cmp_mline);
    int kept = 0;
    for (int i = 0; i < k; i++)
        if (i + 1 == k || (*out)[i + 1].step != (*out)[i].step)
            (*out)[kept++] = (*out)[i];
    *n = kept;
    return 0;
}

/* The newest ckpt_<step>/config.ini of a directory ("" when none). */
static void newest_config(const char *dir, char *path, size_t cap) {
    path[0] = '\0';
    DIR *d = opendir(dir);
    if (!d)
        return;
    long long best = -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        char *end;
        if (strncmp(de->d_name, "ckpt_", 5))
            continue;
        long long step = strtoll(de->d_name + 5, &end, 10);
        struct stat st;
        char p[LOCO_PATH_MAX + 2 * REPORT_SITE_MAX + 320];
        snprintf(p, sizeof p, "%s/%s/config.ini", dir, de->d_name);
        if (*end || step <= best || stat(p, &st) != 0)
            continue;
        best = step;
        snprintf(path, cap, "%s", p);
    }
    closedir(d);
}

static int site_summary(trun *r, tsite *s, warnings *w) {
    const report_site *in = s->in;
    char path[LOCO_PATH_MAX + 2 * REPORT_SITE_MAX + 320];
    LOCO_CHECK(step_lines(in, false, &s->tp, &s->ntp));
    if (s->ntp == 0)
        return LOCO_ERR(LOCO_EPROTO,
                        "%s/metrics.jsonl: no training lines (objects with \"step\" and \"loss\")",
                        in->dir);
    LOCO_CHECK(step_lines(in, true, &s->vp, &s->nvp));
    s->xp = loco_alloc((size_t)(in->no > 0 ? in->no : 1) * sizeof(xpoint));
    if (!s->xp)
        return LOCO_ERR(LOCO_ENOMEM, "report: %d outer lines", in->no);
    for (int i = 0; i < in->no; i++) {
        const report_oline *o = &in->o[i];
        s->xp[s->nxp++] = (xpoint){o->outer_step,           o->step,   o->bytes_sent / 1e6,
                                   o->bytes_received / 1e6, o->wall_s, NAN};
    }
    double sum = 0;
    int n = 0;
    for (int i = s->ntp - 1; i >= 0 && n < REPORT_FINAL_WINDOW; i--)
        if (isfinite(s->tp[i].loss))
            sum += s->tp[i].loss, n++;
    s->final_loss = n ? sum / n : NAN;
    s->final_val = s->final_val_step = NAN;
    for (int i = s->nvp - 1; i >= 0 && isnan(s->final_val); i--)
        if (isfinite(s->vp[i].val_loss))
            s->final_val = s->vp[i].val_loss, s->final_val_step = s->vp[i].step;
    for (int i = 0; i < s->ntp; i++)
        if (isfinite(s->tp[i].tokens_per_s) && isfinite(s->tp[i].step_s)) {
            s->tokens += round(s->tp[i].tokens_per_s * s->tp[i].step_s);
            s->train_s += s->tp[i].step_s;
        }
    double t = 0;
    for (int i = 0; i < s->nxp; i++) {
        xpoint *x = &s->xp[i];
        if (isfinite(x->wall_s) && x->wall_s >= 0 && isfinite(t))
            t += x->wall_s;
        else
            t = NAN; /* a gap: no times from here on */
        x->t = t;
        s->sent += isfinite(x->sent_mb) ? x->sent_mb * 1e6 : 0;
        s->recv += isfinite(x->recv_mb) ? x->recv_mb * 1e6 : 0;
    }
    newest_config(in->dir, path, sizeof path);
    if (path[0] && !r->has_cfg) {
        loco_config_defaults(&r->cfg);
        if (loco_config_load(&r->cfg, path) == 0) {
            r->has_cfg = true;
        } else {
            report_warn(w, "%s: not read (%s); the summary leaves out the configuration", path,
                        loco_errmsg());
            loco_err_clear();
        }
    }
    return 0;
}

static int load_run(trun *r, const char *dir, bool multi, warnings *w) {
    r->multi = multi;
    LOCO_CHECK(report_rundir_load(&r->rd, dir, multi ? REPORT_RUN_MULTI : REPORT_RUN_SINGLE, w));
    r->sites = loco_alloc((size_t)r->rd.nsites * sizeof(tsite));
    if (!r->sites)
        return LOCO_ERR(LOCO_ENOMEM, "report: sites");
    memset(r->sites, 0, (size_t)r->rd.nsites * sizeof(tsite));
    r->nsites = r->rd.nsites;
    for (int i = 0; i < r->nsites; i++) {
        r->sites[i].in = &r->rd.sites[i];
        LOCO_CHECK(site_summary(r, &r->sites[i], w));
    }
    return 0;
}

static void run_fini(trun *r) {
    for (int i = 0; r->sites && i < r->nsites; i++) {
        loco_free(r->sites[i].tp);
        loco_free(r->sites[i].vp);
        loco_free(r->sites[i].xp);
    }
    loco_free(r->sites);
    report_rundir_fini(&r->rd);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------- the page */

static const char HTML_STYLE[] =
    "body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;font-size:90%}th,td{border:1px solid #ccc;padding:3px 6px;"
    "text-align:left}th{background:#f2f2f2}figure{margin:1em 0}.note{color:#555}";

static void h2(sbuf *b, const char *text) {
    report_sb_puts(b, "<h2>");
    report_sb_html(b, text);
    report_sb_puts(b, "</h2>\n");
}

static void row(sbuf *b, int n, const char *const *cells, bool header) {
    report_sb_puts(b, "<tr>");
    for (int i = 0; i < n; i++) {
        report_sb_puts(b, header ? "<th>" : "<td>");
        report_sb_html(b, cells[i]);
        report_sb_puts(b, header ? "</th>" : "</td>");
    }
    report_sb_puts(b, "</tr>\n");
}

static void kv(sbuf *b, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void kv(sbuf *b, const char *key, const char *fmt, ...) {
    char val[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(val, sizeof val, fmt, ap);
    va_end(ap);
    const char *cells[2] = {key, val};
    row(b, 2, cells, false);
}

static void fmt_num(char *buf, size_t cap, double v, const char *fmt) {
    if (isfinite(v))
        snprintf(buf, cap, fmt, v);
    else
        snprintf(buf, cap, "—");
}

static void fmt_mb(char *buf, size_t cap, double bytes) {
    if (bytes >= 1e9)
        snprintf(buf, cap, "%.2f GB", bytes / 1e9);
    else
        snprintf(buf, cap, "%.2f MB", bytes / 1e6);
}

static void note(sbuf *b, const char *text) {
    report_sb_puts(b, "<p class=\"note\">");
    report_sb_html(b, text);
    report_sb_puts(b, "</p>\n");
}

/* The run's configuration highlights, from the first island's checkpoint. */
static void config_rows(sbuf *b, const trun *r) {
    if (!r->has_cfg) {
        kv(b, "configuration", "not recorded (no ckpt_*/config.ini in the run directory)");
        return;
    }
    const loco_config *c = &r->cfg;
    kv(b, "model", "%lld layers, %lld heads, width %lld, context %lld, vocab %lld",
       (long long)c->model.n_layer, (long long)c->model.n_head, (long long)c->model.n_embd,
       (long long)c->model.seq_len, (long long)c->model.vocab_size);
    kv(b, "batch",
       "%lld sequences x %lld tokens x %lld accumulation steps (per data-parallel rank, dp %lld)",
       (long long)c->train.batch_size, (long long)c->model.seq_len, (long long)c->train.grad_accum,
       (long long)c->parallel.dp);
    kv(b, "optimizer", "AdamW, lr %g, warmup %lld steps, weight decay %g, grad clip %g, seed %lld",
       c->train.lr, (long long)c->train.warmup_steps, c->train.weight_decay, c->train.grad_clip,
       (long long)c->train.seed);
    kv(b, "steps configured", "%lld", (long long)c->train.steps);
    if (r->multi)
        kv(b, "outer loop", "H %lld, %s (lr %g, momentum %g), codec %s, zstd %s, algorithm %s",
           (long long)c->outer.H, c->outer.optimizer, c->outer.lr, c->outer.momentum,
           c->compress.codec, c->compress.zstd, c->outer.algorithm);
}

static void summary(sbuf *b, const trun *r) {
    h2(b, "Summary");
    report_sb_puts(b, "<table>\n");
    kv(b, "directory", "%s", r->rd.dir);
    if (r->multi) {
        sbuf names = {0};
        for (int i = 0; i < r->nsites; i++)
            report_sb_printf(&names, "%s%s", i ? ", " : "", r->sites[i].in->name);
        kv(b, "kind", "multi-site (%d islands: %s)", r->nsites, report_sb_str(&names));
        report_sb_fini(&names);
        const char *cfg = r->rd.start ? report_jstr(r->rd.start, "config") : NULL;
        if (cfg)
            kv(b, "config", "%s", cfg);
    } else {
        kv(b, "kind", "single-site (loco train)");
    }
    config_rows(b, r);
    double tokens = 0, train_s = 0, sent = 0, recv = 0, last = 0;
    for (int i = 0; i < r->nsites; i++) {
        const tsite *s = &r->sites[i];
        tokens += s->tokens;
        train_s = fmax(train_s, s->train_s);
        sent += s->sent;
        recv += s->recv;
        last = fmax(last, s->tp[s->ntp - 1].step);
    }
    kv(b, "steps trained", "%.0f", last);
    if (!r->multi) {
        char fl[32], fv[64];
        const tsite *s = &r->sites[0];
        fmt_num(fl, sizeof fl, s->final_loss, "%.4f");
        fmt_num(fv, sizeof fv, s->final_val, "%.4f");
        kv(b, "final training loss", "%s (mean of the last %d steps)", fl, REPORT_FINAL_WINDOW);
        if (isfinite(s->final_val))
            kv(b, "final validation loss", "%s (step %.0f)", fv, s->final_val_step);
        else
            kv(b, "final validation loss", "not recorded");
    }
    kv(b, "total tokens", "%.0f (sum over steps of tokens_per_s x step_s%s)", tokens,
       r->multi ? ", all islands" : "");
    kv(b, "training time", "%.1f s (sum of step_s%s; evaluation and checkpoints excluded)", train_s,
       r->multi ? ", the slowest island" : "");
    if (r->multi) {
        double t0 = r->rd.start ? report_jt(r->rd.start) : NAN,
               t1 = r->rd.end ? report_jt(r->rd.end) : NAN;
        if (isfinite(t0) && isfinite(t1))
            kv(b, "wall time", "%.1f s (start to end event)", t1 - t0);
        else
            kv(b, "wall time", "unknown (no start or end event)");
        const char *st = r->rd.end ? report_jstr(r->rd.end, "status") : NULL;
        kv(b, "status", "%s", st ? st : "did not finish (no end event)");
        char ss[32], rs[32];
        fmt_mb(ss, sizeof ss, sent);
        fmt_mb(rs, sizeof rs, recv);
        kv(b, "bytes on the wire", "%s sent, %s received (all islands)", ss, rs);
        int commits = 0;
        for (int i = 0; i < r->rd.nev; i++)
            commits += report_jkind(r->rd.ev[i], "commit");
        if (r->rd.nev)
            kv(b, "outer steps committed", "%d", commits);
        else
            kv(b, "outer steps committed", "unknown (no events.jsonl)");
    }
    report_sb_puts(b, "</table>\n");
    if (!r->multi)
        return;
    static const char *const head[] = {"island",         "steps",  "final loss",
                                       "final val loss", "tokens", "training (s)",
                                       "outer steps",    "sent",   "received"};
    report_sb_puts(b, "<h3>Islands</h3>\n<table>\n");
    row(b, 9, head, true);
    for (int i = 0; i < r->nsites; i++) {
        const tsite *s = &r->sites[i];
        char steps[32], fl[32], fv[64], tok[32], tr[32], os[32], se[32], re[32];
        snprintf(steps, sizeof steps, "%.0f", s->tp[s->ntp - 1].step);
        fmt_num(fl, sizeof fl, s->final_loss, "%.4f");
        fmt_num(fv, sizeof fv, s->final_val, "%.4f");
        if (isfinite(s->final_val)) {
            size_t n = strlen(fv);
            snprintf(fv + n, sizeof fv - n, " (step %.0f)", s->final_val_step);
        }
        snprintf(tok, sizeof tok, "%.0f", s->tokens);
        snprintf(tr, sizeof tr, "%.1f", s->train_s);
        if (s->in->has_outer) {
            snprintf(os, sizeof os, "%d", s->nxp);
            fmt_mb(se, sizeof se, s->sent);
            fmt_mb(re, sizeof re, s->recv);
        } else {
            snprintf(os, sizeof os, "—");
            snprintf(se, sizeof se, "—");
            snprintf(re, sizeof re, "—");
        }
        const char *cells[9] = {s->in->name, steps, fl, fv, tok, tr, os, se, re};
        row(b, 9, cells, false);
    }
    report_sb_puts(b, "</table>\n");
}

/* The labels of a chart's series live as long as the chart. */
typedef struct {
    report_series s[2 * REPORT_MAX_SITES];
    char label[2 * REPORT_MAX_SITES][REPORT_SITE_MAX + 32];
    int n;
} series_set;

static void add_series(series_set *set, const tsite *s, const char *what, const double *x,
                       const double *y, size_t stride, int n, int color, report_style style) {
    int k = set->n++;
    site_label(s, what, set->label[k], sizeof set->label[k]);
    set->s[k] = (report_series){set->label[k], x, y, stride, n, color, style};
}

static void figure(sbuf *b, const char *title, const char *xlabel, const char *ylabel, bool log_y,
                   const series_set *set, const char *empty) {
    report_chart c = {title, xlabel, ylabel, log_y, empty, set->s, set->n};
    report_sb_puts(b, "<figure>\n");
    report_chart_lines(b, &c);
    report_sb_puts(b, "</figure>\n");
}

/* A chart of one training-line field against step, a series per island. */
static void step_chart(sbuf *b, const trun *r, series_set *set, size_t field, const char *title,
                       const char *ylabel, const char *what, bool log_y) {
    set->n = 0;
    for (int i = 0; i < r->nsites; i++) {
        const tsite *s = &r->sites[i];
        add_series(set, s, what, &s->tp[0].step, (const double *)((const char *)s->tp + field),
                   sizeof(report_mline), s->ntp, i, REPORT_SOLID);
    }
    figure(b, title, "step", ylabel, log_y, set, "no values recorded");
}

static void charts(sbuf *b, const trun *r, series_set *set) {
    h2(b, "Loss");
    set->n = 0;
    bool any_val = false;
    for (int i = 0; i < r->nsites; i++) {
        const tsite *s = &r->sites[i];
        add_series(set, s, "training loss", &s->tp[0].step, &s->tp[0].loss, sizeof(report_mline),
                   s->ntp, r->multi ? i : 0, REPORT_SOLID);
        if (s->nvp) {
            any_val = true;
            add_series(set, s, "validation loss", &s->vp[0].step, &s->vp[0].val_loss,
                       sizeof(report_mline), s->nvp, r->multi ? i : 1, REPORT_DASHED);
        }
    }
    figure(b, "Loss against step", "step", "loss", false, set, "no loss values");
    if (!any_val)
        note(b, "No validation loss recorded (run.eval_every, data.val).");
    h2(b, "Learning rate");
    step_chart(b, r, set, offsetof(report_mline, lr), "Learning rate against step", "learning rate",
               "learning rate", false);
    h2(b, "Gradient norm");
    step_chart(b, r, set, offsetof(report_mline, grad_norm),
               "Gradient norm against step (log scale)", "grad norm", "grad norm", true);
    h2(b, "Throughput");
    step_chart(b, r, set, offsetof(report_mline, tokens_per_s), "Tokens per second against step",
               "tokens/s", "tokens/s", false);
    if (!r->multi)
        return;
    h2(b, "Bytes on the wire");
    set->n = 0;
    bool any_outer = false, any_t = false;
    for (int i = 0; i < r->nsites; i++) {
        const tsite *s = &r->sites[i];
        if (!s->in->has_outer || !s->nxp)
            continue;
        any_outer = true;
        add_series(set, s, "sent", &s->xp[0].outer_step, &s->xp[0].sent_mb, sizeof(xpoint), s->nxp,
                   i, REPORT_SOLID);
        add_series(set, s, "received", &s->xp[0].outer_step, &s->xp[0].recv_mb, sizeof(xpoint),
                   s->nxp, i, REPORT_DASHED);
        for (int j = 0; j < s->nxp; j++)
            any_t |= isfinite(s->xp[j].t);
    }
    figure(b, "Bytes on the wire per outer step", "outer step", "MB", false, set,
           "no outer.jsonl records");
    if (!any_outer)
        note(b, "No island wrote an outer.jsonl: nothing was exchanged.");
    h2(b, "Outer steps over time");
    set->n = 0;
    for (int i = 0; i < r->nsites; i++) {
        const tsite *s = &r->sites[i];
        if (s->in->has_outer && s->nxp)
            add_series(set, s, "outer step", &s->xp[0].t, &s->xp[0].outer_step, sizeof(xpoint),
                       s->nxp, i, REPORT_SOLID);
    }
    figure(b, "Outer steps against training time", "seconds since the island began training",
           "outer step", false, set, "no outer.jsonl record with wall_s");
    if (any_outer && !any_t)
        note(b, "The outer.jsonl records carry no wall_s: no times to draw.");
}

int loco_report_train_write(const char *run_dir, const char *out_dir) {
    loco_rundir_kind kind;
    LOCO_CHECK(loco_report_kind(run_dir, &kind, NULL, 0));
    if (!out_dir)
        out_dir = run_dir;
    trun r = {0};
    warnings w = {0};
    sbuf html = {0};
    series_set *set = loco_alloc(sizeof *set);
    int rc;
    if (!set)
        return LOCO_ERR(LOCO_ENOMEM, "report: series");
    LOCO_CHECK_GOTO(load_run(&r, run_dir, kind != LOCO_RUNDIR_SINGLE, &w), out);
    LOCO_CHECK_GOTO(loco_mkdirs(out_dir), out);
    report_sb_puts(&html, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                          "<title>loco training report: ");
    report_sb_html(&html, run_dir);
    report_sb_printf(&html, "</title>\n<style>%s</style>\n</head>\n<body>\n", HTML_STYLE);
    report_sb_printf(&html, "<h1>loco training report (%s)</h1>\n",
                     r.multi ? "multi-site" : "single-site");
    summary(&html, &r);
    charts(&html, &r, set);
    if (w.n) {
        h2(&html, "Warnings");
        report_sb_puts(&html, "<ul>\n");
        const char *s = report_sb_str(&w.text);
        while (*s) {
            const char *nl = strchr(s, '\n');
            report_sb_puts(&html, "<li>");
            char line[1100];
            snprintf(line, sizeof line, "%.*s", (int)(nl - s), s);
            report_sb_html(&html, line);
            report_sb_puts(&html, "</li>\n");
            s = nl + 1;
        }
        report_sb_puts(&html, "</ul>\n");
    }
    report_sb_puts(&html, "</body>\n</html>\n");
    LOCO_CHECK_GOTO(report_write_file(out_dir, "report.html", &html), out);
    printf("report: %s/report.html\n", out_dir);
out:
    loco_free(set);
    report_sb_fini(&html);
    report_sb_fini(&w.text);
    run_fini(&r);
    return rc;
}
