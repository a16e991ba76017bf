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

#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>

// Blocks ahead that the weight streams are prefetched (8 x 34 and 12 x 20 bytes)
#define SB_Q8_0_PREFETCH 8
#define SB_Q4_1_PREFETCH 12

// acc + the eight int32 sums of unsigned u x signed v bytes over four neighbouring bytes (exact where no
// pair of products exceeds an int16, as in every caller here). With acc 0 and u = |x|, v = y with x's
// signs: vec_dot's mul_sum_us8_pairs_float before its conversion
static inline __m256i sb_sum_us8(const __m256i acc, const __m256i u, const __m256i v) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, v);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, v);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(u, v)));
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
            acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sb_sum_us8(_mm256_setzero_si256(), ax, sy)), acc[c]);
        }
    }
    for (int c = 0; c < nc; ++c) {
        s[c] = ggml_smallbatch_hsum_float_8(acc[c]);
    }
}

#ifdef GGML_SMALLBATCH_HAS_VNNI
// The same sums from activation rows prepared once per call (ggml_smallbatch_q8_0_prepare): vec_dot's
// |x| against y with x's signs costs a sign instruction per activation row and block, and its d a
// conversion and a product. Here x + 128 (unsigned; x ^ 0x80) goes against y with one dpbusd that starts
// each lane at -128 x the sum of its four y (prepared): sum (x + 128) y - 128 sum y = sum x y, exactly
// vec_dot's lane (y is never -128 in Q8_0, where |x| against -y would wrap). d is the prepared float
// times x's, the product vec_dot forms. Same integers, same float steps: bit for bit.
typedef struct {
    int8_t  qs[QK8_0];
    int32_t init[8];  // -128 x the sum of y over each lane's four codes
} sb_q8_0_prepared;   // 64 bytes; a prepared row is n/32 of them, then n/32 floats (d)

size_t ggml_smallbatch_q8_0_prepared_size(int n) {
    return (size_t) (n / QK8_0) * (sizeof(sb_q8_0_prepared) + sizeof(float));
}

void ggml_smallbatch_q8_0_prepare(int n, const void * vy, void * out) {
    const int nb = n / QK8_0;
    const block_q8_0 * y = (const block_q8_0 *) vy;
    sb_q8_0_prepared * p = (sb_q8_0_prepared *) out;
    float * d = (float *) (p + nb);
    const __m256i m128 = _mm256_set1_epi8((char) 0x80);
    for (int i = 0; i < nb; ++i) {
        const __m256i q = _mm256_loadu_si256((const __m256i *) y[i].qs);
        _mm256_storeu_si256((__m256i *) p[i].qs, q);
        _mm256_storeu_si256((__m256i *) p[i].init, _mm256_sub_epi32(_mm256_setzero_si256(), sb_sum_us8(_mm256_setzero_si256(), m128, q)));
        d[i] = GGML_CPU_FP16_TO_FP32(y[i].d);
    }
}

static inline __attribute__((always_inline)) void sb_qx_0_prepared(const int type, int n, float * s, const void * vx,
                                                                   const void * const * vy, const int nc) {
    const int nb = n / QK8_0;
    const __m256i m128 = _mm256_set1_epi8((char) 0x80);

    __m256 acc[GGML_SMALLBATCH_MAX_COLS];
    for (int c = 0; c < nc; ++c) {
        acc[c] = _mm256_setzero_ps();
    }
    for (int i = 0; i < nb; ++i) {
        _mm_prefetch((const char *) vx + (i + SB_Q8_0_PREFETCH) * sb_block_size(type), _MM_HINT_T0);
        float xd;
        const __m256i ux = _mm256_xor_si256(sb_signed_codes(type, vx, i, &xd), m128);
        const __m256  xd8 = _mm256_set1_ps(xd);
        for (int c = 0; c < nc; ++c) {
            const sb_q8_0_prepared * y = (const sb_q8_0_prepared *) vy[c] + i;
            const float * yd = (const float *) ((const sb_q8_0_prepared *) vy[c] + nb) + i;
            const __m256i isum = sb_sum_us8(_mm256_loadu_si256((const __m256i *) y->init), ux,
                                            _mm256_loadu_si256((const __m256i *) y->qs));
            const __m256 d = _mm256_mul_ps(xd8, _mm256_broadcast_ss(yd));
            acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc[c]);
        }
    }
    for (int c = 0; c < nc; ++c) {
        s[c] = ggml_smallbatch_hsum_float_8(acc[c]);
    }
}
#endif

// NAME: KERNEL for weights of TYPE, in the kernels' signature
#define SB_QX_0(NAME, KERNEL, TYPE) \
    static inline __attribute__((always_inline)) void NAME(int n, float * s, const void * vx, const void * const * vy, \
                                                           const int nc) { \
        KERNEL(TYPE, n, s, vx, vy, nc); \
    }
SB_QX_0(sb_q8_0_q8_0, sb_qx_0_q8_0, SB_Q8_0)
SB_QX_0(sb_q4_0_q8_0, sb_qx_0_q8_0, SB_Q4_0)
SB_QX_0(sb_q5_0_q8_0, sb_qx_0_q8_0, SB_Q5_0)
#ifdef GGML_SMALLBATCH_HAS_VNNI
SB_QX_0(sb_q8_0_prep, sb_qx_0_prepared, SB_Q8_0)
SB_QX_0(sb_q4_0_prep, sb_qx_0_prepared, SB_Q4_0)
SB_QX_0(sb_q5_0_prep, sb_qx_0_prepared, SB_Q5_0)
#endif

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
            acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sb_sum_us8(_mm256_setzero_si256(), qx, qy)), acc[c]);
        }
    }
    for (int c = 0; c < nc; ++c) {
        s[c] = ggml_smallbatch_hsum_float_8(acc[c]) + summs[c];
    }
}

// MXFP4 repacked eight rows at a time (repack.cpp's block_mxfp4x8: the eight rows' E8M0 exponents, then
// their 16-byte code blocks interleaved in 8-byte chunks) against Q8_0 activation rows. A weight is
// kvalues_mxfp4[code] (twice its FP4 E2M1 value: -12..12) times the block's exponent halved.
// ggml_gemv_mxfp4_8x8_q8_0 (arch/x86/repack.cpp) gives each 32-bit lane one weight row's exact integer dot
// over the 32 codes of a block (rows in the order 0, 4, 1, 5, 2, 6, 3, 7), converts it to float and adds
// it times exponent * d_y to that lane with one fma, block after block; the lanes are the eight results.
// Here the codes of a block are looked up once for all activation rows, as unsigned bytes (value + 12, so
// that one vpdpbusd takes four of them against four activation bytes), and each activation row starts its
// lanes from -12 x the sum of its 32 values: the same integer per lane, then the same float steps, so
// every result equals the gemv's bit for bit. The gemv is measured faster for one row; this takes 2 and more.
typedef struct {
    uint8_t e[8];
    uint8_t qs[QK_MXFP4 * 4];
} sb_block_mxfp4x8;

// Blocks of eight rows ahead that the weight stream is prefetched (4 x 136 bytes)
#define SB_MXFP4X8_PREFETCH 4


static inline __attribute__((always_inline)) void sb_mxfp4x8_q8_0(int n, float * s, size_t bs, const void * vx,
                                                                  const void * const * vy, const int nr, int nc) {
    const int nb = n / QK8_0;
    // 12 x the sum of each activation row's 32 values, per block (exact; kept per thread for the next call)
    static __thread int32_t * sums = NULL;
    static __thread size_t    cap  = 0;
    if (cap < (size_t) nr * nb) {
        int32_t * grown = (int32_t *) realloc(sums, sizeof(int32_t) * nr * nb);
        if (grown == NULL) {
            GGML_ABORT("out of memory");
        }
        sums = grown;
        cap  = (size_t) nr * nb;
    }
    for (int r = 0; r < nr; ++r) {
        const block_q8_0 * y = (const block_q8_0 *) vy[r];
        for (int b = 0; b < nb; ++b) {
            const __m256i v = _mm256_loadu_si256((const __m256i *) y[b].qs);
            const __m256i p = sb_sum_us8(_mm256_setzero_si256(), _mm256_set1_epi8(1), v);
            __m128i t = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
            sums[r * nb + b] = 12 * _mm_cvtsi128_si32(t);
        }
    }
    // kvalues_mxfp4 (ggml-common.h: 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12) + 12
    const __m256i lut  = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                          12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    const __m256i m4   = _mm256_set1_epi8(0x0f);
    const __m256i perm = _mm256_set_epi32(7, 5, 3, 1, 6, 4, 2, 0);  // lanes 0, 4, 1, 5, ... back to rows 0-7

    for (int x = 0; x < nc / 8; ++x) {
        const sb_block_mxfp4x8 * w = (const sb_block_mxfp4x8 *) vx + (size_t) x * nb;
        __m256 acc[GGML_SMALLBATCH_MAX_COLS];
        for (int r = 0; r < nr; ++r) {
            acc[r] = _mm256_setzero_ps();
        }
        for (int b = 0; b < nb; ++b) {
            _mm_prefetch((const char *) (w + b + SB_MXFP4X8_PREFETCH), _MM_HINT_T0);
            _mm_prefetch((const char *) (w + b + SB_MXFP4X8_PREFETCH) + 64, _MM_HINT_T0);
            _mm_prefetch((const char *) (w + b + SB_MXFP4X8_PREFETCH) + 128, _MM_HINT_T0);
            const __m256i q0 = _mm256_loadu_si256((const __m256i *) w[b].qs);         // rows 0-3, bytes 0-7
            const __m256i q1 = _mm256_loadu_si256((const __m256i *) w[b].qs + 1);     // rows 4-7, bytes 0-7
            const __m256i q2 = _mm256_loadu_si256((const __m256i *) w[b].qs + 2);     // rows 0-3, bytes 8-15
            const __m256i q3 = _mm256_loadu_si256((const __m256i *) w[b].qs + 3);     // rows 4-7, bytes 8-15
            // bytes 4k..4k+3 of rows 0, 4, 1, 5, 2, 6, 3, 7 (the gemv's lanes)
            const __m256i r0 = _mm256_blend_epi32(q0, _mm256_shuffle_epi32(q1, 0xb1), 0xaa);
            const __m256i r1 = _mm256_blend_epi32(_mm256_shuffle_epi32(q0, 0xb1), q1, 0xaa);
            const __m256i r2 = _mm256_blend_epi32(q2, _mm256_shuffle_epi32(q3, 0xb1), 0xaa);
            const __m256i r3 = _mm256_blend_epi32(_mm256_shuffle_epi32(q2, 0xb1), q3, 0xaa);
            // codes 4k..4k+3 (k < 4: low nibbles, weights 0-15; then high ones, 16-31) as value + 12
            __m256i wu[8];
            wu[0] = _mm256_shuffle_epi8(lut, _mm256_and_si256(r0, m4));
            wu[1] = _mm256_shuffle_epi8(lut, _mm256_and_si256(r1, m4));
            wu[2] = _mm256_shuffle_epi8(lut, _mm256_and_si256(r2, m4));
            wu[3] = _mm256_shuffle_epi8(lut, _mm256_and_si256(r3, m4));
            wu[4] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(r0, 4), m4));
            wu[5] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(r1, 4), m4));
            wu[6] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(r2, 4), m4));
            wu[7] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(r3, 4), m4));
            const __m256 col = _mm256_set_ps(
                GGML_CPU_E8M0_TO_FP32_HALF(w[b].e[7]), GGML_CPU_E8M0_TO_FP32_HALF(w[b].e[3]),
                GGML_CPU_E8M0_TO_FP32_HALF(w[b].e[6]), GGML_CPU_E8M0_TO_FP32_HALF(w[b].e[2]),
                GGML_CPU_E8M0_TO_FP32_HALF(w[b].e[5]), GGML_CPU_E8M0_TO_FP32_HALF(w[b].e[1]),
                GGML_CPU_E8M0_TO_FP32_HALF(w[b].e[4]), GGML_CPU_E8M0_TO_FP32_HALF(w[b].e[0]));
            for (int r = 0; r < nr; ++r) {
                const block_q8_0 * y = (const block_q8_0 *) vy[r] + b;
                const int32_t * a = (const int32_t *) y->qs;
                __m256i iacc = _mm256_set1_epi32(-sums[r * nb + b]);
                for (int k = 0; k < 8; ++k) {
                    int32_t a4;
                    memcpy(&a4, a + k, sizeof(a4));
                    iacc = sb_sum_us8(iacc, wu[k], _mm256_set1_epi32(a4));
                }
                const __m256 row = _mm256_set1_ps(GGML_CPU_FP16_TO_FP32(y->d));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc), _mm256_mul_ps(col, row), acc[r]);
            }
        }
        for (int r = 0; r < nr; ++r) {
            _mm256_storeu_ps(s + r * bs + x * 8, _mm256_permutevar8x32_ps(acc[r], perm));
        }
    }
}

#define SB_MXFP4X8_NR(NR) \
    static void sb_mxfp4x8_q8_0_##NR(int n, float * s, size_t bs, const void * vx, const void * const * vy, int nc) { \
        sb_mxfp4x8_q8_0(n, s, bs, vx, vy, NR, nc); \
    }
SB_MXFP4X8_NR(1) SB_MXFP4X8_NR(2) SB_MXFP4X8_NR(3) SB_MXFP4X8_NR(4)
SB_MXFP4X8_NR(5) SB_MXFP4X8_NR(6) SB_MXFP4X8_NR(7) SB_MXFP4X8_NR(8)

static void sb_mxfp4x8_q8_0_nr(int n, float * s, size_t bs, const void * vx, const void * const * vy, int nr, int nc) {
    switch (nr) {
        case 1: sb_mxfp4x8_q8_0_1(n, s, bs, vx, vy, nc); break;
        case 2: sb_mxfp4x8_q8_0_2(n, s, bs, vx, vy, nc); break;
        case 3: sb_mxfp4x8_q8_0_3(n, s, bs, vx, vy, nc); break;
        case 4: sb_mxfp4x8_q8_0_4(n, s, bs, vx, vy, nc); break;
        case 5: sb_mxfp4x8_q8_0_5(n, s, bs, vx, vy, nc); break;
        case 6: sb_mxfp4x8_q8_0_6(n, s, bs, vx, vy, nc); break;
        case 7: sb_mxfp4x8_q8_0_7(n, s, bs, vx, vy, nc); break;
        default: sb_mxfp4x8_q8_0_8(n, s, bs, vx, vy, nc); break;
    }
}
#define SB_MXFP4X8 1

GGML_SMALLBATCH_ROWS(sb_q8_0_q8_0, sb_q8_0_q8_0_nc)
GGML_SMALLBATCH_ROWS(sb_q4_0_q8_0, sb_q4_0_q8_0_nc)
GGML_SMALLBATCH_ROWS(sb_q5_0_q8_0, sb_q5_0_q8_0_nc)
GGML_SMALLBATCH_ROWS(sb_q4_1_q8_1, sb_q4_1_q8_1_nc)
#ifdef GGML_SMALLBATCH_HAS_VNNI
GGML_SMALLBATCH_ROWS(sb_q8_0_prep, sb_q8_0_prep_nc)
GGML_SMALLBATCH_ROWS(sb_q4_0_prep, sb_q4_0_prep_nc)
GGML_SMALLBATCH_ROWS(sb_q5_0_prep, sb_q5_0_prep_nc)
#define SB_PREPARED 1
#endif

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

ggml_smallbatch_dot_t ggml_smallbatch_prepared_kernel(enum ggml_type type) {
#ifdef SB_PREPARED
    switch (type) {
        case GGML_TYPE_Q8_0: return sb_q8_0_prep_nc;
        case GGML_TYPE_Q4_0: return sb_q4_0_prep_nc;
        case GGML_TYPE_Q5_0: return sb_q5_0_prep_nc;
        default:             return NULL;
    }
#else
    (void) type;
    return NULL;
#endif
}

#ifndef SB_PREPARED  // no prepared kernels in this build: nothing is ever prepared
size_t ggml_smallbatch_q8_0_prepared_size(int n) {
    (void) n;
    return 0;
}

void ggml_smallbatch_q8_0_prepare(int n, const void * vy, void * out) {
    (void) n;
    (void) vy;
    (void) out;
}
#endif

ggml_smallbatch_gemm_t ggml_smallbatch_mxfp4x8(void) {
#ifdef SB_MXFP4X8
    return sb_mxfp4x8_q8_0_nr;
#else
    return NULL;  // the repacked layout is an AVX2 one; without it repack.cpp's own path runs
#endif
}
