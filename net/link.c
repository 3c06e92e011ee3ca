/* A link: N established streams, a sender and a reader thread per stream,
 * bounded queues both ways, in-order delivery, WAN emulation and fault
 * injection in the sender path. This file starts a link, sends, and closes;
 * the receive path (reader threads, the receive memory budget,
 * loco_link_recv) is link_recv.c, the types and locking link_internal.h.
 *
 * Frame s of a link goes on stream s % N, so each stream carries every N-th
 * frame in order and the receiver, taking frames from stream (next % N),
 * hands them out in send order.
 *
 * One file: a link's send path, its state machine and its teardown share
 * the link's lock; the receive path is link_recv.c. */
#include "net/link_internal.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

static void fq_clear(fqueue *q) {
    frame *f;
    while ((f = fq_pop(q)))
        frame_free(f);
}

/* Waits on the link's condition until t (monotonic seconds; 0 = no limit). */
void loco__link_wait_until(loco_link *l, double t) {
    if (t <= 0) {
        pthread_cond_wait(&l->cv, &l->mu);
        return;
    }
    struct timespec ts;
    ts.tv_sec = (time_t)floor(t);
    ts.tv_nsec = (long)((t - floor(t)) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&l->cv, &l->mu, &ts);
}

/* Tells every thread to stop and shuts the sockets, so that the peer sees
 * the end at once. Queued received frames stay deliverable. */
static void link_stop(loco_link *l) {
    pthread_mutex_lock(&l->mu);
    if (!l->stopped) {
        l->stopped = true;
        const uint64_t one = 1;
        ssize_t w = write(l->stop_fd, &one, sizeof one);
        (void)w;
        for (int i = 0; i < l->n; i++)
            if (l->s[i].conn)
                shutdown(l->s[i].conn->fd, SHUT_RDWR);
        link_notify(l);
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

void loco_link_set_notify(loco_link *l, int fd) {
    pthread_mutex_lock(&l->mu);
    l->notify_fd = fd;
    bool news = l->stopped;
    for (int i = 0; i < l->n && !news; i++)
        news = l->s[i].rq.n > 0 || l->s[i].eof || l->s[i].reader_done;
    if (news)
        link_notify(l);
    pthread_mutex_unlock(&l->mu);
}

/* Records the link's first failure, logs it (unless we are closing), stops. */
void loco__link_fail(loco_link *l, int rc, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&l->mu);
    const bool first = l->err == 0 && !l->draining;
    if (first) {
        l->err = rc;
        snprintf(l->errmsg, sizeof l->errmsg, "%s", msg);
    }
    pthread_mutex_unlock(&l->mu);
    if (first)
        loco_warn("net: link with %s: %s; dropping the link", l->peer, msg);
    link_stop(l);
}

/* ------------------------------------------------------------ the sender */

/* Writes len bytes, no faster than the link's bandwidth cap. */
static int write_paced(loco_link *l, stream *s, const uint8_t *p, size_t len) {
    while (len > 0) {
        size_t n = len;
        pthread_mutex_lock(&l->mu);
        const double gbps = l->wan.gbps;
        if (gbps > 0) {
            /* The slice occupies the emulated wire for n*8/rate seconds and
             * leaves when it has been serialised. */
            n = len < LOCO__SLICE_BYTES ? len : LOCO__SLICE_BYTES;
            const double now = loco_now();
            const double start = l->bw_next > now ? l->bw_next : now;
            l->bw_next = start + (double)n * 8 / (gbps * 1e9);
            const double t = l->bw_next;
            while (!l->stopped && loco_now() < t)
                loco__link_wait_until(l, t);
        }
        const bool stopped = l->stopped;
        pthread_mutex_unlock(&l->mu);
        if (stopped)
            return LOCO__STOPPED;
        LOCO_CHECK(loco__conn_io(s->conn, (void *)p, n, true, loco_now() + io_idle(l), io_idle(l),
                                 l->stop_fd, NULL));
        p += n;
        len -= n;
    }
    return 0;
}

static int write_frame(loco_link *l, stream *s, frame *f) {
    const size_t len = (size_t)f->hdr.payload_len;
    f->hdr.payload_hash = loco_frame_hash_payload(f->payload, len);
    LOCO_CHECK(loco_frame_encode_header(s->stage, &f->hdr, l->send_max));
    const size_t first = len < LOCO__STAGE_BYTES - LOCO_FRAME_HEADER_BYTES
                             ? len
                             : LOCO__STAGE_BYTES - LOCO_FRAME_HEADER_BYTES;
    if (first)
        memcpy(s->stage + LOCO_FRAME_HEADER_BYTES, f->payload, first);
    if (f->corrupt) {
        const uint64_t pos = f->corrupt_pos % (LOCO_FRAME_HEADER_BYTES + len);
        if (pos < LOCO_FRAME_HEADER_BYTES + first)
            s->stage[pos] ^= f->corrupt_xor;
        else
            f->payload[pos - LOCO_FRAME_HEADER_BYTES] ^= f->corrupt_xor;
    }
    LOCO_CHECK(write_paced(l, s, s->stage, LOCO_FRAME_HEADER_BYTES + first));
    return write_paced(l, s, f->payload + first, len - first);
}

static void *sender_main(void *arg) {
    stream *s = arg;
    loco_link *l = s->l;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        if (l->stopped || l->err)
            break;
        frame *f = s->sq.head;
        if (!f) {
            if (l->closing)
                break;
            loco__link_wait_until(l, 0);
            continue;
        }
        if (f->release > loco_now()) {
            loco__link_wait_until(l, f->release);
            continue;
        }
        pthread_mutex_unlock(&l->mu);
        const int rc = write_frame(l, s, f);
        pthread_mutex_lock(&l->mu);
        fq_pop(&s->sq);
        l->inflight--;
        if (rc == 0) {
            l->st.frames_sent++;
            l->st.bytes_sent += LOCO_FRAME_HEADER_BYTES + f->hdr.payload_len;
        }
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        frame_free(f);
        if (rc < 0 && rc != LOCO__STOPPED) {
            char why[512];
            loco__link_fail(l, rc, "stream %d: %s", s->index, loco__errmsg_line(why, sizeof why));
        }
        pthread_mutex_lock(&l->mu);
        if (rc < 0)
            break;
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* ----------------------------------------------------------------- start */

/* Socket buffer sizes for the log line: KiB below a MiB, MiB above. */
static void fmt_kib_mib(char *buf, size_t cap, double b) {
    if (b >= (1 << 20))
        snprintf(buf, cap, "%.1f MiB", b / (1 << 20));
    else
        snprintf(buf, cap, "%.0f KiB", b / (1 << 10));
}

/* One line per link: who, how, and the socket buffers the kernel granted
 * against what the bandwidth-delay product asked for. */
static void log_link(loco_link *l, bool server) {
    int snd = 0, rcv = 0;
    socklen_t sl = sizeof snd;
    getsockopt(l->s[0].conn->fd, SOL_SOCKET, SO_SNDBUF, &snd, &sl);
    sl = sizeof rcv;
    getsockopt(l->s[0].conn->fd, SOL_SOCKET, SO_RCVBUF, &rcv, &sl);
    l->st.sndbuf = snd;
    l->st.rcvbuf = rcv;
    const int ask_snd = loco__sockbuf_bytes(&l->p, true),
              ask_rcv = loco__sockbuf_bytes(&l->p, false);
    char a[32], b[32];
    fmt_kib_mib(a, sizeof a, snd);
    fmt_kib_mib(b, sizeof b, rcv);
    loco_info("net: link %s %s (%s): %d stream%s, %s, sndbuf %s, rcvbuf %s per stream%s",
              server ? "from" : "to", l->peer, l->s[0].conn->addr, l->n, l->n > 1 ? "s" : "",
              l->st.transport, a, b, ask_snd || ask_rcv ? "" : " (kernel autotuning)");
    /* The kernel reports twice what it grants for data (bookkeeping). */
    if ((ask_snd && snd / 2 < ask_snd) || (ask_rcv && rcv / 2 < ask_rcv)) {
        fmt_kib_mib(a, sizeof a, ask_snd > ask_rcv ? ask_snd : ask_rcv);
        loco_warn("net: link with %s: asked for %s socket buffers per stream (bandwidth-delay "
                  "product / streams), the kernel capped them; raise net.core.wmem_max and "
                  "net.core.rmem_max or use more streams",
                  l->peer, a);
    }
}

int loco__link_start(loco_link **out, const loco_net_params *p, loco__conn **conns, int n,
                     const char *peer_name, uint64_t peer_max_frame, bool server) {
    *out = NULL;
    int rc = 0;
    loco_link *l = loco_alloc(sizeof *l);
    if (!l) {
        for (int i = 0; i < n; i++)
            loco__conn_destroy(conns[i]);
        return LOCO_ERR(LOCO_ENOMEM, "net: link");
    }
    l->p = *p;
    l->n = n;
    pthread_mutex_init(&l->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    l->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    l->notify_fd = -1;
    snprintf(l->peer, sizeof l->peer, "%s", peer_name);
    l->send_max = p->max_frame_bytes < peer_max_frame ? p->max_frame_bytes : peer_max_frame;
    l->recv_max = loco__recv_max(p);
    l->budget = loco__link_budget(p);
    l->wan = p->wan;
    loco_rng_seed(&l->wan_rng, p->wan.seed);
    l->faults = p->faults;
    loco_rng_seed(&l->fault_rng, p->faults.seed);
    l->st.streams = n;
    for (int i = 0; i < n; i++) {
        stream *s = &l->s[i];
        s->l = l;
        s->index = i;
        s->conn = conns[i];
        s->expect_seq = (uint64_t)i;
        s->stage = loco_alloc(LOCO__STAGE_BYTES);
        if (!s->stage && rc == 0)
            rc = LOCO_ERR(LOCO_ENOMEM, "net: link staging buffer");
    }
    if (l->stop_fd < 0 && rc == 0)
        rc = LOCO_ERR(LOCO_EIO, "net: eventfd: %s", strerror(errno));
    if (rc < 0) {
        loco_link_destroy(l);
        return rc;
    }
    l->s[0].conn->ops->describe(l->s[0].conn, l->st.transport, sizeof l->st.transport);
    for (int i = 0; i < n && rc == 0; i++) {
        stream *s = &l->s[i];
        if (pthread_create(&s->sender, NULL, sender_main, s) != 0)
            rc = LOCO_ERR(LOCO_EIO, "net: cannot start a sender thread");
        else
            s->sender_started = true;
        if (rc == 0 && pthread_create(&s->reader, NULL, loco__link_reader_main, s) != 0)
            rc = LOCO_ERR(LOCO_EIO, "net: cannot start a reader thread");
        else if (rc == 0)
            s->reader_started = true;
    }
    if (rc < 0) {
        link_stop(l);
        loco_link_destroy(l);
        return rc;
    }
    log_link(l, server);
    *out = l;
    return 0;
}

/* ------------------------------------------------------------------ send */

/* Appends f (lock held) once the stream of the next number has room. */
static int enqueue(loco_link *l, frame *f, double extra_s) {
    const double deadline = loco_now() + io_idle(l);
    stream *s;
    for (;;) {
        if (l->closing || l->closed)
            return LOCO_ERR(LOCO_EINVAL, "net: link with %s is closed", l->peer);
        if (l->err)
            return LOCO_ERR(l->err, "net: link with %s failed: %s", l->peer, l->errmsg);
        if (l->stopped)
            return LOCO_ERR(LOCO_EPEER, "net: link with %s is stopped", l->peer);
        s = &l->s[l->send_seq % (uint64_t)l->n];
        if (s->sq.n < l->p.queue_frames)
            break;
        if (loco_now() >= deadline)
            return LOCO_ERR(LOCO_ETIMEDOUT,
                            "net: link with %s: send queue full for %d ms (is the peer reading?)",
                            l->peer, l->p.io_timeout_ms);
        loco__link_wait_until(l, deadline);
    }
    f->hdr.seq = l->send_seq++;
    double hold = l->wan.delay_ms * 1e-3 + extra_s;
    if (l->wan.jitter_ms > 0)
        hold += (2 * loco_rng_uniform_d(&l->wan_rng) - 1) * l->wan.jitter_ms * 1e-3;
    const double now = loco_now();
    f->release = hold > 0 ? now + hold : now;
    if (f->release < s->last_release)
        f->release = s->last_release;
    s->last_release = f->release;
    fq_push(&s->sq, f);
    l->inflight++;
    pthread_cond_broadcast(&l->cv);
    return 0;
}

int loco_link_send_move(loco_link *l, const loco_frame_hdr *h, void **payload, size_t len) {
    if (!l || !h || (len && (!payload || !*payload)))
        return LOCO_ERR(LOCO_EINVAL, "net: send: missing link, header or payload");
    if (h->type == LOCO_FRAME_HELLO)
        return LOCO_ERR(LOCO_EINVAL, "net: send: HELLO frames belong to the link");
    loco_frame_hdr hh = *h;
    hh.seq = 0;
    hh.payload_len = len;
    hh.payload_hash = 0;
    if (!hh.run_id)
        hh.run_id = l->p.run_id;
    uint8_t scratch[LOCO_FRAME_HEADER_BYTES];
    LOCO_CHECK(loco_frame_encode_header(scratch, &hh, l->send_max));
    frame *f = loco_alloc(sizeof *f);
    if (!f)
        return LOCO_ERR(LOCO_ENOMEM, "net: send: frame");
    f->hdr = hh;
    f->payload = len ? *payload : NULL;

    /* Faults: six draws per subject frame, whatever they decide, so that a
     * seed replays the same pattern and one probability does not shift the
     * others'. */
    bool drop = false, dup = false;
    double extra = 0;
    pthread_mutex_lock(&l->mu);
    const loco_link_faults *fl = &l->faults;
    const bool subject = fl->types == 0 || (hh.type < 32 && (fl->types & (1u << hh.type)));
    if (subject && (fl->drop > 0 || fl->corrupt > 0 || fl->duplicate > 0 || fl->delay > 0)) {
        const double u_drop = loco_rng_uniform_d(&l->fault_rng);
        const double u_corrupt = loco_rng_uniform_d(&l->fault_rng);
        const double u_dup = loco_rng_uniform_d(&l->fault_rng);
        const double u_delay = loco_rng_uniform_d(&l->fault_rng);
        const uint64_t where = loco_rng_u64(&l->fault_rng), what = loco_rng_u64(&l->fault_rng);
        drop = u_drop < fl->drop;
        f->corrupt = !drop && u_corrupt < fl->corrupt;
        dup = !drop && u_dup < fl->duplicate;
        if (!drop && u_delay < fl->delay)
            extra = fl->delay_ms * 1e-3;
        f->corrupt_pos = where;
        f->corrupt_xor = (uint8_t)(1 + what % 255);
        l->st.faults_dropped += drop;
        l->st.faults_corrupted += f->corrupt;
        l->st.faults_duplicated += dup;
        l->st.faults_delayed += extra > 0;
    }
    pthread_mutex_unlock(&l->mu);
    if (drop) {
        frame_free(f);
        if (len)
            *payload = NULL;
        return 0;
    }
    frame *twin = NULL;
    if (dup) {
        twin = loco_alloc(sizeof *twin);
        if (twin) {
            twin->hdr = hh;
            twin->payload = len ? loco_alloc(len) : NULL;
            if (len && !twin->payload) {
                loco_free(twin);
                twin = NULL;
            } else if (len) {
                memcpy(twin->payload, *payload, len);
            }
        }
        if (!twin) {
            loco_free(f);
            return LOCO_ERR(LOCO_ENOMEM, "net: send: duplicate frame");
        }
    }
    pthread_mutex_lock(&l->mu);
    const int rc = enqueue(l, f, extra);
    /* A twin that finds no room is a duplicate that did not happen; the
     * link's trouble, if any, shows on the next call. */
    if (rc == 0 && twin && enqueue(l, twin, extra) == 0)
        twin = NULL;
    pthread_mutex_unlock(&l->mu);
    frame_free(twin);
    if (rc < 0) {
        loco_free(f); /* never queued: the caller keeps the payload */
        return rc;
    }
    if (len)
        *payload = NULL;
    return 0;
}

int loco_link_send(loco_link *l, const loco_frame_hdr *h, const void *payload, size_t len) {
    if (!l || !h || (len && !payload))
        return LOCO_ERR(LOCO_EINVAL, "net: send: missing link, header or payload");
    void *copy = NULL;
    if (len) {
        if (len > l->send_max)
            return LOCO_ERR(LOCO_EINVAL,
                            "net: send: payload of %zu bytes exceeds the link's limit of %llu", len,
                            (unsigned long long)l->send_max);
        copy = loco_alloc(len);
        if (!copy)
            return LOCO_ERR(LOCO_ENOMEM, "net: send: %zu bytes", len);
        memcpy(copy, payload, len);
    }
    const int rc = loco_link_send_move(l, h, &copy, len);
    loco_free(copy);
    return rc;
}

int loco_link_flush(loco_link *l, int timeout_ms) {
    if (!l)
        return LOCO_ERR(LOCO_EINVAL, "net: flush: no link");
    const double deadline = timeout_ms < 0 ? 0 : loco_now() + timeout_ms * 1e-3;
    int rc = 0;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        if (l->err) {
            rc = LOCO_ERR(l->err, "net: link with %s failed: %s", l->peer, l->errmsg);
            break;
        }
        if (l->inflight == 0)
            break;
        if (l->stopped) {
            rc = LOCO_ERR(LOCO_EINVAL, "net: link with %s is closed", l->peer);
            break;
        }
        if (deadline > 0 && loco_now() >= deadline) {
            rc = LOCO_ERR(LOCO_ETIMEDOUT, "net: link with %s: %llu frames still queued after %d ms",
                          l->peer, (unsigned long long)l->inflight, timeout_ms);
            break;
        }
        loco__link_wait_until(l, deadline);
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}

/* ----------------------------------------------------------- everything else */

const char *loco_link_peer_name(const loco_link *l) {
    return l ? l->peer : "";
}

void loco_link_get_stats(loco_link *l, loco_link_stats *out) {
    memset(out, 0, sizeof *out);
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    *out = l->st;
    for (int i = 0; i < l->n; i++) {
        if (l->s[i].conn) {
            out->wire_bytes_sent += atomic_load(&l->s[i].conn->wire_out);
            out->wire_bytes_recv += atomic_load(&l->s[i].conn->wire_in);
        }
    }
    pthread_mutex_unlock(&l->mu);
}

void loco_link_set_wan(loco_link *l, const loco_wan *w) {
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    memset(&l->wan, 0, sizeof l->wan);
    if (w)
        l->wan = *w;
    loco_rng_seed(&l->wan_rng, l->wan.seed);
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

void loco_link_set_faults(loco_link *l, const loco_link_faults *f) {
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    memset(&l->faults, 0, sizeof l->faults);
    if (f)
        l->faults = *f;
    loco_rng_seed(&l->fault_rng, l->faults.seed);
    pthread_mutex_unlock(&l->mu);
}

int loco_link_write_raw(loco_link *l, int stream_index, const void *buf, size_t len) {
    if (!l || stream_index < 0 || stream_index >= l->n)
        return LOCO_ERR(LOCO_EINVAL, "net: raw write: bad stream");
    return loco__conn_io(l->s[stream_index].conn, (void *)buf, len, true, loco_now() + io_idle(l),
                         io_idle(l), l->stop_fd, NULL);
}

void loco_link_abort(loco_link *l) {
    if (l)
        link_stop(l);
}

static bool readers_done(loco_link *l) {
    for (int i = 0; i < l->n; i++)
        if (l->s[i].reader_started && !l->s[i].reader_done)
            return false;
    return true;
}

void loco_link_close(loco_link *l) {
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    if (l->closing || l->closed) {
        pthread_mutex_unlock(&l->mu);
        return;
    }
    l->closing = true;
    pthread_cond_broadcast(&l->cv);
    /* 1. Senders write what is queued, then exit. */
    const double deadline = loco_now() + io_idle(l);
    while (l->inflight > 0 && !l->err && !l->stopped && loco_now() < deadline)
        loco__link_wait_until(l, deadline);
    const uint64_t unsent = l->err || l->stopped ? 0 : l->inflight;
    pthread_mutex_unlock(&l->mu);
    if (unsent) {
        loco_warn("net: link with %s: closing with %llu frames not written after %d ms", l->peer,
                  (unsigned long long)unsent, l->p.io_timeout_ms);
        link_stop(l);
    }
    for (int i = 0; i < l->n; i++)
        if (l->s[i].sender_started)
            pthread_join(l->s[i].sender, NULL);
    /* 2. End every stream, read and discard until the peer ends its side
     * (closing a socket with unread data would reset the connection, and the
     * peer could lose the last frames we sent). */
    pthread_mutex_lock(&l->mu);
    l->draining = true;
    pthread_cond_broadcast(&l->cv);
    const bool stopped = l->stopped;
    pthread_mutex_unlock(&l->mu);
    if (!stopped) {
        for (int i = 0; i < l->n; i++) {
            loco__conn *c = l->s[i].conn;
            pthread_mutex_lock(&c->mu);
            c->ops->shutdown(c);
            pthread_mutex_unlock(&c->mu);
            shutdown(c->fd, SHUT_WR);
        }
        const double linger = loco_now() + l->p.linger_ms * 1e-3;
        pthread_mutex_lock(&l->mu);
        while (!readers_done(l) && loco_now() < linger)
            loco__link_wait_until(l, linger);
        pthread_mutex_unlock(&l->mu);
    }
    /* 3. Stop what is left, join, release. */
    link_stop(l);
    for (int i = 0; i < l->n; i++)
        if (l->s[i].reader_started)
            pthread_join(l->s[i].reader, NULL);
    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < l->n; i++) {
        stream *s = &l->s[i];
        s->sender_started = s->reader_started = false;
        fq_clear(&s->sq);
        fq_clear(&s->rq);
        if (s->conn) {
            l->st.wire_bytes_sent += atomic_load(&s->conn->wire_out);
            l->st.wire_bytes_recv += atomic_load(&s->conn->wire_in);
            loco__conn_destroy(s->conn);
            s->conn = NULL;
        }
    }
    l->inflight = 0;
    l->rx_held = 0;
    l->closed = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

void loco_link_destroy(loco_link *l) {
    if (!l)
        return;
    loco_link_close(l);
    for (int i = 0; i < l->n; i++) {
        loco__conn_destroy(l->s[i].conn); /* only when close never ran */
        loco_free(l->s[i].stage);
    }
    if (l->stop_fd >= 0)
        close(l->stop_fd);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    loco_free(l);
}
