/* The one allocation wrapper, with failure injection for tests. */
#include "core/core.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_long fail_countdown; /* 0 = disarmed */

void loco_alloc_fail_after(long n) { atomic_store(&fail_countdown, n); }

void *loco_alloc(size_t bytes) {
    long c = atomic_load(&fail_countdown);
    if (c > 0 && atomic_fetch_sub(&fail_countdown, 1) == 1)
        return NULL;
    void *p = NULL;
    if (bytes == 0)
        bytes = 1;
    if (posix_memalign(&p, 64, bytes) != 0)
        return NULL;
    memset(p, 0, bytes);
    return p;
}

void loco_free(void *p) { free(p); }
