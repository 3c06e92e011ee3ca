/* The phi-accrual failure detector on synthetic time: phi against an
 * independent erfc reference, detection bounds, no false suspicion under
 * bounded jitter, the hard timeout, window sliding, numeric range, and
 * argument checks. */
#include "faulttol/faulttol.h"

#include <criterion/criterion.h>
#include <math.h>

#define THRESHOLD 8.0
#define NO_TIMEOUT 0.0

/* Reference phi from the intervals themselves (two-pass mean and
 * population std), in long double so the far tail does not underflow. */
static double ref_phi(const double *iv_ms, int n, double min_std_ms, double pause_ms,
                      double elapsed_ms) {
    long double mean = 0, var = 0;
    for (int i = 0; i < n; i++)
        mean += iv_ms[i];
    mean /= n;
    for (int i = 0; i < n; i++)
        var += (iv_ms[i] - mean) * (iv_ms[i] - mean);
    long double sd = sqrtl(var / n);
    if (sd < min_std_ms)
        sd = min_std_ms;
    long double z = (elapsed_ms - (mean + pause_ms)) / (sd * sqrtl(2.0L));
    return (double)-log10l(0.5L * erfcl(z));
}

/* Beats at t = 0, 1·period, ... with uniform jitter in [-jitter, +jitter]
 * on each interval (none when rng is NULL); returns the time of the last beat. */
static double feed(loco_phi_detector *d, loco_rng *rng, double t, int beats, double period_s,
                   double jitter_s) {
    for (int i = 0; i < beats; i++) {
        if (i > 0 || d->beats > 0)
            t += period_s + (rng ? jitter_s * (2 * loco_rng_uniform_d(rng) - 1) : 0);
        loco_phi_heartbeat(d, t);
    }
    return t;
}

/* First silence (1 ms steps) after the last beat at which d is suspected. */
static double first_suspect(const loco_phi_detector *d, double timeout_s) {
    double last = loco_phi_last(d);
    for (int ms = 0; ms < 3600 * 1000; ms++)
        if (loco_phi_suspect(d, last + ms * 1e-3, THRESHOLD, timeout_s))
            return ms * 1e-3;
    return INFINITY;
}

Test(detector, regular_beats_phi_small_then_rising) {
    loco_phi_detector d;
    cr_assert_eq(loco_phi_init(&d, 1000, 10, 0, 100), 0);
    double last = feed(&d, NULL, 0, 50, 0.1, 0);
    cr_assert_eq(loco_phi_beats(&d), 50);
    cr_assert_eq(loco_phi_samples(&d), 49);
    cr_assert_float_eq(loco_phi_last(&d), last, 1e-12);
    cr_assert_lt(loco_phi(&d, last), 1e-6, "phi just after a beat is ~0");
    /* At the mean the next beat is as likely early as late: phi = log10 2. */
    cr_assert_float_eq(loco_phi(&d, last + 0.1), log10(2.0), 1e-6);
    double p1 = loco_phi(&d, last + 0.12), p2 = loco_phi(&d, last + 0.14);
    cr_assert(p1 < p2 && p2 < loco_phi(&d, last + 0.2));
    cr_assert(!loco_phi_suspect(&d, last + 0.11, THRESHOLD, NO_TIMEOUT));
    loco_phi_fini(&d);
}

Test(detector, matches_erfc_reference) {
    loco_phi_detector d;
    loco_rng rng;
    loco_rng_seed(&rng, 7);
    cr_assert_eq(loco_phi_init(&d, 50, 5, 20, 100), 0);
    double iv[200], t = 0;
    loco_phi_heartbeat(&d, t);
    for (int i = 0; i < 200; i++) { /* wraps the ring four times */
        iv[i] = 100 + 60 * loco_rng_uniform_d(&rng);
        t += iv[i] * 1e-3;
        loco_phi_heartbeat(&d, t);
    }
    /* The reference sees only the last 50 intervals, as the ring should. */
    const double el[] = {0, 50, 120, 150, 200, 300, 500, 1000, 2000, 5000, 8000};
    for (size_t k = 0; k < sizeof el / sizeof el[0]; k++) {
        double want = ref_phi(iv + 150, 50, 5, 20, el[k]);
        double got = loco_phi(&d, t + el[k] * 1e-3);
        cr_assert(fabs(got - want) <= 1e-9 * fmax(1, want), "elapsed %g ms: phi %.15g, ref %.15g",
                  el[k], got, want);
    }
    /* The time detect_time reports is where phi crosses the threshold. */
    double dt = loco_phi_detect_time(&d, THRESHOLD);
    cr_assert_float_eq(ref_phi(iv + 150, 50, 5, 20, dt * 1e3), THRESHOLD, 1e-6);
    cr_assert_float_eq(loco_phi(&d, t + dt), THRESHOLD, 1e-6);
    loco_phi_fini(&d);
}

Test(detector, silent_peer_suspected_fast) {
    loco_phi_detector d;
    loco_rng rng;
    loco_rng_seed(&rng, 1);
    cr_assert_eq(loco_phi_init(&d, 1000, 10, 0, 100), 0);
    feed(&d, &rng, 0, 500, 0.1, 0.010);
    double s = first_suspect(&d, NO_TIMEOUT);
    cr_assert(s > 0.11 && s < 1.0, "suspected after %g s of silence", s);
    cr_assert_float_eq(s, loco_phi_detect_time(&d, THRESHOLD), 1.5e-3);
    loco_phi_fini(&d);
}

Test(detector, jittery_link_never_false_positive) {
    loco_phi_detector d;
    loco_rng rng;
    loco_rng_seed(&rng, 42);
    cr_assert_eq(loco_phi_init(&d, 1000, 10, 0, 200), 0);
    double t = 0, max_phi = 0;
    loco_phi_start(&d, t);
    loco_phi_heartbeat(&d, t);
    for (int i = 0; i < 10000; i++) {
        double next = t + 0.2 + 0.08 * (2 * loco_rng_uniform_d(&rng) - 1);
        /* The longest silence before this beat: just before it lands. */
        double before = next - 1e-9;
        max_phi = fmax(max_phi, loco_phi(&d, before));
        cr_assert(!loco_phi_suspect(&d, before, THRESHOLD, 60), "beat %d suspected, phi %g", i,
                  loco_phi(&d, before));
        loco_phi_heartbeat(&d, t = next);
    }
    cr_assert_lt(max_phi, THRESHOLD);
    double s = first_suspect(&d, 60);
    cr_assert(s > 0.28 && s < 1.5, "suspected after %g s of silence", s);
    loco_phi_fini(&d);
}

Test(detector, phi_non_decreasing_in_silence) {
    loco_phi_detector d;
    loco_rng rng;
    loco_rng_seed(&rng, 3);
    cr_assert_eq(loco_phi_init(&d, 1000, 10, 0, 200), 0);
    double last = feed(&d, &rng, 0, 1000, 0.2, 0.08);
    double prev = loco_phi(&d, last);
    /* 10 µs steps across the whole range, including the switch to the
     * asymptotic tail (z = 26 is near 1.9 s here). */
    for (int i = 1; i <= 400000; i++) {
        double p = loco_phi(&d, last + i * 1e-5);
        cr_assert(p >= prev, "phi fell from %.17g to %.17g at %g s", prev, p, i * 1e-5);
        prev = p;
    }
    for (double e = 4; e < 1e12; e *= 1.5) {
        double p = loco_phi(&d, last + e);
        cr_assert(p >= prev, "phi fell at %g s", e);
        prev = p;
    }
    loco_phi_fini(&d);
}

Test(detector, hard_timeout_fires_when_phi_low) {
    loco_phi_detector d;
    cr_assert_eq(loco_phi_init(&d, 100, 0, 0, 100), 0);
    loco_phi_start(&d, 0);
    /* Never heard from: phi says nothing, the timeout decides. */
    cr_assert_eq(loco_phi(&d, 5), 0);
    cr_assert(!loco_phi_suspect(&d, 1.9, THRESHOLD, 2));
    cr_assert(loco_phi_suspect(&d, 2.1, THRESHOLD, 2));
    cr_assert(!loco_phi_suspect(&d, 100, THRESHOLD, NO_TIMEOUT));
    /* Intervals alternating 0.1 s and 20 s: mean ~10 s, std ~10 s. */
    double t = 0;
    loco_phi_heartbeat(&d, t);
    for (int i = 0; i < 40; i++)
        loco_phi_heartbeat(&d, t += (i % 2) ? 20 : 0.1);
    cr_assert_lt(loco_phi(&d, t + 3), 1.0);
    cr_assert(loco_phi_suspect(&d, t + 3, THRESHOLD, 2));
    cr_assert(!loco_phi_suspect(&d, t + 3, THRESHOLD, 10));
    cr_assert(!loco_phi_suspect(&d, t + 3, THRESHOLD, NO_TIMEOUT));
    loco_phi_fini(&d);
}

Test(detector, window_slides_to_new_rate) {
    loco_phi_detector d;
    loco_rng rng;
    loco_rng_seed(&rng, 9);
    cr_assert_eq(loco_phi_init(&d, 100, 10, 0, 100), 0);
    double t = feed(&d, &rng, 0, 500, 0.1, 0.005);
    /* The first 500 ms gap looks like death to a 100 ms model. */
    cr_assert(loco_phi_suspect(&d, t + 0.49, THRESHOLD, NO_TIMEOUT));
    t = feed(&d, &rng, t, 100, 0.5, 0.005); /* refills the window */
    double mean, sd;
    loco_phi_stats(&d, &mean, &sd);
    cr_assert_float_eq(mean, 500, 5);
    cr_assert_lt(sd, 10.0 + 1e-9);
    for (int i = 0; i < 1000; i++) {
        double next = t + 0.5 + 0.005 * (2 * loco_rng_uniform_d(&rng) - 1);
        cr_assert(!loco_phi_suspect(&d, next - 1e-9, THRESHOLD, NO_TIMEOUT), "beat %d", i);
        loco_phi_heartbeat(&d, t = next);
    }
    cr_assert_eq(loco_phi_samples(&d), 100);
    loco_phi_fini(&d);
}

/* An island back after a 12-day outage: once that interval slides out,
 * the model is exact again (running sums of ~1e18 ms² would otherwise
 * leave a phantom variance behind). */
Test(detector, huge_interval_leaves_no_residue) {
    loco_phi_detector d;
    cr_assert_eq(loco_phi_init(&d, 8, 0, 0, 100), 0);
    loco_phi_heartbeat(&d, 0);
    double t = 1e6;
    loco_phi_heartbeat(&d, t);
    for (int i = 0; i < 24; i++) /* 80, 120, 80, ... ms: mean 100, std 20 */
        loco_phi_heartbeat(&d, t += (i % 2) ? 0.12 : 0.08);
    double mean, sd;
    loco_phi_stats(&d, &mean, &sd);
    cr_assert_float_eq(mean, 100, 1e-6);
    cr_assert_float_eq(sd, 20, 1e-6);
    loco_phi_fini(&d);
}

Test(detector, long_silence_finite_and_huge) {
    loco_phi_detector d;
    cr_assert_eq(loco_phi_init(&d, 1000, 10, 0, 100), 0);
    double last = feed(&d, NULL, 0, 100, 0.1, 0);
    const double el[] = {1, 10, 1e3, 1e6, 1e9, 1e300, INFINITY};
    double prev = 0;
    for (size_t k = 0; k < sizeof el / sizeof el[0]; k++) {
        double p = loco_phi(&d, last + el[k]);
        cr_assert(isfinite(p) && p >= prev && p <= LOCO_PHI_MAX, "%g s: phi %g", el[k], p);
        prev = p;
    }
    cr_assert_gt(loco_phi(&d, last + 10), 1e5);
    cr_assert_eq(loco_phi(&d, last + INFINITY), LOCO_PHI_MAX);
    /* Past erfc's underflow (z ~ 27..100) phi still matches erfcl. */
    double iv[99];
    for (int i = 0; i < 99; i++)
        iv[i] = 100;
    for (double e = 400; e <= 1500; e += 100) {
        double want = ref_phi(iv, 99, 10, 0, e);
        cr_assert(fabs(loco_phi(&d, last + e * 1e-3) - want) <= 1e-9 * want, "%g ms", e);
    }
    cr_assert(isfinite(loco_phi_detect_time(&d, 1e6)));
    loco_phi_fini(&d);
}

Test(detector, out_of_order_beat_ignored) {
    loco_phi_detector d;
    cr_assert_eq(loco_phi_init(&d, 10, 10, 0, 100), 0);
    loco_phi_heartbeat(&d, 1.0);
    loco_phi_heartbeat(&d, 0.5);
    cr_assert_eq(loco_phi_beats(&d), 1);
    cr_assert_eq(loco_phi_samples(&d), 0);
    /* One beat, no interval: the prior (mean 100, std 25) applies. */
    double mean, sd;
    loco_phi_stats(&d, &mean, &sd);
    cr_assert_float_eq(mean, 100, 1e-12);
    cr_assert_float_eq(sd, 25, 1e-12);
    cr_assert_float_eq(loco_phi(&d, 1.1), log10(2.0), 1e-9);
    loco_phi_fini(&d);
}

Test(detector, init_rejects_bad_arguments) {
    loco_phi_detector d;
    cr_assert_eq(loco_phi_init(&d, 1, 10, 0, 100), LOCO_EINVAL);
    cr_assert_eq(loco_phi_init(&d, 0, 10, 0, 100), LOCO_EINVAL);
    cr_assert_eq(loco_phi_init(&d, -5, 10, 0, 100), LOCO_EINVAL);
    cr_assert_eq(loco_phi_init(&d, 100, -1, 0, 100), LOCO_EINVAL);
    cr_assert_eq(loco_phi_init(&d, 100, 10, -1, 100), LOCO_EINVAL);
    cr_assert_eq(loco_phi_init(&d, 100, 10, 0, 0), LOCO_EINVAL);
    cr_assert_eq(loco_phi_init(&d, 100, 10, 0, -100), LOCO_EINVAL);
    cr_assert_eq(loco_phi_init(&d, 100, NAN, 0, 100), LOCO_EINVAL);
    cr_assert_eq(loco_phi_init(&d, 100, 10, INFINITY, 100), LOCO_EINVAL);
    cr_assert_eq(loco_phi_init(NULL, 100, 10, 0, 100), LOCO_EINVAL);
    cr_assert_neq(loco_errmsg()[0], '\0');
    loco_phi_fini(&d); /* zero-filled by the failed init */
    loco_phi_fini(NULL);

    size_t live = loco_alloc_live_bytes();
    loco_alloc_fail_after(1);
    cr_assert_eq(loco_phi_init(&d, 100, 10, 0, 100), LOCO_ENOMEM);
    loco_alloc_fail_after(0);
    cr_assert_eq(loco_phi_init(&d, 2, 0, 0, 100), 0);
    loco_phi_fini(&d);
    cr_assert_eq(loco_alloc_live_bytes(), live);
}
