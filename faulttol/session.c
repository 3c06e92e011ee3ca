/* The island side of the coordinator protocol (held by island rank 0).
 * The session survives the coordinator: when its link breaks, the next
 * call reconnects and registers again with what the island holds
 * (loco_island_progress), under the same incarnation, so a restarted
 * coordinator can rebuild the run and a live one keeps the membership.
 *
 * Why one file: one state machine (connect, register, heartbeat, reconnect)
 * whose transitions share the session's lock and link. */
#include "faulttol/faulttol.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define QUEUE 32

typedef struct {
    loco_frame_hdr h;
    void *payload;
} queued;

struct loco_session {
    pthread_mutex_t mu; /* link (the heartbeat thread sends on it) */
    loco_link *link;
    bool broken;
    int id;
    uint64_t inc; /* this process: a restarted island has another */
    char host[LOCO_ADDR_MAX];
    int port;
    loco_net_params np;
    char site[LOCO_NET_NAME_MAX], mesh[160];
    uint64_t model_hash;
    int n_ranks;
    char (*addrs)[LOCO_ADDR_MAX];
    loco_island_progress progress;
    bool finished; /* the coordinator's final BYE was seen */
    bool stopped;  /* the coordinator stopped the run (an ERROR) */
    queued q[QUEUE];
    int q_head, q_len;
    /* Without a coordinator: attempts spaced by a back-off that doubles up
     * to BACKOFF_MAX_S, for grace_s (faulttol.coordinator_grace_s). */
    double grace_s, backoff_s, next_try;
    int reconnect_ms; /* bound of one attempt while training (faulttol.reconnect_ms) */
    /* Heartbeats go out from their own thread, so a long step or exchange
     * never looks like silence to the coordinator. */
    pthread_t beat_thread;
    bool beating;
    atomic_bool stop;
    atomic_llong inner_step;
    int beat_ms;
    pthread_cond_t cv;
    /* READY or DONE already sent ahead of the wait for its answer (the
     * wait then does not send it again): step, and epoch for DONE. */
    int64_t ready_sent, done_sent;
    uint64_t done_sent_epoch;
};

static int send_locked(loco_session *s, int type, const char *json) {
    pthread_mutex_lock(&s->mu);
    int rc = LOCO_ERR(LOCO_EPEER, "no link to the coordinator");
    if (s->link && !s->broken) {
        loco_frame_hdr h = {.type = (uint16_t)type, .epoch = s->progress.epoch};
        rc = loco_link_send(s->link, &h, json, json ? strlen(json) : 0);
        if (rc < 0)
            s->broken = true;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

bool loco_session_broken(loco_session *s) {
    pthread_mutex_lock(&s->mu);
    const bool b = s->broken || !s->link;
    pthread_mutex_unlock(&s->mu);
    return b;
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
        if (s->link && !s->broken) {
            char json[64];
            snprintf(json, sizeof json, "{\"inner_step\":%lld}",
                     (long long)atomic_load(&s->inner_step));
            loco_frame_hdr h = {.type = LOCO_FRAME_HEARTBEAT, .epoch = s->progress.epoch};
            if (loco_link_send(s->link, &h, json, strlen(json)) < 0)
                s->broken = true; /* the main thread reconnects */
        }
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
    for (int i = 0; i < QUEUE; i++)
        loco_free(s->q[i].payload);
    loco_free(s->addrs);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    loco_free(s);
}

static int refusal(const void *payload, size_t len) {
    return LOCO_ERR(LOCO_EPEER, "coordinator: %.*s", (int)(len > 900 ? 900 : len),
                    (const char *)payload);
}

/* One connection attempt and a REGISTER with the current progress. */
static int connect_register(loco_session *s, int timeout_ms) {
    loco_net_params p = s->np;
    snprintf(p.expect_peer, sizeof p.expect_peer, "%s",
             s->np.backend == LOCO_NET_TLS ? "coordinator" : "");
    p.streams = 1;
    loco_link *l;
    LOCO_CHECK(loco_net_connect(&l, &p, s->host, s->port, timeout_ms));
    cJSON *j = cJSON_CreateObject();
    char hh[17];
    cJSON_AddStringToObject(j, "site", s->site);
    cJSON_AddStringToObject(j, "mesh", s->mesh);
    loco_hash_hex(s->model_hash, hh);
    cJSON_AddStringToObject(j, "model_hash", hh);
    loco_hash_hex(s->inc, hh);
    cJSON_AddStringToObject(j, "inc", hh);
    cJSON *a = cJSON_AddArrayToObject(j, "ranks");
    for (int r = 0; r < s->n_ranks; r++)
        cJSON_AddItemToArray(a, cJSON_CreateString(s->addrs[r]));
    const loco_island_progress *pr = &s->progress;
    cJSON_AddNumberToObject(j, "committed", (double)pr->committed);
    loco_hash_hex(pr->hash, hh);
    cJSON_AddStringToObject(j, "hash", hh);
    cJSON_AddNumberToObject(j, "epoch", (double)pr->epoch);
    cJSON_AddNumberToObject(j, "pending", (double)pr->pending);
    loco_hash_hex(pr->pending_hash, hh);
    cJSON_AddStringToObject(j, "pending_hash", hh);
    if (pr->end_step > 0)
        cJSON_AddNumberToObject(j, "end_step", (double)pr->end_step);
    char *json = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!json) {
        loco_link_destroy(l);
        return LOCO_ERR(LOCO_ENOMEM, "REGISTER");
    }
    loco_frame_hdr h = {.type = LOCO_FRAME_REGISTER};
    int rc = loco_link_send(l, &h, json, strlen(json));
    cJSON_free(json);
    if (rc < 0) {
        loco_link_destroy(l);
        return rc;
    }
    pthread_mutex_lock(&s->mu);
    loco_link *old = s->link;
    s->link = l;
    s->broken = false;
    pthread_mutex_unlock(&s->mu);
    loco_link_destroy(old);
    return 0;
}

/* Reads every frame the link holds now into the queue (the coordinator's
 * final BYE sets `finished`). With `refuse`, an ERROR ends the read as
 * LOCO_EPEER with its text (*refused set); without, it is queued like the rest (next_frame
 * turns it into the error). Returns LOCO_ETIMEDOUT when the link is empty,
 * else the link's error. Also used on a link a send found broken (e.g. the
 * heartbeat thread): its last frames must not be lost. */
static int drain(loco_session *s, bool refuse, bool *refused) {
    if (refused)
        *refused = false;
    if (!s->link)
        return LOCO_EPEER;
    for (;;) {
        loco_frame_hdr h;
        void *payload = NULL;
        int rc = loco_link_recv(s->link, &h, &payload, 0);
        if (rc != 0)
            return rc;
        if (h.type == LOCO_FRAME_ERROR && refuse) {
            rc = refusal(payload, h.payload_len);
            loco_free(payload);
            *refused = true;
            return rc;
        }
        if (h.type == LOCO_FRAME_BYE) {
            loco_debug("session: the coordinator ended the run");
            s->finished = true;
        }
        if (h.type == LOCO_FRAME_ACK || s->q_len == QUEUE) {
            loco_free(payload);
            continue;
        }
        queued *e = &s->q[(s->q_head + s->q_len) % QUEUE];
        e->h = h;
        e->payload = payload;
        s->q_len++;
    }
}

#define BACKOFF_MIN_S 0.1
#define BACKOFF_MAX_S 5.0

/* After the link broke: one attempt to register again, unless the back-off
 * says it is too early (LOCO_ETIMEDOUT then). */
static int reconnect(loco_session *s) {
    drain(s, false, NULL);
    if (s->finished)
        return LOCO_ERR(LOCO_EPEER, "the coordinator ended the run");
    const double now = loco_now();
    if (now < s->next_try)
        return LOCO_ETIMEDOUT;
    int rc = connect_register(s, s->reconnect_ms);
    if (rc == 0) {
        s->backoff_s = BACKOFF_MIN_S;
        s->next_try = 0;
        loco_info("session: registered again with the coordinator (committed outer step %lld)",
                  (long long)s->progress.committed);
        return 0;
    }
    s->backoff_s = s->backoff_s < BACKOFF_MIN_S ? BACKOFF_MIN_S
                   : s->backoff_s * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S
                                                      : s->backoff_s * 2;
    s->next_try = loco_now() + s->backoff_s;
    return rc;
}

/* How long a wait may go on without a coordinator. */
static double patience_s(const loco_session *s, int timeout_ms) {
    const double t = timeout_ms / 1000.0;
    return s->grace_s > t ? s->grace_s : t;
}

/* Next frame from the coordinator that is not a heartbeat-level concern:
 * queued ones first. LOCO_ETIMEDOUT after timeout_ms; reconnects (until
 * deadline) when the link broke. */
static int next_frame(loco_session *s, loco_frame_hdr *h, void **payload, int timeout_ms,
                      double deadline) {
    while (s->q_len > 0) {
        queued *e = &s->q[s->q_head];
        s->q_head = (s->q_head + 1) % QUEUE;
        s->q_len--;
        /* Of several announcements that piled up (an island busy or frozen
         * for a while), only the newest one matters; commits all do. */
        bool newer = false;
        for (int i = 0; i < s->q_len && e->h.type == LOCO_FRAME_QUORUM; i++)
            newer |= s->q[(s->q_head + i) % QUEUE].h.type == LOCO_FRAME_QUORUM;
        if (newer) {
            loco_free(e->payload);
            e->payload = NULL;
            continue;
        }
        *h = e->h;
        *payload = e->payload;
        e->payload = NULL;
        if (h->type == LOCO_FRAME_ERROR) {
            s->stopped = true;
            int rc = refusal(*payload, h->payload_len);
            loco_free(*payload);
            *payload = NULL;
            return rc;
        }
        return 0;
    }
    for (;;) {
        if (s->broken || !s->link) {
            drain(s, false, NULL);
            if (s->q_len > 0)
                return next_frame(s, h, payload, timeout_ms, deadline);
            if (loco_now() >= deadline)
                return LOCO_ERR(LOCO_EPEER, "lost the coordinator and could not register again "
                                            "within %.0f s (faulttol.coordinator_grace_s)",
                                s->grace_s);
            if (reconnect(s) < 0) {
                loco_sleep_ms(50);
                continue;
            }
        }
        int rc = loco_link_recv(s->link, h, payload, timeout_ms);
        if (rc == LOCO_ETIMEDOUT)
            return rc;
        if (rc < 0) {
            loco_warn("session: lost the coordinator (%s); registering again", loco_errmsg());
            pthread_mutex_lock(&s->mu);
            s->broken = true;
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        if (h->type == LOCO_FRAME_ACK) {
            cJSON *ack = cJSON_ParseWithLength(*payload, h->payload_len);
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(ack, "island_id");
            if (cJSON_IsNumber(id))
                s->id = id->valueint;
            cJSON_Delete(ack);
            loco_free(*payload);
            *payload = NULL;
            continue;
        }
        if (h->type == LOCO_FRAME_ERROR) {
            s->stopped = true;
            rc = refusal(*payload, h->payload_len);
            loco_free(*payload);
            *payload = NULL;
            return rc;
        }
        if (h->type == LOCO_FRAME_BYE) {
            loco_debug("session: the coordinator ended the run");
            s->finished = true;
        }
        return 0;
    }
}

int loco_session_join(loco_session **out, const loco_config *cfg, const loco_net_params *np,
                      const loco_island_info *me, const loco_island_progress *progress,
                      int *island_id, loco_quorum *q, int timeout_ms) {
    *out = NULL;
    loco_session *s = loco_alloc(sizeof *s);
    if (!s)
        return LOCO_ERR(LOCO_ENOMEM, "session");
    s->id = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->beat_ms = (int)cfg->faulttol.heartbeat_ms;
    s->grace_s = cfg->faulttol.coordinator_grace_s;
    s->reconnect_ms = (int)cfg->faulttol.reconnect_ms;
    s->backoff_s = BACKOFF_MIN_S;
    s->np = *np;
    snprintf(s->site, sizeof s->site, "%s", me->site);
    snprintf(s->mesh, sizeof s->mesh, "%s", me->mesh);
    s->model_hash = me->model_hash;
    s->n_ranks = me->n_ranks;
    if (progress)
        s->progress = *progress;
    uint64_t seed[2] = {(uint64_t)getpid(), (uint64_t)(loco_now() * 1e9)};
    s->inc = loco_hash64(seed, sizeof seed);
    int rc = loco_parse_hostport(cfg->faulttol.coordinator, s->host, sizeof s->host, &s->port);
    if (rc < 0)
        goto out_fail;
    s->addrs = loco_alloc((size_t)me->n_ranks * sizeof *s->addrs);
    if (!s->addrs) {
        rc = LOCO_ERR(LOCO_ENOMEM, "addresses");
        goto out_fail;
    }
    memcpy(s->addrs, me->addrs, (size_t)me->n_ranks * sizeof *s->addrs);
    /* The coordinator, and the other sites, may start a while after this
     * island; it may also go down and come back meanwhile. */
    const double patience = patience_s(s, timeout_ms);
    double deadline = loco_now() + patience;
    /* Anything but a refusal (another CA, a bad configuration) is worth
     * another try until the deadline: nobody listening yet, a coordinator
     * that went down during the handshake. */
    for (;;) {
        rc = connect_register(s, -1);
        if (rc == 0 || rc == LOCO_EAUTH || rc == LOCO_EINVAL || loco_now() > deadline)
            break;
        loco_sleep_ms(100);
    }
    if (rc < 0)
        goto out_fail;
    for (;;) {
        int left = (int)((deadline - loco_now()) * 1000);
        loco_frame_hdr h;
        void *payload = NULL;
        rc = left > 0 ? next_frame(s, &h, &payload, left, deadline) : LOCO_ETIMEDOUT;
        if (rc == LOCO_ETIMEDOUT) {
            rc = LOCO_ERR(LOCO_ETIMEDOUT, "no quorum from the coordinator within %.0f s (are all "
                                          "sites of outer.sites started?)",
                          patience);
            goto out_fail;
        }
        if (rc < 0)
            goto out_fail;
        bool done = false;
        if (h.type == LOCO_FRAME_QUORUM) {
            rc = loco_quorum_from_json(q, payload, h.payload_len);
            done = rc == 0;
        }
        loco_free(payload);
        if (rc < 0)
            goto out_fail;
        if (done)
            break;
    }
    if (s->id < 0 || s->id >= q->n) {
        rc = LOCO_ERR(LOCO_EPROTO, "coordinator gave no valid island id");
        goto out_fail;
    }
    s->progress.epoch = q->epoch;
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

static int send_outer(loco_session *s, const char *phase, int64_t step, int64_t have,
                      uint64_t epoch, uint64_t hash, uint64_t suspects) {
    char json[256], hh[17];
    loco_hash_hex(hash, hh);
    snprintf(json, sizeof json,
             "{\"phase\":\"%s\",\"outer_step\":%lld,\"have\":%lld,\"epoch\":%llu,\"hash\":\"%s\","
             "\"suspects\":\"%016llx\"}",
             phase, (long long)step, (long long)have, (unsigned long long)epoch, hh,
             (unsigned long long)suspects);
    return send_locked(s, LOCO_FRAME_OUTER, json);
}

static int64_t commit_step(const void *payload, size_t len) {
    cJSON *j = cJSON_ParseWithLength(payload, len);
    const cJSON *os = cJSON_GetObjectItemCaseSensitive(j, "outer_step");
    int64_t s = cJSON_IsNumber(os) ? (int64_t)os->valuedouble : -1;
    cJSON_Delete(j);
    return s;
}

int loco_session_ready(loco_session *s, int64_t step, int64_t have, loco_quorum *q,
                       loco_verdict *v, int timeout_ms) {
    loco_debug("session: ready for outer step %lld (holding %lld; %d queued, link %s)",
               (long long)step, (long long)have, s->q_len, s->broken ? "broken" : "up");
    const double patience = patience_s(s, timeout_ms);
    double deadline = loco_now() + patience;
    bool sent = s->ready_sent == step && !s->broken;
    s->ready_sent = 0;
    int rc = sent ? 0 : send_outer(s, "ready", step, have, 0, 0, 0);
    /* a broken link is mended below, and READY sent again */
    sent = rc == 0;
    for (;;) {
        /* Waiting on a live coordinator is not bounded (it watches the
         * islands); the grace bounds the time without one. */
        if (s->finished && s->q_len == 0) {
            *v = LOCO_VERDICT_FINISHED; /* the run ended; nothing else will come */
            return 0;
        }
        if (!s->broken && s->link)
            deadline = loco_now() + patience;
        if (loco_now() > deadline)
            return LOCO_ERR(LOCO_ETIMEDOUT, "no go for outer step %lld: no coordinator for %.0f s",
                            (long long)step, patience);
        loco_frame_hdr h;
        void *payload = NULL;
        rc = next_frame(s, &h, &payload, 100, deadline);
        if (rc == LOCO_ETIMEDOUT) {
            if (!sent || s->broken)
                sent = send_outer(s, "ready", step, have, 0, 0, 0) == 0;
            continue;
        }
        if (rc < 0)
            return rc;
        if (h.type == LOCO_FRAME_BYE) {
            loco_free(payload);
            *v = LOCO_VERDICT_FINISHED;
            return 0;
        }
        if (h.type != LOCO_FRAME_QUORUM) {
            loco_free(payload);
            continue; /* a COMMIT of a step already settled */
        }
        loco_quorum_fini(q);
        rc = loco_quorum_from_json(q, payload, h.payload_len);
        loco_free(payload);
        LOCO_CHECK(rc);
        s->progress.epoch = q->epoch;
        if (q->join) {
            *v = LOCO_VERDICT_JOIN;
            return 0;
        }
        if (q->outer_step == step) {
            *v = LOCO_VERDICT_GO;
            return 0;
        }
        if (q->outer_step == 0) /* membership changed or a new coordinator: say it again */
            sent = send_outer(s, "ready", step, have, 0, 0, 0) == 0;
    }
}

int loco_session_done(loco_session *s, int64_t step, uint64_t epoch, bool ok, uint64_t hash,
                      uint64_t suspects, loco_quorum *q, loco_verdict *v, int timeout_ms) {
    const double patience = patience_s(s, timeout_ms);
    double deadline = loco_now() + patience;
    const char *phase = ok ? "done" : "failed";
    bool sent = s->done_sent == step && s->done_sent_epoch == epoch && !s->broken;
    s->done_sent = 0;
    if (!sent)
        sent = send_outer(s, phase, step, 0, epoch, hash, suspects) == 0;
    for (;;) {
        if (s->finished && s->q_len == 0) {
            *v = LOCO_VERDICT_FINISHED;
            return 0;
        }
        if (!s->broken && s->link)
            deadline = loco_now() + patience;
        if (loco_now() > deadline)
            return LOCO_ERR(LOCO_ETIMEDOUT,
                            "no verdict on outer step %lld: no coordinator for %.0f s",
                            (long long)step, patience);
        loco_frame_hdr h;
        void *payload = NULL;
        int rc = next_frame(s, &h, &payload, 100, deadline);
        if (rc == LOCO_ETIMEDOUT) {
            if (!sent)
                sent = send_outer(s, phase, step, 0, epoch, hash, suspects) == 0;
            continue;
        }
        if (rc < 0)
            return rc;
        if (h.type == LOCO_FRAME_COMMIT) {
            int64_t cs = commit_step(payload, h.payload_len);
            loco_free(payload);
            if (cs == step) {
                *v = LOCO_VERDICT_COMMIT;
                return 0;
            }
            continue;
        }
        if (h.type == LOCO_FRAME_BYE) {
            loco_free(payload);
            *v = LOCO_VERDICT_FINISHED;
            return 0;
        }
        if (h.type != LOCO_FRAME_QUORUM) {
            loco_free(payload);
            continue;
        }
        loco_quorum_fini(q);
        rc = loco_quorum_from_json(q, payload, h.payload_len);
        loco_free(payload);
        LOCO_CHECK(rc);
        s->progress.epoch = q->epoch;
        if (q->join) {
            *v = LOCO_VERDICT_JOIN;
            return 0;
        }
        if (q->outer_step == 0) {
            *v = LOCO_VERDICT_AGAIN;
            return 0;
        }
    }
}

void loco_session_ready_ahead(loco_session *s, int64_t step, int64_t have) {
    if (!s->broken && send_outer(s, "ready", step, have, 0, 0, 0) == 0)
        s->ready_sent = step;
}

void loco_session_done_ahead(loco_session *s, int64_t step, uint64_t epoch, bool ok,
                             uint64_t hash, uint64_t suspects) {
    if (!s->broken &&
        send_outer(s, ok ? "done" : "failed", step, 0, epoch, hash, suspects) == 0) {
        s->done_sent = step;
        s->done_sent_epoch = epoch;
    }
}

void loco_session_progress(loco_session *s, const loco_island_progress *p) {
    uint64_t epoch = s->progress.epoch;
    s->progress = *p;
    if (!p->epoch)
        s->progress.epoch = epoch;
}

int loco_session_heartbeat(loco_session *s, int64_t inner_step) {
    atomic_store(&s->inner_step, inner_step);
    return 0;
}

int loco_session_poll(loco_session *s) {
    if (s->broken) {
        /* One attempt when the back-off allows: training goes on meanwhile. */
        if (reconnect(s) < 0)
            return 0;
    }
    bool refused;
    int rc = drain(s, true, &refused);
    if (rc == LOCO_ETIMEDOUT)
        return 0;
    if (refused)
        return rc; /* the coordinator stopped the run */
    loco_warn("session: lost the coordinator (%s)", loco_errmsg());
    pthread_mutex_lock(&s->mu);
    s->broken = true;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int loco_session_leave(loco_session *s, int timeout_ms) {
    stop_beats(s);
    if (s->finished)
        return 0; /* the run ended while this island was outside the quorum */
    const double patience = patience_s(s, timeout_ms);
    double deadline = loco_now() + patience;
    bool sent = send_locked(s, LOCO_FRAME_BYE, NULL) == 0;
    for (;;) {
        if (loco_now() > deadline)
            return LOCO_ERR(LOCO_ETIMEDOUT, "no final word from the coordinator within %.0f s",
                            patience);
        loco_frame_hdr h;
        void *payload = NULL;
        int rc = next_frame(s, &h, &payload, 100, deadline);
        if (rc == LOCO_ETIMEDOUT) {
            if (!sent || s->broken)
                sent = send_locked(s, LOCO_FRAME_BYE, NULL) == 0;
            continue;
        }
        loco_free(payload);
        if (rc < 0) {
            /* Gone (LOCO_ETIMEDOUT, as when it stays silent), unless it
             * stopped the run. */
            char why[512];
            snprintf(why, sizeof why, "%s", loco_errmsg());
            return LOCO_ERR(s->stopped ? rc : LOCO_ETIMEDOUT,
                            "no final word from the coordinator: %s", why);
        }
        if (h.type == LOCO_FRAME_BYE)
            return 0;
    }
}
