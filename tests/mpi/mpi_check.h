/* What the standalone checks run under mpirun share: a tally of checks and
 * CHECK, which counts one and, when it fails, says where on which rank.
 * Each program defines g_rank and prints the tally its Criterion test
 * reads (" N passed, M failed"). */
#ifndef LOCO_TESTS_MPI_CHECK_H
#define LOCO_TESTS_MPI_CHECK_H

#include <stdio.h>

static long n_pass, n_fail;
static int g_rank; /* in the world, for messages */

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            n_pass++;                                                                              \
        } else {                                                                                   \
            n_fail++;                                                                              \
            fprintf(stderr, "[rank %d] FAIL %s:%d: ", g_rank, __FILE__, __LINE__);                 \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

#endif
