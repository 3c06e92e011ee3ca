/* What data.c (the loader) and data_prep.c (the writer and preparation)
 * share; included by inner/data/ only. */
#ifndef LOCO_INNER_DATA_INTERNAL_H
#define LOCO_INNER_DATA_INTERNAL_H

#include "inner/data/data.h"

#define SHARD_HEADER_BYTES ((int64_t)LOCO_SHARD_HEADER_INTS * 4)

/* Reads exactly len bytes at off; a short read (file shrank) is LOCO_EPROTO
 * naming path. */
int loco__data_pread_full(int fd, const char *path, void *buf, size_t len, int64_t off);
/* A NUL-terminated copy of s[0 .. n) (loco_free), NULL without memory. */
char *loco__data_str_dup(const char *s, size_t n);

#endif /* LOCO_INNER_DATA_INTERNAL_H */
