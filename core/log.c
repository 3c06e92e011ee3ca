/* Leveled logging to stderr with a wall-clock timestamp. */
#include "core/core.h"

#include <string.h>
#include <time.h>

static loco_log_level log_level = LOCO_LOG_INFO;
static const char *level_names[] = {"error", "warn", "info", "debug"};

void loco_log_set_level(loco_log_level level) { log_level = level; }
loco_log_level loco_log_get_level(void) { return log_level; }

int loco_log_parse_level(const char *s, loco_log_level *out) {
    for (int i = 0; i <= LOCO_LOG_DEBUG; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (loco_log_level)i;
            return 0;
        }
    }
    return LOCO_ERR(LOCO_EINVAL, "unknown log level '%s' (expected error|warn|info|debug)", s);
}

void loco_log(loco_log_level level, const char *fmt, ...) {
    if (level > log_level || level < LOCO_LOG_ERROR)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char line[2048];
    int n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03ld %-5s ", tm.tm_hour,
                     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, level_names[level]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line); /* one write per line, whole */
}
