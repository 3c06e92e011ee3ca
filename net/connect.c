/* The connecting side: p->streams TCP connections to one address, TLS and
 * HELLO on all of them at once, then a link. */
#include "net/internal.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

static uint64_t random_link_id(void) {
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) {
        /* No entropy source: time and address still tell links apart. */
        id = (uint64_t)(loco_wall_time() * 1e9) ^ ((uint64_t)getpid() << 32) ^
             (uint64_t)(uintptr_t)&id;
    }
    return id ? id : 1;
}

/* A non-blocking socket with a connect to a in progress (or done). */
static int start_connect(const struct addrinfo *a, const loco_net_params *p, int *fd_out) {
    *fd_out = -1;
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0)
        return LOCO_ERR(LOCO_EIO, "net: socket: %s", strerror(errno));
    loco__sock_tune(fd, p); /* before connect: the window scale depends on it */
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
        const int e = errno;
        close(fd);
        return LOCO_ERR(LOCO_EIO, "net: connect: %s", strerror(e));
    }
    *fd_out = fd;
    return 0;
}

/* Stream 0 on the first address that accepts a TCP connection. */
static int connect_first(const struct addrinfo *ai, const loco_net_params *p, double deadline,
                         const struct addrinfo **chosen, int *fd_out, char *why, size_t cap) {
    int rc = LOCO_EIO;
    snprintf(why, cap, "no address");
    for (const struct addrinfo *a = ai; a; a = a->ai_next) {
        int fd;
        rc = start_connect(a, p, &fd);
        if (rc < 0) {
            loco__errmsg_line(why, cap);
            continue;
        }
        rc = loco__wait_fd(fd, POLLOUT, -1, deadline);
        int err = 0;
        socklen_t sl = sizeof err;
        if (rc == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) == 0 && err == 0) {
            *chosen = a;
            *fd_out = fd;
            return 0;
        }
        close(fd);
        if (rc == LOCO_ETIMEDOUT) {
            snprintf(why, cap, "TCP connect timed out");
            return LOCO_ETIMEDOUT;
        }
        rc = LOCO_EIO;
        snprintf(why, cap, "%s", strerror(err ? err : errno));
    }
    return rc;
}

/* One link being dialled: where to, by when, and its streams' connections
 * and handshakes. */
typedef struct {
    const loco_net_params *p;
    const char *host;
    int port, n;
    double deadline;
    loco__conn *conns[LOCO_NET_MAX_STREAMS];
    loco__hs hs[LOCO_NET_MAX_STREAMS];
} dialing;

/* Connects the n streams (stream 0 on fd0, connected already) and starts
 * their handshakes with hello. The connections made stay in d->conns for
 * the caller to destroy, also on failure. */
static int open_streams(dialing *d, const loco__transport_ops *ops, void *ctx,
                        const struct addrinfo *a, int fd0, loco__hello hello) {
    int rc;
    for (int i = 0; i < d->n; i++) {
        int fd = fd0; /* stream 0 is connected already */
        if (i > 0 && (rc = start_connect(a, d->p, &fd)) < 0)
            return rc;
        rc = loco__conn_create(&d->conns[i], fd, ops);
        if (rc < 0) {
            close(fd);
            return rc;
        }
        snprintf(d->conns[i]->addr, sizeof d->conns[i]->addr, "%s:%d", d->host, d->port);
        LOCO_CHECK(ops->attach(d->conns[i], ctx, false));
        hello.stream = (uint32_t)i;
        loco__hs_init_client(&d->hs[i], d->conns[i], &hello, i > 0, d->deadline);
    }
    return 0;
}

/* Drives every stream's handshake until all are done, or the deadline. */
static int drive_handshakes(dialing *d) {
    int pending = d->n;
    bool done[LOCO_NET_MAX_STREAMS] = {0};
    while (pending > 0) {
        struct pollfd pf[LOCO_NET_MAX_STREAMS];
        int np = 0;
        for (int i = 0; i < d->n; i++) {
            if (done[i])
                continue;
            const int rc = loco__hs_step(&d->hs[i]);
            if (rc < 0)
                return rc;
            if (rc == 0) {
                done[i] = true;
                pending--;
                continue;
            }
            pf[np++] = (struct pollfd){.fd = d->conns[i]->fd, .events = d->hs[i].want};
        }
        if (pending == 0)
            break;
        const double ms = (d->deadline - loco_now()) * 1e3;
        if (ms <= 0)
            return LOCO_ERR(LOCO_ETIMEDOUT,
                            "net: connect to %s:%d: handshake of %d of %d streams "
                            "not done in time",
                            d->host, d->port, pending, d->n);
        if (poll(pf, (nfds_t)np, (int)ms + 1) < 0 && errno != EINTR)
            return LOCO_ERR(LOCO_EIO, "net: poll: %s", strerror(errno));
    }
    return 0;
}

/* Every stream reached the same peer, which accepted link link_id, of the
 * run and name we expect: its name in *peer, the smallest frame limit it
 * announced in *peer_max. */
static int check_answers(const dialing *d, uint64_t link_id, const char **peer,
                         uint64_t *peer_max) {
    const loco_net_params *p = d->p;
    *peer = d->conns[0]->peer_name[0] ? d->conns[0]->peer_name : d->hs[0].peer.name;
    *peer_max = LOCO_FRAME_PAYLOAD_CEILING;
    for (int i = 0; i < d->n; i++) {
        const loco__hello *r = &d->hs[i].peer;
        if (r->status != 0)
            return LOCO_ERR(r->status, "net: %s:%d refused the link: %s", d->host, d->port,
                            r->reason[0] ? r->reason : loco_strerror(r->status));
        const char *who = d->conns[i]->peer_name[0] ? d->conns[i]->peer_name : r->name;
        if (r->link_id != link_id || r->stream != (uint32_t)i ||
            r->n_streams != (uint32_t)d->n || strcmp(who, *peer) != 0)
            return LOCO_ERR(LOCO_EPROTO,
                            "net: %s:%d answered stream %d with another link's HELLO", d->host,
                            d->port, i);
        if (r->max_frame < *peer_max)
            *peer_max = r->max_frame;
    }
    if (p->run_id && d->hs[0].peer.run_id && d->hs[0].peer.run_id != p->run_id)
        return LOCO_ERR(LOCO_EAUTH, "net: %s:%d serves run %016llx, not %016llx", d->host,
                        d->port, (unsigned long long)d->hs[0].peer.run_id,
                        (unsigned long long)p->run_id);
    if (p->expect_peer[0] && strcmp(*peer, p->expect_peer) != 0)
        return LOCO_ERR(LOCO_EAUTH, "net: %s:%d is '%s', expected '%s'", d->host, d->port,
                        *peer, p->expect_peer);
    return 0;
}

int loco_net_connect(loco_link **out, const loco_net_params *p, const char *host, int port,
                     int timeout_ms) {
    *out = NULL;
    LOCO_CHECK(loco_net_params_check(p, false));
    if (!host || port <= 0 || port > 65535)
        return LOCO_ERR(LOCO_EINVAL, "net: connect: bad address %s:%d", host ? host : "(null)",
                        port);
    dialing d = {.p = p, .host = host, .port = port, .n = p->streams,
                 .deadline = loco_now() +
                             (timeout_ms < 0 ? p->connect_timeout_ms : timeout_ms) * 1e-3};
    const loco__transport_ops *ops = loco__backend_ops(p->backend);
    void *ctx = NULL;
    LOCO_CHECK(ops->ctx_create(&ctx, p, false));

    int rc;
    struct addrinfo *ai = NULL;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    const int gai = getaddrinfo(host, port_s, &hints, &ai);
    if (gai != 0) {
        rc = LOCO_ERR(LOCO_EINVAL, "net: connect to %s:%d: %s", host, port, gai_strerror(gai));
        goto out_destroy_ctx;
    }
    const struct addrinfo *a = NULL;
    int fd0 = -1;
    char why[512];
    rc = connect_first(ai, p, d.deadline, &a, &fd0, why, sizeof why);
    if (rc < 0) {
        rc = LOCO_ERR(rc, "net: connect to %s:%d: %s", host, port, why);
        goto out_free_addrinfo;
    }
    loco__hello hello = {
        .link_id = random_link_id(),
        .n_streams = (uint32_t)d.n,
        .max_frame = loco__recv_max(p),
        .run_id = p->run_id,
    };
    snprintf(hello.name, sizeof hello.name, "%s", p->name);
    const char *peer;
    uint64_t peer_max;
    if ((rc = open_streams(&d, ops, ctx, a, fd0, hello)) < 0 ||
        (rc = drive_handshakes(&d)) < 0 ||
        (rc = check_answers(&d, hello.link_id, &peer, &peer_max)) < 0)
        goto out_destroy_conns;
    char name[LOCO_NET_NAME_MAX];
    snprintf(name, sizeof name, "%s", peer[0] ? peer : d.conns[0]->addr);
    freeaddrinfo(ai);
    ops->ctx_destroy(ctx); /* sessions hold their own reference */
    return loco__link_start(out, p, d.conns, d.n, name, peer_max, false);
out_destroy_conns:
    for (int i = 0; i < d.n; i++)
        loco__conn_destroy(d.conns[i]);
out_free_addrinfo:
    freeaddrinfo(ai);
out_destroy_ctx:
    ops->ctx_destroy(ctx);
    return rc;
}
