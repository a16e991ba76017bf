// Q6_K weights x Q8_K activations, one weight row against up to GGML_SMALLBATCH_MAX_COLS rows.
//
// A Q6_K super-block holds 256 weights: the low 4 bits in ql, the high 2 bits in qh, 16 int8
// scales (one per 16 weights) and a half-precision d. The row's dot product with a Q8_K row is
//     d_x * d_y * sum_k scale_k * sum_{i in k} (q_i - 32) * y_i
// and the -32 offset is taken out with the activation's per-16 sums (bsums). Unpacking the 6-bit
// codes and broadcasting the scales is done once per half super-block (128 weights); the
// multiply-adds, the offset and the float accumulation are then done per activation row, with the
// same lanes as ggml_vec_dot_q6_K_q8_K (arch/x86/quants.c): the per-lane integer sums are exact
// whatever their order, and the float steps are the same, so each result equals the per-row
// kernel's bit for bit.
#include "smallbatch.h"

#define GGML_COMMON_DECL_C
#include "ggml-common.h"
#include "ggml-cpu-impl.h"
#include "simd-mappings.h"

#if defined(__AVX2__)
#include <immintrin.h>

// acc + madd(a, b): one instruction where VNNI has it; integer sums, so the result is the same
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SB_MADD_ACC(acc, a, b) _mm256_dpwssd_epi32((acc), (a), (b))
#elif defined(__AVXVNNI__)
#define SB_MADD_ACC(acc, a, b) _mm256_dpwssd_avx_epi32((acc), (a), (b))
#else
#define SB_MADD_ACC(acc, a, b) _mm256_add_epi32((acc), _mm256_madd_epi16((a), (b)))
#endif

// Super-blocks ahead that the weight stream is prefetched (840 bytes). With several activation rows
// the kernel computes long enough per byte that memory latency is no longer hidden by the hardware
// prefetchers alone (they stop at each 4 KiB page): prefetched by hand, with the Q4_K kernel's
// stream, the real 1.5B's passes over 4 and 8 rows took 7-13% and 11-15% less time on Zen 4
// (docs/kernels.md). A prefetch past the last weight row is only a hint (it never faults), and the
// rows of a chunk are contiguous, so near a row's end this fetches the next row's start.
#define SB_Q6_K_PREFETCH 4

// A super-block's 8 code vectors and 8 scale vectors take all 16 of AVX2's vector registers, and with
// them in registers for every activation row GCC spilled and reloaded them row after row: on AVX2
// (Zen 3) the kernel takes each super-block in two parts of 128 weights (1.14-1.31x; docs/kernels.md).
// With AVX-512VL's 32 registers the whole super-block stays in registers, as measured on Zen 4.
// (-DSB_Q6_K_PARTS=1 or 2 chooses for a benchmark.)
#ifndef SB_Q6_K_PARTS
#if defined(__AVX512VL__)
#define SB_Q6_K_PARTS 1
#else
#define SB_Q6_K_PARTS 2
#endif
#endif
#define SB_Q6_K_NV (8 / SB_Q6_K_PARTS)  // code (and scale) vectors of a part

static inline float sb_hsum_float_8(const __m256 x) {
    __m128 res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    return _mm_cvtss_f32(res);
}

// nc is a compile-time constant in each instantiation below, so the column loops unroll and the
// accumulators stay in registers.
static inline __attribute__((always_inline)) void sb_q6_K_q8_K(int n, float * s, const void * vx,
                                                               const void * const * vy, const int nc) {
    const block_q6_K * x = (const block_q6_K *) vx;
    const int nb = n / QK_K;

    const __m256i m3  = _mm256_set1_epi8(3);
    const __m256i m15 = _mm256_set1_epi8(15);

    __m256 acc[GGML_SMALLBATCH_MAX_COLS];
    for (int c = 0; c < nc; ++c) {
        acc[c] = _mm256_setzero_ps();
    }

    for (int i = 0; i < nb; ++i) {
        const float xd = GGML_CPU_FP16_TO_FP32(x[i].d);
        GGML_SMALLBATCH_PREFETCH_256((const char *) (x + i + SB_Q6_K_PREFETCH));  // a block_q6_K is 210 bytes

        const __m128i scales    = _mm_loadu_si128((const __m128i *) x[i].scales);
        const __m256i scales_16 = _mm256_cvtepi8_epi16(scales);

        // each activation row's integer sum over the super-block, begun with the -32 offset of every
        // code: -32 * sum_k scale_k * bsum_k
        __m256i isum[GGML_SMALLBATCH_MAX_COLS];
        for (int c = 0; c < nc; ++c) {
            const block_q8_K * y = (const block_q8_K *) vy[c] + i;
            const __m256i q8sums = _mm256_loadu_si256((const __m256i *) y->bsums);
            isum[c] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales_16), 5));
        }

        // SB_Q6_K_PARTS parts of the super-block one after another: each part's code and scale
        // vectors stay in registers for every activation row
        const uint8_t * ql = x[i].ql;
        const uint8_t * qh = x[i].qh;
        for (int part = 0; part < SB_Q6_K_PARTS; ++part) {
            __m256i q[SB_Q6_K_NV];   // codes as unsigned bytes 0..63, in the order the activations are stored
            __m256i sc[SB_Q6_K_NV];  // the 16-bit scale of each pair of 16-weight groups, over the 32 bytes they multiply
            for (int j = 0; j < SB_Q6_K_NV / 4; ++j) {
                const int half = part * (SB_Q6_K_NV / 4) + j;  // 128 weights
                const __m256i bits1 = _mm256_loadu_si256((const __m256i *) ql); ql += 32;
                const __m256i bits2 = _mm256_loadu_si256((const __m256i *) ql); ql += 32;
                const __m256i bitsH = _mm256_loadu_si256((const __m256i *) qh); qh += 32;

                const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(bitsH, m3), 4);
                const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(bitsH, _mm256_set1_epi8(12)), 2);
                const __m256i h2 = _mm256_and_si256(bitsH, _mm256_set1_epi8(48));
                const __m256i h3 = _mm256_srli_epi16(_mm256_and_si256(bitsH, _mm256_set1_epi8(-64)), 2);

                q[4 * j + 0] = _mm256_or_si256(_mm256_and_si256(bits1, m15), h0);
                q[4 * j + 1] = _mm256_or_si256(_mm256_and_si256(bits2, m15), h1);
                q[4 * j + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits1, 4), m15), h2);
                q[4 * j + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits2, 4), m15), h3);

                // in-lane byte shuffles of the widened scales of this half (rather than a widening per pair)
                const __m256i sh = half == 0 ? _mm256_permute4x64_epi64(scales_16, 0x44)   // scales 0-7 in both halves
                                             : _mm256_permute4x64_epi64(scales_16, 0xee);  // scales 8-15 in both halves
                for (int k = 0; k < 4; ++k) {
                    const int b = 4 * k;  // bytes of scale 2k (low half) and 2k+1 (high half) in the 8 scales
                    const __m256i idx = _mm256_setr_epi8(b, b + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1,
                                                         b + 2, b + 3, b + 2, b + 3, b + 2, b + 3, b + 2, b + 3,
                                                         b + 2, b + 3, b + 2, b + 3, b + 2, b + 3, b + 2, b + 3);
                    sc[4 * j + k] = _mm256_shuffle_epi8(sh, idx);
                }
            }

            for (int c = 0; c < nc; ++c) {
                const int8_t * q8 = ((const block_q8_K *) vy[c] + i)->qs + 32 * SB_Q6_K_NV * part;
                // two accumulators halve the dependency chain; int32 sums, so any order gives the
                // same total, lane by lane
                __m256i sum0 = isum[c];
                __m256i sum1 = _mm256_setzero_si256();
                for (int k = 0; k < SB_Q6_K_NV; k += 2) {
                    const __m256i p0 = _mm256_maddubs_epi16(q[k + 0], _mm256_loadu_si256((const __m256i *) (q8 + 32 * k)));
                    const __m256i p1 = _mm256_maddubs_epi16(q[k + 1], _mm256_loadu_si256((const __m256i *) (q8 + 32 * k + 32)));
                    sum0 = SB_MADD_ACC(sum0, sc[k + 0], p0);
                    sum1 = SB_MADD_ACC(sum1, sc[k + 1], p1);
                }
                isum[c] = _mm256_add_epi32(sum0, sum1);
            }
        }

        for (int c = 0; c < nc; ++c) {
            const float d = ((const block_q8_K *) vy[c] + i)->d * xd;
            acc[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d), _mm256_cvtepi32_ps(isum[c]), acc[c]);
        }
    }

    for (int c = 0; c < nc; ++c) {
        s[c] = sb_hsum_float_8(acc[c]);
    }
}

#define SB_Q6_K_NC(NC) \
    static void sb_q6_K_q8_K_##NC(int n, float * s, const void * vx, const void * const * vy) { \
        sb_q6_K_q8_K(n, s, vx, vy, NC); \
    }
SB_Q6_K_NC(1) SB_Q6_K_NC(2) SB_Q6_K_NC(3) SB_Q6_K_NC(4)
SB_Q6_K_NC(5) SB_Q6_K_NC(6) SB_Q6_K_NC(7) SB_Q6_K_NC(8)

static void sb_q6_K_q8_K_nc(int n, float * s, size_t bs, const void * vx, size_t bx, int nw,
                            const void * const * vy, int nc) {
    for (int w = 0; w < nw; ++w) {
        const void * x = (const char *) vx + w * bx;
        float * sw = s + w * bs;
        switch (nc) {
            case 1: sb_q6_K_q8_K_1(n, sw, x, vy); break;
            case 2: sb_q6_K_q8_K_2(n, sw, x, vy); break;
            case 3: sb_q6_K_q8_K_3(n, sw, x, vy); break;
            case 4: sb_q6_K_q8_K_4(n, sw, x, vy); break;
            case 5: sb_q6_K_q8_K_5(n, sw, x, vy); break;
            case 6: sb_q6_K_q8_K_6(n, sw, x, vy); break;
            case 7: sb_q6_K_q8_K_7(n, sw, x, vy); break;
            default: sb_q6_K_q8_K_8(n, sw, x, vy); break;
        }
    }
}

ggml_smallbatch_dot_t ggml_smallbatch_q6_K(void) {
    return sb_q6_K_q8_K_nc;
}

#else

ggml_smallbatch_dot_t ggml_smallbatch_q6_K(void) {
    return NULL;  // the per-row kernel is the only one for this instruction set
}

#endif
