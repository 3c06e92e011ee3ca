/* Links over 127.0.0.1: mutual TLS with 1 and 4 streams, frames from 1 byte
 * to a few MB in order with their checksums, peer names from certificates,
 * every handshake refusal (other CA, no certificate, expired, garbage, wrong
 * peer) with the listener going on, forged frames refused and the link
 * dropped, orderly close, and the certificates themselves.
 *
 * One file: every link test shares the loopback pair and certificate fixtures. */
#include "tests/net/net_test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

TestSuite(net_link, .init = t_setup_certs, .fini = t_teardown_certs, .timeout = 30);

static const size_t sizes[] = {1,         2,       95,           96, 4096, 16 << 10, (16 << 10) + 1,
                               65536 + 7, 1 << 20, (3 << 20) + 5};
#define N_SIZES (sizeof sizes / sizeof sizes[0])

/* Both directions, every size, in order, then the counters. */
static void frames_both_ways(t_pair *pr) {
    for (size_t i = 0; i < N_SIZES; i++)
        t_send(pr->client, LOCO_FRAME_PSEUDOGRAD, i, sizes[i], 100 + i);
    t_send(pr->client, LOCO_FRAME_HEARTBEAT, N_SIZES, 0, 0);
    for (size_t i = 0; i < N_SIZES; i++)
        t_expect(pr->server, LOCO_FRAME_PSEUDOGRAD, i, sizes[i], 100 + i);
    t_expect(pr->server, LOCO_FRAME_HEARTBEAT, N_SIZES, 0, 0);
    for (size_t i = 0; i < N_SIZES; i++)
        t_send(pr->server, LOCO_FRAME_STATE, 1000 + i, sizes[N_SIZES - 1 - i], 200 + i);
    for (size_t i = 0; i < N_SIZES; i++)
        t_expect(pr->client, LOCO_FRAME_STATE, 1000 + i, sizes[N_SIZES - 1 - i], 200 + i);
    cr_assert_eq(loco_link_flush(pr->client, T_RECV_MS), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_link_flush(pr->server, T_RECV_MS), 0, "%s", loco_errmsg());
    size_t total = 0;
    for (size_t i = 0; i < N_SIZES; i++)
        total += sizes[i] + LOCO_FRAME_HEADER_BYTES;
    loco_link_stats cs, ss;
    loco_link_get_stats(pr->client, &cs);
    loco_link_get_stats(pr->server, &ss);
    cr_assert_eq(cs.frames_sent, N_SIZES + 1);
    cr_assert_eq(ss.frames_recv, N_SIZES + 1);
    cr_assert_eq(cs.bytes_sent, total + LOCO_FRAME_HEADER_BYTES);
    cr_assert_eq(ss.bytes_recv, cs.bytes_sent);
    cr_assert_eq(cs.frames_recv, N_SIZES);
    cr_assert_geq(cs.wire_bytes_sent, cs.bytes_sent);
    cr_assert_geq(ss.wire_bytes_recv, cs.bytes_sent);
}

static void tls_frames(int streams) {
    loco_net_params sp, cp;
    t_params_tls(&sp, "coordinator");
    t_params_tls(&cp, "siteA");
    cp.streams = streams;
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    cr_assert_str_eq(loco_link_peer_name(pr.server), "siteA");
    cr_assert_str_eq(loco_link_peer_name(pr.client), "coordinator");
    loco_link_stats st;
    loco_link_get_stats(pr.client, &st);
    cr_assert_eq(st.streams, streams);
    t_assert_has(st.transport, "TLSv1.3");
    loco_link_get_stats(pr.server, &st);
    cr_assert_eq(st.streams, streams);
    frames_both_ways(&pr);
    t_pair_close(&pr);
}

Test(net_link, tls_one_stream_frames_in_order) {
    tls_frames(1);
}
Test(net_link, tls_four_streams_frames_in_order) {
    tls_frames(4);
}

Test(net_link, plain_many_small_frames_fill_every_queue) {
    loco_net_params sp, cp;
    t_params_plain(&sp, "coordinator");
    t_params_plain(&cp, "siteB");
    cp.streams = 3;
    sp.queue_frames = cp.queue_frames = 2;
    cp.sndbuf = cp.rcvbuf = 256 << 10;
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    loco_link_stats bufs;
    loco_link_get_stats(pr.client, &bufs);
    /* The kernel reports twice what it grants; it grants at least the
     * smaller of what was asked and its cap (never below 128 KiB here). */
    cr_assert_geq(bufs.sndbuf, 256 << 10, "sndbuf %d", bufs.sndbuf);
    cr_assert_geq(bufs.rcvbuf, 256 << 10, "rcvbuf %d", bufs.rcvbuf);
    cr_assert_str_eq(loco_link_peer_name(pr.server), "siteB");
    cr_assert_str_eq(loco_link_peer_name(pr.client), "coordinator");
    loco_link_stats st;
    loco_link_get_stats(pr.client, &st);
    cr_assert_str_eq(st.transport, "plain");
    /* More frames than both queues hold: the socket buffers absorb the
     * rest while this thread is still sending. */
    for (int i = 0; i < 200; i++)
        t_send(pr.client, LOCO_FRAME_ACK, (uint64_t)i, (size_t)(i % 7) * 100, (uint64_t)i);
    for (int i = 0; i < 200; i++)
        t_expect(pr.server, LOCO_FRAME_ACK, (uint64_t)i, (size_t)(i % 7) * 100, (uint64_t)i);
    t_pair_close(&pr);
}

Test(net_link, recv_timeout_keeps_the_link) {
    loco_net_params sp, cp;
    t_params_plain(&sp, NULL);
    t_params_plain(&cp, NULL);
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    loco_frame_hdr h;
    void *pl = (void *)1;
    const double t0 = loco_now();
    cr_assert_eq(loco_link_recv(pr.server, &h, &pl, 100), LOCO_ETIMEDOUT);
    cr_assert_geq(loco_now() - t0, 0.099);
    cr_assert_null(pl);
    cr_assert_eq(loco_link_recv(pr.server, &h, &pl, 0), LOCO_ETIMEDOUT);
    t_send(pr.client, LOCO_FRAME_QUORUM, 1, 10, 1);
    t_expect(pr.server, LOCO_FRAME_QUORUM, 1, 10, 1);
    /* Unnamed plain peers are known by their address. */
    t_assert_has(loco_link_peer_name(pr.server), "127.0.0.1:");
    t_pair_close(&pr);
}

Test(net_link, close_delivers_everything_then_epeer) {
    loco_net_params sp, cp;
    t_params_tls(&sp, "coordinator");
    t_params_tls(&cp, "siteA");
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    for (int i = 0; i < 20; i++)
        t_send(pr.client, LOCO_FRAME_PSEUDOGRAD, (uint64_t)i, 50000, (uint64_t)i);
    t_send(pr.client, LOCO_FRAME_BYE, 20, 0, 0);
    loco_link_destroy(pr.client); /* flushes, ends the streams */
    pr.client = NULL;
    for (int i = 0; i < 20; i++)
        t_expect(pr.server, LOCO_FRAME_PSEUDOGRAD, (uint64_t)i, 50000, (uint64_t)i);
    t_expect(pr.server, LOCO_FRAME_BYE, 20, 0, 0);
    loco_frame_hdr h;
    void *pl;
    cr_assert_eq(loco_link_recv(pr.server, &h, &pl, T_RECV_MS), LOCO_EPEER, "%s", loco_errmsg());
    /* Sending to a peer that left fails, sooner or later, without a signal. */
    int rc = 0;
    for (int i = 0; i < 100 && rc == 0; i++) {
        loco_frame_hdr hb = t_hdr(LOCO_FRAME_HEARTBEAT, (uint64_t)i);
        rc = loco_link_send(pr.server, &hb, NULL, 0);
        if (rc == 0)
            rc = loco_link_flush(pr.server, T_RECV_MS);
        usleep(10000); /* paces the sends: the loop ends on the failure it waits for */
    }
    cr_assert(rc == LOCO_EPEER || rc == LOCO_EIO, "rc %d: %s", rc, loco_errmsg());
    t_pair_close(&pr);
}

Test(net_link, send_checks_and_close_from_another_thread) {
    loco_net_params sp, cp;
    t_params_plain(&sp, "a");
    t_params_plain(&cp, "b");
    sp.max_frame_bytes = 1000;
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    uint8_t buf[2000] = {0};
    loco_frame_hdr h = t_hdr(LOCO_FRAME_STATE, 1);
    /* The peer's limit is the smaller one. */
    cr_assert_eq(loco_link_send(pr.client, &h, buf, 1001), LOCO_EINVAL);
    cr_assert_eq(loco_link_send(pr.client, &h, buf, 1000), 0, "%s", loco_errmsg());
    h.type = LOCO_FRAME_HELLO;
    cr_assert_eq(loco_link_send(pr.client, &h, buf, 10), LOCO_EINVAL);
    h.type = 200;
    cr_assert_eq(loco_link_send(pr.client, &h, buf, 10), LOCO_EINVAL);
    h = t_hdr(LOCO_FRAME_STATE, 2);
    h.chunk = 3;
    h.n_chunks = 3;
    cr_assert_eq(loco_link_send(pr.client, &h, buf, 10), LOCO_EINVAL);
    /* send_move takes the buffer only on success. */
    void *mine = loco_alloc(10);
    h = t_hdr(LOCO_FRAME_STATE, 2);
    cr_assert_eq(loco_link_send_move(pr.client, &h, &mine, 10), 0);
    cr_assert_null(mine);
    mine = loco_alloc(5000);
    cr_assert_eq(loco_link_send_move(pr.client, &h, &mine, 5000), LOCO_EINVAL);
    cr_assert_not_null(mine);
    loco_free(mine);
    loco_frame_hdr got;
    void *pl;
    cr_assert_eq(loco_link_recv(pr.server, &got, &pl, T_RECV_MS), 0);
    cr_assert_eq(got.payload_len, 1000u);
    loco_free(pl);
    cr_assert_eq(loco_link_recv(pr.server, &got, &pl, T_RECV_MS), 0);
    cr_assert_eq(got.step, 2u);
    loco_free(pl);
    /* Close while another thread waits in recv: it wakes with EINVAL. */
    loco_link_close(pr.server);
    cr_assert_eq(loco_link_recv(pr.server, &got, &pl, T_RECV_MS), LOCO_EINVAL);
    cr_assert_eq(loco_link_send(pr.server, &h, NULL, 0), LOCO_EINVAL);
    loco_link_close(pr.server); /* idempotent */
    t_pair_close(&pr);
}

typedef struct {
    loco_link *l;
    _Atomic pid_t tid;    /* the thread's, once it runs */
    _Atomic bool returned; /* loco_link_recv came back */
} blocked_recv;

static void *recv_in_thread(void *arg) {
    blocked_recv *b = arg;
    b->tid = (pid_t)syscall(SYS_gettid);
    loco_frame_hdr h;
    void *pl;
    int rc = loco_link_recv(b->l, &h, &pl, -1);
    b->returned = true;
    return (void *)(intptr_t)rc;
}

/* Waits until thread tid is blocked in the futex call of a condition wait
 * (the one loco_link_recv waits on: the only thing the thread can block
 * in). The sleep only paces the rereads of /proc. */
static void await_futex_sleep(pid_t tid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
    const double end = loco_now() + T_RECV_MS * 1e-3;
    for (;;) {
        long nr = -1;
        FILE *f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%ld", &nr) != 1)
                nr = -1;
            fclose(f);
        }
        if (nr == SYS_futex)
            return;
        cr_assert(loco_now() < end, "the receiving thread never blocked (syscall %ld)", nr);
        usleep(1000);
    }
}

Test(net_link, close_wakes_a_blocked_recv) {
    loco_net_params sp, cp;
    t_params_plain(&sp, "a");
    t_params_plain(&cp, "b");
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    pthread_t th;
    blocked_recv b = {.l = pr.server};
    cr_assert_eq(pthread_create(&th, NULL, recv_in_thread, &b), 0);
    while (!b.tid)
        sched_yield();
    await_futex_sleep(b.tid);
    cr_assert(!b.returned, "recv returned before the close");
    loco_link_close(pr.server);
    void *ret;
    pthread_join(th, &ret);
    cr_assert_eq((int)(intptr_t)ret, LOCO_EINVAL);
    t_pair_close(&pr);
}

/* ------------------------------------------------------- refused peers */

/* A second run's directory, inside the test's (removed with it). */
static char *other_dir(void) {
    char *d = malloc(strlen(t_dir) + 8);
    sprintf(d, "%s/other", t_dir);
    return d;
}

/* Waits until the listener counted a refusal; returns its reason. */
static void await_refusal(loco_net_listener *l, loco_net_listener_info *info) {
    const double end = loco_now() + T_ACCEPT_MS * 1e-3;
    do {
        loco_net_listener_get_info(l, info);
        if (info->refused > 0)
            return;
        usleep(5000);
    } while (loco_now() < end);
    cr_assert_fail("the listener refused nobody");
}

/* The listener refuses the client with cp; then accepts a good one. */
static void refused_then_good(const loco_net_params *cp, const char *reason) {
    loco_net_params sp, good;
    t_params_tls(&sp, "coordinator");
    t_params_tls(&good, "siteB");
    loco_net_listener *lst;
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    const int port = loco_net_listener_port(lst);
    /* One stream: with several, the client's first failure closes the others
     * and the listener's last reason may be that hang-up. */
    loco_net_params one = *cp;
    one.streams = 1;
    loco_link *bad = NULL;
    const int rc = loco_net_connect(&bad, &one, "127.0.0.1", port, -1);
    /* TLS 1.3: the client may finish its handshake before the server's
     * verdict; the refusal arrives as an alert or as the end of the socket. */
    cr_assert(rc == LOCO_EAUTH || rc == LOCO_EPEER, "rc %d: %s", rc, loco_errmsg());
    cr_assert_null(bad);
    loco_net_listener_info info;
    await_refusal(lst, &info);
    t_assert_has(info.last_refusal, reason);
    loco_link *none;
    cr_assert_eq(loco_net_accept(lst, &none, 0), LOCO_ETIMEDOUT);
    loco_link *client, *server;
    cr_assert_eq(loco_net_connect(&client, &good, "127.0.0.1", port, -1), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_net_accept(lst, &server, T_ACCEPT_MS), 0, "%s", loco_errmsg());
    cr_assert_str_eq(loco_link_peer_name(server), "siteB");
    t_send(client, LOCO_FRAME_REGISTER, 1, 33, 1);
    t_expect(server, LOCO_FRAME_REGISTER, 1, 33, 1);
    loco_net_listener_get_info(lst, &info);
    cr_assert_eq(info.links, 1u);
    loco_link_destroy(client);
    loco_link_destroy(server);
    loco_net_listener_destroy(lst);
}

Test(net_link, refuses_a_certificate_of_another_ca) {
    char *other = other_dir();
    const char *names[] = {"siteA"};
    cr_assert_eq(loco_net_make_certs(other, names, 1, 1), 0, "%s", loco_errmsg());
    loco_net_params cp;
    t_params_tls_in(&cp, other, "siteA", t_dir); /* trusts the run's CA */
    refused_then_good(&cp, "unable to get local issuer certificate");
    free(other);
}

Test(net_link, refuses_a_client_without_certificate) {
    loco_net_params cp;
    t_params_tls(&cp, NULL);
    cr_assert_eq(loco_net_params_check(&cp, false), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_net_params_check(&cp, true), LOCO_EINVAL);
    refused_then_good(&cp, "did not return a certificate");
}

Test(net_link, refuses_an_expired_certificate) {
    const char *names[] = {"siteOld"};
    /* Valid from two days ago to yesterday, signed by the run's CA. */
    cr_assert_eq(loco__net_make_certs_ex(t_dir, names, 1, -2 * 86400L, 86400L), 0, "%s",
                 loco_errmsg());
    loco_net_params cp;
    t_params_tls(&cp, "siteOld");
    refused_then_good(&cp, "certificate has expired");
}

Test(net_link, plain_client_talking_garbage_to_a_tls_listener) {
    loco_net_params sp, good;
    t_params_tls(&sp, "coordinator");
    t_params_tls(&good, "siteA");
    good.streams = 2;
    loco_net_listener *lst;
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    const int port = loco_net_listener_port(lst);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char junk[] = "GET / HTTP/1.0\r\nHost: x\r\n\r\n\x16\x03\x01\xff\xff garbage";
    cr_assert_eq(send(fd, junk, sizeof junk, MSG_NOSIGNAL), (ssize_t)sizeof junk);
    /* The listener answers with an alert at most and hangs up. */
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    char sink[4096];
    const double end = loco_now() + 10;
    while (loco_now() < end && poll(&pf, 1, 1000) >= 0) {
        const ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN))
            break;
    }
    close(fd);
    loco_net_listener_info info;
    await_refusal(lst, &info);
    t_assert_has(info.last_refusal, "TLS handshake");
    /* A plain loco client is refused the same way. */
    loco_net_params plain;
    t_params_plain(&plain, "x");
    loco_link *bad = NULL;
    cr_assert_neq(loco_net_connect(&bad, &plain, "127.0.0.1", port, 3000), 0);
    cr_assert_null(bad);
    loco_link *client, *server;
    cr_assert_eq(loco_net_connect(&client, &good, "127.0.0.1", port, -1), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_net_accept(lst, &server, T_ACCEPT_MS), 0, "%s", loco_errmsg());
    t_send(server, LOCO_FRAME_QUORUM, 9, 100, 9);
    t_expect(client, LOCO_FRAME_QUORUM, 9, 100, 9);
    loco_link_destroy(client);
    loco_link_destroy(server);
    loco_net_listener_destroy(lst);
}

Test(net_link, client_refuses_a_server_of_another_ca_or_name) {
    char *other = other_dir();
    const char *names[] = {"coordinator"};
    cr_assert_eq(loco_net_make_certs(other, names, 1, 1), 0, "%s", loco_errmsg());
    loco_net_params sp, cp;
    t_params_tls_in(&sp, other, "coordinator", t_dir); /* an impostor */
    t_params_tls(&cp, "siteA");
    loco_net_listener *lst;
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    loco_link *l = NULL;
    cr_assert_eq(loco_net_connect(&l, &cp, "127.0.0.1", loco_net_listener_port(lst), -1),
                 LOCO_EAUTH);
    t_assert_has(loco_errmsg(), "unable to get local issuer certificate");
    loco_net_listener_destroy(lst);
    /* The right CA, but not the peer we asked for. */
    t_params_tls(&sp, "siteB");
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    snprintf(cp.expect_peer, sizeof cp.expect_peer, "coordinator");
    cr_assert_eq(loco_net_connect(&l, &cp, "127.0.0.1", loco_net_listener_port(lst), -1),
                 LOCO_EAUTH);
    t_assert_has(loco_errmsg(), "is 'siteB', expected 'coordinator'");
    cr_assert_null(l);
    loco_net_listener_destroy(lst);
    free(other);
}

Test(net_link, run_id_mismatch_is_refused_with_a_reason) {
    loco_net_params sp, cp;
    t_params_plain(&sp, "a");
    t_params_plain(&cp, "b");
    sp.run_id = 0x1234;
    cp.run_id = 0x9999;
    loco_net_listener *lst;
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    loco_link *l = NULL;
    cr_assert_eq(loco_net_connect(&l, &cp, "127.0.0.1", loco_net_listener_port(lst), -1),
                 LOCO_EAUTH);
    t_assert_has(loco_errmsg(), "refused the link: run id");
    loco_net_listener_destroy(lst);
}

Test(net_link, connect_to_nobody_and_accept_timeout) {
    loco_net_params p;
    t_params_plain(&p, "a");
    loco_net_listener *lst;
    cr_assert_eq(loco_net_listen(&lst, &p, "127.0.0.1", 0), 0);
    const int port = loco_net_listener_port(lst);
    loco_link *l;
    const double t0 = loco_now();
    cr_assert_eq(loco_net_accept(lst, &l, 50), LOCO_ETIMEDOUT);
    cr_assert_geq(loco_now() - t0, 0.049);
    loco_net_listener_destroy(lst);
    cr_assert_eq(loco_net_connect(&l, &p, "127.0.0.1", port, 2000), LOCO_EIO);
    cr_assert_null(l);
}

/* Two clients with four streams each, connecting at the same time: the
 * listener groups the streams by link. */
typedef struct {
    loco_net_params p;
    int port;
    loco_link *link;
    int rc;
} conn_job;

static void *connect_job(void *arg) {
    conn_job *j = arg;
    j->rc = loco_net_connect(&j->link, &j->p, "127.0.0.1", j->port, -1);
    return NULL;
}

Test(net_link, concurrent_clients_get_their_own_links) {
    loco_net_params sp;
    t_params_tls(&sp, "coordinator");
    loco_net_listener *lst;
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    conn_job jobs[2];
    const char *names[2] = {"siteA", "siteB"};
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        t_params_tls(&jobs[k].p, names[k]);
        jobs[k].p.streams = 4;
        jobs[k].port = loco_net_listener_port(lst);
        cr_assert_eq(pthread_create(&th[k], NULL, connect_job, &jobs[k]), 0);
    }
    loco_link *srv[2];
    for (int k = 0; k < 2; k++)
        cr_assert_eq(loco_net_accept(lst, &srv[k], T_ACCEPT_MS), 0, "%s", loco_errmsg());
    for (int k = 0; k < 2; k++) {
        pthread_join(th[k], NULL);
        cr_assert_eq(jobs[k].rc, 0);
    }
    for (int k = 0; k < 2; k++) {
        const int who = strcmp(loco_link_peer_name(srv[k]), "siteA") == 0 ? 0 : 1;
        cr_assert_str_eq(loco_link_peer_name(srv[k]), names[who]);
        t_send(jobs[who].link, LOCO_FRAME_PSEUDOGRAD, (uint64_t)who, 300000, (uint64_t)who);
        t_expect(srv[k], LOCO_FRAME_PSEUDOGRAD, (uint64_t)who, 300000, (uint64_t)who);
    }
    for (int k = 0; k < 2; k++) {
        loco_link_destroy(jobs[k].link);
        loco_link_destroy(srv[k]);
    }
    loco_net_listener_destroy(lst);
}

Test(net_link, listener_destroy_drops_unaccepted_links) {
    loco_net_params p;
    t_params_plain(&p, "a");
    p.linger_ms = 100;
    loco_net_listener *lst;
    cr_assert_eq(loco_net_listen(&lst, &p, "127.0.0.1", 0), 0);
    loco_link *c;
    cr_assert_eq(loco_net_connect(&c, &p, "127.0.0.1", loco_net_listener_port(lst), -1), 0);
    loco_net_listener_info info;
    const double end = loco_now() + 10;
    do {
        loco_net_listener_get_info(lst, &info);
    } while (info.links == 0 && loco_now() < end && usleep(2000) == 0);
    cr_assert_eq(info.links, 1u);
    loco_net_listener_destroy(lst);
    loco_frame_hdr h;
    void *pl;
    cr_assert_eq(loco_link_recv(c, &h, &pl, T_RECV_MS), LOCO_EPEER, "%s", loco_errmsg());
    loco_link_destroy(c);
}

/* ----------------------------------------------------------- bad frames */

/* A one-stream link whose client end writes raw bytes; returns the server
 * end's recv status and message. */
static int forged(const uint8_t *bytes, size_t len, bool tls, uint64_t max_frame, char *msg,
                  size_t cap) {
    loco_net_params sp, cp;
    if (tls) {
        t_params_tls(&sp, "coordinator");
        t_params_tls(&cp, "siteA");
    } else {
        t_params_plain(&sp, "coordinator");
        t_params_plain(&cp, "siteA");
    }
    sp.max_frame_bytes = max_frame;
    cp.streams = 1;
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    cr_assert_eq(loco_link_write_raw(pr.client, 0, bytes, len), 0, "%s", loco_errmsg());
    loco_frame_hdr h;
    void *pl = NULL;
    const int rc = loco_link_recv(pr.server, &h, &pl, T_RECV_MS);
    snprintf(msg, cap, "%s", loco_errmsg());
    cr_assert_null(pl);
    /* The link stays dropped, and the other end sees it go. */
    cr_assert_eq(loco_link_recv(pr.server, &h, &pl, T_RECV_MS), rc);
    cr_assert_eq(loco_link_recv(pr.client, &h, &pl, T_RECV_MS), LOCO_EPEER, "%s", loco_errmsg());
    t_pair_close(&pr);
    return rc;
}

static void valid_frame(uint8_t *b, size_t payload_len, uint64_t max) {
    loco_frame_hdr h = t_hdr(LOCO_FRAME_PSEUDOGRAD, 5);
    h.payload_len = payload_len;
    t_fill(b + LOCO_FRAME_HEADER_BYTES, payload_len, 77);
    h.payload_hash = loco_frame_hash_payload(b + LOCO_FRAME_HEADER_BYTES, payload_len);
    cr_assert_eq(loco_frame_encode_header(b, &h, max), 0);
}

Test(net_link, corrupted_payload_byte_drops_the_link) {
    uint8_t b[LOCO_FRAME_HEADER_BYTES + 3000];
    valid_frame(b, 3000, 1 << 20);
    b[LOCO_FRAME_HEADER_BYTES + 1234] ^= 0x40;
    char msg[1024];
    cr_assert_eq(forged(b, sizeof b, true, 1 << 20, msg, sizeof msg), LOCO_EPROTO);
    t_assert_has(msg, "payload checksum mismatch");
}

Test(net_link, oversized_length_is_refused_before_any_allocation) {
    uint8_t b[LOCO_FRAME_HEADER_BYTES];
    loco_frame_hdr h = t_hdr(LOCO_FRAME_PSEUDOGRAD, 0);
    h.payload_len = (uint64_t)1 << 40; /* 1 TiB: never allocated */
    cr_assert_eq(loco_frame_encode_header(b, &h, UINT64_MAX), 0);
    loco_net_params sp, cp;
    t_params_plain(&sp, "coordinator");
    t_params_plain(&cp, "siteA");
    sp.max_frame_bytes = 1 << 20;
    cp.streams = 1;
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    const size_t live = loco_alloc_live_bytes();
    /* The next loco_alloc in this process fails: if the reader allocated for
     * the claimed length, it would report LOCO_ENOMEM, not LOCO_EPROTO. */
    loco_alloc_fail_after(1);
    cr_assert_eq(loco_link_write_raw(pr.client, 0, b, sizeof b), 0, "%s", loco_errmsg());
    loco_frame_hdr got;
    void *pl = NULL;
    cr_assert_eq(loco_link_recv(pr.server, &got, &pl, T_RECV_MS), LOCO_EPROTO);
    t_assert_has(loco_errmsg(), "exceeds the limit of 1048576");
    void *probe = loco_alloc(8);
    cr_assert_null(probe, "an allocation happened on the refusal path");
    loco_alloc_fail_after(0);
    cr_assert_leq(loco_alloc_live_bytes(), live);
    t_pair_close(&pr);
}

Test(net_link, bad_magic_version_type_checksum_and_sequence) {
    struct {
        int off, width;
        uint64_t value;
        bool rehash;
        const char *reason;
    } cases[] = {
        {0, 4, 0x12345678, true, "bad magic"},
        {4, 2, 9, true, "version 9"},
        {6, 2, 77, true, "unknown type 77"},
        {32, 1, 0xee, false, "header checksum mismatch"},
        {48, 8, 4, true, "frame number 4, expected 0"},
        {6, 2, LOCO_FRAME_HELLO, true, "HELLO after the handshake"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t b[LOCO_FRAME_HEADER_BYTES + 10];
        valid_frame(b, 10, 1 << 20);
        for (int k = 0; k < cases[i].width; k++)
            b[cases[i].off + k] = (uint8_t)(cases[i].value >> (8 * k));
        if (cases[i].rehash)
            t_rehash(b);
        char msg[1024];
        cr_assert_eq(forged(b, sizeof b, false, 1 << 20, msg, sizeof msg), LOCO_EPROTO,
                     "case %zu accepted", i);
        t_assert_has(msg, cases[i].reason);
    }
}

Test(net_link, frames_of_another_run_are_refused) {
    uint8_t b[LOCO_FRAME_HEADER_BYTES + 10];
    loco_frame_hdr h = t_hdr(LOCO_FRAME_PSEUDOGRAD, 5);
    h.run_id = 0xbad;
    h.payload_len = 10;
    t_fill(b + LOCO_FRAME_HEADER_BYTES, 10, 1);
    h.payload_hash = loco_frame_hash_payload(b + LOCO_FRAME_HEADER_BYTES, 10);
    cr_assert_eq(loco_frame_encode_header(b, &h, 1 << 20), 0);
    loco_net_params sp, cp;
    t_params_plain(&sp, "coordinator");
    t_params_plain(&cp, "siteA");
    sp.run_id = cp.run_id = 0x600d;
    cp.streams = 1;
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    /* The link stamps its run id on frames that leave it 0. */
    t_send(pr.client, LOCO_FRAME_ACK, 1, 5, 1);
    loco_frame_hdr got;
    void *pl;
    cr_assert_eq(loco_link_recv(pr.server, &got, &pl, T_RECV_MS), 0, "%s", loco_errmsg());
    cr_assert_eq(got.run_id, 0x600du);
    loco_free(pl);
    loco_frame_hdr other = t_hdr(LOCO_FRAME_ACK, 2);
    other.run_id = 0xbad;
    cr_assert_eq(loco_link_send(pr.client, &other, NULL, 0), 0);
    cr_assert_eq(loco_link_recv(pr.server, &got, &pl, T_RECV_MS), LOCO_EPROTO);
    t_assert_has(loco_errmsg(), "of run 0000000000000bad");
    t_pair_close(&pr);
}

/* --------------------------------------------------------- certificates */

static mode_t mode_of(const char *dir, const char *file) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    struct stat st;
    cr_assert_eq(stat(p, &st), 0, "%s missing", p);
    return st.st_mode & 0777;
}

Test(net_link, make_certs_files_modes_and_ca_reuse) {
    cr_assert_eq(mode_of(t_dir, "ca.key"), 0600);
    cr_assert_eq(mode_of(t_dir, "siteA.key"), 0600);
    cr_assert_eq(mode_of(t_dir, "ca.pem"), 0644);
    cr_assert_eq(mode_of(t_dir, "siteA.pem"), 0644);
    char p[600];
    snprintf(p, sizeof p, "%s/ca.pem", t_dir);
    void *ca1, *ca2;
    size_t n1, n2;
    cr_assert_eq(loco_file_read(p, &ca1, &n1), 0);
    const char *more[] = {"siteC"};
    cr_assert_eq(loco_net_make_certs(t_dir, more, 1, 30), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_file_read(p, &ca2, &n2), 0);
    cr_assert(n1 == n2 && memcmp(ca1, ca2, n1) == 0, "the CA was replaced");
    loco_free(ca1);
    loco_free(ca2);
    cr_assert_eq(mode_of(t_dir, "siteC.key"), 0600);
    /* The new site talks to an old one. */
    loco_net_params sp, cp;
    t_params_tls(&sp, "siteA");
    t_params_tls(&cp, "siteC");
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    cr_assert_str_eq(loco_link_peer_name(pr.server), "siteC");
    t_pair_close(&pr);
    /* Refused inputs. */
    const char *bad1[] = {"ca"}, *bad2[] = {"a/b"}, *bad3[] = {""}, *bad4[] = {"x", "x"};
    cr_assert_eq(loco_net_make_certs(t_dir, bad1, 1, 1), LOCO_EINVAL);
    cr_assert_eq(loco_net_make_certs(t_dir, bad2, 1, 1), LOCO_EINVAL);
    cr_assert_eq(loco_net_make_certs(t_dir, bad3, 1, 1), LOCO_EINVAL);
    cr_assert_eq(loco_net_make_certs(t_dir, bad4, 2, 1), LOCO_EINVAL);
    cr_assert_eq(loco_net_make_certs(t_dir, more, 1, 0), LOCO_EINVAL);
    /* A CA key that does not match its certificate is refused. */
    char *other = other_dir();
    cr_assert_eq(loco_net_make_certs(other, NULL, 0, 1), 0, "%s", loco_errmsg());
    char from[600], to[600];
    snprintf(from, sizeof from, "%s/ca.key", other);
    snprintf(to, sizeof to, "%s/ca.key", t_dir);
    cr_assert_eq(rename(from, to), 0);
    cr_assert_eq(loco_net_make_certs(t_dir, more, 1, 1), LOCO_EAUTH);
    free(other);
}

Test(net_link, params_from_config_and_checks) {
    loco_config cfg;
    loco_config_defaults(&cfg);
    loco_net_params p;
    /* TLS without a CA is refused with a pointer to the fix. */
    cr_assert_eq(loco_net_params_from_config(&p, &cfg), LOCO_EINVAL);
    t_assert_has(loco_errmsg(), "net.ca");
    cr_assert_eq(loco_config_set(&cfg, "net.tls=false"), 0);
    cr_assert_eq(loco_config_set(&cfg, "net.streams=2"), 0);
    cr_assert_eq(loco_config_set(&cfg, "net.max_frame_mb=8"), 0);
    cr_assert_eq(loco_config_set(&cfg, "net.wan_delay_ms=25"), 0);
    cr_assert_eq(loco_config_set(&cfg, "net.link_gbps=10"), 0);
    cr_assert_eq(loco_config_set(&cfg, "net.rtt_ms=100"), 0);
    cr_assert_eq(loco_net_params_from_config(&p, &cfg), 0, "%s", loco_errmsg());
    cr_assert_eq(p.backend, LOCO_NET_PLAIN);
    cr_assert_eq(p.streams, 2);
    cr_assert_eq(p.max_frame_bytes, 8u << 20);
    cr_assert_float_eq(p.wan.delay_ms, 25, 0);
    cr_assert_eq(p.connect_timeout_ms, 10000);
    /* 10 Gbit/s x 100 ms = 125 MB in flight, over 2 streams. */
    cr_assert_eq(loco__sockbuf_bytes(&p, true), 62500000);
    p.sndbuf = 4096;
    cr_assert_eq(loco__sockbuf_bytes(&p, true), 4096);
    p.link_gbps = 0;
    cr_assert_eq(loco__sockbuf_bytes(&p, false), 0);
    p.streams = 0;
    cr_assert_eq(loco_net_params_check(&p, false), LOCO_EINVAL);
    p.streams = 1;
    p.faults.drop = 1.5;
    cr_assert_eq(loco_net_params_check(&p, false), LOCO_EINVAL);
    loco_net_params_default(&p);
    p.backend = LOCO_NET_TLS;
    snprintf(p.ca, sizeof p.ca, "%s/ca.pem", t_dir);
    snprintf(p.cert, sizeof p.cert, "%s/nope.pem", t_dir);
    snprintf(p.key, sizeof p.key, "%s/nope.key", t_dir);
    cr_assert_eq(loco_net_params_check(&p, true), LOCO_EINVAL);
    t_assert_has(loco_errmsg(), "nope.pem");
}
