/* The all-gather exchange of encoded pseudo-gradients over net/ links, as a
 * pipeline: a sender thread encodes chunk after chunk and queues each to
 * every peer (the links' own threads put them on the wire), while this
 * thread takes the chunks as they arrive and decodes them, per chunk in
 * ascending island order. Encoding, transmission and decoding overlap. */
#include "outer/outer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

typedef struct {
    loco_outer *o;
    const loco_exchange *x;
    int64_t step;
    size_t n_chunks, raw;
    const void **bytes; /* (n_chunks) own encoded chunks */
    size_t *lens;
    atomic_size_t encoded; /* chunks encoded and published */
    atomic_int abort;      /* the receiver gave up */
    int rc;
    size_t sent;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} pipeline;

static void *sender(void *arg) {
    pipeline *p = arg;
    const loco_exchange *x = p->x;
    for (size_t c = 0; c < p->n_chunks && !atomic_load(&p->abort); c++) {
        const void *b;
        size_t len;
        p->rc = loco_outer_encode_chunk(p->o, 0, c, &b, &len);
        if (p->rc < 0)
            break;
        p->bytes[c] = b;
        p->lens[c] = len;
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->encoded, c + 1);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        for (int k = 0; k < x->n_islands && p->rc == 0; k++) {
            if (k == x->me)
                continue;
            loco_frame_hdr h = {.type = LOCO_FRAME_PSEUDOGRAD, .epoch = x->epoch,
                                .step = (uint64_t)p->step, .shard = x->shard,
                                .chunk = (uint32_t)c, .n_chunks = (uint32_t)p->n_chunks,
                                .raw_len = p->raw};
            p->rc = loco_link_send(x->peers[k], &h, b, len);
            p->sent += len;
        }
        if (p->rc < 0)
            break;
    }
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->abort, p->rc < 0 ? 1 : atomic_load(&p->abort));
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Waits until the sender published chunk c (or failed). */
static int wait_encoded(pipeline *p, size_t c) {
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->encoded) <= c && !atomic_load(&p->abort))
        pthread_cond_wait(&p->cv, &p->mu);
    int ok = atomic_load(&p->encoded) > c;
    pthread_mutex_unlock(&p->mu);
    return ok ? 0 : LOCO_ERR(LOCO_EIO, "outer: the sender stopped");
}

/* The next frame of peer k must be chunk c of this step, epoch and shard. */
static int recv_chunk(const pipeline *p, int k, size_t c, void **payload, size_t *len) {
    const loco_exchange *x = p->x;
    loco_frame_hdr h;
    int rc = loco_link_recv(x->peers[k], &h, payload, x->timeout_ms);
    if (rc < 0)
        return LOCO_ERR(rc, "outer step %lld: island %d: %s", (long long)p->step, k,
                        loco_errmsg());
    if (h.type != LOCO_FRAME_PSEUDOGRAD || h.epoch != x->epoch || h.step != (uint64_t)p->step ||
        h.shard != x->shard || h.chunk != c || h.n_chunks != p->n_chunks) {
        loco_warn("outer step %lld: refused a %s frame from island %d (epoch %llu step %llu "
                  "shard %u chunk %u/%u; expected epoch %llu shard %u chunk %zu/%zu)",
                  (long long)p->step, loco_frame_type_name(h.type), k,
                  (unsigned long long)h.epoch, (unsigned long long)h.step, h.shard, h.chunk,
                  h.n_chunks, (unsigned long long)x->epoch, x->shard, c, p->n_chunks);
        loco_free(*payload);
        *payload = NULL;
        return LOCO_ERR(LOCO_EPROTO, "outer step %lld: stale or misdirected frame from island %d",
                        (long long)p->step, k);
    }
    *len = h.payload_len;
    return 0;
}

int loco_outer_step_allgather(loco_outer *o, const loco_exchange *x, float *theta_local,
                              int64_t step, loco_exchange_stats *st) {
    loco_exchange_stats s = {0};
    if (x->n_islands > LOCO_MAX_PEERS || x->me < 0 || x->me >= x->n_islands)
        return LOCO_ERR(LOCO_EINVAL, "island %d of %d (at most %d)", x->me, x->n_islands,
                        LOCO_MAX_PEERS);
    double t0 = loco_now();
    pipeline p = {.o = o, .x = x, .step = step, .raw = loco_outer_size(o) * sizeof(float)};
    LOCO_CHECK(loco_outer_plan(o, theta_local, step, &p.n_chunks));
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
    pthread_t th;
    int rc = 0;
    if (pthread_create(&th, NULL, sender, &p) != 0) {
        rc = LOCO_ERR(LOCO_EIO, "cannot start the exchange sender");
        goto out;
    }
    for (size_t c = 0; c < p.n_chunks && rc == 0; c++) {
        for (int k = 0; k < x->n_islands && rc == 0; k++) {
            if (k == x->me) {
                rc = wait_encoded(&p, c);
                if (rc == 0)
                    rc = loco_outer_add_chunk(o, 1, k, p.bytes[c], p.lens[c]);
                continue;
            }
            void *payload = NULL;
            size_t len = 0;
            rc = recv_chunk(&p, k, c, &payload, &len);
            if (rc == 0) {
                s.bytes_received += len;
                rc = loco_outer_add_chunk(o, 1, k, payload, len);
            }
            loco_free(payload);
        }
    }
    if (rc < 0)
        atomic_store(&p.abort, 1);
    pthread_join(th, NULL);
    if (rc == 0 && p.rc < 0)
        rc = p.rc;
    double t1 = loco_now();
    if (rc == 0)
        rc = loco_outer_apply(o, theta_local);
    s.raw_bytes = p.raw;
    for (size_t c = 0; c < p.n_chunks && rc == 0; c++)
        s.encoded_bytes += p.lens[c];
    s.bytes_sent = p.sent;
    s.exchange_s = t1 - t0;
    s.apply_s = loco_now() - t1;
out:
    pthread_mutex_destroy(&p.mu);
    pthread_cond_destroy(&p.cv);
    loco_free(p.bytes);
    loco_free(p.lens);
    if (st)
        *st = s;
    return rc;
}
