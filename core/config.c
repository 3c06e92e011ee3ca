/* Configuration: INI files through libinih, `section.key=value` overrides,
 * and the key table of config_keys.h as help text and Markdown. The
 * [site.NAME] keys are config_sites.c's. */
#include "core/config_internal.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>


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

const key_desc *loco__config_find_key(const char *section, const char *key) {
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

void loco__config_expected(const key_desc *k, char *buf, size_t cap) {
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
bool loco__config_parse_value(loco_config *cfg, const key_desc *k, const char *v) {
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
        bool ok = loco__config_parse_value(cfg, &keys[i], d);
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

/* Applies one key; `where` is "file:line" or "--set". */
int loco__config_set_key(loco_config *cfg, const char *where, const char *section,
                         const char *key, const char *value) {
    if (!strncmp(section, "site.", 5))
        return loco__config_add_site_set(cfg, where, section + 5, key, value);
    if (!section[0])
        return LOCO_ERR(LOCO_EINVAL, "%s: key '%s' outside any [section]", where, key);
    if (!section_known(section))
        return LOCO_ERR(LOCO_EINVAL,
                        "%s: key '%s.%s': unknown section [%s] (see `loco config --help`)",
                        where, section, key, section);
    const key_desc *k = loco__config_find_key(section, key);
    if (!k)
        return LOCO_ERR(LOCO_EINVAL, "%s: unknown key '%s.%s' (see `loco config --help`)", where,
                        section, key);
    if (!loco__config_parse_value(cfg, k, value)) {
        char exp[320];
        loco__config_expected(k, exp, sizeof exp);
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
    c->rc = loco__config_set_key(c->cfg, where, section, name, value);
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
        return loco__config_add_site_set(cfg, where, site, skey, eq + 1);
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
    return loco__config_set_key(cfg, where, section, key, eq + 1);
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
    LOCO_CHECK(loco__config_check_site_sets(cfg));
    if (cfg->train.warmup_steps > cfg->train.steps && cfg->train.steps > 0)
        loco_warn("train.warmup_steps (%lld) exceeds train.steps (%lld)",
                  (long long)cfg->train.warmup_steps, (long long)cfg->train.steps);
    return 0;
}

void loco__config_format_value(const loco_config *cfg, const key_desc *k, char *buf, size_t cap) {
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
        loco__config_format_value(&def, k, v, sizeof v);
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
        loco__config_format_value(&def, k, v, sizeof v);
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
        loco__config_format_value(cfg, k, v, sizeof v);
        fprintf(f, "%s = %s\n", k->key, v);
    }
}

void loco_config_dump(const loco_config *cfg, FILE *f) {
    dump_sections(cfg, f, NULL);
    loco__config_dump_sites(cfg, f);
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
