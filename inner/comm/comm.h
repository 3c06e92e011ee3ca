/* inner/comm/ — the island communicator: one interface, backends behind an
 * ops table. `self` is one rank and touches nothing; `mpi` runs over MPI
 * (host buffers) and is how `mpirun` / `srun` launch an island; `nccl`
 * (device buffers, in a build with nvcc and nccl.h) fills the same table:
 * inner/comm/nccl.cu states where it differs (no tags; buffers written on
 * the compute stream are ordered by events, others must be ready before a
 * call).
 *
 * Conventions of every call below:
 * - Functions return 0 or a negative LOCO_E* code with a message
 *   (loco_errmsg()); MPI failures are LOCO_EMPI naming the MPI call.
 * - Collectives are called by every rank of the communicator, in the same
 *   order, with the same count / counts arrays / dtype / op / root.
 * - Counts are in elements of `dt`. Buffers are host memory and must not
 *   overlap unless a call says otherwise; a buffer may be NULL when its
 *   element count is 0.
 * - A communicator is used by one thread at a time (MPI_THREAD_SERIALIZED).
 * - Non-blocking calls (loco_comm_i*) start the operation and hand back a
 *   request; the buffers belong to the operation until loco_comm_wait on
 *   that request returns (the counts arrays may be reused at once). Every
 *   request must be waited on before its communicator is destroyed.
 * - The mpi backend passes int counts to MPI: contiguous operations
 *   (allreduce, broadcast, send/recv) are cut into pieces of at most
 *   loco_comm_chunk() elements, so any size_t count works; the v-operations
 *   (reduce_scatter, allgather, alltoall, alltoallv) need every count and the
 *   sum of counts on each side to fit in an int, else LOCO_EINVAL (split the
 *   call: ZeRO and MoE buckets do). */
#ifndef LOCO_COMM_H
#define LOCO_COMM_H

#include "core/core.h"

typedef struct loco_comm loco_comm;
typedef struct loco_comm_req loco_comm_req;

/* Element types. */
typedef enum {
    LOCO_DT_F32 = 0,
    LOCO_DT_F64 = 1,
    LOCO_DT_I32 = 2,
    LOCO_DT_I64 = 3,
    LOCO_DT_U8 = 4,
    LOCO_DT_COUNT
} loco_comm_dtype;

/* Reductions. AVG is the sum divided by the group size, done after the sum
 * (x / size: IEEE division for floats, C division truncating toward zero for
 * integers); integer sums wrap as MPI's do, so keep integer AVG/SUM inputs
 * small enough not to overflow. */
typedef enum { LOCO_OP_SUM = 0, LOCO_OP_AVG = 1, LOCO_OP_MAX = 2, LOCO_OP_COUNT } loco_comm_op;

/* Thread support the backend provides (MPI's levels, in order). */
typedef enum {
    LOCO_COMM_THREAD_SINGLE = 0,
    LOCO_COMM_THREAD_FUNNELED = 1,
    LOCO_COMM_THREAD_SERIALIZED = 2,
    LOCO_COMM_THREAD_MULTIPLE = 3,
} loco_comm_thread_level;

/* loco_comm_split: this rank joins no new group (MPI_UNDEFINED). */
#define LOCO_COMM_COLOR_NONE (-1)
/* Largest tag of send/recv (the least MPI_TAG_UB that MPI guarantees). */
#define LOCO_COMM_TAG_MAX 32767

/* Bytes per element of dt; 0 for a value outside the enum. */
size_t loco_comm_dtype_size(loco_comm_dtype dt);
/* "f32", "f64", "i32", "i64", "u8"; "?" outside the enum. */
const char *loco_comm_dtype_name(loco_comm_dtype dt);
/* "sum", "avg", "max"; "?" outside the enum. */
const char *loco_comm_op_name(loco_comm_op op);

/* ------------------------------------------------------------- lifecycle */

/* Makes the communicator of every rank this process was launched with.
 * backend: "self" (one rank; never touches MPI), "mpi" (MPI_COMM_WORLD,
 * initialising MPI on first use with MPI_Init_thread(SERIALIZED)), or "auto"
 * / NULL: mpi when a launcher started this process (OMPI_COMM_WORLD_SIZE,
 * PMI_SIZE, PMIX_RANK or SLURM_STEP_NUM_TASKS in the environment) and this
 * build has MPI, else self. "auto" refuses (LOCO_ENOTSUP) a launch of
 * several ranks in a build without MPI rather than training N copies of
 * rank 0. "nccl": NCCL over every rank of an auto communicator, one device
 * each (local rank modulo the devices); LOCO_ENOTSUP in a build without
 * NCCL, LOCO_ECUDA without a device. Anything else is LOCO_EINVAL. Each
 * call returns a new communicator (an MPI_Comm_dup of the world), which the
 * caller destroys. */
int loco_comm_world(loco_comm **out, const char *backend);

/* Frees a communicator (world or split); accepts NULL. Outstanding
 * requests on it must have been waited on. When the last mpi communicator
 * goes and loco initialised MPI, MPI is finalized: this process cannot make
 * an mpi communicator afterwards (MPI forbids a second MPI_Init). */
void loco_comm_destroy(loco_comm *c);

/* Failure path: brings down every rank of c's job (MPI_Abort, does not
 * return). The self backend has no other rank and returns 0; the caller
 * then exits. */
int loco_comm_abort(loco_comm *c, int exit_code);

int loco_comm_rank(const loco_comm *c); /* 0 .. size-1 */
int loco_comm_size(const loco_comm *c);
const char *loco_comm_backend(const loco_comm *c); /* "self", "mpi" */
loco_comm_thread_level loco_comm_thread_support(const loco_comm *c);

/* Largest element count one backend call moves in the contiguous operations
 * (allreduce, broadcast, send, recv); larger ones are cut into pieces of
 * this size, issued in order. Default and maximum: INT_MAX on mpi, SIZE_MAX
 * on self. n = 0 restores the default; n above the maximum is LOCO_EINVAL.
 * Must be the same on every rank (a collective setting, local call). */
int loco_comm_set_chunk(loco_comm *c, size_t n);
size_t loco_comm_chunk(const loco_comm *c);

/* Splits c into groups of the ranks that pass the same color (>= 0, or
 * LOCO_COMM_COLOR_NONE to join none: *out = NULL), ranked by key then by
 * rank in c (MPI_Comm_split). Collective over c. The caller destroys *out. */
int loco_comm_split(loco_comm *c, int color, int key, loco_comm **out);

/* ------------------------------------------------------------ collectives */

/* In place over buf (count elements): every rank ends with op over all
 * ranks' buffers. */
int loco_comm_allreduce(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, loco_comm_op op);

/* send holds sum(counts) elements, ranks' blocks in rank order; rank r
 * receives in recv the op over all ranks of block r (counts[r] elements).
 * counts has size(c) entries, identical on every rank; blocks may be
 * uneven or empty. send == recv is allowed (in place: the result lands at
 * the start of the buffer). */
int loco_comm_reduce_scatter(loco_comm *c, const void *send, void *recv, const size_t *counts,
                             loco_comm_dtype dt, loco_comm_op op);

/* Gathers every rank's send (counts[rank] elements) into recv
 * (sum(counts) elements, blocks in rank order) on every rank: allgatherv.
 * counts has size(c) entries, identical on every rank. In place: send may
 * be recv + (sum of counts before this rank), i.e. this rank's own block. */
int loco_comm_allgather(loco_comm *c, const void *send, void *recv, const size_t *counts,
                        loco_comm_dtype dt);

/* Copies root's buf (count elements) into buf on every rank. */
int loco_comm_broadcast(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int root);

/* Point to point with another rank of c (peer != own rank: LOCO_EINVAL,
 * also on the self backend, which has no peers). Messages between two ranks
 * with one tag (0..LOCO_COMM_TAG_MAX) arrive in order. recv must name the
 * exact count sent: a shorter message is LOCO_EPROTO, a longer one LOCO_EMPI
 * (MPI_ERR_TRUNCATE). A blocking send may wait for the matching recv. */
int loco_comm_send(loco_comm *c, const void *buf, size_t count, loco_comm_dtype dt, int peer,
                   int tag);
int loco_comm_recv(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int peer, int tag);

/* Rank r sends sendcounts[j] elements to rank j (blocks of send in rank
 * order, displacements = prefix sums) and receives recvcounts[j] elements
 * from rank j into recv (same layout). sendcounts[j] on rank r must equal
 * recvcounts[r] on rank j. */
int loco_comm_alltoallv(loco_comm *c, const void *send, const size_t *sendcounts, void *recv,
                        const size_t *recvcounts, loco_comm_dtype dt);
/* alltoallv with every count = count (send and recv hold size*count). */
int loco_comm_alltoall(loco_comm *c, const void *send, void *recv, size_t count,
                       loco_comm_dtype dt);

/* Returns once every rank of c has entered it. */
int loco_comm_barrier(loco_comm *c);

/* ------------------------------------------------------------ non-blocking */

/* The same operations, started: on success *req is a new request (never
 * NULL) that loco_comm_wait completes and frees; on failure *req = NULL and
 * nothing is pending. For AVG the division happens at completion, so buf
 * holds partial sums until then. */
int loco_comm_iallreduce(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, loco_comm_op op,
                         loco_comm_req **req);
int loco_comm_ireduce_scatter(loco_comm *c, const void *send, void *recv, const size_t *counts,
                              loco_comm_dtype dt, loco_comm_op op, loco_comm_req **req);
int loco_comm_iallgather(loco_comm *c, const void *send, void *recv, const size_t *counts,
                         loco_comm_dtype dt, loco_comm_req **req);
int loco_comm_ibroadcast(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int root,
                         loco_comm_req **req);
int loco_comm_isend(loco_comm *c, const void *buf, size_t count, loco_comm_dtype dt, int peer,
                    int tag, loco_comm_req **req);
int loco_comm_irecv(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int peer, int tag,
                    loco_comm_req **req);
int loco_comm_ialltoallv(loco_comm *c, const void *send, const size_t *sendcounts, void *recv,
                         const size_t *recvcounts, loco_comm_dtype dt, loco_comm_req **req);
int loco_comm_ialltoall(loco_comm *c, const void *send, void *recv, size_t count,
                        loco_comm_dtype dt, loco_comm_req **req);

/* Completes a request and frees it, also when it fails (the error is the
 * operation's: MPI failure, short message). NULL is a no-op returning 0. */
int loco_comm_wait(loco_comm_req *req);
/* Waits on n requests in order, frees all of them and sets the entries to
 * NULL (NULL entries are skipped); returns the first failure. */
int loco_comm_waitall(loco_comm_req **reqs, int n);
/* Sets *done when the request has completed (its buffers are final) without
 * blocking; the request stays alive until loco_comm_wait, which then
 * returns at once. A failure here is the operation's; wait still frees. */
int loco_comm_test(loco_comm_req *req, bool *done);

#endif /* LOCO_COMM_H */
