/* Writing token shards (written to path.tmp, fsynced, renamed) and
 * preparing them from a text file's bytes or a tokenizer's ids. */
#include "inner/data/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void put_le32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* ---------------------------------------------------------------- writer */

static int fsync_parent(const char *path) {
    char dir[LOCO_PATH_MAX * 2];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return LOCO_ERR(LOCO_EINVAL, "%s: path too long", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return LOCO_ERR(LOCO_EIO, "%s: cannot open directory for fsync: %s", dir,
                        strerror(errno));
    int rc = fsync(fd) == 0 ? 0 : LOCO_ERR(LOCO_EIO, "%s: fsync: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

int loco_data_write_shard(const char *path, const int32_t *tokens, size_t n, int version) {
    if (!path || !*path)
        return LOCO_ERR(LOCO_EINVAL, "write shard: empty path");
    if (version != LOCO_SHARD_VERSION_U16 && version != LOCO_SHARD_VERSION_U32)
        return LOCO_ERR(LOCO_EINVAL, "%s: shard version %d (expected %d for uint16 or %d for "
                        "uint32 tokens)", path, version, LOCO_SHARD_VERSION_U16,
                        LOCO_SHARD_VERSION_U32);
    if (n > (size_t)INT32_MAX)
        return LOCO_ERR(LOCO_EINVAL, "%s: %zu tokens exceed the header's int32 count", path, n);
    if (n > 0 && !tokens)
        return LOCO_ERR(LOCO_EINVAL, "%s: NULL tokens", path);
    int tok_bytes = version == LOCO_SHARD_VERSION_U16 ? 2 : 4;
    int64_t limit = version == LOCO_SHARD_VERSION_U16 ? 65536 : (int64_t)1 << 32;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= limit)
            return LOCO_ERR(LOCO_EINVAL, "%s: token %d at index %zu does not fit version %d (%s)",
                            path, tokens[i], i, version,
                            version == LOCO_SHARD_VERSION_U16 ? "uint16" : "uint32");
    }
    size_t bytes = (size_t)SHARD_HEADER_BYTES + n * (size_t)tok_bytes;
    uint8_t *buf = loco_alloc(bytes); /* zero-filled: header tail stays 0 */
    if (!buf)
        return LOCO_ERR(LOCO_ENOMEM, "%s: cannot allocate %zu bytes", path, bytes);
    put_le32(buf, version == LOCO_SHARD_VERSION_U16 ? LOCO_SHARD_MAGIC_U16
                                                    : LOCO_SHARD_MAGIC_U32);
    put_le32(buf + 4, (uint32_t)version);
    put_le32(buf + 8, (uint32_t)n);
    uint8_t *p = buf + SHARD_HEADER_BYTES;
    for (size_t i = 0; i < n; i++) {
        uint32_t t = (uint32_t)tokens[i];
        if (tok_bytes == 2) {
            p[2 * i] = (uint8_t)t;
            p[2 * i + 1] = (uint8_t)(t >> 8);
        } else {
            put_le32(p + 4 * i, t);
        }
    }
    int rc = 0;
    size_t plen = strlen(path);
    char *tmp = loco_alloc(plen + 5);
    if (!tmp) {
        rc = LOCO_ERR(LOCO_ENOMEM, "%s: out of memory", path);
        goto out_free_buf;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    rc = loco_file_write_sync(tmp, buf, bytes);
    if (rc < 0) {
        loco__err_trace(__FILE__, __LINE__, "loco_file_write_sync(tmp, buf, bytes)");
        unlink(tmp);
        goto out_free_tmp;
    }
    if (rename(tmp, path) != 0) {
        rc = LOCO_ERR(LOCO_EIO, "rename %s -> %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
        goto out_free_tmp;
    }
    LOCO_CHECK_GOTO(fsync_parent(path), out_free_tmp);
out_free_tmp:
    loco_free(tmp);
out_free_buf:
    loco_free(buf);
    return rc;
}

/* ------------------------------------------------------------------ prep */

/* Writes bytes [begin, end) of the open text file as shards
 * PREFIX_SPLIT_NNNNNN.bin of at most shard_tokens tokens; *nshards gets the
 * count. Stale shards of the same name left by an earlier, longer run are
 * removed so a glob over the split sees only this run's shards. */
static int write_split(int fd, const char *text_path, const char *prefix, const char *split,
                       int64_t begin, int64_t end, size_t shard_tokens, int *nshards) {
    *nshards = 0;
    size_t plen = strlen(prefix) + strlen(split) + 32;
    char *path = loco_alloc(plen);
    uint8_t *bytes = loco_alloc(shard_tokens);
    int32_t *toks = loco_alloc(shard_tokens * sizeof *toks);
    int rc = 0;
    if (!path || !bytes || !toks) {
        rc = LOCO_ERR(LOCO_ENOMEM, "prep %s: cannot allocate a shard of %zu tokens", text_path,
                      shard_tokens);
        goto out_free;
    }
    int idx = 0;
    for (int64_t off = begin; off < end; off += (int64_t)shard_tokens, idx++) {
        size_t n = (size_t)(end - off) < shard_tokens ? (size_t)(end - off) : shard_tokens;
        LOCO_CHECK_GOTO(loco__data_pread_full(fd, text_path, bytes, n, off), out_free);
        for (size_t i = 0; i < n; i++)
            toks[i] = bytes[i];
        snprintf(path, plen, "%s_%s_%06d.bin", prefix, split, idx);
        LOCO_CHECK_GOTO(loco_data_write_shard(path, toks, n, LOCO_SHARD_VERSION_U16), out_free);
    }
    *nshards = idx;
    for (int stale = idx;; stale++) {
        snprintf(path, plen, "%s_%s_%06d.bin", prefix, split, stale);
        if (unlink(path) != 0)
            break;
        loco_warn("prep: removed stale shard %s from an earlier run", path);
    }
out_free:
    loco_free(toks);
    loco_free(bytes);
    loco_free(path);
    return rc;
}

int loco_data_prep_bytes(const char *text_path, const char *out_prefix, double val_frac,
                         size_t shard_tokens) {
    if (!text_path || !out_prefix || !*out_prefix)
        return LOCO_ERR(LOCO_EINVAL, "prep: missing text path or output prefix");
    if (!isfinite(val_frac) || val_frac <= 0.0 || val_frac >= 1.0)
        return LOCO_ERR(LOCO_EINVAL, "prep %s: val_frac %g must lie strictly between 0 and 1",
                        text_path, val_frac);
    if (shard_tokens == 0 || shard_tokens > (size_t)INT32_MAX)
        return LOCO_ERR(LOCO_EINVAL, "prep %s: shard_tokens %zu must be in 1..%d", text_path,
                        shard_tokens, INT32_MAX);
    int fd = open(text_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return LOCO_ERR(errno == ENOENT ? LOCO_EINVAL : LOCO_EIO, "%s: cannot open: %s",
                        text_path, strerror(errno));
    int rc = 0;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = LOCO_ERR(LOCO_EIO, "%s: cannot stat: %s", text_path, strerror(errno));
        goto out_close;
    }
    int64_t n = (int64_t)st.st_size;
    int64_t ntrain = (int64_t)floor((1.0 - val_frac) * (double)n);
    if (ntrain <= 0 || ntrain >= n) {
        rc = LOCO_ERR(LOCO_EINVAL,
                      "%s: %lld bytes with val_frac %g leave %lld train and %lld val bytes; "
                      "both splits must be non-empty",
                      text_path, (long long)n, val_frac, (long long)(ntrain > 0 ? ntrain : 0),
                      (long long)(n - (ntrain > 0 ? ntrain : 0)));
        goto out_close;
    }
    const char *slash = strrchr(out_prefix, '/');
    if (slash && slash != out_prefix) {
        char *dir = loco__data_str_dup(out_prefix, (size_t)(slash - out_prefix));
        if (!dir) {
            rc = LOCO_ERR(LOCO_ENOMEM, "prep %s: out of memory", text_path);
            goto out_close;
        }
        rc = loco_mkdirs(dir);
        loco_free(dir);
        if (rc < 0) {
            loco__err_trace(__FILE__, __LINE__, "loco_mkdirs(dir)");
            goto out_close;
        }
    }
    int ntr = 0, nva = 0;
    LOCO_CHECK_GOTO(write_split(fd, text_path, out_prefix, "train", 0, ntrain, shard_tokens,
                                &ntr),
                    out_close);
    LOCO_CHECK_GOTO(write_split(fd, text_path, out_prefix, "val", ntrain, n, shard_tokens,
                                &nva),
                    out_close);
    loco_info("prep %s: %lld bytes -> %s_train_*.bin (%d shard%s, %lld tokens), "
              "%s_val_*.bin (%d shard%s, %lld tokens), vocab 256",
              text_path, (long long)n, out_prefix, ntr, ntr == 1 ? "" : "s", (long long)ntrain,
              out_prefix, nva, nva == 1 ? "" : "s", (long long)(n - ntrain));
out_close:
    close(fd);
    return rc;
}

/* Writes ids [0, n) as PREFIX_SPLIT_NNNNNN.bin shards and removes stale
 * higher-numbered shards of an earlier run. */
static int write_token_split(const int32_t *ids, size_t n, const char *prefix,
                             const char *split, size_t shard_tokens, int version, int *nshards) {
    *nshards = 0;
    size_t plen = strlen(prefix) + strlen(split) + 32;
    char *path = loco_alloc(plen);
    if (!path)
        return LOCO_ERR(LOCO_ENOMEM, "prep %s: out of memory", prefix);
    int rc = 0, idx = 0;
    for (size_t off = 0; off < n; off += shard_tokens, idx++) {
        size_t k = n - off < shard_tokens ? n - off : shard_tokens;
        snprintf(path, plen, "%s_%s_%06d.bin", prefix, split, idx);
        LOCO_CHECK_GOTO(loco_data_write_shard(path, ids + off, k, version), out);
    }
    *nshards = idx;
    for (int stale = idx;; stale++) {
        snprintf(path, plen, "%s_%s_%06d.bin", prefix, split, stale);
        if (unlink(path) != 0)
            break;
        loco_warn("prep: removed stale shard %s from an earlier run", path);
    }
out:
    loco_free(path);
    return rc;
}

int loco_data_prep_tokens(const int32_t *ids, size_t n, int vocab_size, const char *what,
                          const char *out_prefix, double val_frac, size_t shard_tokens) {
    if (!out_prefix || !*out_prefix)
        return LOCO_ERR(LOCO_EINVAL, "prep %s: missing output prefix", what);
    if (!isfinite(val_frac) || val_frac <= 0.0 || val_frac >= 1.0)
        return LOCO_ERR(LOCO_EINVAL, "prep %s: val_frac %g must lie strictly between 0 and 1",
                        what, val_frac);
    if (shard_tokens == 0 || shard_tokens > (size_t)INT32_MAX)
        return LOCO_ERR(LOCO_EINVAL, "prep %s: shard_tokens %zu must be in 1..%d", what,
                        shard_tokens, INT32_MAX);
    if (vocab_size <= 0)
        return LOCO_ERR(LOCO_EINVAL, "prep %s: vocab_size %d must be positive", what,
                        vocab_size);
    size_t ntrain = (size_t)floor((1.0 - val_frac) * (double)n);
    if (ntrain == 0 || ntrain >= n)
        return LOCO_ERR(LOCO_EINVAL,
                        "prep %s: %zu tokens with val_frac %g leave %zu train and %zu val "
                        "tokens; both splits must be non-empty",
                        what, n, val_frac, ntrain, n - ntrain);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab_size)
            return LOCO_ERR(LOCO_EINVAL, "prep %s: token %d at index %zu outside the "
                            "vocabulary of %d", what, ids[i], i, vocab_size);
    int version = vocab_size <= 65536 ? LOCO_SHARD_VERSION_U16 : LOCO_SHARD_VERSION_U32;
    const char *slash = strrchr(out_prefix, '/');
    if (slash && slash != out_prefix) {
        char *dir = loco__data_str_dup(out_prefix, (size_t)(slash - out_prefix));
        if (!dir)
            return LOCO_ERR(LOCO_ENOMEM, "prep %s: out of memory", what);
        int rc = loco_mkdirs(dir);
        loco_free(dir);
        LOCO_CHECK(rc);
    }
    int ntr = 0, nva = 0;
    LOCO_CHECK(write_token_split(ids, ntrain, out_prefix, "train", shard_tokens, version, &ntr));
    LOCO_CHECK(write_token_split(ids + ntrain, n - ntrain, out_prefix, "val", shard_tokens,
                                 version, &nva));
    loco_info("prep %s: %zu tokens -> %s_train_*.bin (%d shard%s, %zu tokens), "
              "%s_val_*.bin (%d shard%s, %zu tokens), vocab %d, %s",
              what, n, out_prefix, ntr, ntr == 1 ? "" : "s", ntrain, out_prefix, nva,
              nva == 1 ? "" : "s", n - ntrain, vocab_size,
              version == LOCO_SHARD_VERSION_U16 ? "uint16" : "uint32");
    return 0;
}
