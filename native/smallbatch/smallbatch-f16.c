// F16 x F16 mat-muls with a few src1 rows: attention over the KV cache in a verification pass (K x Q
// and the transposed V x softmax(KQ)), which ggml gives to llamafile's sgemm from two rows on.
//
// Every result equals ggml_vec_dot_f16's (vec.cpp) bit for bit, as the token gets it decoded alone: four
// float accumulators over each 4 vectors of values (vector j of each step into accumulator j), the
// product of the two converted halves added by one fma, then the accumulators' sum in vec_dot's order
// (0+2, 1+3, then those two; then the lanes: AVX-512's _mm512_reduce_add_ps, AVX2's two hadds), and the
// values past the last step added in double. llamafile's sgemm sums in another order, so with it a
// token's logits in a batch differed from its logits decoded alone (by up to 0.5-1.3 on the bundled models
// and the 1.5B), the last such difference in a pass of up to GGML_SMALLBATCH_MAX_BATCH rows with the
// small-batch kernels: with this kernel a verification pass gives each row the logits plain decoding gives
// it (docs/kernels.md).
//
// The src1 rows of a call (the query heads that share a KV head, in grouped-query attention) are
// converted to float once, into a per-thread buffer; each src0 row is then converted a vector at a time,
// once per tile of a few src1 rows, and multiplied with them from that buffer, four accumulators per
// result in registers. With AVX-512 the last sums of a tile's four results are taken together.
#include "smallbatch.h"

#include "ggml-impl.h"
#include "ggml-cpu-impl.h"
#include "simd-mappings.h"

#include <stdlib.h>

// vec_dot_f16's result from its vector sum `vsum` over values [0, np): the values past its last step
// added in double, then rounded to float once (both forms)
static inline float sb_f16_leftover(float vsum, int np, int n, const ggml_fp16_t * x, const float * y) {
    double sumf = (double) vsum;
    for (int i = np; i < n; ++i) {
        sumf += (double) (GGML_CPU_FP16_TO_FP32(x[i]) * y[i]);
    }
    return (float) sumf;
}

#if defined(__AVX2__)
#include <immintrin.h>

// F16 weights (a whole F16 model's mat-muls) stream from memory, and a pair of rows then waits for its lines in
// its first tile and computes from L1 in the others: the next pair's rows are fetched while this pair computes,
// spread over its tiles (an F16 0.5B's passes over 2-16 rows 0.69-0.85x the time on Zen 4; into L2, as the
// K-quant kernels do there: into L1 read 0.97-1.07x of that)
#ifndef SB_F16_HINT
#define SB_F16_HINT _MM_HINT_T1
#endif
// The bytes [o, o_end) of a range that is row a's 2n bytes and then row b's, fetched a few lines a step over
// one tile's steps (pf.a NULL: nothing to fetch)
struct sb_f16_pf {
    const char * a;
    const char * b;
    int64_t      o;
    int64_t      o_end;
};

// Bytes to fetch a step, for a tile of `steps` steps (whole lines, at least one)
static inline int64_t sb_f16_fetch_step(const struct sb_f16_pf * pf, int steps) {
    const int64_t lines = (pf->o_end - pf->o + 63) / 64;
    return steps > 0 ? 64 * ((lines + steps - 1) / steps) : 0;
}

static inline __attribute__((always_inline)) void sb_f16_fetch(struct sb_f16_pf * pf, int n, int64_t step) {
    const int64_t until = pf->o + step < pf->o_end ? pf->o + step : pf->o_end;
    for (; pf->o < until; pf->o += 64) {
        const char * p = pf->o < 2 * n ? pf->a + pf->o : pf->b + (pf->o - 2 * n);
        _mm_prefetch(p, SB_F16_HINT);
    }
}

#endif

#if defined(__AVX512F__)
#include <immintrin.h>

#define SB_F16_TILE 4   // src1 rows a pass over one src0 row takes: 16 accumulators
#define SB_F16_COLS 24  // src1 rows converted and taken together (the 1.5B: 6 query heads x 4 tokens)

// _mm512_reduce_add_ps of four vectors at once, into r[0..3], with its pairs of lanes (lanes i and i+8,
// then i and i+4, i and i+2, i and i+1 of what is left): blocks of 128 bits regrouped so that each add
// takes the same two values as one of its adds does (a + b and b + a are the same float)
static inline __attribute__((always_inline)) void sb_f16_reduce4(const __m512 s0, const __m512 s1, const __m512 s2,
                                                                 const __m512 s3, float * r) {
    const __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(s0, s1, 0x44), _mm512_shuffle_f32x4(s0, s1, 0xee));
    const __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(s2, s3, 0x44), _mm512_shuffle_f32x4(s2, s3, 0xee));
    __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, 0x88), _mm512_shuffle_f32x4(u01, u23, 0xdd));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4e));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xb1));
    _mm_storeu_ps(r, _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v)));
}

// Two src0 rows (x0, x1) x (NC <= 3, a constant) src1 rows, n a multiple of 64, into out[c * os + r] for
// src0 row r: each src1 vector loaded once for both rows (24 accumulators), where one row a pass did
// about as many loads as multiplies
#define SB_F16_PAIR_TILE 3
static inline __attribute__((always_inline)) void sb_f16_tile2(int n, const ggml_fp16_t * x0, const ggml_fp16_t * x1,
                                                               const float * y, size_t ldy, float * out, size_t os,
                                                               const int nc, struct sb_f16_pf pf) {
    const int64_t pf_step = sb_f16_fetch_step(&pf, n / 64);
    __m512 acc[2][SB_F16_PAIR_TILE][4];
    for (int c = 0; c < nc; ++c) {
        for (int j = 0; j < 4; ++j) {
            acc[0][c][j] = _mm512_setzero_ps();
            acc[1][c][j] = _mm512_setzero_ps();
        }
    }
    for (int i = 0; i < n; i += 64) {
        if (pf.a != NULL) {
            sb_f16_fetch(&pf, n, pf_step);
        }
        for (int j = 0; j < 4; ++j) {
            const __m512 xa = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (x0 + i + 16 * j)));
            const __m512 xb = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (x1 + i + 16 * j)));
            for (int c = 0; c < nc; ++c) {
                const __m512 yv = _mm512_loadu_ps(y + c * ldy + i + 16 * j);
                acc[0][c][j] = _mm512_fmadd_ps(xa, yv, acc[0][c][j]);
                acc[1][c][j] = _mm512_fmadd_ps(xb, yv, acc[1][c][j]);
            }
        }
    }
    __m512 s[2 * SB_F16_PAIR_TILE];  // output r * nc + c
    for (int r = 0; r < 2; ++r) {
        for (int c = 0; c < nc; ++c) {
            s[r * nc + c] = _mm512_add_ps(_mm512_add_ps(acc[r][c][0], acc[r][c][2]), _mm512_add_ps(acc[r][c][1], acc[r][c][3]));
        }
    }
    float res[8];
    sb_f16_reduce4(s[0], s[1 % (2 * nc)], s[2 % (2 * nc)], s[3 % (2 * nc)], res);
    if (nc == 3) {
        sb_f16_reduce4(s[4], s[5], s[5], s[5], res + 4);
    }
    for (int r = 0; r < 2; ++r) {
        for (int c = 0; c < nc; ++c) {
            out[c * os + r] = res[r * nc + c];
        }
    }
}

// One src0 row x (NC, a constant) src1 rows of n values, y[c] at y + c * ldy, into out[c * os]
static inline __attribute__((always_inline)) void sb_f16_tile(int n, const ggml_fp16_t * x, const float * y, size_t ldy,
                                                              float * out, size_t os, const int nc, struct sb_f16_pf pf) {
    const int np = n & ~63;
    const int64_t pf_step = sb_f16_fetch_step(&pf, np / 64);
    __m512 acc[SB_F16_TILE][4];
    for (int c = 0; c < nc; ++c) {
        for (int j = 0; j < 4; ++j) {
            acc[c][j] = _mm512_setzero_ps();
        }
    }
    for (int i = 0; i < np; i += 64) {
        if (pf.a != NULL) {
            sb_f16_fetch(&pf, n, pf_step);
        }
        for (int j = 0; j < 4; ++j) {
            const __m512 xv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (x + i + 16 * j)));
            for (int c = 0; c < nc; ++c) {
                acc[c][j] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(y + c * ldy + i + 16 * j), acc[c][j]);
            }
        }
    }
    __m512 s[SB_F16_TILE];
    for (int c = 0; c < nc; ++c) {  // GGML_F32x16_REDUCE's adds of the four accumulators
        s[c] = _mm512_add_ps(_mm512_add_ps(acc[c][0], acc[c][2]), _mm512_add_ps(acc[c][1], acc[c][3]));
    }
    if (nc == 4 && np == n) {
        float r[4];
        sb_f16_reduce4(s[0], s[1], s[2], s[3], r);
        for (int c = 0; c < 4; ++c) {
            out[c * os] = r[c];  // (float) (double) r: nothing past the last 64 values to add in double
        }
        return;
    }
    for (int c = 0; c < nc; ++c) {
        out[c * os] = sb_f16_leftover(_mm512_reduce_add_ps(s[c]), np, n, x, y + c * ldy);
    }
}

static inline __attribute__((always_inline)) void sb_f16_tiles(int n, const ggml_fp16_t * x, const float * y, size_t ldy,
                                                               float * out, size_t os, int nc, struct sb_f16_pf pf) {
    switch (nc) {
        case 1: sb_f16_tile(n, x, y, ldy, out, os, 1, pf); break;
        case 2: sb_f16_tile(n, x, y, ldy, out, os, 2, pf); break;
        case 3: sb_f16_tile(n, x, y, ldy, out, os, 3, pf); break;
        default: sb_f16_tile(n, x, y, ldy, out, os, 4, pf); break;
    }
}

static inline __attribute__((always_inline)) void sb_f16_tiles2(int n, const ggml_fp16_t * x0, const ggml_fp16_t * x1,
                                                                const float * y, size_t ldy, float * out, size_t os, int nc,
                                                                struct sb_f16_pf pf) {
    switch (nc) {
        case 1: sb_f16_tile2(n, x0, x1, y, ldy, out, os, 1, pf); break;
        case 2: sb_f16_tile2(n, x0, x1, y, ldy, out, os, 2, pf); break;
        default: sb_f16_tile2(n, x0, x1, y, ldy, out, os, 3, pf); break;
    }
}

#define SB_F16_KERNEL 1
#define SB_F16_PAIRS 1

#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

#define SB_F16_TILE 3   // src1 rows a pass over one src0 row takes: 12 accumulators of AVX2's 16 registers
#define SB_F16_COLS 24

// The AVX2 form of vec_dot_f16: 8-lane accumulators over steps of 32 values, GGML_F32x8_REDUCE's sums
static inline __attribute__((always_inline)) void sb_f16_tile(int n, const ggml_fp16_t * x, const float * y, size_t ldy,
                                                              float * out, size_t os, const int nc, struct sb_f16_pf pf) {
    const int np = n & ~31;
    const int64_t pf_step = sb_f16_fetch_step(&pf, np / 32);
    __m256 acc[SB_F16_TILE][4];
    for (int c = 0; c < nc; ++c) {
        for (int j = 0; j < 4; ++j) {
            acc[c][j] = _mm256_setzero_ps();
        }
    }
    for (int i = 0; i < np; i += 32) {
        if (pf.a != NULL) {
            sb_f16_fetch(&pf, n, pf_step);
        }
        for (int j = 0; j < 4; ++j) {
            const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (x + i + 8 * j)));
            for (int c = 0; c < nc; ++c) {
                acc[c][j] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(y + c * ldy + i + 8 * j), acc[c][j]);
            }
        }
    }
    for (int c = 0; c < nc; ++c) {
        const __m256 s  = _mm256_add_ps(_mm256_add_ps(acc[c][0], acc[c][2]), _mm256_add_ps(acc[c][1], acc[c][3]));
        const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        const __m128 t1 = _mm_hadd_ps(t0, t0);
        out[c * os] = sb_f16_leftover(_mm_cvtss_f32(_mm_hadd_ps(t1, t1)), np, n, x, y + c * ldy);
    }
}

static inline __attribute__((always_inline)) void sb_f16_tiles(int n, const ggml_fp16_t * x, const float * y, size_t ldy,
                                                               float * out, size_t os, int nc, struct sb_f16_pf pf) {
    switch (nc) {
        case 1: sb_f16_tile(n, x, y, ldy, out, os, 1, pf); break;
        case 2: sb_f16_tile(n, x, y, ldy, out, os, 2, pf); break;
        default: sb_f16_tile(n, x, y, ldy, out, os, 3, pf); break;
    }
}

// Long rows (F16 weights: a whole F16 model's mat-muls) with AVX2's 16 registers. At four accumulators a
// result the tile above holds three results, and each src1 vector it loads (from L2 past a few rows) serves
// one multiply: a pass over 16 rows of an F16 0.5B took 1.5x llamafile's time (the haswell module on Zen 4,
// docs/kernels.md). But vec_dot_f16's four accumulators are sums of their own (accumulator j: vector j of
// every step of 32 values), so they can be taken one j at a time with one register a result: 4 src0 rows x
// 2 src1 rows, each loaded vector serving two or four multiplies. The four passes go over blocks of 256
// values (4 KB of the tile's values, in L1), each accumulator kept between blocks; every accumulator adds
// its products in vec_dot's order and the four are added as vec_dot adds them, (0 + 2) + (1 + 3):
// bit-identical. In cache (sb_bench, haswell flags, Zen 4) 1.3-1.8x the tile above at 2-16 rows; 3 x 4,
// 3 x 3, 5 x 2 and 6 x 1 tiles and blocks of 512 or 1024 read slower.
#define SB_F16_JROWS 4
#define SB_F16_JCOLS 2
#define SB_F16_JMIN 256     // shorter rows (attention's K x Q over a head's 64-128 values) keep the tile above
#define SB_F16_JBLOCK 256
static inline __attribute__((always_inline)) void sb_f16_tile_j(int n, const char * x, size_t nb01, const float * y,
                                                                size_t ldy, float * out, size_t os, size_t rs,
                                                                const int nc, struct sb_f16_pf pf) {
    // pf: the next tile's rows (contiguous, pf.a on), fetched a few lines a pass over a block
    const int passes = 4 * ((n + SB_F16_JBLOCK - 1) / SB_F16_JBLOCK);
    const int64_t pf_step = 64 * (((pf.o_end - pf.o + 63) / 64 + passes - 1) / passes);
    __m256 state[4][SB_F16_JROWS][SB_F16_JCOLS];  // accumulator j of each result, between blocks
    for (int j = 0; j < 4; ++j) {
        for (int r = 0; r < SB_F16_JROWS; ++r) {
            for (int c = 0; c < nc; ++c) {
                state[j][r][c] = _mm256_setzero_ps();
            }
        }
    }
    // blocks of SB_F16_JBLOCK values, so that the four passes over a block find its values in L1
    for (int b0 = 0; b0 < n; b0 += SB_F16_JBLOCK) {
        const int b1 = b0 + SB_F16_JBLOCK < n ? b0 + SB_F16_JBLOCK : n;
        for (int j = 0; j < 4; ++j) {
            __m256 acc[SB_F16_JROWS][SB_F16_JCOLS];
            for (int r = 0; r < SB_F16_JROWS; ++r) {
                for (int c = 0; c < nc; ++c) {
                    acc[r][c] = state[j][r][c];
                }
            }
            if (pf.a != NULL) {
                const int64_t until = pf.o + pf_step < pf.o_end ? pf.o + pf_step : pf.o_end;
                for (; pf.o < until; pf.o += 64) {
                    _mm_prefetch(pf.a + pf.o, SB_F16_HINT);
                }
            }
            for (int i = b0 + 8 * j; i < b1; i += 32) {
                __m256 xv[SB_F16_JROWS];
                for (int r = 0; r < SB_F16_JROWS; ++r) {
                    xv[r] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (x + r * nb01 + 2 * (size_t) i)));
                }
                for (int c = 0; c < nc; ++c) {
                    const __m256 yv = _mm256_loadu_ps(y + c * ldy + i);
                    for (int r = 0; r < SB_F16_JROWS; ++r) {
                        acc[r][c] = _mm256_fmadd_ps(xv[r], yv, acc[r][c]);
                    }
                }
            }
            for (int r = 0; r < SB_F16_JROWS; ++r) {
                for (int c = 0; c < nc; ++c) {
                    state[j][r][c] = acc[r][c];
                }
            }
        }
    }
    for (int r = 0; r < SB_F16_JROWS; ++r) {
        for (int c = 0; c < nc; ++c) {  // GGML_F32x8_REDUCE: (0 + 2) + (1 + 3), then the lanes
            const __m256 s  = _mm256_add_ps(_mm256_add_ps(state[0][r][c], state[2][r][c]),
                                            _mm256_add_ps(state[1][r][c], state[3][r][c]));
            const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
            const __m128 t1 = _mm_hadd_ps(t0, t0);
            out[c * os + r * rs] = _mm_cvtss_f32(_mm_hadd_ps(t1, t1));  // no values past the last step
        }
    }
}

static inline __attribute__((always_inline)) void sb_f16_tiles_j(int n, const char * x, size_t nb01, const float * y,
                                                                 size_t ldy, float * out, size_t os, size_t rs, int nc,
                                                                 struct sb_f16_pf pf) {
    switch (nc) {
        case 1: sb_f16_tile_j(n, x, nb01, y, ldy, out, os, rs, 1, pf); break;
        default: sb_f16_tile_j(n, x, nb01, y, ldy, out, os, rs, 2, pf); break;
    }
}
#define SB_F16_JTILES 1

#define SB_F16_KERNEL 1
#endif

#ifdef SB_F16_KERNEL

bool ggml_smallbatch_f16_chunk(const struct ggml_tensor * dst, const void * wdata, size_t row_size, bool src1_packed,
                               int64_t ir0_start, int64_t ir0_end, int64_t ir1_start, int64_t ir1_end) {
    const int    n    = (int) dst->src[0]->ne[0];
    const size_t nb01 = dst->src[0]->nb[1];

    // the converted src1 rows of a call, per thread (grown as needed, kept for the next call), each row on
    // a 64-byte boundary: a vector load that crosses a cache line costs two, and malloc's 16-byte alignment
    // made a pass over 8-16 rows of an F16 0.5B take 1.23-1.26x llamafile's time (docs/kernels.md)
    static __thread float * buf = NULL;
    static __thread size_t  cap = 0;
    const size_t ldy = (size_t) (n + 15) & ~(size_t) 15;
    if (cap < SB_F16_COLS * ldy) {
        float * grown = NULL;
        if (posix_memalign((void **) &grown, 64, SB_F16_COLS * ldy * sizeof(float)) != 0) {
            return false;
        }
        free(buf);
        buf = grown;
        cap = SB_F16_COLS * ldy;
    }

    // src0 rows (cache cells) past the visible ones: K x Q results that the softmax's mask makes -inf
    // (ggml_smallbatch_kq_cells), written as 0 and not computed
    const int64_t cells  = ggml_smallbatch_kq_cells(dst);
    const int64_t ir0_to = ir0_end < cells ? ir0_end : cells > ir0_start ? cells : ir0_start;

    const void * yh[SB_F16_COLS];
    float *      d[SB_F16_COLS];
    for (int64_t c0 = ir1_start; c0 < ir1_end;) {
        const char *  src0_mat;
        const int64_t c  = ggml_smallbatch_columns(dst, wdata, row_size, src1_packed, c0, ir1_end, SB_F16_COLS, yh, d, &src0_mat);
        const int     nc = (int) (c - c0);
        for (int j = 0; j < nc; ++j) {  // to float, once for every src0 row of the chunk
            const ggml_fp16_t * y = (const ggml_fp16_t *) yh[j];
            float * yf = buf + (size_t) j * ldy;
            int i = 0;
            for (; i + 8 <= n; i += 8) {
                _mm256_storeu_ps(yf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (y + i))));
            }
            for (; i < n; ++i) {
                yf[i] = GGML_CPU_FP16_TO_FP32(y[i]);
            }
        }
        for (int j = 0; j < nc; ++j) {
            for (int64_t ir = ir0_to; ir < ir0_end; ++ir) {
                d[j][ir] = 0.0f;
            }
        }
        // V x softmax(KQ): the src1 rows are weights, 0 past the visible cells; the 64-value steps past the
        // last weight that is not 0 would add only products x * 0 (+-0: no accumulator, which starts at +0,
        // changes by one), so the sums stop before them: the same floats (ggml_smallbatch_kq_cells)
        int nk = n;
        if (n % 64 == 0) {
            int last = 0;  // one past the last value that is not 0 in any of the call's rows
            for (int j = 0; j < nc && last < n; ++j) {
                const float * yf = buf + (size_t) j * ldy;
                int i = n;
                while (i > last && yf[i - 1] == 0.0f) {
                    --i;
                }
                last = i > last ? i : last;
            }
            nk = last > 64 ? (last + 63) & ~63 : 64;
        }
        // the results of one src0 row go to consecutive dst columns where dst's columns are evenly spaced
        bool even = true;
        for (int j = 2; j < nc && even; ++j) {
            even = d[j] - d[j - 1] == d[1] - d[0];
        }
        int64_t ir0 = ir0_start;
#ifdef SB_F16_JTILES
        // weights only: rows one after another (attention's V rows are spaced by the cache's size, and keep
        // the tile above, as measured with it)
        const bool weights = nb01 == 2 * (size_t) n;
        for (; weights && nk % 32 == 0 && nk >= SB_F16_JMIN && ir0 + SB_F16_JROWS <= ir0_to; ir0 += SB_F16_JROWS) {
            const char * x = src0_mat + ir0 * nb01;
            // the next tile's rows fetched while this one computes, spread over its column tiles
            const int ntiles = (nc + SB_F16_JCOLS - 1) / SB_F16_JCOLS;
            const int64_t span = (int64_t) 2 * nk * SB_F16_JROWS;
            struct sb_f16_pf pf = {NULL, NULL, 0, 0};
            if (ir0 + 2 * SB_F16_JROWS <= ir0_to) {
                pf.a = x + SB_F16_JROWS * nb01;
            }
            for (int t = 0; t < nc; t += SB_F16_JCOLS) {
                const int nt = nc - t < SB_F16_JCOLS ? nc - t : SB_F16_JCOLS;
                pf.o = span * (t / SB_F16_JCOLS) / ntiles;
                pf.o_end = span * (t / SB_F16_JCOLS + 1) / ntiles;
                if (even) {
                    sb_f16_tiles_j(nk, x, nb01, buf + (size_t) t * ldy, ldy, d[t] + ir0, nc > 1 ? (size_t) (d[1] - d[0]) : 0, 1, nt, pf);
                } else {
                    float out[SB_F16_JCOLS * SB_F16_JROWS];
                    sb_f16_tiles_j(nk, x, nb01, buf + (size_t) t * ldy, ldy, out, SB_F16_JROWS, 1, nt, pf);
                    for (int j = 0; j < nt; ++j) {
                        for (int r = 0; r < SB_F16_JROWS; ++r) {
                            d[t + j][ir0 + r] = out[j * SB_F16_JROWS + r];
                        }
                    }
                }
            }
        }
#endif
#ifdef SB_F16_PAIRS
        for (; nk % 64 == 0 && ir0 + 1 < ir0_to; ir0 += 2) {  // two src0 rows at a time
            const ggml_fp16_t * x0 = (const ggml_fp16_t *) (src0_mat + ir0 * nb01);
            const ggml_fp16_t * x1 = (const ggml_fp16_t *) (src0_mat + (ir0 + 1) * nb01);
            const int ntiles = (nc + SB_F16_PAIR_TILE - 1) / SB_F16_PAIR_TILE;
            struct sb_f16_pf pf = {NULL, NULL, 0, 0};
            if (ir0 + 3 < ir0_to) {
                pf.a = src0_mat + (ir0 + 2) * nb01;
                pf.b = src0_mat + (ir0 + 3) * nb01;
            }
            for (int t = 0; t < nc; t += SB_F16_PAIR_TILE) {
                const int nt = nc - t < SB_F16_PAIR_TILE ? nc - t : SB_F16_PAIR_TILE;
                pf.o = (int64_t) 4 * nk * (t / SB_F16_PAIR_TILE) / ntiles;
                pf.o_end = (int64_t) 4 * nk * (t / SB_F16_PAIR_TILE + 1) / ntiles;
                if (even) {
                    sb_f16_tiles2(nk, x0, x1, buf + (size_t) t * ldy, ldy, d[t] + ir0, nc > 1 ? (size_t) (d[1] - d[0]) : 0, nt, pf);
                } else {
                    float out[2 * SB_F16_PAIR_TILE];
                    sb_f16_tiles2(nk, x0, x1, buf + (size_t) t * ldy, ldy, out, 2, nt, pf);
                    for (int j = 0; j < nt; ++j) {
                        d[t + j][ir0] = out[2 * j];
                        d[t + j][ir0 + 1] = out[2 * j + 1];
                    }
                }
            }
        }
#endif
        for (; ir0 < ir0_to; ++ir0) {
            const ggml_fp16_t * x = (const ggml_fp16_t *) (src0_mat + ir0 * nb01);
            // the next row fetched while this one computes, as for pairs above
            const int ntiles = (nc + SB_F16_TILE - 1) / SB_F16_TILE;
            struct sb_f16_pf pf = {NULL, NULL, 0, 0};
            if (ir0 + 1 < ir0_to) {
                pf.a = src0_mat + (ir0 + 1) * nb01;
            }
            for (int t = 0; t < nc; t += SB_F16_TILE) {
                const int nt = nc - t < SB_F16_TILE ? nc - t : SB_F16_TILE;
                pf.o = (int64_t) 2 * nk * (t / SB_F16_TILE) / ntiles;
                pf.o_end = (int64_t) 2 * nk * (t / SB_F16_TILE + 1) / ntiles;
                if (even) {
                    sb_f16_tiles(nk, x, buf + (size_t) t * ldy, ldy, d[t] + ir0, nc > 1 ? (size_t) (d[1] - d[0]) : 0, nt, pf);
                } else {
                    float out[SB_F16_TILE];
                    sb_f16_tiles(nk, x, buf + (size_t) t * ldy, ldy, out, 1, nt, pf);
                    for (int j = 0; j < nt; ++j) {
                        d[t + j][ir0] = out[j];
                    }
                }
            }
        }
        c0 = c;
    }
    return true;
}

bool ggml_smallbatch_has_f16(void) {
    static int on = -1;
    if (on < 0) {  // GGML_SMALLBATCH_F16=0 leaves attention to llamafile's sgemm, for comparisons
        const char * env = getenv("GGML_SMALLBATCH_F16");
        on = env == NULL || *env == '\0' || atoi(env) != 0;
    }
    return on != 0;
}

#else

bool ggml_smallbatch_f16_chunk(const struct ggml_tensor * dst, const void * wdata, size_t row_size, bool src1_packed,
                               int64_t ir0_start, int64_t ir0_end, int64_t ir1_start, int64_t ir1_end) {
    (void) dst; (void) wdata; (void) row_size; (void) src1_packed;
    (void) ir0_start; (void) ir0_end; (void) ir1_start; (void) ir1_end;
    return false;
}

bool ggml_smallbatch_has_f16(void) {
    return false;  // no AVX2: llamafile's sgemm (or vec_dot) as before
}

#endif
