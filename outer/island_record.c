/* An island's records: a line of outer.jsonl and of the log for each
 * committed outer step (bytes, waits, utilisation, θ_global's hash), and
 * the same figures as live metrics. */
#include "outer/island_internal.h"

#include <math.h>
#include <string.h>

void loco__island_record(island *is, int64_t outer, int64_t inner, int frag,
                         const loco_exchange_stats *st, const double *sums, uint64_t h,
                         int n_members) {
    char hh[17];
    loco_hash_hex(h, hh);
    /* Utilisation: the share of wall time since the last record that the
     * inner loop was not held by the outer loop. */
    const double now = loco_now();
    const double wait = is->wait_acc + (now - is->call_t0), wall = now - is->last_record_t;
    is->wait_acc = 0;
    is->call_t0 = is->last_record_t = now;
    loco_info("outer step %lld (inner %lld, epoch %llu, %d islands%s) | sent %.2f MB for %.2f "
              "MB raw (x%.1f) | exchange %.3f s | waited %.3f of %.3f s | θ %s",
              (long long)outer, (long long)inner, (unsigned long long)is->q.epoch, n_members,
              is->fr.F > 1 ? ", a fragment" : "", sums[1] / 1e6, sums[0] / 1e6,
              sums[1] > 0 ? sums[0] / sums[1] : 0.0, sums[3], wait, wall, hh);
    loco_metrics_begin(is->metrics);
    loco_metrics_int(is->metrics, "outer_step", outer);
    loco_metrics_int(is->metrics, "step", inner);
    loco_metrics_int(is->metrics, "epoch", (int64_t)is->q.epoch);
    loco_metrics_int(is->metrics, "members", n_members);
    loco_metrics_int(is->metrics, "fragment", frag);
    loco_metrics_int(is->metrics, "overlap", is->sync.overlapped ? is->overlap : 0);
    loco_metrics_num(is->metrics, "bytes_raw", sums[0]);
    loco_metrics_num(is->metrics, "bytes_sent", sums[1]);
    loco_metrics_num(is->metrics, "bytes_received", sums[2]);
    loco_metrics_num(is->metrics, "compression_ratio", sums[1] > 0 ? sums[0] / sums[1] : 0);
    loco_metrics_num(is->metrics, "exchange_s", sums[3]);
    loco_metrics_num(is->metrics, "delta_ratio", sums[4]);
    loco_metrics_num(is->metrics, "inner_wait_s", sums[3] + st->encode_s + st->apply_s);
    loco_metrics_num(is->metrics, "wait_s", wait);
    loco_metrics_num(is->metrics, "ready_wait_s", is->sync.ready_s);
    loco_metrics_num(is->metrics, "exchange_wait_s", is->sync.join_s);
    loco_metrics_num(is->metrics, "commit_wait_s", is->sync.done_s);
    loco_metrics_num(is->metrics, "wall_s", wall);
    loco_metrics_num(is->metrics, "utilisation", wall > 0 ? 1 - wait / wall : 1);
    loco_metrics_str(is->metrics, "theta_hash", hh);
    loco_metrics_str(is->metrics, "algorithm",
                     is->algo == LOCO_EXCHANGE_RSAG ? "rsag" : "allgather");
    loco_metrics_int(is->metrics, "zstd", st->zstd);
    loco_metrics_num(is->metrics, "sender_encode_s", st->sender_encode_s);
    loco_metrics_num(is->metrics, "pcie_bytes", is->sync.pcie);
    loco_metrics_end(is->metrics);
    loco_prom *p = is->prom;
    loco_prom_set(p, "loco_island_outer_step", NULL, (double)outer);
    loco_prom_set(p, "loco_island_outer_inner_step", NULL, (double)inner);
    loco_prom_set(p, "loco_island_epoch", NULL, (double)is->q.epoch);
    loco_prom_set(p, "loco_island_members", NULL, n_members);
    loco_prom_add(p, "loco_island_bytes_sent_total", NULL, sums[1]);
    loco_prom_add(p, "loco_island_bytes_received_total", NULL, sums[2]);
    loco_prom_add(p, "loco_island_bytes_raw_total", NULL, sums[0]);
    loco_prom_set(p, "loco_island_delta_ratio", NULL, sums[4]);
    loco_prom_set(p, "loco_island_exchange_seconds", NULL, sums[3]);
    loco_prom_set(p, "loco_island_utilisation", NULL, wall > 0 ? 1 - wait / wall : 1);
    loco_prom_set_only(p, "loco_island_theta_hash_info", hh, 1);
}

/* The live metrics of loco__island_record (docs/METRICS.md). */
static const struct {
    const char *name;
    loco_prom_type type;
    const char *label;
    const char *help;
} island_metrics[] = {
    {"loco_island_info", LOCO_PROM_GAUGE, "site", "always 1; the label is this island's site"},
    {"loco_island_outer_step", LOCO_PROM_GAUGE, NULL, "last outer step this island committed"},
    {"loco_island_outer_inner_step", LOCO_PROM_GAUGE, NULL,
     "inner step at which the last committed outer step was taken"},
    {"loco_island_epoch", LOCO_PROM_GAUGE, NULL, "quorum epoch of the last committed outer step"},
    {"loco_island_members", LOCO_PROM_GAUGE, NULL, "islands in the last committed outer step"},
    {"loco_island_bytes_sent_total", LOCO_PROM_COUNTER, NULL,
     "encoded pseudo-gradient bytes the island's ranks sent to other islands"},
    {"loco_island_bytes_received_total", LOCO_PROM_COUNTER, NULL,
     "encoded pseudo-gradient bytes the island's ranks received from other islands"},
    {"loco_island_bytes_raw_total", LOCO_PROM_COUNTER, NULL,
     "fp32 bytes those exchanges would have taken uncompressed"},
    {"loco_island_delta_ratio", LOCO_PROM_GAUGE, NULL,
     "largest ratio of an island's chunk norm to the median of the others' seen at the last outer "
     "step (what outer.max_delta_ratio bounds)"},
    {"loco_island_exchange_seconds", LOCO_PROM_GAUGE, NULL,
     "wall time of the last outer step's exchange (slowest rank)"},
    {"loco_island_utilisation", LOCO_PROM_GAUGE, NULL,
     "share of wall time since the previous outer step that the inner loop was not held"},
    {"loco_island_theta_hash_info", LOCO_PROM_GAUGE, "hash",
     "always 1; the label is the theta_global hash of the last committed outer step"},
};

int loco_island_set_prom(loco_island *is, loco_prom *p) {
    if (is->whole)
        return loco__whole_set_prom(is, p);
    if (!p)
        return 0;
    for (size_t i = 0; i < sizeof island_metrics / sizeof *island_metrics; i++)
        LOCO_CHECK(loco_prom_declare(p, island_metrics[i].name, island_metrics[i].type,
                                     island_metrics[i].label, island_metrics[i].help));
    loco_prom_set(p, "loco_island_info", is->site, 1);
    is->prom = p;
    return 0;
}
