/* The all-gather exchange of encoded pseudo-gradients over net/ links. */
#include "outer/outer.h"

#include <string.h>

/* Sends one encoded message to a peer in frames of at most max_frame. */
static int send_message(const loco_exchange *x, loco_link *l, const void *bytes, size_t len,
                        int64_t step, size_t raw) {
    size_t per = x->max_frame ? x->max_frame : len;
    uint32_t n = (uint32_t)(len ? (len + per - 1) / per : 1);
    for (uint32_t i = 0; i < n; i++) {
        size_t off = (size_t)i * per, part = len - off < per ? len - off : per;
        loco_frame_hdr h = {.type = LOCO_FRAME_PSEUDOGRAD, .epoch = x->epoch,
                            .step = (uint64_t)step, .shard = x->shard, .chunk = i,
                            .n_chunks = n, .raw_len = raw};
        LOCO_CHECK(loco_link_send(l, &h, (const char *)bytes + off, part));
    }
    return 0;
}

/* Receives one peer's message for this step into a fresh buffer. */
static int recv_message(const loco_exchange *x, loco_link *l, int peer, int64_t step,
                        size_t bound, unsigned char **out, size_t *out_len) {
    unsigned char *buf = NULL;
    size_t len = 0;
    uint32_t n = 0;
    for (uint32_t i = 0;; i++) {
        loco_frame_hdr h;
        void *payload = NULL;
        int rc = loco_link_recv(l, &h, &payload, x->timeout_ms);
        if (rc < 0) {
            loco_free(buf);
            return LOCO_ERR(rc, "outer step %lld: island %d: %s", (long long)step, peer,
                            loco_errmsg());
        }
        if (h.type != LOCO_FRAME_PSEUDOGRAD || h.epoch != x->epoch ||
            h.step != (uint64_t)step || h.shard != x->shard || h.chunk != i ||
            (i > 0 && h.n_chunks != n) || h.n_chunks == 0) {
            loco_warn("outer step %lld: refused a %s frame from island %d (epoch %llu step %llu "
                      "shard %u chunk %u/%u; expected epoch %llu step %lld shard %u chunk %u)",
                      (long long)step, loco_frame_type_name(h.type), peer,
                      (unsigned long long)h.epoch, (unsigned long long)h.step, h.shard, h.chunk,
                      h.n_chunks, (unsigned long long)x->epoch, (long long)step, x->shard, i);
            loco_free(payload);
            loco_free(buf);
            return LOCO_ERR(LOCO_EPROTO, "outer step %lld: stale or misdirected frame from island %d",
                            (long long)step, peer);
        }
        if (i == 0) {
            n = h.n_chunks;
            /* Never more than an honest encoder can produce. */
            if ((uint64_t)n * (x->max_frame ? x->max_frame : bound) > bound + x->max_frame) {
                loco_free(payload);
                return LOCO_ERR(LOCO_EPROTO, "outer step %lld: island %d announces %u frames",
                                (long long)step, peer, n);
            }
            buf = loco_alloc(bound ? bound : 1);
            if (!buf) {
                loco_free(payload);
                return LOCO_ERR(LOCO_ENOMEM, "pseudo-gradient buffer");
            }
        }
        if (len + h.payload_len > bound) {
            loco_free(payload);
            loco_free(buf);
            return LOCO_ERR(LOCO_EPROTO, "outer step %lld: island %d sent more than %zu bytes",
                            (long long)step, peer, bound);
        }
        if (h.payload_len)
            memcpy(buf + len, payload, h.payload_len);
        len += h.payload_len;
        loco_free(payload);
        if (i + 1 == n)
            break;
    }
    *out = buf;
    *out_len = len;
    return 0;
}

int loco_outer_step_allgather(loco_outer *o, const loco_exchange *x, float *theta_local,
                              int64_t step, loco_exchange_stats *st) {
    loco_exchange_stats s = {0};
    double t0 = loco_now();
    const void *mine;
    size_t len, raw;
    LOCO_CHECK(loco_outer_encode(o, theta_local, step, &mine, &len, &raw));
    s.raw_bytes = raw;
    s.encoded_bytes = len;
    double t1 = loco_now();
    for (int k = 0; k < x->n_islands; k++) {
        if (k == x->me)
            continue;
        LOCO_CHECK(send_message(x, x->peers[k], mine, len, step, raw));
        s.bytes_sent += len;
    }
    unsigned char *msg[LOCO_MAX_PEERS] = {0};
    size_t mlen[LOCO_MAX_PEERS] = {0};
    const size_t bound = loco_compress_bound(loco_outer_size(o),
                                             loco_codec_get_params(loco_outer_codec(o)));
    int rc = 0;
    if (x->n_islands > LOCO_MAX_PEERS)
        return LOCO_ERR(LOCO_EINVAL, "%d islands, at most %d", x->n_islands, LOCO_MAX_PEERS);
    for (int k = 0; k < x->n_islands && rc == 0; k++)
        if (k != x->me) {
            rc = recv_message(x, x->peers[k], k, step, bound, &msg[k], &mlen[k]);
            s.bytes_received += mlen[k];
        }
    double t2 = loco_now();
    if (rc == 0) {
        loco_outer_begin_average(o, x->n_islands);
        for (int k = 0; k < x->n_islands && rc == 0; k++)
            rc = k == x->me ? loco_outer_add(o, mine, len) : loco_outer_add(o, msg[k], mlen[k]);
        if (rc == 0)
            rc = loco_outer_apply(o, theta_local);
    }
    for (int k = 0; k < x->n_islands; k++)
        loco_free(msg[k]);
    s.encode_s = t1 - t0;
    s.exchange_s = t2 - t1;
    s.apply_s = loco_now() - t2;
    if (st)
        *st = s;
    return rc;
}
