/* The nccl comm backend on one rank (no launcher: bootstrapped through the
 * self communicator), device buffers: every operation runs through NCCL and
 * the front end's argument checks. Several ranks need several devices and
 * mpirun: scripts/gpu-check.sh. Skips, with the reason, without NCCL in the
 * build or without a device. */
#include <criterion/criterion.h>

#ifndef LOCO_HAVE_NCCL
Test(gpu_nccl, skipped)
{
    cr_skip_test("built without NCCL (needs nvcc and nccl.h at build time): "
                 "the nccl comm backend is not compiled");
}
#else

#include "inner/comm/comm.h"
#include "tests/gpu/gpu_test.h"

Test(gpu_nccl, no_device_is_a_clear_error)
{
    int n = 0;
    if (loco_cuda_device_count(&n) == 0)
        cr_skip_test("a device is present: the failure path cannot be taken");
    loco_comm *c = (loco_comm *)&c;
    cr_expect_eq(loco_comm_world(&c, "nccl"), LOCO_ECUDA);
    cr_expect_null(c);
    cr_expect(strstr(loco_errmsg(), "no CUDA device") != NULL, "%s", loco_errmsg());
}

Test(gpu_nccl, one_rank_operations)
{
    gpu_env e;
    gpu_env_init(&e, 1 << 20);
    loco_comm *c = NULL, *sub = NULL;
    GPU_OK(loco_comm_world(&c, "nccl"));
    cr_assert_str_eq(loco_comm_backend(c), "nccl");
    cr_assert_eq(loco_comm_rank(c), 0);
    cr_assert_eq(loco_comm_size(c), 1);
    uint64_t s = 31;
    const size_t n = 1001;
    float *x = rand_f(&s, n, 1.0), *y = malloc(n * 4);
    float *d = dup_to_dev(&e, x, n * 4), *d2 = dalloc(&e, n * 4);
    GPU_OK(loco_comm_allreduce(c, d, n, LOCO_DT_F32, LOCO_OP_SUM));
    GPU_OK(loco_comm_allreduce(c, d, n, LOCO_DT_F32, LOCO_OP_AVG));
    GPU_OK(loco_comm_allreduce(c, d, n, LOCO_DT_F32, LOCO_OP_MAX));
    size_t counts[1] = {n};
    GPU_OK(loco_comm_reduce_scatter(c, d, d, counts, LOCO_DT_F32, LOCO_OP_SUM));
    GPU_OK(loco_comm_allgather(c, d, d2, counts, LOCO_DT_F32));
    GPU_OK(loco_comm_broadcast(c, d2, n, LOCO_DT_F32, 0));
    GPU_OK(loco_comm_alltoall(c, d2, d, n, LOCO_DT_F32));
    GPU_OK(loco_comm_barrier(c));
    loco_comm_req *r = NULL;
    bool done = false;
    GPU_OK(loco_comm_iallreduce(c, d, n, LOCO_DT_F32, LOCO_OP_SUM, &r));
    GPU_OK(loco_comm_test(r, &done));
    GPU_OK(loco_comm_wait(r));
    to_host(y, d, n * 4);
    cr_expect_eq(memcmp(x, y, n * 4), 0, "one rank: every operation must leave x as it was");
    GPU_OK(loco_comm_split(c, 0, 0, &sub));
    cr_assert_not_null(sub);
    cr_expect_eq(loco_comm_size(sub), 1);
    GPU_OK(loco_comm_allreduce(sub, d, n, LOCO_DT_F32, LOCO_OP_SUM));
    loco_comm_destroy(sub);
    GPU_OK(loco_comm_split(c, LOCO_COMM_COLOR_NONE, 0, &sub));
    cr_expect_null(sub);
    loco_comm_destroy(c);
    free(x), free(y);
    gpu_env_fini(&e);
}

#endif /* LOCO_HAVE_NCCL */
