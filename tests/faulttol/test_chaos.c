/* The short chaos run of scripts/chaos.sh (docs/FAULTS.md, "Chaos test"):
 * a coordinator and three islands started by hand (25 ms one way on every
 * link), then three actions: an island killed and restarted with --resume,
 * an island stopped (SIGSTOP) long enough to be suspected and continued,
 * the coordinator killed and restarted on the same port. The script exits
 * 0 only when every action recovered, every island's last process exited 0
 * by itself and every island ends with the coordinator's last θ_global;
 * the summary it writes says so line by line, and this test reads it back.
 * Without the fault-free run (--no-baseline), which would double the time:
 * the long runs of docs/EXPERIMENTS.md compare the losses. Default fault
 * tolerance settings: a coordinator killed between its GO frames cancels
 * the exchange of the islands that got one (outer/exchange.c). */
#include "tests/support.h"
#include "core/core.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

/* Whole file into a malloc'd string (NULL when it cannot be read). */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *buf = malloc(1 << 17);
    size_t n = buf ? fread(buf, 1, (1 << 17) - 1, f) : 0;
    fclose(f);
    if (buf)
        buf[n] = '\0';
    return buf;
}

TestSuite(chaos, .timeout = 240);

Test(chaos, short_run_recovers_from_every_action_and_agrees) {
    char *dir = test_tmpdir("loco-chaos");
    static char out[1 << 16];
    const double t0 = loco_now();
    int rc = test_run(out, sizeof out, "bash scripts/chaos.sh --short --seed 1 --no-baseline --out %s", dir);
    const double wall = loco_now() - t0;
    cr_assert_eq(rc, 0, "chaos.sh failed (%s/run/logs has the logs):\n%s", dir, out);
    char path[160];
    snprintf(path, sizeof path, "%s/summary.md", dir);
    char *sum = slurp(path);
    cr_assert(sum, "no %s", path);
    cr_expect(strstr(sum, "- result: PASS") != NULL, "%s", sum);
    cr_expect(strstr(sum, "- actions performed: 3 of 3") != NULL, "%s", sum);
    cr_expect(strstr(sum, "- every island's last process exited 0: yes") != NULL, "%s", sum);
    cr_expect(strstr(sum, "- coordinator exited 0: yes") != NULL, "%s", sum);
    cr_expect(strstr(sum, "- θ_global hashes agree: yes") != NULL, "%s", sum);
    cr_expect(strstr(sum, "- watchdog trips: 0") != NULL, "%s", sum);
    cr_expect(strstr(sum, "| kill_resume |") && strstr(sum, "| stop_cont |") &&
                  strstr(sum, "| kill_coord |"),
              "the three actions are in the table: %s", sum);
    /* The island stopped for 3 s was suspected by the detector, and the
     * killed one rejoined through a state transfer with its hash checked. */
    cr_expect(strstr(sum, "suspected: silent for") != NULL, "%s", sum);
    cr_expect(strstr(sum, "(hash checked)") != NULL, "%s", sum);
    cr_expect(strstr(sum, ", of which not explained by an action: 0") != NULL,
              "no false suspicion: %s", sum);
    cr_log_info("chaos --short: %.1f s", wall);
    free(sum);
    loco_rmtree(dir);
    free(dir);
}
