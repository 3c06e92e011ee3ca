/* Link parameters: defaults, the [net] section, range checks. */
#include "net/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* Seeds of the WAN jitter and fault draws, derived from train.seed. */
#define WAN_SEED_SALT 0x6e65742d77616eULL   /* "net-wan" */
#define FAULT_SEED_SALT 0x6e65742d666c74ULL /* "net-flt" */

/* The [net] section and train.seed into p, unchecked. */
static void fill(loco_net_params *p, const loco_config *cfg) {
    memset(p, 0, sizeof *p);
    p->backend = cfg->net.tls ? LOCO_NET_TLS : LOCO_NET_PLAIN;
    snprintf(p->cert, sizeof p->cert, "%s", cfg->net.cert);
    snprintf(p->key, sizeof p->key, "%s", cfg->net.key);
    snprintf(p->ca, sizeof p->ca, "%s", cfg->net.ca);
    snprintf(p->crl, sizeof p->crl, "%s", cfg->net.crl);
    snprintf(p->cert_run_id, sizeof p->cert_run_id, "%.63s", cfg->net.run_id);
    p->streams = (int)cfg->net.streams;
    p->max_frame_bytes = (uint64_t)cfg->net.max_frame_mb << 20;
    p->link_buffer_bytes = (uint64_t)cfg->net.link_buffer_mb << 20;
    p->max_streams = (int)cfg->net.max_streams;
    p->max_pending = (int)cfg->net.max_pending;
    p->queue_frames = (int)cfg->net.queue_frames;
    p->link_gbps = cfg->net.link_gbps;
    p->rtt_ms = cfg->net.rtt_ms;
    p->sndbuf = (int)(cfg->net.sndbuf_kb << 10);
    p->rcvbuf = (int)(cfg->net.rcvbuf_kb << 10);
    p->connect_timeout_ms = (int)cfg->net.connect_timeout_ms;
    p->handshake_timeout_ms = (int)cfg->net.handshake_timeout_ms;
    p->io_timeout_ms = (int)cfg->net.io_timeout_ms;
    p->linger_ms = (int)cfg->net.linger_ms;
    p->wan.delay_ms = cfg->net.wan_delay_ms;
    p->wan.jitter_ms = cfg->net.wan_jitter_ms;
    p->wan.gbps = cfg->net.wan_gbps;
    p->wan.seed = (uint64_t)cfg->train.seed ^ WAN_SEED_SALT;
    p->faults.seed = (uint64_t)cfg->train.seed ^ FAULT_SEED_SALT;
}

void loco_net_params_default(loco_net_params *p) {
    fill(p, loco_config_default());
    /* Callers without a config draw from seed 0, as they always did. */
    p->wan.seed = 0;
    p->faults.seed = 0;
}

int loco_net_params_from_config(loco_net_params *p, const loco_config *cfg) {
    if (strlen(cfg->net.run_id) >= sizeof p->cert_run_id)
        return LOCO_ERR(LOCO_EINVAL, "net.run_id: at most %d characters", LOCO_NET_RUN_ID_MAX - 1);
    fill(p, cfg);
    LOCO_CHECK(loco_net_params_check(p, false));
    /* A process with an unusable certificate refuses to start. */
    return loco__net_check_own_cert(p);
}

static bool prob_ok(double x) {
    return isfinite(x) && x >= 0 && x <= 1;
}
static bool nonneg(double x) {
    return isfinite(x) && x >= 0;
}

static int file_ok(const char *what, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return LOCO_ERR(LOCO_EINVAL, "net.%s: '%s' is not a readable file", what, path);
    return 0;
}

int loco_net_params_check(const loco_net_params *p, bool server) {
    if (p->backend != LOCO_NET_TLS && p->backend != LOCO_NET_PLAIN)
        return LOCO_ERR(LOCO_EINVAL, "net: unknown backend %d", (int)p->backend);
    if (p->streams < 1 || p->streams > LOCO_NET_MAX_STREAMS)
        return LOCO_ERR(LOCO_EINVAL, "net.streams = %d, expected 1..%d", p->streams,
                        LOCO_NET_MAX_STREAMS);
    if (p->max_frame_bytes < 1 || p->max_frame_bytes > LOCO_FRAME_PAYLOAD_CEILING)
        return LOCO_ERR(LOCO_EINVAL, "net: max_frame_bytes = %llu, expected 1..%llu",
                        (unsigned long long)p->max_frame_bytes,
                        (unsigned long long)LOCO_FRAME_PAYLOAD_CEILING);
    if (p->max_streams < 1 || p->max_streams > LOCO_NET_MAX_STREAMS)
        return LOCO_ERR(LOCO_EINVAL, "net.max_streams = %d, expected 1..%d", p->max_streams,
                        LOCO_NET_MAX_STREAMS);
    if (p->max_pending < 1 || p->max_pending > LOCO_NET_MAX_PENDING)
        return LOCO_ERR(LOCO_EINVAL, "net.max_pending = %d, expected 1..%d", p->max_pending,
                        LOCO_NET_MAX_PENDING);
    if (p->recv_max_bytes > p->max_frame_bytes)
        return LOCO_ERR(LOCO_EINVAL, "net: recv_max_bytes = %llu exceeds max_frame_bytes = %llu",
                        (unsigned long long)p->recv_max_bytes,
                        (unsigned long long)p->max_frame_bytes);
    if (loco__link_budget(p) < loco__recv_max(p))
        return LOCO_ERR(LOCO_EINVAL,
                        "net.link_buffer_mb: %llu bytes, below the frame limit of %llu bytes "
                        "(a link could not hold one frame)",
                        (unsigned long long)loco__link_budget(p),
                        (unsigned long long)loco__recv_max(p));
    if (p->queue_frames < 1)
        return LOCO_ERR(LOCO_EINVAL, "net.queue_frames = %d, expected >= 1", p->queue_frames);
    if (!nonneg(p->link_gbps) || !nonneg(p->rtt_ms) || p->sndbuf < 0 || p->rcvbuf < 0)
        return LOCO_ERR(LOCO_EINVAL, "net: negative link_gbps, rtt_ms or socket buffer");
    if (p->connect_timeout_ms < 1 || p->handshake_timeout_ms < 1 || p->io_timeout_ms < 1 ||
        p->linger_ms < 0)
        return LOCO_ERR(LOCO_EINVAL, "net: timeouts must be positive (linger_ms >= 0)");
    if (!nonneg(p->wan.delay_ms) || !nonneg(p->wan.jitter_ms) || !nonneg(p->wan.gbps))
        return LOCO_ERR(LOCO_EINVAL, "net: WAN emulation values must be >= 0");
    const loco_link_faults *f = &p->faults;
    if (!prob_ok(f->drop) || !prob_ok(f->corrupt) || !prob_ok(f->duplicate) || !prob_ok(f->delay) ||
        !nonneg(f->delay_ms))
        return LOCO_ERR(LOCO_EINVAL, "net: fault probabilities must be in [0, 1], delay >= 0");
    if (p->name[0] && !loco__name_ok(p->name))
        return LOCO_ERR(LOCO_EINVAL, "net: name '%.64s' is not printable ASCII", p->name);
    if (p->cert_run_id[0])
        LOCO_CHECK(loco_net_run_id_check(p->cert_run_id));
    if (p->backend == LOCO_NET_PLAIN)
        return 0;
    if (p->crl[0])
        LOCO_CHECK(file_ok("crl", p->crl));
    if (!p->ca[0])
        return LOCO_ERR(LOCO_EINVAL, "net.ca is empty: TLS needs the run's CA (`loco certs`)");
    LOCO_CHECK(file_ok("ca", p->ca));
    if (!p->cert[0] != !p->key[0])
        return LOCO_ERR(LOCO_EINVAL, "net.cert and net.key go together (one is empty)");
    if (!p->cert[0]) {
        if (server)
            return LOCO_ERR(LOCO_EINVAL,
                            "net.cert is empty: a listener must present a certificate");
        return 0;
    }
    LOCO_CHECK(file_ok("cert", p->cert));
    LOCO_CHECK(file_ok("key", p->key));
    return 0;
}
