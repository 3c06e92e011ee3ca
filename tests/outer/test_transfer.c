/* State transfer to a rejoining island (outer/peers.c): the fetched
 * θ_global and momentum are the donor's bits; a donor killed in the middle
 * of the transfer is replaced by the next one, which goes on from the chunk
 * reached; a donor that holds another outer step says so. */
#include "core/core.h"
#include "outer/outer.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N ((size_t)3 << 20) /* 24 MiB of state: several chunks */

static loco_outer_params op = {.H = 1, .nesterov = true, .lr = 0.7f, .momentum = 0.9f};

/* A donor's state: the same on every donor (as after a committed step). */
static loco_outer *donor_state(void) {
    float *theta = loco_alloc(N * sizeof(float));
    cr_assert(theta);
    loco_rng rng;
    loco_rng_seed(&rng, 5);
    for (size_t i = 0; i < N; i++)
        theta[i] = 0.02f * loco_rng_normal(&rng);
    loco_codec_params cp;
    loco_codec_params_default(&cp);
    loco_outer *o;
    cr_assert_eq(loco_outer_create(&o, &op, &cp, N, theta), 0, "%s", loco_errmsg());
    float *m = loco_outer_momentum(o);
    for (size_t i = 0; i < N; i++)
        m[i] = i % 3 == 0 ? -0.0f : 1e-3f * theta[(i * 31) % N];
    loco_free(theta);
    return o;
}

static loco_outer *empty_state(void) {
    float *zero = loco_alloc(N * sizeof(float));
    loco_codec_params cp;
    loco_codec_params_default(&cp);
    loco_outer *o;
    cr_assert_eq(loco_outer_create(&o, &op, &cp, N, zero), 0);
    loco_free(zero);
    return o;
}

static loco_net_params plain(double gbps) {
    loco_net_params p;
    loco_net_params_default(&p);
    p.backend = LOCO_NET_PLAIN;
    p.streams = 2;
    p.wan.gbps = gbps;
    return p;
}

typedef struct {
    char sites[2][LOCO_NET_NAME_MAX];
    char addrs[2][LOCO_ADDR_MAX];
    int n;
} donors;

static int fetch(const donors *d, loco_outer *into, int64_t *step, loco_state_stats *st) {
    loco_net_params p = plain(0);
    int64_t inner = 0;
    *step = -1;
    const loco_outer_set set = {&into, 1};
    return loco_state_fetch(&p, d->n, (const char (*)[LOCO_NET_NAME_MAX])d->sites,
                            (const char (*)[LOCO_ADDR_MAX])d->addrs, step, &set, &inner, st,
                            10000);
}

TestSuite(transfer, .timeout = 60);

Test(transfer, fetched_state_is_the_donors_bits) {
    loco_log_set_level(LOCO_LOG_ERROR);
    loco_outer *src = donor_state(), *dst = empty_state();
    loco_net_params p = plain(0);
    loco_peers *svc;
    cr_assert_eq(loco_peers_create(&svc, &p, "127.0.0.1", &(loco_outer_set){&src, 1}, 10000), 0, "%s", loco_errmsg());
    loco_peers_publish(svc, 4, 40);
    donors d = {.n = 1, .sites = {"a"}};
    snprintf(d.addrs[0], LOCO_ADDR_MAX, "127.0.0.1:%d", loco_peers_port(svc));
    int64_t step;
    loco_state_stats st;
    cr_assert_eq(fetch(&d, dst, &step, &st), 0, "%s", loco_errmsg());
    cr_expect_eq(step, 4);
    cr_expect(st.chunks > 2, "%zu chunks", st.chunks);
    cr_expect_eq(memcmp(loco_outer_theta(dst), loco_outer_theta(src), N * sizeof(float)), 0);
    cr_expect_eq(memcmp(loco_outer_momentum(dst), loco_outer_momentum(src), N * sizeof(float)),
                 0, "momentum bit for bit, -0.0 included");
    loco_peers_destroy(svc);
    loco_outer_destroy(src);
    loco_outer_destroy(dst);
}

/* Donor A (another process, on a slow link) is killed mid-transfer; the
 * joiner asks donor B, which goes on from the chunk A had reached. */
Test(transfer, a_donor_killed_midway_is_replaced_and_the_transfer_resumes) {
    loco_log_set_level(LOCO_LOG_ERROR);
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t a = fork();
    cr_assert(a >= 0);
    if (a == 0) {
        loco_outer *o = donor_state();
        loco_net_params p = plain(0.1); /* 12.5 MB/s: the transfer takes ~2 s */
        p.queue_frames = 1;             /* what is served is about what was sent */
        loco_peers *svc;
        if (loco_peers_create(&svc, &p, "127.0.0.1", &(loco_outer_set){&o, 1}, 10000) != 0)
            _exit(1);
        loco_peers_publish(svc, 9, 90);
        int port = loco_peers_port(svc);
        if (write(fds[1], &port, sizeof port) != sizeof port)
            _exit(1);
        /* Dies (SIGKILL, no goodbye) once five of the six chunks were
         * handed to the link (at most four of them still queued or on the
         * wire), however slow the machine is today. */
        while (loco_peers_served_bytes(svc) < (15u << 20)) {
            struct timespec ts = {0, 2 * 1000000L};
            nanosleep(&ts, NULL);
        }
        raise(SIGKILL);
    }
    int port_a = 0;
    cr_assert_eq(read(fds[0], &port_a, sizeof port_a), (ssize_t)sizeof port_a);
    loco_outer *src = donor_state(), *dst = empty_state();
    loco_net_params p = plain(0);
    loco_peers *svc;
    cr_assert_eq(loco_peers_create(&svc, &p, "127.0.0.1", &(loco_outer_set){&src, 1}, 10000), 0);
    loco_peers_publish(svc, 9, 90);
    donors d = {.n = 2, .sites = {"a", "b"}};
    snprintf(d.addrs[0], LOCO_ADDR_MAX, "127.0.0.1:%d", port_a);
    snprintf(d.addrs[1], LOCO_ADDR_MAX, "127.0.0.1:%d", loco_peers_port(svc));
    int64_t step;
    loco_state_stats st;
    int rc = fetch(&d, dst, &step, &st);
    kill(a, SIGKILL);
    waitpid(a, NULL, 0);
    cr_assert_eq(rc, 0, "%s", loco_errmsg());
    cr_expect_eq(st.donors_tried, 2);
    cr_expect_gt(st.resumed_from, 0, "donor b went on from chunk %zu of %zu", st.resumed_from,
                 st.chunks);
    cr_expect_lt(st.resumed_from, st.chunks);
    cr_expect_eq(step, 9);
    cr_expect_eq(loco_outer_hash(dst), loco_outer_hash(src));
    cr_expect_eq(memcmp(loco_outer_momentum(dst), loco_outer_momentum(src), N * sizeof(float)), 0);
    loco_peers_destroy(svc);
    loco_outer_destroy(src);
    loco_outer_destroy(dst);
}

/* A donor asked for a step it does not hold refuses with the reason. */
Test(transfer, a_donor_at_another_step_refuses) {
    loco_log_set_level(LOCO_LOG_ERROR);
    loco_outer *src = donor_state(), *dst = empty_state();
    loco_net_params p = plain(0);
    loco_peers *svc;
    cr_assert_eq(loco_peers_create(&svc, &p, "127.0.0.1", &(loco_outer_set){&src, 1}, 10000), 0);
    loco_peers_publish(svc, 3, 30);
    char host[64];
    snprintf(host, sizeof host, "127.0.0.1");
    loco_link *l;
    cr_assert_eq(loco_net_connect(&l, &p, host, loco_peers_port(svc), -1), 0);
    const char *req = "{\"outer_step\":2,\"from\":0}";
    loco_frame_hdr h = {.type = LOCO_FRAME_STATE_REQ, .step = 2};
    cr_assert_eq(loco_link_send(l, &h, req, strlen(req)), 0);
    void *payload = NULL;
    cr_assert_eq(loco_link_recv(l, &h, &payload, 5000), 0, "%s", loco_errmsg());
    cr_expect_eq(h.type, LOCO_FRAME_ERROR);
    cr_expect(h.payload_len > 0 && strstr(payload, "holds 3"), "%.*s", (int)h.payload_len,
              (char *)payload);
    loco_free(payload);
    loco_link_destroy(l);
    loco_peers_destroy(svc);
    loco_outer_destroy(src);
    loco_outer_destroy(dst);
}

Test(transfer, state_messages_refuse_bad_input) {
    int64_t step;
    size_t from;
    cr_expect_eq(loco_state_request_parse("{\"outer_step\":3,\"from\":2}", 25, &step, &from), 0);
    cr_expect(step == 3 && from == 2);
    const char *bad[] = {"", "{}", "{\"outer_step\":3}", "{\"outer_step\":-5,\"from\":0}",
                         "{\"outer_step\":3,\"from\":-1}", "{\"outer_step\":1e300,\"from\":0}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_eq(loco_state_request_parse(bad[i], strlen(bad[i]), &step, &from), LOCO_EPROTO,
                     "%s", bad[i]);
    loco_state_meta m;
    const char *good = "{\"outer_step\":3,\"inner_step\":30,\"n\":5,\"chunks\":1,"
                       "\"hash\":\"0123456789abcdef\"}";
    cr_expect_eq(loco_state_meta_parse(good, strlen(good), &m), 0);
    cr_expect(m.outer_step == 3 && m.n == 5 && m.hash == 0x0123456789abcdefull);
    const char *badm = "{\"outer_step\":3,\"inner_step\":30,\"n\":5,\"chunks\":1,\"hash\":\"12\"}";
    cr_expect_eq(loco_state_meta_parse(badm, strlen(badm), &m), LOCO_EPROTO);
}
