/* The island's outer loop, shared by outer/island.c (set-up, the fragment
 * schedule, merges, outer-state files) and outer/island_sync.c (the
 * coordinator's protocol around one outer step, rejoin, the algorithm
 * choice). Not a public header. */
#ifndef LOCO_OUTER_ISLAND_INTERNAL_H
#define LOCO_OUTER_ISLAND_INTERNAL_H

#include "inner/comm/comm.h"
#include "outer/outer.h"

#include <pthread.h>
#include <stdatomic.h>

/* One fragment sync (an outer step of the coordinator's numbering) from
 * its go to its commit; with outer.overlap its exchange runs on a thread
 * while the inner steps go on. */
typedef struct {
    bool active;       /* started, not yet committed */
    bool overlapped;   /* started with outer.overlap: finished τ steps later */
    bool threaded;     /* the exchange runs on `thread` */
    pthread_t thread;
    int64_t outer;     /* outer step number */
    int64_t inner;     /* inner step it started after */
    int frag;
    bool planned;      /* the pseudo-gradient was encoded (a redo resends it) */
    bool observer;
    float *theta;      /* θ_local of the fragment at the start (packed, or in place) */
    loco_exchange x;
    loco_link *contrib[LOCO_MAX_PEERS], *obs[LOCO_MAX_PEERS];
    int ids[LOCO_MAX_PEERS];
    loco_exchange_stats st;
    int rc;            /* of the exchange */
    atomic_int exchanged; /* the thread is through */
    /* Concluded ahead of its commit step (outcome agreed, DONE sent). */
    bool concluded, ok;
    uint64_t suspects, hash;
    /* Where the inner loop waited: for the go, for the exchange to end,
     * for the commit (seconds, this step's attempts together). */
    double ready_s, join_s, done_s;
    double sums[5];    /* island totals: raw, sent, received bytes; exchange seconds,
                          largest contribution-norm ratio (maxima) */
    char msg[256];     /* its error message (errors are thread-local) */
    double pcie;       /* island total: bytes across PCIe since the last record */
} loco_sync;

/* outer.layout = whole (island_whole.c). */
typedef struct loco_whole loco_whole;

struct loco_island {
    loco_whole *whole;          /* outer.layout = whole: a shell around it, the rest unused */
    loco_config cfg;
    char site[LOCO_NET_NAME_MAX];
    int id, K;
    loco_inner_view in;
    struct loco_comm *world;
    int rank, ranks;
    loco_net_params np;
    loco_peers *svc;            /* peer listener, link stash, state server */
    loco_session *session;      /* rank 0 only */
    loco_quorum q;              /* the latest quorum */
    loco_link *links[LOCO_MAX_ISLANDS]; /* by island id, for links_epoch */
    uint64_t links_epoch;
    /* Outer state: one loco_outer per fragment of the owned range. */
    loco_fragments fr;
    loco_outer *outer[LOCO_MAX_FRAGMENTS];
    loco_outer_set set;
    bool on_dev;                /* the outer state is on the device (loco_island_outer_on_device) */
    float *packed;              /* (largest fragment) θ_local of a fragment in flight */
    int64_t period;             /* inner steps between fragment syncs: H / fragments */
    int overlap;                /* τ */
    float alpha;                /* outer.merge_alpha */
    int64_t committed;          /* outer step of θ_global */
    uint64_t committed_hash;
    bool final_committed;       /* the outer step at the run's last inner step committed */
    int64_t end_step;           /* the run's last inner step: train.steps, or later when the
                                   coordinator holds the end for a fault's open cycle */
    loco_sync sync;             /* the outer step under way */
    int merge_frag;             /* committed, merge into θ_local due at merge_step (-1: none) */
    int64_t merge_step;
    bool finished;              /* the run ended during an outer step */
    /* outer.sync = time: an outer step once period_s passed since sync_t0
     * (the end of the last one); the run's last outer step is end_step /
     * period, and the island stops at stop_step, the inner step it
     * committed at. */
    bool timed;
    double sync_t0;
    int64_t last_sync_inner;    /* inner step of the last outer step (or of the start) */
    int64_t stop_step;
    /* outer.quorum: the pseudo-gradient of a period whose outer step went
     * without this island (against θ_global of late_base), folded into
     * θ_local once it is a member again (loco__island_fold_late). */
    float *late;
    int64_t late_base;
    bool late_held;
    loco_exchange_algo algo;
    bool auto_algo, measure;    /* outer.algorithm = auto; links measured, not configured */
    uint64_t algo_epoch;        /* auto: the quorum epoch whose members chose is->algo
                                   together (the probe's, or the last step's); a step in
                                   another epoch all-gathers */
    double rtt_s, bytes_per_s;  /* this rank's estimate of its links */
    double elems_max;           /* largest fragment of the island's ranks */
    loco_metrics *metrics;      /* rank 0: outer-step records */
    loco_prom *prom;            /* rank 0: live metrics (the trainer's; NULL = off) */
    loco_faults f;              /* [faults] of this island (faulttol/) */
    /* Compute utilisation: seconds the inner loop waited for the outer
     * loop since the last record, and when that record was written. */
    double wait_acc, call_t0, last_record_t;
};

typedef struct loco_island island;

/* island_sync.c */
void loco__island_drop_links(island *is);
int loco__island_join(island *is);
int loco__island_hash(island *is, uint64_t *h);
/* outer.algorithm's choice; may_probe: a member of a fresh run's first
 * quorum, whose peers probe too (else auto starts with all-gather). */
int loco__island_choose_algorithm(island *is, bool may_probe);
int loco__island_check_coordinator(island *is);
/* Outer step `outer` (fragment `frag`) after inner step `inner`: ready, go,
 * exchange (on a thread when `overlap`), done, redone in each new epoch
 * until committed; or this island rejoins. */
int loco__island_sync(island *is, int64_t outer, int64_t inner, int frag, bool overlap);
/* Waits for the exchange in flight and carries the step to its commit. */
int loco__island_sync_finish(island *is);
/* While the exchange is in flight: once every rank's is through, its
 * outcome is agreed and DONE goes to the coordinator, so the commit is
 * waiting by the step it is due. */
int loco__island_sync_poll(island *is);
/* READY for the outer step due after the next inner step, sent now. */
void loco__island_ready_ahead(island *is, int64_t outer);
int loco__island_rejoin(island *is);

/* island.c */
/* loco_island_create on the ranks of `world`, in the layout of `inner`'s
 * table. */
int loco__island_create_on(loco_island **out, const loco_config *cfg, const char *site,
                           struct loco_comm *world, const loco_inner_view *inner, bool resumed);
/* θ_local ← α θ_local + (1 − α) θ_global on fragment f (α = 0: a copy). */
int loco__island_merge(island *is, int f, float alpha);
/* outer.quorum: an outer step went without this island; its work of the
 * period is kept (θ_global − θ_local) ... */
int loco__island_keep_late(island *is);
/* ... and once it is a member again, θ_local −= Δ / (1 + s), s the outer
 * steps committed since the θ_global it was made against. */
int loco__island_fold_late(island *is);
/* θ_local ← θ_global on every fragment. */
int loco__island_adopt_global(island *is);
void loco__island_record(island *is, int64_t outer, int64_t inner, int frag,
                         const loco_exchange_stats *st, const double *sums, uint64_t h,
                         int n_members);

/* island_whole.c: the island's calls under outer.layout = whole. */
int loco__whole_create(loco_island **out, const loco_config *cfg, const char *site,
                       struct loco_comm *world, const loco_inner_view *inner, bool resumed);
int loco__whole_after_step(loco_island *is, int64_t step, double step_s);
int loco__whole_save(loco_island *is, int64_t step);
int loco__whole_leave(loco_island *is);
bool loco__whole_finished(const loco_island *is);
int64_t loco__whole_end_step(const loco_island *is);
int loco__whole_set_prom(loco_island *is, loco_prom *p);
void loco__whole_destroy(loco_island *is);

#endif
