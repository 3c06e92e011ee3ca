/* The pipeline schedule's representation, shared by its generators
 * (inner/parallel/schedule.c) and its simulator (inner/parallel/simulate.c).
 * Not for use outside them: everyone else goes through parallel.h. */
#ifndef LOCO_SCHEDULE_INTERNAL_H
#define LOCO_SCHEDULE_INTERNAL_H

#include "inner/parallel/parallel.h"

/* Sizes a schedule may have: beyond any real pipeline, small enough that
 * the lists stay a few hundred MB at worst. */
#define PP_MAX_RANKS 1024
#define PP_MAX_VIRTUAL 64
#define PP_MAX_MICRO 65536
#define PP_MAX_UNITS (1 << 22) /* p * v * m, each (mb, chunk) one unit */
/* Actions of one (mb, chunk) on its rank: F, B and W (or BW), and at most
 * two receives and two sends. */
#define PP_ACTIONS_PER_UNIT 7
/* Stuck ranks a deadlock message describes before "and N more". */
#define PP_DEADLOCK_NAMED 4

struct loco_pp_schedule {
    char name[32];
    int p, v, m, n_chunks;
    int *chunk_rank;        /* [n_chunks] */
    int *len;               /* [p] actions in each rank's list */
    loco_pp_action **lists; /* [p] rows of slab */
    loco_pp_action *slab;   /* [p * cap] */
};

static inline int loco__pp_imin(int a, int b) {
    return a < b ? a : b;
}
static inline int loco__pp_imax(int a, int b) {
    return a > b ? a : b;
}

#endif /* LOCO_SCHEDULE_INTERNAL_H */
