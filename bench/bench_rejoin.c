/* `loco bench rejoin`: the state transfer of a rejoining island. A donor
 * rank serves θ_global and momentum (lossless, fp32 + zstd, in chunks)
 * over a mutually authenticated TLS link with emulated WAN (default
 * 1 Gbit/s, 100 ms RTT); the joiner fetches it as after a restart
 * (loco_state_fetch). Printed beside the link: payload bytes over the
 * time, as a fraction of the emulated bandwidth, and the time against the
 * bound (bytes / bandwidth + connection set-up of TCP + TLS + request
 * round trips). */
#include "bench/bench.h"
#include "compress/compress.h"
#include "core/core.h"
#include "net/net.h"
#include "outer/outer.h"

#include <stdlib.h>
#include <string.h>

int loco_bench_rejoin(int argc, char **argv) {
    double mparams = 124.4, gbps = 1.0, rtt_ms = 100.0;
    int streams = 4;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--mparams") && i + 1 < argc)
            mparams = atof(argv[++i]);
        else if (!strcmp(argv[i], "--gbps") && i + 1 < argc)
            gbps = atof(argv[++i]);
        else if (!strcmp(argv[i], "--rtt-ms") && i + 1 < argc)
            rtt_ms = atof(argv[++i]);
        else if (!strcmp(argv[i], "--streams") && i + 1 < argc)
            streams = atoi(argv[++i]);
        else
            return LOCO_ERR(LOCO_EINVAL, "bench rejoin: unknown option '%s' (--mparams M, "
                                         "--gbps G, --rtt-ms R, --streams S)",
                            argv[i]);
    }
    if (!(mparams > 0) || !(gbps > 0) || rtt_ms < 0 || streams < 1)
        return LOCO_ERR(LOCO_EINVAL, "bench rejoin: --mparams, --gbps, --streams must be > 0");
    const size_t n = (size_t)(mparams * 1e6);
    char dir[] = "/tmp/loco-bench-rejoin-XXXXXX";
    loco_net_params pa, pb;
    int rc = bench_wan_pair(dir, gbps, rtt_ms, streams, &pa, &pb);
    loco_outer_params op = {.H = 1, .nesterov = true, .lr = 0.7f, .momentum = 0.9f};
    loco_codec_params cp;
    loco_codec_params_default(&cp);
    loco_outer *donor = NULL, *joiner = NULL;
    loco_peers *svc = NULL;
    float *theta = loco_alloc(n * sizeof(float));
    if (!theta)
        rc = LOCO_ERR(LOCO_ENOMEM, "bench buffers");
    if (rc == 0) {
        /* Weights of a trained-looking scale: zstd finds little in fp32. */
        loco_rng rng;
        loco_rng_seed(&rng, 11);
        for (size_t i = 0; i < n; i++)
            theta[i] = 0.02f * loco_rng_normal(&rng);
        rc = loco_outer_create(&donor, &op, &cp, n, theta);
    }
    if (rc == 0) {
        float *m = loco_outer_momentum(donor);
        for (size_t i = 0; i < n; i++)
            m[i] = 1e-3f * theta[(i * 7919) % n];
        memset(theta, 0, n * sizeof(float));
        rc = loco_outer_create(&joiner, &op, &cp, n, theta);
    }
    if (rc == 0)
        rc = loco_peers_create(&svc, &pa, "127.0.0.1", &(loco_outer_set){&donor, 1}, 600000);
    if (rc == 0) {
        loco_peers_publish(svc, 7, 700);
        char sites[1][LOCO_NET_NAME_MAX] = {"siteA"};
        char addrs[1][LOCO_ADDR_MAX];
        snprintf(addrs[0], sizeof addrs[0], "127.0.0.1:%d", loco_peers_port(svc));
        int64_t step = -1, inner = 0;
        loco_state_stats st = {0};
        rc = loco_state_fetch(&pb, 1, (const char (*)[LOCO_NET_NAME_MAX])sites,
                              (const char (*)[LOCO_ADDR_MAX])addrs, &step,
                              &(loco_outer_set){&joiner, 1}, &inner, &st,
                              600000);
        if (rc == 0 && loco_outer_hash(joiner) != loco_outer_hash(donor))
            rc = LOCO_ERR(LOCO_EPROTO, "bench rejoin: the fetched state differs");
        if (rc == 0) {
            const double bw = gbps * 1e9 / 8, raw = 2.0 * n * sizeof(float);
            /* Set-up: TCP (1 RTT) + TLS 1.3 (1 RTT) + HELLO (1 RTT) + the
             * request and the first byte back (1 RTT). */
            const double bound = (double)st.bytes / bw + 4 * rtt_ms / 1e3;
            printf("loco bench rejoin: θ_global + momentum of %.1fM parameters (%.1f MB fp32), "
                   "TLS over %d streams, emulated %.2f Gbit/s and %.0f ms RTT\n\n",
                   n / 1e6, raw / 1e6, streams, gbps, rtt_ms);
            printf("| state MB | on the wire MB | total s | data phase s | data MB/s | link MB/s "
                   "| of the link | bound s | x bound |\n|---|---|---|---|---|---|---|---|---|\n");
            printf("| %.1f | %.1f | %.3f | %.3f | %.1f | %.1f | %.0f%% | %.3f | %.2f |\n",
                   raw / 1e6, st.bytes / 1e6, st.seconds, st.stream_s,
                   st.bytes / 1e6 / st.stream_s, bw / 1e6, 100.0 * st.bytes / st.stream_s / bw,
                   bound, st.seconds / bound);
            printf("\nθ hash checked after the transfer (identical to the donor's).\n");
        }
    }
    loco_peers_destroy(svc);
    loco_outer_destroy(donor);
    loco_outer_destroy(joiner);
    loco_free(theta);
    loco_rmtree(dir);
    return rc;
}
