/* outer/ internals shared by outer.c (the host path and the step's
 * bookkeeping) and outer_device.c (device mode): the state of one range. */
#ifndef LOCO_OUTER_INTERNAL_H
#define LOCO_OUTER_INTERNAL_H
#include "outer/outer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef LOCO_HAVE_CUDA
#include <pthread.h>

/* Device mode (loco_outer_create_device): the state of the range on the
 * GPU. Every device call of the state runs under mu (the pipelined
 * exchange encodes on a sender thread while this one decodes), on the
 * compute stream, so it is ordered with the trainer's steps, and on
 * `device` (made current first: a new thread starts on device 0). */
typedef struct outer_dev {
    loco_cuda_slab *slab;
    loco_stream s;
    int device;           /* the creating thread's current device */
    pthread_mutex_t mu;
    float *theta, *mom, *theta_bak, *mom_bak, *avg, *ef; /* (n) ef: NULL without EF */
    float *delta, *prev;  /* (chunk elements) one chunk's Δ; avg before a share */
    float *sample;        /* (SAMPLE_N) zstd=auto's sample of Δ */
    uint8_t *pay;         /* (raw_cap) one chunk's raw payload */
    void *topk_work;      /* (loco_topk_work_bytes(chunk k)) codec topk's selection */
    uint32_t *bad;        /* (2) non-finite flags */
    double *ss;           /* (1 + parts of a chunk) the share's sum of squares */
    size_t raw_cap;
    uint8_t *hpay;        /* (workers × raw_cap) host copies of the payloads */
    bool theta_cur, mom_cur, ef_cur; /* the host mirrors are current */
} outer_dev;
#endif

struct loco_outer {
    loco_outer_params p;
    size_t n;
    float *theta;   /* (n) θ_global */
    float *mom;     /* (n) Nesterov momentum */
    float *delta;   /* (n) this rank's pseudo-gradient */
    float *avg;     /* (n) weighted sum of the decoded contributions */
    loco_codec *codec;
    unsigned char *enc;  /* encoded chunks, packed back to back */
    size_t enc_cap;
    loco_chunk_ref *refs;
    size_t refs_cap;
    int expect, added;   /* contributions announced / added whole */
    /* Per contribution: its weight in the average (1/K, or its tokens over
     * the sum: loco_outer_set_weights) and the factor that undoes it for the
     * norm check (K, or the sum over its tokens). */
    float scale[LOCO_MAX_PEERS];
    double unscale[LOCO_MAX_PEERS];
    loco_encode_plan plan;
    int *chunk_next;     /* (refs_cap) next island expected per chunk */
    size_t chunks_done;  /* chunks that received every contribution */
    /* Reduce-scatter + all-gather: each reducer re-encodes its averaged
     * chunks (codec2: no error feedback) and everyone decodes every chunk
     * from its reducer's bytes into avg2, so all islands apply equal values. */
    loco_codec *codec2;
    float *avg2;          /* (n) */
    unsigned char *enc2;  /* (enc_cap) */
    loco_encode_plan plan2;
    bool use_avg2;
    unsigned char *final_have; /* (refs_cap) chunk decoded into avg2 */
    unsigned char *applied;    /* (refs_cap) chunk's outer update done */
    size_t final_done;
    size_t *enc_len;           /* (refs_cap) bytes of each encoded chunk, for a redo */
    /* Double buffers: the outer update reads θ_global and momentum and
     * writes the next ones into theta_bak / mom_bak, and the pointers swap
     * when every chunk is done. A step redone in a new quorum epoch then
     * finds the state before the step intact (swapping back if the step had
     * finished here), at no extra memory traffic. */
    float *theta_bak, *mom_bak;
    bool swapped; /* the update of the current step was completed here */
    /* The pipelined path works chunk by chunk: Δ of a chunk is computed
     * right before it is encoded, and a chunk of avg zeroed right before
     * its first contribution, so no whole-shard pass delays the first
     * bytes on the wire. */
    const float *theta_local; /* of the current plan */
    float *chunk_delta; /* (workers × chunk elements) Δ of the chunk being encoded */
    int workers;
    unsigned char *avg_zeroed, *avg2_zeroed; /* (refs_cap) */
    float *sample;            /* (SAMPLE_N) Δ at spread positions, for zstd=auto */
    /* Contribution check: each island's share of the chunk being reduced
     * (its decoded values are the change it made to avg, before them kept
     * in chunk_prev), as a sum of squares and whether all were finite. */
    float *chunk_prev;               /* (chunk elements) */
    double sumsq[LOCO_MAX_PEERS];
    bool nonfinite[LOCO_MAX_PEERS];
    int refused;                     /* island refused by the last check, -1 */
    double worst_ratio;              /* largest norm / median of the others this step */
    float poison, poison_next;       /* fault lab: Δ sent times this (1: none), this plan / next */
    /* Device mode: theta, mom and the codec's EF are host mirrors of the
     * device state, copied when read; pcie counts the bytes copied between
     * host and device (both ways) since loco_outer_take_pcie_bytes. */
    bool on_dev;
    uint64_t pcie;
#ifdef LOCO_HAVE_CUDA
    outer_dev *d;
#endif
};

#define SAMPLE_PIECES 8
#define SAMPLE_PIECE 4096
#define SAMPLE_N (SAMPLE_PIECES * SAMPLE_PIECE)

/* The host mirrors of the device mode are caches that a const state may
 * refresh (theta, mom: which); a failed copy is logged (outer.c). */
void loco__outer_mirror(const loco_outer *o, bool theta, bool mom);

/* Device mode (outer_device.c); without CUDA, the mirrors are always
 * current and the rest is never called (o->on_dev stays false). */
int loco__outer_sync_ef(loco_outer *o);
int loco__outer_sync_theta(loco_outer *o);
int loco__outer_dev_apply_range(loco_outer *o, size_t lo, size_t hi, float *theta_local);
int loco__outer_upload_state(loco_outer *o);
int loco__outer_upload_ef(loco_outer *o);
int loco__outer_dev_sample(loco_outer *o, const float *tl, size_t m);
int loco__outer_sync_mom(loco_outer *o);
int loco__outer_dev_encode_chunk(loco_outer *o, int worker, size_t chunk, size_t *len);
int loco__outer_dev_add_chunk(loco_outer *o, int worker, int island, size_t c, const void *bytes,
                         size_t len);
int loco__outer_dev_finish(loco_outer *o);

/* LOCO_EINVAL naming `what` in the device mode (host-path-only calls). */
int loco__outer_host_only(const loco_outer *o, const char *what);
/* [lo, hi) of chunk c of the codec's chunking. */
void loco__outer_chunk_range(const loco_outer *o, size_t c, size_t *lo, size_t *hi);

#endif
