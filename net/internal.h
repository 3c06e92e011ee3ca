/* net/ internals shared by the files of net/ (and the tests' hooks). Not for
 * use outside net/ and tests/net/. */
#ifndef LOCO_NET_INTERNAL_H
#define LOCO_NET_INTERNAL_H

#include <openssl/types.h>
#include <pthread.h>
#include <stdatomic.h>

#include "net/net.h"

/* Results of one transport call besides a byte count > 0 (kept apart from
 * the LOCO_E* codes, which are -1..-11). */
enum {
    LOCO__WANT_READ = -100,  /* poll for POLLIN, then call again */
    LOCO__WANT_WRITE = -101, /* poll for POLLOUT, then call again */
    LOCO__EOF = -102,        /* the peer ended the stream cleanly */
    LOCO__STOPPED = -103,    /* the stop descriptor fired */
};

/* Socket buffers below this are not worth asking for (per stream). */
#define LOCO__SOCKBUF_MIN (64 << 10)
/* Bytes of a frame written under one bandwidth-cap reservation. */
#define LOCO__SLICE_BYTES (64 << 10)
/* Header plus the payload start share one TLS record (16 KiB of plaintext). */
#define LOCO__STAGE_BYTES (16 << 10)
/* Listener: connections in handshake (links: net.max_pending). */
#define LOCO__MAX_PENDING LOCO_NET_MAX_PENDING
/* A frame's payload buffer starts at this size and grows by RX_GROWTH as
 * bytes arrive, so that a claimed length costs nothing until it is sent. */
#define LOCO__RX_FIRST_BYTES (64 << 10)
#define LOCO__RX_GROWTH 4
/* TLS 1.3 suites, fastest first on AES-NI machines (docs/FIGURES). */
#define LOCO__TLS_SUITES                                                                           \
    "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"

typedef struct loco__conn loco__conn;

/* One transport (the ops table of a backend). Calls on one connection are
 * serialised by conn->mu (the I/O helpers take it); all sockets are
 * non-blocking, so a call never blocks with the lock held. */
typedef struct loco__transport_ops {
    const char *name;
    /* Per listener or per connect: loads certificates (TLS). */
    int (*ctx_create)(void **ctx, const loco_net_params *p, bool server);
    void (*ctx_destroy)(void *ctx);
    /* Binds the connection's socket to a new session. */
    int (*attach)(loco__conn *c, void *ctx, bool server);
    /* Advances the handshake: 0 done, LOCO__WANT_*, or LOCO_EAUTH / LOCO_EIO
     * with the reason recorded. */
    int (*handshake)(loco__conn *c);
    /* n > 0, LOCO__WANT_*, LOCO__EOF, or LOCO_EPEER / LOCO_EIO. */
    long (*read)(loco__conn *c, void *buf, size_t len);
    long (*write)(loco__conn *c, const void *buf, size_t len);
    /* Best-effort orderly end (TLS close_notify); one non-blocking try. */
    void (*shutdown)(loco__conn *c);
    /* The verified peer identity into c->peer_name ("" when none). */
    int (*peer_name)(loco__conn *c);
    /* Protocol and cipher ("TLSv1.3 TLS_AES_128_GCM_SHA256"). */
    void (*describe)(loco__conn *c, char *buf, size_t cap);
    void (*detach)(loco__conn *c);
} loco__transport_ops;

extern const loco__transport_ops loco__tls_ops;
extern const loco__transport_ops loco__plain_ops;
const loco__transport_ops *loco__backend_ops(loco_net_backend b);

/* One TCP connection (a stream of a link, or one in handshake). */
struct loco__conn {
    int fd;
    const loco__transport_ops *ops;
    void *impl;   /* SSL * for TLS */
    bool failed;  /* a fatal transport error happened: no orderly shutdown */
    bool bio_eof; /* the last socket read returned 0 (TLS BIO) */
    int last_errno;
    pthread_mutex_t mu;
    _Atomic uint64_t wire_in, wire_out;
    char peer_name[LOCO_NET_NAME_MAX];
    char addr[64];           /* "ip:port" of the peer */
    char verify_reason[384]; /* why the peer's certificate was refused */
};

/* conn.c: sockets and blocking-with-deadline I/O over non-blocking ones. */
int loco__conn_create(loco__conn **out, int fd, const loco__transport_ops *ops);
void loco__conn_destroy(loco__conn *c); /* detaches, closes fd; NULL ok */
/* Moves len bytes (write or read). Before the first byte, waits until
 * first_deadline (monotonic s, 0 = forever); after progress, at most idle_s
 * without progress (0 = forever). Returns 0, LOCO__EOF (clean end; *done
 * bytes had arrived), LOCO__STOPPED, LOCO_ETIMEDOUT or the transport error.
 * stop_fd (-1 = none) becoming readable stops it. */
int loco__conn_io(loco__conn *c, void *buf, size_t len, bool write, double first_deadline,
                  double idle_s, int stop_fd, size_t *done);
/* Waits for events on fd (and stop_fd) until deadline (0 = forever):
 * 0 ready, LOCO__STOPPED, LOCO_ETIMEDOUT. */
int loco__wait_fd(int fd, short events, int stop_fd, double deadline);
/* Socket options shared by both sides: TCP_NODELAY, buffers from params. */
void loco__sock_tune(int fd, const loco_net_params *p);
/* Per-stream buffer bytes asked for (0 = leave the kernel's autotuning). */
int loco__sockbuf_bytes(const loco_net_params *p, bool send);
void loco__sock_addr(int fd, bool peer, char *buf, size_t cap);
/* This thread's error message without its breadcrumbs, copied into buf
 * (for log lines and for nesting in another message). */
const char *loco__errmsg_line(char *buf, size_t cap);

/* handshake.c: the HELLO exchange, one per stream, after TLS. */
#define LOCO__HELLO_PAYLOAD 224
#define LOCO__HELLO_FRAME (LOCO_FRAME_HEADER_BYTES + LOCO__HELLO_PAYLOAD)

typedef struct {
    uint64_t link_id;
    uint32_t stream, n_streams;
    uint64_t max_frame;
    uint64_t run_id;
    int32_t status; /* 0, or the LOCO_E* code of a refusal (reply only) */
    char name[LOCO_NET_NAME_MAX];
    char reason[128]; /* of a refusal */
} loco__hello;

typedef enum {
    LOCO__HS_CONNECTING, /* client: TCP connect in progress */
    LOCO__HS_TLS,
    LOCO__HS_SEND,
    LOCO__HS_RECV,
    LOCO__HS_GOT_HELLO, /* server: the caller decides and sets the reply */
    LOCO__HS_DONE,
} loco__hs_state;

typedef struct {
    loco__conn *c;
    bool server;
    loco__hs_state state;
    short want; /* poll events to wait for */
    uint8_t out[LOCO__HELLO_FRAME], in[LOCO__HELLO_FRAME];
    size_t out_off, in_off;
    double deadline;
    loco__hello peer; /* parsed HELLO of the other side */
    void *user;       /* caller's bookkeeping */
} loco__hs;

/* Client: hello is sent once TLS is up; connecting = TCP connect pending. */
void loco__hs_init_client(loco__hs *h, loco__conn *c, const loco__hello *hello, bool connecting,
                          double deadline);
void loco__hs_init_server(loco__hs *h, loco__conn *c, double deadline);
/* Server, in LOCO__HS_GOT_HELLO: the reply to send (then LOCO__HS_SEND). */
void loco__hs_reply(loco__hs *h, const loco__hello *reply);
/* Advances as far as the socket allows: 1 = wait for h->want, 0 = reached
 * GOT_HELLO or DONE, < 0 = failed (reason recorded). */
int loco__hs_step(loco__hs *h);
/* Hello frame bytes; parse checks everything (LOCO_EPROTO). */
void loco__hello_encode(uint8_t out[LOCO__HELLO_FRAME], const loco__hello *h);
int loco__hello_parse(loco__hello *h, const uint8_t in[LOCO__HELLO_FRAME]);
/* Printable ASCII without the NUL, 1..LOCO_NET_NAME_MAX-1 long. */
bool loco__name_ok(const char *s);

/* The payload limit of frames this side receives (and tells its peers). */
static inline uint64_t loco__recv_max(const loco_net_params *p) {
    return p->recv_max_bytes ? p->recv_max_bytes : p->max_frame_bytes;
}
/* Received payload bytes one link may hold. */
static inline uint64_t loco__link_budget(const loco_net_params *p) {
    return p->link_buffer_bytes ? p->link_buffer_bytes : 4 * loco__recv_max(p);
}

/* link.c: a link over established streams (conns[i] = stream i). Takes the
 * conns in every case (destroys them on failure). */
int loco__link_start(loco_link **out, const loco_net_params *p, loco__conn **conns, int n,
                     const char *peer_name, uint64_t peer_max_frame, bool server);

/* certs.c: make_certs with an explicit validity window, in seconds from now
 * (not_before_s may be negative; tests make expired certificates). */
int loco__net_make_certs_ex(const char *out_dir, const char *const *names, int n_names,
                            long not_before_s, long valid_s);

/* The prefix of the subjectAltName URI that carries a certificate's run id. */
#define LOCO__RUN_URI "loco-run:"

/* Whether x carries the run id want in a "loco-run:" SAN URI (1) or not (0);
 * first receives the first run id x carries ("" when none). */
int loco__cert_run_id_match(const X509 *x, const char *want, char *first, size_t cap);
/* Our own certificate (p->cert, TLS only): LOCO_EINVAL naming the file and
 * the date when it is not valid yet or any more, or naming both ids when
 * p->cert_run_id is set and it carries another run id or none. A process
 * checks it when it starts (loco_net_params_from_config); links made with
 * hand-built params go on, and the peer refuses such a certificate. */
int loco__net_check_own_cert(const loco_net_params *p);
/* "2026-11-30 12:00:00 UTC" ("?" when t is NULL or unreadable). */
void loco__asn1_time_str(const ASN1_TIME *t, char *buf, size_t cap);


#endif /* LOCO_NET_INTERNAL_H */
