/* Which outer path an island runs (loco_island_outer_on_device): the
 * device only with train.device = cuda, one rank, one fragment without
 * overlap or merge, all-gather, in a CUDA build; the host otherwise, with
 * the reason loco_info prints. */
#include "outer/outer.h"

#include <criterion/criterion.h>
#include <string.h>

static loco_config base(void) {
    loco_config c;
    loco_config_defaults(&c);
    snprintf(c.train.device, sizeof c.train.device, "cuda");
    snprintf(c.outer.algorithm, sizeof c.outer.algorithm, "allgather");
    return c;
}

static void expect_host(const loco_config *c, int ranks, const char *reason) {
    char why[160] = "";
    cr_expect_not(loco_island_outer_on_device(c, ranks, why, sizeof why), "%s", why);
    cr_expect(strstr(why, "on the host: ") == why, "%s", why);
    cr_expect(strstr(why, reason), "expected \"%s\" in \"%s\"", reason, why);
}

Test(outer_device_path, cpu_training_takes_the_host_path) {
    loco_config c = base();
    snprintf(c.train.device, sizeof c.train.device, "cpu");
    expect_host(&c, 1, "train.device = cpu");
    loco_config d;
    loco_config_defaults(&d); /* the defaults: cpu, algorithm auto */
    expect_host(&d, 1, "train.device = cpu");
}

Test(outer_device_path, several_ranks_streaming_or_rsag_take_the_host_path) {
    loco_config c = base();
    expect_host(&c, 2, "more than one rank");
    c = base();
    c.outer.fragments = 2;
    expect_host(&c, 1, "streaming");
    c = base();
    c.outer.overlap = 1;
    expect_host(&c, 1, "streaming");
    c = base();
    c.outer.merge_alpha = 0.5;
    expect_host(&c, 1, "streaming");
    c = base();
    snprintf(c.outer.algorithm, sizeof c.outer.algorithm, "rsag");
    expect_host(&c, 1, "not allgather");
    c = base();
    snprintf(c.outer.algorithm, sizeof c.outer.algorithm, "auto");
    expect_host(&c, 1, "not allgather"); /* auto may pick rsag, which the device mode refuses */
}

Test(outer_device_path, cuda_one_rank_allgather_takes_the_device_path_in_a_cuda_build) {
    loco_config c = base();
    char why[160] = "";
    const bool dev = loco_island_outer_on_device(&c, 1, why, sizeof why);
#ifdef LOCO_HAVE_CUDA
    cr_expect(dev, "%s", why);
    cr_expect(strstr(why, "on the device: ") == why, "%s", why);
#else
    cr_expect_not(dev, "%s", why);
    cr_expect(strstr(why, "without the CUDA toolkit"), "%s", why);
#endif
}
