/* outer/ — DiLoCo and local SGD between islands, on the range of the flat
 * parameter buffer one rank owns. Every outer.H inner steps:
 *   Δ_k = θ_global − θ_local,k          (pseudo-gradient of island k)
 *   bytes_k = encode(Δ_k)               (compress/, error feedback per rank)
 *   avg = Σ_k (1/K) · decode(bytes_k)   in ascending island order, every
 *                                       island decoding exactly what was sent
 *   Nesterov: m = μ m + avg; θ_global −= lr (avg + μ m)
 *   (average: θ_global −= avg, i.e. the mean of the θ_local)
 *   θ_local ← θ_global
 * so every island ends with bit-identical θ_global. This module is the
 * algorithm; who carries the bytes (net/ links, or a test) is the caller's. */
#ifndef LOCO_OUTER_H
#define LOCO_OUTER_H

#include "compress/compress.h"
#include "core/core.h"
#include "faulttol/faulttol.h"
#include "net/net.h"

#include <signal.h>
#include <stdio.h>

typedef struct {
    int64_t H;
    bool nesterov; /* false: plain averaging (local SGD) */
    float lr, momentum;
    /* Contribution check (docs/FAULTS.md): a chunk whose norm is over this
     * many times the median of the other islands' norms of that chunk is
     * refused; 0 checks only for NaN and Inf. */
    float max_delta_ratio;
} loco_outer_params;

int loco_outer_params_from_config(loco_outer_params *p, const loco_config *cfg);

typedef struct loco_outer loco_outer;

/* Outer state for a range of n elements starting at theta0 (copied as the
 * first θ_global), with codec cp (cp->n_state is set to n here). */
int loco_outer_create(loco_outer **out, const loco_outer_params *p, const loco_codec_params *cp,
                      size_t n, const float *theta0);
void loco_outer_destroy(loco_outer *o); /* accepts NULL */

/* Computes and encodes this rank's pseudo-gradient for outer step `step`.
 * *bytes (valid until the next encode) holds the chunks back to back;
 * *raw_bytes is what fp32 would have taken. */
int loco_outer_encode(loco_outer *o, const float *theta_local, int64_t step, const void **bytes,
                      size_t *len, size_t *raw_bytes);
/* The same in chunks, for a pipeline: plan once per step, then encode chunk
 * by chunk (each lands in its own slot, valid until the next plan). */
int loco_outer_plan(loco_outer *o, const float *theta_local, int64_t step, size_t *n_chunks);
int loco_outer_encode_chunk(loco_outer *o, int worker, size_t chunk, const void **bytes,
                            size_t *len);
/* A redo of the step (new quorum epoch) sends the chunks encoded before,
 * unchanged (and encodes those not reached yet): same signature as
 * loco_outer_encode_chunk. */
int loco_outer_reuse_chunk(loco_outer *o, int worker, size_t chunk, const void **bytes,
                           size_t *len);
size_t loco_outer_planned_chunks(const loco_outer *o);
/* The current plan runs the zstd stage. */
bool loco_outer_planned_zstd(const loco_outer *o);
/* θ_global and momentum as they were before this outer step: save before
 * the first attempt, restore before a redo. */
void loco_outer_save(loco_outer *o);
void loco_outer_restore(loco_outer *o);
/* Replaces θ_global and momentum (n floats each): a rejoining island's
 * state from a live one, or a checkpoint's. */
void loco_outer_set_state(loco_outer *o, const float *theta, const float *mom);
/* Starts averaging K contributions. */
void loco_outer_begin_average(loco_outer *o, int n_islands);
/* Weights the K contributions of this average by the tokens each island
 * trained on since its last outer step (outer.weighting = tokens): weight
 * tokens_k / sum, the same float on every island. Equal counts (or NULL)
 * keep 1/K, bit for bit. Each count must be in [1, LOCO_OUTER_TOKENS_MAX]
 * (it came from a peer): LOCO_EPROTO otherwise, nothing changed. Call after
 * begin_average, before the first add. */
#define LOCO_OUTER_TOKENS_MAX 1e15
int loco_outer_set_weights(loco_outer *o, const double *tokens);
/* Contribution k's weight in the current average. */
float loco_outer_weight(const loco_outer *o, int island);
/* Adds one island's encoded pseudo-gradient with its weight (1/K); call in
 * ascending island order, the own contribution included (decoded from its
 * own bytes). Every chunk is checked (headers, lengths that tile the message
 * and cover the range exactly, checksums) before any is applied;
 * LOCO_EPROTO otherwise, and the caller restarts the average. */
int loco_outer_add(loco_outer *o, const void *bytes, size_t len);
/* Adds one encoded chunk from island `island` (its weight). Per chunk,
 * contributions must come in ascending island order, so the sum is the
 * same on every island whatever order the chunks arrive in; the chunk is
 * checked before it touches anything (LOCO_EPROTO). */
int loco_outer_add_chunk(loco_outer *o, int worker, int island, const void *bytes, size_t len);
/* When the last contribution of a chunk is added, the chunk is checked
 * before anything of it is applied: an island whose decoded values hold
 * NaN or Inf, or whose norm is an outlier (max_delta_ratio), is refused —
 * add_chunk (or rs_add, for a reducer's bytes) returns LOCO_EREFUSED and
 * this names the island (-1 when none was). Every island decodes the same
 * bytes, so every island refuses the same one. */
int loco_outer_refused(const loco_outer *o);
/* The largest ratio a check of this step found (0 before any). */
double loco_outer_delta_ratio(const loco_outer *o);
/* Fault lab (faults.poison): the pseudo-gradient sent at the next planned
 * step is the true one times factor (finite: the encoder refuses NaN and
 * Inf); the error feedback keeps the true one. */
void loco_outer_poison_next(loco_outer *o, float factor);
/* Applies the outer optimizer to one chunk's range as soon as it has all
 * its contributions (pipelining the update with the chunks still in
 * flight); loco_outer_apply then does the rest. */
int loco_outer_apply_chunk(loco_outer *o, size_t chunk, float *theta_local);
/* Reduce-scatter + all-gather: after the chunks this island reduces got
 * every contribution (add_chunk), rs_plan starts the second stage, which
 * re-encodes those averaged chunks (no error feedback) for everyone;
 * rs_add decodes each chunk once, from its reducer's bytes (own included),
 * and apply then uses those values. */
int loco_outer_rs_plan(loco_outer *o, int64_t step);
int loco_outer_rs_encode_chunk(loco_outer *o, int worker, size_t chunk, const void **bytes,
                               size_t *len);
int loco_outer_rs_add(loco_outer *o, int worker, size_t chunk, const void *bytes, size_t len);
/* Applies the outer optimizer after K contributions (whole, or every chunk
 * from every island) and writes θ_global into theta_local. */
int loco_outer_apply(loco_outer *o, float *theta_local);

size_t loco_outer_size(const loco_outer *o);
const float *loco_outer_theta(const loco_outer *o);
/* Momentum buffer (n), for checkpoints and state transfer. */
float *loco_outer_momentum(loco_outer *o);
/* XXH3 of θ_global: islands compare it after each outer step. */
uint64_t loco_outer_hash(const loco_outer *o);
/* The codec (its error-feedback state belongs to the rank). */
loco_codec *loco_outer_codec(loco_outer *o);

/* Device mode (docs/DECISIONS.md "Outer loop on the device"): with the
 * island training on a GPU, θ_global, the momentum (and their double
 * buffers), the average and the error feedback of the range live on the
 * device; theta0_dev and every theta_local given to loco_outer_plan,
 * loco_outer_apply_chunk and loco_outer_apply are device pointers (the
 * trainer's owned range). Δ is computed and quantized there
 * (loco_cuda_quant), only the payload bytes come to the host for zstd and
 * the wire; received payloads go to the device to be dequantize-accumulated
 * (loco_cuda_dequant_acc), checked (loco_cuda_share_sumsq) and applied
 * (loco_cuda_outer_update), with the host path's bits. The chunked API
 * (plan, encode_chunk, reuse_chunk, add_chunk, apply_chunk, apply) only:
 * the whole-range encode / add and reduce-scatter give LOCO_EINVAL. The
 * host copies of θ_global, momentum and EF are refreshed when read
 * (loco_outer_theta, _momentum, _hash, set_read, save_file) and pushed
 * when written (set_state, load_file). LOCO_EINVAL in a build without
 * CUDA. */
int loco_outer_create_device(loco_outer **out, const loco_outer_params *p,
                             const loco_codec_params *cp, size_t n, const float *theta0_dev);
bool loco_outer_on_device(const loco_outer *o);
/* Bytes this state copied between host and device (both ways) since the
 * last call; resets the count. */
uint64_t loco_outer_take_pcie_bytes(loco_outer *o);

/* The outer state of a rank: one loco_outer per streaming fragment (one
 * without streaming), in fragment order. State transfer and checkpoints
 * see the fragments' θ_global and momentum back to back. */
typedef struct {
    loco_outer **o; /* (n) */
    int n;
} loco_outer_set;
size_t loco_outer_set_size(const loco_outer_set *s);
/* One fragment: loco_outer_hash; more: the hash of the fragments' hashes. */
uint64_t loco_outer_set_hash(const loco_outer_set *s);
void loco_outer_set_read(const loco_outer_set *s, float *theta, float *mom);
void loco_outer_set_write(const loco_outer_set *s, const float *theta, const float *mom);

/* What an outer-state file records besides the tensors. */
typedef struct {
    int64_t committed;  /* outer step of θ_global */
    uint64_t epoch;
    int64_t inner_step; /* of the inner checkpoint it goes with */
    /* An overlapped exchange that committed but whose merge into θ_local
     * is still due at inner step merge_step (-1: none). */
    int merge_fragment;
    int64_t merge_step;
} loco_outer_meta;

/* The outer state of this rank in a safetensors file: θ_global, momentum
 * and error feedback, with the meta as metadata (fsynced; the caller
 * publishes atomically). Loading checks sizes, the fragment count and the
 * hash (LOCO_EPROTO / LOCO_EINVAL) before touching s. */
int loco_outer_save_file(const loco_outer_set *s, const char *path, const loco_outer_meta *m);
int loco_outer_load_file(const loco_outer_set *s, const char *path, loco_outer_meta *m);

/* --------------------------------------------------------- the exchange */

#define LOCO_MAX_PEERS 64
#define LOCO_EXCHANGE_POLL_MS 200 /* how often a wait on a peer checks `cancelled` */

/* Where this rank's outer step exchanges: links to the same rank of every
 * other island of the quorum, indexed by island id. */
typedef struct {
    int n_islands, me;   /* island ids: 0 .. n_islands-1 */
    loco_link **peers;   /* (n_islands), NULL at me */
    uint64_t epoch;      /* quorum epoch; frames of another are refused */
    uint32_t shard;      /* this rank's index in its island */
    size_t max_frame;    /* payload bytes per PSEUDOGRAD frame */
    int timeout_ms;      /* a peer silent this long fails the step */
    /* Optional: true once the attempt can no longer count (the coordinator
     * that started it is gone): the waits on peers then end within
     * LOCO_EXCHANGE_POLL_MS instead of timeout_ms. */
    bool (*cancelled)(void *ctx);
    void *cancel_ctx;
    /* This rank's current estimate of the links, sent to every peer ahead
     * of the chunks (0 = none): the algorithm choice of later steps. */
    double est_rtt_s, est_bytes_per_s;
    /* Tokens this island trained on since its last outer step, sent with
     * the estimate to every peer and observer: the weights of the average
     * (loco_outer_set_weights). 0: uniform weights (outer.weighting). */
    double tokens;
    /* A redo of this step in a new epoch: θ_global and momentum go back to
     * where they were and the chunks already encoded are sent again. */
    bool redo;
    /* Islands that join at this step: they receive every contribution
     * (all-gather only) and send none. An observer itself has me = -1 and
     * peers = the n_islands contributors. */
    loco_link **observers;
    int n_observers;
} loco_exchange;

typedef struct {
    size_t raw_bytes;      /* fp32 bytes of the pseudo-gradient shard */
    size_t encoded_bytes;  /* what the codec made of them */
    size_t bytes_sent;     /* payload bytes sent to all peers */
    size_t bytes_received; /* payload bytes received from all peers */
    double encode_s, exchange_s, apply_s;
    /* Pipelined exchanges: seconds the sender spent encoding (overlapped
     * with the transfer), and whether the chunks went through zstd. */
    double sender_encode_s;
    bool zstd;
    /* Estimates agreed with every peer: the largest RTT and smallest
     * bandwidth among this rank's and the peers' (identical on every island
     * for this rank index). */
    double agreed_rtt_s, agreed_bytes_per_s;
    /* The largest ratio of an island's chunk norm to the median of the
     * others' that this rank saw (what outer.max_delta_ratio bounds). */
    double delta_ratio;
    int failed_peer; /* on failure: the contributor index whose link failed, else -1 */
} loco_exchange_stats;

/* One outer step by all-gather of encoded shards: encode, send the bytes to
 * every peer (in frames of at most max_frame), receive every peer's, average
 * in ascending island order (own contribution from its own bytes), apply,
 * and write θ_global into theta_local. A frame of another epoch, step or
 * shard, or a malformed one, fails the step with LOCO_EPROTO; nothing is
 * applied then. */
int loco_outer_step_allgather(loco_outer *o, const loco_exchange *x, float *theta_local,
                              int64_t step, loco_exchange_stats *st);

/* The same step by reduce-scatter + all-gather: two rounds, each island
 * reduces 1/K of the chunks (from every island, in island order), then
 * re-encodes its averaged chunks once more (no error feedback) for all:
 * 2(K-1)/K of the shard leaves each island instead of K-1 shards. */
int loco_outer_step_rsag(loco_outer *o, const loco_exchange *x, float *theta_local,
                         int64_t step, loco_exchange_stats *st);

typedef enum { LOCO_EXCHANGE_ALLGATHER = 0, LOCO_EXCHANGE_RSAG = 1 } loco_exchange_algo;

/* Picks the faster algorithm from the island count, the codec chunks and
 * encoded size of a shard, and the link's RTT and bandwidth; *why receives
 * the estimate of both. */
loco_exchange_algo loco_exchange_choose(int n_islands, size_t n_chunks, double encoded_bytes,
                                        double rtt_s, double bytes_per_s, char *why,
                                        size_t why_cap);

/* Measures the links at start: an empty and a probe_bytes ping-pong with
 * every peer (pairs in one global order), then agrees with the peers on the
 * largest round trip and the smallest bandwidth seen, so every island of
 * this rank index gets the same figures (INFINITY bandwidth when the probe
 * could not tell). Islands whose x->peers entry is NULL (not in the
 * quorum) are left out. A peer silent for x->timeout_ms, or a link that
 * fails, is an error: the caller falls back to a default (it must never
 * end the island). */
int loco_exchange_probe(const loco_exchange *x, size_t probe_bytes, double *rtt_s,
                        double *bytes_per_s);

/* ------------------------------------------- peer links, state transfer */

/* One rank's peer service: a listener for the links of the same rank of
 * the other islands and for state requests, served from a thread. Links
 * belong to one quorum epoch (LINK frame first); the lower island id
 * connects. State requests get the committed θ_global and momentum of o,
 * losslessly encoded (fp32 + zstd) in chunks, from any chunk on. */
typedef struct loco_peers loco_peers;

int loco_peers_create(loco_peers **out, const loco_net_params *np, const char *host,
                      const loco_outer_set *o, int timeout_ms);
void loco_peers_destroy(loco_peers *p); /* accepts NULL */
int loco_peers_port(const loco_peers *p);
/* Encoded state bytes this rank has served to rejoining islands. */
uint64_t loco_peers_served_bytes(loco_peers *p);
/* The link to island `id` (certificate `site`, listener `addr`) for
 * `epoch`: connects when me < id, else waits up to timeout_ms for id's. */
int loco_peers_link(loco_peers *p, int me, int id, const char *site, const char *addr,
                    uint64_t epoch, loco_link **out, int timeout_ms);
/* A commit: the state requests get from now on is a snapshot of the
 * current θ_global and momentum, of outer step `committed` (inner step
 * `inner_step`). Transfers are served from it, never from the live state. */
void loco_peers_publish(loco_peers *p, int64_t committed, int64_t inner_step);

typedef struct {
    double seconds;   /* request to last chunk, connection set-up included */
    double stream_s;  /* first chunk header to last chunk: the data phase */
    uint64_t bytes;  /* encoded payload bytes received */
    int donors_tried;
    size_t chunks, resumed_from; /* the state's chunks; where the last donor started */
} loco_state_stats;

/* The messages of a state transfer (docs/PROTOCOL.md), parsed from
 * untrusted bytes: LOCO_EPROTO on anything malformed. */
typedef struct {
    int64_t outer_step, inner_step;
    size_t n, chunks; /* elements per tensor; chunks of θ_global ‖ momentum */
    uint64_t hash;    /* of θ_global */
} loco_state_meta;
int loco_state_request_parse(const void *payload, size_t len, int64_t *outer_step,
                             size_t *from);
int loco_state_meta_parse(const void *payload, size_t len, loco_state_meta *m);
/* The lossless codec state chunks use (fp32 + zstd), for 2n elements. */
int loco_state_codec_create(loco_codec **out, size_t n);

/* Fetches the newest committed θ_global and momentum into o from the
 * first donor that answers (same rank of another island), going on from
 * the chunk reached with the next donor when one fails (from scratch when
 * that one has moved on to a newer step); checks the donor's hash.
 * *outer_step receives the step of the state, *inner_step the donor's
 * inner step. LOCO_EPEER when no donor could finish. The caller checks the
 * island's hash against the coordinator's before contributing. */
int loco_state_fetch(const loco_net_params *np, int n_donors,
                     const char (*sites)[LOCO_NET_NAME_MAX], const char (*addrs)[LOCO_ADDR_MAX],
                     int64_t *outer_step, const loco_outer_set *o, int64_t *inner_step,
                     loco_state_stats *st, int timeout_ms);

/* ------------------------------------------------ the island's outer loop */

struct loco_comm;

/* What the outer loop sees of the island's training (inner/ behind it):
 * the flat parameter buffer this rank owns, the table that describes it,
 * and the step counter. */
typedef struct {
    void *ctx;
    /* [*lo, *hi) of the flat buffer and its values (NULL on error). */
    float *(*owned)(void *ctx, size_t *lo, size_t *hi);
    const loco_ttable *(*table)(void *ctx);
    /* After the owned range was rewritten: every rank of the island sees
     * it (a collective over the island). */
    int (*sync)(void *ctx);
    void (*set_step)(void *ctx, int64_t step);
    /* Optional: where the learning-rate schedule stands (outer.sync = time:
     * the run's progress, in train.steps' units). */
    void (*set_schedule)(void *ctx, int64_t step);
    int64_t (*steps_done)(void *ctx);
    /* Optional (NULL: the island runs the host path). The owned range on
     * the device (NULL when training on the host); after the outer step
     * wrote it there, in place of sync: the host copy goes stale. */
    float *(*device_owned)(void *ctx, size_t *lo, size_t *hi);
    int (*device_written)(void *ctx);
    /* Bytes the trainer moved across PCIe since the last call (0 on the
     * host), for outer.jsonl's pcie_bytes. */
    uint64_t (*take_pcie_bytes)(void *ctx);
    /* Needed with outer.layout = whole: the whole model's table (tp = 1,
     * no stage, every expert) into *whole and each owned element's index
     * in it (-1: vocabulary padding) into idx[0 .. hi-lo). */
    int (*whole_layout)(void *ctx, loco_ttable *whole, int64_t *idx);
} loco_inner_view;

/* Whether the island's outer state lives on the device
 * (loco_outer_create_device): only with train.device = cuda, one rank per
 * island, one fragment without overlap or merge_alpha (θ_local updated in
 * place), outer.algorithm = allgather, and a CUDA build; otherwise the
 * host path. why (cap bytes) receives the reason either way. */
bool loco_island_outer_on_device(const loco_config *c, int ranks, char *why, size_t cap);

/* One island's side of a multi-site run, on one rank: joining through the
 * coordinator, DiLoCo's outer steps or Streaming DiLoCo's fragment syncs
 * (outer.fragments, outer.overlap, outer.merge_alpha; docs/STREAMING.md),
 * attempts and redos in new quorum epochs, rejoin by state transfer,
 * the exchange algorithm's choice, outer-state checkpoints and the fault
 * lab's injections ([faults]). Every rank of the island calls it alike. */
typedef struct loco_island loco_island;

/* Registers with the coordinator and joins the run (or rejoins it when it
 * is under way); `resumed`: the trainer continued from a checkpoint, whose
 * outer state is loaded from run.dir when whole. */
int loco_island_create(loco_island **out, const loco_config *cfg, const char *site,
                       struct loco_comm *world, const loco_inner_view *inner, bool resumed);
/* After inner step `step` (which took step_s): injected faults, the
 * coordinator's news, and the outer step, fragment sync or merge due. */
int loco_island_after_step(loco_island *is, int64_t step, double step_s);
/* The run ended while this island was in an outer step. */
bool loco_island_finished(const loco_island *is);
/* The run's last inner step: train.steps, or later once the coordinator
 * held the end for a fault's open cycle (faults.max_extra_steps). */
int64_t loco_island_end_step(const loco_island *is);
/* The outer state next to the inner checkpoint of `step`. */
int loco_island_save(loco_island *is, int64_t step);
/* Tells the coordinator this island is done and waits for its word that
 * every island's θ_global agreed. */
int loco_island_leave(loco_island *is);
void loco_island_destroy(loco_island *is); /* accepts NULL */
/* Adds the island's outer metrics (outer step, epoch, bytes on the wire,
 * delta ratio: docs/METRICS.md) to a live metrics registry, set at each
 * committed outer step; p is the trainer's (loco_trainer_prom), NULL = off.
 * p must outlive is. */
int loco_island_set_prom(loco_island *is, loco_prom *p);

/* ---------------------------------------------------- streaming fragments */

/* Streaming DiLoCo (Douillard et al. 2025) exchanges one fragment of the
 * parameters per outer step, so the traffic spreads over the inner steps.
 * Fragments are transformer blocks strided through depth (block l in
 * fragment l % F): each fragment spans the whole depth (the paper found
 * strided better than sequential), and a pipeline stage of at least F
 * blocks holds some of every fragment. wte and wpe (also the tied head's
 * copy of wte) are fragment 0; ln_f and any other tensor after the last
 * block go with the last block, (n_layer - 1) % F; any other tensor
 * without a block index is fragment 0. */
#define LOCO_MAX_FRAGMENTS 64

typedef struct {
    size_t lo, len; /* elements, in owned-range coordinates (0 = the first owned element) */
    size_t packed;  /* where they start in their fragment's packed vector */
    int frag;
} loco_frag_interval;

typedef struct {
    int F;
    size_t n;                       /* owned elements (hi - lo) */
    size_t n_f[LOCO_MAX_FRAGMENTS]; /* owned elements of each fragment (may be 0, e.g. a
                                     * pipeline stage without that fragment's blocks) */
    int n_iv;
    loco_frag_interval *iv;         /* (n_iv) ascending lo, adjacent intervals of one
                                     * fragment coalesced */
} loco_fragments;

/* F fragments of the owned range [lo, hi) of the buffer tt describes, for a
 * model of n_layer blocks (F = 1: one interval [0, n), whatever the names).
 * LOCO_EINVAL when F < 1, F > LOCO_MAX_FRAGMENTS or F > n_layer, when
 * [lo, hi) is not inside tt, or a block index is not below n_layer. The
 * caller frees with loco_fragments_fini; fr is zeroed on failure. */
int loco_fragments_plan(loco_fragments *fr, int F, int n_layer, const loco_ttable *tt, size_t lo,
                        size_t hi);
void loco_fragments_fini(loco_fragments *fr); /* accepts zeroed */
/* The fragment of a tensor by name (as loco_fragments_plan assigns it, an
 * unknown name after the last block aside), or LOCO_EINVAL as plan. */
int loco_fragment_of(const char *tensor_name, int F, int n_layer);
/* packed (n_f[f]) <- the elements of fragment f of own (the owned range):
 * what one outer step of fragment f sends. */
void loco_fragments_gather(const loco_fragments *fr, int f, const float *own, float *packed);
/* own <- alpha own + (1 - alpha) packed on fragment f (the paper's mixing of
 * the received global fragment into the local one); alpha == 0 copies
 * exactly (bit for bit, -0.0 included). */
void loco_fragments_merge(const loco_fragments *fr, int f, const float *packed, float *own,
                          float alpha);
/* True when fragment f is one interval (*lo = its start) or empty (*lo =
 * 0): the caller may then work in place on own + *lo, without packing. */
bool loco_fragments_contiguous(const loco_fragments *fr, int f, size_t *lo);

#endif /* LOCO_OUTER_H */
