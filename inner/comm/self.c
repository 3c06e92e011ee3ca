/* The self backend: one rank, no dependency. Reductions over one rank are
 * the identity (also AVG: the sum divided by 1), the scatter/gather family
 * copies, broadcast from root 0 does nothing, and there are no peers for
 * send/recv (the front end refuses them). Every operation completes at
 * once, so requests carry no backend state. */
#include "inner/comm/internal.h"

#include <stdint.h>
#include <string.h>

static void copy(void *dst, const void *src, size_t count, loco_comm_dtype dt) {
    if (count > 0 && dst != src)
        memmove(dst, src, count * loco_comm_dtype_size(dt));
}

static int self_allreduce(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt,
                          loco_comm_op op, loco_comm_req *req) {
    return 0;
}

static int self_reduce_scatter(loco_comm *c, const void *send, void *recv, const size_t *counts,
                               loco_comm_dtype dt, loco_comm_op op, loco_comm_req *req) {
    copy(recv, send, counts[0], dt);
    return 0;
}

static int self_allgather(loco_comm *c, const void *send, void *recv, const size_t *counts,
                          loco_comm_dtype dt, loco_comm_req *req) {
    copy(recv, send, counts[0], dt);
    return 0;
}

static int self_broadcast(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int root,
                          loco_comm_req *req) {
    return 0;
}

static int self_send(loco_comm *c, const void *buf, size_t count, loco_comm_dtype dt, int peer,
                     int tag, loco_comm_req *req) {
    return LOCO_ERR(LOCO_EINVAL, "self backend has no peers");
}

static int self_recv(loco_comm *c, void *buf, size_t count, loco_comm_dtype dt, int peer, int tag,
                     loco_comm_req *req) {
    return LOCO_ERR(LOCO_EINVAL, "self backend has no peers");
}

static int self_alltoallv(loco_comm *c, const void *send, const size_t *sendcounts, void *recv,
                          const size_t *recvcounts, loco_comm_dtype dt, loco_comm_req *req) {
    if (sendcounts[0] != recvcounts[0])
        return LOCO_ERR(LOCO_EINVAL,
                        "alltoallv: rank 0 sends %zu elements to itself but expects %zu",
                        sendcounts[0], recvcounts[0]);
    copy(recv, send, sendcounts[0], dt);
    return 0;
}

static int self_barrier(loco_comm *c) {
    return 0;
}

static int self_split(loco_comm *c, int color, int key, loco_comm **out) {
    if (color == LOCO_COMM_COLOR_NONE)
        return 0;
    LOCO_CHECK(loco__comm_self_new(out));
    return 0;
}

static int self_wait(loco_comm_req *req) {
    return 0;
}

static int self_test(loco_comm_req *req, bool *done) {
    *done = true;
    return 0;
}

static int self_abort(loco_comm *c, int exit_code) {
    return 0;
}

static void self_destroy(loco_comm *c) {}

static const loco__comm_ops self_ops = {
    .name = "self",
    .allreduce = self_allreduce,
    .reduce_scatter = self_reduce_scatter,
    .allgather = self_allgather,
    .broadcast = self_broadcast,
    .send = self_send,
    .recv = self_recv,
    .alltoallv = self_alltoallv,
    .barrier = self_barrier,
    .split = self_split,
    .wait = self_wait,
    .test = self_test,
    .abort = self_abort,
    .destroy = self_destroy,
};

int loco__comm_self_new(loco_comm **out) {
    LOCO_CHECK(loco__comm_new(out, &self_ops, 0, 1, SIZE_MAX, LOCO_COMM_THREAD_SERIALIZED, NULL));
    return 0;
}
