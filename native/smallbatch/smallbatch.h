// Small-batch matrix multiplication for quantized weights on the CPU.
//
// When a mat-mul has only a few activation rows (speculative verification: 2-8 tokens), ggml's
// generic path runs one vec_dot per (weight row, activation row) pair: every activation row
// unpacks the same weight row again, so K rows cost almost K single-row passes. The kernels here
// compute one weight row against up to GGML_SMALLBATCH_MAX_COLS activation rows in one pass: the
// weights are loaded and unpacked once, then dotted with each row. Each kernel does per row
// exactly the integer and float arithmetic of the type's vec_dot, so results are bit-identical
// to the per-row path (tested against it on real weights). A single activation row (plain
// decoding) takes them too: the same results, and on an AVX2 Zen 3 a pass 15% faster (docs/kernels.md).
#pragma once

#include "ggml.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define GGML_SMALLBATCH_MAX_COLS 8    // activation rows one kernel call takes
// activation rows the small-batch path takes, in calls of up to MAX_COLS: past 16 too, where ggml's
// tiled and 4-row kernels made a pass over 17 rows cost far more than one over 16 (docs/kernels.md)
#define GGML_SMALLBATCH_MAX_BATCH 32
#define GGML_SMALLBATCH_MAX_WROWS 4   // weight rows one per-row-layout kernel call takes
// activation rows the repacked-Q4_K path takes (repack.patch): every batch, prompts included, where its
// kernels were measured faster than ggml's 4-row gemm (docs/kernels.md): per activation row 2.3-2.5x on an
// AVX2 Zen 3; passes over 33-512 rows of the real 1.5B in 0.66-0.75x the time on an AVX-512 VNNI Zen 4.
// AVX-512 without VNNI (the skylakex module) runs the 256-bit kernel without VNNI against ggml's 512-bit
// gemm: unmeasured, so prompts stay with ggml there.
#if defined(__AVX512F__) && !defined(__AVX512VNNI__)
#define GGML_SMALLBATCH_Q4_K_MAX_BATCH GGML_SMALLBATCH_MAX_BATCH
#else
#define GGML_SMALLBATCH_Q4_K_MAX_BATCH INT64_MAX
#endif

// Activation rows a kernel call takes when `left` (>= 1) remain: all of them up to MAX_COLS, past that calls
// of as even a size as can be (12 rows: two calls of 6, not 8 and 4; 17: 6, 6 and 5). Each call unpacks
// the weights once for its rows, so a short last call costs nearly what a full one does: passes over 9-14
// rows of the 1.5B measured 2-3% faster so on Zen 4 (docs/kernels.md).
int ggml_smallbatch_call_rows(int64_t left);
// Activation rows a call of the repacked-Q4_K kernel takes when `left` remain: with the AMX kernel up to
// GGML_SMALLBATCH_AMX_MAX_COLS (its tile multiplies cost the same for 1-16 rows, and two groups of up to 16
// share one unpacking of the weights), else as above.
#define GGML_SMALLBATCH_AMX_MAX_COLS 32
int ggml_smallbatch_q4_K_call_rows(int64_t left);

// s[w * bs + c] = dot(weight row w, vy[c]) for w < nw (1 <= nw <= GGML_SMALLBATCH_MAX_WROWS) and
// c < nc (1 <= nc <= GGML_SMALLBATCH_MAX_COLS); n values per row, weight row w of the weight type
// at (const char *) vx + w * bx, vy[c] rows of the type's vec_dot_type.
typedef void (*ggml_smallbatch_dot_t)(int n, float * s, size_t bs, const void * vx, size_t bx, int nw,
                                      const void * const * vy, int nc);

// For weights repacked eight rows at a time (repack.cpp): s[r * bs + c] = dot(weight row c,
// vy[r]) for r < nr (1 <= nr <= GGML_SMALLBATCH_MAX_COLS; for the Q4_K kernel up to
// ggml_smallbatch_q4_K_call_rows's count) and c < nc (a multiple of 8); vx
// points at the first group of eight rows, n values per row.
typedef void (*ggml_smallbatch_gemm_t)(int n, float * s, size_t bs, const void * vx, const void * const * vy,
                                       int nr, int nc);

// For a kernel KERNEL(n, s, vx, vy, nc) of one weight row against nc activation rows: one function
// per number of activation rows (a constant there, so the loops over them unroll and the accumulators
// stay in registers), and NAME, a ggml_smallbatch_dot_t that runs the weight rows of a call one after
// another. For the per-row-layout kernels (smallbatch-q6_K.c, smallbatch-legacy.c).
#define GGML_SMALLBATCH_NC(KERNEL, NAME, NC) \
    static void NAME##_##NC(int n, float * s, const void * vx, const void * const * vy) { \
        KERNEL(n, s, vx, vy, NC); \
    }
#define GGML_SMALLBATCH_ROWS(KERNEL, NAME) \
    GGML_SMALLBATCH_NC(KERNEL, NAME, 1) GGML_SMALLBATCH_NC(KERNEL, NAME, 2) GGML_SMALLBATCH_NC(KERNEL, NAME, 3) \
    GGML_SMALLBATCH_NC(KERNEL, NAME, 4) GGML_SMALLBATCH_NC(KERNEL, NAME, 5) GGML_SMALLBATCH_NC(KERNEL, NAME, 6) \
    GGML_SMALLBATCH_NC(KERNEL, NAME, 7) GGML_SMALLBATCH_NC(KERNEL, NAME, 8) \
    static void NAME(int n, float * s, size_t bs, const void * vx, size_t bx, int nw, const void * const * vy, int nc) { \
        for (int w = 0; w < nw; ++w) { \
            const void * x = (const char *) vx + w * bx; \
            float * sw = s + w * bs; \
            switch (nc) { \
                case 1: NAME##_1(n, sw, x, vy); break; \
                case 2: NAME##_2(n, sw, x, vy); break; \
                case 3: NAME##_3(n, sw, x, vy); break; \
                case 4: NAME##_4(n, sw, x, vy); break; \
                case 5: NAME##_5(n, sw, x, vy); break; \
                case 6: NAME##_6(n, sw, x, vy); break; \
                case 7: NAME##_7(n, sw, x, vy); break; \
                default: NAME##_8(n, sw, x, vy); break; \
            } \
        } \
    }

#if defined(__AVX2__)
// The sum of eight float lanes in the order ggml's x86 vec_dot kernels take it (hsum_float_8 of
// arch/x86/quants.c): the kernels' last float step, for results equal to theirs bit for bit.
static inline float ggml_smallbatch_hsum_float_8(const __m256 x) {
    __m128 res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    return _mm_cvtss_f32(res);
}
#endif

// Whether the kernels prefetch their weight stream into L2 only (prefetcht1) rather than into L1 too
// (prefetcht0) when they take several activation rows: set once when the module loads, from
// GGML_SMALLBATCH_PREFETCH_L2 (0 or 1) or else the CPU (smallbatch.c: L2 on AMD Zen 4, where it measured
// faster; L1 elsewhere, as measured before).
extern int ggml_smallbatch_prefetch_l2;

// The four cache lines from p on, into L2 where l2 is true (a branch that always goes the same way,
// or none where l2 is a constant), else into L1 as well. In files built with the intrinsics
// (<immintrin.h>, included above). A macro: GCC 12 finds a function of prefetches alone free of side
// effects and deletes the calls to it that it did not inline early.
#define GGML_SMALLBATCH_PREFETCH_256(p, l2)              \
    do {                                                 \
        const char * sb_pf_ = (p);                       \
        if (l2) {                                        \
            _mm_prefetch(sb_pf_, _MM_HINT_T1);           \
            _mm_prefetch(sb_pf_ + 64, _MM_HINT_T1);      \
            _mm_prefetch(sb_pf_ + 128, _MM_HINT_T1);     \
            _mm_prefetch(sb_pf_ + 192, _MM_HINT_T1);     \
        } else {                                         \
            _mm_prefetch(sb_pf_, _MM_HINT_T0);           \
            _mm_prefetch(sb_pf_ + 64, _MM_HINT_T0);      \
            _mm_prefetch(sb_pf_ + 128, _MM_HINT_T0);     \
            _mm_prefetch(sb_pf_ + 192, _MM_HINT_T0);     \
        }                                                \
    } while (0)
// Whether a kernel taking nr activation rows prefetches into L2: with one row its loop is fast enough
// that L2's latency shows (the real 1.5B's single-row pass measured up to 1.07x slower so), so L1
#define GGML_SMALLBATCH_PREFETCH_L2(nr) (ggml_smallbatch_prefetch_l2 && (nr) > 1)

// False when GGML_CPU_SMALLBATCH=0 in the environment turns the kernels off (for comparisons).
bool ggml_smallbatch_enabled(void);

// Whether this build has the kernels' 512-bit forms (the instruction sets they use)
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define GGML_SMALLBATCH_HAS_512 1
#endif

// Whether this build has a 256-bit vpdpbusd (AVX-512 VNNI with VL, or AVX-VNNI)
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define GGML_SMALLBATCH_HAS_VNNI 1
#endif

// Whether the kernels take their 512-bit forms (where the build has AVX-512 VNNI): on AMD Zen 4 and
// later, where they measured faster (Zen 5 runs 512-bit vpdpbusd at full width; Zen 4 splits each in two
// halves but gains from the forms' fewer other instructions) and on Intel CPUs with AMX (Sapphire Rapids
// class, measured faster too), not on other Intel CPUs, where they are unmeasured.
// GGML_SMALLBATCH_512=0 or 1 in the environment decides instead, for comparisons. A property of the
// CPU, read once at run time.
bool ggml_smallbatch_512(void);

// Whether the kernels take their Intel AMX forms (tile multiplies, TDPBSSD): where the build has the
// 512-bit forms, the CPU has AMX-INT8, and Linux grants the process the tile state (smallbatch.c);
// GGML_SMALLBATCH_AMX=0 in the environment turns them off, for comparisons. Read once at run time.
bool ggml_smallbatch_amx(void);

// The kernel for weights of `type` in this build (NULL: none, use the per-row path). One source
// file per family of weight types provides its getter.
ggml_smallbatch_dot_t ggml_smallbatch_kernel(enum ggml_type type);
// Whether a single activation row of `type` goes to the small-batch kernel (else to ggml's own kernel).
bool ggml_smallbatch_takes_one_row(enum ggml_type type);
ggml_smallbatch_dot_t ggml_smallbatch_q6_K(void);
ggml_smallbatch_dot_t ggml_smallbatch_q8_0(void);  // smallbatch-legacy.c
ggml_smallbatch_dot_t ggml_smallbatch_q4_0(void);
ggml_smallbatch_dot_t ggml_smallbatch_q5_0(void);
ggml_smallbatch_dot_t ggml_smallbatch_q4_1(void);
// Q8_0, Q4_0 and Q5_0 weights against activation rows prepared once per call (smallbatch-legacy.c): the
// kernel for `type` (NULL: none in this build; the kernel above takes the rows as they are), the prepared
// row's size for n values, and its preparation from a Q8_0 row. Results bit for bit as the kernel above.
ggml_smallbatch_dot_t ggml_smallbatch_prepared_kernel(enum ggml_type type);
size_t ggml_smallbatch_q8_0_prepared_size(int n);
void ggml_smallbatch_q8_0_prepare(int n, const void * vy, void * out);
// Q6_K weights against Q8_K rows prepared once per call, where the kernels take their 512-bit forms
// (smallbatch-q6_K.c; NULL: none, or not turned on by GGML_SMALLBATCH_Q6_K_PREPARED=1 in the environment):
// results within rounding of ggml_vec_dot_q6_K_q8_K's, not bit for bit, and each row's the same in a
// call of any number of rows. The prepared row's size for n values, and its preparation from a Q8_K row.
ggml_smallbatch_dot_t ggml_smallbatch_q6_K_prepared(void);
size_t ggml_smallbatch_q8_K_prepared_size(int n);
void ggml_smallbatch_q8_K_prepare(int n, const void * vy, void * out);
// Q4_K repacked as block_q4_Kx8 (NULL: none for this instruction set)
ggml_smallbatch_gemm_t ggml_smallbatch_q4_Kx8(void);
// MXFP4 repacked as block_mxfp4x8, against Q8_0 rows (smallbatch-legacy.c; NULL: none)
ggml_smallbatch_gemm_t ggml_smallbatch_mxfp4x8(void);

// Q8_K quantization of k values (a multiple of QK_K), ggml-cpu's from_float for Q8_K: the result of
// quantize_row_q8_K_ref bit for bit, eight values at a time where the build has AVX2 (smallbatch-q8_K.c).
void ggml_smallbatch_quantize_row_q8_K(const float * GGML_RESTRICT x, void * GGML_RESTRICT y, int64_t k);

// F16 x F16 with 2..MAX_BATCH src1 rows (attention over the KV cache in a verification pass): each result
// ggml_vec_dot_f16's bit for bit, as the token gets it decoded alone (smallbatch-f16.c). The arguments and
// result of ggml_smallbatch_mul_mat_chunk. has_f16: whether this build has that kernel (AVX2 and AVX-512)
// and GGML_SMALLBATCH_F16=0 in the environment does not turn it off (for comparisons).
bool ggml_smallbatch_has_f16(void);
bool ggml_smallbatch_f16_chunk(const struct ggml_tensor * dst, const void * wdata, size_t row_size, bool src1_packed,
                               int64_t ir0_start, int64_t ir0_end, int64_t ir1_start, int64_t ir1_end);

// Attention's cache cells that no query row of a pass can see. llama.cpp pads the cells a pass attends over
// to a multiple of 256 (n_kv: 768 cells when 513-768 are in use), and a softmax's mask leaves the padding
// out, so each pass computed K x Q and V x softmax(KQ) over up to 255 cells whose weights come out 0.
// ggml-cpu.c calls ggml_smallbatch_node_begin(node, next) in each thread before it computes a node (next:
// the graph's following node or NULL). Where the node is an F16 mat-mul that the small-batch path takes and
// next the masked softmax of its result, the thread notes how many leading cells any row of the mask leaves
// visible; ggml_smallbatch_kq_cells(dst) is that count for that mat-mul (else dst->ne[0], every cell).
// The F16 kernel writes 0 for the other cells' K x Q (the mask makes them -inf whatever they hold, and
// their weights exactly 0, as before) and stops V x softmax(KQ) at the 64-value step past the last weight
// that is not 0: the steps left out would have added only products with a weight of 0, so every result is
// the same float (smallbatch-f16.c, docs/kernels.md).
void    ggml_smallbatch_node_begin(const struct ggml_tensor * node, const struct ggml_tensor * next);
int64_t ggml_smallbatch_kq_cells(const struct ggml_tensor * dst);

// The dst columns (src1 rows) one kernel call takes, from column c0 of [c0, c_end): up to `max` consecutive
// ones that multiply the same src0 matrix (src0 broadcast over dims 2-3). Fills y[i] (their rows in `wdata`,
// laid out as ggml_smallbatch_mul_mat_chunk's arguments say), d[i] (their dst columns) and *src0_mat (the
// src0 matrix they multiply); returns the column after the last one taken.
int64_t ggml_smallbatch_columns(const struct ggml_tensor * dst, const void * wdata, size_t row_size, bool src1_packed,
                                int64_t c0, int64_t c_end, int max, const void ** y, float ** d, const char ** src0_mat);

// Whether the small-batch path takes this mat-mul (a type with a kernel, 1..MAX_BATCH src1 rows):
// the tiled K-quant path (tiled/) then leaves it alone.
bool ggml_smallbatch_claims(const struct ggml_tensor * dst);

// Computes rows [ir0_start, ir0_end) x columns [ir1_start, ir1_end) of dst = src0 * src1 with the
// small-batch kernel when there is one for src0's type and at least one column; false to let the
// caller run its per-row loop. `wdata` holds src1 in vec_dot_type (`row_size` bytes a row),
// packed contiguously when `src1_packed`, else with src1's own strides.
bool ggml_smallbatch_mul_mat_chunk(const struct ggml_tensor * dst, const void * wdata, size_t row_size,
                                   bool src1_packed, int64_t ir0_start, int64_t ir0_end,
                                   int64_t ir1_start, int64_t ir1_end);

#ifdef __cplusplus
}
#endif
