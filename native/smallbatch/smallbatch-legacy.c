// ggml's legacy quants (blocks of 32 weights, one or two half-precision factors a block): Q8_0, Q4_0 and
// Q5_0 weights x Q8_0 activations and Q4_1 weights x Q8_1 activations, one weight row against up to
// GGML_SMALLBATCH_MAX_COLS activation rows.
//
// A Q8_0 block holds 32 int8 codes and a half-precision d; a row's dot product with a Q8_0 row is
//     sum_b d_x[b] * d_y[b] * sum_{i in b} x_i * y_i.
// ggml_vec_dot_q8_0_q8_0 (arch/x86/quants.c) takes, per block, the products' sums over four
// neighbouring codes in eight int32 lanes (|x| against y with x's signs), converts them to float and
// adds d_x * d_y times them to eight float lanes, then sums the lanes. Here each weight block is
// loaded and its absolute value taken once, then dotted with every activation row: the same integer
// lanes, the same float steps, so each result equals vec_dot's bit for bit (native/smallbatch/bench).
// Q4_0 and Q5_0 are the same sums once their codes are unpacked to signed bytes (4 and 5 bits less 8 and
// 16), as ggml_vec_dot_q4_0_q8_0 and ggml_vec_dot_q5_0_q8_0 unpack them.
//
// The bundled models tie their output layer to a Q8_0 token embedding (Gemma 3 270M: 262,144 x 640,
// three quarters of its weights), and ggml sends a Q8_0 mat-mul of 2-32 rows to llamafile's
// tinyBLAS_Q0, which on an AMD Zen 5 took 2.7x the single-row time for 2 rows: a pass over 2 rows
// cost 2.04 single passes.
//
// A Q4_1 block holds 32 4-bit codes (weights 0-15 in the low nibbles, 16-31 in the high ones), a factor
// d and an offset m; the Q8_1 activation block carries s = d_y * sum y. ggml_vec_dot_q4_1_q8_1 adds
// d_x * d_y times the codes' integer lane sums to eight float lanes, as above, and m_x * s_y to a
// float scalar, in block order; the result is the lanes' sum plus the scalar. The bundled SmolLM2-135M
// is Q4_1 but for its output layer.
#include "smallbatch.h"

#define GGML_COMMON_DECL_C
#include "ggml-common.h"
#include "ggml-cpu-impl.h"
#include "simd-mappings.h"

#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>

// Blocks ahead that the weight streams are prefetched (8 x 34 and 12 x 20 bytes)
#define SB_Q8_0_PREFETCH 8
#define SB_Q4_1_PREFETCH 12

// the eight int32 sums of |x| * (y with x's signs) over four neighbouring codes: vec_dot's
// mul_sum_us8_pairs_float before its conversion
static inline __m256i sb_sum_us8(const __m256i ax, const __m256i sy) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ax, sy);
#else
    return _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(ax, sy));
#endif
}

// 32 4-bit codes as bytes 0..15: the low nibbles (weights 0-15) then the high ones (16-31), as vec_dot's
// bytes_from_nibbles_32 unpacks them
static inline __m256i sb_nibbles_32(const uint8_t * qs) {
    const __m128i bits = _mm_loadu_si128((const __m128i *) qs);
    return _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(bits), _mm_srli_epi16(bits, 4), 1),
                            _mm256_set1_epi8(0x0f));
}

// The codes of block i of a row of `type` as signed bytes, as vec_dot unpacks them, and its factor
// d (type is a constant in every use, so the switch folds away)
enum { SB_Q8_0, SB_Q4_0, SB_Q5_0 };

static inline __attribute__((always_inline)) __m256i sb_signed_codes(const int type, const void * vx, const int i,
                                                                    float * d) {
    switch (type) {
        case SB_Q4_0: {  // low nibbles: weights 0-15, high: 16-31; minus 8
            const block_q4_0 * x = (const block_q4_0 *) vx + i;
            *d = GGML_CPU_FP16_TO_FP32(x->d);
            return _mm256_sub_epi8(sb_nibbles_32(x->qs), _mm256_set1_epi8(8));
        }
        case SB_Q5_0: {  // as Q4_0, the fifth bits in qh; minus 16 (0xF0 where the bit is clear)
            const block_q5_0 * x = (const block_q5_0 *) vx + i;
            *d = GGML_CPU_FP16_TO_FP32(x->d);
            const __m256i q = sb_nibbles_32(x->qs);
            uint32_t qh;
            memcpy(&qh, x->qh, sizeof(qh));
            const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int) qh),
                                                       _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                         0x0101010101010101, 0x0000000000000000));
            const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                                                  _mm256_set1_epi64x(-1));
            return _mm256_or_si256(q, _mm256_andnot_si256(set, _mm256_set1_epi8((char) 0xF0)));
        }
        default: {
            const block_q8_0 * x = (const block_q8_0 *) vx + i;
            *d = GGML_CPU_FP16_TO_FP32(x->d);
            return _mm256_loadu_si256((const __m256i *) x->qs);
        }
    }
}

static inline __attribute__((always_inline)) size_t sb_block_size(const int type) {
    return type == SB_Q4_0 ? sizeof(block_q4_0) : type == SB_Q5_0 ? sizeof(block_q5_0) : sizeof(block_q8_0);
}

// Q8_0, Q4_0 and Q5_0 weights x Q8_0 activations. nc is a compile-time constant in each instantiation
// below, so the column loops unroll and the accumulators stay in registers.
static inline __attribute__((always_inline)) void sb_qx_0_q8_0(const int type, int n, float * s, const void * vx,
                                                               const void * const * vy, const int nc) {
    const int nb = n / QK8_0;

    __m256 acc[GGML_SMALLBATCH_MAX_COLS];
    for (int c = 0; c < nc; ++c) {
        acc[c] = _mm256_setzero_ps();
    }
    for (int i = 0; i < nb; ++i) {
        _mm_prefetch((const char *) vx + (i + SB_Q8_0_PREFETCH) * sb_block_size(type), _MM_HINT_T0);
        float xd;
        const __m256i qx = sb_signed_codes(type, vx, i, &xd);
        const __m256i ax = _mm256_sign_epi8(qx, qx);
        for (int c = 0; c < nc; ++c) {
            const block_q8_0 * y = (const block_q8_0 *) vy[c] + i;
            const __m256i sy = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *) y->qs), qx);
            const __m256 d = _mm256_set1_ps(xd * GGML_CPU_FP16_TO_FP32(y->d));
            acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sb_sum_us8(ax, sy)), acc[c]);
        }
    }
    for (int c = 0; c < nc; ++c) {
        s[c] = ggml_smallbatch_hsum_float_8(acc[c]);
    }
}

#define SB_QX_0(NAME, TYPE) \
    static inline __attribute__((always_inline)) void NAME(int n, float * s, const void * vx, const void * const * vy, \
                                                           const int nc) { \
        sb_qx_0_q8_0(TYPE, n, s, vx, vy, nc); \
    }
SB_QX_0(sb_q8_0_q8_0, SB_Q8_0)
SB_QX_0(sb_q4_0_q8_0, SB_Q4_0)
SB_QX_0(sb_q5_0_q8_0, SB_Q5_0)

// Q4_1: the codes of a block unpacked once, the integer lanes per activation row as above; the offsets'
// products summed per row in a float scalar, one a block, as vec_dot does.
static inline __attribute__((always_inline)) void sb_q4_1_q8_1(int n, float * s, const void * vx,
                                                               const void * const * vy, const int nc) {
    const block_q4_1 * x = (const block_q4_1 *) vx;
    const int nb = n / QK4_1;

    __m256 acc[GGML_SMALLBATCH_MAX_COLS];
    float summs[GGML_SMALLBATCH_MAX_COLS];
    for (int c = 0; c < nc; ++c) {
        acc[c] = _mm256_setzero_ps();
        summs[c] = 0.0f;
    }
    for (int i = 0; i < nb; ++i) {
        _mm_prefetch((const char *) (x + i + SB_Q4_1_PREFETCH), _MM_HINT_T0);
        const float xd = GGML_CPU_FP16_TO_FP32(x[i].d);
        const float xm = GGML_CPU_FP16_TO_FP32(x[i].m);
        const __m256i qx = sb_nibbles_32(x[i].qs);
        for (int c = 0; c < nc; ++c) {
            const block_q8_1 * y = (const block_q8_1 *) vy[c] + i;
            // written as vec_dot writes it, so the compiler contracts it (or not) alike: one fma where the
            // build allows contraction (GCC's default outside strict ISO C, as ggml builds), else a
            // product and a sum
            summs[c] += xm * GGML_CPU_FP16_TO_FP32(y->s);
            const __m256 d = _mm256_mul_ps(_mm256_set1_ps(xd), _mm256_set1_ps(GGML_CPU_FP16_TO_FP32(y->d)));
            const __m256i qy = _mm256_loadu_si256((const __m256i *) y->qs);
            acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sb_sum_us8(qx, qy)), acc[c]);
        }
    }
    for (int c = 0; c < nc; ++c) {
        s[c] = ggml_smallbatch_hsum_float_8(acc[c]) + summs[c];
    }
}

GGML_SMALLBATCH_ROWS(sb_q8_0_q8_0, sb_q8_0_q8_0_nc)
GGML_SMALLBATCH_ROWS(sb_q4_0_q8_0, sb_q4_0_q8_0_nc)
GGML_SMALLBATCH_ROWS(sb_q5_0_q8_0, sb_q5_0_q8_0_nc)
GGML_SMALLBATCH_ROWS(sb_q4_1_q8_1, sb_q4_1_q8_1_nc)

// The kernels where this instruction set has them; NULL: the per-row kernels are the only ones
#define SB_LEGACY_KERNEL(NAME) NAME
#else
#define SB_LEGACY_KERNEL(NAME) NULL
#endif

ggml_smallbatch_dot_t ggml_smallbatch_q8_0(void) {
    return SB_LEGACY_KERNEL(sb_q8_0_q8_0_nc);
}

ggml_smallbatch_dot_t ggml_smallbatch_q4_0(void) {
    return SB_LEGACY_KERNEL(sb_q4_0_q8_0_nc);
}

ggml_smallbatch_dot_t ggml_smallbatch_q5_0(void) {
    return SB_LEGACY_KERNEL(sb_q5_0_q8_0_nc);
}

ggml_smallbatch_dot_t ggml_smallbatch_q4_1(void) {
    return SB_LEGACY_KERNEL(sb_q4_1_q8_1_nc);
}

