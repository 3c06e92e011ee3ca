/* Internal to kernels/cpu: vectorisable math shared by the kernels. */
#ifndef LOCO_KERNELS_CPU_VMATH_H
#define LOCO_KERNELS_CPU_VMATH_H

/* expf with at most 1.01 ulp error on [-87.3, 88.37]; the scalar and the
 * OpenMP SIMD clone give identical bits, so results do not depend on which
 * elements a loop handles in its scalar tail. */
#pragma omp declare simd notinbranch
float loco__expf(float x);

#endif
