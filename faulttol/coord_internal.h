/* The coordinator's state, shared by faulttol/coord.c (quorum epochs,
 * failure detection, the serve loop), faulttol/coord_step.c (the go and
 * the commit of every outer step), faulttol/coord_register.c (pending
 * connections, REGISTER, the first quorum) and faulttol/coord_metrics.c.
 * Not a public header. */
#ifndef LOCO_FAULTTOL_COORD_INTERNAL_H
#define LOCO_FAULTTOL_COORD_INTERNAL_H

#include "faulttol/faulttol.h"

#include <cjson/cJSON.h>

typedef enum { ABSENT = 0, MEMBER, OUT } island_status;

typedef struct {
    loco_link *link;
    island_status status;
    uint64_t inc;
    bool bye;
    int n_ranks;
    char (*addrs)[LOCO_ADDR_MAX];
    loco_phi_detector phi;    /* over its frame arrivals */
    loco_island_progress reg; /* what it said when it registered */
    int64_t ready_step, ready_have;
    int64_t done_step;
    uint64_t done_epoch, done_hash, suspects;
    bool done_ok;
    double join_sent; /* when it was last told to fetch the state (0: not) */
    bool hold_spent;  /* the members already waited once for its transfer */
    uint64_t gone_sent, gone_recv; /* socket bytes of the links it held before */
} island;

/* A connection that has not registered (yet). */
typedef struct {
    loco_link *link;
    double since; /* accepted, or refused (closing) */
    bool closing; /* refused and told why: waits for the peer to hang up */
} pending_link;

struct loco_coord {
    loco_config cfg;
    loco_net_params np;
    loco_net_listener *listener;
    int wake_fd; /* eventfd the listener and every link add to: the loop's wait */
    int n;       /* islands expected (outer.sites) */
    char sites[LOCO_MAX_ISLANDS][LOCO_NET_NAME_MAX];
    island isl[LOCO_MAX_ISLANDS];               /* by id */
    pending_link pending[LOCO_NET_MAX_PENDING]; /* np.max_pending used */
    /* The mesh and model every island must match: the first registration's. */
    bool have_ref;
    char ref_mesh[160];
    int ref_ranks;
    uint64_t ref_model;
    bool started;
    bool known;       /* the run started once: epoch and committed state are its own */
    double first_reg; /* a restarted coordinator waits for the others from here */
    uint64_t epoch;
    int64_t committed;
    uint64_t committed_hash;
    bool exchanging; /* GO sent for committed + 1, verdicts pending */
    uint64_t go_members, go_observers;
    double gather_t0;           /* first member ready for the step (straggler clock) */
    double site_tokens[LOCO_MAX_ISLANDS]; /* outer.quorum: each site's tokens per period
                                             (0: not read from its keys yet) */
    int failures;               /* failed attempts of the current step */
    int64_t end_step;           /* the run's last inner step: train.steps, moved on while a
                                   fault's cycle is open (faults.max_extra_steps) */
    char events[LOCO_PATH_MAX]; /* the run's timeline, "" = none */
    /* The decision journal (journal.c): on once loco_coord_open_journal
     * opened it; journal_committed is the last commit it holds. */
    bool journal_on;
    int journal_fd;
    char journal[LOCO_PATH_MAX];
    int64_t journal_committed;
    bool hold_warned; /* said once that no island registered holds the committed state */
    /* Live metrics (faulttol.metrics_addr; NULL = off) and the counts
     * only they report. */
    loco_prom *prom;
    double prom_t; /* last update */
    uint64_t n_suspicions, n_lost, n_ejected, n_restarts, n_registrations;
};

/* A JSON number in [lo, hi] (NaN and overflowing values refused). */
static inline bool loco__coord_num_in(const cJSON *j, double lo, double hi) {
    return cJSON_IsNumber(j) && j->valuedouble >= lo && j->valuedouble <= hi;
}

/* Adds the byte counts of island i's link to what its earlier links
 * carried, before the link goes. */
static inline void loco__coord_retire_link(island *is) {
    if (!is->link)
        return;
    loco_link_stats st;
    loco_link_get_stats(is->link, &st);
    is->gone_sent += st.wire_bytes_sent;
    is->gone_recv += st.wire_bytes_recv;
}

/* The island was heard from now (it registered, or the run started and its
 * silence counts from here): the failure detector's clocks restart, its
 * heartbeat intervals stay. */
static inline void loco__coord_heard_now(island *is, double now) {
    loco_phi_start(&is->phi, now);
    if (loco_phi_beats(&is->phi) > 0)
        is->phi.last_s = now;
}

/* coord.c */
/* Appends one event (the JSON body after "t") to the run's timeline. */
void loco__coord_event(loco_coord *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Bit mask of the members of the quorum now. */
uint64_t loco__coord_members(const loco_coord *c);
/* The names of the sites of `mask`, quoted and comma-separated, into out. */
void loco__coord_mask_sites(const loco_coord *c, uint64_t mask, char *out, size_t cap);
/* A control frame; a failed send is noticed when the link is next read. */
int loco__coord_send_json(loco_link *l, int type, uint64_t epoch, const char *json);
/* The QUORUM payload (caller frees with free()); NULL when out of memory. */
char *loco__coord_quorum_json(loco_coord *c, int64_t outer_step, bool join, uint64_t mem,
                              uint64_t obs);
/* Sends a QUORUM (of members mem and observers obs, for outer_step; 0 =
 * an announcement) to every island of mask `to`; a failed send is noticed
 * when the link is next read. */
int loco__coord_announce(loco_coord *c, uint64_t to, int64_t outer_step, uint64_t mem,
                         uint64_t obs);
/* Tells island i it is outside the quorum: fetch the committed state from
 * a member, then say ready. */
int loco__coord_send_join(loco_coord *c, int i);
/* A membership change: a new epoch, announced to everyone in the run. */
int loco__coord_new_epoch(loco_coord *c, const char *why);
/* Every member is gone: every link is dropped and the run starts over as
 * after a coordinator restart (the islands register again). */
void loco__coord_restart_run(loco_coord *c);
/* Island i is gone (its link is dropped); < 0 only when the run must stop. */
int loco__coord_island_lost(loco_coord *c, int i, const char *reason);
/* Island i leaves the quorum but keeps its link: it is told to fetch the
 * committed state and rejoin (a new epoch when it was a member); < 0 only
 * when the run must stop. */
int loco__coord_island_out(loco_coord *c, int i, const char *reason);

/* coord_step.c */
/* An island says at registration that the run ends at end_step: a
 * restarted coordinator takes the latest end it hears of, within
 * train.steps + faults.max_extra_steps (what no island can push past). */
void loco__coord_adopt_end(loco_coord *c, const char *site, int64_t end_step);
/* Every member ready for outer step committed + 1: the GO (stragglers left
 * out under faulttol.straggler_policy = drop); < 0 when the run must stop. */
int loco__coord_try_go(loco_coord *c);
/* The COMMIT once every island of the go reported DONE with a majority
 * hash: 1 when committed, 0 when still waiting, < 0 when the run must stop
 * (no hash has a strict majority). */
int loco__coord_try_commit(loco_coord *c);
/* An OUTER frame (READY, DONE or FAILED) of island i, sent in epoch
 * sent_epoch; < 0 only when the run must stop. */
int loco__coord_handle_outer(loco_coord *c, int i, uint64_t sent_epoch, const char *json,
                             size_t len);
/* An OUTER payload, checked: phase one of ready, done, failed. */
typedef struct {
    char phase[8];
    int64_t outer_step, have;
    uint64_t epoch, hash, suspects;
} loco__outer_msg;
/* Parses an OUTER payload: 0, or LOCO_EPROTO when malformed. */
int loco__coord_outer_parse(loco__outer_msg *m, const char *json, size_t len);

/* journal.c */
/* Appends one decision (a JSON object from fmt) and syncs it: 0 once it is
 * on disk, < 0 when it is not (the decision must not be announced). No-op
 * without a journal. */
int loco__coord_journal(loco_coord *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The commit of outer step `step` with `hash` by `members` (how: "commit",
 * or "resumed" for the state a restart resumes at), unless it is the last
 * one journalled; LOCO_COORD_CRASH_AFTER_COMMIT=step makes the process
 * SIGKILL itself right after (the fault lab's crash). */
int loco__coord_journal_commit(loco_coord *c, int64_t step, uint64_t hash, uint64_t members,
                               const char *how);

/* coord_step.c: stops the run; every live island hears why. */
int loco__coord_fail_run(loco_coord *c, const char *why);

/* coord_metrics.c */
/* Starts serving live metrics when faulttol.metrics_addr is set (the
 * address goes to run.dir/metrics_addr). */
int loco__coord_metrics_start(loco_coord *c);
/* The metrics from the state now (at most every 50 ms; no-op when off). */
void loco__coord_metrics_update(loco_coord *c);

/* coord_register.c */
/* A REGISTER, checked: every field present and in range. The strings and
 * ranks point into root, which the caller deletes (also after an error). */
typedef struct {
    cJSON *root;
    const char *site, *mesh; /* mesh shorter than loco_coord's ref_mesh */
    uint64_t model_hash, inc;
    const cJSON *ranks; /* n_ranks items in [1, LOCO_MAX_ISLAND_RANKS] */
    int n_ranks;
    loco_island_progress reg;
} loco__register_msg;
/* Parses a REGISTER payload: 0, or LOCO_EPROTO when malformed. */
int loco__coord_register_parse(loco__register_msg *m, const char *json, size_t len);
/* Takes links from the listener while there is room for them. */
void loco__coord_accept_pending(loco_coord *c, bool *busy);
/* One frame from each pending link: a REGISTER, or the link goes; < 0 only
 * when the run must stop. */
int loco__coord_read_pending(loco_coord *c, bool *busy);
/* The first quorum, once every site registered (or, after a restart, the
 * grace period passed). */
int loco__coord_start_run(loco_coord *c);

#endif
