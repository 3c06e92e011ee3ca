/* Live metrics in the Prometheus text exposition format (0.0.4): a
 * registry of gauges and counters, each sample with at most one label, set
 * by the owning thread under a mutex and rendered for whoever serves it
 * (cli/metrics_http.c, on another thread). */
#include "core/core.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *label_value; /* NULL: the family's sample without a label */
    double v;
} sample;

typedef struct {
    char name[LOCO_PROM_NAME_MAX];
    char label[LOCO_PROM_NAME_MAX]; /* label name, "" = none */
    char *help;
    loco_prom_type type;
    sample *s;
    int n, cap;
} family;

struct loco_prom {
    pthread_mutex_t mu;
    family fam[LOCO_PROM_MAX_FAMILIES];
    int n_fam;
};

/* ---------------------------------------------------------- the registry */

static char *dup_str(const char *s) {
    const size_t n = strlen(s) + 1;
    char *d = loco_alloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

static bool name_ok(const char *s, bool colon) {
    if (!s[0] || strlen(s) >= LOCO_PROM_NAME_MAX || (s[0] >= '0' && s[0] <= '9'))
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || (colon && *s == ':')))
            return false;
    return true;
}

int loco_prom_create(loco_prom **out) {
    *out = NULL;
    loco_prom *p = loco_alloc(sizeof *p);
    if (!p)
        return LOCO_ERR(LOCO_ENOMEM, "metrics registry");
    pthread_mutex_init(&p->mu, NULL);
    *out = p;
    return 0;
}

void loco_prom_destroy(loco_prom *p) {
    if (!p)
        return;
    for (int i = 0; i < p->n_fam; i++) {
        for (int k = 0; k < p->fam[i].n; k++)
            loco_free(p->fam[i].s[k].label_value);
        loco_free(p->fam[i].s);
        loco_free(p->fam[i].help);
    }
    pthread_mutex_destroy(&p->mu);
    loco_free(p);
}

static family *find(loco_prom *p, const char *name) {
    for (int i = 0; i < p->n_fam; i++)
        if (!strcmp(p->fam[i].name, name))
            return &p->fam[i];
    return NULL;
}

int loco_prom_declare(loco_prom *p, const char *name, loco_prom_type type, const char *label,
                      const char *help) {
    if (!p)
        return 0;
    if (!name_ok(name, true))
        return LOCO_ERR(LOCO_EINVAL,
                        "metrics: '%s' is not a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)", name);
    if (label && (!name_ok(label, false) || !strncmp(label, "__", 2)))
        return LOCO_ERR(LOCO_EINVAL, "metrics: '%s' is not a label name of %s", label, name);
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    if (find(p, name))
        rc = LOCO_ERR(LOCO_EINVAL, "metrics: %s is declared twice", name);
    else if (p->n_fam == LOCO_PROM_MAX_FAMILIES)
        rc = LOCO_ERR(LOCO_EINVAL, "metrics: more than %d metrics", LOCO_PROM_MAX_FAMILIES);
    else {
        family *f = &p->fam[p->n_fam];
        memset(f, 0, sizeof *f);
        f->help = dup_str(help ? help : "");
        if (!f->help)
            rc = LOCO_ERR(LOCO_ENOMEM, "metrics: help of %s", name);
        else {
            snprintf(f->name, sizeof f->name, "%s", name);
            snprintf(f->label, sizeof f->label, "%s", label ? label : "");
            f->type = type;
            p->n_fam++;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* The sample of f with this label value, made when missing (NULL when out
 * of memory, or when the value's presence does not match the family's). */
static sample *sample_of(family *f, const char *value) {
    if (!f->label[0] != !value)
        return NULL;
    for (int i = 0; i < f->n; i++)
        if (!value || !strcmp(f->s[i].label_value, value))
            return &f->s[i];
    if (f->n == f->cap) {
        const int cap = f->cap ? 2 * f->cap : 4;
        sample *s = loco_alloc((size_t)cap * sizeof *s);
        if (!s)
            return NULL;
        if (f->n)
            memcpy(s, f->s, (size_t)f->n * sizeof *s);
        loco_free(f->s);
        f->s = s;
        f->cap = cap;
    }
    sample *s = &f->s[f->n];
    s->label_value = NULL;
    if (value && !(s->label_value = dup_str(value)))
        return NULL;
    s->v = 0;
    f->n++;
    return s;
}

static void update(loco_prom *p, const char *name, const char *value, double v, bool add) {
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    family *f = find(p, name);
    sample *s = f ? sample_of(f, value) : NULL;
    if (s)
        s->v = add ? s->v + v : v;
    pthread_mutex_unlock(&p->mu);
    if (!s)
        loco_debug("metrics: %s%s%s not updated (undeclared, label mismatch or no memory)", name,
                   value ? " " : "", value ? value : "");
}

void loco_prom_set(loco_prom *p, const char *name, const char *label_value, double v) {
    update(p, name, label_value, v, false);
}

void loco_prom_add(loco_prom *p, const char *name, const char *label_value, double dv) {
    update(p, name, label_value, dv, true);
}

void loco_prom_set_only(loco_prom *p, const char *name, const char *label_value, double v) {
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    family *f = find(p, name);
    if (f) {
        for (int k = 0; k < f->n; k++)
            loco_free(f->s[k].label_value);
        f->n = 0;
    }
    sample *s = f ? sample_of(f, label_value) : NULL;
    if (s)
        s->v = v;
    pthread_mutex_unlock(&p->mu);
    if (!s)
        loco_debug("metrics: %s not updated (undeclared, label mismatch or no memory)", name);
}

/* ------------------------------------------------------------- rendering */

typedef struct {
    char *b;
    size_t len, cap;
    bool oom;
} buf;

static void put(buf *o, const char *s, size_t n) {
    if (o->oom)
        return;
    if (o->len + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (o->len + n + 1 > cap)
            cap *= 2;
        char *b = loco_alloc(cap);
        if (!b) {
            o->oom = true;
            return;
        }
        if (o->len)
            memcpy(b, o->b, o->len);
        loco_free(o->b);
        o->b = b;
        o->cap = cap;
    }
    memcpy(o->b + o->len, s, n);
    o->len += n;
    o->b[o->len] = '\0';
}

static void puts_(buf *o, const char *s) {
    put(o, s, strlen(s));
}

/* Escapes as the format says: in HELP text backslash and newline, in label
 * values also the double quote. */
static void put_escaped(buf *o, const char *s, bool quote) {
    for (; *s; s++) {
        if (*s == '\\')
            puts_(o, "\\\\");
        else if (*s == '\n')
            puts_(o, "\\n");
        else if (*s == '"' && quote)
            puts_(o, "\\\"");
        else
            put(o, s, 1);
    }
}

void loco_prom_format_value(double v, char out[LOCO_PROM_VALUE_MAX]) {
    if (isnan(v))
        snprintf(out, LOCO_PROM_VALUE_MAX, "NaN");
    else if (isinf(v))
        snprintf(out, LOCO_PROM_VALUE_MAX, "%s", v > 0 ? "+Inf" : "-Inf");
    else {
        /* The shortest of %.15g and %.17g that reads back as v. */
        snprintf(out, LOCO_PROM_VALUE_MAX, "%.15g", v);
        if (strtod(out, NULL) != v)
            snprintf(out, LOCO_PROM_VALUE_MAX, "%.17g", v);
    }
}

int loco_prom_render(loco_prom *p, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    buf o = {0};
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_fam; i++) {
        const family *f = &p->fam[i];
        if (!f->n)
            continue; /* nothing known yet: no sample rather than a made-up one */
        puts_(&o, "# HELP ");
        puts_(&o, f->name);
        puts_(&o, " ");
        put_escaped(&o, f->help, false);
        puts_(&o, "\n# TYPE ");
        puts_(&o, f->name);
        puts_(&o, f->type == LOCO_PROM_COUNTER ? " counter\n" : " gauge\n");
        for (int k = 0; k < f->n; k++) {
            puts_(&o, f->name);
            if (f->s[k].label_value) {
                puts_(&o, "{");
                puts_(&o, f->label);
                puts_(&o, "=\"");
                put_escaped(&o, f->s[k].label_value, true);
                puts_(&o, "\"}");
            }
            char v[LOCO_PROM_VALUE_MAX];
            loco_prom_format_value(f->s[k].v, v);
            puts_(&o, " ");
            puts_(&o, v);
            puts_(&o, "\n");
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (!o.b && !o.oom)
        puts_(&o, "");
    if (o.oom) {
        loco_free(o.b);
        return LOCO_ERR(LOCO_ENOMEM, "metrics: rendering");
    }
    *text = o.b;
    *len = o.len;
    return 0;
}
