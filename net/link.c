/* A link: N established streams, a sender and a reader thread per stream,
 * bounded queues both ways, in-order delivery, WAN emulation and fault
 * injection in the sender path.
 *
 * Frame s of a link goes on stream s % N, so each stream carries every N-th
 * frame in order and the receiver, taking frames from stream (next % N),
 * hands them out in send order. A reader blocks when its stream's queue is
 * full (TCP flow control does the rest); that cannot deadlock, because the
 * next frame to hand out is always at the head of its own stream's queue.
 *
 * One mutex and one condition variable (CLOCK_MONOTONIC) guard the link's
 * queues and state; each connection has its own mutex that serialises the
 * transport calls (OpenSSL sessions are not safe for concurrent use). */
#include "net/internal.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct frame {
    struct frame *next;
    loco_frame_hdr hdr;
    uint8_t *payload;     /* loco_alloc'd, hdr.payload_len bytes; NULL when empty */
    double release;       /* monotonic seconds: not on the wire before */
    bool corrupt;         /* fault: flip one byte after checksumming */
    uint64_t corrupt_pos; /* taken modulo the frame's size */
    uint8_t corrupt_xor;
} frame;

typedef struct {
    frame *head, *tail;
    int n;
} fqueue;

typedef struct {
    struct loco_link *l;
    int index;
    loco__conn *conn;
    pthread_t sender, reader;
    bool sender_started, reader_started;
    bool reader_done;
    fqueue sq, rq;       /* to send / received, not yet handed out */
    double last_release; /* of the last frame queued: jitter never reorders */
    uint64_t expect_seq; /* of the next frame this stream reads */
    bool eof;            /* the peer ended this stream cleanly */
    uint8_t *stage;      /* header + payload start, one TLS record */
} stream;

struct loco_link {
    loco_net_params p;
    int n;
    stream s[LOCO_NET_MAX_STREAMS];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop_fd; /* readable once the link stops: wakes every poll */
    uint64_t send_seq, recv_seq;
    uint64_t inflight; /* queued, not yet written */
    uint64_t send_max; /* the smaller of both sides' frame limits */
    uint64_t recv_max; /* payload limit of frames received */
    uint64_t budget;   /* received payload bytes held at most (>= recv_max) */
    uint64_t rx_held;  /* reserved for frames being read or not yet handed out */
    bool closing;      /* close started: no new sends, senders drain */
    bool draining;     /* readers discard what still arrives */
    bool stopped;      /* threads are told to exit, sockets shut down */
    bool closed;
    int err; /* first failure (LOCO_E*), 0 while healthy */
    char errmsg[512];
    char peer[LOCO_NET_NAME_MAX];
    loco_wan wan;
    loco_rng wan_rng;
    double bw_next; /* bandwidth cap: when the emulated wire is free */
    loco_link_faults faults;
    loco_rng fault_rng;
    loco_link_stats st;
};

/* ---------------------------------------------------------------- helpers */

static void fq_push(fqueue *q, frame *f) {
    f->next = NULL;
    if (q->tail)
        q->tail->next = f;
    else
        q->head = f;
    q->tail = f;
    q->n++;
}

static frame *fq_pop(fqueue *q) {
    frame *f = q->head;
    if (!f)
        return NULL;
    q->head = f->next;
    if (!q->head)
        q->tail = NULL;
    q->n--;
    return f;
}

static void frame_free(frame *f) {
    if (!f)
        return;
    loco_free(f->payload);
    loco_free(f);
}

static void fq_clear(fqueue *q) {
    frame *f;
    while ((f = fq_pop(q)))
        frame_free(f);
}

/* Waits on the link's condition until t (monotonic seconds; 0 = no limit). */
static void wait_until(loco_link *l, double t) {
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

static double io_idle(const loco_link *l) {
    return l->p.io_timeout_ms * 1e-3;
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
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* Records the link's first failure, logs it (unless we are closing), stops. */
__attribute__((format(printf, 3, 4))) static void link_fail(loco_link *l, int rc, const char *fmt,
                                                            ...) {
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
                wait_until(l, t);
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
            wait_until(l, 0);
            continue;
        }
        if (f->release > loco_now()) {
            wait_until(l, f->release);
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
            link_fail(l, rc, "stream %d: %s", s->index, loco__errmsg_line(why, sizeof why));
        }
        pthread_mutex_lock(&l->mu);
        if (rc < 0)
            break;
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* ------------------------------------------------------------ the reader */

/* The peer ended stream s cleanly: record it and end our side too, so that
 * a peer waiting in its close (linger) is released. */
static void reader_eof(loco_link *l, stream *s) {
    pthread_mutex_lock(&l->mu);
    s->eof = true;
    const bool draining = l->draining;
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
        link_fail(l, LOCO_EPEER,
                  "stream %d: the peer closed the connection in the middle of a "
                  "frame (%zu bytes in)",
                  s->index, got);
    else
        link_fail(l, rc, "stream %d: %s%s", s->index, loco__errmsg_line(why, sizeof why),
                  mid_frame ? " (in the middle of a frame)" : "");
}

static void refuse(loco_link *l, stream *s, const char *reason) {
    link_fail(l, LOCO_EPROTO, "refused a frame on stream %d: %s", s->index, reason);
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

static void *reader_main(void *arg) {
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
            wait_until(l, 0);
        const bool stopped = l->stopped, reserved = !l->draining;
        if (reserved && !stopped)
            rx_reserve(l, h.payload_len);
        pthread_mutex_unlock(&l->mu);
        if (stopped)
            break;
        frame *f = loco_alloc(sizeof *f);
        if (!f) {
            rx_release(l, reserved ? h.payload_len : 0);
            link_fail(l, LOCO_ENOMEM, "stream %d: no memory for a frame", s->index);
            break;
        }
        f->hdr = h;
        rc = read_payload(l, s, &h, &f->payload, &got);
        if (rc != 0) {
            frame_free(f);
            rx_release(l, reserved ? h.payload_len : 0);
            if (rc == LOCO_ENOMEM)
                link_fail(l, rc, "stream %d: no memory for a frame of %llu bytes", s->index,
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
            pthread_cond_broadcast(&l->cv);
        }
        pthread_mutex_unlock(&l->mu);
    }
    pthread_mutex_lock(&l->mu);
    s->reader_done = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* ----------------------------------------------------------------- start */

static void fmt_bytes(char *buf, size_t cap, double b) {
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
    fmt_bytes(a, sizeof a, snd);
    fmt_bytes(b, sizeof b, rcv);
    loco_info("net: link %s %s (%s): %d stream%s, %s, sndbuf %s, rcvbuf %s per stream%s",
              server ? "from" : "to", l->peer, l->s[0].conn->addr, l->n, l->n > 1 ? "s" : "",
              l->st.transport, a, b, ask_snd || ask_rcv ? "" : " (kernel autotuning)");
    /* The kernel reports twice what it grants for data (bookkeeping). */
    if ((ask_snd && snd / 2 < ask_snd) || (ask_rcv && rcv / 2 < ask_rcv)) {
        fmt_bytes(a, sizeof a, ask_snd > ask_rcv ? ask_snd : ask_rcv);
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
        if (rc == 0 && pthread_create(&s->reader, NULL, reader_main, s) != 0)
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
        wait_until(l, deadline);
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
        wait_until(l, deadline);
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
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
        wait_until(l, deadline);
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

int loco__link_write_raw(loco_link *l, int stream_index, const void *buf, size_t len) {
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
        wait_until(l, deadline);
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
            wait_until(l, linger);
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
