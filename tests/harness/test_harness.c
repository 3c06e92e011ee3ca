/* The test harness itself (tests/support.h): a command past its deadline
 * comes back on time with its output, and nothing it started outlives it;
 * the deadline follows the test's Criterion timeout. */
#include "tests/support.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEADLINE_S 2.0

/* How many live (not zombie) processes ps shows in group pgid or with
 * pid (-1: none). */
static int live(pid_t pgid, pid_t pid) {
    char cmd[256];
    snprintf(cmd, sizeof cmd,
             "ps -eo pid=,pgid=,stat= | awk '($2 == %d || $1 == %d) && $3 !~ /^Z/' | wc -l",
             (int)pgid, (int)pid);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    int n = -1;
    cr_assert_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

/* Whether group pgid (or pid, when pgid is 0) still exists, zombies
 * included, after init had a few seconds to reap the orphans. */
static bool exists(pid_t pgid, pid_t pid) {
    for (int i = 0; i < 250; i++) {
        if ((pgid ? kill(-pgid, 0) : kill(pid, 0)) == -1 && errno == ESRCH)
            return false;
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    return true;
}

/* The number after `key ` in out, or 0. */
static pid_t number_after(const char *out, const char *key) {
    const char *p = strstr(out, key);
    return p ? (pid_t)atoi(p + strlen(key)) : 0;
}

TestSuite(harness, .timeout = 30);

/* A foreground sleep, a background one and an orphan of a subshell (still
 * in the group), and one that left the group (as loco launch's children
 * do): all stopped, the output kept. */
Test(harness, a_command_past_its_deadline_is_stopped_with_everything_it_started) {
    char out[4096], tail[4096];
    const double t0 = test__now();
    const int rc = test_run_deadline(out, sizeof out, tail, sizeof tail, DEADLINE_S,
                                     "echo pgid $$; (sleep 31 &); sleep 32 & setsid sleep 33 & "
                                     "echo away $!; echo to stderr >&2; sleep 34");
    const double took = test__now() - t0;
    cr_expect_eq(rc, TEST_RUN_TIMED_OUT, "rc %d: %s", rc, out);
    /* without waiting out the grace: SIGTERM ended everything */
    cr_expect(took >= DEADLINE_S && took < DEADLINE_S + TEST_RUN_GRACE_S - 1,
              "came back after %.1f s", took);
    cr_expect(strstr(tail, "to stderr") && strstr(out, "to stderr"), "%s", tail);
    const pid_t pgid = number_after(out, "pgid "), away = number_after(out, "away ");
    cr_assert(pgid > 0 && away > 0, "%s", out);
    cr_expect_eq(live(pgid, away), 0, "a process of group %d or %d is left", (int)pgid, (int)away);
    cr_expect_not(exists(pgid, 0), "group %d is left", (int)pgid);
    cr_expect_not(exists(0, away), "the process that left the group (%d) is left", (int)away);
}

/* SIGTERM ignored: SIGKILL after the grace. */
Test(harness, a_command_ignoring_sigterm_is_killed_after_the_grace) {
    char out[256];
    const double t0 = test__now();
    const int rc =
        test_run_deadline(out, sizeof out, NULL, 0, 1, "echo pgid $$; trap '' TERM; sleep 35");
    const double took = test__now() - t0;
    cr_expect_eq(rc, TEST_RUN_TIMED_OUT, "rc %d: %s", rc, out);
    cr_expect(took >= 1 + TEST_RUN_GRACE_S && took < 1 + TEST_RUN_GRACE_S + 2,
              "came back after %.1f s", took);
    const pid_t pgid = number_after(out, "pgid ");
    cr_assert_gt(pgid, 0, "%s", out);
    cr_expect_eq(live(pgid, -1), 0, "a process of group %d is left", (int)pgid);
    cr_expect_not(exists(pgid, 0), "group %d is left", (int)pgid);
}

/* What the command prints as it stops (loco launch: its children's last
 * lines) is in the output too. */
Test(harness, what_a_command_prints_while_stopping_is_kept) {
    char out[256], tail[1024];
    const int rc = test_run_deadline(out, sizeof out, tail, sizeof tail, 1,
                                     "trap 'echo stopping on TERM; exit 1' TERM; echo running; "
                                     "while :; do sleep 0.1; done");
    cr_expect_eq(rc, TEST_RUN_TIMED_OUT, "rc %d: %s", rc, out);
    cr_expect(strstr(tail, "running\n") && strstr(tail, "stopping on TERM\n"), "%s", tail);
}

/* The shell exits at once, but what it put in the background holds the
 * output open: that is a timeout too, and the note says so. */
Test(harness, output_held_open_after_the_command_exited_times_out) {
    char out[256], tail[1024];
    const double t0 = test__now();
    const int rc =
        test_run_deadline(out, sizeof out, tail, sizeof tail, DEADLINE_S, "echo start; sleep 36 &");
    cr_expect_eq(rc, TEST_RUN_TIMED_OUT, "rc %d: %s", rc, out);
    cr_expect_lt(test__now() - t0, DEADLINE_S + TEST_RUN_GRACE_S - 1);
    cr_expect(strstr(tail, "start\n") && strstr(tail, "sh exited (status 0)"), "%s", tail);
}

/* The message of test_run's failure names the deadline and the command,
 * then the output. */
Test(harness, the_timeout_message_carries_the_command_and_its_output) {
    char out[256], tail[TEST_RUN_TAIL], msg[TEST_RUN_TAIL + 256];
    const char *cmd = "echo '[siteA] step 7'; echo '[coordinator] waiting' >&2; sleep 37";
    cr_assert_eq(test_run_deadline(out, sizeof out, tail, sizeof tail, 1, cmd), TEST_RUN_TIMED_OUT);
    test_run_timeout_message(msg, sizeof msg, 1, cmd, tail);
    cr_expect(strncmp(msg, "timed out after 1 s: echo '[siteA]", 34) == 0, "%s", msg);
    cr_expect(strstr(msg, "\n[siteA] step 7\n[coordinator] waiting\n"), "%s", msg);
}

/* Commands that end: their status, stdout and stderr together, stdin
 * empty, the first bytes in out and the last in tail, all of it read. */
Test(harness, commands_that_end_give_their_status_and_output) {
    static char out[64], tail[64];
    cr_expect_eq(test_run_deadline(out, sizeof out, NULL, 0, 10, "echo a; echo b >&2; exit 3"), 3);
    cr_expect_str_eq(out, "a\nb\n");
    cr_expect_eq(test_run_deadline(out, sizeof out, NULL, 0, 10, "cat; echo read nothing"), 0);
    cr_expect_str_eq(out, "read nothing\n");
    cr_expect_eq(test_run_deadline(out, sizeof out, tail, sizeof tail, 10, "seq 100000"), 0);
    cr_expect(strncmp(out, "1\n2\n3\n", 6) == 0 && strlen(out) == sizeof out - 1, "%s", out);
    cr_expect(strstr(tail, "\n99999\n100000\n") && strlen(tail) == sizeof tail - 1, "%s", tail);
    cr_expect_eq(test_run_deadline(out, sizeof out, NULL, 0, 10, "kill -9 $$"), -1);
    cr_expect_eq(test_run(out, sizeof out, "printf %%s-%%d x 5"), 0);
    cr_expect_str_eq(out, "x-5");
}

/* The suite's 30 s, less the 5 s margin and the time since the test
 * started; LOCO_TEST_CMD_TIMEOUT_S only shortens it. */
Test(harness, the_deadline_follows_the_suite_timeout) {
    unsetenv("LOCO_TEST_CMD_TIMEOUT_S");
    const double t = test_cmd_timeout_s();
    cr_expect(t > 30 - TEST_RUN_MARGIN_S - 5 && t <= 30 - TEST_RUN_MARGIN_S, "%g s", t);
    setenv("LOCO_TEST_CMD_TIMEOUT_S", "7", 1);
    cr_expect_eq(test_cmd_timeout_s(), 7);
    setenv("LOCO_TEST_CMD_TIMEOUT_S", "100", 1);
    cr_expect_leq(test_cmd_timeout_s(), 30 - TEST_RUN_MARGIN_S);
}

/* A test's own timeout wins over its suite's; the margin is a tenth of
 * a long one. */
Test(harness, the_deadline_follows_the_test_timeout, .timeout = 120) {
    const double t = test_cmd_timeout_s();
    cr_expect(t > 120 - 12 - 5 && t <= 120 - 12, "%g s", t);
}

/* Without a timeout, TEST_RUN_DEFAULT_S or the environment's. */
Test(harness_untimed, the_deadline_without_a_timeout) {
    unsetenv("LOCO_TEST_CMD_TIMEOUT_S");
    cr_expect_eq(test_cmd_timeout_s(), TEST_RUN_DEFAULT_S);
    setenv("LOCO_TEST_CMD_TIMEOUT_S", "42", 1);
    cr_expect_eq(test_cmd_timeout_s(), 42);
}
