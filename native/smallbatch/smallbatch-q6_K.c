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

#include <stdlib.h>

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
// The 512-bit kernel (AMD Zen 5) prefetches 16 super-blocks (3,360 bytes) ahead: at 4 its 2- to 8-row
// passes over the real 1.5B waited on memory far more than they computed (perf: the Q6_K kernel at 2 rows
// 1.7x its 1-row time, where in cache it takes 1.4x); 16-32 were alike (docs/kernels.md).
#define SB_Q6_K_PREFETCH_512 16

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
        GGML_SMALLBATCH_PREFETCH_256((const char *) (x + i + SB_Q6_K_PREFETCH), GGML_SMALLBATCH_PREFETCH_L2(nc));  // a block_q6_K is 210 bytes

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
        s[c] = ggml_smallbatch_hsum_float_8(acc[c]);
    }
}

#ifdef GGML_SMALLBATCH_HAS_512
// A super-block's 256 codes as unsigned bytes, 64 a vector in the order of the activations (q[m]: codes
// 64m..64m+63): the low 4 bits from ql, the high 2 from qh (both 512-bit kernels below)
static inline __attribute__((always_inline)) void sb_q6_K_codes_512(const block_q6_K * xb, __m512i q[4]) {
    const __m512i m15 = _mm512_set1_epi8(15);
    const __m512i m48 = _mm512_set1_epi8(48);
    // the high 2 bits of codes 0-31 | 32-63 (shifted left 4 | 2 within 16-bit words: what crosses a
    // byte lands outside bits 4-5) and of 64-95 | 96-127 (shifted right 0 | 2)
    const __m512i shl01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr23 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    for (int h = 0; h < 2; ++h) {
        const __m512i bits  = _mm512_loadu_si512((const void *) (xb->ql + 64 * h));
        const __m512i bitsH = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) (xb->qh + 32 * h)));
        const __m512i h01 = _mm512_and_si512(_mm512_sllv_epi16(bitsH, shl01), m48);
        const __m512i h23 = _mm512_and_si512(_mm512_srlv_epi16(bitsH, shr23), m48);
        q[2 * h + 0] = _mm512_or_si512(_mm512_and_si512(bits, m15), h01);
        q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(bits, 4), m15), h23);
    }
}

// 512-bit form (ggml_smallbatch_512: AMD Zen 4 and later, Intel with AMX; Zen 5 runs its multiplies at full width). A
// super-block's codes are 4 vectors of 64, each two of the 256-bit kernel's (the pair whose activations
// follow each other), and its scales 4 vectors (a 16-bit scale over each 128-bit lane: 16 weights);
// each activation row then needs 4 maddubs and 4 dpwssd instead of 8 and 8. The high 256 bits of a
// row's sum are added to the low ones once per super-block: lane j again sums exactly the integers of
// lane j of ggml_vec_dot_q6_K_q8_K, and the float steps are the same, so results are bit-identical.
static inline __attribute__((always_inline)) void sb_q6_K_q8_K_512(int n, float * s, const void * vx,
                                                                   const void * const * vy, const int nc) {
    const block_q6_K * x = (const block_q6_K *) vx;
    const int nb = n / QK_K;

    // word t of scale vector m: scale 4m + t/8
    static const uint16_t sc_lane[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    const __m512i sc_base = _mm512_loadu_si512((const void *) sc_lane);

    __m256 acc[GGML_SMALLBATCH_MAX_COLS];
    for (int c = 0; c < nc; ++c) {
        acc[c] = _mm256_setzero_ps();
    }

    for (int i = 0; i < nb; ++i) {
        const float xd = GGML_CPU_FP16_TO_FP32(x[i].d);
        const __m256 xd8 = _mm256_set1_ps(xd);
        GGML_SMALLBATCH_PREFETCH_256((const char *) (x + i + SB_Q6_K_PREFETCH_512), GGML_SMALLBATCH_PREFETCH_L2(nc));

        const __m256i scales_16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) x[i].scales));
        const __m512i scales_z  = _mm512_castsi256_si512(scales_16);
        // -32 x the scales (within int16): each row's offset term is then one madd, the same integers
        // as -(madd(bsums, scales) << 5)
        const __m256i scales_m32 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(scales_16, 5));

        __m512i q[4];   // codes 64m..64m+63 as unsigned bytes, in the order of the activations
        __m512i sc[4];  // their 16-bit scales
        sb_q6_K_codes_512(x + i, q);
        for (int m = 0; m < 4; ++m) {
            sc[m] = _mm512_permutexvar_epi16(_mm512_add_epi16(sc_base, _mm512_set1_epi16(4 * m)), scales_z);
        }

        for (int c = 0; c < nc; ++c) {
            const block_q8_K * y = (const block_q8_K *) vy[c] + i;
            const __m256i q8sums = _mm256_loadu_si256((const __m256i *) y->bsums);
            // begun with the -32 offset of every code, in the low 256 bits: -32 * sum_k scale_k * bsum_k.
            // One chain of multiply-adds a row (the rows are the independent chains) and d as a vector
            // product (the same float product as the scalar one): 3-4% fewer cycles than two chains
            // and a scalar d at 4-8 rows in cache on Zen 4 (docs/kernels.md)
            __m512i sum = _mm512_zextsi256_si512(_mm256_madd_epi16(q8sums, scales_m32));
            for (int m = 0; m < 4; ++m) {
                sum = _mm512_dpwssd_epi32(sum, sc[m], _mm512_maddubs_epi16(q[m], _mm512_loadu_si512((const void *) (y->qs + 64 * m))));
            }
            const __m256i isum = _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
            const __m256 d = _mm256_mul_ps(_mm256_broadcast_ss(&y->d), xd8);
            acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc[c]);
        }
    }

    for (int c = 0; c < nc; ++c) {
        s[c] = ggml_smallbatch_hsum_float_8(acc[c]);
    }
}
#define SB_Q6_K_512 1

// The 512-bit kernel on activation rows prepared once per call (ggml_smallbatch_q8_K_prepare): each
// 32-bit lane of a vector sums one sub-block of 16 weights. The row above spends 4 maddubs and 4 dpwssd a
// super-block (the scales applied in 16 bits) and then a float tail over 8 lanes, per activation row; here
// a super-block is 4 dpbusd from the row's prepared -32 x bsum offsets, one conversion and one fma with
// the scales as floats (x's d times each scale, once per super-block, times y's d). The codes are laid
// out for it once per super-block (a 4 x 4 transpose of 32-bit groups within each 128-bit lane), the
// activations once per call. The integer sum of each sub-block is exact, but its float steps differ from
// ggml_vec_dot_q6_K_q8_K's (a scale per lane in float, not in the integers; 16 lanes summed at the end):
// results within rounding of the per-row kernel's, not bit for bit. Each activation row takes the same
// steps however many rows a call has, so a batch's rows equal the rows decoded alone bit for bit.
// Off unless GGML_SMALLBATCH_Q6_K_PREPARED=1: the set-up's check and tests/test_kernels.py hold the
// kernels' rows to the unpatched module's bit for bit, which this form does not keep (docs/kernels.md).
// Lane 4j + m of every vector here belongs to sub-block 4m + j (j: the 128-bit lane, m: the vector of 64
// codes the transpose takes it from).
typedef struct {
    int8_t  qs[QK_K];  // vector t: in lane 4j + m, the values 4t..4t+3 of sub-block 4m + j
    int32_t off[16];   // -32 x the sum of sub-block 4m + j's 16 values, in lane 4j + m
} sb_q8_K_prepared;    // 320 bytes; a prepared row is nb of them, then nb floats (d), padded to 64 bytes

static const int32_t sb_lane_sub[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};

// Within each 128-bit lane j, the 4 x 4 transpose of the 32-bit groups of v[0..3]: group t of v[m] to
// group m of v[t]
static inline __attribute__((always_inline)) void sb_transpose_4x4(__m512i v[4]) {
    const __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]);
    const __m512i t1 = _mm512_unpackhi_epi32(v[0], v[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]);
    const __m512i t3 = _mm512_unpackhi_epi32(v[2], v[3]);
    v[0] = _mm512_unpacklo_epi64(t0, t2);
    v[1] = _mm512_unpackhi_epi64(t0, t2);
    v[2] = _mm512_unpacklo_epi64(t1, t3);
    v[3] = _mm512_unpackhi_epi64(t1, t3);
}

size_t ggml_smallbatch_q8_K_prepared_size(int n) {
    const size_t nb = (size_t) (n / QK_K);
    return (nb * (sizeof(sb_q8_K_prepared) + sizeof(float)) + 63) & ~(size_t) 63;
}

void ggml_smallbatch_q8_K_prepare(int n, const void * vy, void * out) {
    const int nb = n / QK_K;
    const block_q8_K * y = (const block_q8_K *) vy;
    sb_q8_K_prepared * p = (sb_q8_K_prepared *) out;
    float * d = (float *) (p + nb);
    const __m512i lane_sub = _mm512_loadu_si512((const void *) sb_lane_sub);
    for (int i = 0; i < nb; ++i) {
        __m512i v[4];
        for (int m = 0; m < 4; ++m) {
            v[m] = _mm512_loadu_si512((const void *) (y[i].qs + 64 * m));
        }
        sb_transpose_4x4(v);
        for (int t = 0; t < 4; ++t) {
            _mm512_storeu_si512((void *) (p[i].qs + 64 * t), v[t]);
        }
        const __m512i bsums = _mm512_permutexvar_epi32(lane_sub, _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *) y[i].bsums)));
        _mm512_storeu_si512((void *) p[i].off, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(bsums, 5)));
        d[i] = y[i].d;
    }
}

static inline __attribute__((always_inline)) void sb_q6_K_prepared_512(int n, float * s, const void * vx,
                                                                       const void * const * vy, const int nc) {
    const block_q6_K * x = (const block_q6_K *) vx;
    const int nb = n / QK_K;

    const __m512i lane_sub = _mm512_loadu_si512((const void *) sb_lane_sub);

    __m512 acc[GGML_SMALLBATCH_MAX_COLS];
    for (int c = 0; c < nc; ++c) {
        acc[c] = _mm512_setzero_ps();
    }

    for (int i = 0; i < nb; ++i) {
        GGML_SMALLBATCH_PREFETCH_256((const char *) (x + i + SB_Q6_K_PREFETCH_512), GGML_SMALLBATCH_PREFETCH_L2(nc));
        // x's d times each sub-block's scale, in the sub-block's lane
        const __m512i scales = _mm512_permutexvar_epi32(lane_sub, _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *) x[i].scales)));
        const __m512 xsc = _mm512_mul_ps(_mm512_cvtepi32_ps(scales), _mm512_set1_ps(GGML_CPU_FP16_TO_FP32(x[i].d)));

        __m512i q[4];  // codes 64m..64m+63 as unsigned bytes, in the order of the activations; then transposed
        sb_q6_K_codes_512(x + i, q);
        sb_transpose_4x4(q);

        for (int c = 0; c < nc; ++c) {
            const sb_q8_K_prepared * y = (const sb_q8_K_prepared *) vy[c] + i;
            const float * yd = (const float *) ((const sb_q8_K_prepared *) vy[c] + nb) + i;
            __m512i sum = _mm512_loadu_si512((const void *) y->off);
            for (int t = 0; t < 4; ++t) {
                sum = _mm512_dpbusd_epi32(sum, q[t], _mm512_loadu_si512((const void *) (y->qs + 64 * t)));
            }
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(xsc, _mm512_set1_ps(*yd)), acc[c]);
        }
    }

    for (int c = 0; c < nc; ++c) {
        s[c] = _mm512_reduce_add_ps(acc[c]);
    }
}
#endif

GGML_SMALLBATCH_ROWS(sb_q6_K_q8_K, sb_q6_K_q8_K_nc)
#ifdef SB_Q6_K_512
GGML_SMALLBATCH_ROWS(sb_q6_K_q8_K_512, sb_q6_K_q8_K_512_nc)
GGML_SMALLBATCH_ROWS(sb_q6_K_prepared_512, sb_q6_K_prepared_512_nc)
#endif

ggml_smallbatch_dot_t ggml_smallbatch_q6_K(void) {
#ifdef SB_Q6_K_512
    if (ggml_smallbatch_512()) {
        return sb_q6_K_q8_K_512_nc;
    }
#endif
    return sb_q6_K_q8_K_nc;
}

ggml_smallbatch_dot_t ggml_smallbatch_q6_K_prepared(void) {
#ifdef SB_Q6_K_512
    static int on = -1;
    if (on < 0) {
        const char * env = getenv("GGML_SMALLBATCH_Q6_K_PREPARED");
        on = env != NULL && atoi(env) != 0;
    }
    if (on && ggml_smallbatch_512()) {
        return sb_q6_K_prepared_512_nc;
    }
#endif
    return NULL;
}

#else

ggml_smallbatch_dot_t ggml_smallbatch_q6_K(void) {
    return NULL;  // the per-row kernel is the only one for this instruction set
}

ggml_smallbatch_dot_t ggml_smallbatch_q6_K_prepared(void) {
    return NULL;
}

#endif

#ifndef SB_Q6_K_512  // no prepared Q6_K kernel in this build: nothing is ever prepared
size_t ggml_smallbatch_q8_K_prepared_size(int n) {
    (void) n;
    return 0;
}

void ggml_smallbatch_q8_K_prepare(int n, const void * vy, void * out) {
    (void) n;
    (void) vy;
    (void) out;
}
#endif
