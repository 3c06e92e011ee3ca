/* `loco bench exchange`: one outer step between two islands in this
 * process, over a mutually authenticated TLS link with emulated WAN
 * (default 1 Gbit/s, 100 ms RTT), for every codec, beside the bound
 * encoded bytes / bandwidth + RTT. It runs the real exchange
 * (loco_outer_step_allgather): encode, send, receive and decode pipelined. */
#include "bench/bench.h"
#include "compress/compress.h"
#include "core/core.h"
#include "net/net.h"
#include "outer/outer.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    loco_outer *o;
    loco_exchange x;
    float *theta_local;
    loco_exchange_stats st;
    int rc;
    double seconds;
} side;

static void *run_side(void *arg) {
    side *s = arg;
    double t0 = loco_now();
    s->rc = loco_outer_step_allgather(s->o, &s->x, s->theta_local, 1, &s->st);
    s->seconds = loco_now() - t0;
    return NULL;
}

int loco_bench_exchange(int argc, char **argv) {
    double mparams = 124.4, gbps = 1.0, rtt_ms = 100.0;
    const char *only = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--mparams") && i + 1 < argc)
            mparams = atof(argv[++i]);
        else if (!strcmp(argv[i], "--gbps") && i + 1 < argc)
            gbps = atof(argv[++i]);
        else if (!strcmp(argv[i], "--rtt-ms") && i + 1 < argc)
            rtt_ms = atof(argv[++i]);
        else if (!strcmp(argv[i], "--codec") && i + 1 < argc)
            only = argv[++i];
        else
            return LOCO_ERR(LOCO_EINVAL, "bench exchange: unknown option '%s' (--mparams M, "
                                         "--gbps G, --rtt-ms R, --codec NAME)",
                            argv[i]);
    }
    if (!(mparams > 0) || !(gbps > 0) || rtt_ms < 0)
        return LOCO_ERR(LOCO_EINVAL, "bench exchange: --mparams and --gbps must be > 0");
    const size_t n = (size_t)(mparams * 1e6);
    char dir[] = "/tmp/loco-bench-exchange-XXXXXX";
    loco_net_params pa, pb;
    int rc = bench_wan_pair(dir, gbps, rtt_ms, 4, &pa, &pb);
    snprintf(pa.expect_peer, sizeof pa.expect_peer, "siteB");
    loco_net_listener *l = NULL;
    loco_link *la = NULL, *lb = NULL;
    float *theta0 = NULL, *ta = NULL, *tb = NULL;
    if (rc == 0)
        rc = loco_net_listen(&l, &pb, "127.0.0.1", 0);
    if (rc == 0)
        rc = loco_net_connect(&la, &pa, "127.0.0.1", loco_net_listener_port(l), -1);
    if (rc == 0)
        rc = loco_net_accept(l, &lb, 10000);
    if (rc < 0)
        goto out;
    theta0 = loco_alloc(n * sizeof(float));
    ta = loco_alloc(n * sizeof(float));
    tb = loco_alloc(n * sizeof(float));
    if (!theta0 || !ta || !tb) {
        rc = LOCO_ERR(LOCO_ENOMEM, "bench buffers");
        goto out;
    }
    loco_rng rng;
    loco_rng_seed(&rng, 7);
    for (size_t i = 0; i < n; i++)
        theta0[i] = 0.02f * loco_rng_normal(&rng);
    loco_link_stats ls;
    loco_link_get_stats(la, &ls);
    printf("loco bench exchange: %.1fM-parameter pseudo-gradient, 2 islands, %s over %d "
           "streams, emulated %.2f Gbit/s and %.0f ms RTT\n",
           n / 1e6, ls.transport, ls.streams, gbps, rtt_ms);
    printf("bound = encoded bytes / bandwidth + RTT; both islands send at once (full duplex), so "
           "only one one-way delay is paid: the one-way bound (bytes / bandwidth + RTT/2) is "
           "shown too\n\n");
    printf("| codec | zstd | encoded MB | ratio | exchange s | bound s | x bound | one-way bound s "
           "| x one-way |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    static const char *const codecs[] = {"none", "bf16", "int8", "fp8", "int4", "fp4"};
    for (int ci = 0; ci < 6 && rc == 0; ci++) {
        if (only && strcmp(only, codecs[ci]))
            continue;
        loco_outer_params op = {.H = 1, .nesterov = true, .lr = 0.7f, .momentum = 0.9f};
        loco_codec_params cp;
        loco_codec_params_default(&cp);
        loco_codec_parse(codecs[ci], &cp.codec);
        cp.link_gbps = gbps;
        side a = {.x = {.n_islands = 2, .me = 0, .epoch = 1, .max_frame = 64u << 20,
                        .timeout_ms = 600000},
                  .theta_local = ta};
        side b = a;
        b.x.me = 1;
        b.theta_local = tb;
        loco_link *peers_a[2] = {NULL, la}, *peers_b[2] = {lb, NULL};
        a.x.peers = peers_a;
        b.x.peers = peers_b;
        rc = loco_outer_create(&a.o, &op, &cp, n, theta0);
        if (rc == 0)
            rc = loco_outer_create(&b.o, &op, &cp, n, theta0);
        for (size_t i = 0; rc == 0 && i < n; i++) {
            ta[i] = theta0[i] - 1e-3f * loco_rng_normal(&rng);
            tb[i] = theta0[i] - 1e-3f * loco_rng_normal(&rng);
        }
        if (rc == 0) {
            pthread_t th;
            pthread_create(&th, NULL, run_side, &b);
            run_side(&a);
            pthread_join(th, NULL);
            rc = a.rc < 0 ? a.rc : b.rc;
        }
        if (rc == 0) {
            double enc = (double)a.st.encoded_bytes;
            double bound = enc * 8 / (gbps * 1e9) + rtt_ms / 1e3;
            double t = a.seconds > b.seconds ? a.seconds : b.seconds;
            loco_encode_plan plan;
            loco_codec_plan(loco_outer_codec(a.o), &plan, theta0, n, 0, 1);
            double oneway = bound - rtt_ms / 2e3;
            printf("| %s | %s | %.1f | %.2f | %.3f | %.3f | %.2f | %.3f | %.2f |\n", codecs[ci],
                   plan.zstd ? "yes" : "no", enc / 1e6, (double)a.st.raw_bytes / enc, t, bound,
                   t / bound, oneway, t / oneway);
            fflush(stdout);
        }
        loco_outer_destroy(a.o);
        loco_outer_destroy(b.o);
    }
out:
    loco_link_destroy(la);
    loco_link_destroy(lb);
    loco_net_listener_destroy(l);
    loco_free(theta0);
    loco_free(ta);
    loco_free(tb);
    loco_rmtree(dir);
    return rc;
}
