/* The reports' pieces shared by report/rundir.c (the one reader of run
 * directories), report_runs.c (growing buffers, the fault report's runs),
 * report.c (its analysis and document), report_svg.c (the charts) and
 * report_train.c (the training report). Not for use outside report/; the
 * public entry points are in report/report.h. */
#ifndef LOCO_REPORT_INTERNAL_H
#define LOCO_REPORT_INTERNAL_H

#include "core/core.h"
#include "faulttol/faulttol.h"
#include "report/report.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#define REPORT_SITE_MAX 64     /* bytes of a site name, with the NUL */
#define REPORT_MAX_SITES 256   /* islands of one run */
#define REPORT_LIST_MAX 12     /* outer steps named in a lost-update reason */
#define REPORT_FINAL_WINDOW 10 /* training steps averaged for the final loss */
#define REPORT_MAX_POINTS 1500 /* points per polyline before decimation */
#define REPORT_MAX_MARKS 200   /* per-outer-step markers (with tooltips) per run */

typedef struct {
    char *s;
    size_t n, cap;
    bool oom;
} sbuf;

typedef struct {
    int64_t step;
    double loss, val; /* NAN where the line had none */
    int seq;          /* line order, so the last value of a step wins */
} mpoint;

typedef struct {
    int64_t outer_step;
    double bytes_sent;
    double wait_s, wall_s; /* NAN where absent or not usable (docs/REPORTS.md) */
    double util;           /* 1 - wait_s / wall_s; NAN with them */
    char hash[40];
} opoint;

/* Compute utilisation of an island or a run: 1 - waiting / wall time over
 * the outer.jsonl records that carry both; NAN when none does. */
typedef struct {
    double wait_s, wall_s; /* sums over the records counted */
    double overall;        /* 1 - wait_s / wall_s */
    double min;            /* lowest of one record */
    int n;                 /* records counted */
} utilisation;

/* ---------------------------------------------- the run-directory reader
 * report/rundir.c: what `loco train` and `loco launch` leave in a run
 * directory (docs/REPORTS.md), read once for both reports. */

/* One metrics.jsonl line with a step. Fields are NAN where absent, null or
 * (warned about) not a number. */
typedef struct {
    double step; /* first: the training report's dedupe reads it there */
    double loss, val_loss, lr, grad_norm, tokens_per_s, step_s;
    bool has_loss, has_val; /* the line names "loss" / "val_loss" (maybe null) */
    int seq;                /* line order, so the last value of a step wins */
} report_mline;

/* One outer.jsonl line with an outer_step. */
typedef struct {
    double outer_step, step, bytes_sent, bytes_received, wait_s, wall_s;
    int lineno;    /* for warnings about the line */
    char hash[40]; /* theta_hash; "" when absent */
} report_oline;

typedef struct {
    char name[REPORT_SITE_MAX]; /* "" for a single-site run */
    char dir[LOCO_PATH_MAX + REPORT_SITE_MAX];
    report_mline *m; /* file order */
    int nm, capm;
    report_oline *o; /* file order */
    int no, capo;
    bool has_outer; /* outer.jsonl exists (its absence is warned about) */
} report_site;

typedef enum {
    REPORT_RUN_SINGLE,   /* `loco train`: DIR/metrics.jsonl, one unnamed site */
    REPORT_RUN_MULTI,    /* `loco launch`: events.jsonl (missing: a warning), sites */
    REPORT_RUN_TIMELINE, /* the same, events.jsonl required and not empty */
} report_run_kind;

typedef struct {
    const char *dir;
    cJSON **ev; /* the timeline, sorted by t (file order among equal times) */
    int nev;
    const cJSON *start, *end; /* the first start, the last end; owned by ev[] */
    report_site *sites;       /* a multi-site run's: sorted by name unless the
                                 start event listed them */
    int nsites;
} report_rundir;

/* An island of the fault report, from its report_site. */
typedef struct {
    char name[REPORT_SITE_MAX];
    mpoint *m; /* after load: one point per step, ascending */
    int nm, capm;
    opoint *o; /* in file order */
    int no, capo;
    bool has_outer;
    utilisation util;
} site_data;

/* A series over steps: the mean over the islands present at each step. */
typedef struct {
    int64_t *step;
    double *loss, *val;
    int n, cap;
} series;

/* A run of the fault report: what the reader found and its analysis. */
typedef struct {
    report_rundir rd;  /* dir, timeline, start and end events */
    const char *label; /* "fault run" / "baseline" */
    site_data *sites;  /* (nsites) as rd.sites */
    int nsites;
    double t0, t1; /* first and last time of the run */
    series mean;
    double bytes_sent, transfer_bytes;
    int64_t *commits; /* committed outer steps, ascending, unique */
    int ncommits, capcommits;
    bool commits_from_events;
    double util_mean;   /* mean over the islands with a utilisation; NAN: none */
    int util_sites;     /* islands with a utilisation */
    int64_t *util_step; /* (nutil) outer steps with a utilisation, ascending */
    double *util;       /* (nutil) mean over their records of 1 - wait_s / wall_s */
    int nutil;
} run_data;

/* Warnings shown in the report and logged as they are found. */
typedef struct {
    sbuf text; /* one per line */
    int n;
} warnings;

/* rundir.c: a run directory read (kind says which); warnings for what was
 * skipped or missing. LOCO_EIO naming a missing metrics.jsonl (or
 * events.jsonl for REPORT_RUN_TIMELINE), LOCO_EPROTO for a timeline without
 * events. Free with report_rundir_fini, also after a failed load. */
int report_rundir_load(report_rundir *r, const char *dir, report_run_kind kind, warnings *w);
void report_rundir_fini(report_rundir *r);
/* ... JSON fields of a timeline event or record (NAN / NULL when absent)
 * and NULL-safe string equality. */
const char *report_jstr(const cJSON *o, const char *key);
double report_jnum(const cJSON *o, const char *key);
bool report_jkind(const cJSON *e, const char *kind);
double report_jt(const cJSON *e);
bool report_jmembers_has(const cJSON *e, const char *site);
bool report_streq(const char *a, const char *b);

/* report_runs.c: text buffers (appended to, escaped for HTML or a
 * Markdown table cell, read back as one string, freed) ... */
void report_sb_puts(sbuf *b, const char *s);
__attribute__((format(printf, 2, 3))) void report_sb_printf(sbuf *b, const char *fmt, ...);
void report_sb_html(sbuf *b, const char *s);
void report_sb_md(sbuf *b, const char *s);
const char *report_sb_str(const sbuf *b);
void report_sb_fini(sbuf *b);
/* Writes DIR/NAME through a synced temporary and a rename. */
int report_write_file(const char *dir, const char *name, const sbuf *text);
/* ... an array grown (elements of size elem) to hold need; LOCO_ENOMEM ...
 * ... a warning shown in the report and logged ... */
int report_grow(void **p, int *cap, int need, size_t elem);
__attribute__((format(printf, 2, 3))) void report_warn(warnings *w, const char *fmt, ...);
/* ... a fault report's run read and analysed (warnings for what was
 * skipped), whether it has validation losses, freed ... */
int report_load_run(run_data *r, const char *dir, const char *label, warnings *w);
bool report_has_val(const run_data *r);
void report_run_fini(run_data *r);
/* ... and the qsort / bsearch order of int64_t. */
int report_cmp_i64(const void *a, const void *b);

/* report_svg.c: the loss chart (fault run beside the baseline), the
 * membership chart and the utilisation chart, appended to b as inline SVG. */
void report_chart_loss(sbuf *b, const run_data *f, const run_data *base);
void report_chart_membership(sbuf *b, const run_data *r);
/* The utilisation chart (per outer step, both runs); call only when one of
 * them has a utilisation (nutil > 0). */
void report_chart_utilisation(sbuf *b, const run_data *f, const run_data *base);

/* The training-run report's charts (report_train.c): lines against a
 * shared x axis, one legend entry per series. A series reads n points
 * x[i * stride], y[i * stride] (strides in bytes, so x and y may be fields
 * of an array of structs); a non-finite y (or, on a log axis, y <= 0)
 * breaks its line. Colours index a palette of REPORT_PALETTE. */
#define REPORT_PALETTE 10
typedef enum {
    REPORT_SOLID,  /* a line */
    REPORT_DASHED, /* a dashed line with a marker per point */
} report_style;

typedef struct {
    const char *label; /* legend text, also the polyline's data-label */
    const double *x, *y;
    size_t stride;
    int n;
    int color;
    report_style style;
} report_series;

typedef struct {
    const char *title, *xlabel, *ylabel;
    bool log_y;        /* log10 y axis (decades, 2 and 5 between them) */
    const char *empty; /* the text drawn when no series has a point */
    const report_series *s;
    int ns;
} report_chart;

void report_chart_lines(sbuf *b, const report_chart *c);
/* A colour of the palette, i modulo REPORT_PALETTE. */
const char *report_color(int i);

#endif /* LOCO_REPORT_INTERNAL_H */
