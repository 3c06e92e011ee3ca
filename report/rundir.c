/* The one reader of run directories, for both reports: `loco train`'s
 * (metrics.jsonl) and `loco launch`'s (events.jsonl, <site>/metrics.jsonl,
 * <site>/outer.jsonl; docs/REPORTS.md is the contract). It checks and
 * keeps what the files say; each report draws its own conclusions. */
#include "report/report_internal.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* ------------------------------------------------------------ JSONL */

/* line(ctx, path, lineno, obj) for each JSON object line of path;
 * malformed lines are warned about with file:line and skipped. The
 * callback owns obj when it returns 1, else it is freed; a negative return
 * stops the read with that code. A missing file is LOCO_EIO naming it. */
typedef int (*line_fn)(void *ctx, const char *path, int lineno, cJSON *obj);

static int read_jsonl(const char *path, line_fn fn, void *ctx, warnings *w) {
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

typedef struct {
    report_rundir *r;
    report_site *s;
    warnings *w;
} read_ctx;

/* A number field: NAN when absent or null (a non-finite value is written
 * as null); a field of another type is warned about and counts as absent. */
static double num_field(read_ctx *c, const cJSON *obj, const char *key, const char *path,
                        int lineno) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return NAN;
    if (!cJSON_IsNumber(v)) {
        report_warn(c->w, "%s:%d: \"%s\" is not a number; taken as missing", path, lineno, key);
        return NAN;
    }
    return v->valuedouble;
}

static int metrics_line(void *ctx, const char *path, int lineno, cJSON *obj) {
    read_ctx *c = ctx;
    report_site *s = c->s;
    double step = num_field(c, obj, "step", path, lineno);
    if (!isfinite(step) || step < 0) {
        report_warn(c->w, "%s:%d: metrics line without a \"step\" skipped", path, lineno);
        return 0;
    }
    report_mline m = {
        .step = step,
        .loss = num_field(c, obj, "loss", path, lineno),
        .val_loss = num_field(c, obj, "val_loss", path, lineno),
        .lr = num_field(c, obj, "lr", path, lineno),
        .grad_norm = num_field(c, obj, "grad_norm", path, lineno),
        .tokens_per_s = num_field(c, obj, "tokens_per_s", path, lineno),
        .step_s = num_field(c, obj, "step_s", path, lineno),
        .has_loss = cJSON_GetObjectItemCaseSensitive(obj, "loss") != NULL,
        .has_val = cJSON_GetObjectItemCaseSensitive(obj, "val_loss") != NULL,
        .seq = s->nm,
    };
    LOCO_CHECK(report_grow((void **)&s->m, &s->capm, s->nm + 1, sizeof m));
    s->m[s->nm++] = m;
    return 0;
}

static int outer_line(void *ctx, const char *path, int lineno, cJSON *obj) {
    read_ctx *c = ctx;
    report_site *s = c->s;
    double os = num_field(c, obj, "outer_step", path, lineno);
    if (!isfinite(os)) {
        report_warn(c->w, "%s:%d: outer line without an \"outer_step\" skipped", path, lineno);
        return 0;
    }
    report_oline o = {
        .outer_step = os,
        .step = num_field(c, obj, "step", path, lineno),
        .bytes_sent = num_field(c, obj, "bytes_sent", path, lineno),
        .bytes_received = num_field(c, obj, "bytes_received", path, lineno),
        .wait_s = num_field(c, obj, "wait_s", path, lineno),
        .wall_s = num_field(c, obj, "wall_s", path, lineno),
        .lineno = lineno,
    };
    const char *h = report_jstr(obj, "theta_hash");
    snprintf(o.hash, sizeof o.hash, "%s", h ? h : "");
    LOCO_CHECK(report_grow((void **)&s->o, &s->capo, s->no + 1, sizeof o));
    s->o[s->no++] = o;
    return 0;
}

/* ------------------------------------------------------------- the run */

static void skipped_event(void *arg, const char *path, int line, const char *why) {
    report_warn(arg, "%s:%d: malformed line skipped (%s)", path, line, why);
}

/* The timeline, through faulttol's one reader of it: LOCO_EIO when
 * required and missing, else a warning. */
static int read_events(report_rundir *r, const char *path, bool required, warnings *w) {
    struct stat st;
    if (!required && stat(path, &st) != 0) {
        report_warn(w, "%s: missing; no wall time, config or commits from the timeline", path);
        return 0;
    }
    LOCO_CHECK(loco_events_load(path, &r->ev, &r->nev, skipped_event, w));
    if (required && r->nev == 0)
        return LOCO_ERR(LOCO_EPROTO, "%s: no events", path);
    for (int i = 0; i < r->nev; i++) {
        if (!r->start && report_jkind(r->ev[i], "start"))
            r->start = r->ev[i];
        if (report_jkind(r->ev[i], "end"))
            r->end = r->ev[i];
    }
    return 0;
}

/* A site name becomes a path component: no separators, no dot files. */
static int add_site(report_rundir *r, const char *name, const char *where) {
    if (!name[0] || name[0] == '.' || strchr(name, '/') || strlen(name) >= REPORT_SITE_MAX)
        return LOCO_ERR(LOCO_EPROTO, "%s: bad site name '%s'", where, name);
    for (int i = 0; i < r->nsites; i++)
        if (!strcmp(r->sites[i].name, name))
            return 0;
    if (r->nsites >= REPORT_MAX_SITES)
        return LOCO_ERR(LOCO_EINVAL, "%s: more than %d sites", where, REPORT_MAX_SITES);
    report_site *s = &r->sites[r->nsites++];
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->dir, sizeof s->dir, "%s/%s", r->dir, name);
    return 0;
}

static int cmp_site(const void *a, const void *b) {
    return strcmp(((const report_site *)a)->name, ((const report_site *)b)->name);
}

/* The islands: those of the start event, or else the subdirectories that
 * hold a metrics.jsonl. */
static int find_sites(report_rundir *r, const char *events_path, warnings *w) {
    const cJSON *list = r->start ? cJSON_GetObjectItemCaseSensitive(r->start, "sites") : NULL;
    const cJSON *x;
    cJSON_ArrayForEach(x, list) {
        if (cJSON_IsString(x))
            LOCO_CHECK(add_site(r, x->valuestring, events_path));
    }
    if (r->nsites > 0)
        return 0;
    if (r->nev)
        report_warn(w,
                    "%s: no start event with \"sites\"; using the subdirectories of %s that hold "
                    "a metrics.jsonl",
                    events_path, r->dir);
    DIR *d = opendir(r->dir);
    if (!d)
        return LOCO_ERR(LOCO_EIO, "%s: cannot list: %s", r->dir, strerror(errno));
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d)) && rc == 0) {
        char path[LOCO_PATH_MAX + 2 * REPORT_SITE_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/%.*s/metrics.jsonl", r->dir, REPORT_SITE_MAX - 1,
                 de->d_name);
        if (de->d_name[0] != '.' && strlen(de->d_name) < REPORT_SITE_MAX && stat(path, &st) == 0)
            rc = add_site(r, de->d_name, r->dir);
    }
    closedir(d);
    if (rc < 0)
        return rc;
    if (r->nsites == 0)
        return LOCO_ERR(LOCO_EIO,
                        "%s: no islands: no start event naming them and no <site>/metrics.jsonl",
                        r->dir);
    qsort(r->sites, (size_t)r->nsites, sizeof(report_site), cmp_site);
    return 0;
}

/* An island's metrics.jsonl (required) and, in a multi-site run, its
 * outer.jsonl (a warning when missing). */
static int read_site(report_rundir *r, report_site *s, bool multi, warnings *w) {
    char path[LOCO_PATH_MAX + 2 * REPORT_SITE_MAX];
    read_ctx c = {r, s, w};
    snprintf(path, sizeof path, "%s/metrics.jsonl", s->dir);
    LOCO_CHECK(read_jsonl(path, metrics_line, &c, w));
    if (!multi)
        return 0;
    struct stat st;
    snprintf(path, sizeof path, "%s/outer.jsonl", s->dir);
    if (stat(path, &st) != 0) {
        report_warn(w, "%s: missing; island %s counted as sending nothing", path, s->name);
        return 0;
    }
    s->has_outer = true;
    return read_jsonl(path, outer_line, &c, w);
}

int report_rundir_load(report_rundir *r, const char *dir, report_run_kind kind, warnings *w) {
    struct stat st;
    memset(r, 0, sizeof *r);
    r->dir = dir;
    if (stat(dir, &st) != 0)
        return LOCO_ERR(LOCO_EIO, "run directory %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return LOCO_ERR(LOCO_EIO, "run directory %s: not a directory", dir);
    r->sites = loco_alloc(REPORT_MAX_SITES * sizeof(report_site));
    if (!r->sites)
        return LOCO_ERR(LOCO_ENOMEM, "report: sites");
    memset(r->sites, 0, REPORT_MAX_SITES * sizeof(report_site));
    if (kind == REPORT_RUN_SINGLE) {
        r->nsites = 1;
        snprintf(r->sites[0].dir, sizeof r->sites[0].dir, "%s", dir);
        return read_site(r, &r->sites[0], false, w);
    }
    char events[LOCO_PATH_MAX + 32];
    snprintf(events, sizeof events, "%s/events.jsonl", dir);
    LOCO_CHECK(read_events(r, events, kind == REPORT_RUN_TIMELINE, w));
    LOCO_CHECK(find_sites(r, events, w));
    for (int i = 0; i < r->nsites; i++)
        LOCO_CHECK(read_site(r, &r->sites[i], true, w));
    return 0;
}

void report_rundir_fini(report_rundir *r) {
    loco_events_free(r->ev, r->nev);
    for (int i = 0; r->sites && i < r->nsites; i++) {
        loco_free(r->sites[i].m);
        loco_free(r->sites[i].o);
    }
    loco_free(r->sites);
    memset(r, 0, sizeof *r);
}

int loco_report_kind(const char *run_dir, loco_rundir_kind *kind, char *baseline, size_t cap) {
    struct stat st;
    char p[LOCO_PATH_MAX + 64];
    if (stat(run_dir, &st) != 0)
        return LOCO_ERR(LOCO_EIO, "run directory %s: %s", run_dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return LOCO_ERR(LOCO_EIO, "run directory %s: not a directory", run_dir);
    snprintf(p, sizeof p, "%s/baseline/events.jsonl", run_dir);
    bool has_base = stat(p, &st) == 0;
    snprintf(p, sizeof p, "%s/events.jsonl", run_dir);
    bool has_events = stat(p, &st) == 0;
    if (has_base && has_events) {
        *kind = LOCO_RUNDIR_FAULT;
        if (baseline)
            snprintf(baseline, cap, "%s/baseline", run_dir);
        return 0;
    }
    snprintf(p, sizeof p, "%s/metrics.jsonl", run_dir);
    if (stat(p, &st) == 0) {
        *kind = LOCO_RUNDIR_SINGLE;
        return 0;
    }
    bool sites = has_events;
    DIR *d = opendir(run_dir);
    struct dirent *de;
    while (d && !sites && (de = readdir(d))) {
        snprintf(p, sizeof p, "%s/%.*s/metrics.jsonl", run_dir, REPORT_SITE_MAX, de->d_name);
        sites = de->d_name[0] != '.' && stat(p, &st) == 0;
    }
    if (d)
        closedir(d);
    if (!sites)
        return LOCO_ERR(LOCO_EIO,
                        "%s: not a run directory: no metrics.jsonl (loco train), no events.jsonl "
                        "or <site>/metrics.jsonl (loco launch)",
                        run_dir);
    *kind = LOCO_RUNDIR_MULTI;
    return 0;
}
