/* One rank's peer service: the listener its peer islands connect to, a
 * thread that accepts their links (kept until the main thread asks for
 * them, by island and quorum epoch) and serves state transfers to
 * rejoining islands from the committed θ_global and momentum; and the
 * fetching side of that transfer.
 *
 * Links belong to one quorum epoch: after any change of membership or a
 * failed exchange every island drops all its links and builds new ones, so
 * no frame of an abandoned attempt can be mistaken for one of the next. */
#include "outer/outer.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STASH 64

typedef struct {
    loco_link *link;
    int from;
    uint64_t epoch;
} stashed;

struct loco_peers {
    loco_net_params np;
    loco_net_listener *listener;
    loco_outer_set o; /* the fragments' states, back to back */
    int timeout_ms;
    pthread_t thread;
    bool running;
    atomic_bool stop;
    pthread_mutex_t mu; /* stash */
    pthread_cond_t cv;
    stashed stash[STASH];
    /* The committed state requests get: a snapshot the main thread takes
     * when it publishes a commit (snap_mu held only for the copies), so a
     * transfer never waits on an outer step, nor an outer step on a slow
     * joiner. */
    pthread_mutex_t snap_mu;
    int64_t committed, inner_step;
    uint64_t hash;
    float *snap;       /* (2n) θ_global then momentum, as committed */
    loco_codec *codec; /* lossless: fp32 + zstd, no error feedback */
    float *staging;    /* (2n) the service thread's copy of snap for one transfer */
    atomic_ullong served_bytes;
    atomic_int serving;
};

int loco_state_request_parse(const void *payload, size_t len, int64_t *outer_step,
                             size_t *from) {
    cJSON *j = cJSON_ParseWithLength(payload, len);
    const cJSON *os = cJSON_GetObjectItemCaseSensitive(j, "outer_step");
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(j, "from");
    int rc = 0;
    if (!cJSON_IsNumber(os) || !cJSON_IsNumber(fr) || fr->valuedouble < 0 ||
        fr->valuedouble > LOCO_JSON_NUM_MAX || os->valuedouble < -1 || os->valuedouble > LOCO_JSON_NUM_MAX)
        rc = LOCO_ERR(LOCO_EPROTO, "STATE_REQ: malformed request");
    else {
        *outer_step = (int64_t)os->valuedouble;
        *from = (size_t)fr->valuedouble;
    }
    cJSON_Delete(j);
    return rc;
}

int loco_state_meta_parse(const void *payload, size_t len, loco_state_meta *m) {
    cJSON *j = cJSON_ParseWithLength(payload, len);
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(j, "n");
    const cJSON *jc = cJSON_GetObjectItemCaseSensitive(j, "chunks");
    const cJSON *ji = cJSON_GetObjectItemCaseSensitive(j, "inner_step");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(j, "outer_step");
    const cJSON *jh = cJSON_GetObjectItemCaseSensitive(j, "hash");
    int rc = 0;
    if (!cJSON_IsNumber(jn) || !cJSON_IsNumber(jc) || !cJSON_IsNumber(ji) ||
        !cJSON_IsNumber(jo) || !cJSON_IsString(jh) || jn->valuedouble < 0 ||
        jn->valuedouble > LOCO_JSON_NUM_MAX || jc->valuedouble < 0 || jc->valuedouble > 1e12 ||
        jo->valuedouble < 0 || jo->valuedouble > LOCO_JSON_NUM_MAX || ji->valuedouble < 0 ||
        ji->valuedouble > LOCO_JSON_NUM_MAX || strlen(jh->valuestring) != 16)
        rc = LOCO_ERR(LOCO_EPROTO, "STATE: malformed header");
    else {
        m->n = (size_t)jn->valuedouble;
        m->chunks = (size_t)jc->valuedouble;
        m->inner_step = (int64_t)ji->valuedouble;
        m->outer_step = (int64_t)jo->valuedouble;
        m->hash = strtoull(jh->valuestring, NULL, 16);
    }
    cJSON_Delete(j);
    return rc;
}

int loco_state_codec_create(loco_codec **out, size_t n) {
    loco_codec_params cp;
    loco_codec_params_default(&cp);
    cp.codec = LOCO_CODEC_NONE;
    cp.error_feedback = false;
    cp.stochastic = false;
    cp.zstd = LOCO_ZSTD_ON;
    cp.zstd_level = 1;
    cp.threads = 1;
    cp.n_state = 2 * n;
    return loco_codec_create(out, &cp);
}

/* Sends the committed state from chunk `from` on. Runs on the service
 * thread, from its own copy of the snapshot: no lock is held while it
 * sends. */
static void serve_state(loco_peers *p, loco_link *l, const void *req, size_t len) {
    int64_t want;
    size_t from;
    if (loco_state_request_parse(req, len, &want, &from) < 0) {
        loco_warn("refused a state request from %s: %s", loco_link_peer_name(l), loco_errmsg());
        return;
    }
    const size_t n = loco_outer_set_size(&p->o);
    atomic_store(&p->serving, 1);
    char text[256];
    int rc = 0;
    pthread_mutex_lock(&p->snap_mu);
    const int64_t have = p->committed, inner = p->inner_step;
    const uint64_t hash = p->hash;
    if (want < 0)
        want = have; /* the newest committed state */
    if (want == have)
        memcpy(p->staging, p->snap, 2 * n * sizeof(float));
    pthread_mutex_unlock(&p->snap_mu);
    if (want != have) {
        snprintf(text, sizeof text, "state of outer step %lld asked, this island holds %lld",
                 (long long)want, (long long)have);
        loco_frame_hdr h = {.type = LOCO_FRAME_ERROR};
        if (loco_link_send(l, &h, text, strlen(text)) == 0)
            loco_link_flush(l, LOCO_LINK_FAREWELL_MS);
        goto out;
    }
    loco_encode_plan plan;
    rc = loco_codec_plan(p->codec, &plan, p->staging, 2 * n, 0, (uint64_t)want);
    char meta[256];
    snprintf(meta, sizeof meta,
             "{\"outer_step\":%lld,\"inner_step\":%lld,\"n\":%zu,\"chunks\":%zu,\"hash\":\"%016llx\"}",
             (long long)have, (long long)inner, n, plan.n_chunks, (unsigned long long)hash);
    loco_frame_hdr mh = {.type = LOCO_FRAME_STATE, .step = (uint64_t)want};
    if (rc == 0)
        rc = loco_link_send(l, &mh, meta, strlen(meta));
    void *slot = rc == 0 ? loco_alloc(plan.slot_bytes ? plan.slot_bytes : 1) : NULL;
    for (size_t c = from; rc == 0 && slot && c < plan.n_chunks; c++) {
        size_t clen;
        rc = loco_codec_encode_chunk(p->codec, 0, &plan, slot, plan.slot_bytes, &clen, p->staging,
                                     c);
        loco_frame_hdr h = {.type = LOCO_FRAME_STATE, .step = (uint64_t)want,
                            .chunk = (uint32_t)c, .n_chunks = (uint32_t)plan.n_chunks,
                            .raw_len = 2 * n * sizeof(float)};
        if (rc == 0)
            rc = loco_link_send(l, &h, slot, clen);
        atomic_fetch_add(&p->served_bytes, clen);
    }
    loco_free(slot);
    if (rc == 0)
        rc = loco_link_flush(l, p->timeout_ms);
    if (rc < 0)
        loco_warn("state transfer to %s stopped: %s", loco_link_peer_name(l), loco_errmsg());
    else
        loco_info("served the state of outer step %lld to %s (chunks %zu..%zu)", (long long)want,
                  loco_link_peer_name(l), from, plan.n_chunks);
out:
    atomic_store(&p->serving, 0);
}

static void stash_link(loco_peers *p, loco_link *l, const void *payload, size_t len,
                       uint64_t epoch) {
    cJSON *j = cJSON_ParseWithLength(payload, len);
    const cJSON *from = cJSON_GetObjectItemCaseSensitive(j, "island");
    int id = cJSON_IsNumber(from) ? from->valueint : -1;
    cJSON_Delete(j);
    if (id < 0 || id >= LOCO_MAX_PEERS) {
        loco_warn("peer link from %s without a valid island id: closed", loco_link_peer_name(l));
        loco_link_destroy(l);
        return;
    }
    pthread_mutex_lock(&p->mu);
    int slot = -1;
    for (int i = 0; i < STASH; i++) {
        stashed *s = &p->stash[i];
        /* An older link of the same island is abandoned. */
        if (s->link && s->from == id && s->epoch <= epoch) {
            loco_link_destroy(s->link);
            s->link = NULL;
        }
        if (!s->link && slot < 0)
            slot = i;
    }
    if (slot < 0) {
        loco_link_destroy(l);
    } else {
        p->stash[slot] = (stashed){.link = l, .from = id, .epoch = epoch};
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
}

static void *service(void *arg) {
    loco_peers *p = arg;
    while (!atomic_load(&p->stop)) {
        loco_link *l;
        if (loco_net_accept(p->listener, &l, 100) != 0)
            continue;
        loco_frame_hdr h;
        void *payload = NULL;
        int rc = loco_link_recv(l, &h, &payload, p->timeout_ms);
        if (rc == 0 && h.type == LOCO_FRAME_LINK) {
            stash_link(p, l, payload, h.payload_len, h.epoch);
            l = NULL;
        } else if (rc == 0 && h.type == LOCO_FRAME_STATE_REQ) {
            serve_state(p, l, payload, h.payload_len);
        } else if (rc == 0) {
            loco_warn("peer %s opened a link with a %s frame: closed", loco_link_peer_name(l),
                      loco_frame_type_name(h.type));
        }
        loco_free(payload);
        loco_link_destroy(l);
    }
    return NULL;
}

int loco_peers_create(loco_peers **out, const loco_net_params *np, const char *host,
                      const loco_outer_set *o, int timeout_ms) {
    *out = NULL;
    loco_peers *p = loco_alloc(sizeof *p);
    if (!p)
        return LOCO_ERR(LOCO_ENOMEM, "peer service");
    p->np = *np;
    p->o = *o;
    p->timeout_ms = timeout_ms;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_mutex_init(&p->snap_mu, NULL);
    const size_t n = loco_outer_set_size(o);
    int rc = loco_state_codec_create(&p->codec, n);
    if (rc == 0) {
        p->staging = loco_alloc((2 * n + 1) * sizeof(float));
        p->snap = loco_alloc((2 * n + 1) * sizeof(float));
        if (!p->staging || !p->snap)
            rc = LOCO_ERR(LOCO_ENOMEM, "state snapshot");
    }
    if (rc == 0)
        loco_peers_publish(p, 0, 0);
    if (rc == 0)
        rc = loco_net_listen(&p->listener, np, host, 0);
    if (rc == 0 && pthread_create(&p->thread, NULL, service, p) != 0)
        rc = LOCO_ERR(LOCO_EIO, "cannot start the peer service thread");
    if (rc < 0) {
        loco_peers_destroy(p);
        return rc;
    }
    p->running = true;
    *out = p;
    return 0;
}

int loco_peers_port(const loco_peers *p) { return loco_net_listener_port(p->listener); }

uint64_t loco_peers_served_bytes(loco_peers *p) { return atomic_load(&p->served_bytes); }

void loco_peers_destroy(loco_peers *p) {
    if (!p)
        return;
    if (p->running) {
        atomic_store(&p->stop, true);
        pthread_join(p->thread, NULL);
    }
    for (int i = 0; i < STASH; i++)
        loco_link_destroy(p->stash[i].link);
    loco_net_listener_destroy(p->listener);
    loco_codec_destroy(p->codec);
    loco_free(p->staging);
    loco_free(p->snap);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->snap_mu);
    loco_free(p);
}

void loco_peers_publish(loco_peers *p, int64_t committed, int64_t inner_step) {
    const size_t n = loco_outer_set_size(&p->o);
    const uint64_t hash = loco_outer_set_hash(&p->o);
    pthread_mutex_lock(&p->snap_mu);
    loco_outer_set_read(&p->o, p->snap, p->snap + n);
    p->committed = committed;
    p->inner_step = inner_step;
    p->hash = hash;
    pthread_mutex_unlock(&p->snap_mu);
}

int loco_peers_link(loco_peers *p, int me, int id, const char *site, const char *addr,
                    uint64_t epoch, loco_link **out, int timeout_ms) {
    *out = NULL;
    if (me < id) {
        char host[LOCO_ADDR_MAX];
        int port;
        LOCO_CHECK(loco_parse_hostport(addr, host, sizeof host, &port));
        loco_net_params np = p->np;
        if (np.backend == LOCO_NET_TLS)
            snprintf(np.expect_peer, sizeof np.expect_peer, "%s", site);
        loco_link *l;
        LOCO_CHECK(loco_net_connect(&l, &np, host, port, timeout_ms));
        char json[32];
        snprintf(json, sizeof json, "{\"island\":%d}", me);
        loco_frame_hdr h = {.type = LOCO_FRAME_LINK, .epoch = epoch};
        int rc = loco_link_send(l, &h, json, strlen(json));
        if (rc < 0) {
            loco_link_destroy(l);
            return rc;
        }
        *out = l;
        return 0;
    }
    /* The island above connects: wait for its link of this epoch. */
    double deadline = loco_now() + timeout_ms / 1000.0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        for (int i = 0; i < STASH; i++) {
            stashed *s = &p->stash[i];
            if (!s->link || s->from != id)
                continue;
            if (s->epoch < epoch) {
                loco_link_destroy(s->link);
                s->link = NULL;
            } else if (s->epoch == epoch) {
                if (strcmp(loco_link_peer_name(s->link), site) &&
                    p->np.backend == LOCO_NET_TLS) {
                    loco_warn("a link claiming island %d came from %s, not %s: closed", id,
                              loco_link_peer_name(s->link), site);
                    loco_link_destroy(s->link);
                    s->link = NULL;
                    continue;
                }
                *out = s->link;
                s->link = NULL;
                pthread_mutex_unlock(&p->mu);
                return 0;
            }
        }
        double left = deadline - loco_now();
        if (left <= 0)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double w = left < 0.05 ? left : 0.05;
        long ns = ts.tv_nsec + (long)(w * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    }
    pthread_mutex_unlock(&p->mu);
    return LOCO_ERR(LOCO_ETIMEDOUT, "island %d (%s) did not link within %d ms (epoch %llu)", id,
                    site, timeout_ms, (unsigned long long)epoch);
}

/* One donor: the state from chunk *have on; *have advances as chunks land. */
static int fetch_from(const loco_net_params *np0, const char *site, const char *addr,
                      int64_t *step_io, loco_codec *codec, float *dst, size_t n,
                      size_t *have, size_t *n_chunks, int64_t *inner_step, uint64_t *hash,
                      uint64_t *bytes, double *stream_s, bool *moved_on, int timeout_ms) {
    int64_t outer_step = *step_io;
    *moved_on = false;
    char host[LOCO_ADDR_MAX];
    int port;
    LOCO_CHECK(loco_parse_hostport(addr, host, sizeof host, &port));
    loco_net_params np = *np0;
    if (np.backend == LOCO_NET_TLS)
        snprintf(np.expect_peer, sizeof np.expect_peer, "%s", site);
    loco_link *l;
    LOCO_CHECK(loco_net_connect(&l, &np, host, port, timeout_ms));
    char req[96];
    snprintf(req, sizeof req, "{\"outer_step\":%lld,\"from\":%zu}", (long long)outer_step, *have);
    loco_frame_hdr h = {.type = LOCO_FRAME_STATE_REQ, .step = (uint64_t)outer_step};
    int rc = loco_link_send(l, &h, req, strlen(req));
    void *payload = NULL;
    if (rc == 0)
        rc = loco_link_recv(l, &h, &payload, timeout_ms);
    if (rc == 0 && h.type == LOCO_FRAME_ERROR) {
        *moved_on = true;
        rc = LOCO_ERR(LOCO_EPEER, "%s: %.*s", site, (int)(h.payload_len > 300 ? 300 : h.payload_len),
                      (const char *)payload);
    } else if (rc == 0) {
        loco_state_meta m;
        if (h.type != LOCO_FRAME_STATE || loco_state_meta_parse(payload, h.payload_len, &m) < 0 ||
            (outer_step >= 0 && m.outer_step != outer_step) ||
            h.step != (uint64_t)m.outer_step || m.n != n ||
            (*n_chunks && m.chunks != *n_chunks))
            rc = LOCO_ERR(LOCO_EPROTO, "%s: state header does not match (%zu elements wanted)",
                          site, n);
        else {
            *n_chunks = m.chunks;
            *inner_step = m.inner_step;
            *hash = m.hash;
            outer_step = *step_io = m.outer_step;
        }
    }
    loco_free(payload);
    const double t_data = loco_now();
    while (rc == 0 && *have < *n_chunks) {
        payload = NULL;
        rc = loco_link_recv(l, &h, &payload, timeout_ms);
        if (rc == 0 && (h.type != LOCO_FRAME_STATE || h.step != (uint64_t)outer_step ||
                        h.chunk != *have || h.n_chunks != *n_chunks))
            rc = LOCO_ERR(LOCO_EPROTO, "%s: state chunk %u where %zu was due", site, h.chunk,
                          *have);
        if (rc == 0)
            rc = loco_codec_decode_chunk(codec, 0, dst, 2 * n, 1.0f, payload, h.payload_len);
        if (rc == 0) {
            *bytes += h.payload_len;
            (*have)++;
        }
        loco_free(payload);
    }
    *stream_s += loco_now() - t_data;
    loco_link_destroy(l);
    return rc;
}

int loco_state_fetch(const loco_net_params *np, int n_donors, const char (*sites)[LOCO_NET_NAME_MAX],
                     const char (*addrs)[LOCO_ADDR_MAX], int64_t *outer_step,
                     const loco_outer_set *o, int64_t *inner_step, loco_state_stats *st, int timeout_ms) {
    const size_t n = loco_outer_set_size(o);
    if (st)
        memset(st, 0, sizeof *st);
    loco_codec *codec = NULL;
    LOCO_CHECK(loco_state_codec_create(&codec, n));
    float *dst = loco_alloc((2 * n + 1) * sizeof(float));
    if (!dst) {
        loco_codec_destroy(codec);
        return LOCO_ERR(LOCO_ENOMEM, "state buffer");
    }
    /* -0.0 + x is x for every x, +0 and -0 included: decoding by
     * accumulation then reproduces the sender's bits. */
    for (size_t i = 0; i < 2 * n; i++)
        dst[i] = -0.0f;
    size_t have = 0, n_chunks = 0;
    uint64_t bytes = 0, hash = 0;
    int64_t step = -1; /* the newest any donor has, fixed by the first answer */
    double stream_s = 0;
    int rc = LOCO_ERR(LOCO_EPEER, "no island to fetch the state from");
    double t0 = loco_now();
    int tries = 0;
    for (int k = 0; k < n_donors; k++) {
        if (have > 0 && have == n_chunks)
            break;
        tries++;
        const size_t start_chunk = have;
        bool moved_on = false;
        rc = fetch_from(np, sites[k], addrs[k], &step, codec, dst, n, &have, &n_chunks,
                        inner_step, &hash, &bytes, &stream_s, &moved_on, timeout_ms);
        if (rc == 0) {
            if (st)
                st->resumed_from = start_chunk;
            break;
        }
        if (moved_on && have > 0) {
            /* The next donor moved on: start again from its newest state. */
            for (size_t i = 0; i < 2 * n; i++)
                dst[i] = -0.0f;
            have = n_chunks = 0;
            step = -1;
        }
        loco_warn("state transfer from %s stopped after %zu of %zu chunks: %s; asking the next "
                  "island",
                  sites[k], have, n_chunks, loco_errmsg());
        loco_sleep_ms(10);
    }
    if (rc == 0) {
        loco_outer_set_write(o, dst, dst + n);
        if (loco_outer_set_hash(o) != hash)
            rc = LOCO_ERR(LOCO_EPROTO, "state of outer step %lld: hash %016llx after the "
                                       "transfer, the donor's is %016llx",
                          (long long)step, (unsigned long long)loco_outer_set_hash(o),
                          (unsigned long long)hash);
        *outer_step = step;
    }
    if (st) {
        st->seconds = loco_now() - t0;
        st->stream_s = stream_s;
        st->chunks = n_chunks;
        st->bytes = bytes;
        st->donors_tried = tries;
    }
    loco_free(dst);
    loco_codec_destroy(codec);
    return rc;
}
