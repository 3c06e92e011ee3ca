/* Token-shard data loader (llm.c .bin format); the shard writer and the
 * preparation of text files and ids are in data_prep.c.
 *
 * All shards are validated at open (header, size, length against one batch
 * of every rank). While iterating only the current shard's file is open and
 * only one window (B*T+1 tokens) is held in memory; tokens are checked
 * against the vocabulary as they are read. */
#include "inner/data/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char *path;
    int64_t ntok;  /* tokens in the shard (header[2]) */
    int tok_bytes; /* 2 (version 1) or 4 (version 7) */
} shard_info;

struct loco_data {
    int B, T, rank, world, vocab_size;
    int64_t bt;     /* B*T: tokens per rank per step */
    int64_t stride; /* world*B*T: tokens all ranks consume per step */
    shard_info *shards; /* (nshards) sorted by path */
    int nshards;
    int64_t total_tokens;
    int64_t shard, pos, epoch; /* pos: start of rank 0's next window */
    int fd;           /* open file of shard fd_shard, or -1 */
    int64_t fd_shard; /* which shard fd belongs to, -1 for none */
    uint8_t *raw;     /* (B*T+1) * 4 bytes: one window as stored on disk */
};

/* ------------------------------------------------------------ little endian */

static int32_t get_le32(const uint8_t *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

int loco__data_pread_full(int fd, const char *path, void *buf, size_t len, int64_t off) {
    uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, p + done, len - done, (off_t)(off + (int64_t)done));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return LOCO_ERR(LOCO_EIO, "%s: read of %zu bytes at offset %lld failed: %s", path,
                            len, (long long)off, strerror(errno));
        }
        if (r == 0)
            return LOCO_ERR(LOCO_EPROTO,
                            "%s: unexpected end of file at offset %lld (wanted %zu bytes at "
                            "offset %lld; was the file changed after open?)",
                            path, (long long)(off + (int64_t)done), len, (long long)off);
        done += (size_t)r;
    }
    return 0;
}

/* ------------------------------------------------------------ shard list */

char *loco__data_str_dup(const char *s, size_t n) {
    char *d = loco_alloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

static int shard_cmp(const void *a, const void *b) {
    return strcmp(((const shard_info *)a)->path, ((const shard_info *)b)->path);
}

static int push_shard(loco_data *d, int *cap, const char *path) {
    if (d->nshards == *cap) {
        int ncap = *cap ? 2 * *cap : 16;
        shard_info *ns = loco_alloc((size_t)ncap * sizeof *ns);
        if (!ns)
            return LOCO_ERR(LOCO_ENOMEM, "data: cannot grow shard list to %d entries", ncap);
        if (d->nshards)
            memcpy(ns, d->shards, (size_t)d->nshards * sizeof *ns);
        loco_free(d->shards);
        d->shards = ns;
        *cap = ncap;
    }
    char *p = loco__data_str_dup(path, strlen(path));
    if (!p)
        return LOCO_ERR(LOCO_ENOMEM, "data: cannot copy path %s", path);
    d->shards[d->nshards++] = (shard_info){.path = p};
    return 0;
}

/* Expands one glob (or plain path) and appends its matches. */
static int expand_one(loco_data *d, int *cap, const char *item, const char *pattern) {
    glob_t g;
    int grc = glob(item, 0, NULL, &g);
    if (grc == GLOB_NOMATCH) {
        globfree(&g);
        return LOCO_ERR(LOCO_EINVAL, "%s: %s (data pattern '%s')", item,
                        strpbrk(item, "*?[") ? "no file matches" : "no such file", pattern);
    }
    if (grc != 0) {
        globfree(&g);
        return LOCO_ERR(grc == GLOB_NOSPACE ? LOCO_ENOMEM : LOCO_EIO,
                        "%s: glob failed (code %d, data pattern '%s')", item, grc, pattern);
    }
    int rc = 0;
    for (size_t i = 0; i < g.gl_pathc && rc == 0; i++)
        rc = push_shard(d, cap, g.gl_pathv[i]);
    globfree(&g);
    return rc;
}

/* Splits `pattern` on commas (items trimmed of spaces), expands each item and
 * sorts the union by name. */
static int expand_pattern(loco_data *d, const char *pattern) {
    int cap = 0;
    const char *s = pattern;
    for (;;) {
        const char *end = strchr(s, ',');
        size_t n = end ? (size_t)(end - s) : strlen(s);
        const char *b = s;
        while (n > 0 && (*b == ' ' || *b == '\t')) {
            b++;
            n--;
        }
        while (n > 0 && (b[n - 1] == ' ' || b[n - 1] == '\t'))
            n--;
        if (n == 0)
            return LOCO_ERR(LOCO_EINVAL, "data pattern '%s': empty item in comma-separated list",
                            pattern);
        char *item = loco__data_str_dup(b, n);
        if (!item)
            return LOCO_ERR(LOCO_ENOMEM, "data pattern '%s': out of memory", pattern);
        int rc = expand_one(d, &cap, item, pattern);
        loco_free(item);
        LOCO_CHECK(rc);
        if (!end)
            break;
        s = end + 1;
    }
    if (d->nshards > 1)
        qsort(d->shards, (size_t)d->nshards, sizeof *d->shards, shard_cmp);
    return 0;
}

/* Checks one shard's header and size; fills ntok and tok_bytes. */
static int validate_shard(shard_info *sh) {
    const char *path = sh->path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return LOCO_ERR(errno == ENOENT ? LOCO_EINVAL : LOCO_EIO, "%s: cannot open: %s", path,
                        strerror(errno));
    int rc = 0;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = LOCO_ERR(LOCO_EIO, "%s: cannot stat: %s", path, strerror(errno));
        goto out_close;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = LOCO_ERR(LOCO_EINVAL, "%s: not a regular file", path);
        goto out_close;
    }
    int64_t size = (int64_t)st.st_size;
    if (size < SHARD_HEADER_BYTES) {
        rc = LOCO_ERR(LOCO_EPROTO,
                      "%s: truncated: file has %lld bytes, shorter than the %lld-byte header",
                      path, (long long)size, (long long)SHARD_HEADER_BYTES);
        goto out_close;
    }
    uint8_t hdr[3 * 4];
    LOCO_CHECK_GOTO(loco__data_pread_full(fd, path, hdr, sizeof hdr, 0), out_close);
    int32_t magic = get_le32(hdr), version = get_le32(hdr + 4), ntok = get_le32(hdr + 8);
    if (magic == LOCO_SHARD_MAGIC_U16) {
        if (version != LOCO_SHARD_VERSION_U16) {
            rc = LOCO_ERR(LOCO_EPROTO, "%s: unsupported version %d for magic %d (expected %d)",
                          path, version, magic, LOCO_SHARD_VERSION_U16);
            goto out_close;
        }
        sh->tok_bytes = 2;
    } else if (magic == LOCO_SHARD_MAGIC_U32) {
        if (version != LOCO_SHARD_VERSION_U32) {
            rc = LOCO_ERR(LOCO_EPROTO, "%s: unsupported version %d for magic %d (expected %d)",
                          path, version, magic, LOCO_SHARD_VERSION_U32);
            goto out_close;
        }
        sh->tok_bytes = 4;
    } else {
        rc = LOCO_ERR(LOCO_EPROTO,
                      "%s: bad magic %d (expected %d for uint16 or %d for uint32 tokens); not "
                      "an llm.c token shard",
                      path, magic, LOCO_SHARD_MAGIC_U16, LOCO_SHARD_MAGIC_U32);
        goto out_close;
    }
    if (ntok < 0) {
        rc = LOCO_ERR(LOCO_EPROTO, "%s: negative token count %d in header", path, ntok);
        goto out_close;
    }
    int64_t data_bytes = (int64_t)ntok * sh->tok_bytes;
    int64_t want = SHARD_HEADER_BYTES + data_bytes;
    if (size < want) {
        rc = LOCO_ERR(LOCO_EPROTO,
                      "%s: truncated: header says %d tokens (%lld bytes) but file has %lld bytes",
                      path, ntok, (long long)want, (long long)size);
        goto out_close;
    }
    if (size > want) {
        rc = LOCO_ERR(LOCO_EPROTO,
                      "%s: oversize: header says %d tokens (%lld bytes) but file has %lld bytes",
                      path, ntok, (long long)want, (long long)size);
        goto out_close;
    }
    sh->ntok = ntok;
out_close:
    close(fd);
    return rc;
}

/* ---------------------------------------------------------------- loader */

int loco_data_open(loco_data **out, const char *pattern, int B, int T, int rank, int world,
                   int vocab_size) {
    *out = NULL;
    if (!pattern || !*pattern)
        return LOCO_ERR(LOCO_EINVAL, "data: empty shard pattern");
    if (B <= 0 || T <= 0)
        return LOCO_ERR(LOCO_EINVAL, "data %s: batch B=%d T=%d must be positive", pattern, B,
                        T);
    if (world <= 0 || rank < 0 || rank >= world)
        return LOCO_ERR(LOCO_EINVAL, "data %s: rank %d outside world of %d", pattern, rank,
                        world);
    if (vocab_size <= 0)
        return LOCO_ERR(LOCO_EINVAL, "data %s: vocab_size %d must be positive", pattern,
                        vocab_size);
    int64_t bt = (int64_t)B * T;
    if (bt > INT32_MAX / 4 || bt * world > INT32_MAX)
        return LOCO_ERR(LOCO_EINVAL, "data %s: B*T*world = %d*%d*%d too large for one shard",
                        pattern, B, T, world);

    loco_data *d = loco_alloc(sizeof *d);
    if (!d)
        return LOCO_ERR(LOCO_ENOMEM, "data %s: out of memory", pattern);
    d->B = B;
    d->T = T;
    d->rank = rank;
    d->world = world;
    d->vocab_size = vocab_size;
    d->bt = bt;
    d->stride = bt * world;
    d->fd = -1;
    d->fd_shard = -1;
    int rc = 0;
    LOCO_CHECK_GOTO(expand_pattern(d, pattern), out_fail);
    for (int i = 0; i < d->nshards; i++) {
        shard_info *sh = &d->shards[i];
        LOCO_CHECK_GOTO(validate_shard(sh), out_fail);
        if (sh->ntok < d->stride + 1) {
            rc = LOCO_ERR(LOCO_EINVAL,
                          "%s: shard holds %lld tokens, fewer than one batch of all ranks "
                          "needs: world*B*T+1 = %d*%d*%d+1 = %lld",
                          sh->path, (long long)sh->ntok, world, B, T,
                          (long long)(d->stride + 1));
            goto out_fail;
        }
        d->total_tokens += sh->ntok;
    }
    d->raw = loco_alloc((size_t)(bt + 1) * 4);
    if (!d->raw) {
        rc = LOCO_ERR(LOCO_ENOMEM, "data %s: cannot allocate a window of %lld tokens", pattern,
                      (long long)(bt + 1));
        goto out_fail;
    }
    *out = d;
    return 0;
out_fail:
    loco_data_close(d);
    return rc;
}

void loco_data_close(loco_data *d) {
    if (!d)
        return;
    if (d->fd >= 0)
        close(d->fd);
    for (int i = 0; i < d->nshards; i++)
        loco_free(d->shards[i].path);
    loco_free(d->shards);
    loco_free(d->raw);
    loco_free(d);
}

/* Makes d->fd the open file of shard s. */
static int open_shard(loco_data *d, int64_t s) {
    if (d->fd_shard == s)
        return 0;
    if (d->fd >= 0)
        close(d->fd);
    d->fd = -1;
    d->fd_shard = -1;
    const char *path = d->shards[s].path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return LOCO_ERR(LOCO_EIO, "%s: cannot open: %s", path, strerror(errno));
    d->fd = fd;
    d->fd_shard = s;
    return 0;
}

int loco_data_next(loco_data *d, int32_t *inputs, int32_t *targets) {
    const shard_info *sh = &d->shards[d->shard];
    int64_t start = d->pos + (int64_t)d->rank * d->bt; /* first token of this window */
    int64_t n = d->bt + 1;
    LOCO_CHECK(open_shard(d, d->shard));
    LOCO_CHECK(loco__data_pread_full(d->fd, sh->path, d->raw, (size_t)(n * sh->tok_bytes),
                          SHARD_HEADER_BYTES + start * sh->tok_bytes));
    const uint8_t *p = d->raw;
    uint32_t vocab = (uint32_t)d->vocab_size;
    for (int64_t i = 0; i < n; i++) {
        uint32_t t;
        if (sh->tok_bytes == 2)
            t = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
        else
            t = (uint32_t)get_le32(p + 4 * i);
        if (t >= vocab)
            return LOCO_ERR(LOCO_EPROTO,
                            "%s: token %u at token offset %lld (byte %lld) is >= vocab_size %d",
                            sh->path, t, (long long)(start + i),
                            (long long)(SHARD_HEADER_BYTES + (start + i) * sh->tok_bytes),
                            d->vocab_size);
        if (i < d->bt)
            inputs[i] = (int32_t)t;
        if (i > 0)
            targets[i - 1] = (int32_t)t;
    }
    /* Advance the shared position; the next step must fit for every rank. */
    d->pos += d->stride;
    if (d->pos + d->stride + 1 > sh->ntok) {
        d->pos = 0;
        if (++d->shard == d->nshards) {
            d->shard = 0;
            d->epoch++;
        }
    }
    return 0;
}

loco_data_pos loco_data_tell(const loco_data *d) {
    return (loco_data_pos){.shard = d->shard, .pos = d->pos, .epoch = d->epoch};
}

int loco_data_seek(loco_data *d, loco_data_pos p) {
    if (p.shard < 0 || p.shard >= d->nshards)
        return LOCO_ERR(LOCO_EINVAL, "data seek: shard %lld outside 0..%d", (long long)p.shard,
                        d->nshards - 1);
    const shard_info *sh = &d->shards[p.shard];
    if (p.epoch < 0)
        return LOCO_ERR(LOCO_EINVAL, "%s: data seek: negative epoch %lld", sh->path,
                        (long long)p.epoch);
    if (p.pos < 0 || (p.pos != 0 && p.pos + d->stride + 1 > sh->ntok))
        return LOCO_ERR(LOCO_EINVAL,
                        "%s: data seek: position %lld leaves no full step in a shard of %lld "
                        "tokens (world*B*T+1 = %lld)",
                        sh->path, (long long)p.pos, (long long)sh->ntok,
                        (long long)(d->stride + 1));
    d->shard = p.shard;
    d->pos = p.pos;
    d->epoch = p.epoch;
    return 0;
}

int loco_data_num_shards(const loco_data *d) { return d->nshards; }

int64_t loco_data_num_tokens(const loco_data *d) { return d->total_tokens; }

int loco_data_unigram_entropy(const char *pattern, int vocab_size, double *nats) {
    /* Counts every target of one pass over the shards in windows of 1 x 256. */
    enum { W = 256 };
    loco_data *d;
    LOCO_CHECK(loco_data_open(&d, pattern, 1, W, 0, 1, vocab_size));
    int rc = 0;
    int64_t *counts = loco_alloc((size_t)vocab_size * sizeof(int64_t));
    int32_t in[W], tg[W];
    if (!counts) {
        rc = LOCO_ERR(LOCO_ENOMEM, "unigram counts");
        goto out;
    }
    int64_t total = 0;
    for (;;) {
        LOCO_CHECK_GOTO(loco_data_next(d, in, tg), out);
        for (int i = 0; i < W; i++)
            counts[tg[i]]++;
        total += W;
        if (loco_data_tell(d).epoch > 0)
            break;
    }
    double h = 0;
    for (int v = 0; v < vocab_size; v++)
        if (counts[v]) {
            double p = (double)counts[v] / (double)total;
            h -= p * log(p);
        }
    *nats = h;
out:
    loco_free(counts);
    loco_data_close(d);
    return rc;
}
