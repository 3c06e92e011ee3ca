/* The island side of the coordinator protocol (held by island rank 0). */
#include "faulttol/faulttol.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

struct loco_session {
    loco_link *link;
    uint64_t epoch;
    int id;
    /* Heartbeats go out from their own thread, so a long step or exchange
     * never looks like silence to the coordinator. */
    pthread_t beat_thread;
    bool beating;
    atomic_bool stop;
    atomic_llong inner_step;
    int beat_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static int send_beat(loco_session *s, int64_t inner_step, int64_t outer_step, uint64_t hash) {
    char json[160], hh[17];
    loco_hash_hex(hash, hh);
    snprintf(json, sizeof json, "{\"inner_step\":%lld,\"outer_step\":%lld,\"hash\":\"%s\"}",
             (long long)inner_step, (long long)outer_step, hh);
    loco_frame_hdr h = {.type = LOCO_FRAME_HEARTBEAT, .epoch = s->epoch,
                        .step = (uint64_t)(outer_step > 0 ? outer_step : 0)};
    return loco_link_send(s->link, &h, json, strlen(json));
}

static void *beat_main(void *arg) {
    loco_session *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!atomic_load(&s->stop)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)(s->beat_ms % 1000) * 1000000L;
        ts.tv_sec += s->beat_ms / 1000 + ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        if (atomic_load(&s->stop))
            break;
        pthread_mutex_unlock(&s->mu);
        int rc = send_beat(s, atomic_load(&s->inner_step), 0, 0);
        pthread_mutex_lock(&s->mu);
        if (rc < 0)
            break; /* the link failed: the main thread hears it on poll */
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void stop_beats(loco_session *s) {
    if (!s->beating)
        return;
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->stop, true);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->beat_thread, NULL);
    s->beating = false;
}

void loco_session_destroy(loco_session *s) {
    if (!s)
        return;
    stop_beats(s);
    loco_link_destroy(s->link);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    loco_free(s);
}

static int refusal(loco_session *s, const void *payload, size_t len) {
    (void)s;
    return LOCO_ERR(LOCO_EPEER, "coordinator: %.*s", (int)(len > 900 ? 900 : len),
                    (const char *)payload);
}

int loco_session_join(loco_session **out, const loco_config *cfg, const loco_net_params *np,
                      const loco_island_info *me, int *island_id, loco_quorum *q,
                      int timeout_ms) {
    *out = NULL;
    char host[LOCO_ADDR_MAX];
    int port;
    LOCO_CHECK(loco_parse_hostport(cfg->faulttol.coordinator, host, sizeof host, &port));
    loco_session *s = loco_alloc(sizeof *s);
    if (!s)
        return LOCO_ERR(LOCO_ENOMEM, "session");
    s->id = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->beat_ms = (int)cfg->faulttol.heartbeat_ms;
    int rc;
    loco_net_params p = *np;
    snprintf(p.expect_peer, sizeof p.expect_peer, "%s", np->backend == LOCO_NET_TLS ? "coordinator" : "");
    p.streams = 1;
    /* The coordinator may start a moment after the islands. */
    double deadline = loco_now() + timeout_ms / 1000.0;
    for (;;) {
        rc = loco_net_connect(&s->link, &p, host, port, -1);
        if (rc != LOCO_EIO || loco_now() > deadline)
            break;
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (rc < 0)
        goto out_fail;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "site", me->site);
    cJSON_AddStringToObject(j, "mesh", me->mesh);
    char hh[17];
    loco_hash_hex(me->model_hash, hh);
    cJSON_AddStringToObject(j, "model_hash", hh);
    cJSON *a = cJSON_AddArrayToObject(j, "ranks");
    for (int r = 0; r < me->n_ranks; r++)
        cJSON_AddItemToArray(a, cJSON_CreateString(me->addrs[r]));
    char *json = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!json) {
        rc = LOCO_ERR(LOCO_ENOMEM, "REGISTER");
        goto out_fail;
    }
    loco_frame_hdr h = {.type = LOCO_FRAME_REGISTER};
    rc = loco_link_send(s->link, &h, json, strlen(json));
    cJSON_free(json);
    if (rc < 0)
        goto out_fail;
    bool have_quorum = false;
    while (!have_quorum) {
        int left = (int)((deadline - loco_now()) * 1000);
        void *payload = NULL;
        rc = loco_link_recv(s->link, &h, &payload, left > 0 ? left : 0);
        if (rc == LOCO_ETIMEDOUT) {
            rc = LOCO_ERR(LOCO_ETIMEDOUT, "no quorum from the coordinator within %d ms (are all "
                                          "sites of outer.sites started?)",
                          timeout_ms);
            goto out_fail;
        }
        if (rc < 0)
            goto out_fail;
        if (h.type == LOCO_FRAME_ERROR) {
            rc = refusal(s, payload, h.payload_len);
        } else if (h.type == LOCO_FRAME_ACK) {
            cJSON *ack = cJSON_ParseWithLength(payload, h.payload_len);
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(ack, "island_id");
            s->id = cJSON_IsNumber(id) ? id->valueint : -1;
            cJSON_Delete(ack);
        } else if (h.type == LOCO_FRAME_QUORUM) {
            rc = loco_quorum_from_json(q, payload, h.payload_len);
            s->epoch = q->epoch;
            have_quorum = rc == 0;
        }
        loco_free(payload);
        if (rc < 0)
            goto out_fail;
    }
    if (s->id < 0 || s->id >= q->n) {
        rc = LOCO_ERR(LOCO_EPROTO, "coordinator gave no valid island id");
        goto out_fail;
    }
    *island_id = s->id;
    if (pthread_create(&s->beat_thread, NULL, beat_main, s) != 0) {
        rc = LOCO_ERR(LOCO_EIO, "cannot start the heartbeat thread");
        goto out_fail;
    }
    s->beating = true;
    *out = s;
    return 0;
out_fail:
    loco_session_destroy(s);
    return rc;
}

int loco_session_heartbeat(loco_session *s, int64_t inner_step, int64_t outer_step,
                           uint64_t hash) {
    atomic_store(&s->inner_step, inner_step);
    if (outer_step < 1)
        return 0; /* the heartbeat thread carries progress */
    return send_beat(s, inner_step, outer_step, hash);
}

int loco_session_poll(loco_session *s) {
    for (;;) {
        loco_frame_hdr h;
        void *payload = NULL;
        int rc = loco_link_recv(s->link, &h, &payload, 0);
        if (rc == LOCO_ETIMEDOUT)
            return 0;
        if (rc < 0)
            return LOCO_ERR(rc, "lost the coordinator: %s", loco_errmsg());
        if (h.type == LOCO_FRAME_ERROR)
            rc = refusal(s, payload, h.payload_len);
        loco_free(payload);
        if (rc < 0)
            return rc;
    }
}

int loco_session_leave(loco_session *s, int timeout_ms) {
    stop_beats(s);
    loco_frame_hdr h = {.type = LOCO_FRAME_BYE, .epoch = s->epoch};
    LOCO_CHECK(loco_link_send(s->link, &h, NULL, 0));
    for (;;) {
        void *payload = NULL;
        int rc = loco_link_recv(s->link, &h, &payload, timeout_ms);
        if (rc < 0)
            return LOCO_ERR(rc, "no final word from the coordinator: %s", loco_errmsg());
        if (h.type == LOCO_FRAME_ERROR)
            rc = refusal(s, payload, h.payload_len);
        loco_free(payload);
        if (rc < 0)
            return rc;
        if (h.type == LOCO_FRAME_BYE)
            return 0;
    }
}
