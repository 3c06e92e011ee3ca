/* The report of a fault-injection experiment, a fault run
 * beside a fault-free baseline of the same seed. Reads the run directories
 * that `loco launch` leaves (events.jsonl, <site>/metrics.jsonl,
 * <site>/outer.jsonl; docs/REPORTS.md is the contract), and writes
 * report.md and report.html with inline SVG charts, the fault table, bytes
 * on the wire, compute utilisation and a PASS/FAIL verdict.
 * One file: the verdict's checks and the document's sections share the
 * doc writer and read the same analysis. */
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

/* ------------------------------------------------------------- analysis */

/* The verdict's reasons, one per line. */
typedef struct {
    sbuf why;
    int nfail;
    sbuf open; /* cycles that did not complete */
    int nopen;
} verdict;

__attribute__((format(printf, 2, 3))) static void fail(verdict *v, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (v->nfail++)
        report_sb_puts(&v->why, "; ");
    report_sb_puts(&v->why, msg);
}

static const opoint *outer_at(const site_data *s, int64_t step) {
    for (int j = s->no - 1; j >= 0; j--)
        if (s->o[j].outer_step == step)
            return &s->o[j];
    return NULL;
}

/* θ hashes of the islands of the last committed quorum: at the last commit
 * (against the commit's own hash) and at their last outer.jsonl lines. */
static void check_hashes(const run_data *r, verdict *v) {
    const cJSON *last = NULL;
    for (int i = 0; i < r->rd.nev; i++)
        if (report_jkind(r->rd.ev[i], "commit"))
            last = r->rd.ev[i];
    const site_data *mem[REPORT_MAX_SITES];
    int nm = 0;
    for (int i = 0; i < r->nsites; i++)
        if (!last || !cJSON_GetObjectItemCaseSensitive(last, "members") ||
            report_jmembers_has(last, r->sites[i].name))
            mem[nm++] = &r->sites[i];
    if (last && isfinite(report_jnum(last, "outer_step"))) {
        int64_t s = (int64_t)report_jnum(last, "outer_step");
        const char *want = report_jstr(last, "hash");
        const opoint *first = NULL;
        const site_data *firsts = NULL;
        for (int i = 0; i < nm; i++) {
            const opoint *p = outer_at(mem[i], s);
            if (!p || !p->hash[0])
                continue;
            if (want && want[0] && strcmp(p->hash, want)) {
                fail(v, "θ hash of %s at outer step %lld is %s, the commit says %s", mem[i]->name,
                     (long long)s, p->hash, want);
            } else if (first && strcmp(p->hash, first->hash)) {
                fail(v, "θ hashes differ at outer step %lld: %s %s, %s %s", (long long)s,
                     firsts->name, first->hash, mem[i]->name, p->hash);
            }
            if (!first)
                first = p, firsts = mem[i];
        }
    }
    int64_t top = INT64_MIN;
    for (int i = 0; i < nm; i++)
        if (mem[i]->no && mem[i]->o[mem[i]->no - 1].outer_step > top)
            top = mem[i]->o[mem[i]->no - 1].outer_step;
    const opoint *ref = NULL;
    const site_data *refs = NULL;
    for (int i = 0; i < nm; i++) {
        if (!mem[i]->no)
            continue;
        const opoint *p = &mem[i]->o[mem[i]->no - 1];
        if (p->outer_step != top || !p->hash[0])
            continue;
        if (ref && strcmp(ref->hash, p->hash)) {
            fail(v, "final θ hashes differ at outer step %lld: %s %s, %s %s", (long long)top,
                 refs->name, ref->hash, mem[i]->name, p->hash);
            return;
        }
        if (!ref)
            ref = p, refs = mem[i];
    }
}

static bool has_commit(const run_data *r, int64_t s) {
    return bsearch(&s, r->commits, (size_t)r->ncommits, sizeof(int64_t), report_cmp_i64) != NULL;
}

/* Outer steps the baseline committed that the fault run never did, and gaps
 * in the fault run's own range. */
static void check_lost_updates(const run_data *f, const run_data *b, verdict *v) {
    sbuf list = {0};
    int missing = 0;
    int64_t hi = b->ncommits ? b->commits[b->ncommits - 1] : 0;
    if (f->ncommits && f->commits[f->ncommits - 1] > hi)
        hi = f->commits[f->ncommits - 1];
    int64_t lo = 1;
    if (b->ncommits && b->commits[0] < lo)
        lo = b->commits[0];
    for (int64_t s = lo; s <= hi; s++) {
        bool want = has_commit(b, s) || (f->ncommits && s < f->commits[f->ncommits - 1]);
        if (!want || has_commit(f, s))
            continue;
        if (missing < REPORT_LIST_MAX)
            report_sb_printf(&list, "%s%lld", missing ? ", " : "", (long long)s);
        missing++;
    }
    if (missing)
        fail(v, "lost update: %d outer step%s never committed in the fault run (%s%s)", missing,
             missing > 1 ? "s" : "", report_sb_str(&list), missing > REPORT_LIST_MAX ? ", ..." : "");
    report_sb_fini(&list);
}

/* Final loss of a run (docs/REPORTS.md): the mean validation loss at the
 * last validated step when use_val, else the mean training loss over the
 * last REPORT_FINAL_WINDOW steps that have one. */
static double final_loss(const run_data *r, bool use_val, int64_t *at) {
    const series *m = &r->mean;
    if (use_val) {
        for (int i = m->n - 1; i >= 0; i--)
            if (!isnan(m->val[i])) {
                *at = m->step[i];
                return m->val[i];
            }
        return NAN;
    }
    double s = 0;
    int n = 0;
    for (int i = m->n - 1; i >= 0 && n < REPORT_FINAL_WINDOW; i--)
        if (!isnan(m->loss[i])) {
            if (n == 0)
                *at = m->step[i];
            s += m->loss[i];
            n++;
        }
    return n ? s / n : NAN;
}


/* --------------------------------------------------------- the document */

/* Markdown and HTML written side by side from the same calls. */
typedef struct {
    sbuf md, html;
} doc;

static void doc_h(doc *d, int level, const char *text) {
    for (int i = 0; i < level; i++)
        report_sb_puts(&d->md, "#");
    report_sb_puts(&d->md, " ");
    report_sb_md(&d->md, text);
    report_sb_puts(&d->md, "\n\n");
    report_sb_printf(&d->html, "<h%d>", level);
    report_sb_html(&d->html, text);
    report_sb_printf(&d->html, "</h%d>\n", level);
}

static void doc_p(doc *d, const char *text) {
    report_sb_md(&d->md, text);
    report_sb_puts(&d->md, "\n\n");
    report_sb_puts(&d->html, "<p>");
    report_sb_html(&d->html, text);
    report_sb_puts(&d->html, "</p>\n");
}

static void doc_ul(doc *d, bool begin) {
    report_sb_puts(&d->html, begin ? "<ul>\n" : "</ul>\n");
    if (!begin)
        report_sb_puts(&d->md, "\n");
}

__attribute__((format(printf, 3, 4))) static void doc_li(doc *d, const char *key, const char *fmt,
                                                         ...) {
    char val[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(val, sizeof val, fmt, ap);
    va_end(ap);
    report_sb_puts(&d->md, "- ");
    if (key) {
        report_sb_puts(&d->md, "**");
        report_sb_md(&d->md, key);
        report_sb_puts(&d->md, "**: ");
    }
    report_sb_md(&d->md, val);
    report_sb_puts(&d->md, "\n");
    report_sb_puts(&d->html, "<li>");
    if (key) {
        report_sb_puts(&d->html, "<b>");
        report_sb_html(&d->html, key);
        report_sb_puts(&d->html, "</b>: ");
    }
    report_sb_html(&d->html, val);
    report_sb_puts(&d->html, "</li>\n");
}

static void doc_row(doc *d, int n, const char *const *cells, bool header) {
    report_sb_puts(&d->md, "|");
    report_sb_puts(&d->html, "<tr>");
    for (int i = 0; i < n; i++) {
        report_sb_puts(&d->md, " ");
        report_sb_md(&d->md, cells[i]);
        report_sb_puts(&d->md, " |");
        report_sb_puts(&d->html, header ? "<th>" : "<td>");
        report_sb_html(&d->html, cells[i]);
        report_sb_puts(&d->html, header ? "</th>" : "</td>");
    }
    report_sb_puts(&d->md, "\n");
    report_sb_puts(&d->html, "</tr>\n");
    if (header) {
        report_sb_puts(&d->md, "|");
        for (int i = 0; i < n; i++)
            report_sb_puts(&d->md, "---|");
        report_sb_puts(&d->md, "\n");
    }
}

static void doc_table(doc *d, bool begin) {
    report_sb_puts(&d->html, begin ? "<table>\n" : "</table>\n");
    if (!begin)
        report_sb_puts(&d->md, "\n");
}

static void doc_svg(doc *d, const sbuf *svg) {
    report_sb_puts(&d->md, report_sb_str(svg));
    report_sb_puts(&d->md, "\n");
    report_sb_puts(&d->html, "<figure>\n");
    report_sb_puts(&d->html, report_sb_str(svg));
    report_sb_puts(&d->html, "</figure>\n");
}

static void fmt_time(char *buf, size_t cap, double t) {
    if (!isfinite(t)) {
        snprintf(buf, cap, "unknown");
        return;
    }
    time_t s = (time_t)floor(t);
    struct tm tm;
    gmtime_r(&s, &tm);
    strftime(buf, cap, "%Y-%m-%d %H:%M:%S UTC", &tm);
}

static void fmt_secs(char *buf, size_t cap, double s) {
    if (isnan(s))
        snprintf(buf, cap, "—");
    else
        snprintf(buf, cap, "%.2f", s);
}

static void fmt_bytes(char *buf, size_t cap, double b) {
    snprintf(buf, cap, "%.0f bytes (%.2f MB)", b, b / 1e6);
}

static void run_status(const run_data *r, char *buf, size_t cap) {
    if (!r->rd.end) {
        snprintf(buf, cap, "did not finish (no end event)");
        return;
    }
    const char *st = report_jstr(r->rd.end, "status"), *why = report_jstr(r->rd.end, "reason");
    snprintf(buf, cap, "%s%s%s%s", st ? st : "unknown", why && why[0] ? " (" : "",
             why && why[0] ? why : "", why && why[0] ? ")" : "");
}

static void header(doc *d, const run_data *f, const run_data *b) {
    static const char *const head[] = {"", "fault run", "baseline"};
    char cell[2][7][LOCO_PATH_MAX];
    const run_data *runs[2] = {f, b};
    for (int k = 0; k < 2; k++) {
        const run_data *r = runs[k];
        const char *cfg = r->rd.start ? report_jstr(r->rd.start, "config") : NULL;
        double seed = r->rd.start ? report_jnum(r->rd.start, "seed") : NAN;
        sbuf sites = {0};
        for (int i = 0; i < r->nsites; i++)
            report_sb_printf(&sites, "%s%s", i ? ", " : "", r->sites[i].name);
        snprintf(cell[k][0], LOCO_PATH_MAX, "%s", r->rd.dir);
        snprintf(cell[k][1], LOCO_PATH_MAX, "%s", cfg ? cfg : "unknown");
        if (isfinite(seed))
            snprintf(cell[k][2], LOCO_PATH_MAX, "%.0f", seed);
        else
            snprintf(cell[k][2], LOCO_PATH_MAX, "unknown");
        snprintf(cell[k][3], LOCO_PATH_MAX, "%s", report_sb_str(&sites));
        fmt_time(cell[k][4], LOCO_PATH_MAX, r->t0);
        fmt_time(cell[k][5], LOCO_PATH_MAX, r->t1);
        size_t n = strlen(cell[k][5]);
        snprintf(cell[k][5] + n, LOCO_PATH_MAX - n, " (%.2f s)", r->t1 - r->t0);
        run_status(r, cell[k][6], LOCO_PATH_MAX);
        report_sb_fini(&sites);
    }
    static const char *const what[7] = {"directory", "config", "seed",  "sites",
                                        "start",     "end",    "status"};
    doc_h(d, 1, "loco fault-injection report");
    doc_table(d, true);
    doc_row(d, 3, head, true);
    for (int i = 0; i < 7; i++) {
        const char *row[3] = {what[i], cell[0][i], cell[1][i]};
        doc_row(d, 3, row, false);
    }
    doc_table(d, false);
}

/* One row per fault's cycle (faulttol/cycle.c): injected, detected and
 * recovered, and whether it completed; every incomplete one goes into
 * the verdict. */
static void fault_table(doc *d, const run_data *r, verdict *v) {
    static const char *const head[] = {"no.",           "fault",         "site(s)",
                                       "injected (s)",  "detected (s)",  "detection (s)",
                                       "recovered (s)", "recovery (s)",  "cycle",
                                       "notes"};
    doc_h(d, 2, "Faults");
    loco_fault_cycle cyc[LOCO_MAX_CYCLES];
    int n = loco_fault_cycles(r->rd.ev, r->rd.nev, cyc, LOCO_MAX_CYCLES);
    if (n <= 0) {
        doc_p(d, "No fault was injected.");
        return;
    }
    doc_p(d, "One row per injected fault and its cycle (injected → detected → recovered, "
             "docs/FAULTS.md has each kind's); times in seconds since the start of the fault "
             "run, detection and recovery measured from the injection.");
    doc_table(d, true);
    doc_row(d, 10, head, true);
    for (int i = 0; i < n; i++) {
        const loco_fault_cycle *f = &cyc[i];
        char num[16], sites[2 * LOCO_NET_NAME_MAX + 8], inj[32], det[32], dt[32], rec[32],
            rt[32], state[256];
        snprintf(num, sizeof num, "%d", i + 1);
        snprintf(sites, sizeof sites, "%s%s%s", f->site[0] ? f->site : "—", f->peer[0] ? ", " : "",
                 f->peer);
        fmt_secs(inj, sizeof inj, f->injected - r->t0);
        fmt_secs(det, sizeof det, f->detected - r->t0);
        fmt_secs(dt, sizeof dt, f->detected - f->injected);
        fmt_secs(rec, sizeof rec, f->recovered - r->t0);
        fmt_secs(rt, sizeof rt, f->recovered - f->injected);
        snprintf(state, sizeof state, "%s%s", f->complete ? "complete" : "INCOMPLETE: ",
                 f->complete ? "" : f->missing);
        const char *cells[10] = {num, f->fault, sites, inj, det, dt, rec, rt, state, f->notes};
        doc_row(d, 10, cells, false);
        if (!f->complete) {
            if (v->nopen++)
                report_sb_puts(&v->open, "; ");
            report_sb_printf(&v->open, "%s%s%s: %s", f->fault, f->site[0] ? " of " : "", f->site,
                             f->missing);
        }
    }
    doc_table(d, false);
}

static void fmt_util(char *buf, size_t cap, double u) {
    if (isnan(u))
        snprintf(buf, cap, "not recorded");
    else
        snprintf(buf, cap, "%.1f%%", 100 * u);
}

/* A run's mean utilisation over islands, saying how many islands it covers
 * when some recorded none. */
static void fmt_util_mean(char *buf, size_t cap, const run_data *r) {
    fmt_util(buf, cap, r->util_mean);
    size_t n = strlen(buf);
    if (r->util_sites && r->util_sites < r->nsites)
        snprintf(buf + n, cap - n, " (%d of %d islands)", r->util_sites, r->nsites);
}

/* Per island of both runs: seconds the inner loop waited on the outer loop,
 * wall seconds and their utilisation over its outer.jsonl records. */
static void utilisation_section(doc *d, const run_data *f, const run_data *b) {
    static const char *const head[] = {"run",      "island",   "records",    "waited (s)",
                                       "wall (s)", "utilisation", "lowest record"};
    doc_h(d, 2, "Compute utilisation");
    if (!f->util_sites && !b->util_sites) {
        doc_p(d, "Not recorded: no outer.jsonl record of either run carries \"wait_s\" and "
                 "\"wall_s\".");
        return;
    }
    doc_p(d, "Utilisation is 1 - waited / wall: the share of wall time the inner training loop "
             "was not blocked by the outer loop, summed over an island's outer.jsonl records "
             "that carry \"wait_s\" and \"wall_s\"; the lowest record is the worst single "
             "outer step. The run's figure is the mean over its islands.");
    sbuf svg = {0};
    report_chart_utilisation(&svg, f, b);
    doc_svg(d, &svg);
    report_sb_fini(&svg);
    doc_table(d, true);
    doc_row(d, 7, head, true);
    const run_data *runs[2] = {f, b};
    for (int k = 0; k < 2; k++) {
        const run_data *r = runs[k];
        for (int i = 0; i < r->nsites; i++) {
            const utilisation *u = &r->sites[i].util;
            char n[16], wait[32], wall[32], all[64], low[64];
            snprintf(n, sizeof n, "%d", u->n);
            fmt_secs(wait, sizeof wait, u->n ? u->wait_s : NAN);
            fmt_secs(wall, sizeof wall, u->n ? u->wall_s : NAN);
            fmt_util(all, sizeof all, u->overall);
            if (u->n)
                fmt_util(low, sizeof low, u->min);
            else
                snprintf(low, sizeof low, "—");
            const char *cells[7] = {r->label, r->sites[i].name, n, wait, wall, all, low};
            doc_row(d, 7, cells, false);
        }
        char mean[96];
        fmt_util_mean(mean, sizeof mean, r);
        const char *cells[7] = {r->label, "mean over islands", "", "", "", mean, ""};
        doc_row(d, 7, cells, false);
    }
    doc_table(d, false);
}

static int count_kind(const run_data *r, const char *kind) {
    int n = 0;
    for (int i = 0; i < r->rd.nev; i++)
        n += report_jkind(r->rd.ev[i], kind);
    return n;
}

/* Everything the verdict rests on, in the report and in v. */
static void results(doc *d, const run_data *f, const run_data *b, const loco_report_opts *o,
                    verdict *v) {
    char bf[96], bb[96], tb[96];
    doc_h(d, 2, "Against the baseline");
    doc_ul(d, true);
    fmt_bytes(bf, sizeof bf, f->bytes_sent);
    fmt_bytes(bb, sizeof bb, b->bytes_sent);
    doc_li(d, "Bytes on the wire (sum of bytes_sent)", "fault run %s; baseline %s", bf, bb);
    if (f->transfer_bytes > 0) {
        fmt_bytes(tb, sizeof tb, f->transfer_bytes);
        doc_li(d, "State transfer to joining islands", "%s", tb);
    }
    double wf = f->t1 - f->t0, wb = b->t1 - b->t0;
    doc_li(d, "Wall time", "fault run %.2f s; baseline %.2f s; extra %+.2f s (%+.1f%%)", wf, wb,
           wf - wb, wb > 0 ? 100 * (wf - wb) / wb : 0.0);
    bool use_val = report_has_val(f) && report_has_val(b);
    int64_t sf = 0, sbs = 0;
    double lf = final_loss(f, use_val, &sf), lb = final_loss(b, use_val, &sbs);
    const char *what = use_val ? "validation loss at the last validated step"
                               : "training loss, mean of the last steps";
    if (isnan(lf) || isnan(lb)) {
        doc_li(d, "Final loss", "not available (%s has no loss values)",
               isnan(lf) ? "the fault run" : "the baseline");
        if (o->strict_loss)
            fail(v, "final loss not available");
    } else {
        double rel = lb != 0 ? (lf - lb) / fabs(lb) : (lf == lb ? 0 : INFINITY);
        bool within = fabs(rel) <= o->loss_tol;
        doc_li(d, "Final loss", "%s: fault run %.4f (step %lld), baseline %.4f (step %lld)", what,
               lf, (long long)sf, lb, (long long)sbs);
        doc_li(d, "Relative difference", "%+.2f%%, %s the tolerance of %.2f%%%s", 100 * rel,
               within ? "within" : "outside", 100 * o->loss_tol,
               o->strict_loss ? " (--strict-loss)" : " (not a failure without --strict-loss)");
        if (!within && o->strict_loss)
            fail(v, "final loss differs from the baseline by %+.2f%% (tolerance %.2f%%)", 100 * rel,
                 100 * o->loss_tol);
    }
    doc_li(d, "Committed outer steps", "fault run %d (%s%lld), baseline %d (%s%lld)%s", f->ncommits,
           f->ncommits ? "last " : "", f->ncommits ? (long long)f->commits[f->ncommits - 1] : 0LL,
           b->ncommits, b->ncommits ? "last " : "",
           b->ncommits ? (long long)b->commits[b->ncommits - 1] : 0LL,
           f->commits_from_events && b->commits_from_events
               ? ""
               : " (a run without commit events counts the outer steps of outer.jsonl)");
    char uf[96], ub[96];
    fmt_util_mean(uf, sizeof uf, f);
    fmt_util_mean(ub, sizeof ub, b);
    doc_li(d, "Compute utilisation (mean over islands)", "fault run %s; baseline %s", uf, ub);
    const cJSON *ext = NULL;
    for (int i = 0; i < f->rd.nev; i++)
        if (report_jkind(f->rd.ev[i], "extend"))
            ext = f->rd.ev[i];
    if (ext)
        doc_li(d, "Run extended", "%d time%s while a fault's cycle was open: the last inner step "
               "moved from %.0f to %.0f (limit %.0f, faults.max_extra_steps); the last time for "
               "%s", count_kind(f, "extend"), count_kind(f, "extend") > 1 ? "s" : "",
               report_jnum(ext, "train_steps"), report_jnum(ext, "end_step"),
               report_jnum(ext, "limit"), report_jstr(ext, "why") ? report_jstr(ext, "why") : "?");
    else
        doc_li(d, "Run extended", "no (it ended at train.steps)");
    doc_li(d, "Events of the fault run", "suspect %d, late %d, join %d, refused %d, divergence %d",
           count_kind(f, "suspect"), count_kind(f, "late"), count_kind(f, "join"),
           count_kind(f, "refused"), count_kind(f, "divergence"));
    doc_ul(d, false);

    char st[600];
    run_status(f, st, sizeof st);
    if (!f->rd.end)
        fail(v, "the fault run did not finish (no end event)");
    else if (!report_streq(report_jstr(f->rd.end, "status"), "finished"))
        fail(v, "the fault run ended with status %s", st);
    for (int i = 0; i < f->rd.nev; i++)
        if (report_jkind(f->rd.ev[i], "divergence")) {
            const char *det = report_jstr(f->rd.ev[i], "detail");
            fail(v, "divergence at outer step %.0f%s%s", report_jnum(f->rd.ev[i], "outer_step"),
                 det ? ": " : "", det ? det : "");
        }
    check_hashes(f, v);
    check_lost_updates(f, b, v);
}

static const char HTML_STYLE[] =
    "body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;font-size:90%}th,td{border:1px solid #ccc;padding:3px 6px;"
    "text-align:left}th{background:#f2f2f2}figure{margin:1em 0}.pass{color:#1a7f37}"
    ".fail{color:#cf222e}";

void loco_report_opts_default(loco_report_opts *o) {
    o->loss_tol = 0.01;
    o->strict_loss = false;
}

int loco_report_write_opts(const char *fault_dir, const char *baseline_dir, const char *out_dir,
                          const loco_report_opts *opts, int *verdict_ok) {
    loco_report_opts o;
    loco_report_opts_default(&o);
    if (opts)
        o = *opts;
    if (!out_dir)
        out_dir = fault_dir;
    run_data f = {0}, b = {0};
    warnings w = {0};
    verdict v = {0};
    doc d = {0};
    sbuf svg = {0};
    int rc;
    LOCO_CHECK_GOTO(report_load_run(&f, fault_dir, "fault run", &w), out);
    LOCO_CHECK_GOTO(report_load_run(&b, baseline_dir, "baseline", &w), out);
    LOCO_CHECK_GOTO(loco_mkdirs(out_dir), out);

    report_sb_puts(&d.html, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                     "<title>loco report: ");
    report_sb_html(&d.html, f.rd.start && report_jstr(f.rd.start, "config") ? report_jstr(f.rd.start, "config") : fault_dir);
    report_sb_printf(&d.html, "</title>\n<style>%s</style>\n</head>\n<body>\n", HTML_STYLE);
    header(&d, &f, &b);
    /* the verdict needs the analysis, but is read first: analyse into a
     * scratch document, then lay out verdict, charts and tables in order */
    doc body = {0}, faults = {0};
    fault_table(&faults, &f, &v);
    results(&body, &f, &b, &o, &v);
    if (b.rd.end == NULL || !report_streq(report_jstr(b.rd.end, "status"), "finished"))
        report_warn(&w, "%s: the baseline did not finish; comparisons are against a partial run",
                    baseline_dir);
    /* FAIL outranks INCOMPLETE: a broken run says so first. */
    const bool ok = v.nfail == 0 && v.nopen == 0;
    const char *word = v.nfail ? "FAIL" : v.nopen ? "INCOMPLETE" : "PASS";
    sbuf why = {0};
    report_sb_puts(&why, report_sb_str(&v.why));
    if (v.nopen)
        report_sb_printf(&why, "%sa fault's cycle did not complete: %s", v.nfail ? "; " : "",
                         report_sb_str(&v.open));
    report_sb_printf(&d.md, "**Verdict: %s**", word);
    report_sb_printf(&d.html, "<p class=\"%s\"><b>Verdict: %s</b>", ok ? "pass" : "fail", word);
    if (!ok) {
        report_sb_puts(&d.md, ": ");
        report_sb_md(&d.md, report_sb_str(&why));
        report_sb_puts(&d.html, ": ");
        report_sb_html(&d.html, report_sb_str(&why));
    }
    report_sb_puts(&d.md, "\n\n");
    report_sb_puts(&d.html, "</p>\n");

    doc_h(&d, 2, "Loss");
    report_chart_loss(&svg, &f, &b);
    doc_svg(&d, &svg);
    svg.n = 0;
    doc_h(&d, 2, "Membership");
    report_chart_membership(&svg, &f);
    doc_svg(&d, &svg);
    report_sb_puts(&d.md, report_sb_str(&faults.md));
    report_sb_puts(&d.html, report_sb_str(&faults.html));
    report_sb_puts(&d.md, report_sb_str(&body.md));
    report_sb_puts(&d.html, report_sb_str(&body.html));
    report_sb_fini(&faults.md);
    report_sb_fini(&faults.html);
    report_sb_fini(&body.md);
    report_sb_fini(&body.html);
    utilisation_section(&d, &f, &b);
    if (w.n) {
        doc_h(&d, 2, "Warnings");
        doc_ul(&d, true);
        const char *s = report_sb_str(&w.text);
        while (*s) {
            const char *nl = strchr(s, '\n');
            doc_li(&d, NULL, "%.*s", (int)(nl - s), s);
            s = nl + 1;
        }
        doc_ul(&d, false);
    }
    report_sb_puts(&d.html, "</body>\n</html>\n");
    LOCO_CHECK_GOTO(report_write_file(out_dir, "report.md", &d.md), out);
    LOCO_CHECK_GOTO(report_write_file(out_dir, "report.html", &d.html), out);
    printf("report: %s/report.md, %s/report.html\n", out_dir, out_dir);
    printf("verdict: %s%s%s\n", word, ok ? "" : ": ", report_sb_str(&why));
    report_sb_fini(&why);
    if (verdict_ok)
        *verdict_ok = ok;
out:
    report_sb_fini(&svg);
    report_sb_fini(&d.md);
    report_sb_fini(&d.html);
    report_sb_fini(&v.why);
    report_sb_fini(&v.open);
    report_sb_fini(&w.text);
    report_run_fini(&f);
    report_run_fini(&b);
    return rc;
}

int loco_report_write(const char *fault_dir, const char *baseline_dir, const char *out_dir,
                     int *verdict_ok) {
    return loco_report_write_opts(fault_dir, baseline_dir, out_dir, NULL, verdict_ok);
}

