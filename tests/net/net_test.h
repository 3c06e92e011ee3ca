/* Helpers shared by the net/ tests: a run's certificates in a temporary
 * directory, parameters for both backends, and a connected pair of links
 * over 127.0.0.1. Static functions: each test file includes this once. */
#ifndef LOCO_TESTS_NET_TEST_H
#define LOCO_TESTS_NET_TEST_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/internal.h"
#include "net/net.h"

/* Helpers a test file may leave unused. */
#define T_FN __attribute__((unused)) static

/* Generous bounds: they catch hangs, never a slow machine. */
#define T_ACCEPT_MS 10000
#define T_RECV_MS 10000

static char *t_dir; /* certificates: ca, coordinator, siteA, siteB */

T_FN void t_setup_certs(void) {
    t_dir = strdup("/tmp/loco-net-XXXXXX");
    cr_assert(mkdtemp(t_dir));
    const char *names[] = {"coordinator", "siteA", "siteB"};
    cr_assert_eq(loco_net_make_certs(t_dir, names, 3, 1), 0, "%s", loco_errmsg());
    loco_err_clear();
}

T_FN void t_teardown_certs(void) {
    loco_alloc_fail_after(0);
    if (t_dir) {
        loco_rmtree(t_dir);
        free(t_dir);
        t_dir = NULL;
    }
}

/* TLS params presenting dir/name.pem and trusting dir/ca.pem. */
T_FN void t_params_tls_in(loco_net_params *p, const char *dir, const char *name,
                          const char *ca_dir) {
    loco_net_params_default(p);
    p->backend = LOCO_NET_TLS;
    if (name) {
        snprintf(p->cert, sizeof p->cert, "%s/%s.pem", dir, name);
        snprintf(p->key, sizeof p->key, "%s/%s.key", dir, name);
    }
    snprintf(p->ca, sizeof p->ca, "%s/ca.pem", ca_dir);
    p->linger_ms = 2000;
}

T_FN void t_params_tls(loco_net_params *p, const char *name) {
    t_params_tls_in(p, t_dir, name, t_dir);
}

T_FN void t_params_plain(loco_net_params *p, const char *name) {
    loco_net_params_default(p);
    p->backend = LOCO_NET_PLAIN;
    if (name)
        snprintf(p->name, sizeof p->name, "%s", name);
}

typedef struct {
    loco_net_listener *lst;
    loco_link *server; /* the listener's end */
    loco_link *client; /* the connecting end */
} t_pair;

/* Listens with sp on an ephemeral port, connects with cp, accepts. */
T_FN void t_pair_open(t_pair *pr, const loco_net_params *sp, const loco_net_params *cp) {
    memset(pr, 0, sizeof *pr);
    cr_assert_eq(loco_net_listen(&pr->lst, sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    const int port = loco_net_listener_port(pr->lst);
    cr_assert_gt(port, 0);
    cr_assert_eq(loco_net_connect(&pr->client, cp, "127.0.0.1", port, -1), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_net_accept(pr->lst, &pr->server, T_ACCEPT_MS), 0, "%s", loco_errmsg());
}

T_FN void t_pair_close(t_pair *pr) {
    loco_link_destroy(pr->client);
    loco_link_destroy(pr->server);
    loco_net_listener_destroy(pr->lst);
    memset(pr, 0, sizeof *pr);
}

/* Deterministic payload bytes for frame i. */
T_FN void t_fill(uint8_t *buf, size_t len, uint64_t seed) {
    loco_rng r;
    loco_rng_seed(&r, seed);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const uint64_t v = loco_rng_u64(&r);
        memcpy(buf + i, &v, 8);
    }
    for (; i < len; i++)
        buf[i] = (uint8_t)loco_rng_u64(&r);
}

T_FN loco_frame_hdr t_hdr(int type, uint64_t step) {
    loco_frame_hdr h = {0};
    h.type = (uint16_t)type;
    h.step = step;
    h.epoch = 7;
    h.shard = 3;
    return h;
}

/* Receives one frame and checks its type, step and payload (t_fill(seed)). */
T_FN void t_expect(loco_link *l, int type, uint64_t step, size_t len, uint64_t seed) {
    loco_frame_hdr h;
    void *pl = NULL;
    const int rc = loco_link_recv(l, &h, &pl, T_RECV_MS);
    cr_assert_eq(rc, 0, "step %llu: %s", (unsigned long long)step, loco_errmsg());
    cr_assert_eq(h.type, type);
    cr_assert_eq(h.step, step, "got step %llu, expected %llu", (unsigned long long)h.step,
                 (unsigned long long)step);
    cr_assert_eq(h.payload_len, len);
    if (len) {
        uint8_t *want = malloc(len);
        t_fill(want, len, seed);
        cr_assert(memcmp(pl, want, len) == 0, "payload of step %llu differs",
                  (unsigned long long)step);
        free(want);
    } else {
        cr_assert_null(pl);
    }
    loco_free(pl);
}

T_FN void t_send(loco_link *l, int type, uint64_t step, size_t len, uint64_t seed) {
    uint8_t *buf = len ? malloc(len) : NULL;
    if (len)
        t_fill(buf, len, seed);
    loco_frame_hdr h = t_hdr(type, step);
    cr_assert_eq(loco_link_send(l, &h, buf, len), 0, "%s", loco_errmsg());
    free(buf);
}

/* Header bytes with the checksum recomputed (after editing fields). */
T_FN void t_rehash(uint8_t *b) {
    const uint64_t h = loco_hash64(b, LOCO_FRAME_HEADER_BYTES - 8);
    for (int i = 0; i < 8; i++)
        b[LOCO_FRAME_HEADER_BYTES - 8 + i] = (uint8_t)(h >> (8 * i));
}

T_FN void t_assert_has(const char *msg, const char *part) {
    cr_assert(strstr(msg, part), "message lacks \"%s\":\n%s", part, msg);
}

#endif
