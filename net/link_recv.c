/* The receive path of a link: one reader thread per stream reads frames,
 * checks them and queues them for loco_link_recv, which hands them out in
 * send order; and the link's receive memory budget (rx_fits, rx_reserve,
 * rx_release), which bounds the payload bytes a link holds.
 *
 * A reader blocks when its stream's queue is full (TCP flow control does the
 * rest); that cannot deadlock, because the next frame to hand out is always
 * at the head of its own stream's queue. The link itself, its types and its
 * locking: link.c and link_internal.h. */
#include "net/link_internal.h"

#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

/* ------------------------------------------------------------ the reader */

/* The peer ended stream s cleanly: record it and end our side too, so that
 * a peer waiting in its close (linger) is released. */
static void reader_eof(loco_link *l, stream *s) {
    pthread_mutex_lock(&l->mu);
    s->eof = true;
    const bool draining = l->draining;
    link_notify(l);
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    if (!draining)
        shutdown(s->conn->fd, SHUT_WR);
}

/* A transport failure (rc) on stream s while reading; quiet when closing. */
static void reader_fail(loco_link *l, stream *s, int rc, size_t got, bool mid_frame) {
    if (rc == LOCO__STOPPED)
        return;
    char why[512];
    if (rc == LOCO__EOF)
        loco__link_fail(l, LOCO_EPEER,
                        "stream %d: the peer closed the connection in the middle of a "
                        "frame (%zu bytes in)",
                        s->index, got);
    else
        loco__link_fail(l, rc, "stream %d: %s%s", s->index, loco__errmsg_line(why, sizeof why),
                        mid_frame ? " (in the middle of a frame)" : "");
}

static void refuse(loco_link *l, stream *s, const char *reason) {
    loco__link_fail(l, LOCO_EPROTO, "refused a frame on stream %d: %s", s->index, reason);
}

/* Whether a frame's payload may be reserved now (lock held). The frame next
 * to hand out always may: frames further ahead leave room for one frame of
 * the limit, so the link never waits on memory that only its caller can
 * free, and never holds more than its budget. */
static bool rx_fits(const loco_link *l, const loco_frame_hdr *h) {
    if (h->seq == l->recv_seq || h->payload_len == 0)
        return true;
    return l->rx_held + h->payload_len + l->recv_max <= l->budget;
}

static void rx_reserve(loco_link *l, uint64_t n) {
    l->rx_held += n;
    if (l->rx_held > l->st.rx_held_peak)
        l->st.rx_held_peak = l->rx_held;
}

static void rx_release(loco_link *l, uint64_t n) {
    pthread_mutex_lock(&l->mu);
    l->rx_held -= n;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* Reads a payload of h->payload_len bytes into a buffer that grows as they
 * arrive: a peer claiming a length it never sends costs a small buffer, not
 * the length. *got: bytes read. 0, LOCO_ENOMEM, or what loco__conn_io says. */
static int read_payload(loco_link *l, stream *s, const loco_frame_hdr *h, uint8_t **out,
                        size_t *got) {
    const size_t len = (size_t)h->payload_len;
    const double idle = io_idle(l);
    size_t cap = len < LOCO__RX_FIRST_BYTES ? len : LOCO__RX_FIRST_BYTES, have = 0;
    uint8_t *buf = len ? loco_alloc(cap) : NULL;
    *out = buf;
    *got = 0;
    if (len && !buf)
        return LOCO_ENOMEM;
    while (have < len) {
        if (have == cap) {
            const size_t grown = cap > len / LOCO__RX_GROWTH ? len : cap * LOCO__RX_GROWTH;
            uint8_t *bigger = loco_alloc(grown);
            if (!bigger)
                return LOCO_ENOMEM;
            memcpy(bigger, buf, have);
            loco_free(buf);
            *out = buf = bigger;
            cap = grown;
        }
        size_t n = 0;
        const int rc = loco__conn_io(s->conn, buf + have, cap - have, false, loco_now() + idle,
                                     idle, l->stop_fd, &n);
        have += n;
        *got = have;
        if (rc != 0)
            return rc;
    }
    return 0;
}

void *loco__link_reader_main(void *arg) {
    stream *s = arg;
    loco_link *l = s->l;
    const double idle = io_idle(l);
    char why[512];
    for (;;) {
        uint8_t hb[LOCO_FRAME_HEADER_BYTES];
        size_t got = 0;
        int rc = loco__conn_io(s->conn, hb, sizeof hb, false, 0, idle, l->stop_fd, &got);
        if (rc == LOCO__EOF && got == 0) {
            reader_eof(l, s);
            break;
        }
        if (rc != 0) {
            reader_fail(l, s, rc, got, got > 0);
            break;
        }
        loco_frame_hdr h;
        if (loco_frame_parse_header(&h, hb, sizeof hb, l->recv_max) != 0) {
            refuse(l, s, loco__errmsg_line(why, sizeof why));
            break;
        }
        if (h.type == LOCO_FRAME_HELLO) {
            refuse(l, s, "HELLO after the handshake");
            break;
        }
        if (h.seq != s->expect_seq) {
            snprintf(why, sizeof why, "frame number %llu, expected %llu on this stream",
                     (unsigned long long)h.seq, (unsigned long long)s->expect_seq);
            refuse(l, s, why);
            break;
        }
        if (l->p.run_id && h.run_id != l->p.run_id) {
            snprintf(why, sizeof why, "%s frame of run %016llx, this link is run %016llx",
                     loco_frame_type_name(h.type), (unsigned long long)h.run_id,
                     (unsigned long long)l->p.run_id);
            refuse(l, s, why);
            break;
        }
        s->expect_seq += (uint64_t)l->n;
        /* Room and budget first, memory as the bytes arrive. */
        pthread_mutex_lock(&l->mu);
        while (!l->draining && !l->stopped && (s->rq.n >= l->p.queue_frames || !rx_fits(l, &h)))
            loco__link_wait_until(l, 0);
        const bool stopped = l->stopped, reserved = !l->draining;
        if (reserved && !stopped)
            rx_reserve(l, h.payload_len);
        pthread_mutex_unlock(&l->mu);
        if (stopped)
            break;
        frame *f = loco_alloc(sizeof *f);
        if (!f) {
            rx_release(l, reserved ? h.payload_len : 0);
            loco__link_fail(l, LOCO_ENOMEM, "stream %d: no memory for a frame", s->index);
            break;
        }
        f->hdr = h;
        rc = read_payload(l, s, &h, &f->payload, &got);
        if (rc != 0) {
            frame_free(f);
            rx_release(l, reserved ? h.payload_len : 0);
            if (rc == LOCO_ENOMEM)
                loco__link_fail(l, rc, "stream %d: no memory for a frame of %llu bytes", s->index,
                                (unsigned long long)h.payload_len);
            else
                reader_fail(l, s, rc, LOCO_FRAME_HEADER_BYTES + got, true);
            break;
        }
        uint8_t *payload = f->payload;
        if (loco_frame_verify_payload(&h, payload, (size_t)h.payload_len) != 0) {
            frame_free(f);
            rx_release(l, reserved ? h.payload_len : 0);
            refuse(l, s, loco__errmsg_line(why, sizeof why));
            break;
        }
        pthread_mutex_lock(&l->mu);
        if (l->draining) {
            if (reserved)
                l->rx_held -= h.payload_len;
            frame_free(f);
        } else {
            fq_push(&s->rq, f);
            l->st.frames_recv++;
            l->st.bytes_recv += LOCO_FRAME_HEADER_BYTES + h.payload_len;
            link_notify(l);
            pthread_cond_broadcast(&l->cv);
        }
        pthread_mutex_unlock(&l->mu);
    }
    pthread_mutex_lock(&l->mu);
    s->reader_done = true;
    link_notify(l);
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* ------------------------------------------------------------------ recv */

int loco_link_recv(loco_link *l, loco_frame_hdr *h, void **payload, int timeout_ms) {
    if (!l || !h || !payload)
        return LOCO_ERR(LOCO_EINVAL, "net: recv: missing link, header or payload pointer");
    *payload = NULL;
    const double deadline = timeout_ms < 0 ? 0 : loco_now() + timeout_ms * 1e-3;
    int rc = 0;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        if (l->closing || l->closed) {
            rc = LOCO_ERR(LOCO_EINVAL, "net: link with %s is closed", l->peer);
            break;
        }
        stream *s = &l->s[l->recv_seq % (uint64_t)l->n];
        frame *f = fq_pop(&s->rq);
        if (f) {
            l->recv_seq++;
            l->rx_held -= f->hdr.payload_len; /* the caller's memory now */
            pthread_cond_broadcast(&l->cv);   /* room and budget for the readers */
            *h = f->hdr;
            *payload = f->payload;
            loco_free(f);
            break;
        }
        if (l->err) {
            rc = LOCO_ERR(l->err, "net: link with %s failed: %s", l->peer, l->errmsg);
            break;
        }
        if (s->eof || l->stopped) {
            rc = LOCO_ERR(LOCO_EPEER, "net: %s closed the link", l->peer);
            break;
        }
        if (timeout_ms == 0 || (deadline > 0 && loco_now() >= deadline)) {
            rc = LOCO_ERR(LOCO_ETIMEDOUT, "net: nothing from %s within %d ms", l->peer, timeout_ms);
            break;
        }
        loco__link_wait_until(l, deadline);
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}
