/* What a peer can make a link hold: payload memory follows the bytes that
 * arrived, not the lengths claimed; received payload stays within the
 * link's budget (net.link_buffer_mb) while every frame still arrives in
 * order; a listener refuses links of too many streams and links beyond
 * net.max_pending, with the reason. */
#include "tests/net/net_test.h"

#include <pthread.h>
#include <time.h>

TestSuite(net_limits, .init = t_setup_certs, .fini = t_teardown_certs, .timeout = 30);

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double live_mib(size_t since) {
    return ((double)loco_alloc_live_bytes() - (double)since) / (1 << 20);
}

/* Waits until the server end reserved at least `bytes` for frames. */
static void wait_held(loco_link *l, uint64_t bytes) {
    for (int k = 0; k < 500; k++) {
        loco_link_stats st;
        loco_link_get_stats(l, &st);
        if (st.rx_held_peak >= bytes)
            return;
        sleep_ms(10);
    }
    cr_assert_fail("the reader never took the header");
}

Test(net_limits, a_claimed_length_costs_only_the_bytes_that_arrive) {
    loco_net_params sp, cp;
    t_params_plain(&sp, "coordinator");
    t_params_plain(&cp, "siteA");
    cp.streams = 8;
    const uint64_t claim = sp.max_frame_bytes; /* 64 MiB, the limit */
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    const size_t live0 = loco_alloc_live_bytes();
    for (int st = 0; st < cp.streams; st++) {
        loco_frame_hdr h = t_hdr(LOCO_FRAME_PSEUDOGRAD, 1);
        h.seq = (uint64_t)st;
        h.payload_len = claim;
        uint8_t b[LOCO_FRAME_HEADER_BYTES];
        cr_assert_eq(loco_frame_encode_header(b, &h, claim), 0);
        cr_assert_eq(loco_link_write_raw(pr.client, st, b, sizeof b), 0, "%s", loco_errmsg());
    }
    /* 8 x 64 MiB claimed: the budget (4 x 64 MiB) reserves three or four
     * (frames ahead of the next one leave room for it), and each of those
     * holds one small buffer so far. */
    wait_held(pr.server, 3 * claim);
    sleep_ms(100);
    loco_link_stats st;
    loco_link_get_stats(pr.server, &st);
    cr_expect_leq(st.rx_held_peak, 4 * claim, "reserved %llu", (unsigned long long)st.rx_held_peak);
    cr_expect_lt(live_mib(live0), 1.0, "%.2f MiB allocated for nothing", live_mib(live0));
    /* 3 MiB of the first frame arrive: the buffer follows them. */
    const size_t part = 3 << 20;
    uint8_t *bytes = calloc(1, part);
    cr_assert_eq(loco_link_write_raw(pr.client, 0, bytes, part), 0, "%s", loco_errmsg());
    free(bytes);
    sleep_ms(300);
    cr_expect_lt(live_mib(live0), 16.0, "%.2f MiB for 3 MiB received", live_mib(live0));
    /* The client hangs up mid-frame: the server end says so and lets go. */
    loco_link_abort(pr.client);
    loco_frame_hdr h;
    void *pl = NULL;
    cr_expect_eq(loco_link_recv(pr.server, &h, &pl, T_RECV_MS), LOCO_EPEER, "%s", loco_errmsg());
    t_assert_has(loco_errmsg(), "middle of a frame");
    t_pair_close(&pr);
    cr_expect_leq(loco_alloc_live_bytes(), live0);
}

typedef struct {
    loco_link *l;
    int n;
    size_t max;
} sender;

/* Frame i's length: spread over 0..max (frame 0 is empty). */
static size_t frame_len(int i, size_t max) {
    return (size_t)(((uint64_t)i * 0x9e3779b97f4a7c15ull >> 40) % (max + 1));
}

static void *send_main(void *arg) {
    sender *s = arg;
    for (int i = 0; i < s->n; i++)
        t_send(s->l, LOCO_FRAME_PSEUDOGRAD, (uint64_t)i, frame_len(i, s->max), (uint64_t)i);
    return NULL;
}

Test(net_limits, a_link_holds_no_more_than_its_budget_and_delivers_everything) {
    const size_t max = 1 << 20;
    /* The budget at one frame (streams take turns) and at two. */
    for (int k = 1; k <= 2; k++) {
        loco_net_params sp, cp;
        t_params_plain(&sp, "coordinator");
        t_params_plain(&cp, "siteA");
        sp.max_frame_bytes = cp.max_frame_bytes = max;
        sp.link_buffer_bytes = (uint64_t)k * max;
        cp.streams = 4;
        t_pair pr;
        t_pair_open(&pr, &sp, &cp);
        sender s = {.l = pr.client, .n = 48, .max = max};
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, send_main, &s), 0);
        sleep_ms(200); /* the readers fill up what they may */
        for (int i = 0; i < s.n; i++)
            t_expect(pr.server, LOCO_FRAME_PSEUDOGRAD, (uint64_t)i, frame_len(i, max), (uint64_t)i);
        pthread_join(t, NULL);
        loco_link_stats st;
        loco_link_get_stats(pr.server, &st);
        cr_expect_leq(st.rx_held_peak, sp.link_buffer_bytes, "budget %d MiB: held %llu", k,
                      (unsigned long long)st.rx_held_peak);
        cr_expect_gt(st.rx_held_peak, max / 2);
        t_pair_close(&pr);
    }
}

Test(net_limits, too_many_streams_or_pending_links_are_refused_with_the_reason) {
    loco_net_params sp, cp;
    t_params_tls(&sp, "coordinator");
    t_params_tls(&cp, "siteA");
    sp.streams = 1;
    sp.max_streams = 2;
    sp.max_pending = 2;
    loco_net_listener *lst;
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    const int port = loco_net_listener_port(lst);
    loco_link *l[4] = {0};
    cp.streams = 3;
    cr_expect_eq(loco_net_connect(&l[0], &cp, "127.0.0.1", port, -1), LOCO_EPEER);
    t_assert_has(loco_errmsg(), "at most 2 (net.max_streams)");
    /* Two links wait for accept; the third is refused until one is taken. */
    cp.streams = 2;
    for (int i = 0; i < 2; i++)
        cr_assert_eq(loco_net_connect(&l[i], &cp, "127.0.0.1", port, -1), 0, "%s", loco_errmsg());
    for (int k = 0; k < 100; k++) { /* the second link is complete on both ends */
        loco_net_listener_info info;
        loco_net_listener_get_info(lst, &info);
        if (info.links == 2)
            break;
        sleep_ms(10);
    }
    cr_expect_eq(loco_net_connect(&l[2], &cp, "127.0.0.1", port, -1), LOCO_EPEER);
    t_assert_has(loco_errmsg(), "net.max_pending = 2");
    loco_link *a;
    cr_assert_eq(loco_net_accept(lst, &a, T_ACCEPT_MS), 0, "%s", loco_errmsg());
    cr_expect_eq(loco_net_connect(&l[3], &cp, "127.0.0.1", port, -1), 0, "%s", loco_errmsg());
    loco_link_destroy(a);
    for (int i = 0; i < 4; i++)
        loco_link_destroy(l[i]);
    loco_net_listener_destroy(lst);
}

Test(net_limits, params_refuse_a_budget_below_one_frame) {
    loco_net_params p;
    t_params_plain(&p, "x");
    cr_expect_eq(loco_net_params_check(&p, true), 0, "%s", loco_errmsg());
    p.link_buffer_bytes = p.max_frame_bytes - 1;
    cr_expect_eq(loco_net_params_check(&p, true), LOCO_EINVAL);
    t_assert_has(loco_errmsg(), "net.link_buffer_mb");
    p.recv_max_bytes = p.max_frame_bytes / 2; /* now the budget holds a received frame */
    cr_expect_eq(loco_net_params_check(&p, true), 0, "%s", loco_errmsg());
    p.recv_max_bytes = p.max_frame_bytes + 1;
    cr_expect_eq(loco_net_params_check(&p, true), LOCO_EINVAL);
    t_params_plain(&p, "x");
    p.max_streams = 0;
    cr_expect_eq(loco_net_params_check(&p, true), LOCO_EINVAL);
    p.max_streams = 1;
    p.max_pending = LOCO_NET_MAX_PENDING + 1;
    cr_expect_eq(loco_net_params_check(&p, true), LOCO_EINVAL);
}
