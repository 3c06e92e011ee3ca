/* The fault-experiment report: growing buffers and the run directories
 * `loco launch` leaves (events.jsonl, <site>/metrics.jsonl,
 * <site>/outer.jsonl; docs/REPORTS.md is the contract), read and checked. */
#include "faulttol/report_internal.h"

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
    for (int i = 0; i < r->nev; i++)
        cJSON_Delete(r->ev[i]);
    loco_free(r->ev);
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

/* ------------------------------------------------------------ JSON help */

const char *report_jstr(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

double report_jnum(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

bool report_jkind(const cJSON *e, const char *kind) {
    const char *k = report_jstr(e, "kind");
    return k && !strcmp(k, kind);
}

double report_jt(const cJSON *e) {
    return report_jnum(e, "t");
}

/* True when the event's "members" array names site. */
bool report_jmembers_has(const cJSON *e, const char *site) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "members");
    const cJSON *x;
    cJSON_ArrayForEach(x, m) {
        if (cJSON_IsString(x) && !strcmp(x->valuestring, site))
            return true;
    }
    return false;
}

bool report_streq(const char *a, const char *b) {
    return a && b && !strcmp(a, b);
}

int report_read_jsonl(const char *path, report_line_fn fn, void *ctx, warnings *w,
                      int *malformed) {
    void *data;
    size_t len;
    LOCO_CHECK(loco_file_read(path, &data, &len));
    const char *s = data, *end = s + len;
    int lineno = 0, rc = 0;
    while (s < end && rc >= 0) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *e = nl ? nl : end;
        lineno++;
        const char *p = s;
        while (p < e && (*p == ' ' || *p == '\t' || *p == '\r'))
            p++;
        if (p < e) {
            cJSON *obj = cJSON_ParseWithLength(s, (size_t)(e - s));
            if (!cJSON_IsObject(obj)) {
                report_warn(w, "%s:%d: malformed line skipped (not a JSON object)", path, lineno);
                if (malformed)
                    (*malformed)++;
                cJSON_Delete(obj);
            } else {
                rc = fn(ctx, path, lineno, obj);
                if (rc != 1)
                    cJSON_Delete(obj);
            }
        }
        s = e + 1;
    }
    loco_free(data);
    return rc < 0 ? rc : 0;
}

/* ------------------------------------------------------------- loading */

typedef struct {
    run_data *r;
    warnings *w;
} load_ctx;

static int event_line(void *ctx, const char *path, int lineno, cJSON *obj) {
    load_ctx *c = ctx;
    if (!isfinite(report_jt(obj)) || !report_jstr(obj, "kind")) {
        report_warn(c->w, "%s:%d: event without a numeric \"t\" and a \"kind\" skipped", path,
                    lineno);
        c->r->malformed++;
        return 0;
    }
    LOCO_CHECK(report_grow((void **)&c->r->ev, &c->r->capev, c->r->nev + 1, sizeof(cJSON *)));
    c->r->ev[c->r->nev++] = obj;
    return 1;
}

typedef struct {
    site_data *s;
    warnings *w;
    int *malformed;
} site_ctx;

static int metrics_line(void *ctx, const char *path, int lineno, cJSON *obj) {
    site_ctx *c = ctx;
    double step = report_jnum(obj, "step");
    if (!isfinite(step) || step < 0) {
        report_warn(c->w, "%s:%d: metrics line without a \"step\" skipped", path, lineno);
        (*c->malformed)++;
        return 0;
    }
    mpoint p = {(int64_t)step, report_jnum(obj, "loss"), report_jnum(obj, "val_loss"), c->s->nm};
    if (isnan(p.loss) && isnan(p.val))
        return 0; /* nothing this report draws */
    LOCO_CHECK(report_grow((void **)&c->s->m, &c->s->capm, c->s->nm + 1, sizeof(mpoint)));
    c->s->m[c->s->nm++] = p;
    return 0;
}

static int outer_line(void *ctx, const char *path, int lineno, cJSON *obj) {
    site_ctx *c = ctx;
    double os = report_jnum(obj, "outer_step");
    if (!isfinite(os)) {
        report_warn(c->w, "%s:%d: outer line without an \"outer_step\" skipped", path, lineno);
        (*c->malformed)++;
        return 0;
    }
    opoint p = {(int64_t)os, report_jnum(obj, "bytes_sent"), report_jnum(obj, "wait_s"),
                report_jnum(obj, "wall_s"), NAN, ""};
    bool any = !isnan(p.wait_s) || !isnan(p.wall_s);
    if (any && !(p.wall_s > 0 && p.wait_s >= 0 && p.wait_s <= p.wall_s && isfinite(p.wall_s))) {
        report_warn(c->w,
                    "%s:%d: \"wait_s\" and \"wall_s\" not usable (need 0 <= wait_s <= wall_s, "
                    "wall_s > 0); left out of the utilisation",
                    path, lineno);
        p.wait_s = p.wall_s = NAN;
    } else if (any) {
        p.util = 1 - p.wait_s / p.wall_s;
    }
    const char *h = report_jstr(obj, "theta_hash");
    snprintf(p.hash, sizeof p.hash, "%s", h ? h : "");
    LOCO_CHECK(report_grow((void **)&c->s->o, &c->s->capo, c->s->no + 1, sizeof(opoint)));
    c->s->o[c->s->no++] = p;
    return 0;
}

/* Sorts events by time, keeping the file order of events of equal time (a
 * fault and what it caused may share a timestamp): a merge sort. */
static int sort_events(cJSON **ev, int n) {
    cJSON **tmp = loco_alloc((size_t)(n > 0 ? n : 1) * sizeof(cJSON *));
    if (!tmp)
        return LOCO_ERR(LOCO_ENOMEM, "report: sorting %d events", n);
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = report_jt(ev[j]) < report_jt(ev[i]) ? ev[j++] : ev[i++];
            while (i < mid)
                tmp[k++] = ev[i++];
            while (j < hi)
                tmp[k++] = ev[j++];
        }
        memcpy(ev, tmp, (size_t)n * sizeof(cJSON *));
    }
    loco_free(tmp);
    return 0;
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

/* A site name becomes a path component: no separators, no dot files. */
int report_check_site_name(const char *name, const char *where) {
    if (!name[0] || name[0] == '.' || strchr(name, '/') || strlen(name) >= REPORT_SITE_MAX)
        return LOCO_ERR(LOCO_EPROTO, "%s: bad site name '%s'", where, name);
    return 0;
}

static int add_site(run_data *r, const char *name, const char *where) {
    LOCO_CHECK(report_check_site_name(name, where));
    for (int i = 0; i < r->nsites; i++)
        if (!strcmp(r->sites[i].name, name))
            return 0;
    if (r->nsites >= REPORT_MAX_SITES)
        return LOCO_ERR(LOCO_EINVAL, "%s: more than %d sites", where, REPORT_MAX_SITES);
    snprintf(r->sites[r->nsites++].name, REPORT_SITE_MAX, "%s", name);
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const site_data *)a)->name, ((const site_data *)b)->name);
}

/* The sites of a run: those of its start event, or else the subdirectories
 * that hold a metrics.jsonl. */
static int find_sites(run_data *r, const char *events_path, warnings *w) {
    r->sites = loco_alloc(REPORT_MAX_SITES * sizeof(site_data));
    if (!r->sites)
        return LOCO_ERR(LOCO_ENOMEM, "report: sites");
    const cJSON *list = r->start ? cJSON_GetObjectItemCaseSensitive(r->start, "sites") : NULL;
    if (cJSON_IsArray(list)) {
        const cJSON *x;
        cJSON_ArrayForEach(x, list) {
            if (cJSON_IsString(x))
                LOCO_CHECK(add_site(r, x->valuestring, events_path));
        }
        if (r->nsites > 0)
            return 0;
    }
    report_warn(w,
                "%s: no start event with \"sites\"; using the subdirectories of %s that hold a "
                "metrics.jsonl",
                events_path, r->dir);
    DIR *d = opendir(r->dir);
    if (!d)
        return LOCO_ERR(LOCO_EIO, "%s: cannot list: %s", r->dir, strerror(errno));
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d)) && rc == 0) {
        if (de->d_name[0] == '.')
            continue;
        char path[LOCO_PATH_MAX + 2 * REPORT_SITE_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/%.*s/metrics.jsonl", r->dir, REPORT_SITE_MAX - 1,
                 de->d_name);
        if (strlen(de->d_name) < REPORT_SITE_MAX && stat(path, &st) == 0)
            rc = add_site(r, de->d_name, r->dir);
    }
    closedir(d);
    if (rc < 0)
        return rc;
    if (r->nsites == 0)
        return LOCO_ERR(LOCO_EIO, "%s: no sites: no start event and no <site>/metrics.jsonl",
                        r->dir);
    qsort(r->sites, (size_t)r->nsites, sizeof(site_data), cmp_name);
    return 0;
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
    for (int i = 0; i < r->nev; i++) {
        double s = report_jnum(r->ev[i], "outer_step");
        if (report_jkind(r->ev[i], "commit") && isfinite(s))
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

int report_load_run(run_data *r, const char *dir, const char *label, warnings *w) {
    struct stat st;
    r->dir = dir;
    r->label = label;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return LOCO_ERR(LOCO_EIO, "%s run directory %s: %s", label, dir,
                        errno ? strerror(errno) : "not a directory");
    char path[LOCO_PATH_MAX + 2 * REPORT_SITE_MAX];
    snprintf(path, sizeof path, "%s/events.jsonl", dir);
    load_ctx lc = {r, w};
    LOCO_CHECK(report_read_jsonl(path, event_line, &lc, w, &r->malformed));
    if (r->nev == 0)
        return LOCO_ERR(LOCO_EPROTO, "%s: no events", path);
    LOCO_CHECK(sort_events(r->ev, r->nev));
    for (int i = 0; i < r->nev; i++) {
        if (!r->start && report_jkind(r->ev[i], "start"))
            r->start = r->ev[i];
        if (report_jkind(r->ev[i], "end"))
            r->end = r->ev[i];
    }
    r->t0 = r->start ? report_jt(r->start) : report_jt(r->ev[0]);
    r->t1 = r->end ? report_jt(r->end) : report_jt(r->ev[r->nev - 1]);
    LOCO_CHECK(find_sites(r, path, w));
    for (int i = 0; i < r->nsites; i++) {
        site_data *s = &r->sites[i];
        site_ctx sc = {s, w, &r->malformed};
        snprintf(path, sizeof path, "%s/%s/metrics.jsonl", dir, s->name);
        LOCO_CHECK(report_read_jsonl(path, metrics_line, &sc, w, &r->malformed));
        dedupe_steps(s);
        snprintf(path, sizeof path, "%s/%s/outer.jsonl", dir, s->name);
        if (stat(path, &st) != 0) {
            report_warn(w, "%s: missing; island %s counted as sending nothing", path, s->name);
            continue;
        }
        s->has_outer = true;
        LOCO_CHECK(report_read_jsonl(path, outer_line, &sc, w, &r->malformed));
        for (int j = 0; j < s->no; j++)
            if (isfinite(s->o[j].bytes_sent))
                r->bytes_sent += s->o[j].bytes_sent;
    }
    for (int i = 0; i < r->nev; i++) {
        double b = report_jnum(r->ev[i], "transfer_bytes");
        if (report_jkind(r->ev[i], "join") && isfinite(b))
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
