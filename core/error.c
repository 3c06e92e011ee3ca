/* Error codes and this thread's message with breadcrumbs. */
#include "core/core.h"

#include <string.h>

#define ERR_MSG_MAX 4096

static _Thread_local char err_msg[ERR_MSG_MAX];

const char *loco_strerror(int rc) {
    switch (rc) {
    case LOCO_OK: return "LOCO_OK: success";
    case LOCO_EINVAL: return "LOCO_EINVAL: invalid argument or input";
    case LOCO_ENOMEM: return "LOCO_ENOMEM: out of memory";
    case LOCO_EIO: return "LOCO_EIO: I/O error";
    case LOCO_ETIMEDOUT: return "LOCO_ETIMEDOUT: timed out";
    case LOCO_EPROTO: return "LOCO_EPROTO: malformed data";
    case LOCO_EAUTH: return "LOCO_EAUTH: authentication failed";
    case LOCO_EPEER: return "LOCO_EPEER: peer failed";
    case LOCO_ECUDA: return "LOCO_ECUDA: CUDA error";
    case LOCO_ENCCL: return "LOCO_ENCCL: NCCL error";
    case LOCO_EMPI: return "LOCO_EMPI: MPI error";
    case LOCO_ENOTSUP: return "LOCO_ENOTSUP: not supported";
    case LOCO_EREFUSED: return "LOCO_EREFUSED: refused a peer's data";
    default: return "unknown loco error code";
    }
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int loco__err_set(int rc, const char *file, int line, const char *fmt, ...) {
    /* Formatted aside first: the arguments may include loco_errmsg(). */
    char tmp[sizeof err_msg];
    int n = snprintf(tmp, sizeof tmp, "%s:%d: ", base_name(file), line);
    if (n < 0 || n >= (int)sizeof tmp)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp + n, sizeof tmp - (size_t)n, fmt, ap);
    va_end(ap);
    memcpy(err_msg, tmp, sizeof err_msg);
    return rc;
}

void loco__err_trace(const char *file, int line, const char *expr) {
    size_t len = strlen(err_msg);
    if (len >= sizeof err_msg - 1)
        return;
    snprintf(err_msg + len, sizeof err_msg - len, "\n  at %s:%d (%.80s)",
             base_name(file), line, expr);
}

const char *loco_errmsg(void) { return err_msg; }

void loco_err_clear(void) { err_msg[0] = '\0'; }
