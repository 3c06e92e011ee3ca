/* The inside of a link, shared by link.c (start, send, close, the rest) and
 * link_recv.c (the receive path): the queued frame, the frame queue, the
 * stream, struct loco_link, and the helpers both sides use. Only those two
 * files include it; the rest of net/ sees a link through net.h and
 * internal.h.
 *
 * One mutex and one condition variable (CLOCK_MONOTONIC) guard the link's
 * queues and state; each connection has its own mutex that serialises the
 * transport calls (OpenSSL sessions are not safe for concurrent use). */
#ifndef LOCO_NET_LINK_INTERNAL_H
#define LOCO_NET_LINK_INTERNAL_H

#include "net/internal.h"

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
    int stop_fd;   /* readable once the link stops: wakes every poll */
    int notify_fd; /* the owner's eventfd (-1: none), see loco_link_set_notify */
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

/* ------------------------------------------------------- frame queues */

static inline void fq_push(fqueue *q, frame *f) {
    f->next = NULL;
    if (q->tail)
        q->tail->next = f;
    else
        q->head = f;
    q->tail = f;
    q->n++;
}

static inline frame *fq_pop(fqueue *q) {
    frame *f = q->head;
    if (!f)
        return NULL;
    q->head = f->next;
    if (!q->head)
        q->tail = NULL;
    q->n--;
    return f;
}

static inline void frame_free(frame *f) {
    if (!f)
        return;
    loco_free(f->payload);
    loco_free(f);
}

static inline double io_idle(const loco_link *l) {
    return l->p.io_timeout_ms * 1e-3;
}

/* Tells the owner's poll that the link has news (a frame, an ended stream,
 * a stop). The link's mutex is held. */
static inline void link_notify(loco_link *l) {
    if (l->notify_fd >= 0) {
        const uint64_t one = 1;
        ssize_t w = write(l->notify_fd, &one, sizeof one);
        (void)w; /* a full eventfd is already readable */
    }
}

/* ------------------------------------------------------------ link.c */

/* Waits on the link's condition until t (monotonic seconds; 0 = no limit).
 * The link's mutex is held. */
void loco__link_wait_until(loco_link *l, double t);
/* Records the link's first failure, logs it (unless we are closing), stops
 * the link. Takes the link's mutex: call without it. */
__attribute__((format(printf, 3, 4))) void loco__link_fail(loco_link *l, int rc, const char *fmt,
                                                           ...);

/* ------------------------------------------------------- link_recv.c */

/* The reader thread of one stream (arg: its stream): reads, checks and
 * queues frames until the stream ends, fails or the link stops; then sets
 * reader_done. */
void *loco__link_reader_main(void *arg);

#endif /* LOCO_NET_LINK_INTERNAL_H */
