// Q4_K weights repacked eight rows at a time (ggml's block_q4_Kx8, repack.cpp) x Q8_K activations:
// eight weight rows against up to GGML_SMALLBATCH_MAX_COLS activation rows in one pass.
//
// The repacked layout interleaves eight Q4_K rows in 8-byte chunks, so one 32-byte load holds the
// same 8 positions of four rows. The chunks are unpacked to bytes and regrouped so that each
// 32-bit lane holds 4 consecutive weights of one row (lane order 0 4 1 5 2 6 3 7), once per
// 64-weight step; every activation row then multiplies them with its own 4 bytes broadcast to all
// lanes (dpbusd), scales each 32-weight sub-block per row (the 6-bit scales) and takes out the
// 6-bit mins with its per-32 sums. The integer sums per row and lane are exact, and the float
// steps per row are those of ggml_gemv_q4_K_8x8_q8_K (arch/x86/repack.cpp), so each activation
// row gets that kernel's result bit for bit, whatever the number of rows.
#include "smallbatch.h"

#define GGML_COMMON_DECL_C
#include "ggml-common.h"
#include "ggml-cpu-impl.h"

#include <string.h>

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

// ggml's block_q4_Kx8 (repack.h): the d, dmin, scales and quants of eight Q4_K blocks, interleaved
typedef struct {
    ggml_half d[8];
    ggml_half dmin[8];
    uint8_t   scales[96];
    uint8_t   qs[1024];
} sb_block_q4_Kx8;
_Static_assert(sizeof(sb_block_q4_Kx8) == 16 * sizeof(ggml_half) + 8 * K_SCALE_SIZE + 4 * QK_K, "block_q4_Kx8 layout");

// Blocks of eight rows ahead that the weight stream is prefetched (2,304 bytes), as in the Q6_K
// kernel and for the same reason (smallbatch-q6_K.c): the groups of eight rows of a call are contiguous.
#define SB_Q4_KX8_PREFETCH 2
// The 512-bit kernel (AMD Zen 5) goes through its weights about twice as fast and prefetches 6 blocks
// (6,912 bytes) ahead: at 2 its passes over several rows waited on memory (4-12 were alike; docs/kernels.md).
#define SB_Q4_KX8_PREFETCH_512 6

// acc + the sums of 4 products of unsigned (a) and signed (b) bytes per 32-bit lane; exact
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SB_DPBUSD(acc, a, b) _mm256_dpbusd_epi32((acc), (a), (b))
#elif defined(__AVXVNNI__)
#define SB_DPBUSD(acc, a, b) _mm256_dpbusd_avx_epi32((acc), (a), (b))
#else
#define SB_DPBUSD(acc, a, b) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((a), (b)), _mm256_set1_epi16(1)))
#endif

// The 6-bit scales and mins of the eight rows for sub-blocks 2sb (low 128 bits) and 2sb+1 (high),
// each as bytes 0-3 scales of rows 0-3, 4-7 scales of rows 4-7, 8-11 mins of rows 0-3, 12-15 mins
// of rows 4-7. Each sub-block's 12 packed bytes hold: bytes 0-3 the scales of rows 0-3 (low 6 bits)
// and bits 4-5 of rows 4-7's (top 2 bits), bytes 4-7 the same for the mins, bytes 8-11 the low 4
// bits of rows 4-7's scales (low nibble) and mins (high nibble). Vector form of ggml's scalar decode.
static inline __m256i sb_scales_mins(const uint8_t * packed) {
    // 16 bytes from each of the two 12-byte groups (the 4 bytes past the second lie inside the block)
    const __m256i v = _mm256_loadu2_m128i((const __m128i *) (packed + 12), (const __m128i *) packed);
    const __m256i m63 = _mm256_set1_epi8(63);
    // rows 0-3: bytes 0-3 scales, 4-7 mins
    const __m256i r03 = _mm256_and_si256(v, m63);
    // rows 4-7: bytes 8-11 to 0-3 and 4-7, the scales' low nibble in 0-3 and the mins' high one in 4-7
    const __m256i c  = _mm256_shuffle_epi8(v, _mm256_setr_epi8(8, 9, 10, 11, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1,
                                                              8, 9, 10, 11, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1));
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(c, _mm256_setr_epi32(0, 4, 0, 0, 0, 4, 0, 0)), _mm256_set1_epi8(15));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 2), _mm256_set1_epi8(48));  // top 2 bits of 0-7 to bits 4-5
    const __m256i r47 = _mm256_or_si256(lo, hi);
    return _mm256_unpacklo_epi32(r03, r47);
}

// With VNNI, the high nibbles of a byte are used in place, as 16 x the code (0..240): dpbusd sums the
// four products in 32 bits, exactly. Without it maddubs' 16-bit pair sums would saturate, so the
// codes are shifted down as before.
#ifdef GGML_SMALLBATCH_HAS_VNNI
#define SB_Q4_HIGH_X16 1
#else
#define SB_Q4_HIGH_X16 0
#endif

// acc + dpbusd(a, the 4 bytes at p in every lane). With AVX-512VL the broadcast is dpbusd's
// embedded-broadcast memory operand ({1to8}): a separate broadcast instruction would take an
// execution slot of the same pipes as dpbusd on Zen 4 (measured: 1 cycle per broadcast + dpbusd pair,
// 0.5 with the embedded broadcast). GCC does not fold the broadcast itself, hence the asm.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__GNUC__)
static inline __m256i sb_dpbusd_bcast(__m256i acc, const __m256i a, const int8_t * p) {
    __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*(const int32_t *) p));
    return acc;
}
#else
static inline __m256i sb_dpbusd_bcast(__m256i acc, const __m256i a, const int8_t * p) {
    int32_t v;
    memcpy(&v, p, sizeof(v));
    return SB_DPBUSD(acc, a, _mm256_set1_epi32(v));
}
#endif

static inline __attribute__((always_inline)) void sb_q4_Kx8_q8_K(int n, float * s, size_t bs, const void * vx,
                                                                 const void * const * vy, const int nr, int nc) {
    const int nb = n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    // lanes 0 4 1 5 2 6 3 7 of the regrouped quants, for the scales, the d's and the final order
    const __m128i lane_order8  = _mm_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i lane_order16 = _mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
    const __m256i to_rows      = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);

    for (int x = 0; x < nc / 8; ++x) {
        const sb_block_q4_Kx8 * w = (const sb_block_q4_Kx8 *) vx + (size_t) x * nb;
        __m256 acc[GGML_SMALLBATCH_MAX_COLS];
        __m256 acc_min[GGML_SMALLBATCH_MAX_COLS];
        for (int r = 0; r < nr; ++r) {
            acc[r] = _mm256_setzero_ps();
            acc_min[r] = _mm256_setzero_ps();
        }
        for (int b = 0; b < nb; ++b) {
            for (int l = 0; l < (int) sizeof(sb_block_q4_Kx8); l += 256) {  // 1,152 bytes
                GGML_SMALLBATCH_PREFETCH_256((const char *) (w + b + SB_Q4_KX8_PREFETCH) + l, GGML_SMALLBATCH_PREFETCH_L2(nr));
            }
            const __m256 d_lanes = _mm256_cvtph_ps(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *) w[b].d), lane_order16));
            const __m256 dmin    = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w[b].dmin));
            __m256i isum[GGML_SMALLBATCH_MAX_COLS];
            __m256i imin[GGML_SMALLBATCH_MAX_COLS];
            __m256i pair_sums[GGML_SMALLBATCH_MAX_COLS];  // lane sb: sums of sub-blocks 2sb, 2sb+1 (int16 each)
            for (int r = 0; r < nr; ++r) {
                isum[r] = _mm256_setzero_si256();
                imin[r] = _mm256_setzero_si256();
                const __m256i bsums = _mm256_loadu_si256((const __m256i *) ((const block_q8_K *) vy[r] + b)->bsums);
                pair_sums[r] = _mm256_castsi128_si256(_mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1)));
            }
            for (int sb = 0; sb < QK_K / 64; ++sb) {
                // q[h][k]: sub-block 2sb+h, weights 4k..4k+3 of each row (lanes 0 4 1 5 2 6 3 7)
                __m256i q[2][8];
                const uint8_t * qs = w[b].qs + sb * 256;
                for (int j = 0; j < 4; ++j) {
                    const __m256i lo = _mm256_loadu_si256((const __m256i *) (qs + 64 * j));       // rows 0-3
                    const __m256i hi = _mm256_loadu_si256((const __m256i *) (qs + 64 * j + 32));  // rows 4-7
                    const __m256i lo_sw = _mm256_shuffle_epi32(lo, 0xb1);
                    const __m256i hi_sw = _mm256_shuffle_epi32(hi, 0xb1);
                    const __m256i even = _mm256_blend_epi32(lo, hi_sw, 0xaa);  // weights 8j..8j+3
                    const __m256i odd  = _mm256_blend_epi32(lo_sw, hi, 0xaa);  // weights 8j+4..8j+7
                    q[0][2 * j]     = _mm256_and_si256(even, m4);
                    q[0][2 * j + 1] = _mm256_and_si256(odd, m4);
#if SB_Q4_HIGH_X16
                    // the high nibbles left in place (16 x the code): no shift, which on Zen 4 competes
                    // with dpbusd for its pipes; the factor 16 is taken out once per super-block below
                    q[1][2 * j]     = _mm256_andnot_si256(m4, even);
                    q[1][2 * j + 1] = _mm256_andnot_si256(m4, odd);
#else
                    q[1][2 * j]     = _mm256_and_si256(_mm256_srli_epi16(even, 4), m4);
                    q[1][2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(odd, 4), m4);
#endif
                }
                const __m256i sm  = sb_scales_mins(w[b].scales + 24 * sb);
                const __m128i sm0 = _mm256_castsi256_si128(sm);
                const __m128i sm1 = _mm256_extracti128_si256(sm, 1);
#if SB_Q4_HIGH_X16
                // 16 x the scales of sub-block 2sb, to match the 16 x codes of sub-block 2sb+1
                const __m256i sc0 = _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_shuffle_epi8(sm0, lane_order8)), 4);
#else
                const __m256i sc0 = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(sm0, lane_order8));
#endif
                const __m256i sc1 = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(sm1, lane_order8));
                // per row in natural order: min of sub-block 2sb, min of 2sb+1
                const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_shuffle_epi32(sm0, 0x4e), _mm_shuffle_epi32(sm1, 0x4e)));

                for (int r = 0; r < nr; ++r) {
                    const int8_t * a = ((const block_q8_K *) vy[r] + b)->qs + sb * 64;
                    // four dependency chains of four dpbusd (exact int32 sums: any order)
                    __m256i s0 = _mm256_setzero_si256(), t0 = _mm256_setzero_si256();
                    __m256i s1 = _mm256_setzero_si256(), t1 = _mm256_setzero_si256();
                    for (int k = 0; k < 8; k += 2) {  // activations 4k..4k+3 of each sub-block, in every lane
                        s0 = sb_dpbusd_bcast(s0, q[0][k], a + 4 * k);
                        s1 = sb_dpbusd_bcast(s1, q[1][k], a + 32 + 4 * k);
                        t0 = sb_dpbusd_bcast(t0, q[0][k + 1], a + 4 * k + 4);
                        t1 = sb_dpbusd_bcast(t1, q[1][k + 1], a + 32 + 4 * k + 4);
                    }
                    s0 = _mm256_add_epi32(s0, t0);
                    s1 = _mm256_add_epi32(s1, t1);
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_mullo_epi32(s0, sc0), _mm256_mullo_epi32(s1, sc1)));
                    // the activations' sums of sub-blocks 2sb and 2sb+1 (one 32-bit pair) times the mins
                    imin[r] = _mm256_add_epi32(imin[r], _mm256_madd_epi16(_mm256_permutevar8x32_epi32(pair_sums[r], _mm256_set1_epi32(sb)), mins));
                }
            }
            for (int r = 0; r < nr; ++r) {
                const __m256 yd = _mm256_set1_ps(((const block_q8_K *) vy[r] + b)->d);
#if SB_Q4_HIGH_X16
                // isum is 16 x the gemv's int32 sum, exactly (|16 x sum| <= 16 * 8 * 63 * 15 * 128 * 32
                // < 2^31), so the shift gives that sum
                isum[r] = _mm256_srai_epi32(isum[r], 4);
#endif
                acc[r]     = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d_lanes, yd), acc[r]);
                acc_min[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin[r]), _mm256_mul_ps(dmin, yd), acc_min[r]);
            }
        }
        for (int r = 0; r < nr; ++r) {
            _mm256_storeu_ps(s + r * bs + x * 8, _mm256_sub_ps(_mm256_permutevar8x32_ps(acc[r], to_rows), acc_min[r]));
        }
    }
}

#if !SB_Q4_HIGH_X16
// Without VNNI (AVX2 only: Zen 3, Haswell..Skylake client) a dpbusd is maddubs + madd + add, and
// the regrouped quants of both sub-blocks (16 registers) do not fit AVX2's 16 registers beside the
// accumulators. This variant leaves the interleaved layout as it is: a 32-byte load holds 8
// consecutive bytes of four rows (one 64-bit lane each), so each activation row broadcasts its 8
// matching bytes (vpbroadcastq) once for two maddubs (rows 0-3 and 4-7). The int16 pair sums of
// maddubs are added in 16 bits over a sub-block's 32 weights (4 per lane, |sum| <= 4 * 2 * 15 * 128
// < 2^15: exact) and multiplied by the row's scale with one madd per sub-block, where the kernel
// above needs a madd per 4 weights and a 32-bit multiply per sub-block. The per-row int32 sums are
// the same integers and the float steps are the same, so each row again equals
// ggml_gemv_q4_K_8x8_q8_K bit for bit (native/smallbatch/bench). 1.4-1.5x the kernel above at 4-8
// rows on Zen 3 (docs/kernels.md).
//
// One sub-block (2sb + h: the low nibbles for h = 0, the high ones for h = 1) of the eight weight rows
// against nr activation rows (ya[r] + off: their 64 bytes of this sub-block pair). The sub-block's
// 8 quant vectors stay in registers for all rows; each row broadcasts each 8 of its 32 activation
// bytes over the four 64-bit lanes; int16 sums over the 32 weights, then times the rows' scales
// into the int32 sums.
static inline __attribute__((always_inline)) void sb_q4_Kx8_avx2_sub(const uint8_t * qs, const int8_t * const * ya, int off,
                                                                     const int h, const int nr, const __m256i sc03,
                                                                     const __m256i sc47, __m256i * isum03, __m256i * isum47) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i w03[4], w47[4];
    for (int j = 0; j < 4; ++j) {  // bytes 8j..8j+7 of each row
        __m256i lo = _mm256_loadu_si256((const __m256i *) (qs + 64 * j));       // rows 0-3
        __m256i hi = _mm256_loadu_si256((const __m256i *) (qs + 64 * j + 32));  // rows 4-7
        if (h) {
            lo = _mm256_srli_epi16(lo, 4);
            hi = _mm256_srli_epi16(hi, 4);
        }
        w03[j] = _mm256_and_si256(lo, m4);
        w47[j] = _mm256_and_si256(hi, m4);
    }
    for (int r = 0; r < nr; ++r) {
        const int8_t * a = ya[r] + off + 32 * h;
        __m256i a03 = _mm256_setzero_si256(), a47 = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
            // the row's 8 activation bytes in every 64-bit lane (vpbroadcastq from memory: measured faster
            // on Zen 3 than one 32-byte load spread by vpermq, or vbroadcasti128 and vpshufd)
            int64_t q;
            memcpy(&q, a + 8 * j, sizeof(q));
            const __m256i v = _mm256_set1_epi64x(q);
            a03 = _mm256_add_epi16(a03, _mm256_maddubs_epi16(w03[j], v));
            a47 = _mm256_add_epi16(a47, _mm256_maddubs_epi16(w47[j], v));
            // keep each sum a chain in its register: GCC otherwise reassociates the sums and spills the products
            __asm__("" : "+x"(a03), "+x"(a47));
        }
        isum03[r] = _mm256_add_epi32(isum03[r], _mm256_madd_epi16(a03, sc03));
        isum47[r] = _mm256_add_epi32(isum47[r], _mm256_madd_epi16(a47, sc47));
    }
}

static inline __attribute__((always_inline)) void sb_q4_Kx8_q8_K_avx2(int n, float * s, size_t bs, const void * vx,
                                                                      const void * const * vy, const int nr, int nc) {
    const int nb = n / QK_K;
    // each row's 16-bit scale over its 64-bit lane: rows 0-3 from bytes 0-3, rows 4-7 from bytes 4-7
    const __m128i sc_rows03 = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m128i sc_rows47 = _mm_setr_epi8(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);

    for (int x = 0; x < nc / 8; ++x) {
        const sb_block_q4_Kx8 * w = (const sb_block_q4_Kx8 *) vx + (size_t) x * nb;
        __m256 acc[GGML_SMALLBATCH_MAX_COLS];
        __m256 acc_min[GGML_SMALLBATCH_MAX_COLS];
        for (int r = 0; r < nr; ++r) {
            acc[r] = _mm256_setzero_ps();
            acc_min[r] = _mm256_setzero_ps();
        }
        for (int b = 0; b < nb; ++b) {
            for (int l = 0; l < (int) sizeof(sb_block_q4_Kx8); l += 256) {  // 1,152 bytes
                GGML_SMALLBATCH_PREFETCH_256((const char *) (w + b + SB_Q4_KX8_PREFETCH) + l, GGML_SMALLBATCH_PREFETCH_L2(nr));
            }
            const __m256 d    = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w[b].d));
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w[b].dmin));
            // isum03: rows 0-3, two int32 lanes each (0 0 1 1 2 2 3 3); isum47 the same for rows 4-7
            __m256i isum03[GGML_SMALLBATCH_MAX_COLS];
            __m256i isum47[GGML_SMALLBATCH_MAX_COLS];
            __m256i imin[GGML_SMALLBATCH_MAX_COLS];
            __m256i pair_sums[GGML_SMALLBATCH_MAX_COLS];  // lane sb: sums of sub-blocks 2sb, 2sb+1 (int16 each)
            const int8_t * ya[GGML_SMALLBATCH_MAX_COLS];
            for (int r = 0; r < nr; ++r) {
                isum03[r] = _mm256_setzero_si256();
                isum47[r] = _mm256_setzero_si256();
                imin[r] = _mm256_setzero_si256();
                const block_q8_K * y = (const block_q8_K *) vy[r] + b;
                const __m256i bsums = _mm256_loadu_si256((const __m256i *) y->bsums);
                pair_sums[r] = _mm256_castsi128_si256(_mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1)));
                ya[r] = y->qs;
            }
            for (int sb = 0; sb < QK_K / 64; ++sb) {
                const __m256i sm  = sb_scales_mins(w[b].scales + 24 * sb);
                const __m128i sm0 = _mm256_castsi256_si128(sm);
                const __m128i sm1 = _mm256_extracti128_si256(sm, 1);
                const __m256i sc[2][2] = {
                    { _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm0, sc_rows03)), _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm0, sc_rows47)) },
                    { _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm1, sc_rows03)), _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm1, sc_rows47)) },
                };
                const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_shuffle_epi32(sm0, 0x4e), _mm_shuffle_epi32(sm1, 0x4e)));
                const uint8_t * qs = w[b].qs + sb * 256;
                                sb_q4_Kx8_avx2_sub(qs, ya, sb * 64, 0, nr, sc[0][0], sc[0][1], isum03, isum47);
                sb_q4_Kx8_avx2_sub(qs, ya, sb * 64, 1, nr, sc[1][0], sc[1][1], isum03, isum47);
                for (int r = 0; r < nr; ++r) {
                    imin[r] = _mm256_add_epi32(imin[r], _mm256_madd_epi16(_mm256_permutevar8x32_epi32(pair_sums[r], _mm256_set1_epi32(sb)), mins));
                }
            }
            for (int r = 0; r < nr; ++r) {
                const __m256 yd = _mm256_set1_ps(((const block_q8_K *) vy[r] + b)->d);
                // rows 0 1 4 5 | 2 3 6 7 after the pairwise add, then 0-7 in order
                const __m256i isum = _mm256_permute4x64_epi64(_mm256_hadd_epi32(isum03[r], isum47[r]), 0xd8);
                acc[r]     = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, yd), acc[r]);
                acc_min[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin[r]), _mm256_mul_ps(dmin, yd), acc_min[r]);
            }
        }
        for (int r = 0; r < nr; ++r) {
            _mm256_storeu_ps(s + r * bs + x * 8, _mm256_sub_ps(acc[r], acc_min[r]));
        }
    }
}
#define SB_Q4_KX8_KERNEL sb_q4_Kx8_q8_K_avx2
#else
#define SB_Q4_KX8_KERNEL sb_q4_Kx8_q8_K
#endif

#ifdef GGML_SMALLBATCH_HAS_512
// ps[r * nb + b]: the sums of activation row r's 8 sub-blocks in super-block b as int16 (lane s of the
// 128-bit vector: sub-blocks 2s and 2s+1), the same for every group of weight rows, so made once a call
static inline void sb_q8_K_pair_sums(const void * const * vy, int nr, int nb, __m128i * ps) {
    for (int r = 0; r < nr; ++r) {
        for (int b = 0; b < nb; ++b) {
            const __m256i bsums = _mm256_loadu_si256((const __m256i *) ((const block_q8_K *) vy[r] + b)->bsums);
            ps[r * nb + b] = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
        }
    }
}

// 512-bit form (ggml_smallbatch_512: AMD Zen 4 and later, Intel with AMX). Zen 5 runs 512-bit vpdpbusd at full width
// (two a cycle, as many as 256-bit ones); Zen 4 splits them in two halves, and still gains from the
// form's fewer instructions of other kinds (1.16-1.19x the 256-bit kernel in cache at 2-8 rows). Where
// the multiplies are that cheap the kernel's time follows its count of vector instructions of every
// kind, so it is written for few:
// * The interleaved layout is used as it is: one 64-byte load holds the same 8 bytes (16 weights: 8 of
//   sub-block 2sb in the low nibbles, 8 of 2sb+1 in the high ones) of each of the eight rows, a 64-bit
//   lane a row, in natural order. Each activation row broadcasts its matching 8 bytes to every 64-bit
//   lane (vpbroadcastq from memory: a load) and one dpbusd gives, per row, the sums of weights 0-3 (even
//   32-bit lane) and 4-7 (odd lane). No regrouping shuffles.
// * A sub-block's sum per lane (16 products of a 4-bit code and an int8) lies within +-30,720, an int16,
//   so the sums of a pair of sub-blocks are packed to int16 and one dpwssd applies both 6-bit scales
//   into the rows' int32 sums, not a 32-bit multiply and two adds per sub-block.
// * The mins' products are taken once per super-block: the eight rows' 8 mins as int16 pairs in two
//   vectors, against the activation row's sub-block sums (computed once per call, not per group of
//   rows) in two dpwssd.
// * A row's two partial sums (and its mins' two lanes) are added once per super-block, the sums and the
//   mins' products side by side in one vector, so one conversion and one fma per row take both to float.
// Per row and super-block the same int32 sums and the same float steps as ggml_gemv_q4_K_8x8_q8_K, in the
// same lanes: bit-identical (native/smallbatch/bench).
static inline __attribute__((always_inline)) void sb_q4_Kx8_q8_K_512(int n, float * s, size_t bs, const void * vx,
                                                                     const void * const * vy, const int nr, int nc) {
    const int nb = n / QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    // From the scales of sub-blocks 2sb (bytes 0-7, a row each) and 2sb+1 (bytes 8-15): in 128-bit lane k,
    // rows 2k and 2k+1, each twice, of sub-block 2sb, then of 2sb+1. packs_epi32(s0, s1) puts words in that
    // order (lane k: s0's and then s1's two 32-bit lanes of rows 2k and 2k+1), so one dpwssd scales both
    // sub-blocks: dword 0 of lane k gets row 2k's part of sub-block 2sb, 1 row 2k+1's, 2 and 3 the same
    // of 2sb+1. A lane's sums lie within +-30,720, so the pack is exact.
    const __m256i pair_scales = _mm256_setr_epi8(0, 0, 1, 1, 8, 8, 9, 9, 2, 2, 3, 3, 10, 10, 11, 11,
                                                 4, 4, 5, 5, 12, 12, 13, 13, 6, 6, 7, 7, 14, 14, 15, 15);
    // lanes 2i and 2i+1 of the mins' vectors: row i's (min 4h, min 4h+1) and (min 4h+2, min 4h+3)
    const __m512i mins_pairs = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    // rows 0-7 of the sums (dwords 0 and 1 of each 128-bit lane) and of the mins' products (the low 32
    // bits of each 64-bit lane)
    const __m512i row_dwords = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 18, 20, 22, 24, 26, 28, 30);

    // per activation row and super-block: the sums of its 8 sub-blocks (sb_q8_K_pair_sums)
    __m128i * ps = (__m128i *) __builtin_alloca(sizeof(__m128i) * (size_t) nr * (size_t) nb);
    sb_q8_K_pair_sums(vy, nr, nb, ps);

    for (int x = 0; x < nc / 8; ++x) {
        const sb_block_q4_Kx8 * w = (const sb_block_q4_Kx8 *) vx + (size_t) x * nb;
        __m512 acc[GGML_SMALLBATCH_MAX_COLS];  // per row: the gemv's acc (low half) and acc_min (high half)
        for (int r = 0; r < nr; ++r) {
            acc[r] = _mm512_setzero_ps();
        }
        for (int b = 0; b < nb; ++b) {
            for (int l = 0; l < (int) sizeof(sb_block_q4_Kx8); l += 256) {  // 1,152 bytes
                GGML_SMALLBATCH_PREFETCH_256((const char *) (w + b + SB_Q4_KX8_PREFETCH_512) + l, GGML_SMALLBATCH_PREFETCH_L2(nr));
            }
            const __m512 d_dmin = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w[b].d))),
                                                     _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w[b].dmin)), 1);
            __m512i isum[GGML_SMALLBATCH_MAX_COLS];  // row i in lanes 2i (weights 0-3 of each 8) and 2i+1 (4-7)
            for (int r = 0; r < nr; ++r) {
                isum[r] = _mm512_setzero_si512();
            }
            __m256i mins[QK_K / 64];  // row i's (min 2sb, min 2sb+1) as int16 in lane i
            for (int sb = 0; sb < QK_K / 64; ++sb) {
                // q[h][j]: sub-block 2sb+h, weights 8j..8j+7 of each row
                __m512i q[2][4];
                const uint8_t * qs = w[b].qs + sb * 256;
                for (int j = 0; j < 4; ++j) {
                    const __m512i v = _mm512_loadu_si512((const void *) (qs + 64 * j));
                    q[0][j] = _mm512_and_si512(v, m4);
                    q[1][j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                }
                const __m256i sm  = sb_scales_mins(w[b].scales + 24 * sb);
                const __m128i sm0 = _mm256_castsi256_si128(sm);
                const __m128i sm1 = _mm256_extracti128_si256(sm, 1);
                // the eight rows' scales of both sub-blocks as int16, in the word order of the pack below
                const __m512i sc01 = _mm512_cvtepu8_epi16(_mm256_shuffle_epi8(
                    _mm256_broadcastsi128_si256(_mm_unpacklo_epi64(sm0, sm1)), pair_scales));
                mins[sb] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_shuffle_epi32(sm0, 0x4e), _mm_shuffle_epi32(sm1, 0x4e)));

                for (int r = 0; r < nr; ++r) {
                    const int8_t * a = ((const block_q8_K *) vy[r] + b)->qs + sb * 64;
                    int64_t a8[8];
                    memcpy(a8, a, sizeof(a8));
                    __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[0][0], _mm512_set1_epi64(a8[0]));
                    __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[1][0], _mm512_set1_epi64(a8[4]));
                    for (int j = 1; j < 4; ++j) {
                        s0 = _mm512_dpbusd_epi32(s0, q[0][j], _mm512_set1_epi64(a8[j]));
                        s1 = _mm512_dpbusd_epi32(s1, q[1][j], _mm512_set1_epi64(a8[4 + j]));
                    }
                    isum[r] = _mm512_dpwssd_epi32(isum[r], _mm512_packs_epi32(s0, s1), sc01);
                }
            }
            const __m512i mins01 = _mm512_permutex2var_epi32(_mm512_castsi256_si512(mins[0]), mins_pairs, _mm512_castsi256_si512(mins[1]));
            const __m512i mins23 = _mm512_permutex2var_epi32(_mm512_castsi256_si512(mins[2]), mins_pairs, _mm512_castsi256_si512(mins[3]));
            for (int r = 0; r < nr; ++r) {
                const __m128i p = ps[r * nb + b];
                __m512i imin = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mins01, _mm512_broadcastq_epi64(p));
                imin = _mm512_dpwssd_epi32(imin, mins23, _mm512_broadcastq_epi64(_mm_unpackhi_epi64(p, p)));
                // each row's two sums added (dwords 0 and 1 of each 128-bit lane: rows 2k and 2k+1), then the
                // mins' products (each row's two lanes: the low 32 bits of each 64-bit lane)
                const __m512i both = _mm512_permutex2var_epi32(_mm512_add_epi32(isum[r], _mm512_shuffle_epi32(isum[r], 0x4e)), row_dwords,
                                                               _mm512_add_epi32(imin, _mm512_srli_epi64(imin, 32)));
                const __m512 yd = _mm512_set1_ps(((const block_q8_K *) vy[r] + b)->d);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(both), _mm512_mul_ps(d_dmin, yd), acc[r]);
            }
        }
        for (int r = 0; r < nr; ++r) {
            _mm256_storeu_ps(s + r * bs + x * 8, _mm256_sub_ps(_mm512_castps512_ps256(acc[r]), _mm512_extractf32x8_ps(acc[r], 1)));
        }
    }
}
#define SB_Q4_KX8_512 1
#endif

// One function per number of activation rows (a constant there, so the row loops unroll and the
// accumulators stay in registers), and a switch over them.
#define SB_Q4_KX8_NR(KERNEL, NAME, NR) \
    static void NAME##_##NR(int n, float * s, size_t bs, const void * vx, const void * const * vy, int nc) { \
        KERNEL(n, s, bs, vx, vy, NR, nc); \
    }
#define SB_Q4_KX8_SWITCH(KERNEL, NAME) \
    SB_Q4_KX8_NR(KERNEL, NAME, 1) SB_Q4_KX8_NR(KERNEL, NAME, 2) SB_Q4_KX8_NR(KERNEL, NAME, 3) \
    SB_Q4_KX8_NR(KERNEL, NAME, 4) SB_Q4_KX8_NR(KERNEL, NAME, 5) SB_Q4_KX8_NR(KERNEL, NAME, 6) \
    SB_Q4_KX8_NR(KERNEL, NAME, 7) SB_Q4_KX8_NR(KERNEL, NAME, 8) \
    static void NAME(int n, float * s, size_t bs, const void * vx, const void * const * vy, int nr, int nc) { \
        switch (nr) { \
            case 1: NAME##_1(n, s, bs, vx, vy, nc); break; \
            case 2: NAME##_2(n, s, bs, vx, vy, nc); break; \
            case 3: NAME##_3(n, s, bs, vx, vy, nc); break; \
            case 4: NAME##_4(n, s, bs, vx, vy, nc); break; \
            case 5: NAME##_5(n, s, bs, vx, vy, nc); break; \
            case 6: NAME##_6(n, s, bs, vx, vy, nc); break; \
            case 7: NAME##_7(n, s, bs, vx, vy, nc); break; \
            default: NAME##_8(n, s, bs, vx, vy, nc); break; \
        } \
    }

SB_Q4_KX8_SWITCH(SB_Q4_KX8_KERNEL, sb_q4_Kx8_q8_K_nr)
#ifdef SB_Q4_KX8_512
SB_Q4_KX8_SWITCH(sb_q4_Kx8_q8_K_512, sb_q4_Kx8_q8_K_512_nr)
#endif

// The VNNI kernel of this build and CPU: the 512-bit form where ggml_smallbatch_512, else the 256-bit one
static ggml_smallbatch_gemm_t sb_q4_Kx8_vnni(void) {
#ifdef SB_Q4_KX8_512
    if (ggml_smallbatch_512()) {
        return sb_q4_Kx8_q8_K_512_nr;
    }
#endif
    return sb_q4_Kx8_q8_K_nr;
}

// Intel AMX form (ggml_smallbatch_amx: Sapphire Rapids and later Xeons). One TDPBSSD multiplies a tile
// of up to 16 activation rows x 64 int8 values by a tile of 16 x 64 bytes (for 16 weight rows, their 64
// values as 16 groups of 4) into 16 int32 sums per activation row: 1,024 multiply-adds per activation
// row in one instruction, where the VNNI kernels take 16 512-bit dpbusd. Per super-block and 16 weight
// rows (two groups of eight):
// * The 6-bit scale of a sub-block is 8 h + l (h, l < 8), and a 4-bit code times h or l is below 128, so
//   the codes are unpacked once for all activation rows into two tiles' worth of bytes, code x l and
//   code x h (vpmullw: the two bytes of a 16-bit lane belong to one weight row and each product stays
//   below 256). Each 64-byte load of the interleaved layout holds weights 8j..8j+7 of a sub-block pair
//   for eight rows (a 64-bit lane a row): its low and high nibbles, masked, are one 32-byte group of
//   four per row of sub-blocks 2sb and 2sb+1, and one vpermt2d per tile row joins the two groups of
//   eight rows, in natural order, into the tiles' layout (a per-thread buffer, loaded as tiles).
// * The activations' tile is their Q8_K codes as they lie (the rows of a call are equally spaced). A call of
//   17-32 rows runs two tiles of activation rows against the same unpacked codes (the real 1.5B's passes over
//   17-24 rows took 0.90-0.93x the time so, against two calls).
// * Two tiles accumulate the super-block's sums, C_l and C_h, over its 256 values (four TDPBSSD each),
//   and each weight row's integer sum is C_l + 8 C_h, the gemv's sum of the sub-blocks' scaled sums.
//   The mins' products are taken with madd from the activations' per-32 sums, and the float steps per
//   row and super-block are those of ggml_gemv_q4_K_8x8_q8_K: the same integers and the same float
//   operations per weight row, so each result equals the gemv's bit for bit (native/smallbatch/bench,
//   1-32 rows).
// The tiles are configured at the start of each call and released at its end: other code on the same
// thread (ONNX Runtime's or oneDNN's AMX kernels) may configure them otherwise in between.
#if defined(SB_Q4_KX8_512) && defined(__linux__) && defined(__GNUC__) && (__GNUC__ >= 11 || defined(__clang__))
#define SB_Q4_KX8_AMX 1
#define SB_AMX_TARGET __attribute__((target("amx-tile,amx-int8")))

// Activation rows a call from which the AMX kernel runs; fewer go to the VNNI kernel. Passes of the real
// 1.5B on a Sapphire Rapids-class Xeon (2 cores) took 1.01-1.10x the time with the AMX kernel at 2-5 rows
// and 0.91-0.99x at 6-8 (docs/kernels.md): below about 6 rows its fixed cost per 16 weight rows (unpacking,
// tile loads) outweighs the multiplies it saves.
#define SB_AMX_MIN_ROWS 6

typedef struct {
    uint8_t  palette;
    uint8_t  start_row;
    uint8_t  reserved[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
} __attribute__((packed)) sb_tilecfg;

// Up to 16 rows (m1 = 0): tmm0, tmm1 the low and high parts of the sums (m0 x 16 int32); tmm2, tmm5 activations
// (m0 x 64 bytes); tmm3-4, tmm6-7 codes times the low and the high 3 bits of the scales (16 x 64 bytes), two
// sub-block pairs at a time. 17-32 rows, in two groups of m0 and m1: tmm0-1 and tmm2-3 the two groups' sums,
// tmm4 and tmm5 their activations, tmm6-7 the codes, shared by both groups.
static SB_AMX_TARGET void sb_amx_configure(int m0, int m1) {
    sb_tilecfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) {
        cfg.colsb[t] = 64;
        if (m1 == 0) {
            cfg.rows[t] = (uint8_t) (t == 0 || t == 1 || t == 2 || t == 5 ? m0 : 16);
        } else {
            cfg.rows[t] = (uint8_t) (t == 0 || t == 1 || t == 4 ? m0 : t == 2 || t == 3 || t == 5 ? m1 : 16);
        }
    }
    _tile_loadconfig(&cfg);
}

static SB_AMX_TARGET void sb_q4_Kx8_q8_K_amx(int n, float * s, size_t bs, const void * vx, const void * const * vy,
                                             const int nr, int nc) {
    const int nb = n / QK_K;
    const size_t stride = (size_t) ((const char *) vy[nr > 1 ? 1 : 0] - (const char *) vy[0]);
    // past 16 rows two groups, which share each unpacking of the codes
    const int m0 = nr > 16 ? (nr + 1) / 2 : nr;
    const int m1 = nr - m0;
    sb_amx_configure(m0, m1);
    const __m512i m4   = _mm512_set1_epi8(0x0f);
    const __m512i m7   = _mm512_set1_epi32(7);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd  = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    static __thread int8_t  blo[4][16][64] __attribute__((aligned(64)));
    static __thread int8_t  bhi[4][16][64] __attribute__((aligned(64)));
    static __thread int32_t sum_lo[GGML_SMALLBATCH_AMX_MAX_COLS][16] __attribute__((aligned(64)));
    static __thread int32_t sum_hi[GGML_SMALLBATCH_AMX_MAX_COLS][16] __attribute__((aligned(64)));

    __m128i * ps = (__m128i *) __builtin_alloca(sizeof(__m128i) * (size_t) nr * (size_t) nb);
    sb_q8_K_pair_sums(vy, nr, nb, ps);

    for (int x = 0; x < nc / 8; x += 2) {
        const int two = x + 1 < nc / 8;
        const sb_block_q4_Kx8 * w0 = (const sb_block_q4_Kx8 *) vx + (size_t) x * nb;
        const sb_block_q4_Kx8 * w1 = w0 + nb;
        __m512 acc[GGML_SMALLBATCH_AMX_MAX_COLS];
        __m512 acc_min[GGML_SMALLBATCH_AMX_MAX_COLS];
        for (int r = 0; r < nr; ++r) {
            acc[r] = _mm512_setzero_ps();
            acc_min[r] = _mm512_setzero_ps();
        }
        for (int b = 0; b < nb; ++b) {
            for (int l = 0; l < (int) sizeof(sb_block_q4_Kx8); l += 256) {
                GGML_SMALLBATCH_PREFETCH_256((const char *) (w0 + b + SB_Q4_KX8_PREFETCH) + l, 0);
                if (two) {
                    GGML_SMALLBATCH_PREFETCH_256((const char *) (w1 + b + SB_Q4_KX8_PREFETCH) + l, 0);
                }
            }
            __m512i mins[4];
            for (int sb = 0; sb < QK_K / 64; ++sb) {
                const __m256i sm0 = sb_scales_mins(w0[b].scales + 24 * sb);
                const __m256i sm1 = two ? sb_scales_mins(w1[b].scales + 24 * sb) : _mm256_setzero_si256();
                const __m128i a0 = _mm256_castsi256_si128(sm0), a1 = _mm256_extracti128_si256(sm0, 1);
                const __m128i b0 = _mm256_castsi256_si128(sm1), b1 = _mm256_extracti128_si256(sm1, 1);
                const __m512i sc0 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(a0, b0));  // sub-block 2sb
                const __m512i sc1 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(a1, b1));  // 2sb+1
                // each factor in both 16-bit halves of its row's lane
                __m512i f[2][2];  // [sub-block h][low, high 3 bits]
                f[0][0] = _mm512_and_si512(sc0, m7);
                f[0][1] = _mm512_srli_epi32(sc0, 3);
                f[1][0] = _mm512_and_si512(sc1, m7);
                f[1][1] = _mm512_srli_epi32(sc1, 3);
                for (int h = 0; h < 2; ++h) {
                    for (int k = 0; k < 2; ++k) {
                        f[h][k] = _mm512_or_si512(f[h][k], _mm512_slli_epi32(f[h][k], 16));
                    }
                }
                const __m128i m0 = _mm_unpackhi_epi64(a0, b0);
                const __m128i m1 = _mm_unpackhi_epi64(a1, b1);
                mins[sb] = _mm512_cvtepu8_epi16(_mm256_setr_m128i(_mm_unpacklo_epi8(m0, m1), _mm_unpackhi_epi8(m0, m1)));
                for (int j = 0; j < 4; ++j) {
                    const __m512i v0 = _mm512_loadu_si512((const void *) (w0[b].qs + sb * 256 + 64 * j));
                    const __m512i v1 = two ? _mm512_loadu_si512((const void *) (w1[b].qs + sb * 256 + 64 * j)) : _mm512_setzero_si512();
                    const __m512i lo0 = _mm512_and_si512(v0, m4);
                    const __m512i lo1 = _mm512_and_si512(v1, m4);
                    const __m512i hi0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4);
                    const __m512i hi1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4);
                    const __m512i q[4] = {  // B rows 2j, 2j+1 (sub-block 2sb), 8+2j, 9+2j (2sb+1)
                        _mm512_permutex2var_epi32(lo0, even, lo1), _mm512_permutex2var_epi32(lo0, odd, lo1),
                        _mm512_permutex2var_epi32(hi0, even, hi1), _mm512_permutex2var_epi32(hi0, odd, hi1),
                    };
                    for (int i = 0; i < 4; ++i) {
                        const int row = (i < 2 ? 0 : 8) + 2 * j + (i & 1);
                        _mm512_store_si512((void *) blo[sb][row], _mm512_mullo_epi16(q[i], f[i >> 1][0]));
                        _mm512_store_si512((void *) bhi[sb][row], _mm512_mullo_epi16(q[i], f[i >> 1][1]));
                    }
                }
            }
            const char * a = (const char *) ((const block_q8_K *) vy[0] + b)->qs;
            _tile_zero(0);
            _tile_zero(1);
            if (m1 == 0) {
                for (int sb = 0; sb < 4; sb += 2) {
                    _tile_loadd(2, a + 64 * sb, stride);
                    _tile_loadd(3, blo[sb], 64);
                    _tile_loadd(4, bhi[sb], 64);
                    _tile_dpbssd(0, 2, 3);
                    _tile_dpbssd(1, 2, 4);
                    _tile_loadd(5, a + 64 * sb + 64, stride);
                    _tile_loadd(6, blo[sb + 1], 64);
                    _tile_loadd(7, bhi[sb + 1], 64);
                    _tile_dpbssd(0, 5, 6);
                    _tile_dpbssd(1, 5, 7);
                }
            } else {
                const char * a1 = a + (size_t) m0 * stride;
                _tile_zero(2);
                _tile_zero(3);
                for (int sb = 0; sb < 4; ++sb) {
                    _tile_loadd(6, blo[sb], 64);
                    _tile_loadd(7, bhi[sb], 64);
                    _tile_loadd(4, a + 64 * sb, stride);
                    _tile_loadd(5, a1 + 64 * sb, stride);
                    _tile_dpbssd(0, 4, 6);
                    _tile_dpbssd(1, 4, 7);
                    _tile_dpbssd(2, 5, 6);
                    _tile_dpbssd(3, 5, 7);
                }
                _tile_stored(2, sum_lo[m0], 64);
                _tile_stored(3, sum_hi[m0], 64);
            }
            _tile_stored(0, sum_lo, 64);
            _tile_stored(1, sum_hi, 64);
            const __m512 d    = _mm512_cvtph_ps(_mm256_setr_m128i(_mm_loadu_si128((const __m128i *) w0[b].d),
                                                                   two ? _mm_loadu_si128((const __m128i *) w1[b].d) : _mm_setzero_si128()));
            const __m512 dmin = _mm512_cvtph_ps(_mm256_setr_m128i(_mm_loadu_si128((const __m128i *) w0[b].dmin),
                                                                   two ? _mm_loadu_si128((const __m128i *) w1[b].dmin) : _mm_setzero_si128()));
            for (int r = 0; r < nr; ++r) {
                const __m512i isum = _mm512_add_epi32(_mm512_load_si512((const void *) sum_lo[r]),
                                                      _mm512_slli_epi32(_mm512_load_si512((const void *) sum_hi[r]), 3));
                const __m128i p = ps[r * nb + b];
                __m512i imin = _mm512_madd_epi16(mins[0], _mm512_set1_epi32(_mm_extract_epi32(p, 0)));
                imin = _mm512_add_epi32(imin, _mm512_madd_epi16(mins[1], _mm512_set1_epi32(_mm_extract_epi32(p, 1))));
                imin = _mm512_add_epi32(imin, _mm512_madd_epi16(mins[2], _mm512_set1_epi32(_mm_extract_epi32(p, 2))));
                imin = _mm512_add_epi32(imin, _mm512_madd_epi16(mins[3], _mm512_set1_epi32(_mm_extract_epi32(p, 3))));
                const __m512 yd = _mm512_set1_ps(((const block_q8_K *) vy[r] + b)->d);
                acc[r]     = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, yd), acc[r]);
                acc_min[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin), _mm512_mul_ps(dmin, yd), acc_min[r]);
            }
        }
        for (int r = 0; r < nr; ++r) {
            const __m512 out = _mm512_sub_ps(acc[r], acc_min[r]);
            if (two) {
                _mm512_storeu_ps(s + r * bs + x * 8, out);
            } else {
                _mm256_storeu_ps(s + r * bs + x * 8, _mm512_castps512_ps256(out));
            }
        }
    }
    _tile_release();
}

// The AMX kernel for calls of SB_AMX_MIN_ROWS rows or more whose rows are equally spaced (a tile's rows
// are), the VNNI kernel for the others
static void sb_q4_Kx8_q8_K_amx_nr(int n, float * s, size_t bs, const void * vx, const void * const * vy, int nr, int nc) {
    int even = nr >= SB_AMX_MIN_ROWS;
    for (int r = 2; r < nr && even; ++r) {
        even = (const char *) vy[r] - (const char *) vy[r - 1] == (const char *) vy[1] - (const char *) vy[0];
    }
    if (even) {
        sb_q4_Kx8_q8_K_amx(n, s, bs, vx, vy, nr, nc);
        return;
    }
    const ggml_smallbatch_gemm_t vnni = sb_q4_Kx8_vnni();
    for (int r0 = 0, k = 0; r0 < nr; r0 += k) {  // calls of up to MAX_COLS rows
        k = ggml_smallbatch_call_rows(nr - r0);
        vnni(n, s + r0 * bs, bs, vx, vy + r0, k, nc);
    }
}
#endif

ggml_smallbatch_gemm_t ggml_smallbatch_q4_Kx8(void) {
#ifdef SB_Q4_KX8_AMX
    if (ggml_smallbatch_amx()) {
        return sb_q4_Kx8_q8_K_amx_nr;
    }
#endif
    return sb_q4_Kx8_vnni();
}

#else

ggml_smallbatch_gemm_t ggml_smallbatch_q4_Kx8(void) {
    return NULL;  // the repacked kernels are AVX2 ones; without them repack.cpp's own path runs
}

#endif
