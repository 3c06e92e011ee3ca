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
    char hh[17];
    loco_hash_hex(q->committed_hash, hh);
    cJSON_AddNumberToObject(j, "epoch", (double)q->epoch);
    cJSON_AddNumberToObject(j, "outer_step", (double)q->outer_step);
    cJSON_AddNumberToObject(j, "committed", (double)q->committed);
    cJSON_AddStringToObject(j, "hash", hh);
    cJSON_AddBoolToObject(j, "join", q->join);
    cJSON_AddNumberToObject(j, "n", q->n);
    if (q->end_step > 0)
        cJSON_AddNumberToObject(j, "end_step", (double)q->end_step);
    cJSON *arr = cJSON_AddArrayToObject(j, "islands");
    for (int i = 0; i < q->n; i++) {
        const loco_member *m = &q->m[i];
        if (m->n_ranks < 1)
            continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "id", i);
        cJSON_AddStringToObject(e, "site", m->site);
        const char *role = loco_quorum_has(q->members, i)     ? "member"
                           : loco_quorum_has(q->observers, i) ? "observer"
                                                              : "out";
        cJSON_AddStringToObject(e, "role", role);
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
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "islands");
    const cJSON *ep = cJSON_GetObjectItemCaseSensitive(j, "epoch");
    const cJSON *os = cJSON_GetObjectItemCaseSensitive(j, "outer_step");
    const cJSON *cm = cJSON_GetObjectItemCaseSensitive(j, "committed");
    const cJSON *hh = cJSON_GetObjectItemCaseSensitive(j, "hash");
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(j, "join");
    const cJSON *nn = cJSON_GetObjectItemCaseSensitive(j, "n");
    const cJSON *es = cJSON_GetObjectItemCaseSensitive(j, "end_step");
    int rc = 0;
    if (!cJSON_IsArray(arr) || !cJSON_IsNumber(ep) || !cJSON_IsNumber(os) ||
        !cJSON_IsNumber(cm) || !cJSON_IsString(hh) || !cJSON_IsBool(jn) || !cJSON_IsNumber(nn) ||
        nn->valueint < 1 || nn->valueint > LOCO_MAX_ISLANDS || !(os->valuedouble >= 0) ||
        !(cm->valuedouble >= 0) || !(ep->valuedouble >= 0) || os->valuedouble > LOCO_JSON_NUM_MAX ||
        cm->valuedouble > LOCO_JSON_NUM_MAX || ep->valuedouble > LOCO_JSON_NUM_MAX ||
        cJSON_GetArraySize(arr) > nn->valueint ||
        (es && !(cJSON_IsNumber(es) && es->valuedouble >= 0 && es->valuedouble <= LOCO_JSON_NUM_MAX))) {
        rc = LOCO_ERR(LOCO_EPROTO, "QUORUM: malformed JSON");
        goto out;
    }
    q->epoch = (uint64_t)ep->valuedouble;
    q->outer_step = (int64_t)os->valuedouble;
    q->committed = (int64_t)cm->valuedouble;
    q->committed_hash = strtoull(hh->valuestring, NULL, 16);
    q->join = cJSON_IsTrue(jn);
    q->n = nn->valueint;
    q->end_step = es ? (int64_t)es->valuedouble : 0;
    for (int i = 0; i < q->n; i++)
        q->m[i].id = i;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *site = cJSON_GetObjectItemCaseSensitive(e, "site");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
        const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(e, "ranks");
        int nr = cJSON_GetArraySize(ranks);
        if (!cJSON_IsNumber(id) || id->valueint < 0 || id->valueint >= q->n ||
            q->m[id->valueint].n_ranks || !cJSON_IsString(site) ||
            strlen(site->valuestring) >= LOCO_NET_NAME_MAX || !cJSON_IsString(role) ||
            !cJSON_IsArray(ranks) || nr < 1 || nr > LOCO_MAX_ISLAND_RANKS) {
            rc = LOCO_ERR(LOCO_EPROTO, "QUORUM: an island entry is malformed");
            goto out;
        }
        int i = id->valueint;
        loco_member *m = &q->m[i];
        snprintf(m->site, sizeof m->site, "%s", site->valuestring);
        if (!strcmp(role->valuestring, "member"))
            q->members |= 1ull << i;
        else if (!strcmp(role->valuestring, "observer"))
            q->observers |= 1ull << i;
        m->addrs = loco_alloc((size_t)nr * sizeof *m->addrs);
        if (!m->addrs) {
            rc = LOCO_ERR(LOCO_ENOMEM, "quorum addresses");
            goto out;
        }
        m->n_ranks = nr;
        for (int r = 0; r < nr; r++) {
            const cJSON *a = cJSON_GetArrayItem(ranks, r);
            if (!cJSON_IsString(a) || strlen(a->valuestring) >= LOCO_ADDR_MAX) {
                rc = LOCO_ERR(LOCO_EPROTO, "QUORUM: bad address of island %d rank %d", i, r);
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
