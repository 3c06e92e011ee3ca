/* WAN emulation and fault injection on links over 127.0.0.1. Times are
 * asserted from below only (sleeps never end early); the upper bounds only
 * catch a hang. */
#include "tests/net/net_test.h"

TestSuite(net_wan, .init = t_setup_certs, .fini = t_teardown_certs, .timeout = 30);

Test(net_wan, delay_makes_a_round_trip_at_least_twice_as_long) {
    loco_net_params sp, cp;
    t_params_tls(&sp, "coordinator");
    t_params_tls(&cp, "siteA");
    sp.wan.delay_ms = cp.wan.delay_ms = 50;
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    for (int i = 0; i < 3; i++) {
        const double t0 = loco_now();
        t_send(pr.client, LOCO_FRAME_HEARTBEAT, (uint64_t)i, 64, (uint64_t)i);
        t_expect(pr.server, LOCO_FRAME_HEARTBEAT, (uint64_t)i, 64, (uint64_t)i);
        const double one_way = loco_now() - t0;
        t_send(pr.server, LOCO_FRAME_ACK, (uint64_t)i, 0, 0);
        t_expect(pr.client, LOCO_FRAME_ACK, (uint64_t)i, 0, 0);
        const double rtt = loco_now() - t0;
        cr_assert_geq(one_way, 0.050, "one way %.3f s", one_way);
        cr_assert_geq(rtt, 0.100, "round trip %.3f s", rtt);
        cr_assert_lt(rtt, 5.0, "round trip %.3f s", rtt);
    }
    /* Off at run time. */
    loco_link_set_wan(pr.client, NULL);
    loco_link_set_wan(pr.server, NULL);
    const double t0 = loco_now();
    t_send(pr.client, LOCO_FRAME_HEARTBEAT, 9, 0, 0);
    t_expect(pr.server, LOCO_FRAME_HEARTBEAT, 9, 0, 0);
    cr_assert_lt(loco_now() - t0, 5.0);
    t_pair_close(&pr);
}

Test(net_wan, bandwidth_cap_paces_the_sender) {
    loco_net_params sp, cp;
    t_params_tls(&sp, "coordinator");
    t_params_tls(&cp, "siteA");
    cp.streams = 4;
    cp.wan.gbps = 0.1; /* 100 Mbit/s for the whole link */
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    const size_t total = 5000000, chunk = 500000;
    const double t0 = loco_now();
    for (size_t i = 0; i < total / chunk; i++)
        t_send(pr.client, LOCO_FRAME_PSEUDOGRAD, i, chunk, i);
    for (size_t i = 0; i < total / chunk; i++)
        t_expect(pr.server, LOCO_FRAME_PSEUDOGRAD, i, chunk, i);
    const double dt = loco_now() - t0;
    /* 5 MB (plus headers) at 1e8 bit/s is 0.4 s at the very least. */
    cr_assert_geq(dt, 0.4, "5 MB took %.3f s under a 100 Mbit/s cap", dt);
    cr_assert_lt(dt, 10.0, "5 MB took %.3f s", dt);
    t_pair_close(&pr);
}

Test(net_wan, jitter_never_reorders) {
    loco_net_params sp, cp;
    t_params_plain(&sp, "coordinator");
    t_params_plain(&cp, "siteA");
    cp.streams = 4;
    cp.queue_frames = 64;
    cp.wan.delay_ms = 3;
    cp.wan.jitter_ms = 3;
    cp.wan.seed = 11;
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    for (int i = 0; i < 200; i++)
        t_send(pr.client, LOCO_FRAME_PSEUDOGRAD, (uint64_t)i, (size_t)(i % 5) * 1000, (uint64_t)i);
    for (int i = 0; i < 200; i++)
        t_expect(pr.server, LOCO_FRAME_PSEUDOGRAD, (uint64_t)i, (size_t)(i % 5) * 1000,
                 (uint64_t)i);
    t_pair_close(&pr);
}

Test(net_wan, drop_everything_then_nothing) {
    loco_net_params sp, cp;
    t_params_tls(&sp, "coordinator");
    t_params_tls(&cp, "siteA");
    cp.streams = 2;
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    loco_link_faults f = {.drop = 1, .seed = 1};
    loco_link_set_faults(pr.client, &f);
    for (int i = 0; i < 10; i++)
        t_send(pr.client, LOCO_FRAME_PSEUDOGRAD, (uint64_t)i, 1000, (uint64_t)i);
    cr_assert_eq(loco_link_flush(pr.client, T_RECV_MS), 0);
    loco_frame_hdr h;
    void *pl;
    cr_assert_eq(loco_link_recv(pr.server, &h, &pl, 300), LOCO_ETIMEDOUT);
    loco_link_stats st;
    loco_link_get_stats(pr.client, &st);
    cr_assert_eq(st.faults_dropped, 10u);
    cr_assert_eq(st.frames_sent, 0u);
    /* Dropped frames took no sequence numbers: the link goes on. */
    loco_link_set_faults(pr.client, NULL);
    t_send(pr.client, LOCO_FRAME_PSEUDOGRAD, 10, 1000, 10);
    t_send(pr.client, LOCO_FRAME_PSEUDOGRAD, 11, 1000, 11);
    t_expect(pr.server, LOCO_FRAME_PSEUDOGRAD, 10, 1000, 10);
    t_expect(pr.server, LOCO_FRAME_PSEUDOGRAD, 11, 1000, 11);
    /* Faults that spare a type: heartbeats pass, pseudo-gradients do not. */
    f.types = 1u << LOCO_FRAME_PSEUDOGRAD;
    loco_link_set_faults(pr.client, &f);
    t_send(pr.client, LOCO_FRAME_PSEUDOGRAD, 12, 10, 12);
    t_send(pr.client, LOCO_FRAME_HEARTBEAT, 13, 0, 0);
    t_expect(pr.server, LOCO_FRAME_HEARTBEAT, 13, 0, 0);
    t_pair_close(&pr);
}

Test(net_wan, corrupt_drops_the_link) {
    loco_net_params sp, cp;
    t_params_tls(&sp, "coordinator");
    t_params_tls(&cp, "siteA");
    cp.faults.corrupt = 1;
    cp.faults.seed = 3;
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    t_send(pr.client, LOCO_FRAME_PSEUDOGRAD, 0, 20000, 0);
    loco_frame_hdr h;
    void *pl = NULL;
    cr_assert_eq(loco_link_recv(pr.server, &h, &pl, T_RECV_MS), LOCO_EPROTO);
    t_assert_has(loco_errmsg(), "checksum mismatch");
    cr_assert_null(pl);
    loco_link_stats st;
    loco_link_get_stats(pr.client, &st);
    cr_assert_eq(st.faults_corrupted, 1u);
    t_pair_close(&pr);
}

Test(net_wan, corrupt_header_only_frames_too) {
    loco_net_params sp, cp;
    t_params_plain(&sp, "coordinator");
    t_params_plain(&cp, "siteA");
    cp.faults.corrupt = 1;
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    t_send(pr.client, LOCO_FRAME_HEARTBEAT, 0, 0, 0);
    loco_frame_hdr h;
    void *pl = NULL;
    cr_assert_eq(loco_link_recv(pr.server, &h, &pl, T_RECV_MS), LOCO_EPROTO);
    t_pair_close(&pr);
}

Test(net_wan, duplicate_and_delay) {
    loco_net_params sp, cp;
    t_params_plain(&sp, "coordinator");
    t_params_plain(&cp, "siteA");
    cp.streams = 3;
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    loco_link_faults f = {.duplicate = 1, .seed = 5};
    loco_link_set_faults(pr.client, &f);
    for (int i = 0; i < 5; i++)
        t_send(pr.client, LOCO_FRAME_STATE, (uint64_t)i, 777, (uint64_t)i);
    for (int i = 0; i < 5; i++) {
        t_expect(pr.server, LOCO_FRAME_STATE, (uint64_t)i, 777, (uint64_t)i);
        t_expect(pr.server, LOCO_FRAME_STATE, (uint64_t)i, 777, (uint64_t)i);
    }
    loco_link_faults d = {.delay = 1, .delay_ms = 100, .seed = 5};
    loco_link_set_faults(pr.client, &d);
    const double t0 = loco_now();
    t_send(pr.client, LOCO_FRAME_ACK, 5, 1, 5);
    t_expect(pr.server, LOCO_FRAME_ACK, 5, 1, 5);
    cr_assert_geq(loco_now() - t0, 0.1);
    loco_link_stats st;
    loco_link_get_stats(pr.client, &st);
    cr_assert_eq(st.faults_duplicated, 5u);
    cr_assert_eq(st.faults_delayed, 1u);
    t_pair_close(&pr);
}

/* Which of 64 frames survive drop = 0.5 with this seed. */
static uint64_t survivors(uint64_t seed) {
    loco_net_params sp, cp;
    t_params_plain(&sp, "coordinator");
    t_params_plain(&cp, "siteA");
    cp.faults.drop = 0.5;
    cp.faults.seed = seed;
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    for (int i = 0; i < 64; i++)
        t_send(pr.client, LOCO_FRAME_HEARTBEAT, (uint64_t)i, 0, 0);
    t_send(pr.client, LOCO_FRAME_BYE, 64, 0, 0); /* may be dropped too */
    loco_link_close(pr.client);
    uint64_t mask = 0;
    for (;;) {
        loco_frame_hdr h;
        void *pl;
        const int rc = loco_link_recv(pr.server, &h, &pl, T_RECV_MS);
        if (rc == LOCO_EPEER)
            break;
        cr_assert_eq(rc, 0, "%s", loco_errmsg());
        if (h.step < 64)
            mask |= 1ull << h.step;
    }
    t_pair_close(&pr);
    return mask;
}

Test(net_wan, a_seed_replays_the_same_faults) {
    const uint64_t a = survivors(99), b = survivors(99), c = survivors(100);
    cr_assert_eq(a, b, "same seed, different drops: %016llx %016llx", (unsigned long long)a,
                 (unsigned long long)b);
    cr_assert_neq(a, c);
    cr_assert_neq(a, 0u);
    cr_assert_neq(a, ~0ull);
}
