/* faulttol/ — what keeps a multi-site run together: the coordinator
 * (registration, ids, quorum epochs, heartbeats and the bitwise-agreement
 * check of θ_global) and the island side of that protocol. Messages are
 * net/ frames whose payloads are small JSON objects; docs/PROTOCOL.md lists
 * them. This version stops the run when an island fails; surviving failures
 * comes with the fault-tolerance issue. */
#ifndef LOCO_FAULTTOL_H
#define LOCO_FAULTTOL_H

#include "core/core.h"
#include "net/net.h"

#define LOCO_MAX_ISLANDS 64
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
    int n_ranks;
    char (*addrs)[LOCO_ADDR_MAX]; /* (n_ranks) "host:port" of each rank's peer listener */
} loco_member;

typedef struct {
    uint64_t epoch;
    int n;
    loco_member m[LOCO_MAX_ISLANDS]; /* by id */
} loco_quorum;

void loco_quorum_fini(loco_quorum *q);
/* JSON form, as QUORUM frames carry it (caller frees with free()). */
char *loco_quorum_to_json(const loco_quorum *q);
int loco_quorum_from_json(loco_quorum *q, const char *json, size_t len);

/* ----------------------------------------------------------- coordinator */

typedef struct loco_coord loco_coord;

/* Listens on faulttol.coordinator (or host:port when given: port 0 picks
 * one) for the islands of outer.sites. */
int loco_coord_create(loco_coord **out, const loco_config *cfg, const loco_net_params *np,
                      const char *host, int port);
int loco_coord_port(const loco_coord *c);
/* Serves until every island said BYE (0) or the run must stop: an island
 * with another mesh or model is refused (it gets an ERROR, the others go
 * on waiting); θ_global hashes that differ at an outer step, or an island
 * lost before BYE, stop the run (ERROR to everyone, LOCO_EPEER here). */
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

/* Connects to the coordinator, registers and waits (up to timeout_ms) for
 * the first quorum. A refusal is LOCO_EPEER with the coordinator's reason. */
int loco_session_join(loco_session **out, const loco_config *cfg, const loco_net_params *np,
                      const loco_island_info *me, int *island_id, loco_quorum *q,
                      int timeout_ms);
/* Sends a heartbeat; with outer_step >= 1 it carries that step's θ_global
 * hash. */
int loco_session_heartbeat(loco_session *s, int64_t inner_step, int64_t outer_step,
                           uint64_t hash);
/* Reads what the coordinator sent since (never blocks): an ERROR becomes
 * LOCO_EPEER with its text. */
int loco_session_poll(loco_session *s);
/* Says BYE and waits for the coordinator's final word (its own BYE once
 * every island finished with agreeing hashes, or an ERROR). */
int loco_session_leave(loco_session *s, int timeout_ms);
void loco_session_destroy(loco_session *s);

#endif /* LOCO_FAULTTOL_H */
