/* The coordinator's live metrics (faulttol.metrics_addr): what it knows of
 * the run, set from its one thread in core's registry (loco_prom), which
 * the `loco` program serves. docs/METRICS.md lists them. */
#include "faulttol/coord_internal.h"

#include <stdio.h>

/* Updates at most this often: the serve loop turns every few ms. */
#define UPDATE_S 0.05

static const struct {
    const char *name;
    loco_prom_type type;
    const char *label;
    const char *help;
} metrics[] = {
    {"loco_coord_islands", LOCO_PROM_GAUGE, NULL, "islands the run expects (outer.sites)"},
    {"loco_coord_members", LOCO_PROM_GAUGE, NULL, "islands in the quorum now"},
    {"loco_coord_member", LOCO_PROM_GAUGE, "site", "1 when the site is in the quorum, else 0"},
    {"loco_coord_connected", LOCO_PROM_GAUGE, "site",
     "1 when the site holds a registered link to the coordinator, else 0"},
    {"loco_coord_started", LOCO_PROM_GAUGE, NULL, "1 once the first quorum was announced"},
    {"loco_coord_epoch", LOCO_PROM_GAUGE, NULL, "quorum epoch (bumped by every membership change)"},
    {"loco_coord_outer_step", LOCO_PROM_GAUGE, NULL, "last outer step committed"},
    {"loco_coord_exchanging", LOCO_PROM_GAUGE, NULL,
     "1 while an outer step's exchange is under way (GO sent, verdicts pending)"},
    {"loco_coord_last_hash_info", LOCO_PROM_GAUGE, "hash",
     "always 1; the label is the theta_global hash of the last committed outer step"},
    {"loco_coord_bytes_sent_total", LOCO_PROM_COUNTER, NULL,
     "bytes the coordinator wrote to island links (socket bytes, TLS included)"},
    {"loco_coord_bytes_received_total", LOCO_PROM_COUNTER, NULL,
     "bytes the coordinator read from island links (socket bytes, TLS included)"},
    {"loco_coord_suspicions_total", LOCO_PROM_COUNTER, NULL,
     "islands suspected (a suspect event: silent, link closed, straggler, refused, other hash)"},
    {"loco_coord_islands_lost_total", LOCO_PROM_COUNTER, NULL,
     "island links dropped as dead (silent, closed, or replaced by a restarted process)"},
    {"loco_coord_ejections_total", LOCO_PROM_COUNTER, NULL,
     "members sent out of the quorum with their link kept (to fetch the state and rejoin)"},
    {"loco_coord_run_restarts_total", LOCO_PROM_COUNTER, NULL,
     "times every member was gone and the run waited for the islands to register again"},
    {"loco_coord_registrations_total", LOCO_PROM_COUNTER, NULL,
     "REGISTERs accepted (one per island process, more when islands restart or reconnect)"},
};

int loco__coord_metrics_start(loco_coord *c) {
    if (!c->cfg.faulttol.metrics_addr[0])
        return 0;
    LOCO_CHECK(loco_prom_create(&c->prom));
    for (size_t i = 0; i < sizeof metrics / sizeof *metrics; i++)
        LOCO_CHECK(loco_prom_declare(c->prom, metrics[i].name, metrics[i].type, metrics[i].label,
                                     metrics[i].help));
    c->prom_t = 0;
    loco__coord_metrics_update(c);
    return 0;
}

loco_prom *loco_coord_prom(loco_coord *c) {
    return c->prom;
}

void loco__coord_metrics_update(loco_coord *c) {
    if (!c->prom || loco_now() - c->prom_t < UPDATE_S)
        return;
    c->prom_t = loco_now();
    loco_prom *p = c->prom;
    const uint64_t mem = loco__coord_members(c);
    double sent = 0, recv = 0;
    for (int i = 0; i < c->n; i++) {
        const island *is = &c->isl[i];
        loco_prom_set(p, "loco_coord_member", c->sites[i], loco_quorum_has(mem, i));
        loco_prom_set(p, "loco_coord_connected", c->sites[i], is->link != NULL);
        sent += (double)is->gone_sent;
        recv += (double)is->gone_recv;
        if (is->link) {
            loco_link_stats st;
            loco_link_get_stats(is->link, &st);
            sent += (double)st.wire_bytes_sent;
            recv += (double)st.wire_bytes_recv;
        }
    }
    loco_prom_set(p, "loco_coord_islands", NULL, c->n);
    loco_prom_set(p, "loco_coord_members", NULL, __builtin_popcountll(mem));
    loco_prom_set(p, "loco_coord_started", NULL, c->started);
    loco_prom_set(p, "loco_coord_epoch", NULL, (double)c->epoch);
    loco_prom_set(p, "loco_coord_outer_step", NULL, (double)c->committed);
    loco_prom_set(p, "loco_coord_exchanging", NULL, c->exchanging);
    if (c->committed > 0) {
        char hh[17];
        loco_hash_hex(c->committed_hash, hh);
        loco_prom_set_only(p, "loco_coord_last_hash_info", hh, 1);
    }
    loco_prom_set(p, "loco_coord_bytes_sent_total", NULL, sent);
    loco_prom_set(p, "loco_coord_bytes_received_total", NULL, recv);
    loco_prom_set(p, "loco_coord_suspicions_total", NULL, (double)c->n_suspicions);
    loco_prom_set(p, "loco_coord_islands_lost_total", NULL, (double)c->n_lost);
    loco_prom_set(p, "loco_coord_ejections_total", NULL, (double)c->n_ejected);
    loco_prom_set(p, "loco_coord_run_restarts_total", NULL, (double)c->n_restarts);
    loco_prom_set(p, "loco_coord_registrations_total", NULL, (double)c->n_registrations);
}
