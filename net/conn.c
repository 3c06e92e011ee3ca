/* Connections: the socket under a transport, and blocking-with-deadline I/O
 * over non-blocking sockets that a stop descriptor can interrupt. */
#include "net/internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

const loco__transport_ops *loco__backend_ops(loco_net_backend b) {
    return b == LOCO_NET_PLAIN ? &loco__plain_ops : &loco__tls_ops;
}

int loco__conn_create(loco__conn **out, int fd, const loco__transport_ops *ops) {
    *out = NULL;
    loco__conn *c = loco_alloc(sizeof *c);
    if (!c)
        return LOCO_ERR(LOCO_ENOMEM, "net: connection");
    c->fd = fd;
    c->ops = ops;
    pthread_mutex_init(&c->mu, NULL);
    atomic_init(&c->wire_in, 0);
    atomic_init(&c->wire_out, 0);
    loco__sock_addr(fd, true, c->addr, sizeof c->addr);
    *out = c;
    return 0;
}

void loco__conn_destroy(loco__conn *c) {
    if (!c)
        return;
    if (c->impl)
        c->ops->detach(c);
    if (c->fd >= 0)
        close(c->fd);
    pthread_mutex_destroy(&c->mu);
    loco_free(c);
}

void loco__sock_addr(int fd, bool peer, char *buf, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int rc = peer ? getpeername(fd, (struct sockaddr *)&ss, &sl)
                  : getsockname(fd, (struct sockaddr *)&ss, &sl);
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (rc == 0 && ss.ss_family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        port = ntohs(a->sin_port);
    } else if (rc == 0 && ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        port = ntohs(a->sin6_port);
    }
    snprintf(buf, cap, "%s:%d", host, port);
}

const char *loco__errmsg_line(char *buf, size_t cap) {
    const char *m = loco_errmsg();
    const char *nl = strchr(m, '\n');
    const int len = nl ? (int)(nl - m) : (int)strlen(m);
    snprintf(buf, cap, "%.*s", len, m);
    return buf;
}

int loco__sockbuf_bytes(const loco_net_params *p, bool send) {
    int explicit_bytes = send ? p->sndbuf : p->rcvbuf;
    if (explicit_bytes > 0)
        return explicit_bytes;
    if (p->link_gbps <= 0 || p->rtt_ms <= 0)
        return 0;
    const double bdp = p->link_gbps * 1e9 / 8 * p->rtt_ms * 1e-3;
    double per_stream = ceil(bdp / p->streams);
    if (per_stream < LOCO__SOCKBUF_MIN)
        per_stream = LOCO__SOCKBUF_MIN;
    if (per_stream > (double)(1 << 30))
        per_stream = (double)(1 << 30);
    return (int)per_stream;
}

/* Asks for a buffer: the privileged option first (ignores the sysctl cap),
 * then the ordinary one. The kernel doubles what it grants (bookkeeping). */
static void set_buf(int fd, int opt, int force_opt, int bytes) {
    if (bytes <= 0)
        return;
    if (setsockopt(fd, SOL_SOCKET, force_opt, &bytes, sizeof bytes) != 0)
        (void)setsockopt(fd, SOL_SOCKET, opt, &bytes, sizeof bytes);
}

void loco__sock_tune(int fd, const loco_net_params *p) {
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_buf(fd, SO_SNDBUF, SO_SNDBUFFORCE, loco__sockbuf_bytes(p, true));
    set_buf(fd, SO_RCVBUF, SO_RCVBUFFORCE, loco__sockbuf_bytes(p, false));
}

static int ms_until(double deadline) {
    if (deadline <= 0)
        return -1;
    double ms = (deadline - loco_now()) * 1e3;
    if (ms <= 0)
        return 0;
    return ms > 1e9 ? 1000000000 : (int)ceil(ms);
}

int loco__wait_fd(int fd, short events, int stop_fd, double deadline) {
    for (;;) {
        struct pollfd pf[2] = {{.fd = fd, .events = events}, {.fd = stop_fd, .events = POLLIN}};
        const int timeout = ms_until(deadline);
        const int n = poll(pf, stop_fd >= 0 ? 2 : 1, timeout);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return LOCO_ERR(LOCO_EIO, "net: poll: %s", strerror(errno));
        if (stop_fd >= 0 && (pf[1].revents & POLLIN))
            return LOCO__STOPPED;
        if (pf[0].revents)
            return 0;
        if (timeout == 0 || (deadline > 0 && loco_now() >= deadline))
            return LOCO_ETIMEDOUT;
    }
}

int loco__conn_io(loco__conn *c, void *buf, size_t len, bool write, double first_deadline,
                  double idle_s, int stop_fd, size_t *done) {
    size_t off = 0;
    double deadline = first_deadline;
    int rc = 0;
    while (off < len) {
        pthread_mutex_lock(&c->mu);
        const long n = write ? c->ops->write(c, (const char *)buf + off, len - off)
                             : c->ops->read(c, (char *)buf + off, len - off);
        pthread_mutex_unlock(&c->mu);
        if (n > 0) {
            off += (size_t)n;
            deadline = idle_s > 0 ? loco_now() + idle_s : 0;
            continue;
        }
        if (n != LOCO__WANT_READ && n != LOCO__WANT_WRITE) {
            rc = (int)n;
            break;
        }
        rc = loco__wait_fd(c->fd, n == LOCO__WANT_READ ? POLLIN : POLLOUT, stop_fd, deadline);
        if (rc == LOCO_ETIMEDOUT) {
            rc = LOCO_ERR(LOCO_ETIMEDOUT, "net: %s %s made no progress in time (%zu of %zu bytes)",
                          write ? "write to" : "read from", c->addr, off, len);
            break;
        }
        if (rc != 0)
            break;
    }
    if (done)
        *done = off;
    return off == len ? 0 : rc;
}
