/* The HELLO exchange that turns a TLS (or plain) connection into a stream of
 * a link: the client says which link and stream it is, the server answers
 * with its own HELLO (status 0) or a refusal with a reason. Both directions
 * are ordinary frames with a fixed-size payload, parsed like any other. Runs
 * as a non-blocking state machine so that one thread drives many. */
#include "net/internal.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

/* HELLO payload byte offsets (docs/NET.md). */
enum {
    H_LINK_ID = 0,
    H_STREAM = 8,
    H_N_STREAMS = 12,
    H_MAX_FRAME = 16,
    H_STATUS = 24,
    H_RESERVED = 28,
    H_NAME = 32,
    H_REASON = 96,
    H_END = 224,
};
_Static_assert(H_END == LOCO__HELLO_PAYLOAD, "HELLO layout");
_Static_assert(H_REASON - H_NAME == LOCO_NET_NAME_MAX, "HELLO name field");

bool loco__name_ok(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (s[n] < 0x20 || s[n] > 0x7e || n >= LOCO_NET_NAME_MAX - 1)
            return false;
    return n > 0;
}

void loco__hello_encode(uint8_t out[LOCO__HELLO_FRAME], const loco__hello *h) {
    uint8_t *pl = out + LOCO_FRAME_HEADER_BYTES;
    memset(pl, 0, LOCO__HELLO_PAYLOAD);
    loco_put_le64(pl + H_LINK_ID, h->link_id);
    loco_put_le32(pl + H_STREAM, h->stream);
    loco_put_le32(pl + H_N_STREAMS, h->n_streams);
    loco_put_le64(pl + H_MAX_FRAME, h->max_frame);
    loco_put_le32(pl + H_STATUS, (uint32_t)h->status);
    memcpy(pl + H_NAME, h->name, strnlen(h->name, LOCO_NET_NAME_MAX - 1));
    memcpy(pl + H_REASON, h->reason, strnlen(h->reason, H_END - H_REASON - 1));
    loco_frame_hdr fh = {
        .type = LOCO_FRAME_HELLO,
        .run_id = h->run_id,
        .payload_len = LOCO__HELLO_PAYLOAD,
        .payload_hash = loco_frame_hash_payload(pl, LOCO__HELLO_PAYLOAD),
    };
    (void)loco_frame_encode_header(out, &fh, LOCO__HELLO_PAYLOAD);
}

int loco__hello_parse(loco__hello *h, const uint8_t in[LOCO__HELLO_FRAME]) {
    loco_frame_hdr fh;
    LOCO_CHECK(loco_frame_parse_header(&fh, in, LOCO_FRAME_HEADER_BYTES, LOCO__HELLO_PAYLOAD));
    if (fh.type != LOCO_FRAME_HELLO || fh.payload_len != LOCO__HELLO_PAYLOAD)
        return LOCO_ERR(LOCO_EPROTO, "HELLO expected, got a %s frame of %llu bytes",
                        loco_frame_type_name(fh.type), (unsigned long long)fh.payload_len);
    const uint8_t *pl = in + LOCO_FRAME_HEADER_BYTES;
    LOCO_CHECK(loco_frame_verify_payload(&fh, pl, LOCO__HELLO_PAYLOAD));
    memset(h, 0, sizeof *h);
    h->link_id = loco_get_le64(pl + H_LINK_ID);
    h->stream = loco_get_le32(pl + H_STREAM);
    h->n_streams = loco_get_le32(pl + H_N_STREAMS);
    h->max_frame = loco_get_le64(pl + H_MAX_FRAME);
    h->status = (int32_t)loco_get_le32(pl + H_STATUS);
    h->run_id = fh.run_id;
    if (loco_get_le32(pl + H_RESERVED) != 0)
        return LOCO_ERR(LOCO_EPROTO, "HELLO: reserved bytes not zero");
    if (h->n_streams < 1 || h->n_streams > LOCO_NET_MAX_STREAMS || h->stream >= h->n_streams)
        return LOCO_ERR(LOCO_EPROTO, "HELLO: stream %u of %u (at most %d streams)", h->stream,
                        h->n_streams, LOCO_NET_MAX_STREAMS);
    if (h->max_frame < 1 || h->max_frame > LOCO_FRAME_PAYLOAD_CEILING)
        return LOCO_ERR(LOCO_EPROTO, "HELLO: frame limit %llu out of range",
                        (unsigned long long)h->max_frame);
    if (h->status > 0 || h->status < LOCO_ENOTSUP)
        return LOCO_ERR(LOCO_EPROTO, "HELLO: status %d unknown", h->status);
    const char *name = (const char *)pl + H_NAME;
    if (!memchr(name, 0, LOCO_NET_NAME_MAX))
        return LOCO_ERR(LOCO_EPROTO, "HELLO: name not terminated");
    memcpy(h->name, name, LOCO_NET_NAME_MAX);
    if (h->name[0] && !loco__name_ok(h->name))
        return LOCO_ERR(LOCO_EPROTO, "HELLO: name is not printable ASCII");
    /* The reason is shown to a person: keep printable bytes only. */
    const uint8_t *r = pl + H_REASON;
    size_t n = 0;
    for (; n < sizeof h->reason - 1 && r[n]; n++)
        h->reason[n] = (r[n] >= 0x20 && r[n] <= 0x7e) ? (char)r[n] : '?';
    h->reason[n] = '\0';
    return 0;
}

void loco__hs_init_client(loco__hs *h, loco__conn *c, const loco__hello *hello, bool connecting,
                          double deadline) {
    memset(h, 0, sizeof *h);
    h->c = c;
    h->server = false;
    h->state = connecting ? LOCO__HS_CONNECTING : LOCO__HS_TLS;
    h->deadline = deadline;
    loco__hello_encode(h->out, hello);
}

void loco__hs_init_server(loco__hs *h, loco__conn *c, double deadline) {
    memset(h, 0, sizeof *h);
    h->c = c;
    h->server = true;
    h->state = LOCO__HS_TLS;
    h->deadline = deadline;
}

void loco__hs_reply(loco__hs *h, const loco__hello *reply) {
    loco__hello_encode(h->out, reply);
    h->out_off = 0;
    h->state = LOCO__HS_SEND;
}

static int want_of(long n, loco__hs *h) {
    h->want = n == LOCO__WANT_READ ? POLLIN : POLLOUT;
    return 1;
}

int loco__hs_step(loco__hs *h) {
    loco__conn *c = h->c;
    for (;;) {
        switch (h->state) {
        case LOCO__HS_CONNECTING: {
            struct pollfd pf = {.fd = c->fd, .events = POLLOUT};
            if (poll(&pf, 1, 0) == 0) {
                h->want = POLLOUT;
                return 1;
            }
            int err = 0;
            socklen_t sl = sizeof err;
            if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0)
                err = errno;
            if (err)
                return LOCO_ERR(LOCO_EIO, "net: connect to %s: %s", c->addr, strerror(err));
            h->state = LOCO__HS_TLS;
            break;
        }
        case LOCO__HS_TLS: {
            const int rc = c->ops->handshake(c);
            if (rc == LOCO__WANT_READ || rc == LOCO__WANT_WRITE)
                return want_of(rc, h);
            LOCO_CHECK(rc);
            LOCO_CHECK(c->ops->peer_name(c));
            h->state = h->server ? LOCO__HS_RECV : LOCO__HS_SEND;
            break;
        }
        case LOCO__HS_SEND: {
            const long n = c->ops->write(c, h->out + h->out_off, LOCO__HELLO_FRAME - h->out_off);
            if (n == LOCO__WANT_READ || n == LOCO__WANT_WRITE)
                return want_of(n, h);
            if (n < 0)
                return (int)n;
            h->out_off += (size_t)n;
            if (h->out_off == LOCO__HELLO_FRAME)
                h->state = h->server ? LOCO__HS_DONE : LOCO__HS_RECV;
            break;
        }
        case LOCO__HS_RECV: {
            const long n = c->ops->read(c, h->in + h->in_off, LOCO__HELLO_FRAME - h->in_off);
            if (n == LOCO__WANT_READ || n == LOCO__WANT_WRITE)
                return want_of(n, h);
            if (n == LOCO__EOF)
                return LOCO_ERR(LOCO_EPEER, "net: %s closed the connection during the handshake%s",
                                c->addr, h->server ? "" : " (see the listener's log)");
            if (n < 0)
                return (int)n;
            h->in_off += (size_t)n;
            if (h->in_off < LOCO__HELLO_FRAME)
                break;
            const int rc = loco__hello_parse(&h->peer, h->in);
            if (rc < 0) {
                char why[512];
                loco__errmsg_line(why, sizeof why);
                return LOCO_ERR(rc, "net: bad HELLO from %s: %s", c->addr, why);
            }
            h->state = h->server ? LOCO__HS_GOT_HELLO : LOCO__HS_DONE;
            break;
        }
        case LOCO__HS_GOT_HELLO:
        case LOCO__HS_DONE: return 0;
        }
    }
}
