/* xoshiro256** (Blackman & Vigna), seeded through splitmix64. */
#include "core/core.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void loco_rng_seed(loco_rng *rng, uint64_t seed) {
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t loco_rng_u64(loco_rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float loco_rng_uniform(loco_rng *rng) {
    return (float)(loco_rng_u64(rng) >> 40) * (1.0f / 16777216.0f);
}

double loco_rng_uniform_d(loco_rng *rng) {
    return (double)(loco_rng_u64(rng) >> 11) * (1.0 / 9007199254740992.0);
}

float loco_rng_normal(loco_rng *rng) {
    double u1 = loco_rng_uniform_d(rng);
    double u2 = loco_rng_uniform_d(rng);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}
