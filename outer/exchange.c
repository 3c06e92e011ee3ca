/* The exchanges of encoded pseudo-gradients over net/ links, as pipelines:
 * a sender thread encodes chunk after chunk and queues each to its
 * destinations (the links' own threads put them on the wire), while this
 * thread takes the chunks as they arrive and decodes them, per chunk in
 * ascending island order. Encoding, transmission and decoding overlap.
 *
 * All-gather: every island sends every chunk to every other island and
 * reduces all of them. Reduce-scatter + all-gather: chunk c belongs to
 * reducer owner(c) (contiguous pieces); stage 1 sends each chunk to its
 * reducer only, stage 2 the reducer re-encodes its averaged chunks for
 * everyone. Frames of stage 2 carry chunk numbers n_chunks + c.
 *
 * Deadlock freedom: every island consumes frames in one global order (chunk
 * by chunk), and each link delivers a sender's frames in the order sent,
 * which is that same order; so the earliest frame anyone waits for is never
 * stuck behind a frame nobody will read. */
#include "outer/outer.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

typedef int (*encode_fn)(loco_outer *o, int worker, size_t chunk, const void **bytes,
                         size_t *len);

typedef struct {
    loco_outer *o;
    const loco_exchange *x;
    float *theta_local; /* updated chunk by chunk as chunks complete */
    int64_t step;
    size_t n_chunks, raw;
    bool rsag;
    int stage;             /* 1 or 2 */
    encode_fn encode;
    const void **bytes;    /* (n_chunks) own encoded chunks of this stage */
    size_t *lens;
    atomic_size_t encoded; /* chunks of this stage published (in send order) */
    atomic_int abort;
    int rc;
    size_t sent;
    double encode_s; /* wall seconds of the sender's encode calls */
    int bad_peer;    /* contributor whose link failed, -1 */
    pthread_mutex_t mu;
    pthread_cond_t cv;
} pipeline;

/* Reducer of chunk c among K islands. */
static int owner(size_t c, size_t n_chunks, int K) {
    return (int)(c * (size_t)K / n_chunks);
}

/* Does this island encode chunk c in this stage, and for whom (-1 = all)? */
static bool encodes(const pipeline *p, size_t c, int *dest) {
    *dest = -1;
    if (!p->rsag)
        return true;
    int own = owner(c, p->n_chunks, p->x->n_islands);
    if (p->stage == 1) {
        *dest = own;
        return true;
    }
    return own == p->x->me;
}

static void *sender(void *arg) {
    pipeline *p = arg;
    const loco_exchange *x = p->x;
    for (size_t c = 0; c < p->n_chunks && !atomic_load(&p->abort); c++) {
        int dest;
        if (!encodes(p, c, &dest))
            continue;
        const void *b;
        size_t len;
        const double te = loco_now();
        p->rc = p->encode(p->o, 0, c, &b, &len);
        p->encode_s += loco_now() - te;
        if (p->rc < 0)
            break;
        p->bytes[c] = b;
        p->lens[c] = len;
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->encoded, c + 1);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        for (int k = 0; k < x->n_islands && p->rc == 0; k++) {
            if (k == x->me || (dest >= 0 && k != dest))
                continue;
            size_t base = p->stage == 2 ? p->n_chunks : 0;
            loco_frame_hdr h = {.type = LOCO_FRAME_PSEUDOGRAD, .epoch = x->epoch,
                                .step = (uint64_t)p->step, .shard = x->shard,
                                .chunk = (uint32_t)(base + c),
                                .n_chunks = (uint32_t)(p->rsag ? 2 * p->n_chunks : p->n_chunks),
                                .raw_len = p->raw};
            p->rc = loco_link_send(x->peers[k], &h, b, len);
            p->sent += len;
        }
        /* Islands joining at this step hear every contribution. */
        for (int k = 0; k < x->n_observers && p->rc == 0 && !p->rsag; k++) {
            loco_frame_hdr h = {.type = LOCO_FRAME_PSEUDOGRAD, .epoch = x->epoch,
                                .step = (uint64_t)p->step, .shard = x->shard,
                                .chunk = (uint32_t)c, .n_chunks = (uint32_t)p->n_chunks,
                                .raw_len = p->raw};
            p->rc = loco_link_send(x->observers[k], &h, b, len);
            p->sent += len;
        }
        if (p->rc < 0)
            break;
    }
    pthread_mutex_lock(&p->mu);
    if (p->rc < 0)
        atomic_store(&p->abort, 1);
    atomic_store(&p->encoded, p->n_chunks); /* done: wake any waiter */
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Waits until the sender published chunk c (or failed). */
/* The next frame from peer k within x->timeout_ms, in slices so that a
 * cancelled attempt (loco_exchange.cancelled) ends without waiting out a
 * peer that will never send. */
static int recv_frame(const loco_exchange *x, int k, loco_frame_hdr *h, void **payload) {
    const double deadline = loco_now() + x->timeout_ms / 1e3;
    for (;;) {
        const double left_ms = (deadline - loco_now()) * 1e3;
        const int slice = !x->cancelled ? x->timeout_ms
                          : left_ms < LOCO_EXCHANGE_POLL_MS ? (int)fmax(left_ms, 0)
                                                           : LOCO_EXCHANGE_POLL_MS;
        const int rc = loco_link_recv(x->peers[k], h, payload, slice);
        if (rc != LOCO_ETIMEDOUT || !x->cancelled || left_ms <= slice)
            return rc;
        if (x->cancelled(x->cancel_ctx))
            return LOCO_ERR(LOCO_EPEER, "the coordinator that started this attempt is gone");
        loco_err_clear();
    }
}

static int wait_encoded(pipeline *p, size_t c) {
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->encoded) <= c && !atomic_load(&p->abort))
        pthread_cond_wait(&p->cv, &p->mu);
    int ok = !atomic_load(&p->abort) && p->bytes[c];
    pthread_mutex_unlock(&p->mu);
    return ok ? 0 : LOCO_ERR(LOCO_EIO, "outer: the sender stopped: %s", loco_strerror(p->rc));
}

/* The next frame of peer k must be frame `chunk` of this step, epoch, shard. */
static int recv_chunk(const pipeline *p, int k, size_t chunk, void **payload, size_t *len) {
    const loco_exchange *x = p->x;
    const size_t total = p->rsag ? 2 * p->n_chunks : p->n_chunks;
    loco_frame_hdr h;
    int rc = recv_frame(x, k, &h, payload);
    if (rc < 0) {
        ((pipeline *)p)->bad_peer = k;
        return LOCO_ERR(rc, "outer step %lld: island %d: %s", (long long)p->step, k,
                        loco_errmsg());
    }
    if (h.type != LOCO_FRAME_PSEUDOGRAD || h.epoch != x->epoch || h.step != (uint64_t)p->step ||
        h.shard != x->shard || h.chunk != chunk || h.n_chunks != total) {
        loco_warn("outer step %lld: refused a %s frame from island %d (epoch %llu step %llu "
                  "shard %u chunk %u/%u; expected epoch %llu shard %u chunk %zu/%zu)",
                  (long long)p->step, loco_frame_type_name(h.type), k,
                  (unsigned long long)h.epoch, (unsigned long long)h.step, h.shard, h.chunk,
                  h.n_chunks, (unsigned long long)x->epoch, x->shard, chunk, total);
        loco_free(*payload);
        *payload = NULL;
        ((pipeline *)p)->bad_peer = k;
        return LOCO_ERR(LOCO_EPROTO, "outer step %lld: stale or misdirected frame from island %d",
                        (long long)p->step, k);
    }
    *len = h.payload_len;
    return 0;
}

/* Island k's share of a chunk; a refused one (outer.h) fails the step
 * with island k as the peer to drop. */
static int add_share(pipeline *p, int k, const void *bytes, size_t len) {
    int rc = loco_outer_add_chunk(p->o, 1, k, bytes, len);
    if (rc == LOCO_EREFUSED)
        p->bad_peer = loco_outer_refused(p->o);
    return rc;
}

static int start(pipeline *p, pthread_t *th, int stage, encode_fn fn) {
    p->stage = stage;
    p->encode = fn;
    atomic_store(&p->encoded, 0);
    memset(p->bytes, 0, p->n_chunks * sizeof *p->bytes);
    if (pthread_create(th, NULL, sender, p) != 0)
        return LOCO_ERR(LOCO_EIO, "cannot start the exchange sender");
    return 0;
}

static int finish(pipeline *p, pthread_t th, int rc) {
    if (rc < 0)
        atomic_store(&p->abort, 1);
    pthread_join(th, NULL);
    return rc < 0 ? rc : p->rc;
}

/* Stage 1 of either algorithm: reduce the chunks this island reduces. */
static int reduce_stage(pipeline *p, loco_exchange_stats *s) {
    const loco_exchange *x = p->x;
    int rc = 0;
    for (size_t c = 0; c < p->n_chunks && rc == 0; c++) {
        if (p->rsag && owner(c, p->n_chunks, x->n_islands) != x->me)
            continue;
        for (int k = 0; k < x->n_islands && rc == 0; k++) {
            if (k == x->me) {
                rc = wait_encoded(p, c);
                if (rc == 0)
                    rc = add_share(p, k, p->bytes[c], p->lens[c]);
                continue;
            }
            void *payload = NULL;
            size_t len = 0;
            rc = recv_chunk(p, k, c, &payload, &len);
            if (rc == 0) {
                s->bytes_received += len;
                rc = add_share(p, k, payload, len);
            }
            loco_free(payload);
        }
        /* All-gather: chunk c is final; update it while the rest arrive. */
        if (rc == 0 && !p->rsag)
            rc = loco_outer_apply_chunk(p->o, c, p->theta_local);
    }
    return rc;
}

/* Stage 2 of reduce-scatter + all-gather: every reduced chunk from its
 * reducer (own ones from own bytes). */
static int gather_stage(pipeline *p, loco_exchange_stats *s) {
    const loco_exchange *x = p->x;
    int rc = 0;
    for (size_t c = 0; c < p->n_chunks && rc == 0; c++) {
        int k = owner(c, p->n_chunks, x->n_islands);
        if (k == x->me) {
            rc = wait_encoded(p, c);
            if (rc == 0)
                rc = loco_outer_rs_add(p->o, 1, c, p->bytes[c], p->lens[c]);
            if (rc == 0)
                rc = loco_outer_apply_chunk(p->o, c, p->theta_local);
            continue;
        }
        void *payload = NULL;
        size_t len = 0;
        rc = recv_chunk(p, k, p->n_chunks + c, &payload, &len);
        if (rc == 0) {
            s->bytes_received += len;
            rc = loco_outer_rs_add(p->o, 1, c, payload, len);
            if (rc == LOCO_EREFUSED)
                p->bad_peer = k; /* its reducer */
        }
        loco_free(payload);
        if (rc == 0)
            rc = loco_outer_apply_chunk(p->o, c, p->theta_local);
    }
    return rc;
}

/* An island joining at this step: every contributor's chunks, in
 * contributor order, averaged and applied like everyone else does. */
/* What every contributor sends ahead of its chunks: its link estimate
 * (RTT, -bandwidth) and the tokens it trained on since its last outer step. */
#define EST_N 3

/* Every other contributor's estimate frame: the largest RTT and -bandwidth
 * into agreed (when not NULL); under outer.weighting = tokens (x->tokens >
 * 0) each one's tokens weigh its contribution to this average. */
static int recv_estimates(pipeline *p, double agreed[2]) {
    const loco_exchange *x = p->x;
    double tokens[LOCO_MAX_PEERS] = {0};
    if (x->me >= 0)
        tokens[x->me] = x->tokens;
    int rc = 0;
    for (int k = 0; k < x->n_islands && rc == 0; k++) {
        if (k == x->me)
            continue;
        loco_frame_hdr h;
        void *in = NULL;
        rc = recv_frame(x, k, &h, &in);
        if (rc < 0) {
            p->bad_peer = k;
            rc = LOCO_ERR(rc, "outer step %lld: island %d: %s", (long long)p->step, k,
                          loco_errmsg());
        } else if (h.type != LOCO_FRAME_HEARTBEAT || h.step != (uint64_t)p->step ||
                   h.epoch != x->epoch || h.payload_len != EST_N * sizeof(double)) {
            rc = LOCO_ERR(LOCO_EPROTO, "outer step %lld: island %d sent a %s frame (step %llu) "
                                       "where its link estimate belongs",
                          (long long)p->step, k, loco_frame_type_name(h.type),
                          (unsigned long long)h.step);
        } else {
            double theirs[EST_N];
            memcpy(theirs, in, sizeof theirs);
            if (agreed) {
                agreed[0] = fmax(agreed[0], theirs[0]);
                agreed[1] = fmax(agreed[1], theirs[1]);
            }
            tokens[k] = theirs[2];
        }
        loco_free(in);
    }
    if (rc == 0 && x->tokens > 0)
        rc = loco_outer_set_weights(p->o, tokens);
    return rc;
}

static int observe(loco_outer *o, const loco_exchange *x, float *theta_local, int64_t step,
                   loco_exchange_stats *st) {
    loco_exchange_stats s = {0};
    double t0 = loco_now();
    if (x->redo)
        loco_outer_restore(o);
    else
        loco_outer_save(o);
    const loco_codec_params *cp = loco_codec_get_params(loco_outer_codec(o));
    pipeline p = {.o = o, .x = x, .theta_local = theta_local, .step = step,
                  .raw = loco_outer_size(o) * sizeof(float), .bad_peer = -1,
                  .n_chunks = loco_compress_chunk_count(loco_outer_size(o), cp)};
    loco_outer_begin_average(o, x->n_islands);
    int rc = recv_estimates(&p, NULL);
    for (size_t c = 0; c < p.n_chunks && rc == 0; c++) {
        for (int k = 0; k < x->n_islands && rc == 0; k++) {
            void *payload = NULL;
            size_t len = 0;
            rc = recv_chunk(&p, k, c, &payload, &len);
            if (rc == 0) {
                s.bytes_received += len;
                rc = add_share(&p, k, payload, len);
            }
            loco_free(payload);
        }
        if (rc == 0)
            rc = loco_outer_apply_chunk(o, c, theta_local);
    }
    double t1 = loco_now();
    if (rc == 0)
        rc = loco_outer_apply(o, theta_local);
    s.raw_bytes = p.raw;
    s.exchange_s = t1 - t0;
    s.apply_s = loco_now() - t1;
    s.failed_peer = p.bad_peer;
    s.delta_ratio = loco_outer_delta_ratio(o);
    if (st)
        *st = s;
    return rc;
}

static int step_impl(loco_outer *o, const loco_exchange *x, bool rsag, float *theta_local,
                     int64_t step, loco_exchange_stats *st) {
    loco_exchange_stats s = {0};
    if (x->n_islands > LOCO_MAX_PEERS || x->me >= x->n_islands || x->n_observers < 0 ||
        x->n_islands + x->n_observers > LOCO_MAX_PEERS)
        return LOCO_ERR(LOCO_EINVAL, "island %d of %d + %d (at most %d)", x->me, x->n_islands,
                        x->n_observers, LOCO_MAX_PEERS);
    if (x->me < 0)
        return observe(o, x, theta_local, step, st);
    if (rsag && x->n_observers > 0)
        return LOCO_ERR(LOCO_EINVAL, "outer: islands joining a step need the all-gather exchange");
    double t0 = loco_now();
    pipeline p = {.o = o, .x = x, .theta_local = theta_local, .step = step, .rsag = rsag,
                  .raw = loco_outer_size(o) * sizeof(float), .bad_peer = -1};
    if (x->redo) {
        loco_outer_restore(o);
        p.n_chunks = loco_outer_planned_chunks(o);
    } else {
        loco_outer_save(o);
        LOCO_CHECK(loco_outer_plan(o, theta_local, step, &p.n_chunks));
    }
    p.bytes = loco_alloc((p.n_chunks ? p.n_chunks : 1) * sizeof *p.bytes);
    p.lens = loco_alloc((p.n_chunks ? p.n_chunks : 1) * sizeof *p.lens);
    if (!p.bytes || !p.lens) {
        loco_free(p.bytes);
        loco_free(p.lens);
        return LOCO_ERR(LOCO_ENOMEM, "exchange tables");
    }
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    loco_outer_begin_average(o, x->n_islands);
    /* Link estimates and token counts travel ahead of the chunks (the same
     * links keep the order): to every peer and observer; they come back
     * while the first chunks are encoded. */
    const double est[EST_N] = {x->est_rtt_s, -x->est_bytes_per_s, x->tokens};
    int rc = 0;
    for (int k = 0; k < x->n_islands + x->n_observers && rc == 0; k++) {
        if (k == x->me)
            continue;
        loco_frame_hdr h = {.type = LOCO_FRAME_HEARTBEAT, .epoch = x->epoch,
                            .step = (uint64_t)step, .shard = x->shard};
        rc = loco_link_send(k < x->n_islands ? x->peers[k] : x->observers[k - x->n_islands], &h,
                            est, sizeof est);
    }
    pthread_t th;
    if (rc == 0)
        rc = start(&p, &th, 1, x->redo ? loco_outer_reuse_chunk : loco_outer_encode_chunk);
    if (rc < 0)
        goto out;
    double agreed[2] = {est[0], est[1]};
    rc = recv_estimates(&p, agreed);
    s.agreed_rtt_s = agreed[0];
    s.agreed_bytes_per_s = -agreed[1];
    rc = finish(&p, th, rc == 0 ? reduce_stage(&p, &s) : rc);
    for (size_t c = 0; c < p.n_chunks; c++)
        s.encoded_bytes += p.bytes[c] ? p.lens[c] : 0;
    s.sender_encode_s = p.encode_s;
    s.zstd = loco_outer_planned_zstd(o);
    if (rc == 0 && rsag) {
        rc = loco_outer_rs_plan(o, step);
        if (rc == 0)
            rc = start(&p, &th, 2, loco_outer_rs_encode_chunk);
        if (rc == 0)
            rc = finish(&p, th, gather_stage(&p, &s));
    }
out:;
    double t1 = loco_now();
    if (rc == 0)
        rc = loco_outer_apply(o, theta_local);
    s.raw_bytes = p.raw;
    s.bytes_sent = p.sent;
    s.failed_peer = p.bad_peer;
    s.delta_ratio = loco_outer_delta_ratio(o);
    s.exchange_s = t1 - t0;
    s.apply_s = loco_now() - t1;
    /* zstd=auto times its choice (a redo only resent bytes). */
    if (rc == 0 && !x->redo)
        loco_codec_note_exchange(loco_outer_codec(o), s.zstd, s.exchange_s, loco_outer_size(o));
    pthread_mutex_destroy(&p.mu);
    pthread_cond_destroy(&p.cv);
    loco_free(p.bytes);
    loco_free(p.lens);
    if (st)
        *st = s;
    return rc;
}

int loco_outer_step_allgather(loco_outer *o, const loco_exchange *x, float *theta_local,
                              int64_t step, loco_exchange_stats *st) {
    return step_impl(o, x, false, theta_local, step, st);
}

int loco_outer_step_rsag(loco_outer *o, const loco_exchange *x, float *theta_local,
                         int64_t step, loco_exchange_stats *st) {
    return step_impl(o, x, true, theta_local, step, st);
}

loco_exchange_algo loco_exchange_choose(int n_islands, size_t n_chunks, double encoded_bytes,
                                        double rtt_s, double bytes_per_s, char *why,
                                        size_t why_cap) {
    const double K = n_islands;
    /* All-gather: one round, each island sends its whole shard to K-1
     * peers. Reduce-scatter + all-gather: two rounds; the busiest reducer
     * (the most chunks, ceil(chunks/K)) receives and then sends K-1 copies
     * of its part, so few chunks leave little to gain. */
    const double part = n_chunks ? (double)((n_chunks + (size_t)n_islands - 1) / (size_t)n_islands) /
                                       (double)n_chunks
                                 : 1.0;
    const double ag = rtt_s / 2 + (K - 1) * encoded_bytes / bytes_per_s;
    const double rs = rtt_s + 2 * (K - 1) * part * encoded_bytes / bytes_per_s;
    loco_exchange_algo a = n_islands > 2 && rs < ag ? LOCO_EXCHANGE_RSAG : LOCO_EXCHANGE_ALLGATHER;
    if (why)
        snprintf(why, why_cap,
                 "%d islands, %.1f MB per shard in %zu chunks, RTT %.1f ms, %.2f Gbit/s: "
                 "all-gather ~%.3f s, reduce-scatter + all-gather ~%.3f s",
                 n_islands, encoded_bytes / 1e6, n_chunks, rtt_s * 1e3, bytes_per_s * 8 / 1e9, ag,
                 rs);
    return a;
}

/* One ping-pong of `len` payload bytes with peer k; *s receives the round
 * trip as seen by the side that pings. */
static int ping(const loco_exchange *x, int k, bool first, size_t len, const void *payload,
                double *s) {
    loco_frame_hdr h = {.type = LOCO_FRAME_HEARTBEAT, .epoch = x->epoch, .shard = x->shard};
    void *in = NULL;
    double t0 = loco_now();
    if (first) {
        LOCO_CHECK(loco_link_send(x->peers[k], &h, payload, len));
        LOCO_CHECK(loco_link_recv(x->peers[k], &h, &in, x->timeout_ms));
    } else {
        LOCO_CHECK(loco_link_recv(x->peers[k], &h, &in, x->timeout_ms));
        t0 = loco_now();
        LOCO_CHECK(loco_link_send(x->peers[k], &h, in, h.payload_len));
    }
    loco_free(in);
    if (h.type != LOCO_FRAME_HEARTBEAT)
        return LOCO_ERR(LOCO_EPROTO, "link probe: island %d sent a %s frame", k,
                        loco_frame_type_name(h.type));
    *s = loco_now() - t0;
    return 0;
}

int loco_exchange_probe(const loco_exchange *x, size_t probe_bytes, double *rtt_s,
                        double *bytes_per_s) {
    unsigned char *buf = loco_alloc(probe_bytes ? probe_bytes : 1);
    if (!buf)
        return LOCO_ERR(LOCO_ENOMEM, "probe buffer");
    double rtt = 0, bw = INFINITY;
    int rc = 0;
    /* Pairs in one global order (lower id pings), so nobody waits on a
     * pair its peer has not reached. */
    for (int k = 0; k < x->n_islands && rc == 0; k++) {
        if (k == x->me || !x->peers[k])
            continue;
        bool first = x->me < k;
        double empty = 0, full = 0;
        /* The first ping waits until the peer reaches this pair; the
         * second measures. */
        rc = ping(x, k, first, 0, NULL, &empty);
        if (rc == 0)
            rc = ping(x, k, first, 0, NULL, &empty);
        if (rc == 0)
            rc = ping(x, k, first, probe_bytes, buf, &full);
        if (rc == 0 && first) {
            rtt = fmax(rtt, empty);
            if (full > empty)
                bw = fmin(bw, (double)probe_bytes / (full - empty));
        }
    }
    /* Agree with every peer: the largest RTT and the smallest bandwidth
     * any pinging side saw. */
    double mine[2] = {rtt, -bw};
    for (int k = 0; k < x->n_islands && rc == 0; k++) {
        if (k == x->me || !x->peers[k])
            continue;
        loco_frame_hdr h = {.type = LOCO_FRAME_HEARTBEAT, .epoch = x->epoch, .shard = x->shard};
        rc = loco_link_send(x->peers[k], &h, mine, sizeof mine);
    }
    double agreed[2] = {rtt, -bw};
    for (int k = 0; k < x->n_islands && rc == 0; k++) {
        if (k == x->me || !x->peers[k])
            continue;
        loco_frame_hdr h;
        void *in = NULL;
        rc = loco_link_recv(x->peers[k], &h, &in, x->timeout_ms);
        if (rc == 0 && (h.type != LOCO_FRAME_HEARTBEAT || h.payload_len != sizeof mine))
            rc = LOCO_ERR(LOCO_EPROTO, "link probe: bad answer from island %d", k);
        if (rc == 0) {
            double theirs[2];
            memcpy(theirs, in, sizeof theirs);
            agreed[0] = fmax(agreed[0], theirs[0]);
            agreed[1] = fmax(agreed[1], theirs[1]);
        }
        loco_free(in);
    }
    loco_free(buf);
    *rtt_s = agreed[0];
    *bytes_per_s = -agreed[1];
    return rc;
}
