/* [site.NAME] sections and --set site.NAME.section.key=value: the keys
 * one island of a multi-site run sets for itself, kept as text, checked
 * when given and applied by that island (docs/DECISIONS.md "Per-site
 * keys"). */
#include "core/config_internal.h"

#include <ctype.h>
#include <string.h>

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
    return loco__config_find_key(sec, dot + 1);
}

/* Keeps `site`'s `skey = value` (checked now, applied by that island);
 * the same key given again replaces the value. */
int loco__config_add_site_set(loco_config *cfg, const char *where, const char *site,
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
    const bool ok = strlen(value) < sizeof cfg->site_set[0].value &&
                    loco__config_parse_value(scratch, k, value);
    loco_free(scratch);
    if (!ok) {
        char exp[320];
        loco__config_expected(k, exp, sizeof exp);
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
        LOCO_CHECK(loco__config_set_key(cfg, cfg->site_set[i].where, sec, k->key,
                                        cfg->site_set[i].value));
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

/* The keys that lay out a rank's share of the model: with outer.layout =
 * ranks the exchange pairs rank r of every island with rank r of the
 * others, so these are one per run (docs/DECISIONS.md, "Per-site keys";
 * outer.layout = whole lets them differ). zero_stage and sp are not among them: every ZeRO
 * stage owns the same range, sequence parallelism splits activations; the
 * pipeline schedule is (its default chunks per rank). */
static const char *const layout_keys[] = {"dp", "tp", "pp", "cp", "ep", "pp_schedule",
                                          "virtual_stages", "pp_layers"};

int loco__config_check_site_sets(const loco_config *cfg) {
    for (int i = 0; i < cfg->n_site_sets; i++)
        if (cfg->outer.sites[0] && !sites_have(cfg->outer.sites, cfg->site_set[i].site))
            return LOCO_ERR(LOCO_EINVAL, "%s: [site.%s]: no such site in outer.sites (%s)",
                            cfg->site_set[i].where, cfg->site_set[i].site, cfg->outer.sites);
    /* the whole layout lets every island have a mesh of its own */
    if (!strcmp(cfg->outer.layout, "whole"))
        return 0;
    loco_config *scratch = NULL;
    int rc = 0;
    for (int i = 0; i < cfg->n_site_sets && rc == 0; i++) {
        const char *key = cfg->site_set[i].key;
        for (size_t j = 0; j < sizeof layout_keys / sizeof layout_keys[0]; j++) {
            if (strncmp(key, "parallel.", 9) || strcmp(key + 9, layout_keys[j]))
                continue;
            if (!scratch && !(scratch = loco_alloc(sizeof *scratch)))
                return LOCO_ERR(LOCO_ENOMEM, "config scratch");
            const key_desc *k = loco__config_find_key("parallel", layout_keys[j]);
            char run[LOCO_PATH_MAX], site[LOCO_PATH_MAX];
            loco__config_format_value(cfg, k, run, sizeof run);
            *scratch = *cfg;
            /* checked when it was given */
            loco__config_parse_value(scratch, k, cfg->site_set[i].value);
            loco__config_format_value(scratch, k, site, sizeof site);
            if (strcmp(run, site)) {
                rc = LOCO_ERR(LOCO_EINVAL,
                              "%s: [site.%s]: %s = %s differs from the run's %s: the islands of "
                              "one run share one mesh with outer.layout = ranks (the exchange "
                              "pairs rank r of each island with rank r of the others); "
                              "outer.layout = whole lets them differ",
                              cfg->site_set[i].where, cfg->site_set[i].site, key, site, run);
                break;
            }
        }
    }
    loco_free(scratch);
    return rc;
}

/* [site.NAME] sections, each site's keys in the order given. */
void loco__config_dump_sites(const loco_config *cfg, FILE *f) {
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
