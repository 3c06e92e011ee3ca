/* Inside core/: the key table's descriptors (config.c) shared with the
 * per-site keys (config_sites.c). */
#ifndef LOCO_CORE_CONFIG_INTERNAL_H
#define LOCO_CORE_CONFIG_INTERNAL_H

#include "core/core.h"

#include <stdio.h>

typedef enum { K_INT, K_NUM, K_BOOL, K_STR, K_ENUM } key_type;

typedef struct {
    const char *section, *key, *def, *choices, *desc;
    key_type type;
    double lo, hi;
    size_t offset;
    long long ilo, ihi; /* K_INT bounds, exact (a double rounds INT64_MAX up) */
} key_desc;

/* config.c */
const key_desc *loco__config_find_key(const char *section, const char *key);
/* Parses v into k's field of cfg; false when it does not fit. */
bool loco__config_parse_value(loco_config *cfg, const key_desc *k, const char *v);
void loco__config_format_value(const loco_config *cfg, const key_desc *k, char *buf, size_t cap);
/* What k takes, as an error message says it. */
void loco__config_expected(const key_desc *k, char *buf, size_t cap);
/* Applies one key; `where` is "file:line" or "--set ...". */
int loco__config_set_key(loco_config *cfg, const char *where, const char *section,
                         const char *key, const char *value);

/* config_sites.c */
/* Keeps `site`'s `skey = value` (checked now, applied by that island). */
int loco__config_add_site_set(loco_config *cfg, const char *where, const char *site,
                              const char *skey, const char *value);
/* The site keys against outer.sites and the layout one run shares. */
int loco__config_check_site_sets(const loco_config *cfg);
void loco__config_dump_sites(const loco_config *cfg, FILE *f);

#endif
