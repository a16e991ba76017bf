// Q8_K quantization of activation rows (the vec_dot_type of the K-quants), with AVX2.
//
// Every mat-mul with K-quant weights first quantizes its activation rows to Q8_K. On x86 ggml runs
// the scalar reference for it (arch/x86/quants.c: quantize_row_q8_K calls quantize_row_q8_K_ref);
// at 4 rows that took 2.3% of a pass of the real 1.5B (docs/kernels.md). This does the same
// arithmetic eight values at a time, with the same result bit for bit:
//   - amax is the largest |x| and `max` the first value that reaches it (the reference keeps the
//     first on ties, and skips NaN: _mm256_max_ps returns its second operand for a NaN);
//   - iscale = -127/max, one float division, as the reference;
//   - each code is the product iscale * x rounded to float, then to the nearest integer with ties
//     to even: the reference's nearest_int (adding 1.5 * 2^23) in libggml-base, compiled for
//     baseline x86-64 without FMA contraction, and _mm256_cvtps_epi32 in the default rounding mode;
//     then min(127, q);
//   - bsums are exact integer sums, and d = 1/iscale;
//   - a NaN gets code 0 (the reference's rounding trick makes 0 of it; cvtps would give INT_MIN);
//   - an all-zero block gets d = 0 and zero codes, and its bsums are left as they were, as the
//     reference leaves them (they are multiplied by d = 0).
// native/smallbatch/bench checks all of these against the reference.
#include "smallbatch.h"

#define GGML_COMMON_DECL_C
#include "ggml-common.h"
#include "ggml-quants.h"

#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>

// the sums of the eight int32 lanes of v[0..7], in order
static inline __m256i sb_hsum8_epi32(const __m256i * v) {
    const __m256i t0 = _mm256_hadd_epi32(v[0], v[1]);
    const __m256i t1 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i t2 = _mm256_hadd_epi32(v[4], v[5]);
    const __m256i t3 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i u0 = _mm256_hadd_epi32(t0, t1);  // per 128-bit half: v0 v1 v2 v3
    const __m256i u1 = _mm256_hadd_epi32(t2, t3);  // per 128-bit half: v4 v5 v6 v7
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

void ggml_smallbatch_quantize_row_q8_K(const float * GGML_RESTRICT x, void * GGML_RESTRICT vy, int64_t k) {
    block_q8_K * GGML_RESTRICT y = (block_q8_K *) vy;
    const int64_t nb = k / QK_K;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i q127 = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);

    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        __m256 vmax = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) {
            vmax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask), vmax);
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float amax = _mm_cvtss_f32(m);
        if (!amax) {
            y[i].d = 0;
            memset(y[i].qs, 0, QK_K);
            continue;
        }
        float max = 0;
        const __m256 vamax = _mm256_set1_ps(amax);
        for (int j = 0; j < QK_K; j += 8) {
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask), vamax, _CMP_EQ_OQ));
            if (hit) {
                max = x[j + __builtin_ctz((unsigned) hit)];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 vscale = _mm256_set1_ps(iscale);
        __m256i sums[QK_K / 16];
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q[4];
            for (int l = 0; l < 4; ++l) {
                __m256 p = _mm256_mul_ps(vscale, _mm256_loadu_ps(x + j + 8 * l));
                p = _mm256_and_ps(p, _mm256_cmp_ps(p, p, _CMP_ORD_Q));  // NaN -> 0, the reference's code for it
                q[l] = _mm256_min_epi32(_mm256_cvtps_epi32(p), q127);
            }
            sums[j / 16]     = _mm256_add_epi32(q[0], q[1]);
            sums[j / 16 + 1] = _mm256_add_epi32(q[2], q[3]);
            // -127..127: no saturation; the packs interleave 128-bit halves, `order` undoes it
            const __m256i q16 = _mm256_packs_epi32(q[0], q[1]);
            const __m256i q16b = _mm256_packs_epi32(q[2], q[3]);
            const __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16, q16b), order);
            _mm256_storeu_si256((__m256i *) (y[i].qs + j), q8);
        }
        const __m256i s0 = sb_hsum8_epi32(sums);
        const __m256i s1 = sb_hsum8_epi32(sums + 8);
        _mm256_storeu_si256((__m256i *) y[i].bsums, _mm256_permute4x64_epi64(_mm256_packs_epi32(s0, s1), 0xd8));
        y[i].d = 1 / iscale;
    }
}

#else

void ggml_smallbatch_quantize_row_q8_K(const float * GGML_RESTRICT x, void * GGML_RESTRICT vy, int64_t k) {
    quantize_row_q8_K_ref(x, (block_q8_K *) vy, k);
}

#endif
