/* `loco report`: the report of a fault-injection experiment, a fault run
 * beside a fault-free baseline of the same seed. Reads the run directories
 * that `loco launch` leaves (events.jsonl, <site>/metrics.jsonl,
 * <site>/outer.jsonl; docs/REPORTS.md is the contract), and writes
 * report.md and report.html with inline SVG charts, the fault table, bytes
 * on the wire and a PASS/FAIL verdict. */
#include "cli/cli.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define REPORT_SITE_MAX 64     /* bytes of a site name, with the NUL */
#define REPORT_MAX_SITES 256   /* islands of one run */
#define REPORT_LIST_MAX 12     /* outer steps named in a lost-update reason */
#define REPORT_FINAL_WINDOW 10 /* training steps averaged for the final loss */
#define REPORT_MAX_POINTS 1500 /* points per polyline before decimation */

/* ------------------------------------------------------- growing buffers */

/* Grows *p (elements of size elem, capacity *cap) to hold need elements. */
static int grow(void **p, int *cap, int need, size_t elem) {
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
typedef struct {
    char *s;
    size_t n, cap;
    bool oom;
} sbuf;

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

static void sb_puts(sbuf *b, const char *s) {
    sb_putn(b, s, strlen(s));
}

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...) {
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

static void sb_fini(sbuf *b) {
    loco_free(b->s);
    memset(b, 0, sizeof *b);
}

static const char *sb_str(const sbuf *b) {
    return b->s ? b->s : "";
}

/* Text for HTML (and SVG): the five special characters as entities. */
static void sb_html(sbuf *b, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': sb_puts(b, "&amp;"); break;
        case '<': sb_puts(b, "&lt;"); break;
        case '>': sb_puts(b, "&gt;"); break;
        case '"': sb_puts(b, "&quot;"); break;
        case '\'': sb_puts(b, "&#39;"); break;
        default: sb_putn(b, s, 1);
        }
    }
}

/* Text for Markdown: HTML entities for what would open a tag or entity,
 * backslashes before Markdown's punctuation, lines joined (table cells). */
static void sb_md(sbuf *b, const char *s) {
    if (*s == '#')
        sb_puts(b, "\\");
    for (; *s; s++) {
        if (strchr("&<>\"'", *s)) {
            char one[2] = {*s, 0};
            sb_html(b, one);
        } else if (strchr("\\`*_[]|", *s)) {
            char esc[3] = {'\\', *s, 0};
            sb_puts(b, esc);
        } else if (*s == '\n' || *s == '\r') {
            sb_puts(b, " ");
        } else {
            sb_putn(b, s, 1);
        }
    }
}

/* ---------------------------------------------------------- run content */

typedef struct {
    int64_t step;
    double loss, val; /* NAN where the line had none */
    int seq;          /* line order, so the last value of a step wins */
} mpoint;

typedef struct {
    int64_t outer_step;
    double bytes_sent;
    char hash[40];
} opoint;

typedef struct {
    char name[REPORT_SITE_MAX];
    mpoint *m; /* after load: one point per step, ascending */
    int nm, capm;
    opoint *o; /* in file order */
    int no, capo;
    bool has_outer;
} site_data;

/* A series over steps: the mean over the islands present at each step. */
typedef struct {
    int64_t *step;
    double *loss, *val;
    int n, cap;
} series;

typedef struct {
    const char *dir;
    const char *label; /* "fault run" / "baseline" */
    cJSON **ev;        /* events, sorted by t */
    int nev, capev;
    site_data *sites;
    int nsites;
    const cJSON *start, *end; /* owned by ev[] */
    double t0, t1;            /* first and last time of the run */
    series mean;
    double bytes_sent, transfer_bytes;
    int64_t *commits; /* committed outer steps, ascending, unique */
    int ncommits, capcommits;
    bool commits_from_events;
    int malformed;
} run_data;

/* Warnings shown in the report and logged as they are found. */
typedef struct {
    sbuf text; /* one per line */
    int n;
} warnings;

__attribute__((format(printf, 2, 3))) static void report_warn(warnings *w, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    loco_warn("report: %s", msg);
    sb_puts(&w->text, msg);
    sb_puts(&w->text, "\n");
    w->n++;
}

static void run_fini(run_data *r) {
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
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------ JSON help */

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static double jnum(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static bool jkind(const cJSON *e, const char *kind) {
    const char *k = jstr(e, "kind");
    return k && !strcmp(k, kind);
}

static double jt(const cJSON *e) {
    return jnum(e, "t");
}

/* True when the event's "members" array names site. */
static bool jmembers_has(const cJSON *e, const char *site) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "members");
    const cJSON *x;
    cJSON_ArrayForEach(x, m) {
        if (cJSON_IsString(x) && !strcmp(x->valuestring, site))
            return true;
    }
    return false;
}

static bool streq(const char *a, const char *b) {
    return a && b && !strcmp(a, b);
}

/* Calls line(ctx, path, lineno, obj) for each JSON object line of a JSONL
 * file; malformed lines are warned about with file:line and skipped. The
 * callback owns obj when it returns 1, else it is freed. A missing file is
 * LOCO_EIO naming it. */
typedef int (*line_fn)(void *ctx, const char *path, int lineno, cJSON *obj);

static int read_jsonl(const char *path, line_fn fn, void *ctx, warnings *w, int *malformed) {
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
    if (!isfinite(jt(obj)) || !jstr(obj, "kind")) {
        report_warn(c->w, "%s:%d: event without a numeric \"t\" and a \"kind\" skipped", path,
                    lineno);
        c->r->malformed++;
        return 0;
    }
    LOCO_CHECK(grow((void **)&c->r->ev, &c->r->capev, c->r->nev + 1, sizeof(cJSON *)));
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
    double step = jnum(obj, "step");
    if (!isfinite(step) || step < 0) {
        report_warn(c->w, "%s:%d: metrics line without a \"step\" skipped", path, lineno);
        (*c->malformed)++;
        return 0;
    }
    mpoint p = {(int64_t)step, jnum(obj, "loss"), jnum(obj, "val_loss"), c->s->nm};
    if (isnan(p.loss) && isnan(p.val))
        return 0; /* nothing this report draws */
    LOCO_CHECK(grow((void **)&c->s->m, &c->s->capm, c->s->nm + 1, sizeof(mpoint)));
    c->s->m[c->s->nm++] = p;
    return 0;
}

static int outer_line(void *ctx, const char *path, int lineno, cJSON *obj) {
    site_ctx *c = ctx;
    double os = jnum(obj, "outer_step");
    if (!isfinite(os)) {
        report_warn(c->w, "%s:%d: outer line without an \"outer_step\" skipped", path, lineno);
        (*c->malformed)++;
        return 0;
    }
    opoint p = {(int64_t)os, jnum(obj, "bytes_sent"), ""};
    const char *h = jstr(obj, "theta_hash");
    snprintf(p.hash, sizeof p.hash, "%s", h ? h : "");
    LOCO_CHECK(grow((void **)&c->s->o, &c->s->capo, c->s->no + 1, sizeof(opoint)));
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
                tmp[k++] = jt(ev[j]) < jt(ev[i]) ? ev[j++] : ev[i++];
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

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* A site name becomes a path component: no separators, no dot files. */
static int check_site_name(const char *name, const char *where) {
    if (!name[0] || name[0] == '.' || strchr(name, '/') || strlen(name) >= REPORT_SITE_MAX)
        return LOCO_ERR(LOCO_EPROTO, "%s: bad site name '%s'", where, name);
    return 0;
}

static int add_site(run_data *r, const char *name, const char *where) {
    LOCO_CHECK(check_site_name(name, where));
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
    LOCO_CHECK(grow((void **)&r->commits, &r->capcommits, r->ncommits + 1, sizeof(int64_t)));
    r->commits[r->ncommits++] = step;
    return 0;
}

/* Committed outer steps: the commit events, or where a run has none (an
 * older coordinator), every outer step an island wrote to outer.jsonl. */
static int collect_commits(run_data *r) {
    for (int i = 0; i < r->nev; i++) {
        double s = jnum(r->ev[i], "outer_step");
        if (jkind(r->ev[i], "commit") && isfinite(s))
            LOCO_CHECK(add_commit(r, (int64_t)s));
    }
    r->commits_from_events = r->ncommits > 0;
    if (!r->commits_from_events)
        for (int i = 0; i < r->nsites; i++)
            for (int j = 0; j < r->sites[i].no; j++)
                LOCO_CHECK(add_commit(r, r->sites[i].o[j].outer_step));
    qsort(r->commits, (size_t)r->ncommits, sizeof(int64_t), cmp_i64);
    int out = 0;
    for (int i = 0; i < r->ncommits; i++)
        if (out == 0 || r->commits[out - 1] != r->commits[i])
            r->commits[out++] = r->commits[i];
    r->ncommits = out;
    return 0;
}

static int load_run(run_data *r, const char *dir, const char *label, warnings *w) {
    struct stat st;
    r->dir = dir;
    r->label = label;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return LOCO_ERR(LOCO_EIO, "%s run directory %s: %s", label, dir,
                        errno ? strerror(errno) : "not a directory");
    char path[LOCO_PATH_MAX + 2 * REPORT_SITE_MAX];
    snprintf(path, sizeof path, "%s/events.jsonl", dir);
    load_ctx lc = {r, w};
    LOCO_CHECK(read_jsonl(path, event_line, &lc, w, &r->malformed));
    if (r->nev == 0)
        return LOCO_ERR(LOCO_EPROTO, "%s: no events", path);
    LOCO_CHECK(sort_events(r->ev, r->nev));
    for (int i = 0; i < r->nev; i++) {
        if (!r->start && jkind(r->ev[i], "start"))
            r->start = r->ev[i];
        if (jkind(r->ev[i], "end"))
            r->end = r->ev[i];
    }
    r->t0 = r->start ? jt(r->start) : jt(r->ev[0]);
    r->t1 = r->end ? jt(r->end) : jt(r->ev[r->nev - 1]);
    LOCO_CHECK(find_sites(r, path, w));
    for (int i = 0; i < r->nsites; i++) {
        site_data *s = &r->sites[i];
        site_ctx sc = {s, w, &r->malformed};
        snprintf(path, sizeof path, "%s/%s/metrics.jsonl", dir, s->name);
        LOCO_CHECK(read_jsonl(path, metrics_line, &sc, w, &r->malformed));
        dedupe_steps(s);
        snprintf(path, sizeof path, "%s/%s/outer.jsonl", dir, s->name);
        if (stat(path, &st) != 0) {
            report_warn(w, "%s: missing; island %s counted as sending nothing", path, s->name);
            continue;
        }
        s->has_outer = true;
        LOCO_CHECK(read_jsonl(path, outer_line, &sc, w, &r->malformed));
        for (int j = 0; j < s->no; j++)
            if (isfinite(s->o[j].bytes_sent))
                r->bytes_sent += s->o[j].bytes_sent;
    }
    for (int i = 0; i < r->nev; i++) {
        double b = jnum(r->ev[i], "transfer_bytes");
        if (jkind(r->ev[i], "join") && isfinite(b))
            r->transfer_bytes += b;
    }
    LOCO_CHECK(build_mean(r));
    LOCO_CHECK(collect_commits(r));
    return 0;
}

/* ------------------------------------------------------------- analysis */

/* One row of the fault table; times are unix seconds, NAN when none. */
typedef struct {
    const cJSON *ev;
    double t, detected, recovered;
    char notes[512];
} fault_row;

static bool is_frame_fault(const char *k) {
    return streq(k, "corrupt") || streq(k, "drop") || streq(k, "duplicate") || streq(k, "reorder");
}

static bool site_matches(const cJSON *e, const char *site, const char *peer) {
    const char *s = jstr(e, "site");
    return streq(s, site) || streq(s, peer);
}

/* First event of kind at or after t (index after `from`) for site or peer
 * (any site when both are NULL); -1 when none. */
static int next_event(const run_data *r, int from, double t, const char *kind, const char *site,
                      const char *peer) {
    for (int i = from + 1; i < r->nev; i++) {
        const cJSON *e = r->ev[i];
        if (jt(e) < t || !jkind(e, kind))
            continue;
        if ((!site && !peer) || site_matches(e, site, peer))
            return i;
    }
    return -1;
}

/* First join of site at or after t, else the first quorum naming it. */
static int next_rejoin(const run_data *r, int from, double t, const char *site) {
    int j = next_event(r, from, t, "join", site, NULL);
    if (j >= 0)
        return j;
    for (int i = from + 1; i < r->nev; i++)
        if (jt(r->ev[i]) >= t && jkind(r->ev[i], "quorum") && jmembers_has(r->ev[i], site))
            return i;
    return -1;
}

static void add_note(fault_row *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_note(fault_row *f, const char *fmt, ...) {
    size_t n = strlen(f->notes);
    if (n && n + 2 < sizeof f->notes) {
        strcat(f->notes, "; ");
        n += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->notes + n, sizeof f->notes - n, fmt, ap);
    va_end(ap);
}

/* Detection and recovery of the fault at ev[i] (docs/REPORTS.md). */
static void analyse_fault(const run_data *r, int i, fault_row *f) {
    const cJSON *e = r->ev[i];
    const char *kind = jstr(e, "fault"), *site = jstr(e, "site"), *peer = jstr(e, "peer");
    memset(f, 0, sizeof *f);
    f->ev = e;
    f->t = jt(e);
    f->detected = f->recovered = NAN;
    const char *detail = jstr(e, "detail");
    if (detail && detail[0])
        add_note(f, "%s", detail);
    if (streq(kind, "restart") || streq(kind, "heal")) {
        /* recovery actions: the island (either side) back in */
        int j = -1;
        if (site)
            j = next_rejoin(r, i, f->t, site);
        if (streq(kind, "heal") && peer) {
            int k = next_event(r, i, f->t, "join", peer, NULL);
            if (k >= 0 && (j < 0 || !jkind(r->ev[j], "join") || k < j))
                j = k;
            if (j >= 0 && !jkind(r->ev[j], "join"))
                j = -1; /* after a heal only a join says someone came back */
        }
        if (j >= 0) {
            f->recovered = jt(r->ev[j]);
            add_note(f, "%s %s", jstr(r->ev[j], "site") ? jstr(r->ev[j], "site") : "membership",
                     jkind(r->ev[j], "join") ? "joined" : "back in the quorum");
        }
        return;
    }
    if (streq(kind, "kill_coordinator") || streq(kind, "restart_coordinator")) {
        int q = next_event(r, i, f->t, "quorum", NULL, NULL);
        int c = next_event(r, i, f->t, "commit", NULL, NULL);
        int j = q < 0 ? c : c < 0 ? q : (q < c ? q : c);
        if (j >= 0) {
            f->recovered = jt(r->ev[j]);
            add_note(f, "first %s after it", jstr(r->ev[j], "kind"));
        }
        return;
    }
    int d = site ? next_event(r, i, f->t, "suspect", site, peer) : -1;
    if (d >= 0) {
        f->detected = jt(r->ev[d]);
        const char *why = jstr(r->ev[d], "reason");
        add_note(f, "%s suspected%s%s%s", jstr(r->ev[d], "site"), why ? " (" : "", why ? why : "",
                 why ? ")" : "");
    } else if (is_frame_fault(kind)) {
        int k = next_event(r, i, f->t, "refused", peer ? site : NULL, peer);
        if (k >= 0) {
            f->detected = jt(r->ev[k]);
            const char *why = jstr(r->ev[k], "reason");
            add_note(f, "frame refused by %s%s%s%s",
                     jstr(r->ev[k], "site") ? jstr(r->ev[k], "site") : "an island", why ? " (" : "",
                     why ? why : "", why ? ")" : "");
            /* nothing was applied: recovered once the next outer step commits */
            int c = next_event(r, k, f->detected, "commit", NULL, NULL);
            if (c >= 0) {
                f->recovered = jt(r->ev[c]);
                add_note(f, "next commit");
            }
        }
    }
    if (isnan(f->detected) && !streq(kind, "partition"))
        add_note(f, "not detected");
    if (streq(kind, "partition")) {
        int h = -1;
        for (int k = i + 1; k < r->nev && h < 0; k++) {
            const cJSON *x = r->ev[k];
            const char *xs = jstr(x, "site"), *xp = jstr(x, "peer");
            if (jkind(x, "fault") && streq(jstr(x, "fault"), "heal") &&
                (site_matches(x, site, peer) || (!xs && !xp)) &&
                (!xp || streq(xp, site) || streq(xp, peer)))
                h = k;
        }
        if (h >= 0) {
            f->recovered = jt(r->ev[h]);
            add_note(f, "healed");
            if (d >= 0) {
                const char *out = jstr(r->ev[d], "site");
                int j = next_rejoin(r, h, f->recovered, out);
                if (j >= 0)
                    add_note(f, "%s rejoined at %.2f s", out, jt(r->ev[j]) - r->t0);
            }
        } else {
            add_note(f, "never healed");
        }
        return;
    }
    if (d >= 0) {
        const char *out = jstr(r->ev[d], "site");
        int j = next_rejoin(r, d, f->detected, out);
        if (j >= 0)
            f->recovered = jt(r->ev[j]);
        else
            add_note(f, "%s never came back", out);
    }
}

/* The verdict's reasons, one per line. */
typedef struct {
    sbuf why;
    int nfail;
} verdict;

__attribute__((format(printf, 2, 3))) static void fail(verdict *v, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (v->nfail++)
        sb_puts(&v->why, "; ");
    sb_puts(&v->why, msg);
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
    for (int i = 0; i < r->nev; i++)
        if (jkind(r->ev[i], "commit"))
            last = r->ev[i];
    const site_data *mem[REPORT_MAX_SITES];
    int nm = 0;
    for (int i = 0; i < r->nsites; i++)
        if (!last || !cJSON_GetObjectItemCaseSensitive(last, "members") ||
            jmembers_has(last, r->sites[i].name))
            mem[nm++] = &r->sites[i];
    if (last && isfinite(jnum(last, "outer_step"))) {
        int64_t s = (int64_t)jnum(last, "outer_step");
        const char *want = jstr(last, "hash");
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
    return bsearch(&s, r->commits, (size_t)r->ncommits, sizeof(int64_t), cmp_i64) != NULL;
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
            sb_printf(&list, "%s%lld", missing ? ", " : "", (long long)s);
        missing++;
    }
    if (missing)
        fail(v, "lost update: %d outer step%s never committed in the fault run (%s%s)", missing,
             missing > 1 ? "s" : "", sb_str(&list), missing > REPORT_LIST_MAX ? ", ..." : "");
    sb_fini(&list);
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

static bool has_val(const run_data *r) {
    for (int i = 0; i < r->mean.n; i++)
        if (!isnan(r->mean.val[i]))
            return true;
    return false;
}

/* ---------------------------------------------------------------- SVG */

static const char *const C_BASE = "#1f77b4", *const C_FAULT = "#d62728", *const C_IN = "#2ca02c",
                         *const C_SUSPECT = "#ff7f0e", *const C_JOIN = "#1f77b4",
                         *const C_GRID = "#e5e5e5", *const C_DIV = "#9467bd";

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
    sb_printf(b,
              "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
              "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\" role=\"img\" "
              "aria-label=\"",
              w, h, w, h);
    sb_html(b, title);
    sb_puts(b, "\">\n<title>");
    sb_html(b, title);
    sb_printf(b, "</title>\n<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", w, h);
    sb_printf(b,
              "<text x=\"%d\" y=\"16\" text-anchor=\"middle\" font-size=\"13\" "
              "font-weight=\"bold\">",
              w / 2);
    sb_html(b, title);
    sb_puts(b, "</text>\n");
}

static void svg_text(sbuf *b, double x, double y, const char *anchor, const char *extra,
                     const char *text) {
    sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s%s>", x, y, anchor,
              extra ? " " : "", extra ? extra : "");
    sb_html(b, text);
    sb_puts(b, "</text>\n");
}

/* Grid, ticks and labels of both axes; y_ticks false leaves the y axis bare. */
static void svg_axes(sbuf *b, const frame *f, const char *xlabel, const char *ylabel,
                     bool y_ticks) {
    char lab[64];
    double xs = nice_step(f->x1 - f->x0, 8);
    for (double x = ceil(f->x0 / xs - 1e-9) * xs; x <= f->x1 + xs * 1e-9; x += xs) {
        double X = px(f, x);
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", X,
                  f->top, X, f->top + f->h, C_GRID);
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                  X, f->top + f->h, X, f->top + f->h + 4);
        tick_label(lab, sizeof lab, x, xs);
        svg_text(b, X, f->top + f->h + 16, "middle", NULL, lab);
    }
    if (y_ticks) {
        double ys = nice_step(f->y1 - f->y0, 6);
        for (double y = ceil(f->y0 / ys - 1e-9) * ys; y <= f->y1 + ys * 1e-9; y += ys) {
            double Y = py(f, y);
            sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n",
                      f->left, Y, f->left + f->w, Y, C_GRID);
            sb_printf(b,
                      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                      f->left - 4, Y, f->left, Y);
            tick_label(lab, sizeof lab, y, ys);
            svg_text(b, f->left - 6, Y + 4, "end", NULL, lab);
        }
    }
    sb_printf(b,
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
            sb_puts(b, "\"/>\n");
            open = false;
        }
        if (!open) {
            sb_printf(b,
                      "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" "
                      "stroke-opacity=\"%.2f\" points=\"",
                      color, width, opacity);
            open = true;
        } else {
            sb_puts(b, " ");
        }
        sb_printf(b, "%.1f,%.1f", px(f, (double)x), py(f, y));
        last = x;
    }
    if (open)
        sb_puts(b, "\"/>\n");
}

static void svg_marker(sbuf *b, const char *shape, double x, double y, const char *color,
                       const char *tip) {
    sb_puts(b, "<g>");
    if (tip) {
        sb_puts(b, "<title>");
        sb_html(b, tip);
        sb_puts(b, "</title>");
    }
    if (!strcmp(shape, "circle"))
        sb_printf(b,
                  "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\" stroke=\"black\" "
                  "stroke-width=\"0.5\"/>",
                  x, y, color);
    else if (!strcmp(shape, "square"))
        sb_printf(b,
                  "<rect x=\"%.1f\" y=\"%.1f\" width=\"7\" height=\"7\" fill=\"%s\" "
                  "stroke=\"black\" stroke-width=\"0.5\"/>",
                  x - 3.5, y - 3.5, color);
    else if (!strcmp(shape, "diamond"))
        sb_printf(b,
                  "<path d=\"M%.1f %.1fl5 5l-5 5l-5 -5z\" fill=\"%s\" stroke=\"black\" "
                  "stroke-width=\"0.5\"/>",
                  x, y - 5, color);
    else if (!strcmp(shape, "cross"))
        sb_printf(b,
                  "<path d=\"M%.1f %.1fl10 10m0 -10l-10 10\" stroke=\"%s\" "
                  "stroke-width=\"2.5\"/>",
                  x - 5, y - 5, color);
    else if (!strcmp(shape, "tick"))
        sb_printf(b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                  "stroke-width=\"1.5\"/>",
                  x, y - 6, x, y + 6, color);
    sb_puts(b, "</g>\n");
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
        sb_printf(b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                  "stroke-width=\"2\"/>\n",
                  x, y, x + 18, y, color);
    else if (!strcmp(shape, "thin"))
        sb_printf(b,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                  "stroke-width=\"0.8\" stroke-opacity=\"0.45\"/>\n",
                  x, y, x + 18, y, color);
    else if (!strcmp(shape, "bar"))
        sb_printf(b,
                  "<rect x=\"%.1f\" y=\"%.1f\" width=\"18\" height=\"8\" fill=\"%s\" "
                  "fill-opacity=\"0.6\"/>\n",
                  x, y - 4, color);
    else
        svg_marker(b, shape, x + 9, y, color, NULL);
    svg_text(b, x + 22, y + 4, "start", NULL, text);
    l->x += width;
}

/* Chart 1: loss against step, both runs. */
static void chart_loss(sbuf *b, const run_data *f, const run_data *base) {
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
        sb_puts(b, "</svg>\n");
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
    if (has_val(base))
        legend_item(&l, "circle", C_BASE, "baseline validation loss");
    if (has_val(f))
        legend_item(&l, "square", C_FAULT, "fault run validation loss");
    sb_puts(b, "</svg>\n");
}

static int site_row(const run_data *r, const char *site) {
    for (int i = 0; i < r->nsites; i++)
        if (streq(r->sites[i].name, site))
            return i;
    return -1;
}

/* Chart 2: who was in the quorum when, with faults, suspicions and joins. */
static void chart_membership(sbuf *b, const run_data *r) {
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
        sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n",
                  fr.left, fr.top + (i + 1) * row_h, fr.left + fr.w, fr.top + (i + 1) * row_h,
                  C_GRID);
    }
    /* in-quorum bars: everyone of the start event in at first; a quorum
     * event sets the membership, a suspect takes one out, a join puts one in */
    double since[REPORT_MAX_SITES];
    bool in[REPORT_MAX_SITES];
    for (int i = 0; i < r->nsites; i++)
        in[i] = true, since[i] = r->t0;
    for (int e = 0; e <= r->nev; e++) {
        const cJSON *ev = e < r->nev ? r->ev[e] : NULL;
        double t = ev ? jt(ev) : r->t1;
        bool quorum = ev && jkind(ev, "quorum");
        for (int i = 0; i < r->nsites; i++) {
            bool now = in[i];
            if (!ev || jkind(ev, "end"))
                now = false;
            else if (quorum)
                now = jmembers_has(ev, r->sites[i].name);
            else if (jkind(ev, "suspect") && streq(jstr(ev, "site"), r->sites[i].name))
                now = false;
            else if (jkind(ev, "join") && streq(jstr(ev, "site"), r->sites[i].name))
                now = true;
            if (in[i] && !now && t > since[i]) {
                double y = fr.top + i * row_h + 6;
                sb_printf(b,
                          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"%s\" "
                          "fill-opacity=\"0.6\"><title>",
                          px(&fr, since[i] - r->t0), y,
                          px(&fr, t - r->t0) - px(&fr, since[i] - r->t0), row_h - 12, C_IN);
                sb_html(b, r->sites[i].name);
                sb_printf(b, " in the quorum %.2f-%.2f s</title></rect>\n", since[i] - r->t0,
                          t - r->t0);
            }
            if (!in[i] && now)
                since[i] = t;
            in[i] = now;
        }
        if (!ev || jkind(ev, "end"))
            break;
    }
    for (int e = 0; e < r->nev; e++) {
        const cJSON *ev = r->ev[e];
        double t = jt(ev) - r->t0, X = px(&fr, t);
        const char *site = jstr(ev, "site");
        int row = site ? site_row(r, site) : -1;
        char tip[256];
        if (jkind(ev, "fault")) {
            const char *k = jstr(ev, "fault");
            snprintf(tip, sizeof tip, "%s %s%s%s at %.2f s", k ? k : "fault", site ? site : "",
                     jstr(ev, "peer") ? " / " : "", jstr(ev, "peer") ? jstr(ev, "peer") : "", t);
            bool mend = streq(k, "restart") || streq(k, "heal") || streq(k, "restart_coordinator");
            const char *shape = mend ? "tick" : "cross";
            int prow = site_row(r, jstr(ev, "peer") ? jstr(ev, "peer") : "");
            if (row < 0 && prow < 0)
                row = r->nsites;
            if (row >= 0)
                svg_marker(b, shape, X, fr.top + (row + 0.5) * row_h, C_FAULT, tip);
            if (prow >= 0)
                svg_marker(b, shape, X, fr.top + (prow + 0.5) * row_h, C_FAULT, tip);
        } else if (jkind(ev, "suspect") && row >= 0) {
            snprintf(tip, sizeof tip, "%s suspected at %.2f s (%s)", site, t,
                     jstr(ev, "reason") ? jstr(ev, "reason") : "no reason given");
            svg_marker(b, "circle", X, fr.top + (row + 0.5) * row_h, C_SUSPECT, tip);
        } else if (jkind(ev, "join") && row >= 0) {
            snprintf(tip, sizeof tip, "%s joined at %.2f s", site, t);
            svg_marker(b, "diamond", X, fr.top + (row + 0.5) * row_h, C_JOIN, tip);
        } else if (jkind(ev, "commit")) {
            snprintf(tip, sizeof tip, "outer step %.0f committed at %.2f s", jnum(ev, "outer_step"),
                     t);
            svg_marker(b, "tick", X, fr.top + (r->nsites + 0.5) * row_h, "#333333", tip);
        } else if (jkind(ev, "divergence")) {
            sb_printf(b,
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
    legend_item(&l, "diamond", C_JOIN, "joined");
    legend_item(&l, "tick", "#333333", "commit");
    sb_puts(b, "</svg>\n");
}

/* --------------------------------------------------------- the document */

/* Markdown and HTML written side by side from the same calls. */
typedef struct {
    sbuf md, html;
} doc;

static void doc_h(doc *d, int level, const char *text) {
    for (int i = 0; i < level; i++)
        sb_puts(&d->md, "#");
    sb_puts(&d->md, " ");
    sb_md(&d->md, text);
    sb_puts(&d->md, "\n\n");
    sb_printf(&d->html, "<h%d>", level);
    sb_html(&d->html, text);
    sb_printf(&d->html, "</h%d>\n", level);
}

static void doc_p(doc *d, const char *text) {
    sb_md(&d->md, text);
    sb_puts(&d->md, "\n\n");
    sb_puts(&d->html, "<p>");
    sb_html(&d->html, text);
    sb_puts(&d->html, "</p>\n");
}

static void doc_ul(doc *d, bool begin) {
    sb_puts(&d->html, begin ? "<ul>\n" : "</ul>\n");
    if (!begin)
        sb_puts(&d->md, "\n");
}

__attribute__((format(printf, 3, 4))) static void doc_li(doc *d, const char *key, const char *fmt,
                                                         ...) {
    char val[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(val, sizeof val, fmt, ap);
    va_end(ap);
    sb_puts(&d->md, "- ");
    if (key) {
        sb_puts(&d->md, "**");
        sb_md(&d->md, key);
        sb_puts(&d->md, "**: ");
    }
    sb_md(&d->md, val);
    sb_puts(&d->md, "\n");
    sb_puts(&d->html, "<li>");
    if (key) {
        sb_puts(&d->html, "<b>");
        sb_html(&d->html, key);
        sb_puts(&d->html, "</b>: ");
    }
    sb_html(&d->html, val);
    sb_puts(&d->html, "</li>\n");
}

static void doc_row(doc *d, int n, const char *const *cells, bool header) {
    sb_puts(&d->md, "|");
    sb_puts(&d->html, "<tr>");
    for (int i = 0; i < n; i++) {
        sb_puts(&d->md, " ");
        sb_md(&d->md, cells[i]);
        sb_puts(&d->md, " |");
        sb_puts(&d->html, header ? "<th>" : "<td>");
        sb_html(&d->html, cells[i]);
        sb_puts(&d->html, header ? "</th>" : "</td>");
    }
    sb_puts(&d->md, "\n");
    sb_puts(&d->html, "</tr>\n");
    if (header) {
        sb_puts(&d->md, "|");
        for (int i = 0; i < n; i++)
            sb_puts(&d->md, "---|");
        sb_puts(&d->md, "\n");
    }
}

static void doc_table(doc *d, bool begin) {
    sb_puts(&d->html, begin ? "<table>\n" : "</table>\n");
    if (!begin)
        sb_puts(&d->md, "\n");
}

static void doc_svg(doc *d, const sbuf *svg) {
    sb_puts(&d->md, sb_str(svg));
    sb_puts(&d->md, "\n");
    sb_puts(&d->html, "<figure>\n");
    sb_puts(&d->html, sb_str(svg));
    sb_puts(&d->html, "</figure>\n");
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
    if (!r->end) {
        snprintf(buf, cap, "did not finish (no end event)");
        return;
    }
    const char *st = jstr(r->end, "status"), *why = jstr(r->end, "reason");
    snprintf(buf, cap, "%s%s%s%s", st ? st : "unknown", why && why[0] ? " (" : "",
             why && why[0] ? why : "", why && why[0] ? ")" : "");
}

static void header(doc *d, const run_data *f, const run_data *b) {
    static const char *const head[] = {"", "fault run", "baseline"};
    char cell[2][7][LOCO_PATH_MAX];
    const run_data *runs[2] = {f, b};
    for (int k = 0; k < 2; k++) {
        const run_data *r = runs[k];
        const char *cfg = r->start ? jstr(r->start, "config") : NULL;
        double seed = r->start ? jnum(r->start, "seed") : NAN;
        sbuf sites = {0};
        for (int i = 0; i < r->nsites; i++)
            sb_printf(&sites, "%s%s", i ? ", " : "", r->sites[i].name);
        snprintf(cell[k][0], LOCO_PATH_MAX, "%s", r->dir);
        snprintf(cell[k][1], LOCO_PATH_MAX, "%s", cfg ? cfg : "unknown");
        if (isfinite(seed))
            snprintf(cell[k][2], LOCO_PATH_MAX, "%.0f", seed);
        else
            snprintf(cell[k][2], LOCO_PATH_MAX, "unknown");
        snprintf(cell[k][3], LOCO_PATH_MAX, "%s", sb_str(&sites));
        fmt_time(cell[k][4], LOCO_PATH_MAX, r->t0);
        fmt_time(cell[k][5], LOCO_PATH_MAX, r->t1);
        size_t n = strlen(cell[k][5]);
        snprintf(cell[k][5] + n, LOCO_PATH_MAX - n, " (%.2f s)", r->t1 - r->t0);
        run_status(r, cell[k][6], LOCO_PATH_MAX);
        sb_fini(&sites);
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

static void fault_table(doc *d, const run_data *r) {
    static const char *const head[] = {"no.",           "fault",        "site(s)",
                                       "injected (s)",  "detected (s)", "detection (s)",
                                       "recovered (s)", "recovery (s)", "notes"};
    doc_h(d, 2, "Faults");
    int n = 0;
    for (int i = 0; i < r->nev; i++)
        n += jkind(r->ev[i], "fault");
    if (!n) {
        doc_p(d, "No fault was injected.");
        return;
    }
    doc_p(d, "Times in seconds since the start of the fault run; detection and recovery are "
             "measured from the injection (docs/REPORTS.md says which events count).");
    doc_table(d, true);
    doc_row(d, 9, head, true);
    int k = 0;
    for (int i = 0; i < r->nev; i++) {
        if (!jkind(r->ev[i], "fault"))
            continue;
        fault_row f;
        analyse_fault(r, i, &f);
        char num[16], sites[2 * REPORT_SITE_MAX + 8], inj[32], det[32], dt[32], rec[32], rt[32];
        const char *site = jstr(f.ev, "site"), *peer = jstr(f.ev, "peer");
        const char *kind = jstr(f.ev, "fault");
        snprintf(num, sizeof num, "%d", ++k);
        snprintf(sites, sizeof sites, "%.*s%s%.*s", REPORT_SITE_MAX, site ? site : "—",
                 peer ? ", " : "", REPORT_SITE_MAX, peer ? peer : "");
        fmt_secs(inj, sizeof inj, f.t - r->t0);
        fmt_secs(det, sizeof det, f.detected - r->t0);
        fmt_secs(dt, sizeof dt, f.detected - f.t);
        fmt_secs(rec, sizeof rec, f.recovered - r->t0);
        fmt_secs(rt, sizeof rt, f.recovered - f.t);
        const char *cells[9] = {num, kind ? kind : "?", sites, inj, det, dt, rec, rt, f.notes};
        doc_row(d, 9, cells, false);
    }
    doc_table(d, false);
}

static int count_kind(const run_data *r, const char *kind) {
    int n = 0;
    for (int i = 0; i < r->nev; i++)
        n += jkind(r->ev[i], kind);
    return n;
}

/* Everything the verdict rests on, in the report and in v. */
static void results(doc *d, const run_data *f, const run_data *b, const cli_report_opts *o,
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
    bool use_val = has_val(f) && has_val(b);
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
    doc_li(d, "Events of the fault run", "suspect %d, join %d, refused %d, divergence %d",
           count_kind(f, "suspect"), count_kind(f, "join"), count_kind(f, "refused"),
           count_kind(f, "divergence"));
    doc_ul(d, false);

    char st[600];
    run_status(f, st, sizeof st);
    if (!f->end)
        fail(v, "the fault run did not finish (no end event)");
    else if (!streq(jstr(f->end, "status"), "finished"))
        fail(v, "the fault run ended with status %s", st);
    for (int i = 0; i < f->nev; i++)
        if (jkind(f->ev[i], "divergence")) {
            const char *det = jstr(f->ev[i], "detail");
            fail(v, "divergence at outer step %.0f%s%s", jnum(f->ev[i], "outer_step"),
                 det ? ": " : "", det ? det : "");
        }
    check_hashes(f, v);
    check_lost_updates(f, b, v);
}

static int write_file(const char *dir, const char *name, const sbuf *text) {
    char path[LOCO_PATH_MAX + 32], tmp[LOCO_PATH_MAX + 40];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (text->oom)
        return LOCO_ERR(LOCO_ENOMEM, "%s: out of memory building the report", path);
    LOCO_CHECK(loco_file_write_sync(tmp, sb_str(text), text->n));
    if (rename(tmp, path) != 0)
        return LOCO_ERR(LOCO_EIO, "%s: cannot rename: %s", path, strerror(errno));
    return 0;
}

static const char HTML_STYLE[] =
    "body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;font-size:90%}th,td{border:1px solid #ccc;padding:3px 6px;"
    "text-align:left}th{background:#f2f2f2}figure{margin:1em 0}.pass{color:#1a7f37}"
    ".fail{color:#cf222e}";

void cli_report_opts_default(cli_report_opts *o) {
    o->loss_tol = 0.01;
    o->strict_loss = false;
}

int cli_write_report_opts(const char *fault_dir, const char *baseline_dir, const char *out_dir,
                          const cli_report_opts *opts, int *verdict_ok) {
    cli_report_opts o;
    cli_report_opts_default(&o);
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
    LOCO_CHECK_GOTO(load_run(&f, fault_dir, "fault run", &w), out);
    LOCO_CHECK_GOTO(load_run(&b, baseline_dir, "baseline", &w), out);
    LOCO_CHECK_GOTO(loco_mkdirs(out_dir), out);

    sb_puts(&d.html, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                     "<title>loco report: ");
    sb_html(&d.html, f.start && jstr(f.start, "config") ? jstr(f.start, "config") : fault_dir);
    sb_printf(&d.html, "</title>\n<style>%s</style>\n</head>\n<body>\n", HTML_STYLE);
    header(&d, &f, &b);
    /* the verdict needs the analysis, but is read first: analyse into a
     * scratch document, then lay out verdict, charts and tables in order */
    doc body = {0};
    results(&body, &f, &b, &o, &v);
    if (b.end == NULL || !streq(jstr(b.end, "status"), "finished"))
        report_warn(&w, "%s: the baseline did not finish; comparisons are against a partial run",
                    baseline_dir);
    bool ok = v.nfail == 0;
    sb_printf(&d.md, "**Verdict: %s**", ok ? "PASS" : "FAIL");
    sb_printf(&d.html, "<p class=\"%s\"><b>Verdict: %s</b>", ok ? "pass" : "fail",
              ok ? "PASS" : "FAIL");
    if (!ok) {
        sb_puts(&d.md, ": ");
        sb_md(&d.md, sb_str(&v.why));
        sb_puts(&d.html, ": ");
        sb_html(&d.html, sb_str(&v.why));
    }
    sb_puts(&d.md, "\n\n");
    sb_puts(&d.html, "</p>\n");

    doc_h(&d, 2, "Loss");
    chart_loss(&svg, &f, &b);
    doc_svg(&d, &svg);
    svg.n = 0;
    doc_h(&d, 2, "Membership");
    chart_membership(&svg, &f);
    doc_svg(&d, &svg);
    fault_table(&d, &f);
    sb_puts(&d.md, sb_str(&body.md));
    sb_puts(&d.html, sb_str(&body.html));
    sb_fini(&body.md);
    sb_fini(&body.html);
    if (w.n) {
        doc_h(&d, 2, "Warnings");
        doc_ul(&d, true);
        const char *s = sb_str(&w.text);
        while (*s) {
            const char *nl = strchr(s, '\n');
            doc_li(&d, NULL, "%.*s", (int)(nl - s), s);
            s = nl + 1;
        }
        doc_ul(&d, false);
    }
    sb_puts(&d.html, "</body>\n</html>\n");
    LOCO_CHECK_GOTO(write_file(out_dir, "report.md", &d.md), out);
    LOCO_CHECK_GOTO(write_file(out_dir, "report.html", &d.html), out);
    printf("report: %s/report.md, %s/report.html\n", out_dir, out_dir);
    printf("verdict: %s%s%s\n", ok ? "PASS" : "FAIL", ok ? "" : ": ", sb_str(&v.why));
    if (verdict_ok)
        *verdict_ok = ok;
out:
    sb_fini(&svg);
    sb_fini(&d.md);
    sb_fini(&d.html);
    sb_fini(&v.why);
    sb_fini(&w.text);
    run_fini(&f);
    run_fini(&b);
    return rc;
}

int cli_write_report(const char *fault_dir, const char *baseline_dir, const char *out_dir,
                     int *verdict_ok) {
    return cli_write_report_opts(fault_dir, baseline_dir, out_dir, NULL, verdict_ok);
}

static int report_usage(const char *msg, const char *arg) {
    fprintf(stderr, "loco report: %s%s%s\n(run `loco help` for usage)\n", msg, arg ? ": " : "",
            arg ? arg : "");
    return CLI_USAGE;
}

int cli_report(int argc, char **argv) {
    const char *dirs[2] = {NULL, NULL}, *out = NULL;
    int ndirs = 0;
    cli_report_opts o;
    cli_report_opts_default(&o);
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--loss-tol") && i + 1 < argc) {
            char *end;
            o.loss_tol = strtod(argv[++i], &end);
            if (end == argv[i] || *end || !(o.loss_tol >= 0) || !isfinite(o.loss_tol))
                return report_usage("--loss-tol expects a non-negative number", argv[i]);
        } else if (!strcmp(argv[i], "--strict-loss")) {
            o.strict_loss = true;
        } else if (argv[i][0] != '-' && ndirs < 2) {
            dirs[ndirs++] = argv[i];
        } else {
            return report_usage("unexpected argument", argv[i]);
        }
    }
    if (ndirs != 2)
        return report_usage("expected FAULT_RUN_DIR BASELINE_RUN_DIR", NULL);
    int ok = 0;
    int rc = cli_write_report_opts(dirs[0], dirs[1], out, &o, &ok);
    if (rc < 0)
        return cli_fail(rc);
    return ok ? CLI_OK : CLI_FAIL;
}
