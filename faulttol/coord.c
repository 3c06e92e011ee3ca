/* The coordinator: registration, the quorum, heartbeats and the check that
 * every island holds the same θ_global after each outer step. One thread
 * polls the listener and every link; the messages are small. */
#include "faulttol/faulttol.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HASH_RING 64
#define MAX_PENDING 64

typedef struct {
    loco_link *link;
    bool registered, bye;
    char mesh[160];
    uint64_t model_hash;
    int n_ranks;
    char (*addrs)[LOCO_ADDR_MAX];
    double last_seen;
    loco_phi_detector phi;    /* over its heartbeat arrivals */
    int64_t ring_step[HASH_RING];
    uint64_t ring_hash[HASH_RING];
    int64_t last_outer;
} island;

struct loco_coord {
    loco_config cfg;
    loco_net_params np;
    loco_net_listener *listener;
    int n;                              /* islands expected (outer.sites) */
    char sites[LOCO_MAX_ISLANDS][LOCO_NET_NAME_MAX];
    island isl[LOCO_MAX_ISLANDS];       /* by id */
    loco_link *pending[MAX_PENDING];    /* accepted, not yet registered */
    int first_registered;               /* whose mesh the others must match, -1 */
    bool quorum_sent;
    uint64_t epoch;
    int64_t checked_outer;              /* highest outer step verified */
};

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int send_json(loco_link *l, int type, uint64_t epoch, const char *json) {
    loco_frame_hdr h = {.type = (uint16_t)type, .epoch = epoch};
    return loco_link_send(l, &h, json, strlen(json));
}

static void send_error(loco_link *l, const char *text) {
    loco_frame_hdr h = {.type = LOCO_FRAME_ERROR};
    if (loco_link_send(l, &h, text, strlen(text)) == 0)
        loco_link_flush(l, 2000);
}

int loco_coord_create(loco_coord **out, const loco_config *cfg, const loco_net_params *np,
                      const char *host, int port) {
    *out = NULL;
    loco_coord *c = loco_alloc(sizeof *c);
    if (!c)
        return LOCO_ERR(LOCO_ENOMEM, "coordinator");
    int rc;
    c->cfg = *cfg;
    c->np = *np;
    c->first_registered = -1;
    c->epoch = 1;
    c->checked_outer = 0;
    LOCO_CHECK_GOTO(loco_site_id(cfg, NULL, NULL, &c->n), out_fail);
    const char *p = cfg->outer.sites;
    for (int i = 0; i < c->n; i++) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len >= LOCO_NET_NAME_MAX) {
            rc = LOCO_ERR(LOCO_EINVAL, "outer.sites: site %d has a bad name", i);
            goto out_fail;
        }
        memcpy(c->sites[i], p, len);
        c->sites[i][len] = '\0';
        p = comma ? comma + 1 : p + len;
    }
    char h[LOCO_ADDR_MAX];
    int prt;
    if (host) {
        snprintf(h, sizeof h, "%s", host);
        prt = port;
    } else {
        LOCO_CHECK_GOTO(loco_parse_hostport(cfg->faulttol.coordinator, h, sizeof h, &prt),
                        out_fail);
    }
    LOCO_CHECK_GOTO(loco_net_listen(&c->listener, np, h, prt), out_fail);
    loco_info("coordinator: listening on %s:%d for %d islands (%s)", h,
              loco_net_listener_port(c->listener), c->n, cfg->outer.sites);
    *out = c;
    return 0;
out_fail:
    loco_coord_destroy(c);
    return rc;
}

int loco_coord_port(const loco_coord *c) { return loco_net_listener_port(c->listener); }

void loco_coord_destroy(loco_coord *c) {
    if (!c)
        return;
    for (int i = 0; i < MAX_PENDING; i++)
        loco_link_destroy(c->pending[i]);
    for (int i = 0; i < LOCO_MAX_ISLANDS; i++) {
        loco_link_destroy(c->isl[i].link);
        loco_free(c->isl[i].addrs);
        loco_phi_fini(&c->isl[i].phi);
    }
    loco_net_listener_destroy(c->listener);
    loco_free(c);
}

/* Stops the run: every live island hears why. */
static int fail_run(loco_coord *c, const char *why) {
    loco_error("coordinator: stopping the run: %s", why);
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].link)
            send_error(c->isl[i].link, why);
    return LOCO_ERR(LOCO_EPEER, "%s", why);
}

/* A REGISTER from a pending link: 1 when it became island `id`, 0 when it
 * was refused (the link is then closed), < 0 on failure. */
static int handle_register(loco_coord *c, loco_link *l, const char *json, size_t len) {
    cJSON *j = cJSON_ParseWithLength(json, len);
    const cJSON *site = cJSON_GetObjectItemCaseSensitive(j, "site");
    const cJSON *mesh = cJSON_GetObjectItemCaseSensitive(j, "mesh");
    const cJSON *mh = cJSON_GetObjectItemCaseSensitive(j, "model_hash");
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(j, "ranks");
    char why[1024] = "";
    int id = -1;
    int nr = cJSON_GetArraySize(ranks);
    if (!cJSON_IsString(site) || !cJSON_IsString(mesh) || !cJSON_IsString(mh) ||
        !cJSON_IsArray(ranks) || nr < 1 || nr > LOCO_MAX_ISLAND_RANKS ||
        strlen(mesh->valuestring) >= sizeof c->isl[0].mesh) {
        snprintf(why, sizeof why, "malformed REGISTER");
        goto refuse;
    }
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->sites[i], site->valuestring))
            id = i;
    if (id < 0) {
        snprintf(why, sizeof why, "site '%.64s' is not in this run's outer.sites (%.300s)",
                 site->valuestring, c->cfg.outer.sites);
        goto refuse;
    }
    if (strcmp(loco_link_peer_name(l), site->valuestring)) {
        snprintf(why, sizeof why, "site '%.64s' registered with the certificate of '%.64s'",
                 site->valuestring, loco_link_peer_name(l));
        goto refuse;
    }
    island *is = &c->isl[id];
    if (is->link) {
        snprintf(why, sizeof why, "site '%.64s' is already registered", site->valuestring);
        goto refuse;
    }
    uint64_t model_hash = strtoull(mh->valuestring, NULL, 16);
    if (c->first_registered >= 0) {
        const island *f = &c->isl[c->first_registered];
        if (strcmp(f->mesh, mesh->valuestring) || f->n_ranks != nr) {
            snprintf(why, sizeof why,
                     "mesh of '%.64s' (%.150s, %d ranks) differs from '%.64s' (%.150s, %d ranks); "
                     "islands of one run need the same mesh",
                     site->valuestring, mesh->valuestring, nr, c->sites[c->first_registered],
                     f->mesh, f->n_ranks);
            goto refuse;
        }
        if (f->model_hash != model_hash) {
            snprintf(why, sizeof why,
                     "'%.64s' has another [model]/[outer]/[compress] configuration than '%.64s'",
                     site->valuestring, c->sites[c->first_registered]);
            goto refuse;
        }
    }
    is->addrs = loco_alloc((size_t)nr * sizeof *is->addrs);
    if (!is->addrs) {
        cJSON_Delete(j);
        return LOCO_ERR(LOCO_ENOMEM, "island addresses");
    }
    for (int r = 0; r < nr; r++) {
        const cJSON *a = cJSON_GetArrayItem(ranks, r);
        snprintf(is->addrs[r], LOCO_ADDR_MAX, "%s", cJSON_IsString(a) ? a->valuestring : "");
    }
    const double beat = (double)c->cfg.faulttol.heartbeat_ms;
    int prc = loco_phi_init(&is->phi, 1000, beat / 4, (double)c->cfg.faulttol.phi_pause_ms, beat);
    if (prc < 0) {
        cJSON_Delete(j);
        return prc;
    }
    is->link = l;
    is->registered = true;
    is->n_ranks = nr;
    is->model_hash = model_hash;
    is->last_seen = loco_now();
    snprintf(is->mesh, sizeof is->mesh, "%s", mesh->valuestring);
    if (c->first_registered < 0)
        c->first_registered = id;
    cJSON_Delete(j);
    char ack[64];
    snprintf(ack, sizeof ack, "{\"island_id\":%d}", id);
    loco_info("coordinator: island %d = %s registered (%s, %d ranks)", id, is->mesh[0] ? c->sites[id] : "?",
              is->mesh, nr);
    int rc = send_json(l, LOCO_FRAME_ACK, c->epoch, ack);
    return rc < 0 ? rc : 1;
refuse:
    cJSON_Delete(j);
    loco_warn("coordinator: refused an island from %s: %s", loco_link_peer_name(l), why);
    send_error(l, why);
    return 0;
}

static int send_quorum(loco_coord *c) {
    loco_quorum q = {.epoch = c->epoch, .n = c->n};
    for (int i = 0; i < c->n; i++) {
        q.m[i].id = i;
        snprintf(q.m[i].site, sizeof q.m[i].site, "%s", c->sites[i]);
        q.m[i].n_ranks = c->isl[i].n_ranks;
        q.m[i].addrs = c->isl[i].addrs;
    }
    char *json = loco_quorum_to_json(&q);
    if (!json)
        return LOCO_ERR(LOCO_ENOMEM, "quorum");
    int rc = 0;
    for (int i = 0; i < c->n && rc == 0; i++)
        rc = send_json(c->isl[i].link, LOCO_FRAME_QUORUM, c->epoch, json);
    free(json);
    loco_info("coordinator: quorum epoch %llu: %d islands", (unsigned long long)c->epoch, c->n);
    c->quorum_sent = true;
    return rc;
}

/* Once every island reported outer step s, their hashes must agree. */
static int check_step(loco_coord *c, int64_t s) {
    uint64_t h[LOCO_MAX_ISLANDS] = {0};
    for (int i = 0; i < c->n; i++) {
        const island *is = &c->isl[i];
        if (is->ring_step[s % HASH_RING] != s)
            return 0; /* not everyone yet */
        h[i] = is->ring_hash[s % HASH_RING];
    }
    for (int i = 1; i < c->n; i++)
        if (h[i] != h[0]) {
            char why[512];
            snprintf(why, sizeof why,
                     "θ_global differs after outer step %lld: %s has %016llx, %s has %016llx",
                     (long long)s, c->sites[0], (unsigned long long)h[0], c->sites[i],
                     (unsigned long long)h[i]);
            return fail_run(c, why);
        }
    if (s > c->checked_outer)
        c->checked_outer = s;
    loco_debug("coordinator: outer step %lld agrees (%016llx)", (long long)s,
               (unsigned long long)h[0]);
    return 0;
}

static int handle_heartbeat(loco_coord *c, int id, const char *json, size_t len) {
    island *is = &c->isl[id];
    is->last_seen = loco_now();
    cJSON *j = cJSON_ParseWithLength(json, len);
    const cJSON *os = cJSON_GetObjectItemCaseSensitive(j, "outer_step");
    const cJSON *hh = cJSON_GetObjectItemCaseSensitive(j, "hash");
    int rc = 0;
    if (cJSON_IsNumber(os) && os->valuedouble >= 1 && cJSON_IsString(hh)) {
        int64_t s = (int64_t)os->valuedouble;
        if (s > is->last_outer) {
            is->last_outer = s;
            is->ring_step[s % HASH_RING] = s;
            is->ring_hash[s % HASH_RING] = strtoull(hh->valuestring, NULL, 16);
            rc = check_step(c, s);
        }
    }
    cJSON_Delete(j);
    return rc;
}

/* Reads everything an island sent; 1 when something happened. */
static int poll_island(loco_coord *c, int id, bool *busy) {
    island *is = &c->isl[id];
    for (;;) {
        loco_frame_hdr h;
        void *payload = NULL;
        int rc = loco_link_recv(is->link, &h, &payload, 0);
        if (rc == LOCO_ETIMEDOUT)
            return 0;
        if (rc < 0) {
            if (is->bye)
                return 0;
            char why[256];
            snprintf(why, sizeof why, "island %d (%s) was lost: %s", id, c->sites[id],
                     loco_errmsg());
            loco_link_destroy(is->link);
            is->link = NULL;
            return fail_run(c, why);
        }
        *busy = true;
        loco_phi_heartbeat(&is->phi, loco_now());
        if (h.type == LOCO_FRAME_HEARTBEAT)
            rc = handle_heartbeat(c, id, payload, h.payload_len);
        else if (h.type == LOCO_FRAME_BYE) {
            is->bye = true;
            loco_info("coordinator: island %d (%s) finished", id, c->sites[id]);
        } else
            loco_warn("coordinator: ignored a %s frame from %s", loco_frame_type_name(h.type),
                      c->sites[id]);
        loco_free(payload);
        if (rc < 0)
            return rc;
    }
}

int loco_coord_serve(loco_coord *c) {
    const double timeout = (double)c->cfg.faulttol.timeout_ms / 1000.0;
    for (;;) {
        bool busy = false;
        loco_link *l;
        if (loco_net_accept(c->listener, &l, 0) == 0) {
            busy = true;
            int slot = -1;
            for (int i = 0; i < MAX_PENDING && slot < 0; i++)
                if (!c->pending[i])
                    slot = i;
            if (slot < 0) {
                send_error(l, "coordinator: too many unregistered connections");
                loco_link_destroy(l);
            } else {
                c->pending[slot] = l;
            }
        }
        for (int i = 0; i < MAX_PENDING; i++) {
            if (!c->pending[i])
                continue;
            loco_frame_hdr h;
            void *payload = NULL;
            int rc = loco_link_recv(c->pending[i], &h, &payload, 0);
            if (rc == LOCO_ETIMEDOUT)
                continue;
            busy = true;
            if (rc == 0 && h.type == LOCO_FRAME_REGISTER) {
                rc = handle_register(c, c->pending[i], payload, h.payload_len);
                if (rc == 1)
                    c->pending[i] = NULL; /* now owned by its island */
            } else if (rc == 0) {
                send_error(c->pending[i], "expected REGISTER");
                rc = 0;
            }
            loco_free(payload);
            if (rc < 0)
                return rc;
            if (c->pending[i]) {
                loco_link_destroy(c->pending[i]);
                c->pending[i] = NULL;
            }
        }
        int registered = 0, done = 0;
        for (int i = 0; i < c->n; i++) {
            island *is = &c->isl[i];
            if (!is->link)
                continue;
            registered++;
            LOCO_CHECK(poll_island(c, i, &busy));
            double now = loco_now();
            if (is->bye)
                done++;
            else if (c->quorum_sent &&
                     loco_phi_suspect(&is->phi, now, c->cfg.faulttol.phi, timeout)) {
                char why[256];
                snprintf(why, sizeof why,
                         "island %d (%s) is suspected dead: silent for %.0f ms (phi %.1f, "
                         "threshold %.1f; hard timeout %lld ms)",
                         i, c->sites[i], (now - loco_phi_last(&is->phi)) * 1e3,
                         loco_phi(&is->phi, now), c->cfg.faulttol.phi,
                         (long long)c->cfg.faulttol.timeout_ms);
                return fail_run(c, why);
            }
        }
        if (!c->quorum_sent && registered == c->n) {
            LOCO_CHECK(send_quorum(c));
            for (int i = 0; i < c->n; i++) /* silence counts from now */
                loco_phi_start(&c->isl[i].phi, loco_now());
        }
        if (c->quorum_sent && done == c->n) {
            /* Everyone finished and every reported step agreed. */
            for (int i = 0; i < c->n; i++) {
                loco_frame_hdr h = {.type = LOCO_FRAME_BYE, .epoch = c->epoch};
                if (loco_link_send(c->isl[i].link, &h, NULL, 0) == 0)
                    loco_link_flush(c->isl[i].link, 2000);
            }
            loco_info("coordinator: run finished; θ_global agreed through outer step %lld",
                      (long long)c->checked_outer);
            return 0;
        }
        if (!busy)
            sleep_ms(2);
    }
}
