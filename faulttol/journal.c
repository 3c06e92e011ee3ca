/* The coordinator's decision journal (run.dir/decisions.log): every
 * decision — a quorum epoch, a go, a commit with its outer step, hash and
 * members — is appended and synced before any island hears it, so a
 * restarted coordinator knows its own past instead of asking the islands
 * for it (docs/FAULTS.md, "Durable decisions"). One record a line: the
 * XXH3 hash of the JSON in 16 hex digits, a space, the JSON object. A
 * torn last record (a crash mid-write) is dropped with a warning; any other
 * record that does not check is an error naming the file and the record. */
#include "faulttol/coord_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The longest record: a commit or go names at most 64 members by mask. */
#define JOURNAL_RECORD_MAX 512

/* Takes one checked record into c: the highest epoch, the last commit.
 * false when it is not a record this journal writes. */
static bool apply(loco_coord *c, const char *json, size_t len) {
    cJSON *j = cJSON_ParseWithLength(json, len);
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "k");
    const cJSON *ep = cJSON_GetObjectItemCaseSensitive(j, "epoch");
    bool ok = cJSON_IsString(k) && loco__coord_num_in(ep, 0, LOCO_JSON_NUM_MAX);
    if (ok && (uint64_t)ep->valuedouble > c->epoch)
        c->epoch = (uint64_t)ep->valuedouble;
    if (ok && !strcmp(k->valuestring, "commit")) {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "step");
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "hash");
        ok = loco__coord_num_in(st, 0, LOCO_JSON_NUM_MAX) && cJSON_IsString(h) &&
             (int64_t)st->valuedouble >= c->journal_committed;
        if (ok) {
            c->journal_committed = (int64_t)st->valuedouble;
            c->committed = c->journal_committed;
            c->committed_hash = strtoull(h->valuestring, NULL, 16);
            c->known = true;
        }
    } else if (ok) {
        ok = !strcmp(k->valuestring, "epoch") || !strcmp(k->valuestring, "go");
    }
    cJSON_Delete(j);
    return ok;
}

/* Whether the record at [line, line + len) (no newline) checks — its
 * hash, then its JSON — and is taken into c. */
static bool record_ok(loco_coord *c, const char *line, size_t len) {
    if (len < 18 || line[16] != ' ')
        return false;
    char hex[17];
    memcpy(hex, line, 16);
    hex[16] = '\0';
    char *end;
    const uint64_t want = strtoull(hex, &end, 16);
    if (end != hex + 16 || loco_hash64(line + 17, len - 17) != want)
        return false;
    return apply(c, line + 17, len - 17);
}

int loco_coord_open_journal(loco_coord *c, const char *path) {
    void *data = NULL;
    size_t len = 0;
    if (access(path, F_OK) == 0)
        LOCO_CHECK(loco_file_read(path, &data, &len));
    const char *buf = data;
    size_t pos = 0, good = 0;
    int n = 0;
    while (pos < len) {
        n++;
        const char *nl = memchr(buf + pos, '\n', len - pos);
        const size_t end = nl ? (size_t)(nl - buf) : len;
        const bool last = !nl || end + 1 == len;
        if (nl && record_ok(c, buf + pos, end - pos)) {
            pos = good = end + 1;
            continue;
        }
        if (!last) {
            loco_free(data);
            return LOCO_ERR(LOCO_EIO,
                            "%s: record %d (at byte %zu) is corrupt: expected '<16 hex digits of "
                            "the XXH3 of the JSON> <JSON>' with a known kind; only a torn last "
                            "record is skipped",
                            path, n, pos);
        }
        loco_warn("coordinator: %s: the last record (%d, %zu bytes at byte %zu) is torn (a crash "
                  "while it was written): ignored",
                  path, n, len - pos, pos);
        break;
    }
    loco_free(data);
    const int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return LOCO_ERR(LOCO_EIO, "cannot open %s for the coordinator's decisions: %s", path,
                        strerror(errno));
    /* Appends go after the last good record, never after a torn one. */
    if (ftruncate(fd, (off_t)good) < 0 || lseek(fd, (off_t)good, SEEK_SET) < 0 || fsync(fd) < 0) {
        const int e = errno;
        close(fd);
        return LOCO_ERR(LOCO_EIO, "%s: cannot cut the torn record: %s", path, strerror(e));
    }
    c->journal_fd = fd;
    c->journal_on = true;
    snprintf(c->journal, sizeof c->journal, "%s", path);
    if (good > 0) {
        char hh[17];
        loco_hash_hex(c->committed_hash, hh);
        loco_info("coordinator: %s: its decisions read back: outer step %lld committed (%s), "
                  "epoch %llu; what islands claim beyond that is not believed",
                  path, (long long)c->journal_committed, hh, (unsigned long long)c->epoch);
    }
    return 0;
}

int loco__coord_journal(loco_coord *c, const char *fmt, ...) {
    if (!c->journal_on)
        return 0;
    char json[JOURNAL_RECORD_MAX], line[JOURNAL_RECORD_MAX + 24], hh[17];
    va_list ap;
    va_start(ap, fmt);
    const int jl = vsnprintf(json, sizeof json, fmt, ap);
    va_end(ap);
    if (jl < 0 || (size_t)jl >= sizeof json)
        return LOCO_ERR(LOCO_EINVAL, "coordinator: a decision record over %d bytes",
                        JOURNAL_RECORD_MAX);
    loco_hash_hex(loco_hash64(json, (size_t)jl), hh);
    const int n = snprintf(line, sizeof line, "%s %s\n", hh, json);
    for (int o = 0; o < n;) {
        const ssize_t w = write(c->journal_fd, line + o, (size_t)(n - o));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return LOCO_ERR(LOCO_EIO, "coordinator: %s: %s; the decision is not announced",
                            c->journal, strerror(errno));
        o += (int)w;
    }
    if (fdatasync(c->journal_fd) < 0)
        return LOCO_ERR(LOCO_EIO, "coordinator: %s: sync: %s; the decision is not announced",
                        c->journal, strerror(errno));
    return 0;
}

int loco__coord_journal_commit(loco_coord *c, int64_t step, uint64_t hash, uint64_t members,
                               const char *how) {
    if (c->journal_on && step != c->journal_committed) {
        char hh[17];
        loco_hash_hex(hash, hh);
        LOCO_CHECK(loco__coord_journal(c,
                                       "{\"k\":\"commit\",\"step\":%lld,\"epoch\":%llu,\"hash\":"
                                       "\"%s\",\"members\":\"%llx\",\"how\":\"%s\"}",
                                       (long long)step, (unsigned long long)c->epoch, hh,
                                       (unsigned long long)members, how));
        c->journal_committed = step;
    }
    /* The fault lab's crash at the worst moment: decided (and recorded,
     * with a journal), heard by no one. */
    const char *crash = getenv("LOCO_COORD_CRASH_AFTER_COMMIT");
    if (crash && *crash && !strcmp(how, "commit") && strtoll(crash, NULL, 10) == step) {
        loco_warn("coordinator: LOCO_COORD_CRASH_AFTER_COMMIT=%s: SIGKILL after the record of "
                  "outer step %lld",
                  crash, (long long)step);
        raise(SIGKILL);
    }
    return 0;
}
