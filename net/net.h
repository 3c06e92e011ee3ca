/* net/ — links between islands: TLS 1.3 with mutual authentication
 * (OpenSSL 3), framed messages with a fixed checksummed header and a hard
 * size limit, several TCP streams per link with socket buffers sized to the
 * bandwidth-delay product, WAN emulation (delay, jitter, bandwidth cap) and
 * fault-injection hooks in the sender path. docs/NET.md has the byte table,
 * the handshake and the limits.
 *
 * A link is one logical, ordered, reliable channel of frames between two
 * processes. Under it are `streams` TCP connections (each with its own TLS
 * session); frame number s of a link travels on stream s % streams and the
 * receiver hands frames out in the order they were sent. Every link has one
 * sender thread and one reader thread per stream: loco_link_send only
 * enqueues, so the caller compresses the next chunk while earlier ones are on
 * the wire, and the reader threads decrypt and verify while the caller
 * decodes.
 *
 * Nothing from the wire is trusted: every header field is checked before
 * anything is allocated, every payload checksum before it is handed out. A
 * frame that fails a check is refused with a logged reason, the link is
 * dropped (LOCO_EPROTO for the caller) and the process goes on. */
#ifndef LOCO_NET_H
#define LOCO_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

/* --------------------------------------------------------------- frames */

#define LOCO_FRAME_MAGIC 0x46434f4cU /* "LOCF" as little-endian bytes */
#define LOCO_FRAME_VERSION 1
#define LOCO_FRAME_HEADER_BYTES 96
/* Ceiling of any configured payload limit (net.max_frame_mb's range). */
#define LOCO_FRAME_PAYLOAD_CEILING ((uint64_t)4096 << 20)

/* Frame types. New types go before LOCO_FRAME_TYPE_END; numbers never
 * change once released (they are on the wire). 0 is never valid. */
typedef enum {
    LOCO_FRAME_HELLO = 1,      /* link handshake, one per stream (net/ only) */
    LOCO_FRAME_REGISTER = 2,   /* island -> coordinator: join the run */
    LOCO_FRAME_QUORUM = 3,     /* coordinator -> islands: members of an epoch */
    LOCO_FRAME_HEARTBEAT = 4,  /* liveness, with a hash of θ_global */
    LOCO_FRAME_PSEUDOGRAD = 5, /* one compressed chunk of a pseudo-gradient */
    LOCO_FRAME_STATE = 6,      /* state transfer to a rejoining island */
    LOCO_FRAME_ACK = 7,
    LOCO_FRAME_ERROR = 8, /* the sender refuses something; payload is text */
    LOCO_FRAME_BYE = 9,   /* orderly leave */
    LOCO_FRAME_OUTER = 10,     /* island -> coordinator: ready for / done with an outer step */
    LOCO_FRAME_COMMIT = 11,    /* coordinator -> islands: an outer step every member agreed on */
    LOCO_FRAME_STATE_REQ = 12, /* rejoining island -> live island: send θ_global from chunk k */
    LOCO_FRAME_LINK = 13,      /* first frame of an island-to-island link: who and which start */
    LOCO_FRAME_TYPE_END
} loco_frame_type;

/* A frame header in host form. The link owns `seq`, `payload_len` and
 * `payload_hash` on send (whatever the caller puts there is replaced) and
 * fills `run_id` from loco_net_params.run_id when the caller leaves it 0. The
 * other fields belong to the caller; net/ checks only that `flags` is 0 and
 * that chunk < n_chunks when n_chunks is not 0. */
typedef struct {
    uint16_t type;         /* loco_frame_type */
    uint16_t flags;        /* reserved, 0 in version 1 */
    uint16_t codec;        /* the caller's (compress/ codec of the payload) */
    uint32_t shard;        /* owned range (rank) the payload belongs to */
    uint64_t run_id;       /* frames of another run are refused */
    uint64_t epoch;        /* quorum epoch */
    uint64_t step;         /* outer step */
    uint32_t chunk;        /* chunk index within the message */
    uint32_t n_chunks;     /* chunks in the message, 0 = not chunked */
    uint64_t seq;          /* link sequence number, from 0 per link */
    uint64_t payload_len;  /* bytes after the header */
    uint64_t raw_len;      /* the caller's: bytes the payload decodes to */
    uint64_t payload_hash; /* XXH3-64 of the payload */
} loco_frame_hdr;

/* Packs h into exactly LOCO_FRAME_HEADER_BYTES little-endian bytes, with the
 * header checksum. Refuses (LOCO_EINVAL, out untouched) an unknown type,
 * nonzero flags, chunk >= n_chunks, or payload_len > max_payload. The caller
 * sets payload_hash (loco_frame_hash_payload). */
int loco_frame_encode_header(uint8_t out[LOCO_FRAME_HEADER_BYTES], const loco_frame_hdr *h,
                             uint64_t max_payload);

/* Parses len untrusted bytes (only the first LOCO_FRAME_HEADER_BYTES are
 * read; fewer is LOCO_EPROTO "truncated"). Checks, in order: magic, version,
 * header checksum, type, flags and reserved bytes, chunk < n_chunks,
 * payload_len <= max_payload. LOCO_EPROTO with the reason on the first
 * failure; h is written only on success. Never reads past buf + len and
 * never allocates, so a length is checked before anyone allocates for it. */
int loco_frame_parse_header(loco_frame_hdr *h, const void *buf, size_t len, uint64_t max_payload);

/* XXH3-64 of a payload (what payload_hash holds). */
uint64_t loco_frame_hash_payload(const void *payload, size_t len);

/* Checks a received payload against its header: len == payload_len and the
 * checksum matches. LOCO_EPROTO with the reason otherwise. */
int loco_frame_verify_payload(const loco_frame_hdr *h, const void *payload, size_t len);

/* "HELLO", "PSEUDOGRAD", ...; "?" for anything unknown. */
const char *loco_frame_type_name(int type);

/* ----------------------------------------------------------- parameters */

#define LOCO_NET_NAME_MAX 64 /* site names and certificate CNs, with the NUL */
/* Run ids in certificates: 1-63 characters of [A-Za-z0-9._-], and the NUL. */
#define LOCO_NET_RUN_ID_MAX 64
#define LOCO_NET_MAX_STREAMS 64
#define LOCO_NET_MAX_PENDING 256 /* ceiling of net.max_pending */

typedef enum {
    LOCO_NET_TLS = 0,   /* TLS 1.3, both sides present and verify certificates */
    LOCO_NET_PLAIN = 1, /* plain TCP: tests and measuring what TLS costs */
} loco_net_backend;

/* WAN emulation on the sender side of one link end. Every frame is held for
 * delay_ms plus a jitter drawn uniformly from [-jitter_ms, +jitter_ms]
 * (never below 0, and never earlier than the previous frame of its stream, so
 * nothing is reordered), then written no faster than gbps (one token bucket
 * for all streams of the link; 0 = no cap). Both ends of a link emulate their
 * own direction: a round trip pays two delays. */
typedef struct {
    double delay_ms;
    double jitter_ms;
    double gbps;
    uint64_t seed; /* of the jitter draws */
} loco_wan;

/* Faults injected on send, drawn per frame from a seeded RNG in the order
 * frames are sent (so a seed replays the same faults). A dropped frame never
 * leaves (and takes no sequence number: the receiver sees nothing, not a
 * gap); a duplicated one is sent twice; a corrupted one has one byte (header
 * or payload) flipped after its checksums were computed, so the receiver
 * refuses it and drops the link; a delayed one is held delay_ms longer (and
 * with it the frames behind it on its stream). */
typedef struct {
    double drop; /* probabilities in [0, 1] */
    double corrupt;
    double duplicate;
    double delay;
    double delay_ms; /* extra hold of a delayed frame */
    uint32_t types;  /* bit t set: frames of type t are subject; 0 = every type */
    uint64_t seed;
} loco_link_faults;

/* Everything a listener or a connecting side needs. Plain data: copy it,
 * change a field, pass it again. Strings are paths or names ("" = unset). */
typedef struct {
    loco_net_backend backend;
    char cert[LOCO_PATH_MAX];            /* our certificate (PEM, may hold the chain) */
    char key[LOCO_PATH_MAX];             /* its private key (PEM) */
    char ca[LOCO_PATH_MAX];              /* the run's CA: peers must chain to it */
    char name[LOCO_NET_NAME_MAX];        /* our name in HELLO (plain peers know us by it) */
    char expect_peer[LOCO_NET_NAME_MAX]; /* connect: refuse any other peer name ("" = any) */
    /* TLS: the run id (net.run_id) peer certificates must carry ("" = not checked). */
    char cert_run_id[LOCO_NET_RUN_ID_MAX];
    char crl[LOCO_PATH_MAX];    /* TLS: CRLs of the CA (PEM); peers listed are refused */
    uint64_t run_id;            /* frames: 0 = not checked; else HELLO and every frame must
                                   match (a number; cert_run_id is the certificates' text) */
    uint64_t max_frame_bytes;   /* payload limit per frame, both directions */
    uint64_t recv_max_bytes;    /* tighter limit on frames received (0 = max_frame_bytes);
                                   HELLO tells the peer, which sends nothing larger */
    uint64_t link_buffer_bytes; /* received payload a link holds at once, frames being
                                   read included (0 = 4 x the receive limit; at least
                                   the receive limit) */
    int streams;                /* TCP connections per link (connect decides) */
    int max_streams;            /* listener: links of more streams (and more than
                                   `streams`) are refused */
    int max_pending;            /* listener: links in handshake, and links waiting for
                                   accept, each at most this many (1..LOCO_NET_MAX_PENDING) */
    int queue_frames;           /* frames queued per stream, each way */
    double link_gbps;           /* expected path bandwidth, for socket buffers */
    double rtt_ms;              /* expected path round trip, for socket buffers */
    int sndbuf, rcvbuf;         /* bytes per stream; 0 = BDP / streams, or kernel
                                   autotuning when link_gbps or rtt_ms is 0 */
    int connect_timeout_ms;     /* TCP + TLS + HELLO on every stream */
    int handshake_timeout_ms;   /* listener: a connection or link must complete by then */
    int io_timeout_ms;          /* a write or a started frame making no progress */
    int linger_ms;              /* close: wait this long for the peer's end */
    loco_wan wan;
    loco_link_faults faults;
} loco_net_params;

/* Defaults: the [net] keys of core/config_keys.h (TLS, no files, 64 MiB
 * frames, 4 streams, ...), seeds 0, no faults. */
void loco_net_params_default(loco_net_params *p);
/* Fills p from the [net] section (seeds from train.seed). Per-pair WAN
 * settings are not keys yet: set them per link with loco_link_set_wan once
 * the peer's name is known. LOCO_EINVAL, naming the file and the date or
 * both run ids, when our own certificate (net.cert) is not valid yet, not
 * valid any more, or does not carry net.run_id: a process refuses to start
 * with it. */
int loco_net_params_from_config(loco_net_params *p, const loco_config *cfg);
/* LOCO_EINVAL with the reason when a field is out of range, cert_run_id is
 * not a run id, or, for TLS, a file (ca, cert, key, crl) is missing. A
 * connecting side may leave cert and key empty (it then presents no
 * certificate, which a loco listener refuses). */
int loco_net_params_check(const loco_net_params *p, bool server);

/* ---------------------------------------------------------- certificates */

/* Writes a run's PKI into out_dir (created if missing): ca.pem and ca.key
 * (ECDSA P-256, self-signed, CA:TRUE), then for every name NAME.pem and
 * NAME.key (P-256, signed by the CA, CN and DNS SAN = NAME, usable as TLS
 * client and server). Keys are written 0600, certificates 0644, each to a
 * temporary name and renamed. An existing ca.pem + ca.key pair is reused, so
 * sites can be added to a run later; NAME files are replaced. Names are 1-63
 * characters of [A-Za-z0-9._-] and not "ca". days: validity, 1..36500.
 * LOCO_EINVAL for bad names or days, LOCO_EIO for files, LOCO_EAUTH when an
 * existing CA key does not match its certificate. */
int loco_net_make_certs(const char *out_dir, const char *const *names, int n_names, int days);
/* Same, and binds run_id into every site certificate it issues (a
 * subjectAltName URI "loco-run:RUN_ID", signed with the rest) and writes it
 * to out_dir/run_id. run_id NULL or "" = none (loco_net_make_certs). A
 * listener or connecting side with cert_run_id set refuses peers whose
 * certificate carries another run id or none. LOCO_EINVAL for a run id
 * that is not 1-63 characters of [A-Za-z0-9._-]. */
int loco_net_make_certs_run(const char *out_dir, const char *const *names, int n_names, int days,
                            const char *run_id);
/* A new random run id (16 hex digits, 64 bits from OpenSSL's CSPRNG) into
 * out. LOCO_EIO when the generator fails. */
int loco_net_new_run_id(char out[LOCO_NET_RUN_ID_MAX]);
/* The run id dir/run_id holds (written by loco_net_make_certs_run): 1 and
 * id filled, 0 when there is no such file, LOCO_EINVAL for one that holds
 * no valid run id. */
int loco_net_certs_run_id(const char *dir, char id[LOCO_NET_RUN_ID_MAX]);
/* 0 when id is a valid run id, else LOCO_EINVAL with the reason. */
int loco_net_run_id_check(const char *id);
/* The run id of the certificates made in dir, by precedence: opt (the
 * command line's, NULL = none), else cfg_id (net.run_id, NULL or "" =
 * none), else the one dir/run_id holds (the run the CA in dir serves), else
 * a new random one; *from names which ("from --run-id", "from net.run_id",
 * "kept from DIR/run_id", "new, random"). LOCO_EINVAL for an opt or cfg_id
 * that is no valid run id, or a dir/run_id that holds none. */
int loco_net_pick_run_id(char id[LOCO_NET_RUN_ID_MAX], const char **from, const char *opt,
                         const char *cfg_id, const char *dir);
/* Revokes the current certificates dir/NAME.pem of names: adds their serial
 * numbers to dir/crl.pem (created, or extended after checking it was signed
 * by dir/ca.pem), signed by dir/ca.key, valid until the CA expires. Point
 * net.crl at it. *n_revoked (may be NULL) = entries in the list after.
 * LOCO_EINVAL when the CA, a certificate or an existing CRL is missing or
 * not the CA's; LOCO_EIO for files. */
int loco_net_revoke_certs(const char *dir, const char *const *names, int n_names, int *n_revoked);

/* ---------------------------------------------------------------- links */

typedef struct loco_net_listener loco_net_listener;
typedef struct loco_link loco_link;

/* Listens on host:port (host NULL = every address; port 0 = an ephemeral
 * port, see loco_net_listener_port). A background thread accepts
 * connections and runs their handshakes concurrently, so a slow or hostile
 * client delays nobody; refused connections are logged (warn) and counted,
 * and the listener goes on. Links are complete once all their streams
 * arrived; loco_net_accept hands them out. */
int loco_net_listen(loco_net_listener **out, const loco_net_params *p, const char *host, int port);
/* The bound port. */
int loco_net_listener_port(const loco_net_listener *l);
/* Waits up to timeout_ms (< 0 = forever) for the next complete link. The
 * caller owns *out. LOCO_ETIMEDOUT when none arrived in time. */
int loco_net_accept(loco_net_listener *l, loco_link **out, int timeout_ms);
/* From now on, adds 1 to eventfd fd whenever a link becomes ready to
 * accept (at once when one already is), so that one poll can wait on the
 * listener beside links (loco_link_set_notify). fd = -1 stops it. The
 * caller owns fd and keeps it open while it is set. */
void loco_net_listener_set_notify(loco_net_listener *l, int fd);

typedef struct {
    uint64_t links;         /* links completed */
    uint64_t refused;       /* connections refused (handshake, HELLO, timeout) */
    char last_refusal[512]; /* reason of the latest refusal */
} loco_net_listener_info;
void loco_net_listener_get_info(loco_net_listener *l, loco_net_listener_info *out);
/* Stops the thread, closes pending connections and links not yet accepted.
 * Links already handed out live on. Accepts NULL. */
void loco_net_listener_destroy(loco_net_listener *l);

/* Opens p->streams connections to host:port, runs TLS and HELLO on each
 * (concurrently) and returns the link. timeout_ms < 0 takes
 * p->connect_timeout_ms. LOCO_EAUTH when TLS fails either way (bad or
 * missing certificate, unknown CA, expired or not yet valid, revoked by
 * p->crl, not of run p->cert_run_id, or the peer's name is not
 * p->expect_peer), LOCO_EPEER when the listener refused the link (reason in
 * the message), LOCO_EIO when nobody listens, LOCO_ETIMEDOUT. */
int loco_net_connect(loco_link **out, const loco_net_params *p, const char *host, int port,
                     int timeout_ms);

/* Enqueues one frame (payload copied; len may be 0 with payload NULL).
 * Returns when the frame is queued, not when it is written: waits for room
 * in the stream's queue at most io_timeout_ms (LOCO_ETIMEDOUT). LOCO_EINVAL
 * for a bad header, a HELLO, or len above the smaller of both sides'
 * max_frame_bytes; the link's error once it failed; LOCO_EINVAL once closed.
 * Safe from several threads; frames keep the order of the calls. */
int loco_link_send(loco_link *l, const loco_frame_hdr *h, const void *payload, size_t len);
/* Same, without a copy: *payload (from loco_alloc) passes to the link on
 * success and *payload becomes NULL; on failure the caller still owns it. */
int loco_link_send_move(loco_link *l, const loco_frame_hdr *h, void **payload, size_t len);
/* Waits until every queued frame was written to its socket. 0, the link's
 * error, or LOCO_ETIMEDOUT (timeout_ms < 0 = forever). */
int loco_link_flush(loco_link *l, int timeout_ms);
/* From now on, adds 1 to eventfd fd whenever a frame arrives, a stream ends
 * or the link stops (at once when that already happened), so that one
 * poll over fd waits on many links. fd = -1 stops it. The caller owns fd
 * and keeps it open until the link is destroyed or fd is unset. */
void loco_link_set_notify(loco_link *l, int fd);
/* How long a last frame (ERROR, BYE) may take to reach the wire before its
 * link closes: long enough for a live peer's socket to take a few small
 * frames, short enough that a dead peer holds the sender back no more than
 * a couple of heartbeat rounds. A protocol constant, not a tunable. */
#define LOCO_LINK_FAREWELL_MS 2000
/* Next frame in send order. *payload is a loco_alloc'd buffer of
 * h->payload_len bytes the caller frees (NULL when empty), already checked
 * against its checksum. Frames that arrived intact before a failure are
 * handed out first; then: LOCO_ETIMEDOUT (timeout_ms elapsed, < 0 =
 * forever, 0 = poll; the link stays usable), LOCO_EPROTO (a bad frame: the
 * link is dropped), LOCO_EPEER (the peer closed or vanished), LOCO_EINVAL
 * (closed here). */
int loco_link_recv(loco_link *l, loco_frame_hdr *h, void **payload, int timeout_ms);

/* The peer's identity: the CN (else the first DNS SAN) of its verified
 * certificate; in plain mode the name from its HELLO, or its address. */
const char *loco_link_peer_name(const loco_link *l);

typedef struct {
    uint64_t frames_sent, frames_recv;         /* frames written / handed to the reader queue */
    uint64_t bytes_sent, bytes_recv;           /* frame bytes, headers included */
    uint64_t wire_bytes_sent, wire_bytes_recv; /* socket bytes, TLS records included */
    uint64_t faults_dropped, faults_corrupted, faults_duplicated, faults_delayed;
    uint64_t rx_held_peak; /* most received payload bytes held at once, reserved for
                              frames being read included (<= link_buffer_bytes) */
    int streams;
    int sndbuf, rcvbuf; /* per stream, as the kernel reports them */
    char transport[64]; /* "TLSv1.3 TLS_AES_128_GCM_SHA256" or "plain" */
} loco_link_stats;
void loco_link_get_stats(loco_link *l, loco_link_stats *out);

/* Replace the emulation or the faults from now on (frames already queued
 * keep their release times). Both reseed their RNG. NULL = off. */
void loco_link_set_wan(loco_link *l, const loco_wan *w);
void loco_link_set_faults(loco_link *l, const loco_link_faults *f);

/* Orderly close: writes what is queued (at most io_timeout_ms), ends every
 * stream (TLS close_notify, FIN), waits at most linger_ms for the peer's
 * end, stops the threads and closes the sockets. May be called from another
 * thread to wake a blocked send or recv (they return LOCO_EINVAL). Idempotent. */
void loco_link_close(loco_link *l);
/* Ends the link now, for a peer not worth waiting for: nothing queued is
 * written any more and nobody waits for the peer's end (it may see a reset);
 * every blocked call returns. Close or destroy it afterwards (neither waits
 * then). Accepts NULL. */
void loco_link_abort(loco_link *l);
/* Closes if needed and frees. No other call on l may run. Accepts NULL. */
void loco_link_destroy(loco_link *l);

/* The adversary's hook: writes raw bytes on one stream of link l, bypassing
 * the sender thread and every check, so tests and experiments can forge
 * and garble frames as a hostile peer would. 0, or < 0 when the write
 * fails. Never used by the library itself. */
int loco_link_write_raw(loco_link *l, int stream, const void *buf, size_t len);


#endif /* LOCO_NET_H */
