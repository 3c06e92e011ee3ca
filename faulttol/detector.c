/* Phi-accrual failure detector: a normal model of the last `window`
 * heartbeat intervals, kept as a ring with running sums, and phi =
 * -log10(P(the next heartbeat comes later than the silence so far)). */
#include "faulttol/faulttol.h"

#include <math.h>
#include <string.h>

/* Below this z the tail 0.5*erfc(z) is a normal double; above it, erfc
 * nears underflow and the asymptotic series is accurate to ~1e-13. */
#define PHI_ASYMPTOTIC_Z 26.0
/* Floor on sigma when min_std_ms is 0 and every interval was equal. */
#define PHI_SIGMA_FLOOR_MS 1e-6
/* Prior std as a fraction of first_interval_ms (Akka's choice). */
#define PHI_PRIOR_STD_FRACTION 0.25

int loco_phi_init(loco_phi_detector *d, int window, double min_std_ms, double acceptable_pause_ms,
                  double first_interval_ms) {
    if (!d)
        return LOCO_ERR(LOCO_EINVAL, "phi detector: NULL detector");
    memset(d, 0, sizeof *d);
    if (window < 2)
        return LOCO_ERR(LOCO_EINVAL, "phi detector: window %d < 2", window);
    /* Written as !(x >= 0) so that NaN is refused too. */
    if (!(min_std_ms >= 0) || !(acceptable_pause_ms >= 0) || !(first_interval_ms > 0) ||
        isinf(min_std_ms) || isinf(acceptable_pause_ms) || isinf(first_interval_ms))
        return LOCO_ERR(LOCO_EINVAL,
                        "phi detector: min_std_ms %g, acceptable_pause_ms %g, "
                        "first_interval_ms %g (need >= 0, >= 0, > 0, finite)",
                        min_std_ms, acceptable_pause_ms, first_interval_ms);
    d->iv = loco_alloc((size_t)window * sizeof *d->iv);
    if (!d->iv)
        return LOCO_ERR(LOCO_ENOMEM, "phi detector: ring of %d intervals", window);
    d->window = window;
    d->min_std_ms = min_std_ms;
    d->pause_ms = acceptable_pause_ms;
    d->first_ms = first_interval_ms;
    d->start_s = loco_now();
    return 0;
}

void loco_phi_fini(loco_phi_detector *d) {
    if (!d)
        return;
    loco_free(d->iv);
    memset(d, 0, sizeof *d);
}

void loco_phi_start(loco_phi_detector *d, double now_s) {
    d->start_s = now_s;
}

/* Exact sums over the ring, so rounding in the running sums cannot pile
 * up: called once per wrap, O(window) every window heartbeats. */
static void resync(loco_phi_detector *d) {
    d->sum = d->sumsq = 0;
    for (int i = 0; i < d->n; i++) {
        d->sum += d->iv[i];
        d->sumsq += d->iv[i] * d->iv[i];
    }
}

void loco_phi_heartbeat(loco_phi_detector *d, double now_s) {
    if (d->beats > 0) {
        if (now_s < d->last_s)
            return;
        double x = (now_s - d->last_s) * 1e3;
        if (d->n == d->window) {
            double old = d->iv[d->head];
            d->sum -= old;
            d->sumsq -= old * old;
        } else {
            d->n++;
        }
        d->iv[d->head] = x;
        d->sum += x;
        d->sumsq += x * x;
        d->head = (d->head + 1) % d->window;
        if (d->head == 0)
            resync(d);
    }
    d->last_s = now_s;
    d->beats++;
}

void loco_phi_stats(const loco_phi_detector *d, double *mean_ms, double *std_ms) {
    double mean, sd;
    if (d->n == 0) {
        mean = d->first_ms;
        sd = d->first_ms * PHI_PRIOR_STD_FRACTION;
    } else {
        mean = d->sum / d->n;
        double var = d->sumsq / d->n - mean * mean;
        sd = var > 0 ? sqrt(var) : 0;
    }
    sd = fmax(sd, d->min_std_ms);
    if (mean_ms)
        *mean_ms = mean;
    if (std_ms)
        *std_ms = sd;
}

/* -log10(0.5 * erfc(z)), finite for every z. Past PHI_ASYMPTOTIC_Z it uses
 * erfc(z) = exp(-z²)/(z√π) · (1 - w + 3w² - 15w³ + 105w⁴ - ...), w = 1/(2z²),
 * taken in logs so nothing underflows. */
static double phi_of_z(double z) {
    double phi;
    if (z < PHI_ASYMPTOTIC_Z) {
        phi = -log10(0.5 * erfc(z));
    } else {
        double w = 1.0 / (2.0 * z * z);
        double series = 1.0 - w * (1.0 - w * (3.0 - w * (15.0 - 105.0 * w)));
        double ln_p = -z * z - log(z * sqrt(M_PI)) + log(series) + log(0.5);
        phi = -ln_p / M_LN10;
    }
    if (!(phi > 0)) /* -0 at the far left tail */
        return 0;
    return fmin(phi, LOCO_PHI_MAX);
}

/* The standardized silence: (elapsed - mu) / (sigma·√2). */
static double z_of(const loco_phi_detector *d, double elapsed_ms) {
    double mean, sd;
    loco_phi_stats(d, &mean, &sd);
    sd = fmax(sd, PHI_SIGMA_FLOOR_MS);
    return (elapsed_ms - (mean + d->pause_ms)) / (sd * M_SQRT2);
}

double loco_phi(const loco_phi_detector *d, double now_s) {
    if (d->beats == 0)
        return 0;
    double elapsed_ms = fmax(0, now_s - d->last_s) * 1e3;
    return phi_of_z(z_of(d, elapsed_ms));
}

bool loco_phi_suspect(const loco_phi_detector *d, double now_s, double threshold,
                      double timeout_s) {
    double since = now_s - (d->beats > 0 ? d->last_s : d->start_s);
    if (timeout_s > 0 && since > timeout_s)
        return true;
    return d->beats > 0 && loco_phi(d, now_s) > threshold;
}

double loco_phi_detect_time(const loco_phi_detector *d, double threshold) {
    if (!(threshold > 0))
        return 0;
    threshold = fmin(threshold, LOCO_PHI_MAX);
    /* phi_of_z increases with z: bracket the crossing by doubling, then
     * bisect until the bracket is one ulp wide. */
    double lo = -1, hi = 1;
    while (phi_of_z(hi) < threshold) {
        lo = hi;
        hi *= 2;
    }
    while (phi_of_z(lo) >= threshold) {
        hi = lo;
        lo *= 2;
    }
    for (;;) {
        double mid = 0.5 * (lo + hi);
        if (mid <= lo || mid >= hi)
            break;
        if (phi_of_z(mid) < threshold)
            lo = mid;
        else
            hi = mid;
    }
    double mean, sd;
    loco_phi_stats(d, &mean, &sd);
    sd = fmax(sd, PHI_SIGMA_FLOOR_MS);
    double t_ms = mean + d->pause_ms + hi * sd * M_SQRT2;
    return fmax(0, t_ms) * 1e-3;
}
