/* The plain TCP backend: no handshake, no identity (the peer is known by the
 * name in its HELLO). For tests and for measuring what TLS costs. */
#include "net/internal.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

static int plain_ctx_create(void **ctx, const loco_net_params *p, bool server) {
    *ctx = NULL;
    return 0;
}

static void plain_ctx_destroy(void *ctx) {}

static int plain_attach(loco__conn *c, void *ctx, bool server) {
    return 0;
}

static int plain_handshake(loco__conn *c) {
    return 0;
}

static long io_error(loco__conn *c, const char *what) {
    c->failed = true;
    c->last_errno = errno;
    if (errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN)
        return LOCO_ERR(LOCO_EPEER, "net: %s %s: %s", what, c->addr, strerror(errno));
    return LOCO_ERR(LOCO_EIO, "net: %s %s: %s", what, c->addr, strerror(errno));
}

static long plain_read(loco__conn *c, void *buf, size_t len) {
    for (;;) {
        const ssize_t n = recv(c->fd, buf, len, 0);
        if (n > 0) {
            atomic_fetch_add(&c->wire_in, (uint64_t)n);
            return n;
        }
        if (n == 0)
            return LOCO__EOF;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return LOCO__WANT_READ;
        return io_error(c, "read from");
    }
}

static long plain_write(loco__conn *c, const void *buf, size_t len) {
    for (;;) {
        const ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL);
        if (n >= 0) {
            atomic_fetch_add(&c->wire_out, (uint64_t)n);
            return n > 0 ? n : LOCO__WANT_WRITE;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return LOCO__WANT_WRITE;
        return io_error(c, "write to");
    }
}

static void plain_shutdown(loco__conn *c) {}

static int plain_peer_name(loco__conn *c) {
    c->peer_name[0] = '\0';
    return 0;
}

static void plain_describe(loco__conn *c, char *buf, size_t cap) {
    snprintf(buf, cap, "plain");
}

static void plain_detach(loco__conn *c) {}

const loco__transport_ops loco__plain_ops = {
    .name = "plain",
    .ctx_create = plain_ctx_create,
    .ctx_destroy = plain_ctx_destroy,
    .attach = plain_attach,
    .handshake = plain_handshake,
    .read = plain_read,
    .write = plain_write,
    .shutdown = plain_shutdown,
    .peer_name = plain_peer_name,
    .describe = plain_describe,
    .detach = plain_detach,
};
