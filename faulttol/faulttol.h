/* faulttol/ — what keeps a multi-site run together: the coordinator
 * (registration, ids, quorum epochs, heartbeats and the bitwise-agreement
 * check of θ_global) and the island side of that protocol. Messages are
 * net/ frames whose payloads are small JSON objects; docs/PROTOCOL.md lists
 * them. */
#ifndef LOCO_FAULTTOL_H
#define LOCO_FAULTTOL_H

#include "core/core.h"
#include "net/net.h"

#define LOCO_MAX_ISLANDS 64
/* Largest number a control message's JSON may carry for a step, an epoch,
 * a count or an offset: below 2^53, so every integer up to it is exact in
 * the double cJSON parses into, and far above any real run's counters. */
#define LOCO_JSON_NUM_MAX 1e15
#define LOCO_MAX_ISLAND_RANKS 4096
#define LOCO_ADDR_MAX 96

/* Splits "host:port" (port 1..65535). */
int loco_parse_hostport(const char *s, char *host, size_t host_cap, int *port);
/* The island id of a site: its index in outer.sites; LOCO_EINVAL if absent. */
int loco_site_id(const loco_config *cfg, const char *site, int *id, int *n_sites);

/* One island as the coordinator announces it. */
typedef struct {
    int id;
    char site[LOCO_NET_NAME_MAX];
    int n_ranks;                  /* 0: not registered now */
    char (*addrs)[LOCO_ADDR_MAX]; /* (n_ranks) "host:port" of each rank's peer listener */
} loco_member;

/* What the coordinator announces: membership of a quorum epoch and, with
 * outer_step > 0, the go for that outer step. */
typedef struct {
    uint64_t epoch;
    int64_t outer_step;      /* go for this outer step; 0 = membership only */
    int64_t committed;       /* last outer step every member agreed on */
    uint64_t committed_hash; /* θ_global hash after it */
    bool join;               /* to an island outside the quorum: fetch the state of
                                `committed` from a member, then say ready */
    int n;                   /* islands of the run (outer.sites) */
    uint64_t members;        /* bit id: contributes to this step */
    uint64_t observers;      /* bit id: joins at this step (receives, sends nothing) */
    int64_t end_step;        /* the run's last inner step as the coordinator holds it: moved
                                on while a fault's cycle is open (faults.max_extra_steps);
                                0 = not said */
    loco_member m[LOCO_MAX_ISLANDS]; /* by id */
} loco_quorum;

void loco_quorum_fini(loco_quorum *q);
/* JSON form, as QUORUM frames carry it (caller frees with free()). */
char *loco_quorum_to_json(const loco_quorum *q);
int loco_quorum_from_json(loco_quorum *q, const char *json, size_t len);
static inline bool loco_quorum_has(uint64_t mask, int id) {
    return id >= 0 && id < 64 && ((mask >> id) & 1u);
}

/* ----------------------------------------------------------- coordinator */

typedef struct loco_coord loco_coord;

/* The largest frame payload the coordinator takes (its links tell islands
 * so in HELLO): a REGISTER listing LOCO_MAX_ISLAND_RANKS addresses. */
#define LOCO_COORD_MAX_FRAME (4096 + LOCO_MAX_ISLAND_RANKS * (LOCO_ADDR_MAX + 4))
/* Streams per link it accepts (islands use one). */
#define LOCO_COORD_MAX_STREAMS 4

/* Listens on faulttol.coordinator (or host:port when given: port 0 picks
 * one) for the islands of outer.sites. Events (quorums, suspicions,
 * commits, joins) are appended to events_path when not NULL. */
int loco_coord_create(loco_coord **out, const loco_config *cfg, const loco_net_params *np,
                      const char *host, int port, const char *events_path);
int loco_coord_port(const loco_coord *c);
/* Reads the coordinator's decision journal at path back (missing = empty)
 * and appends every decision after it from now on, synced before any
 * island hears it: a restarted coordinator resumes at the last commit it
 * recorded (islands holding it, committed or only finished, vouch for it;
 * it waits for one) and believes no island beyond it. A torn last record
 * is dropped with a warning; a corrupt record before it is LOCO_EIO naming
 * the file and record. Call before loco_coord_serve. */
int loco_coord_open_journal(loco_coord *c, const char *path);
/* The coordinator's live metrics registry (faulttol.metrics_addr set;
 * else NULL), for its caller to serve; valid while c lives. */
loco_prom *loco_coord_prom(loco_coord *c);
/* Serves until every member said BYE (0) or the run must stop. Islands
 * lost or suspected leave the quorum (new epoch; the survivors redo the
 * step without them); a restarted island or a dropped straggler rejoins
 * through a state transfer; a coordinator restarted mid-run rebuilds the
 * quorum from what the islands report when they re-register, and so does
 * this one when every member is gone. An island whose θ_global hash
 * differs from the one a strict majority of the members reported, or whose
 * contribution a strict majority refused, leaves the quorum and fetches
 * the state; hashes that differ with no strict majority stop the run
 * (ERROR to everyone, LOCO_EPEER here). Nothing a
 * connection does ends it otherwise: a refused REGISTER (unknown site,
 * another site's certificate, another mesh or model), a frame out of place
 * or a link that fails is logged, that connection dropped, and it goes on. */
int loco_coord_serve(loco_coord *c);
void loco_coord_destroy(loco_coord *c);

/* ---------------------------------------------------------- island side */

typedef struct loco_session loco_session;

/* What an island tells the coordinator about itself. */
typedef struct {
    const char *site;
    int n_ranks;
    const char (*addrs)[LOCO_ADDR_MAX];
    const char *mesh;   /* e.g. "dp=2 tp=1 pp=1 cp=1 ep=1 zero=1" */
    uint64_t model_hash; /* hash of [model] and [outer]: islands must agree */
} loco_island_info;

/* What an island holds, sent with every (re)registration so that a
 * restarted coordinator can rebuild the run. */
typedef struct {
    int64_t committed;     /* outer step of its θ_global (0: the initial one) */
    uint64_t hash;         /* θ_global hash at committed */
    uint64_t epoch;        /* last quorum epoch it knew (0: none) */
    int64_t pending;       /* outer step done but not yet committed (0: none) */
    uint64_t pending_hash; /* θ_global hash after it */
    int64_t end_step;      /* the run's last inner step it knows (0: train.steps) */
} loco_island_progress;

/* The coordinator's answer to a session call. */
typedef enum {
    LOCO_VERDICT_GO = 1,     /* exchange this step with q's members (q filled) */
    LOCO_VERDICT_COMMIT = 2, /* every member agreed: the step is final */
    LOCO_VERDICT_AGAIN = 3,  /* membership changed: say ready again and redo */
    LOCO_VERDICT_JOIN = 4,   /* outside the quorum: fetch the state, rejoin (q filled) */
    LOCO_VERDICT_FINISHED = 5, /* the run ended (BYE) */
} loco_verdict;

/* Connects to the coordinator, registers and waits (up to timeout_ms) for
 * the first quorum (q: membership, or join = true). A refusal is
 * LOCO_EPEER with the coordinator's reason. */
int loco_session_join(loco_session **out, const loco_config *cfg, const loco_net_params *np,
                      const loco_island_info *me, const loco_island_progress *progress,
                      int *island_id, loco_quorum *q, int timeout_ms);
/* Ready for outer step `step` holding the committed θ_global of step
 * `have`: waits for GO (q = members and observers of the step) or JOIN (q =
 * the members to fetch from) or FINISHED. Survives a coordinator restart
 * (reconnects and re-registers); fails after timeout_ms without a
 * coordinator (a live one may take as long as it needs). */
int loco_session_ready(loco_session *s, int64_t step, int64_t have, loco_quorum *q,
                       loco_verdict *v, int timeout_ms);
/* The outcome of the step's exchange in `epoch`: ok with the island's
 * θ_global hash, or failed, suspecting the islands of mask `suspects`.
 * Waits for COMMIT, AGAIN or JOIN (q filled for JOIN). */
int loco_session_done(loco_session *s, int64_t step, uint64_t epoch, bool ok, uint64_t hash,
                      uint64_t suspects, loco_quorum *q, loco_verdict *v, int timeout_ms);
/* READY and DONE sent ahead of the wait for their answer (never blocks;
 * nothing when the link is down): the coordinator's round trip then
 * overlaps the island's work, and the next loco_session_ready or
 * loco_session_done of the same step (and epoch) only waits. */
void loco_session_ready_ahead(loco_session *s, int64_t step, int64_t have);
void loco_session_done_ahead(loco_session *s, int64_t step, uint64_t epoch, bool ok,
                             uint64_t hash, uint64_t suspects);
/* Whether the link to the coordinator is down now (found by a heartbeat
 * or a send; the next wait mends it): an exchange started by that
 * coordinator's GO can no longer be committed by it. Any thread. */
bool loco_session_broken(loco_session *s);
/* Records the committed state (for re-registration). */
void loco_session_progress(loco_session *s, const loco_island_progress *p);
/* Records progress; a thread of the session sends a heartbeat every
 * faulttol.heartbeat_ms from join to leave, whatever the island is doing. */
int loco_session_heartbeat(loco_session *s, int64_t inner_step);
/* Reads what the coordinator sent since (never blocks; reconnects when the
 * coordinator went away): an ERROR becomes LOCO_EPEER with its text. */
int loco_session_poll(loco_session *s);
/* Says BYE and waits for the coordinator's final word (its own BYE once
 * every member finished with agreeing hashes, or an ERROR: LOCO_EPEER).
 * LOCO_ETIMEDOUT when the coordinator stays silent or is gone. */
int loco_session_leave(loco_session *s, int timeout_ms);
void loco_session_destroy(loco_session *s);

/* ------------------------------------------------ phi-accrual detector */

/* Phi-accrual failure detector (Hayashibara et al. 2004, as in Akka and
 * Cassandra) over the inter-arrival times of one peer's heartbeats. phi is
 * -log10 of the probability that a heartbeat is still to come after the
 * silence observed so far, under a normal model of the recent intervals; a
 * threshold of 8 means one false suspicion in 1e8 under that model. The
 * caller owns the struct; every time is passed in (seconds on one clock,
 * e.g. loco_now()), so tests run on synthetic time. Not thread-safe. */
#define LOCO_PHI_MAX 1e300 /* phi saturates here instead of reaching inf */
/* Intervals the coordinator's detector models per island: at the default
 * 100 ms heartbeat, the last 100 s (Akka's default window), long enough to
 * learn a slow island's rhythm, short enough to follow a change of it. */
#define LOCO_PHI_WINDOW 1000

typedef struct {
    double *iv;        /* (window) recent intervals in ms, ring buffer */
    int window;        /* intervals kept */
    int n;             /* intervals held, <= window */
    int head;          /* slot the next interval goes to */
    double sum, sumsq; /* running sums over the n intervals held, ms, ms² */
    double min_std_ms; /* floor on the standard deviation */
    double pause_ms;   /* acceptable pause added to the mean */
    double first_ms;   /* prior mean before any interval is known */
    double start_s;    /* reference for "never heard from" */
    double last_s;     /* time of the last heartbeat, valid when beats > 0 */
    int64_t beats;     /* heartbeats recorded */
} loco_phi_detector;

/* Prepares d with room for `window` intervals (>= 2). min_std_ms and
 * acceptable_pause_ms must be >= 0, first_interval_ms > 0: it is the mean
 * assumed (with std first/4) until two heartbeats gave an interval.
 * LOCO_EINVAL on a bad argument, LOCO_ENOMEM when the ring cannot be
 * allocated. The "never heard from" clock starts at loco_now(); see
 * loco_phi_start for other time bases. Pair with loco_phi_fini. */
int loco_phi_init(loco_phi_detector *d, int window, double min_std_ms, double acceptable_pause_ms,
                  double first_interval_ms);
/* Frees the ring; d may be zero-filled or NULL. */
void loco_phi_fini(loco_phi_detector *d);
/* Sets the time the peer is expected from: silence before its first
 * heartbeat counts from here. */
void loco_phi_start(loco_phi_detector *d, double now_s);
/* Records a heartbeat arriving at now_s: O(1). A time before the last
 * heartbeat is ignored. */
void loco_phi_heartbeat(loco_phi_detector *d, double now_s);
/* Suspicion level now: >= 0, non-decreasing in now_s between heartbeats,
 * finite (at most LOCO_PHI_MAX) however long the silence. 0 before the
 * first heartbeat (loco_phi_suspect then relies on the hard timeout). */
double loco_phi(const loco_phi_detector *d, double now_s);
/* True when phi > threshold, or the peer has been silent for more than
 * timeout_s since its last heartbeat (since loco_phi_start when it never
 * sent one). timeout_s <= 0 disables the hard bound. */
bool loco_phi_suspect(const loco_phi_detector *d, double now_s, double threshold, double timeout_s);
/* Silence in seconds after the last heartbeat at which phi reaches
 * threshold (> 0), from the current estimate: the detection time without
 * the hard timeout, for reports. */
double loco_phi_detect_time(const loco_phi_detector *d, double threshold);
/* The model phi uses now: mean interval and standard deviation in ms
 * (prior before any interval; std after the min_std floor, pause excluded). */
void loco_phi_stats(const loco_phi_detector *d, double *mean_ms, double *std_ms);
/* Heartbeats recorded, and the time of the last one (valid when > 0). */
static inline int64_t loco_phi_beats(const loco_phi_detector *d) {
    return d->beats;
}
static inline double loco_phi_last(const loco_phi_detector *d) {
    return d->last_s;
}
/* Intervals in the window now (<= window). */
static inline int loco_phi_samples(const loco_phi_detector *d) {
    return d->n;
}

/* What the timeline says of the run's progress, read incrementally (the
 * caller zero-fills it and keeps it between calls). */
typedef struct {
    long offset;       /* bytes of the file read so far */
    int64_t committed; /* highest outer step committed */
    bool ended;        /* an end event was seen */
    bool finished;     /* ... with status finished */
} loco_run_progress;

/* ------------------------------------------------------ injected faults
 * The fault lab's [faults] (docs/FAULTS.md) that concern one island:
 * parsed once, then applied after each inner step (faulttol/inject.c). */
typedef struct {
    char site[LOCO_NET_NAME_MAX];
    int id;
    bool events;             /* this rank writes timeline events (rank 0) */
    int64_t kill_step;       /* SIGKILL itself on reaching it (0 = never) */
    int64_t freeze_step, freeze_ms; /* SIGSTOP itself there for that long */
    double slow;             /* each inner step takes this many times as long */
    int part_peer;           /* partition from this island, -1 = none */
    int64_t part_step, part_ms;
    double part_until;       /* loco_now() when it heals; 0 = not started */
    int link_peer;           /* link change towards this island, -1 = none */
    int64_t link_step;
    loco_wan link_wan;
    bool link_done;
    loco_link_faults frames; /* on every island-to-island link */
    int64_t thaw_commit;     /* faults.thaw_after_steps: thaw once this outer step committed */
    int64_t thaw_span;       /* and at least this many outer steps past the freeze's */
    int64_t heal_commit;     /* faults.heal_after_steps: heal once this outer step committed */
    loco_run_progress prog;  /* the run's progress, from the timeline (LOCO_EVENTS) */
    int64_t poison_step;     /* the first outer step at or after it sends Δ × poison_factor */
    float poison_factor;     /* NaN or Inf possible */
} loco_faults;

/* The faults of island `id` (site) in c's [faults]; LOCO_EINVAL naming the
 * key for a malformed spec. events: this rank records timeline events
 * (LOCO_EVENTS, set by `loco launch`). */
int loco_faults_parse(loco_faults *f, const loco_config *c, const char *site, int id,
                      bool events);
/* Whether the link to island `peer` is cut now (a partition timed by the
 * run reads its progress: f changes). */
bool loco_faults_partitioned(loco_faults *f, int peer);
/* Arms a (new) link to `peer` with the faults it carries now. */
void loco_faults_arm_link(loco_faults *f, int peer, loco_link *l);
/* After inner step `step` (which took step_s seconds): the faults due now
 * (kill, freeze, slow, partition and its healing, link change), applied to
 * this process and to the island's links (by island id, NULL where none);
 * q names the peers. */
void loco_faults_inject(loco_faults *f, int64_t step, double step_s, loco_link *const *links,
                        const loco_quorum *q);
/* Timeline events: an injected fault (peer may be NULL), a refused frame. */
void loco_faults_event(const loco_faults *f, const char *fault, const char *peer,
                       const char *detail);
void loco_faults_refused_event(const loco_faults *f, const char *reason);
/* faults.poison: the factor for the pseudo-gradient of the outer step that
 * inner step `step` ends (1 when none; then it is spent, recorded as an
 * event). */
float loco_faults_poison(loco_faults *f, int64_t step);

/* ------------------------------------------------------- fault cycles
 * The one table of fault kinds (faulttol/cycle.c, docs/FAULTS.md): each
 * injected fault has a cycle — injected, detected, recovered — read off
 * the run's timeline. */
#define LOCO_MAX_CYCLES 64

typedef struct cJSON cJSON;

/* Whether c's [faults] injects anything (every kind of the table). */
bool loco_faults_active(const loco_config *c);
/* The --set values that turn every fault off (the fault-free baseline):
 * at most cap into out; their count, or LOCO_EINVAL when cap is short. */
int loco_faults_clear_sets(const char **out, int cap);
/* The cycle of a fault kind in words ("SIGKILL → suspected → ..."); NULL
 * for a name that is not a kind. */
const char *loco_fault_cycle_words(const char *fault);
/* The faults c's [faults] plans, as a JSON array for the start event
 * (fault, site, peer, due, detect, recover); caller frees with free();
 * NULL when out of memory. */
char *loco_faults_plan_json(const loco_config *c);

/* One fault's cycle. Times are unix seconds, NAN where it did not happen. */
typedef struct {
    char fault[24];
    char site[LOCO_NET_NAME_MAX], peer[LOCO_NET_NAME_MAX];
    bool injected_ok; /* false: planned but never injected */
    bool complete;
    bool can_complete; /* incomplete, but what it waits for may still come */
    double injected, detected, action, recovered; /* action: restart, thaw, heal */
    char missing[200]; /* why it is not complete */
    char notes[400];
} loco_fault_cycle;

/* The cycles of a timeline (events sorted by time, as loco_events_load
 * gives them): one per injected fault (recovery actions belong to theirs)
 * and one per planned fault never injected (the start event's "planned").
 * At most cap; returns their count or LOCO_ENOMEM. */
int loco_fault_cycles(cJSON *const *ev, int nev, loco_fault_cycle *out, int cap);
/* Told of each line of a timeline that loco_events_load skips (line is
 * 1-based; why says what was wrong with it). */
typedef void (*loco_events_skip_fn)(void *arg, const char *path, int line, const char *why);
/* Reads a timeline (events.jsonl), the one reader of it: every object line
 * with a numeric "t" and a "kind", sorted by time, events of equal time in
 * file order (a fault and what it caused may share a timestamp). Other
 * lines (a torn last line, a stray one) are skipped, and told to skip
 * when it is not NULL. LOCO_EIO naming a missing file. Free with
 * loco_events_free. */
int loco_events_load(const char *path, cJSON ***ev, int *nev, loco_events_skip_fn skip,
                     void *arg);
void loco_events_free(cJSON **ev, int nev);
/* How many injected faults of the timeline at events_path have an open
 * cycle that can still complete (0 when there is no timeline); why gets
 * the first one's. */
int loco_fault_cycles_open(const char *events_path, char *why, size_t cap);

/* One line per cycle of the timeline at events_path on out ("faults:
 * kill siteC at 1.20 s: cycle complete" or "...: INCOMPLETE: why"); *open
 * gets the incomplete ones. Returns the number of cycles, or < 0 (a
 * missing timeline: LOCO_EIO). */
int loco_fault_cycles_print(const char *events_path, FILE *out, int *open);

void loco_run_progress_read(loco_run_progress *p, const char *events_path);
/* The outer step whose commit says the run reached inner step s (one every
 * outer.H / outer.fragments inner steps): what "after N steps" waits for. */
int64_t loco_faults_commit_at(const loco_config *c, int64_t s);

#endif /* LOCO_FAULTTOL_H */
