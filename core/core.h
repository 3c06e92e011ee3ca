/* core/ — the ground floor every other room stands on: error codes with
 * breadcrumbs, logging, allocation, RNG, checksums, JSONL metrics, tensor
 * tables over flat buffers, safetensors I/O, configuration, clocks and an
 * object store (paths and URLs through libcurl).
 * Library code returns 0 or a negative LOCO_E* code; only cli/ exits. */
#ifndef LOCO_CORE_H
#define LOCO_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---------------------------------------------------------------- errors */

enum {
    LOCO_OK = 0,
    LOCO_EINVAL = -1,    /* bad argument, config or input */
    LOCO_ENOMEM = -2,    /* allocation failed */
    LOCO_EIO = -3,       /* file or socket I/O failed */
    LOCO_ETIMEDOUT = -4, /* a deadline passed */
    LOCO_EPROTO = -5,    /* malformed data: frame, shard, checkpoint */
    LOCO_EAUTH = -6,     /* authentication refused */
    LOCO_EPEER = -7,     /* the remote side failed */
    LOCO_ECUDA = -8,
    LOCO_ENCCL = -9,
    LOCO_EMPI = -10,
    LOCO_ENOTSUP = -11, /* asked for something this build does not do */
    LOCO_EREFUSED = -12, /* a peer's well-formed data failed a check (NaN, outlier) */
};

/* Name of an error code ("LOCO_EINVAL: invalid argument"). Never NULL. */
const char *loco_strerror(int rc);

/* Records rc and a formatted message for this thread, prefixed by file:line.
 * Returns rc, so `return LOCO_ERR(LOCO_EINVAL, "...")` reads naturally. */
int loco__err_set(int rc, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Appends a breadcrumb "  at file:line (expr)" to this thread's message. */
void loco__err_trace(const char *file, int line, const char *expr);
/* This thread's last error message with breadcrumbs ("" when none). */
const char *loco_errmsg(void);
void loco_err_clear(void);

#define LOCO_ERR(rc, ...) loco__err_set((rc), __FILE__, __LINE__, __VA_ARGS__)

/* Propagate a failing status, leaving a breadcrumb per frame. */
#define LOCO_CHECK(call)                                                       \
    do {                                                                       \
        int loco_rc_ = (call);                                                 \
        if (loco_rc_ < 0) {                                                    \
            loco__err_trace(__FILE__, __LINE__, #call);                        \
            return loco_rc_;                                                   \
        }                                                                      \
    } while (0)

/* Same, but stores the status in `rc` and jumps to a cleanup label. */
#define LOCO_CHECK_GOTO(call, label)                                           \
    do {                                                                       \
        rc = (call);                                                           \
        if (rc < 0) {                                                          \
            loco__err_trace(__FILE__, __LINE__, #call);                        \
            goto label;                                                        \
        }                                                                      \
    } while (0)

/* --------------------------------------------------------------- logging */

typedef enum {
    LOCO_LOG_ERROR = 0,
    LOCO_LOG_WARN = 1,
    LOCO_LOG_INFO = 2,
    LOCO_LOG_DEBUG = 3,
} loco_log_level;

void loco_log_set_level(loco_log_level level);
loco_log_level loco_log_get_level(void);
/* Parses "error|warn|info|debug"; returns LOCO_EINVAL on anything else. */
int loco_log_parse_level(const char *s, loco_log_level *out);
void loco_log(loco_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define loco_error(...) loco_log(LOCO_LOG_ERROR, __VA_ARGS__)
#define loco_warn(...) loco_log(LOCO_LOG_WARN, __VA_ARGS__)
#define loco_info(...) loco_log(LOCO_LOG_INFO, __VA_ARGS__)
#define loco_debug(...) loco_log(LOCO_LOG_DEBUG, __VA_ARGS__)

/* ---------------------------------------------------------------- memory */

/* The one allocation wrapper: 64-byte aligned, zero-filled memory, or NULL.
 * Tests make the Nth call fail with loco_alloc_fail_after(). */
void *loco_alloc(size_t bytes);
void loco_free(void *p); /* accepts NULL */
/* Make the n-th allocation from now fail (n >= 1); n = 0 disarms. */
void loco_alloc_fail_after(long n);
/* Bytes currently allocated through loco_alloc by this process. */
size_t loco_alloc_live_bytes(void);

/* ------------------------------------------------------------------- RNG */

/* xoshiro256** seeded through splitmix64: fast, plain state that
 * checkpoints copy as four integers. */
typedef struct {
    uint64_t s[4];
} loco_rng;

void loco_rng_seed(loco_rng *rng, uint64_t seed);
uint64_t loco_rng_u64(loco_rng *rng);
/* Uniform in [0, 1) with 24 bits (float) or 53 bits (double). */
float loco_rng_uniform(loco_rng *rng);
double loco_rng_uniform_d(loco_rng *rng);
/* Standard normal (Box-Muller, one draw per call). */
float loco_rng_normal(loco_rng *rng);

/* ------------------------------------------------------------- checksums */

/* XXH3 64-bit hash of a buffer. */
uint64_t loco_hash64(const void *data, size_t len);
/* Hex form into buf (17 bytes). */
void loco_hash_hex(uint64_t h, char buf[17]);

/* ----------------------------------------------------------- byte order */

/* Little-endian packing for wire and file formats, whatever the host. */
static inline void loco_put_le16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void loco_put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void loco_put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t loco_get_le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t loco_get_le32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static inline uint64_t loco_get_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ----------------------------------------------------------------- clock */

double loco_now(void); /* monotonic seconds */
double loco_wall_time(void); /* seconds since the epoch */
void loco_sleep_ms(int ms);

/* ----------------------------------------------------------------- files */

/* Reads a whole file into a fresh buffer (caller frees with loco_free). */
int loco_file_read(const char *path, void **data, size_t *len);
/* Writes all bytes and fsyncs the file (no rename; see loco_dir_commit). */
int loco_file_write_sync(const char *path, const void *data, size_t len);
/* Creates a directory and its parents (mkdir -p). */
int loco_mkdirs(const char *path);
/* Removes a directory tree (rm -rf); missing is fine. */
int loco_rmtree(const char *path);
/* Atomically publishes directory tmp as final: fsyncs tmp, swaps it with an
 * existing final (renameat2 RENAME_EXCHANGE) or renames it, fsyncs the
 * parent, removes the old one. A crash leaves either the old or the new
 * directory under `final`, never a half-written one; on file systems without
 * RENAME_EXCHANGE (NFS, many FUSE) the old one is moved aside to final.old
 * first, so a crash between the two renames leaves it there: the next
 * commit puts it back, and readers should look at final.old when final is
 * missing (loco_ckpt_load does). */
int loco_dir_commit(const char *tmp, const char *final);

/* --------------------------------------------------------- tensor tables */

#define LOCO_TENSOR_NAME_MAX 96
#define LOCO_TENSOR_MAX_DIM 4

/* A named tensor inside a flat fp32 buffer. */
typedef struct {
    char name[LOCO_TENSOR_NAME_MAX];
    int ndim;
    int64_t shape[LOCO_TENSOR_MAX_DIM];
    size_t offset; /* in elements from the start of the flat buffer */
    size_t numel;
    int split_dim; /* dimension tensor parallelism splits, -1 for none */
    int split_parts; /* fused parts along split_dim split one by one (3 for
                      * c_attn's q, k, v); 1 otherwise */
    int64_t part_len[LOCO_TENSOR_MAX_DIM]; /* the parts' lengths along split_dim in
                      * the whole tensor when they differ (grouped-query
                      * c_attn: NH, NKV, NKV heads); all 0: equal parts */
    int part_units[LOCO_TENSOR_MAX_DIM]; /* with part_len: the indivisible
                      * units (heads) of part p; over t ranks it is cut into
                      * min(t, units) chunks, each held by t / that many
                      * consecutive ranks (key/value heads fewer than tp) */
    bool decay;    /* weight decay applies (2-D weights) */
} loco_tensor;

typedef struct {
    loco_tensor *t;
    int n, cap;
    size_t numel; /* total elements, = end of the last tensor */
} loco_ttable;

void loco_ttable_init(loco_ttable *tt);
void loco_ttable_fini(loco_ttable *tt);
/* Appends a tensor at the current end of the buffer. Names must be unique. */
int loco_ttable_add(loco_ttable *tt, const char *name, int ndim,
                    const int64_t *shape, int split_dim, bool decay);
/* Index of a tensor by name, or -1. */
int loco_ttable_find(const loco_ttable *tt, const char *name);

/* ----------------------------------------------------------- safetensors */

/* A safetensors file held in memory, header validated on open. */
typedef struct loco_st loco_st;

/* Opens and validates a safetensors file: header length, JSON, dtypes,
 * offsets inside the data, shapes matching byte counts. LOCO_EPROTO with the
 * reason on anything inconsistent; LOCO_EIO when unreadable. */
int loco_st_open(loco_st **out, const char *path);
void loco_st_close(loco_st *st); /* accepts NULL */
/* Looks up an F32 tensor. LOCO_EINVAL when absent or not F32. The data
 * pointer stays valid until loco_st_close. */
int loco_st_get(const loco_st *st, const char *name, const float **data,
                int *ndim, int64_t shape[LOCO_TENSOR_MAX_DIM]);
/* Value of a __metadata__ string entry, or NULL. */
const char *loco_st_meta(const loco_st *st, const char *key);
/* Writes every tensor of tt from base as F32, plus metadata pairs
 * (NULL-terminated array of key, value strings, may be NULL); fsyncs. If
 * `rename_prefix` is not NULL, tensor i is stored as prefix + name. */
int loco_st_write(const char *path, const loco_ttable *tt, const float *base,
                  const char *rename_prefix, const char *const *meta_kv);
/* Fills base from a file: every tensor of tt must be present, F32, with the
 * same shape (name looked up as prefix + name when prefix != NULL). */
int loco_st_read_into(const loco_st *st, const loco_ttable *tt, float *base,
                      const char *prefix);

/* --------------------------------------------------------------- metrics */

/* JSONL metrics: one object per line, flushed per record. */
typedef struct loco_metrics loco_metrics;

int loco_metrics_open(loco_metrics **out, const char *path, bool append);
void loco_metrics_close(loco_metrics *m); /* accepts NULL */
/* Builds one record: begin, add fields, end writes the line. A NULL
 * handle (metrics off, e.g. on ranks other than 0) makes them no-ops. */
void loco_metrics_begin(loco_metrics *m);
void loco_metrics_int(loco_metrics *m, const char *key, int64_t v);
void loco_metrics_num(loco_metrics *m, const char *key, double v);
/* key: a JSON array of n integers. */
void loco_metrics_ints(loco_metrics *m, const char *key, const int64_t *v, int n);
void loco_metrics_str(loco_metrics *m, const char *key, const char *v);
int loco_metrics_end(loco_metrics *m);

/* Appends {"t": <unix seconds>, <fields>} as one line to the JSONL file at
 * path (created if missing) with a single O_APPEND write, so several
 * processes can share a timeline (a run's events.jsonl). fields_fmt is a
 * printf format of the remaining JSON members, already escaped. */
int loco_event_append(const char *path, const char *fields_fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------- live metrics */

/* Live metrics in the Prometheus text exposition format 0.0.4
 * (core/prom.c; docs/METRICS.md lists them): a registry of gauges and
 * counters, each sample with at most one label, updated by the owning
 * thread under a mutex and rendered for a scraper on another thread (the
 * `loco` program serves it over HTTP: cli/metrics_http.c). A NULL handle
 * makes every update a no-op (metrics off). */
typedef struct loco_prom loco_prom;
typedef enum { LOCO_PROM_GAUGE = 0, LOCO_PROM_COUNTER } loco_prom_type;

#define LOCO_PROM_NAME_MAX 96      /* metric and label names, NUL included */
#define LOCO_PROM_MAX_FAMILIES 64  /* metrics per registry */
#define LOCO_PROM_VALUE_MAX 32     /* a formatted sample value */

/* An empty registry (caller destroys it). */
int loco_prom_create(loco_prom **out);
/* Frees everything; whoever serves p stops first. Accepts NULL. */
void loco_prom_destroy(loco_prom *p);
/* Declares metric `name` ([a-zA-Z_:][a-zA-Z0-9_:]*) with its HELP text;
 * `label`: the name of its one label, or NULL for none. LOCO_EINVAL on a
 * bad or repeated name, or past LOCO_PROM_MAX_FAMILIES. */
int loco_prom_declare(loco_prom *p, const char *name, loco_prom_type type, const char *label,
                      const char *help);
/* Sets (or, add, increments) the sample of `name` whose label has this
 * value (NULL for a metric without a label), made on first use. An
 * undeclared name or a label that does not match the declaration is
 * ignored (a debug line). NaN and infinities are valid values. */
void loco_prom_set(loco_prom *p, const char *name, const char *label_value, double v);
void loco_prom_add(loco_prom *p, const char *name, const char *label_value, double dv);
/* Sets the sample and forgets every other of `name`, at once (an info
 * metric whose label changed: a scrape sees the old one or the new one). */
void loco_prom_set_only(loco_prom *p, const char *name, const char *label_value, double v);
/* The exposition text of every metric that has a sample: # HELP, # TYPE,
 * then `name{label="value"} v` lines, label values and help escaped, NaN
 * and +Inf / -Inf as Prometheus writes them. Caller frees *text with
 * loco_free (NUL-terminated beyond len). */
int loco_prom_render(loco_prom *p, char **text, size_t *len);
/* A sample value as the format writes it (the shortest of %.15g and %.17g
 * that reads back exactly; NaN, +Inf, -Inf). */
void loco_prom_format_value(double v, char out[LOCO_PROM_VALUE_MAX]);

/* ---------------------------------------------------------------- config */

#define LOCO_PATH_MAX 512
#define LOCO_SITE_NAME_MAX 64 /* a site's name, its NUL included */
#define LOCO_SITE_SETS_MAX 64 /* [site.NAME] keys of one config, all sites together */

/* Every tunable of loco. Sections mirror the rooms; config_keys.h is the one
 * table of keys, defaults, ranges and descriptions. */
typedef struct {
#define LOCO_SECTION_BEGIN(sec) struct {
#define LOCO_SECTION_END(sec)                                                  \
    }                                                                          \
    sec;
#define LOCO_KEY_INT(sec, key, def, lo, hi, desc) int64_t key;
#define LOCO_KEY_NUM(sec, key, def, lo, hi, desc) double key;
#define LOCO_KEY_BOOL(sec, key, def, desc) bool key;
#define LOCO_KEY_STR(sec, key, def, desc) char key[LOCO_PATH_MAX];
#define LOCO_KEY_ENUM(sec, key, def, choices, desc) char key[32];
#include "core/config_keys.h"
#undef LOCO_SECTION_BEGIN
#undef LOCO_SECTION_END
#undef LOCO_KEY_INT
#undef LOCO_KEY_NUM
#undef LOCO_KEY_BOOL
#undef LOCO_KEY_STR
#undef LOCO_KEY_ENUM
    /* Keys a file or --set gave, for keys that follow another until both
     * are given (core/config.c, follow()). */
    struct {
        bool grad_accum;
    } given;
    /* [site.NAME] sections and --set site.NAME.section.key=value: keys one
     * island of a multi-site run sets for itself (its mesh, batch, threads,
     * device), kept as text in the order given and applied by that island
     * (loco_config_for_site). */
    int n_site_sets;
    struct {
        char site[LOCO_SITE_NAME_MAX];
        char key[64];    /* "section.key" */
        char value[128];
        char where[160]; /* "file:line" or "--set ..." */
    } site_set[LOCO_SITE_SETS_MAX];
} loco_config;

/* Fills every key with its default. */
void loco_config_defaults(loco_config *cfg);
/* The key table's defaults, built once and shared (read-only, thread-safe):
 * what a module's *_default() reads so that a default lives only in
 * core/config_keys.h. */
const loco_config *loco_config_default(void);
/* Reads an INI file over cfg. Errors name file:line, section.key and what
 * was expected (unknown section or key, wrong type, out of range). */
int loco_config_load(loco_config *cfg, const char *path);
/* Applies one "section.key=value" override (from --set). */
int loco_config_set(loco_config *cfg, const char *assignment);
/* Checks relations between keys (n_embd divisible by n_head, ...). */
int loco_config_validate(const loco_config *cfg);
/* Applies the [site.NAME] keys of `site` to cfg (the island of that site
 * calls it after loading); the other sites' keys stay as text. */
int loco_config_for_site(loco_config *cfg, const char *site);
/* The key table as text (`loco config --help`) or as Markdown (CONFIG.md). */
void loco_config_print_help(FILE *f);
void loco_config_print_markdown(FILE *f);
/* Writes cfg as an INI file that loco_config_load reads back to equal. */
void loco_config_dump(const loco_config *cfg, FILE *f);
/* Hash over the canonical dump of the keys of the given sections
 * (NULL-terminated list, NULL = all): checkpoints store the model hash. */
uint64_t loco_config_hash(const loco_config *cfg, const char *const *sections);

/* ---------------------------------------------------------- object store */

/* Whole objects put, fetched, tested and deleted at a *location*: a plain
 * path or a file:// URL (POSIX calls: written to a temporary name, fsynced
 * and renamed, so a reader sees the old object or the new one), or an
 * http:// or https:// URL through libcurl (PUT, GET, HEAD, DELETE; a PUT
 * refused for a missing parent — 409 as RFC 4918 says, 500 from nginx,
 * 404 — creates the WebDAV collections above it with MKCOL and is sent
 * once more). Downloads go to a temporary name next to the
 * destination and are renamed once complete: never a partial file. Errors
 * name the method, the URL and the HTTP status or the curl error:
 * LOCO_EAUTH (certificate refused, HTTP 401/403), LOCO_ETIMEDOUT,
 * LOCO_EPEER (any other HTTP error status), LOCO_EIO (connection, files,
 * 404), LOCO_ENOTSUP (another scheme). URLs take no query string. */
typedef struct {
    char ca[LOCO_PATH_MAX];   /* CA file verifying https servers ("" = system store) */
    char cert[LOCO_PATH_MAX]; /* client certificate, PEM ("" = none) */
    char key[LOCO_PATH_MAX];  /* its private key */
    long connect_timeout_ms;  /* TCP + TLS of each request */
    long stall_timeout_s;     /* a transfer making no progress this long fails */
} loco_store_opts;

typedef struct loco_store loco_store;

/* No CA, no client certificate; run.ckpt_connect_ms and run.ckpt_stall_s
 * of the key table. */
void loco_store_opts_default(loco_store_opts *o);
/* net.ca, net.cert, net.key, run.ckpt_connect_ms, run.ckpt_stall_s. */
void loco_store_opts_from_config(loco_store_opts *o, const loco_config *cfg);
/* A handle (one libcurl easy handle: connections and TLS sessions are
 * reused between calls). One thread at a time; caller destroys it. */
int loco_store_create(loco_store **out, const loco_store_opts *o);
void loco_store_destroy(loco_store *s); /* accepts NULL */
/* True when loc starts with "scheme://" (any scheme: an unsupported one is
 * refused by the calls below, never taken for a relative path). */
bool loco_store_is_url(const char *loc);
/* dst = base + "/" + name (one slash between them). LOCO_EINVAL when it
 * does not fit in cap. */
int loco_store_join(char *dst, size_t cap, const char *base, const char *name);
/* Stores len bytes (or the file at path) as the object at loc, replacing
 * it. Parent directories or collections are created. */
int loco_store_put(loco_store *s, const char *loc, const void *data, size_t len);
int loco_store_put_file(loco_store *s, const char *loc, const char *path);
/* Fetches the object at loc into a fresh buffer (caller frees with
 * loco_free; NUL-terminated beyond len). LOCO_EPROTO when it is larger
 * than max_len bytes. */
int loco_store_get(loco_store *s, const char *loc, size_t max_len, void **data, size_t *len);
/* Fetches the object at loc into the file at path (parents created),
 * through a temporary name renamed once complete and fsynced. */
int loco_store_get_file(loco_store *s, const char *loc, const char *path);
/* *exists = whether an object is at loc (HEAD: 200 yes, 404/410 no). */
int loco_store_exists(loco_store *s, const char *loc, bool *exists);
/* Deletes the object at loc; a missing one is not an error. */
int loco_store_delete(loco_store *s, const char *loc);

/* --------------------------------------------------------------- threads */

/* Sets OpenMP and BLAS thread counts; n <= 0 means all cores. Returns the
 * count used. Same count + same seed = same bits. */
int loco_set_threads(int n);

#endif /* LOCO_CORE_H */
