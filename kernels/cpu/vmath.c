/* Vectorisable elementary functions shared by the kernels.
 *
 * glibc's expf/tanhf do not vectorise without -ffast-math, and at GPT-2
 * sizes the softmax, cross-entropy and GELU loops spend most of their time in
 * them. loco__expf carries an OpenMP "declare simd" so callers' loops call
 * its 8-wide clone. Its scalar and vector versions execute the same IEEE
 * operations (every multiply-add is an explicit fmaf), so results do not
 * depend on which elements a loop happens to run in its scalar tail. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#pragma omp declare simd notinbranch
float loco__expf(float x);

/* Input clamps: above EXP_HI the result saturates at exp(EXP_HI) ~ 2.4e38;
 * below about -87.68 (so at EXP_LO and under) 2^n has a zero exponent field
 * and the result is exactly 0, where the true value is under 1.2e-38. */
#define EXP_HI 88.37f
#define EXP_LO -88.0f

/* exp(x), Cephes' expf reduction and polynomial: x = n ln2 + r with
 * |r| <= ln2/2, exp(r) by a degree-7 polynomial, 2^n built in the exponent
 * bits. Max error about 1 ulp over the normal range. */
#pragma omp declare simd notinbranch
float loco__expf(float x)
{
    const float shifter = 0x1.8p23f; /* adding it rounds to an integer */
    /* Branch-free apart from the two clamps: GCC will not if-convert (so
     * not vectorise) a branch arm that might raise an FP exception. */
    float xc = x > EXP_HI ? EXP_HI : x;
    xc = xc < EXP_LO ? EXP_LO : xc;
    const float k = fmaf(xc, 1.44269504088896341f, shifter);
    const float n = k - shifter;
    float r = fmaf(n, -0.693359375f, xc); /* ln2 split hi + lo */
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    const float y = fmaf(p, r * r, r) + 1.0f;
    int32_t kb, sb;
    memcpy(&kb, &k, sizeof kb);
    memcpy(&sb, &shifter, sizeof sb);
    const uint32_t eb = (uint32_t)(kb - sb + 127) << 23; /* 2^n */
    float two_n;
    memcpy(&two_n, &eb, sizeof two_n);
    return y * two_n;
}
