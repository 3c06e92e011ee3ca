/* What the WAN benchmarks share: a throw-away PKI and the link parameters
 * of two sites over emulated WAN (TLS 1.3, both directions delayed and
 * capped). */
#include "bench/bench.h"

#include <stdlib.h>

int bench_wan_pair(char *dir, double gbps, double rtt_ms, int streams, loco_net_params *pa,
                   loco_net_params *pb) {
    if (!mkdtemp(dir))
        return LOCO_ERR(LOCO_EIO, "mkdtemp %s failed", dir);
    const char *names[] = {"siteA", "siteB"};
    LOCO_CHECK(loco_net_make_certs(dir, names, 2, 1));
    loco_net_params_default(pa);
    pa->streams = streams;
    pa->link_gbps = gbps;
    pa->rtt_ms = rtt_ms;
    pa->max_frame_bytes = 64u << 20;
    pa->wan = (loco_wan){.delay_ms = rtt_ms / 2, .gbps = gbps, .seed = 1};
    *pb = *pa;
    snprintf(pa->cert, sizeof pa->cert, "%s/siteA.pem", dir);
    snprintf(pa->key, sizeof pa->key, "%s/siteA.key", dir);
    snprintf(pb->cert, sizeof pb->cert, "%s/siteB.pem", dir);
    snprintf(pb->key, sizeof pb->key, "%s/siteB.key", dir);
    snprintf(pa->ca, sizeof pa->ca, "%s/ca.pem", dir);
    snprintf(pb->ca, sizeof pb->ca, "%s/ca.pem", dir);
    return 0;
}
