/* Silence is never fatal (issue 30): a fresh run of three islands with
 * outer.algorithm = auto, whose start-up link probe finds siteC silent
 * (SIGSTOP after it registered). tests/faulttol/silent_probe.sh starts
 * the processes by hand and waits for their log lines; it exits 0 only
 * when every island and the coordinator exited 0 and every island
 * recorded outer steps. Before, siteA and siteB exited 1 at start-up
 * (link_recv / connect timeout at island.c loco_island_create). */
#include "core/core.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

Test(silence, a_silent_peer_during_the_start_up_probe_ends_no_island, .timeout = 90) {
    char *dir = test_tmpdir("loco-silence");
    static char out[1 << 16];
    const int rc = test_run(out, sizeof out, "bash tests/faulttol/silent_probe.sh %s", dir);
    cr_assert_eq(rc, 0, "silent_probe.sh failed (%s/logs has the logs):\n%s", dir, out);
    cr_expect(strstr(out, "siteA's probe fell back") != NULL, "%s", out);
    cr_expect(strstr(out, "all-gather until an outer step measures the links") != NULL, "%s", out);
    loco_rmtree(dir);
    free(dir);
}
