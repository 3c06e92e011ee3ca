/* JSONL metrics: one object per line, flushed per record so a crash loses at
 * most the record being built. */
#include "core/core.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/time.h>
#include <unistd.h>
#include <math.h>
#include <string.h>

struct loco_metrics {
    FILE *f;
    cJSON *rec;
};

int loco_metrics_open(loco_metrics **out, const char *path, bool append) {
    *out = NULL;
    loco_metrics *m = loco_alloc(sizeof *m);
    if (!m)
        return LOCO_ERR(LOCO_ENOMEM, "metrics handle");
    m->f = fopen(path, append ? "a" : "w");
    if (!m->f) {
        loco_free(m);
        return LOCO_ERR(LOCO_EIO, "%s: cannot open metrics: %s", path, strerror(errno));
    }
    *out = m;
    return 0;
}

void loco_metrics_close(loco_metrics *m) {
    if (!m)
        return;
    cJSON_Delete(m->rec);
    fclose(m->f);
    loco_free(m);
}

void loco_metrics_begin(loco_metrics *m) {
    if (!m)
        return;
    cJSON_Delete(m->rec);
    m->rec = cJSON_CreateObject();
}

void loco_metrics_int(loco_metrics *m, const char *key, int64_t v) {
    if (!m)
        return;
    cJSON_AddNumberToObject(m->rec, key, (double)v);
}

void loco_metrics_ints(loco_metrics *m, const char *key, const int64_t *v, int n) {
    if (!m)
        return;
    cJSON *a = cJSON_AddArrayToObject(m->rec, key);
    for (int i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
}

void loco_metrics_num(loco_metrics *m, const char *key, double v) {
    if (!m)
        return;
    if (isfinite(v))
        cJSON_AddNumberToObject(m->rec, key, v);
    else
        cJSON_AddNullToObject(m->rec, key); /* JSON has no NaN */
}

void loco_metrics_str(loco_metrics *m, const char *key, const char *v) {
    if (!m)
        return;
    cJSON_AddStringToObject(m->rec, key, v);
}

int loco_metrics_end(loco_metrics *m) {
    if (!m)
        return 0;
    if (!m->rec)
        return LOCO_ERR(LOCO_ENOMEM, "metrics record");
    char *s = cJSON_PrintUnformatted(m->rec);
    cJSON_Delete(m->rec);
    m->rec = NULL;
    if (!s)
        return LOCO_ERR(LOCO_ENOMEM, "metrics line");
    int ok = fprintf(m->f, "%s\n", s) >= 0 && fflush(m->f) == 0;
    cJSON_free(s);
    return ok ? 0 : LOCO_ERR(LOCO_EIO, "metrics write failed: %s", strerror(errno));
}

int loco_event_append(const char *path, const char *fields_fmt, ...) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    char line[2048];
    int n = snprintf(line, sizeof line, "{\"t\":%.3f,", (double)tv.tv_sec + tv.tv_usec / 1e6);
    va_list ap;
    va_start(ap, fields_fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 2, fields_fmt, ap);
    va_end(ap);
    if (m < 0 || (size_t)(n + m) >= sizeof line - 2)
        return LOCO_ERR(LOCO_EINVAL, "event for %s: longer than %zu bytes", path, sizeof line);
    n += m;
    line[n++] = '}';
    line[n++] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return LOCO_ERR(LOCO_EIO, "open %s: %s", path, strerror(errno));
    ssize_t w = write(fd, line, (size_t)n);
    close(fd);
    return w == n ? 0 : LOCO_ERR(LOCO_EIO, "write %s: %s", path, strerror(errno));
}
