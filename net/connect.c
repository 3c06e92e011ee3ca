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

int loco_net_connect(loco_link **out, const loco_net_params *p, const char *host, int port,
                     int timeout_ms) {
    *out = NULL;
    LOCO_CHECK(loco_net_params_check(p, false));
    if (!host || port <= 0 || port > 65535)
        return LOCO_ERR(LOCO_EINVAL, "net: connect: bad address %s:%d", host ? host : "(null)",
                        port);
    const int n = p->streams;
    const double deadline =
        loco_now() + (timeout_ms < 0 ? p->connect_timeout_ms : timeout_ms) * 1e-3;
    const loco__transport_ops *ops = loco__backend_ops(p->backend);
    void *ctx = NULL;
    LOCO_CHECK(ops->ctx_create(&ctx, p, false));

    int rc = 0;
    char why[512];
    loco__conn *conns[LOCO_NET_MAX_STREAMS] = {0};
    loco__hs hs[LOCO_NET_MAX_STREAMS];
    struct addrinfo *ai = NULL;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    const int gai = getaddrinfo(host, port_s, &hints, &ai);
    if (gai != 0) {
        rc = LOCO_ERR(LOCO_EINVAL, "net: connect to %s:%d: %s", host, port, gai_strerror(gai));
        goto out;
    }
    const struct addrinfo *a = NULL;
    int fd0 = -1;
    rc = connect_first(ai, p, deadline, &a, &fd0, why, sizeof why);
    if (rc < 0) {
        rc = LOCO_ERR(rc, "net: connect to %s:%d: %s", host, port, why);
        goto out;
    }

    loco__hello hello = {
        .link_id = random_link_id(),
        .n_streams = (uint32_t)n,
        .max_frame = loco__recv_max(p),
        .run_id = p->run_id,
    };
    snprintf(hello.name, sizeof hello.name, "%s", p->name);
    for (int i = 0; i < n; i++) {
        int fd = fd0; /* stream 0 is connected already */
        if (i > 0 && (rc = start_connect(a, p, &fd)) < 0)
            goto out;
        rc = loco__conn_create(&conns[i], fd, ops);
        if (rc < 0) {
            close(fd);
            goto out;
        }
        snprintf(conns[i]->addr, sizeof conns[i]->addr, "%s:%d", host, port);
        LOCO_CHECK_GOTO(ops->attach(conns[i], ctx, false), out);
        hello.stream = (uint32_t)i;
        loco__hs_init_client(&hs[i], conns[i], &hello, i > 0, deadline);
    }

    /* Drive all handshakes until every one is done. */
    int pending = n;
    bool done[LOCO_NET_MAX_STREAMS] = {0};
    while (pending > 0) {
        struct pollfd pf[LOCO_NET_MAX_STREAMS];
        int np = 0;
        for (int i = 0; i < n; i++) {
            if (done[i])
                continue;
            rc = loco__hs_step(&hs[i]);
            if (rc < 0)
                goto out;
            if (rc == 0) {
                done[i] = true;
                pending--;
                continue;
            }
            pf[np++] = (struct pollfd){.fd = conns[i]->fd, .events = hs[i].want};
        }
        if (pending == 0)
            break;
        const double ms = (deadline - loco_now()) * 1e3;
        if (ms <= 0) {
            rc = LOCO_ERR(LOCO_ETIMEDOUT,
                          "net: connect to %s:%d: handshake of %d of %d streams "
                          "not done in time",
                          host, port, pending, n);
            goto out;
        }
        if (poll(pf, (nfds_t)np, (int)ms + 1) < 0 && errno != EINTR) {
            rc = LOCO_ERR(LOCO_EIO, "net: poll: %s", strerror(errno));
            goto out;
        }
    }

    /* Every stream reached the same peer, which accepted the link. */
    const char *peer = conns[0]->peer_name[0] ? conns[0]->peer_name : hs[0].peer.name;
    uint64_t peer_max = LOCO_FRAME_PAYLOAD_CEILING;
    for (int i = 0; i < n; i++) {
        const loco__hello *r = &hs[i].peer;
        if (r->status != 0) {
            rc = LOCO_ERR(r->status, "net: %s:%d refused the link: %s", host, port,
                          r->reason[0] ? r->reason : loco_strerror(r->status));
            goto out;
        }
        const char *who = conns[i]->peer_name[0] ? conns[i]->peer_name : r->name;
        if (r->link_id != hello.link_id || r->stream != (uint32_t)i ||
            r->n_streams != (uint32_t)n || strcmp(who, peer) != 0) {
            rc = LOCO_ERR(LOCO_EPROTO, "net: %s:%d answered stream %d with another link's HELLO",
                          host, port, i);
            goto out;
        }
        if (r->max_frame < peer_max)
            peer_max = r->max_frame;
    }
    if (p->run_id && hs[0].peer.run_id && hs[0].peer.run_id != p->run_id) {
        rc = LOCO_ERR(LOCO_EAUTH, "net: %s:%d serves run %016llx, not %016llx", host, port,
                      (unsigned long long)hs[0].peer.run_id, (unsigned long long)p->run_id);
        goto out;
    }
    if (p->expect_peer[0] && strcmp(peer, p->expect_peer) != 0) {
        rc = LOCO_ERR(LOCO_EAUTH, "net: %s:%d is '%s', expected '%s'", host, port, peer,
                      p->expect_peer);
        goto out;
    }
    char name[LOCO_NET_NAME_MAX];
    snprintf(name, sizeof name, "%s", peer[0] ? peer : conns[0]->addr);
    freeaddrinfo(ai);
    ops->ctx_destroy(ctx); /* sessions hold their own reference */
    rc = loco__link_start(out, p, conns, n, name, peer_max, false);
    return rc;
out:
    for (int i = 0; i < n; i++)
        loco__conn_destroy(conns[i]);
    if (ai)
        freeaddrinfo(ai);
    ops->ctx_destroy(ctx);
    return rc;
}
