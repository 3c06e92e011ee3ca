/* The one allocation wrapper: 64-byte aligned, zeroed, counted (so memory
 * benchmarks report what was really allocated), with failure injection for
 * tests. */
#include "core/core.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define HEADER 64 /* keeps the caller's pointer 64-byte aligned */

static atomic_long fail_countdown; /* 0 = disarmed */
static atomic_size_t live_bytes;

void loco_alloc_fail_after(long n) { atomic_store(&fail_countdown, n); }

size_t loco_alloc_live_bytes(void) { return atomic_load(&live_bytes); }

void *loco_alloc(size_t bytes) {
    long c = atomic_load(&fail_countdown);
    if (c > 0 && atomic_fetch_sub(&fail_countdown, 1) == 1)
        return NULL;
    if (bytes > SIZE_MAX - HEADER)
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes + HEADER) != 0)
        return NULL;
    memset(p, 0, bytes + HEADER);
    *(size_t *)p = bytes;
    atomic_fetch_add(&live_bytes, bytes);
    return (char *)p + HEADER;
}

void loco_free(void *p) {
    if (!p)
        return;
    char *base = (char *)p - HEADER;
    atomic_fetch_sub(&live_bytes, *(size_t *)base);
    free(base);
}
