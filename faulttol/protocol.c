/* Shared pieces of the coordinator protocol: addresses, site ids, quorums. */
#include "faulttol/faulttol.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

int loco_parse_hostport(const char *s, char *host, size_t host_cap, int *port) {
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || (size_t)(colon - s) >= host_cap)
        return LOCO_ERR(LOCO_EINVAL, "'%s': expected host:port", s);
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 0 || p > 65535 || end == colon + 1)
        return LOCO_ERR(LOCO_EINVAL, "'%s': port must be 0..65535", s);
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    *port = (int)p;
    return 0;
}

int loco_site_id(const loco_config *cfg, const char *site, int *id, int *n_sites) {
    int n = 0, found = -1;
    const char *p = cfg->outer.sites;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (site && len == strlen(site) && !strncmp(p, site, len))
            found = n;
        n++;
        if (!comma)
            break;
        p = comma + 1;
    }
    if (n_sites)
        *n_sites = n;
    if (n == 0)
        return LOCO_ERR(LOCO_EINVAL, "outer.sites is empty: list the run's sites (siteA,siteB,...)");
    if (n > LOCO_MAX_ISLANDS)
        return LOCO_ERR(LOCO_EINVAL, "outer.sites lists %d sites, at most %d", n, LOCO_MAX_ISLANDS);
    if (site && found < 0)
        return LOCO_ERR(LOCO_EINVAL, "site '%s' is not in outer.sites (%s)", site, cfg->outer.sites);
    if (id)
        *id = found;
    return 0;
}

void loco_quorum_fini(loco_quorum *q) {
    for (int i = 0; i < LOCO_MAX_ISLANDS; i++)
        loco_free(q->m[i].addrs);
    memset(q, 0, sizeof *q);
}

char *loco_quorum_to_json(const loco_quorum *q) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "epoch", (double)q->epoch);
    cJSON *arr = cJSON_AddArrayToObject(j, "members");
    for (int i = 0; i < q->n; i++) {
        const loco_member *m = &q->m[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "id", m->id);
        cJSON_AddStringToObject(e, "site", m->site);
        cJSON *a = cJSON_AddArrayToObject(e, "ranks");
        for (int r = 0; r < m->n_ranks; r++)
            cJSON_AddItemToArray(a, cJSON_CreateString(m->addrs[r]));
        cJSON_AddItemToArray(arr, e);
    }
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

int loco_quorum_from_json(loco_quorum *q, const char *json, size_t len) {
    memset(q, 0, sizeof *q);
    cJSON *j = cJSON_ParseWithLength(json, len);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "members");
    const cJSON *ep = cJSON_GetObjectItemCaseSensitive(j, "epoch");
    int rc = 0;
    if (!cJSON_IsArray(arr) || !cJSON_IsNumber(ep) || cJSON_GetArraySize(arr) > LOCO_MAX_ISLANDS) {
        rc = LOCO_ERR(LOCO_EPROTO, "QUORUM: malformed JSON");
        goto out;
    }
    q->epoch = (uint64_t)ep->valuedouble;
    q->n = cJSON_GetArraySize(arr);
    for (int i = 0; i < q->n; i++) {
        const cJSON *e = cJSON_GetArrayItem(arr, i);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *site = cJSON_GetObjectItemCaseSensitive(e, "site");
        const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(e, "ranks");
        int nr = cJSON_GetArraySize(ranks);
        if (!cJSON_IsNumber(id) || id->valueint != i || !cJSON_IsString(site) ||
            strlen(site->valuestring) >= LOCO_NET_NAME_MAX || !cJSON_IsArray(ranks) || nr < 1 ||
            nr > LOCO_MAX_ISLAND_RANKS) {
            rc = LOCO_ERR(LOCO_EPROTO, "QUORUM: member %d is malformed", i);
            goto out;
        }
        loco_member *m = &q->m[i];
        m->id = i;
        snprintf(m->site, sizeof m->site, "%s", site->valuestring);
        m->n_ranks = nr;
        m->addrs = loco_alloc((size_t)nr * sizeof *m->addrs);
        if (!m->addrs) {
            rc = LOCO_ERR(LOCO_ENOMEM, "quorum addresses");
            goto out;
        }
        for (int r = 0; r < nr; r++) {
            const cJSON *a = cJSON_GetArrayItem(ranks, r);
            if (!cJSON_IsString(a) || strlen(a->valuestring) >= LOCO_ADDR_MAX) {
                rc = LOCO_ERR(LOCO_EPROTO, "QUORUM: bad address of member %d rank %d", i, r);
                goto out;
            }
            snprintf(m->addrs[r], LOCO_ADDR_MAX, "%s", a->valuestring);
        }
    }
out:
    cJSON_Delete(j);
    if (rc < 0)
        loco_quorum_fini(q);
    return rc;
}
