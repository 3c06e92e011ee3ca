/* The reports' growing buffers, and the fault-experiment report's runs:
 * what rundir.c read, turned into per-island points, the mean over the
 * islands, the committed outer steps and the compute utilisation. */
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

/* ------------------------------------------------------- growing buffers */

/* Grows *p (elements of size elem, capacity *cap) to hold need elements. */
int report_grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap)
        return 0;
    int ncap = *cap ? *cap * 2 : 16;
    while (ncap < need)
        ncap *= 2;
    void *q = loco_alloc((size_t)ncap * elem);
    if (!q)
        return LOCO_ERR(LOCO_ENOMEM, "report: %d elements", ncap);
    if (*p)
        memcpy(q, *p, (size_t)*cap * elem);
    loco_free(*p);
    *p = q;
    *cap = ncap;
    return 0;
}

/* A string builder; an allocation failure sets oom and later appends are
 * dropped, checked once when the text is written out. */

static void sb_putn(sbuf *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap * 2 : 4096;
        while (ncap < b->n + n + 1)
            ncap *= 2;
        char *q = loco_alloc(ncap);
        if (!q) {
            b->oom = true;
            return;
        }
        if (b->s)
            memcpy(q, b->s, b->n);
        loco_free(b->s);
        b->s = q;
        b->cap = ncap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

void report_sb_puts(sbuf *b, const char *s) {
    sb_putn(b, s, strlen(s));
}

__attribute__((format(printf, 2, 3))) void report_sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof tmp) {
        sb_putn(b, tmp, (size_t)n);
        return;
    }
    char *big = loco_alloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_putn(b, big, (size_t)n);
    loco_free(big);
}

void report_sb_fini(sbuf *b) {
    loco_free(b->s);
    memset(b, 0, sizeof *b);
}

const char *report_sb_str(const sbuf *b) {
    return b->s ? b->s : "";
}

/* Text for HTML (and SVG): the five special characters as entities. */
void report_sb_html(sbuf *b, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': report_sb_puts(b, "&amp;"); break;
        case '<': report_sb_puts(b, "&lt;"); break;
        case '>': report_sb_puts(b, "&gt;"); break;
        case '"': report_sb_puts(b, "&quot;"); break;
        case '\'': report_sb_puts(b, "&#39;"); break;
        default: sb_putn(b, s, 1);
        }
    }
}

/* Text for Markdown: HTML entities for what would open a tag or entity,
 * backslashes before Markdown's punctuation, lines joined (table cells). */
void report_sb_md(sbuf *b, const char *s) {
    if (*s == '#')
        report_sb_puts(b, "\\");
    for (; *s; s++) {
        if (strchr("&<>\"'", *s)) {
            char one[2] = {*s, 0};
            report_sb_html(b, one);
        } else if (strchr("\\`*_[]|", *s)) {
            char esc[3] = {'\\', *s, 0};
            report_sb_puts(b, esc);
        } else if (*s == '\n' || *s == '\r') {
            report_sb_puts(b, " ");
        } else {
            sb_putn(b, s, 1);
        }
    }
}

int report_write_file(const char *dir, const char *name, const sbuf *text) {
    char path[LOCO_PATH_MAX + 32], tmp[LOCO_PATH_MAX + 40];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (text->oom)
        return LOCO_ERR(LOCO_ENOMEM, "%s: out of memory building the report", path);
    LOCO_CHECK(loco_file_write_sync(tmp, report_sb_str(text), text->n));
    if (rename(tmp, path) != 0)
        return LOCO_ERR(LOCO_EIO, "%s: cannot rename: %s", path, strerror(errno));
    return 0;
}

/* ---------------------------------------------------------- run content */

__attribute__((format(printf, 2, 3))) void report_warn(warnings *w, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    loco_warn("report: %s", msg);
    report_sb_puts(&w->text, msg);
    report_sb_puts(&w->text, "\n");
    w->n++;
}

void report_run_fini(run_data *r) {
    report_rundir_fini(&r->rd);
    for (int i = 0; i < r->nsites; i++) {
        loco_free(r->sites[i].m);
        loco_free(r->sites[i].o);
    }
    loco_free(r->sites);
    loco_free(r->mean.step);
    loco_free(r->mean.loss);
    loco_free(r->mean.val);
    loco_free(r->commits);
    loco_free(r->util_step);
    loco_free(r->util);
    memset(r, 0, sizeof *r);
}

static int cmp_mpoint(const void *a, const void *b) {
    const mpoint *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return x->seq - y->seq;
}

int report_cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts one island's points by step and keeps one per step: the last loss
 * and the last validation loss written for it (a restarted island appends
 * to the same file, so steps repeat). */
static void dedupe_steps(site_data *s) {
    qsort(s->m, (size_t)s->nm, sizeof(mpoint), cmp_mpoint);
    int out = 0;
    for (int i = 0; i < s->nm;) {
        mpoint p = s->m[i];
        int j = i + 1;
        for (; j < s->nm && s->m[j].step == p.step; j++) {
            if (!isnan(s->m[j].loss))
                p.loss = s->m[j].loss;
            if (!isnan(s->m[j].val))
                p.val = s->m[j].val;
        }
        s->m[out++] = p;
        i = j;
    }
    s->nm = out;
}

/* The mean over the islands that have a value at each step. */
static int build_mean(run_data *r) {
    int total = 0;
    for (int i = 0; i < r->nsites; i++)
        total += r->sites[i].nm;
    if (total == 0)
        return 0;
    mpoint *all = loco_alloc((size_t)total * sizeof(mpoint));
    if (!all)
        return LOCO_ERR(LOCO_ENOMEM, "report: %d points", total);
    int n = 0;
    for (int i = 0; i < r->nsites; i++)
        for (int j = 0; j < r->sites[i].nm; j++) {
            all[n] = r->sites[i].m[j];
            all[n].seq = n;
            n++;
        }
    qsort(all, (size_t)n, sizeof(mpoint), cmp_mpoint);
    series *m = &r->mean;
    int rc = 0;
    m->step = loco_alloc((size_t)n * sizeof(int64_t));
    m->loss = loco_alloc((size_t)n * sizeof(double));
    m->val = loco_alloc((size_t)n * sizeof(double));
    if (!m->step || !m->loss || !m->val) {
        rc = LOCO_ERR(LOCO_ENOMEM, "report: mean series");
        goto out_free_all;
    }
    for (int i = 0; i < n;) {
        double sl = 0, sv = 0;
        int nl = 0, nv = 0, j = i;
        for (; j < n && all[j].step == all[i].step; j++) {
            if (!isnan(all[j].loss))
                sl += all[j].loss, nl++;
            if (!isnan(all[j].val))
                sv += all[j].val, nv++;
        }
        m->step[m->n] = all[i].step;
        m->loss[m->n] = nl ? sl / nl : NAN;
        m->val[m->n] = nv ? sv / nv : NAN;
        m->n++;
        i = j;
    }
out_free_all:
    loco_free(all);
    return rc;
}

static int add_commit(run_data *r, int64_t step) {
    LOCO_CHECK(report_grow((void **)&r->commits, &r->capcommits, r->ncommits + 1, sizeof(int64_t)));
    r->commits[r->ncommits++] = step;
    return 0;
}

/* Committed outer steps: the commit events, or where a run has none (an
 * older coordinator), every outer step an island wrote to outer.jsonl. */
static int collect_commits(run_data *r) {
    for (int i = 0; i < r->rd.nev; i++) {
        double s = report_jnum(r->rd.ev[i], "outer_step");
        if (report_jkind(r->rd.ev[i], "commit") && isfinite(s))
            LOCO_CHECK(add_commit(r, (int64_t)s));
    }
    r->commits_from_events = r->ncommits > 0;
    if (!r->commits_from_events)
        for (int i = 0; i < r->nsites; i++)
            for (int j = 0; j < r->sites[i].no; j++)
                LOCO_CHECK(add_commit(r, r->sites[i].o[j].outer_step));
    qsort(r->commits, (size_t)r->ncommits, sizeof(int64_t), report_cmp_i64);
    int out = 0;
    for (int i = 0; i < r->ncommits; i++)
        if (out == 0 || r->commits[out - 1] != r->commits[i])
            r->commits[out++] = r->commits[i];
    r->ncommits = out;
    return 0;
}

/* An island's utilisation over its records that carry wait_s and wall_s
 * (a restarted island's repeated outer steps included, as for bytes). */
static void site_utilisation(site_data *s) {
    utilisation *u = &s->util;
    *u = (utilisation){0, 0, NAN, NAN, 0};
    for (int j = 0; j < s->no; j++) {
        const opoint *p = &s->o[j];
        if (isnan(p->util))
            continue;
        u->wait_s += p->wait_s;
        u->wall_s += p->wall_s;
        u->min = u->n++ ? fmin(u->min, p->util) : p->util;
    }
    if (u->n)
        u->overall = 1 - u->wait_s / u->wall_s;
}

typedef struct {
    int64_t outer_step;
    double u;
} upoint;

static int cmp_upoint(const void *a, const void *b) {
    return report_cmp_i64(&((const upoint *)a)->outer_step, &((const upoint *)b)->outer_step);
}

/* The run's utilisation: the mean over its islands of theirs, and per
 * outer step the mean over every record of that step. */
static int run_utilisation(run_data *r) {
    double sum = 0;
    int total = 0;
    for (int i = 0; i < r->nsites; i++) {
        site_utilisation(&r->sites[i]);
        if (r->sites[i].util.n) {
            sum += r->sites[i].util.overall;
            r->util_sites++;
            total += r->sites[i].util.n;
        }
    }
    r->util_mean = r->util_sites ? sum / r->util_sites : NAN;
    if (!total)
        return 0;
    upoint *all = loco_alloc((size_t)total * sizeof(upoint));
    r->util_step = loco_alloc((size_t)total * sizeof(int64_t));
    r->util = loco_alloc((size_t)total * sizeof(double));
    if (!all || !r->util_step || !r->util) {
        loco_free(all);
        return LOCO_ERR(LOCO_ENOMEM, "report: %d utilisation points", total);
    }
    int n = 0;
    for (int i = 0; i < r->nsites; i++)
        for (int j = 0; j < r->sites[i].no; j++) {
            const opoint *p = &r->sites[i].o[j];
            if (!isnan(p->util))
                all[n++] = (upoint){p->outer_step, p->util};
        }
    qsort(all, (size_t)n, sizeof(upoint), cmp_upoint);
    for (int i = 0; i < n;) {
        double s = 0;
        int j = i;
        for (; j < n && all[j].outer_step == all[i].outer_step; j++)
            s += all[j].u;
        r->util_step[r->nutil] = all[i].outer_step;
        r->util[r->nutil++] = s / (j - i);
        i = j;
    }
    loco_free(all);
    return 0;
}

/* An island's points: the metrics lines with a loss or a validation loss,
 * and its outer.jsonl records (wait_s and wall_s checked for the
 * utilisation). */
static int site_points(site_data *s, const report_site *in, warnings *w) {
    snprintf(s->name, sizeof s->name, "%s", in->name);
    for (int i = 0; i < in->nm; i++) {
        const report_mline *l = &in->m[i];
        if (isnan(l->loss) && isnan(l->val_loss))
            continue; /* nothing this report draws */
        LOCO_CHECK(report_grow((void **)&s->m, &s->capm, s->nm + 1, sizeof(mpoint)));
        s->m[s->nm] = (mpoint){(int64_t)l->step, l->loss, l->val_loss, s->nm};
        s->nm++;
    }
    dedupe_steps(s);
    s->has_outer = in->has_outer;
    for (int i = 0; i < in->no; i++) {
        const report_oline *l = &in->o[i];
        opoint p = {(int64_t)l->outer_step, l->bytes_sent, l->wait_s, l->wall_s, NAN, ""};
        bool any = !isnan(p.wait_s) || !isnan(p.wall_s);
        if (any && !(p.wall_s > 0 && p.wait_s >= 0 && p.wait_s <= p.wall_s && isfinite(p.wall_s))) {
            report_warn(w,
                        "%s/outer.jsonl:%d: \"wait_s\" and \"wall_s\" not usable (need 0 <= "
                        "wait_s <= wall_s, wall_s > 0); left out of the utilisation",
                        in->dir, l->lineno);
            p.wait_s = p.wall_s = NAN;
        } else if (any) {
            p.util = 1 - p.wait_s / p.wall_s;
        }
        snprintf(p.hash, sizeof p.hash, "%s", l->hash);
        LOCO_CHECK(report_grow((void **)&s->o, &s->capo, s->no + 1, sizeof(opoint)));
        s->o[s->no++] = p;
    }
    return 0;
}

int report_load_run(run_data *r, const char *dir, const char *label, warnings *w) {
    struct stat st;
    r->label = label;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return LOCO_ERR(LOCO_EIO, "%s run directory %s: %s", label, dir,
                        errno ? strerror(errno) : "not a directory");
    LOCO_CHECK(report_rundir_load(&r->rd, dir, REPORT_RUN_TIMELINE, w));
    r->t0 = r->rd.start ? report_jt(r->rd.start) : report_jt(r->rd.ev[0]);
    r->t1 = r->rd.end ? report_jt(r->rd.end) : report_jt(r->rd.ev[r->rd.nev - 1]);
    r->sites = loco_alloc((size_t)r->rd.nsites * sizeof(site_data));
    if (!r->sites)
        return LOCO_ERR(LOCO_ENOMEM, "report: sites");
    memset(r->sites, 0, (size_t)r->rd.nsites * sizeof(site_data));
    r->nsites = r->rd.nsites;
    for (int i = 0; i < r->nsites; i++) {
        site_data *s = &r->sites[i];
        LOCO_CHECK(site_points(s, &r->rd.sites[i], w));
        for (int j = 0; j < s->no; j++)
            if (isfinite(s->o[j].bytes_sent))
                r->bytes_sent += s->o[j].bytes_sent;
    }
    for (int i = 0; i < r->rd.nev; i++) {
        double b = report_jnum(r->rd.ev[i], "transfer_bytes");
        if (report_jkind(r->rd.ev[i], "join") && isfinite(b))
            r->transfer_bytes += b;
    }
    LOCO_CHECK(build_mean(r));
    LOCO_CHECK(collect_commits(r));
    LOCO_CHECK(run_utilisation(r));
    return 0;
}

bool report_has_val(const run_data *r) {
    for (int i = 0; i < r->mean.n; i++)
        if (!isnan(r->mean.val[i]))
            return true;
    return false;
}
