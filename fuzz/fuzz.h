/* What the file-reading fuzz targets share: a private scratch directory
 * (on /dev/shm where there is one: a target writes a file per input) that
 * goes when the process exits. */
#ifndef LOCO_FUZZ_H
#define LOCO_FUZZ_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

static char fuzz_dir_[64];

static void fuzz_rm_dir_(void) {
    loco_rmtree(fuzz_dir_);
}

/* The scratch directory, made on first use. */
static const char *fuzz_dir(void) {
    if (!fuzz_dir_[0]) {
        snprintf(fuzz_dir_, sizeof fuzz_dir_, "/dev/shm/loco-fuzz-XXXXXX");
        if (!mkdtemp(fuzz_dir_)) {
            snprintf(fuzz_dir_, sizeof fuzz_dir_, "/tmp/loco-fuzz-XXXXXX");
            if (!mkdtemp(fuzz_dir_))
                abort();
        }
        atexit(fuzz_rm_dir_);
    }
    return fuzz_dir_;
}

/* Writes bytes to dir/name (dir NULL: the scratch directory); the path goes
 * to out. */
static void fuzz_write(const char *dir, const char *name, const void *data, size_t size, char *out,
                       size_t cap) {
    snprintf(out, cap, "%s/%s", dir ? dir : fuzz_dir(), name);
    FILE *f = fopen(out, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f))
        abort();
}

#endif
