/* Configuration: INI files through libinih, `section.key=value` overrides,
 * [site.NAME] keys, and the key table of config_keys.h as help text and
 * Markdown. One file: the parser, the per-site keys, the dump and the help
 * all read the one static table of key descriptors built here. */
#include "core/core.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef enum { K_INT, K_NUM, K_BOOL, K_STR, K_ENUM } key_type;

typedef struct {
    const char *section, *key, *def, *choices, *desc;
    key_type type;
    double lo, hi;
    size_t offset;
    long long ilo, ihi; /* K_INT bounds, exact (a double rounds INT64_MAX up) */
} key_desc;

#define LOCO_SECTION_BEGIN(sec)
#define LOCO_SECTION_END(sec)
#define LOCO_KEY_INT(sec, k, d, l, h, ds)                                      \
    {#sec, #k, #d, NULL, ds, K_INT, (double)(l), (double)(h), offsetof(loco_config, sec.k),  \
     (l), (h)},
#define LOCO_KEY_NUM(sec, k, d, l, h, ds)                                      \
    {#sec, #k, #d, NULL, ds, K_NUM, (l), (h), offsetof(loco_config, sec.k), 0, 0},
#define LOCO_KEY_BOOL(sec, k, d, ds)                                           \
    {#sec, #k, #d, NULL, ds, K_BOOL, 0, 1, offsetof(loco_config, sec.k), 0, 0},
#define LOCO_KEY_STR(sec, k, d, ds)                                            \
    {#sec, #k, d, NULL, ds, K_STR, 0, 0, offsetof(loco_config, sec.k), 0, 0},
#define LOCO_KEY_ENUM(sec, k, d, ch, ds)                                       \
    {#sec, #k, d, ch, ds, K_ENUM, 0, 0, offsetof(loco_config, sec.k), 0, 0},
static const key_desc keys[] = {
#include "core/config_keys.h"
};
#undef LOCO_SECTION_BEGIN
#undef LOCO_SECTION_END
#undef LOCO_KEY_INT
#undef LOCO_KEY_NUM
#undef LOCO_KEY_BOOL
#undef LOCO_KEY_STR
#undef LOCO_KEY_ENUM

#define N_KEYS (sizeof keys / sizeof keys[0])

static const char *type_name(const key_desc *k) {
    switch (k->type) {
    case K_INT: return "int";
    case K_NUM: return "number";
    case K_BOOL: return "bool";
    case K_STR: return "string";
    case K_ENUM: return k->choices;
    }
    return "?";
}

static bool section_known(const char *section) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].section, section))
            return true;
    return false;
}

static const key_desc *find_key(const char *section, const char *key) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].section, section) && !strcmp(keys[i].key, key))
            return &keys[i];
    return NULL;
}

/* The longest line libinih reads (its buffer less the terminating NUL). */
#define CONFIG_LINE_MAX (INI_MAX_LINE - 1)

/* The longest string key k can hold: its dumped line `key = value` must
 * load back, so it fits in one config line, and in the field. */
static int str_max(const key_desc *k) {
    int n = CONFIG_LINE_MAX - (int)strlen(k->key) - 3;
    return n < LOCO_PATH_MAX - 1 ? n : LOCO_PATH_MAX - 1;
}

/* Whether v survives loco_config_dump and a load: libinih strips blanks at
 * both ends, reads a ';' after a blank as an inline comment, and a newline
 * ends the line. A value read from a file passes already (libinih cut it
 * so); one given with --set may not. */
static bool str_storable(const key_desc *k, const char *v) {
    size_t n = strlen(v);
    if (n > (size_t)str_max(k))
        return false;
    if (n && (isspace((unsigned char)v[0]) || isspace((unsigned char)v[n - 1]) || v[0] == ';'))
        return false;
    for (size_t i = 0; i < n; i++) {
        if (iscntrl((unsigned char)v[i]) && v[i] != '\t')
            return false;
        if (v[i] == ';' && i > 0 && isspace((unsigned char)v[i - 1]))
            return false;
    }
    return true;
}

static void expected(const key_desc *k, char *buf, size_t cap) {
    switch (k->type) {
    case K_INT: snprintf(buf, cap, "an integer in [%lld, %lld]", k->ilo, k->ihi); break;
    case K_NUM: snprintf(buf, cap, "a number in [%g, %g]", k->lo, k->hi); break;
    case K_BOOL: snprintf(buf, cap, "true or false"); break;
    case K_STR:
        snprintf(buf, cap,
                 "a string of at most %d bytes without control characters, blanks at "
                 "either end, or a ';' first or after a blank (what a config line `%s = ...` "
                 "can hold)",
                 str_max(k), k->key);
        break;
    case K_ENUM: snprintf(buf, cap, "one of %s", k->choices); break;
    }
}

static bool enum_has(const char *choices, const char *v) {
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && n > 0 && !strncmp(p, v, n))
            return true;
        if (!bar)
            break;
        p = bar + 1;
    }
    return false;
}

/* Parses value into the field of key k; returns false when it does not fit. */
static bool parse_value(loco_config *cfg, const key_desc *k, const char *v) {
    char *field = (char *)cfg + k->offset;
    char *end;
    errno = 0;
    switch (k->type) {
    case K_INT: {
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end || x < k->ilo || x > k->ihi)
            return false;
        *(int64_t *)field = x;
        return true;
    }
    case K_NUM: {
        double x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x) || x < k->lo || x > k->hi)
            return false;
        *(double *)field = x;
        return true;
    }
    case K_BOOL:
        if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "yes") || !strcmp(v, "on"))
            *(bool *)field = true;
        else if (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "no") || !strcmp(v, "off"))
            *(bool *)field = false;
        else
            return false;
        return true;
    case K_STR:
        if (!str_storable(k, v))
            return false;
        snprintf(field, LOCO_PATH_MAX, "%s", v);
        return true;
    case K_ENUM:
        if (!enum_has(k->choices, v) || strlen(v) >= 32)
            return false;
        snprintf(field, 32, "%s", v);
        return true;
    }
    return false;
}

void loco_config_defaults(loco_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < N_KEYS; i++) {
        const char *d = keys[i].def;
        char buf[64];
        if (keys[i].type == K_INT) { /* "9223372036854775807LL" → digits only */
            snprintf(buf, sizeof buf, "%s", d);
            buf[strspn(buf, "-0123456789")] = '\0';
            d = buf;
        }
        bool ok = parse_value(cfg, &keys[i], d);
        (void)ok; /* defaults are checked by tests/core/test_config.c */
    }
}

static loco_config default_cfg;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static void default_init(void) { loco_config_defaults(&default_cfg); }

const loco_config *loco_config_default(void) {
    pthread_once(&default_once, default_init);
    return &default_cfg;
}

/* Keys a user sets once: parallel.microbatches given alone sets
 * train.grad_accum too (under pipeline parallelism both count the
 * micro-batches of one optimizer step). Once both were given they stay as
 * given; inner/train.c refuses them if they differ under parallel.pp > 1. */
static void follow(loco_config *cfg, const key_desc *k) {
    if (k->offset == offsetof(loco_config, train.grad_accum))
        cfg->given.grad_accum = true;
    else if (k->offset == offsetof(loco_config, parallel.microbatches) &&
             cfg->parallel.microbatches > 0 && !cfg->given.grad_accum)
        cfg->train.grad_accum = cfg->parallel.microbatches;
}

static int add_site_set(loco_config *cfg, const char *where, const char *site,
                        const char *skey, const char *value);
static int check_site_sets(const loco_config *cfg);

/* Applies one key; `where` is "file:line" or "--set". */
static int set_key(loco_config *cfg, const char *where, const char *section, const char *key,
                   const char *value) {
    if (!strncmp(section, "site.", 5))
        return add_site_set(cfg, where, section + 5, key, value);
    if (!section[0])
        return LOCO_ERR(LOCO_EINVAL, "%s: key '%s' outside any [section]", where, key);
    if (!section_known(section))
        return LOCO_ERR(LOCO_EINVAL,
                        "%s: key '%s.%s': unknown section [%s] (see `loco config --help`)",
                        where, section, key, section);
    const key_desc *k = find_key(section, key);
    if (!k)
        return LOCO_ERR(LOCO_EINVAL, "%s: unknown key '%s.%s' (see `loco config --help`)", where,
                        section, key);
    if (!parse_value(cfg, k, value)) {
        char exp[320];
        expected(k, exp, sizeof exp);
        return LOCO_ERR(LOCO_EINVAL, "%s: key '%s.%s': expected %s, got '%s'", where, section, key,
                        exp, value);
    }
    follow(cfg, k);
    return 0;
}

typedef struct {
    loco_config *cfg;
    FILE *f;
    const char *path;
    int line;
    int rc;
} load_ctx;

/* libinih calls the reader once per line, so counting here gives the line of
 * the key the handler sees next. Leading blanks are dropped: libinih would
 * take an indented line as the continuation of the previous value, so an
 * indented `val = b` after `train = a` would set train to "val = b". A line
 * longer than libinih's buffer is refused: libinih would read its tail as
 * the next line. */
static char *line_reader(char *str, int num, void *stream) {
    load_ctx *c = stream;
    char *r = fgets(str, num, c->f);
    if (!r)
        return NULL;
    c->line++;
    size_t len = strlen(r);
    if (len == (size_t)num - 1 && r[len - 1] != '\n') {
        int next = fgetc(c->f);
        if (next != '\n' && next != EOF) {
            if (c->rc == 0)
                c->rc = LOCO_ERR(LOCO_EINVAL, "%s:%d: line longer than %d bytes", c->path,
                                 c->line, num - 1);
            return NULL;
        }
    }
    size_t blank = strspn(r, " \t");
    memmove(r, r + blank, len - blank + 1);
    return r;
}

static int on_ini_key(void *user, const char *section, const char *name, const char *value) {
    load_ctx *c = user;
    if (c->rc < 0)
        return 1; /* keep the first error only */
    char where[LOCO_PATH_MAX + 32];
    snprintf(where, sizeof where, "%s:%d", c->path, c->line);
    c->rc = set_key(c->cfg, where, section, name, value);
    return c->rc == 0;
}

int loco_config_load(loco_config *cfg, const char *path) {
    load_ctx c = {.cfg = cfg, .path = path};
    c.f = fopen(path, "r");
    if (!c.f)
        return LOCO_ERR(LOCO_EIO, "%s: cannot open config: %s", path, strerror(errno));
    int r = ini_parse_stream(line_reader, &c, on_ini_key, &c);
    fclose(c.f);
    if (c.rc < 0)
        return c.rc;
    if (r > 0)
        return LOCO_ERR(LOCO_EINVAL, "%s:%d: syntax error (expected [section] or key = value)",
                        path, r);
    if (r < 0)
        return LOCO_ERR(LOCO_EIO, "%s: cannot parse config", path);
    return 0;
}

int loco_config_set(loco_config *cfg, const char *assignment) {
    const char *eq = strchr(assignment, '=');
    const char *dot = strchr(assignment, '.');
    if (!eq || !dot || dot > eq)
        return LOCO_ERR(LOCO_EINVAL, "--set %s: expected section.key=value", assignment);
    if (!strncmp(assignment, "site.", 5)) { /* site.NAME.section.key=value */
        const char *name = assignment + 5, *dot2 = strchr(name, '.');
        if (!dot2 || dot2 > eq || dot2 == name || (size_t)(dot2 - name) >= LOCO_SITE_NAME_MAX ||
            (size_t)(eq - dot2 - 1) >= sizeof cfg->site_set[0].key)
            return LOCO_ERR(LOCO_EINVAL, "--set %s: expected site.NAME.section.key=value",
                            assignment);
        char site[LOCO_SITE_NAME_MAX], skey[sizeof cfg->site_set[0].key];
        snprintf(site, sizeof site, "%.*s", (int)(dot2 - name), name);
        snprintf(skey, sizeof skey, "%.*s", (int)(eq - dot2 - 1), dot2 + 1);
        char where[160];
        snprintf(where, sizeof where, "--set %.120s", assignment);
        return add_site_set(cfg, where, site, skey, eq + 1);
    }
    char section[64], key[64];
    size_t sl = (size_t)(dot - assignment), kl = (size_t)(eq - dot - 1);
    if (sl == 0 || kl == 0 || sl >= sizeof section || kl >= sizeof key)
        return LOCO_ERR(LOCO_EINVAL, "--set %s: expected section.key=value", assignment);
    memcpy(section, assignment, sl);
    section[sl] = '\0';
    memcpy(key, dot + 1, kl);
    key[kl] = '\0';
    char where[160];
    snprintf(where, sizeof where, "--set %.120s", assignment);
    return set_key(cfg, where, section, key, eq + 1);
}

int loco_config_validate(const loco_config *cfg) {
    if (cfg->model.n_head < 1) /* a struct filled by hand has had no range check */
        return LOCO_ERR(LOCO_EINVAL, "model.n_head (%lld) must be at least 1",
                        (long long)cfg->model.n_head);
    if (cfg->model.n_embd % cfg->model.n_head != 0)
        return LOCO_ERR(LOCO_EINVAL,
                        "model.n_embd (%lld) must be divisible by model.n_head (%lld)",
                        (long long)cfg->model.n_embd, (long long)cfg->model.n_head);
    if (cfg->model.n_kv_head > 0 && cfg->model.n_head % cfg->model.n_kv_head != 0)
        return LOCO_ERR(LOCO_EINVAL,
                        "model.n_kv_head (%lld) must divide model.n_head (%lld): each key/value "
                        "head serves n_head / n_kv_head query heads",
                        (long long)cfg->model.n_kv_head, (long long)cfg->model.n_head);
    if (cfg->parallel.pp_layers[0] && cfg->parallel.pp < 2)
        return LOCO_ERR(LOCO_EINVAL, "parallel.pp_layers = \"%s\" needs parallel.pp > 1",
                        cfg->parallel.pp_layers);
    LOCO_CHECK(check_site_sets(cfg));
    if (cfg->train.warmup_steps > cfg->train.steps && cfg->train.steps > 0)
        loco_warn("train.warmup_steps (%lld) exceeds train.steps (%lld)",
                  (long long)cfg->train.warmup_steps, (long long)cfg->train.steps);
    return 0;
}

/* ------------------------------------------------------- per-site keys */

static void format_value(const loco_config *cfg, const key_desc *k, char *buf, size_t cap);

/* What an island may set for itself: how it trains (mesh, batch, threads,
 * device), never what the islands must share (model, outer, compress). */
static bool site_key_allowed(const key_desc *k) {
    if (!strcmp(k->section, "parallel"))
        return true;
    if (!strcmp(k->section, "train"))
        return !strcmp(k->key, "batch_size") || !strcmp(k->key, "grad_accum") ||
               !strcmp(k->key, "device");
    return !strcmp(k->section, "run") && !strcmp(k->key, "threads");
}

/* A site's name as outer.sites and a [site.NAME] header can both hold it. */
static bool site_name_ok(const char *site) {
    size_t n = strlen(site);
    if (n == 0 || n >= LOCO_SITE_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)site[i]) && site[i] != '_' && site[i] != '-')
            return false;
    return true;
}

static const key_desc *split_key(const char *skey, char *sec, size_t sec_cap) {
    const char *dot = strchr(skey, '.');
    if (!dot || (size_t)(dot - skey) >= sec_cap)
        return NULL;
    snprintf(sec, sec_cap, "%.*s", (int)(dot - skey), skey);
    return find_key(sec, dot + 1);
}

/* Keeps `site`'s `skey = value` (checked now, applied by that island);
 * the same key given again replaces the value. */
static int add_site_set(loco_config *cfg, const char *where, const char *site,
                        const char *skey, const char *value) {
    if (!site_name_ok(site))
        return LOCO_ERR(LOCO_EINVAL,
                        "%s: [site.%s]: expected a site name of 1 to %d letters, digits, '_' or "
                        "'-'",
                        where, site, LOCO_SITE_NAME_MAX - 1);
    char sec[32];
    const key_desc *k = split_key(skey, sec, sizeof sec);
    if (!k || strlen(skey) >= sizeof cfg->site_set[0].key)
        return LOCO_ERR(LOCO_EINVAL,
                        "%s: [site.%s]: unknown key '%s' (expected section.key, see `loco config "
                        "--help`)",
                        where, site, skey);
    if (!site_key_allowed(k))
        return LOCO_ERR(LOCO_EINVAL,
                        "%s: [site.%s]: key '%s' is the same for every island of a run; a site "
                        "may set parallel.*, train.batch_size, train.grad_accum, train.device and "
                        "run.threads",
                        where, site, skey);
    loco_config *scratch = loco_alloc(sizeof *scratch);
    if (!scratch)
        return LOCO_ERR(LOCO_ENOMEM, "config scratch");
    loco_config_defaults(scratch);
    const bool ok = strlen(value) < sizeof cfg->site_set[0].value && parse_value(scratch, k, value);
    loco_free(scratch);
    if (!ok) {
        char exp[320];
        expected(k, exp, sizeof exp);
        return LOCO_ERR(LOCO_EINVAL, "%s: [site.%s]: key '%s': expected %s (at most %zu bytes), "
                                     "got '%s'",
                        where, site, skey, exp, sizeof cfg->site_set[0].value - 1, value);
    }
    int i = 0;
    while (i < cfg->n_site_sets &&
           (strcmp(cfg->site_set[i].site, site) || strcmp(cfg->site_set[i].key, skey)))
        i++;
    if (i == cfg->n_site_sets) {
        if (i == LOCO_SITE_SETS_MAX)
            return LOCO_ERR(LOCO_EINVAL, "%s: [site.%s]: more than %d per-site keys in all", where,
                            site, LOCO_SITE_SETS_MAX);
        cfg->n_site_sets++;
    }
    snprintf(cfg->site_set[i].site, sizeof cfg->site_set[i].site, "%s", site);
    snprintf(cfg->site_set[i].key, sizeof cfg->site_set[i].key, "%s", skey);
    snprintf(cfg->site_set[i].value, sizeof cfg->site_set[i].value, "%s", value);
    snprintf(cfg->site_set[i].where, sizeof cfg->site_set[i].where, "%s", where);
    return 0;
}

int loco_config_for_site(loco_config *cfg, const char *site) {
    for (int i = 0; i < cfg->n_site_sets; i++) {
        if (strcmp(cfg->site_set[i].site, site))
            continue;
        char sec[32];
        const key_desc *k = split_key(cfg->site_set[i].key, sec, sizeof sec);
        if (!k)
            return LOCO_ERR(LOCO_EINVAL, "%s: unknown key '%s'", cfg->site_set[i].where,
                            cfg->site_set[i].key);
        LOCO_CHECK(set_key(cfg, cfg->site_set[i].where, sec, k->key, cfg->site_set[i].value));
    }
    return 0;
}

/* Whether `site` is one of the comma-separated names of `sites`. */
static bool sites_have(const char *sites, const char *site) {
    const size_t n = strlen(site);
    for (const char *p = sites; *p;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == n && !strncmp(p, site, n))
            return true;
        if (!comma)
            break;
        p = comma + 1;
    }
    return false;
}

/* The keys that lay out a rank's share of the model: the exchange pairs
 * rank r of every island with rank r of the others, so these are one per
 * run until the exchange has a layout of its own (docs/DECISIONS.md,
 * "Per-site keys"). zero_stage and sp are not among them: every ZeRO
 * stage owns the same range, sequence parallelism splits activations; the
 * pipeline schedule is (its default chunks per rank). */
static const char *const layout_keys[] = {"dp", "tp", "pp", "cp", "ep", "pp_schedule",
                                          "virtual_stages", "pp_layers"};

static int check_site_sets(const loco_config *cfg) {
    for (int i = 0; i < cfg->n_site_sets; i++)
        if (cfg->outer.sites[0] && !sites_have(cfg->outer.sites, cfg->site_set[i].site))
            return LOCO_ERR(LOCO_EINVAL, "%s: [site.%s]: no such site in outer.sites (%s)",
                            cfg->site_set[i].where, cfg->site_set[i].site, cfg->outer.sites);
    loco_config *scratch = NULL;
    int rc = 0;
    for (int i = 0; i < cfg->n_site_sets && rc == 0; i++) {
        const char *key = cfg->site_set[i].key;
        for (size_t j = 0; j < sizeof layout_keys / sizeof layout_keys[0]; j++) {
            if (strncmp(key, "parallel.", 9) || strcmp(key + 9, layout_keys[j]))
                continue;
            if (!scratch && !(scratch = loco_alloc(sizeof *scratch)))
                return LOCO_ERR(LOCO_ENOMEM, "config scratch");
            const key_desc *k = find_key("parallel", layout_keys[j]);
            char run[LOCO_PATH_MAX], site[LOCO_PATH_MAX];
            format_value(cfg, k, run, sizeof run);
            *scratch = *cfg;
            parse_value(scratch, k, cfg->site_set[i].value); /* checked when it was given */
            format_value(scratch, k, site, sizeof site);
            if (strcmp(run, site)) {
                rc = LOCO_ERR(LOCO_EINVAL,
                              "%s: [site.%s]: %s = %s differs from the run's %s: the islands of "
                              "one run share one mesh for now (the exchange pairs rank r of "
                              "each island with rank r of the others)",
                              cfg->site_set[i].where, cfg->site_set[i].site, key, site, run);
                break;
            }
        }
    }
    loco_free(scratch);
    return rc;
}

static void format_value(const loco_config *cfg, const key_desc *k, char *buf, size_t cap) {
    const char *field = (const char *)cfg + k->offset;
    switch (k->type) {
    case K_INT: snprintf(buf, cap, "%lld", (long long)*(const int64_t *)field); break;
    case K_NUM: snprintf(buf, cap, "%.17g", *(const double *)field); break;
    case K_BOOL: snprintf(buf, cap, "%s", *(const bool *)field ? "true" : "false"); break;
    case K_STR:
    case K_ENUM: snprintf(buf, cap, "%s", field); break;
    }
}

void loco_config_print_help(FILE *f) {
    loco_config def;
    loco_config_defaults(&def);
    const char *sec = "";
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_desc *k = &keys[i];
        if (strcmp(sec, k->section)) {
            sec = k->section;
            fprintf(f, "\n[%s]\n", sec);
        }
        char v[LOCO_PATH_MAX];
        format_value(&def, k, v, sizeof v);
        char name[80];
        snprintf(name, sizeof name, "%s.%s", k->section, k->key);
        fprintf(f, "  %-24s %-8s %-22s %s\n", name, k->type == K_ENUM ? "enum" : type_name(k), v,
                k->desc);
    }
}

/* Text inside a Markdown table cell: a bare '|' would start a new cell. */
static void md_cell(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '|')
            fputc('\\', f);
        fputc(*s, f);
    }
}

void loco_config_print_markdown(FILE *f) {
    loco_config def;
    loco_config_defaults(&def);
    fprintf(f, "# Configuration keys\n\n"
               "Generated by `loco config --markdown` from core/config_keys.h; "
               "a test keeps this file and the table equal.\n"
               "Set keys in an INI file under their `[section]`, or on the command line with "
               "`--set section.key=value`.\n");
    const char *sec = "";
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_desc *k = &keys[i];
        if (strcmp(sec, k->section)) {
            sec = k->section;
            fprintf(f, "\n## [%s]\n\n| key | type | default | range | description |\n"
                       "|---|---|---|---|---|\n", sec);
        }
        char v[LOCO_PATH_MAX], range[96] = "";
        format_value(&def, k, v, sizeof v);
        if (k->type == K_INT)
            snprintf(range, sizeof range, "%lld – %lld", k->ilo, k->ihi);
        else if (k->type == K_NUM)
            snprintf(range, sizeof range, "%g – %g", k->lo, k->hi);
        else if (k->type == K_ENUM)
            snprintf(range, sizeof range, "%s", k->choices);
        fprintf(f, "| `%s.%s` | %s | `", k->section, k->key,
                k->type == K_ENUM ? "enum" : type_name(k));
        md_cell(f, v);
        fputs("` | ", f);
        md_cell(f, range);
        fputs(" | ", f);
        md_cell(f, k->desc);
        fputs(" |\n", f);
    }
}

static void dump_sections(const loco_config *cfg, FILE *f, const char *const *sections) {
    const char *sec = "";
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_desc *k = &keys[i];
        if (sections) {
            bool want = false;
            for (int s = 0; sections[s]; s++)
                want |= !strcmp(sections[s], k->section);
            if (!want)
                continue;
        }
        if (strcmp(sec, k->section)) {
            sec = k->section;
            fprintf(f, "[%s]\n", sec);
        }
        char v[LOCO_PATH_MAX];
        format_value(cfg, k, v, sizeof v);
        fprintf(f, "%s = %s\n", k->key, v);
    }
}

void loco_config_dump(const loco_config *cfg, FILE *f) {
    dump_sections(cfg, f, NULL);
    /* [site.NAME] sections, each site's keys in the order given. */
    for (int i = 0; i < cfg->n_site_sets; i++) {
        bool first = true;
        for (int j = 0; j < i && first; j++)
            first = strcmp(cfg->site_set[j].site, cfg->site_set[i].site) != 0;
        if (!first)
            continue;
        fprintf(f, "[site.%s]\n", cfg->site_set[i].site);
        for (int j = i; j < cfg->n_site_sets; j++)
            if (!strcmp(cfg->site_set[j].site, cfg->site_set[i].site))
                fprintf(f, "%s = %s\n", cfg->site_set[j].key, cfg->site_set[j].value);
    }
}

uint64_t loco_config_hash(const loco_config *cfg, const char *const *sections) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return 0;
    dump_sections(cfg, f, sections);
    fclose(f);
    uint64_t h = loco_hash64(buf, len);
    free(buf);
    return h;
}
