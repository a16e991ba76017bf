// Single-thread microbenchmark and bit-identity check of the small-batch kernels (../*.c) against
// ggml's per-row kernels: ggml_vec_dot_q6_K_q8_K (arch/x86/quants.c) for Q6_K and
// ggml_gemv_q4_K_8x8_q8_K (arch/x86/repack.cpp) for Q4_K repacked eight rows at a time.
// Built by build.sh from the vendored ggml of the llama-cpp-python sdist; `old_*` are the kernels
// of an earlier commit (build.sh OLD=<rev>), compiled with their getters renamed.
//
//   sb_bench [--check-only]
// prints, per weight type, width and activation-row count: ns per activation row per 256 weights
// (Q4_K: per group of eight weight rows x 256 weights) for the old and the new kernel, the fastest
// of 21 interleaved repeats, and exits 1 if any result differs from the per-row kernel's in any bit.
#include "smallbatch.h"

#define GGML_COMMON_DECL_C
#include "ggml-common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void quantize_row_q4_K_ref(const float * x, block_q4_K * y, int64_t k);
void quantize_row_q6_K_ref(const float * x, block_q6_K * y, int64_t k);
void quantize_row_q8_K_ref(const float * x, block_q8_K * y, int64_t k);
void ggml_vec_dot_q6_K_q8_K(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void ggml_gemv_q4_K_8x8_q8_K(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
void quantize_row_q8_0_ref(const float * x, block_q8_0 * y, int64_t k);
void quantize_row_q8_1_ref(const float * x, block_q8_1 * y, int64_t k);
void quantize_row_q4_1_ref(const float * x, block_q4_1 * y, int64_t k);
void quantize_row_q4_0_ref(const float * x, block_q4_0 * y, int64_t k);
void quantize_row_q5_0_ref(const float * x, block_q5_0 * y, int64_t k);
void ggml_vec_dot_q4_0_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void ggml_vec_dot_q5_0_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void ggml_vec_dot_q8_0_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void ggml_vec_dot_q4_1_q8_1(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);

// the earlier commit's kernels (interface of that commit: build.sh defines SB_OLD_WROWS when its
// per-row-layout kernel takes several weight rows a call, as this one does)
#ifdef SB_OLD_WROWS
typedef ggml_smallbatch_dot_t old_dot_t;
#define OLD6_ROWS(n, s, bs, x, bx, nw, vy, nc) old6((n), (s), (bs), (x), (bx), (nw), (vy), (nc))
#else
typedef void (*old_dot_t)(int n, float * s, const void * vx, const void * const * vy, int nc);
#define OLD6_ROWS(n, s, bs, x, bx, nw, vy, nc) \
    for (int w_ = 0; w_ < (nw); ++w_) old6((n), (s) + w_ * (bs), (const char *) (x) + w_ * (bx), (vy), (nc))
#endif
old_dot_t old_smallbatch_q6_K(void);
ggml_smallbatch_gemm_t old_smallbatch_q4_Kx8(void);

void ggml_vec_dot_f16(int n, float * s, size_t bs, ggml_fp16_t * x, size_t bx, ggml_fp16_t * y, size_t by, int nrc);

// ggml-cpu's fp16 -> fp32 table (ggml-cpu.c fills it in ggml_cpu_init); the per-row kernels read it
float ggml_table_f32_f16[1 << 16];
float ggml_table_f32_e8m0_half[1 << 8];
void quantize_row_mxfp4_ref(const float * x, block_mxfp4 * y, int64_t k);
void ggml_gemv_mxfp4_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
float ggml_fp16_to_fp32(ggml_fp16_t x);

typedef struct {  // block_q4_Kx8 (repack.h)
    ggml_half d[8];
    ggml_half dmin[8];
    uint8_t   scales[96];
    uint8_t   qs[1024];
} bench_q4_Kx8;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {  // roughly N(0,1)-shaped: sum of uniforms
    float s = 0;
    for (int i = 0; i < 4; ++i) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        s += (float) (rng >> 40) / (float) (1 << 24) - 0.5f;
    }
    return s;
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

// 8 Q4_K rows -> block_q4_Kx8 groups: d, dmin, the quants interleaved 8 bytes at a time, the
// 6-bit scales and mins of each sub-block regrouped 12 bytes per sub-block over the 8 rows
static void pack_q4_Kx8(const block_q4_K * rows[8], bench_q4_Kx8 * out, int nb) {
    for (int b = 0; b < nb; ++b) {
        bench_q4_Kx8 * o = out + b;
        for (int r = 0; r < 8; ++r) {
            o->d[r] = rows[r][b].d;
            o->dmin[r] = rows[r][b].dmin;
        }
        for (int i = 0; i < 128; ++i) {
            memcpy(o->qs + 8 * i, rows[i % 8][b].qs + 8 * (i / 8), 8);
        }
        for (int sub = 0; sub < 8; ++sub) {
            uint8_t sc[8], mn[8];
            for (int r = 0; r < 8; ++r) {  // unpack the row's 6-bit scale and min of sub-block `sub`
                const uint8_t * q = rows[r][b].scales;
                if (sub < 4) {
                    sc[r] = q[sub] & 63;
                    mn[r] = q[sub + 4] & 63;
                } else {
                    sc[r] = (q[sub + 4] & 15) | ((q[sub - 4] >> 6) << 4);
                    mn[r] = (q[sub + 4] >> 4) | ((q[sub] >> 6) << 4);
                }
            }
            // 12 bytes per sub-block: rows 0-3 in the low 6 bits, rows 4-7 split over the rest
            uint8_t * p = o->scales + 12 * sub;
            for (int r = 0; r < 4; ++r) {
                p[r]     = sc[r] | ((sc[r + 4] & 48) << 2);
                p[r + 4] = mn[r] | ((mn[r + 4] & 48) << 2);
                p[r + 8] = (sc[r + 4] & 15) | ((mn[r + 4] & 15) << 4);
            }
        }
    }
}

// Q8_K quantization (smallbatch-q8_K.c) against quantize_row_q8_K_ref on rows built to hit its
// edge cases: the largest |x| twice with both signs, an all-zero block, a NaN, products that land
// on .5 (ties to even) and next to it, a tiny and a huge scale. Returns the rows that differ.
static int check_quantize_q8_K(int time_it) {
    enum { N = 8960, ROWS = 64 };
    float * x = malloc(sizeof(float) * N);
    block_q8_K * a = malloc(sizeof(block_q8_K) * (N / QK_K));
    block_q8_K * b = malloc(sizeof(block_q8_K) * (N / QK_K));
    int bad = 0;
    for (int r = 0; r < ROWS; ++r) {
        for (int i = 0; i < N; ++i) x[i] = frand() * (r % 3 == 0 ? 1e-30f : r % 3 == 1 ? 1.0f : 1e30f);
        if (r % 4 == 1) {  // ties for the largest |x|: the first one found sets the sign
            x[7] = 3.0f * (r % 3 == 2 ? 1e30f : 1.0f); x[200] = -x[7]; x[256 + 9] = -x[7]; x[256 + 100] = x[7];
        }
        if (r % 4 == 2) {  // codes exactly on and next to .5: iscale = -127/max with max = -127
            for (int i = 0; i < QK_K; ++i) x[i] = (float) (i % 200) - 99.5f;
            x[5] = -127.0f;
            x[QK_K + 3] = 2.5f; x[QK_K + 4] = nextafterf(2.5f, 3.0f); x[QK_K + 5] = -0.0f;
        }
        if (r % 8 == 3) memset(x + 2 * QK_K, 0, sizeof(float) * QK_K);  // an all-zero block
        if (r % 8 == 7) x[3 * QK_K + 17] = NAN;  // the reference skips it when looking for the largest
        memset(a, 0x5a, sizeof(block_q8_K) * (N / QK_K));
        memset(b, 0x5a, sizeof(block_q8_K) * (N / QK_K));
        quantize_row_q8_K_ref(x, a, N);
        ggml_smallbatch_quantize_row_q8_K(x, b, N);
        if (memcmp(a, b, sizeof(block_q8_K) * (N / QK_K)) != 0) {
            printf("check Q8_K quantization row %d: differs from quantize_row_q8_K_ref\n", r);
            bad++;
        }
    }
    printf("check Q8_K quantization: %d rows, %s\n", ROWS, bad ? "DIFFERENT" : "bit-identical");
    if (time_it) {  // ns per 256 values, the fastest of 21 repeats
        double best_ref = 1e30, best_new = 1e30;
        for (int i = 0; i < N; ++i) x[i] = frand();
        for (int rep = 0; rep < 21; ++rep) {
            const double t0 = now_ns();
            for (int k = 0; k < 16; ++k) quantize_row_q8_K_ref(x, a, N);
            const double t1 = now_ns();
            for (int k = 0; k < 16; ++k) ggml_smallbatch_quantize_row_q8_K(x, b, N);
            const double t2 = now_ns();
            best_ref = (t1 - t0) < best_ref ? (t1 - t0) : best_ref;
            best_new = (t2 - t1) < best_new ? (t2 - t1) : best_new;
        }
        printf("time Q8_K quantization, ns per 256 values: quantize_row_q8_K_ref %.1f, this %.1f (x%.1f)\n",
               best_ref / (16.0 * N / QK_K), best_new / (16.0 * N / QK_K), best_ref / best_new);
    }
    free(x); free(a); free(b);
    return bad;
}

// The legacy quants' kernels (smallbatch-legacy.c) against vec_dot: Q8_0, Q4_0 and Q5_0 x Q8_0 and Q4_1 x
// Q8_1, every (weight row, activation row) of 1-8 activation rows and 1-4 weight rows a call, bit for
// bit; with `timed`, ns per activation row per 32 weights: vec_dot row by row against the kernel.
typedef void (*vec_dot_t)(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
static void q8_0_weights(const float * f, void * y, int64_t k) { quantize_row_q8_0_ref(f, y, k); }
static void q4_0_weights(const float * f, void * y, int64_t k) { quantize_row_q4_0_ref(f, y, k); }
static void q5_0_weights(const float * f, void * y, int64_t k) { quantize_row_q5_0_ref(f, y, k); }
static void q4_1_weights(const float * f, void * y, int64_t k) { quantize_row_q4_1_ref(f, y, k); }
static void q8_0_acts(const float * f, void * y, int64_t k) { quantize_row_q8_0_ref(f, y, k); }
static void q8_1_acts(const float * f, void * y, int64_t k) { quantize_row_q8_1_ref(f, y, k); }

// Results of `dot` (on rows `kvy`) that differ from `ref_dot`'s (on rows `vy`): every weight row a stride of 61
// apart, 1-8 activation rows and 1-4 weight rows a call
static int legacy_differences(int n, int rows, const char * w, size_t row, ggml_smallbatch_dot_t dot, const void * const * kvy,
                              vec_dot_t ref_dot, const void * const * vy) {
    float ref, out[GGML_SMALLBATCH_MAX_WROWS * GGML_SMALLBATCH_MAX_COLS];
    int bad = 0;
    for (int nc = 1; nc <= GGML_SMALLBATCH_MAX_COLS; ++nc) {
        for (int nw = 1; nw <= GGML_SMALLBATCH_MAX_WROWS; ++nw) {
            for (int r0 = 0; r0 + nw <= rows; r0 += 61) {
                dot(n, out, GGML_SMALLBATCH_MAX_COLS, w + r0 * row, row, nw, kvy, nc);
                for (int k = 0; k < nw; ++k) {
                    for (int c = 0; c < nc; ++c) {
                        ref_dot(n, &ref, 0, w + (r0 + k) * row, 0, vy[c], 0, 1);
                        bad += memcmp(&ref, &out[k * GGML_SMALLBATCH_MAX_COLS + c], sizeof(float)) != 0;
                    }
                }
            }
        }
    }
    return bad;
}

static int check_legacy(int timed) {
    enum { N = 640, NB = N / 32, ROWS = 512, REPS = 21, TYPES = 4 };  // Gemma 3 270M's width
    static const struct {
        const char * name;
        size_t wsize, asize;
        void (*weights)(const float *, void *, int64_t);
        void (*acts)(const float *, void *, int64_t);
        vec_dot_t ref;
        ggml_smallbatch_dot_t (*kernel)(void);
        enum ggml_type type;
    } types[TYPES] = {
        {"Q8_0", sizeof(block_q8_0), sizeof(block_q8_0), q8_0_weights, q8_0_acts, ggml_vec_dot_q8_0_q8_0, ggml_smallbatch_q8_0, GGML_TYPE_Q8_0},
        {"Q4_0", sizeof(block_q4_0), sizeof(block_q8_0), q4_0_weights, q8_0_acts, ggml_vec_dot_q4_0_q8_0, ggml_smallbatch_q4_0, GGML_TYPE_Q4_0},
        {"Q5_0", sizeof(block_q5_0), sizeof(block_q8_0), q5_0_weights, q8_0_acts, ggml_vec_dot_q5_0_q8_0, ggml_smallbatch_q5_0, GGML_TYPE_Q5_0},
        {"Q4_1", sizeof(block_q4_1), sizeof(block_q8_1), q4_1_weights, q8_1_acts, ggml_vec_dot_q4_1_q8_1, ggml_smallbatch_q4_1, GGML_TYPE_Q4_1},
    };
    int bad_total = 0;
    float * f = malloc(sizeof(float) * N);
    for (int t = 0; t < TYPES; ++t) {
        const size_t row = types[t].wsize * NB, arow = types[t].asize * NB;
        char * w = malloc(row * ROWS);
        char * a = malloc(arow * GGML_SMALLBATCH_MAX_COLS);
        const void * vy[GGML_SMALLBATCH_MAX_COLS];
        for (int r = 0; r < ROWS; ++r) {
            for (int i = 0; i < N; ++i) f[i] = frand() * (r % 7 == 0 ? 3.0f : 0.02f);
            types[t].weights(f, w + r * row, N);
        }
        for (int c = 0; c < GGML_SMALLBATCH_MAX_COLS; ++c) {
            for (int i = 0; i < N; ++i) f[i] = frand();
            types[t].acts(f, a + c * arow, N);
            vy[c] = a + c * arow;
        }
        const ggml_smallbatch_dot_t dot = types[t].kernel();
        const vec_dot_t ref_dot = types[t].ref;
        float ref[GGML_SMALLBATCH_MAX_COLS], out[GGML_SMALLBATCH_MAX_WROWS * GGML_SMALLBATCH_MAX_COLS];
        const int bad = legacy_differences(N, ROWS, w, row, dot, vy, ref_dot, vy);
        printf("check n=%d nc=1-8 nw=1-4: %s %s\n", N, types[t].name, bad ? "DIFFERS" : "bit-identical");
        bad_total += bad;
        // the kernel on activation rows prepared once per call (ggml_smallbatch_prepared_kernel), where the build has it
        const ggml_smallbatch_dot_t pdot = ggml_smallbatch_prepared_kernel(types[t].type);
        const size_t prow = ggml_smallbatch_q8_0_prepared_size(N);
        char * pa = pdot != NULL ? malloc(prow * GGML_SMALLBATCH_MAX_COLS) : NULL;
        const void * pvy[GGML_SMALLBATCH_MAX_COLS];
        for (int c = 0; pdot != NULL && c < GGML_SMALLBATCH_MAX_COLS; ++c) {
            ggml_smallbatch_q8_0_prepare(N, vy[c], pa + c * prow);
            pvy[c] = pa + c * prow;
        }
        const int pbad = pdot != NULL ? legacy_differences(N, ROWS, w, row, pdot, pvy, ref_dot, vy) : 0;
        if (pdot != NULL) {
            printf("check n=%d nc=1-8 nw=1-4: %s prepared %s\n", N, types[t].name, pbad ? "DIFFERS" : "bit-identical");
        }
        bad_total += pbad;
        for (int nc = 1; timed && pdot != NULL && nc <= GGML_SMALLBATCH_MAX_COLS; nc += nc < 4 ? 1 : 4) {
            double best_old = 1e30, best_new = 1e30;
            for (int rep = 0; rep < REPS; ++rep) {
                double t0 = now_ns();
                for (int r = 0; r < ROWS; r += GGML_SMALLBATCH_MAX_WROWS)
                    dot(N, out, GGML_SMALLBATCH_MAX_COLS, w + r * row, row, GGML_SMALLBATCH_MAX_WROWS, vy, nc);
                double t1 = now_ns();
                for (int c = 0; c < nc; ++c) ggml_smallbatch_q8_0_prepare(N, vy[c], pa + c * prow);  // once per call
                for (int r = 0; r < ROWS; r += GGML_SMALLBATCH_MAX_WROWS)
                    pdot(N, out, GGML_SMALLBATCH_MAX_COLS, w + r * row, row, GGML_SMALLBATCH_MAX_WROWS, pvy, nc);
                double t2 = now_ns();
                best_old = t1 - t0 < best_old ? t1 - t0 : best_old;
                best_new = t2 - t1 < best_new ? t2 - t1 : best_new;
            }
            const double units = (double) ROWS * NB * nc;
            printf("time n=%d nc=%d  %s kernel %6.3f prepared (preparing included, %d weight rows) %6.3f (x%.2f)\n", N, nc,
                   types[t].name, best_old / units, ROWS, best_new / units, best_old / best_new);
        }
        free(pa);
        for (int nc = 1; timed && nc <= GGML_SMALLBATCH_MAX_COLS; nc *= 2) {
            double best_ref = 1e30, best_new = 1e30;
            for (int rep = 0; rep < REPS; ++rep) {
                double t0 = now_ns();
                for (int r = 0; r < ROWS; ++r)
                    for (int c = 0; c < nc; ++c) ref_dot(N, ref + c, 0, w + r * row, 0, vy[c], 0, 1);
                double t1 = now_ns();
                for (int r = 0; r < ROWS; r += GGML_SMALLBATCH_MAX_WROWS)
                    dot(N, out, GGML_SMALLBATCH_MAX_COLS, w + r * row, row, GGML_SMALLBATCH_MAX_WROWS, vy, nc);
                double t2 = now_ns();
                best_ref = t1 - t0 < best_ref ? t1 - t0 : best_ref;
                best_new = t2 - t1 < best_new ? t2 - t1 : best_new;
            }
            const double units = (double) ROWS * NB * nc;
            printf("time n=%d nc=%d  %s vec_dot %6.2f kernel %6.2f (x%.2f)\n", N, nc, types[t].name, best_ref / units,
                   best_new / units, best_ref / best_new);
        }
        free(w); free(a);
    }
    free(f);
    return bad_total;
}

enum { WIDTHS = 2, REPEATS = 21 };

// The prepared Q6_K kernel (ggml_smallbatch_q6_K_prepared, where the build has it) on nrows weight rows: its
// results within rounding of vec_dot's (ref6[r * nc_max + c]: the largest difference at most 1e-5 of the
// largest result), each row's bit for bit the same in calls of 1..nc_max rows; then timed against the
// per-row-layout kernel `dot`, the rows prepared once per 64 weight rows as the driver does per chunk.
static int q6_K_prepared(int n, int nrows, const void * w6, size_t row6, const void * const * vy, int nc_max,
                         const float * ref6, ggml_smallbatch_dot_t dot, int check_only) {
    setenv("GGML_SMALLBATCH_Q6_K_PREPARED", "1", 0);  // off by default in the module
    const ggml_smallbatch_dot_t pdot = ggml_smallbatch_q6_K_prepared();
    if (pdot == NULL) {
        printf("check n=%d: no prepared Q6_K kernel in this build\n", n);
        return 0;
    }
    const size_t prow = ggml_smallbatch_q8_K_prepared_size(n);
    char * pbuf = aligned_alloc(64, prow * nc_max);
    const void * yp[GGML_SMALLBATCH_MAX_COLS];
    for (int c = 0; c < nc_max; ++c) {
        ggml_smallbatch_q8_K_prepare(n, vy[c], pbuf + c * prow);
        yp[c] = pbuf + c * prow;
    }
    float * one = malloc(sizeof(float) * nrows * nc_max);  // each row alone
    float * out = malloc(sizeof(float) * nrows * nc_max);
    int failures = 0;
    for (int c = 0; c < nc_max; ++c) {
        for (int r = 0; r < nrows; r += GGML_SMALLBATCH_MAX_WROWS) {
            pdot(n, one + r * nc_max + c, nc_max, (const char *) w6 + r * row6, row6, GGML_SMALLBATCH_MAX_WROWS, yp + c, 1);
        }
    }
    float top = 0, worst = 0;
    for (int i = 0; i < nrows * nc_max; ++i) {
        top = fmaxf(top, fabsf(ref6[i]));
        worst = fmaxf(worst, fabsf(one[i] - ref6[i]));
    }
    failures += !(worst <= 1e-5f * top);
    for (int nc = 2; nc <= nc_max; ++nc) {
        int bad = 0;
        memset(out, 0xff, sizeof(float) * nrows * nc_max);
        for (int r = 0; r < nrows; r += GGML_SMALLBATCH_MAX_WROWS) {
            pdot(n, out + r * nc_max, nc_max, (const char *) w6 + r * row6, row6, GGML_SMALLBATCH_MAX_WROWS, yp, nc);
        }
        for (int r = 0; r < nrows; ++r)
            for (int c = 0; c < nc; ++c)
                bad += memcmp(out + r * nc_max + c, one + r * nc_max + c, sizeof(float)) != 0;
        failures += bad;
        if (bad) printf("check n=%d nc=%d: prepared Q6_K rows DIFFER from the rows alone\n", n, nc);
    }
    printf("check n=%d nc=1-%d: prepared Q6_K within %.2g of the largest result (%.3g against %.3g), rows alone = rows in a call: %s\n",
           n, nc_max, (double) (worst / top), (double) worst, (double) top, failures ? "NO" : "yes");
    if (!check_only) {
        static const int ncs[] = {1, 2, 4, 8};
        const int nb = n / 256;
        for (int k = 0; k < 4; ++k) {
            const int nc = ncs[k];
            double t[2][REPEATS];
            for (int rep = 0; rep < REPEATS; ++rep) {
                double t0 = now_ns();
                for (int r = 0; r < nrows; r += GGML_SMALLBATCH_MAX_WROWS)
                    dot(n, out + r * nc_max, nc_max, (const char *) w6 + r * row6, row6, GGML_SMALLBATCH_MAX_WROWS, vy, nc);
                double t1 = now_ns();
                for (int r0 = 0; r0 < nrows; r0 += 64) {
                    for (int c = 0; c < nc; ++c) ggml_smallbatch_q8_K_prepare(n, vy[c], pbuf + c * prow);
                    for (int r = r0; r < r0 + 64 && r < nrows; r += GGML_SMALLBATCH_MAX_WROWS)
                        pdot(n, out + r * nc_max, nc_max, (const char *) w6 + r * row6, row6, GGML_SMALLBATCH_MAX_WROWS, yp, nc);
                }
                double t2 = now_ns();
                t[0][rep] = (t1 - t0) / ((double) nc * nb * nrows);
                t[1][rep] = (t2 - t1) / ((double) nc * nb * nrows);
            }
            qsort(t[0], REPEATS, sizeof(double), cmp_double);
            qsort(t[1], REPEATS, sizeof(double), cmp_double);
            printf("time n=%d nc=%d  Q6_K kernel %6.2f prepared (preparing included) %6.2f (x%.2f)\n", n, nc, t[0][0], t[1][0],
                   t[0][0] / t[1][0]);
        }
    }
    free(pbuf); free(one); free(out);
    return failures;
}
static const int widths[WIDTHS] = {1536, 8960};

// The F16 kernel (smallbatch-f16.c) against ggml_vec_dot_f16 (vec.cpp, the same flags), as attention uses
// it: src0 broadcast over 6 src1 matrices (grouped-query heads), row lengths with and without values past
// the last full step, dst with evenly spaced columns and with a gap between its matrices. Returns the
// number of differing results.
static int check_f16(void) {
    static const int ns[] = {64, 128, 200, 256, 520, 896};
    static const int ks[] = {2, 3, 5, 16};
    const int64_t rows = 40, heads_kv = 2, heads = 12;
    int bad = 0;
    srand(7);
    for (int a = 0; a < 6; ++a) {
        for (int b = 0; b < 4; ++b) {
            // mode 1: a gap between dst's matrices; 2: the src1 rows 0 from a third of the way on (V x softmax's
            // weights past the visible cells), and a softmax after dst whose mask leaves out the last 11 rows
            for (int mode = 0; mode < 3; ++mode) {
                const int gap = mode == 1, tail = mode == 2;
                const int n = ns[a], k = ks[b];
                ggml_fp16_t * x = malloc(sizeof(ggml_fp16_t) * n * rows * heads_kv);
                ggml_fp16_t * y = malloc(sizeof(ggml_fp16_t) * n * k * heads);
                for (int64_t i = 0; i < n * rows * heads_kv; ++i) x[i] = ggml_fp32_to_fp16((float) rand() / RAND_MAX * 2 - 1);
                for (int64_t i = 0; i < n * k * heads; ++i) y[i] = ggml_fp32_to_fp16((float) rand() / RAND_MAX * 4 - 2);
                for (int64_t i = 0; tail && i < n * k * heads; ++i) {
                    if (i % n > n / 3) y[i] = ggml_fp32_to_fp16(0.0f);
                }
                const int64_t plane = rows * k + (gap ? 3 : 0);  // floats between dst's matrices
                float * out = malloc(sizeof(float) * plane * heads);
                memset(out, 0xff, sizeof(float) * plane * heads);
                struct ggml_tensor s0 = {0}, s1 = {0}, d = {0};
                s0.type = GGML_TYPE_F16; s0.ne[0] = n; s0.ne[1] = rows; s0.ne[2] = heads_kv; s0.ne[3] = 1;
                s0.nb[0] = 2; s0.nb[1] = 2 * n; s0.nb[2] = 2 * n * rows; s0.nb[3] = s0.nb[2] * heads_kv; s0.data = x;
                s1.type = GGML_TYPE_F16; s1.ne[0] = n; s1.ne[1] = k; s1.ne[2] = heads; s1.ne[3] = 1;
                s1.nb[0] = 2; s1.nb[1] = 2 * n; s1.nb[2] = 2 * n * k; s1.nb[3] = s1.nb[2] * heads; s1.data = y;
                d.type = GGML_TYPE_F32; d.ne[0] = rows; d.ne[1] = k; d.ne[2] = heads; d.ne[3] = 1;
                d.nb[0] = 4; d.nb[1] = 4 * rows; d.nb[2] = 4 * plane; d.nb[3] = d.nb[2] * heads; d.data = out;
                d.src[0] = &s0; d.src[1] = &s1; d.op = GGML_OP_MUL_MAT;
                const int64_t visible = tail ? rows - 11 : rows;
                float * mask_data = malloc(sizeof(float) * rows * k);
                for (int64_t i = 0; i < rows * k; ++i) mask_data[i] = i % rows < visible ? 0.0f : -INFINITY;
                struct ggml_tensor mask = {0}, soft_max = {0};
                mask.type = GGML_TYPE_F32; mask.ne[0] = rows; mask.ne[1] = k; mask.ne[2] = 1; mask.ne[3] = 1;
                mask.nb[0] = 4; mask.nb[1] = 4 * rows; mask.nb[2] = mask.nb[3] = 4 * rows * k; mask.data = mask_data;
                soft_max.op = GGML_OP_SOFT_MAX; soft_max.src[0] = &d; soft_max.src[1] = &mask;
                ggml_smallbatch_node_begin(&d, tail ? &soft_max : NULL);
                if (ggml_smallbatch_kq_cells(&d) != visible) {
                    printf("check F16 n=%d rows=%d: %lld visible cells noted, not %lld\n", n, k,
                           (long long) ggml_smallbatch_kq_cells(&d), (long long) visible);
                    bad++;
                }
                // two chunks of rows, as two threads take them
                if (!ggml_smallbatch_f16_chunk(&d, y, 2 * n, true, 0, 17, 0, k * heads) ||
                    !ggml_smallbatch_f16_chunk(&d, y, 2 * n, true, 17, rows, 0, k * heads)) {
                    printf("check F16: no kernel in this build\n");
                    return 1;
                }
                ggml_smallbatch_node_begin(&d, NULL);
                free(mask_data);
                int diff = 0;
                for (int64_t h = 0; h < heads; ++h)
                    for (int64_t t = 0; t < k; ++t)
                        for (int64_t r = 0; r < rows; ++r) {
                            float ref;
                            ggml_vec_dot_f16(n, &ref, 0, x + (h / (heads / heads_kv)) * n * rows + r * n, 0, y + (h * k + t) * n, 0, 1);
                            if (r >= visible) ref = 0.0f;  // masked: written as 0
                            diff += memcmp(&ref, out + h * plane + t * rows + r, sizeof(float)) != 0;
                        }
                printf("check F16 n=%d rows=%d%s: %s\n", n, k, gap ? " (gap in dst)" : tail ? " (weights 0 past n/3, last 11 rows masked)" : "",
                       diff ? "DIFFERS" : "bit-identical");
                bad += diff;
                free(x); free(y); free(out);
            }
        }
    }
    return bad;
}

// The multiply peak the kernels' fractions are taken of: ns per instruction of 24 (AVX2: 12) independent
// multiply-adds in registers, as this core issues them (no memory, no dependency between them)
#define SB_PEAK_F(r) "vfmadd231ps %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define SB_PEAK_D(r) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define SB_PEAK_Y(r) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #r "\n\t"
#define SB_PEAK_24(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) \
                      M(12) M(13) M(14) M(15) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23)
// 24 of the 512-bit instruction M(r) (zmm0-23 accumulate zmm30 x zmm31), `it` times; the fastest ns each into BEST
#define SB_PEAK_512(M, BEST)                                                                                        \
    do {                                                                                                          \
        const double p0 = now_ns();                                                                               \
        __asm__ volatile("vpxord %%zmm30, %%zmm30, %%zmm30\n\tvpxord %%zmm31, %%zmm31, %%zmm31\n\tmov %0, %%rcx\n\t1:\n\t" \
                         SB_PEAK_24(M) "dec %%rcx\n\tjnz 1b\n\t" :: "r"(it)                                        \
                         : "rcx", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",    \
                           "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18",  \
                           "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm30", "xmm31");                          \
        const double p1 = now_ns();                                                                               \
        if ((p1 - p0) / (it * 24.0) < (BEST)) (BEST) = (p1 - p0) / (it * 24.0);                                   \
    } while (0)

static void time_peak(void) {
    const long it = 20000000;
    double best[3] = {1e30, 1e30, 1e30};
    for (int rep = 0; rep < 5; ++rep) {
        double t0 = now_ns();
        __asm__ volatile("vxorps %%xmm14, %%xmm14, %%xmm14\n\tvxorps %%xmm15, %%xmm15, %%xmm15\n\tmov %0, %%rcx\n\t1:\n\t"
                         SB_PEAK_Y(0) SB_PEAK_Y(1) SB_PEAK_Y(2) SB_PEAK_Y(3) SB_PEAK_Y(4) SB_PEAK_Y(5)
                         SB_PEAK_Y(6) SB_PEAK_Y(7) SB_PEAK_Y(8) SB_PEAK_Y(9) SB_PEAK_Y(10) SB_PEAK_Y(11)
                         "dec %%rcx\n\tjnz 1b\n\t" :: "r"(it)
                         : "rcx", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                           "xmm9", "xmm10", "xmm11", "xmm14", "xmm15");
        double t1 = now_ns();
        if ((t1 - t0) / (it * 12.0) < best[0]) best[0] = (t1 - t0) / (it * 12.0);
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
        SB_PEAK_512(SB_PEAK_F, best[1]);
        SB_PEAK_512(SB_PEAK_D, best[2]);
#endif
    }
    printf("peak: 256-bit fma %.3f ns", best[0]);
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
    printf(", 512-bit fma %.3f ns, 512-bit vpdpbusd %.3f ns", best[1], best[2]);
#endif
    printf(" per instruction\n");
}

// The MXFP4 kernel (repacked eight rows at a time, smallbatch-legacy.c) against ggml_gemv_mxfp4_8x8_q8_0 for
// every activation row: 1-8 rows a call, the results bit for bit; timed per row of 32 weights x 8 rows
typedef struct {
    uint8_t e[8];
    uint8_t qs[QK_MXFP4 * 4];
} bench_mxfp4x8;

static int check_mxfp4(int timed) {
    enum { N = 896, NB = N / 32, ROWS = 512, REPS = 21 };
    const ggml_smallbatch_gemm_t kernel = ggml_smallbatch_mxfp4x8();
    if (kernel == NULL) {
        printf("check MXFP4: no kernel in this build\n");
        return 0;
    }
    float * f = malloc(sizeof(float) * N);
    block_mxfp4 * w = malloc(sizeof(block_mxfp4) * NB * ROWS);
    for (int r = 0; r < ROWS; ++r) {
        for (int i = 0; i < N; ++i) f[i] = frand() * (r % 5 == 0 ? 1e-3f : 0.05f);
        quantize_row_mxfp4_ref(f, w + r * NB, N);
    }
    bench_mxfp4x8 * wx = malloc(sizeof(bench_mxfp4x8) * NB * (ROWS / 8));
    for (int g = 0; g < ROWS / 8; ++g) {  // make_block_mxfp4x8 (repack.cpp): 8-byte chunks, row i % 8
        for (int b = 0; b < NB; ++b) {
            bench_mxfp4x8 * o = wx + g * NB + b;
            for (int i = 0; i < 8; ++i) o->e[i] = w[(g * 8 + i) * NB + b].e;
            for (int i = 0; i < 16; ++i) memcpy(o->qs + 8 * i, w[(g * 8 + i % 8) * NB + b].qs + 8 * (i / 8), 8);
        }
    }
    block_q8_0 * act = malloc(sizeof(block_q8_0) * NB * GGML_SMALLBATCH_MAX_COLS);
    const void * vy[GGML_SMALLBATCH_MAX_COLS];
    for (int c = 0; c < GGML_SMALLBATCH_MAX_COLS; ++c) {
        for (int i = 0; i < N; ++i) f[i] = frand() * (c == 2 ? 30.0f : 1.0f);
        quantize_row_q8_0_ref(f, act + c * NB, N);
        vy[c] = act + c * NB;
    }
    float * ref = malloc(sizeof(float) * ROWS * GGML_SMALLBATCH_MAX_COLS);
    float * out = malloc(sizeof(float) * ROWS * GGML_SMALLBATCH_MAX_COLS);
    for (int c = 0; c < GGML_SMALLBATCH_MAX_COLS; ++c) {
        ggml_gemv_mxfp4_8x8_q8_0(N, ref + c * ROWS, ROWS, wx, vy[c], 1, ROWS);
    }
    int bad = 0;
    for (int nr = 1; nr <= GGML_SMALLBATCH_MAX_COLS; ++nr) {
        memset(out, 0xff, sizeof(float) * ROWS * GGML_SMALLBATCH_MAX_COLS);
        kernel(N, out, ROWS, wx, vy, nr, ROWS);
        int diff = 0;
        for (int c = 0; c < nr; ++c) diff += memcmp(out + c * ROWS, ref + c * ROWS, sizeof(float) * ROWS) != 0;
        printf("check MXFP4x8 nr=%d: %s\n", nr, diff ? "DIFFERS" : "bit-identical");
        bad += diff;
    }
    if (timed) {
        static const int ncs[] = {1, 2, 4, 8};
        for (int k = 0; k < 4; ++k) {
            const int nr = ncs[k];
            double t[2][REPS];
            for (int rep = 0; rep < REPS; ++rep) {
                const double t0 = now_ns();
                for (int c = 0; c < nr; ++c) ggml_gemv_mxfp4_8x8_q8_0(N, out + c * ROWS, ROWS, wx, vy[c], 1, ROWS);
                const double t1 = now_ns();
                kernel(N, out, ROWS, wx, vy, nr, ROWS);
                const double t2 = now_ns();
                const double units = (double) nr * NB * (ROWS / 8);
                t[0][rep] = (t1 - t0) / units;
                t[1][rep] = (t2 - t1) / units;
            }
            qsort(t[0], REPS, sizeof(double), cmp_double);
            qsort(t[1], REPS, sizeof(double), cmp_double);
            printf("time MXFP4x8 n=%d nr=%d  gemv per row %6.2f kernel %6.2f (x%.2f)\n", N, nr, t[0][0], t[1][0], t[0][0] / t[1][0]);
        }
    }
    free(f); free(w); free(wx); free(act); free(ref); free(out);
    return bad;
}

#ifdef SB_OLD_F16
bool old_smallbatch_f16_chunk(const struct ggml_tensor * dst, const void * wdata, size_t row_size, bool src1_packed,
                              int64_t ir0_start, int64_t ir0_end, int64_t ir1_start, int64_t ir1_end);
#endif

// The F16 kernel as an F16 model's weights use it (one src0 matrix, k src1 rows, a thread's chunk of 64
// weight rows at a time), against the earlier commit's: ns per 256 multiply-adds of one src1 row
static void time_f16(void) {
#ifdef SB_OLD_F16
    static const int ns[] = {896, 4864};
    static const int ks[] = {2, 4, 8, 16};
    const int64_t rows = 512;
    for (int a = 0; a < 2; ++a) {
        const int n = ns[a];
        ggml_fp16_t * x = malloc(sizeof(ggml_fp16_t) * n * rows);
        ggml_fp16_t * y = malloc(sizeof(ggml_fp16_t) * n * 16);
        float * out = malloc(sizeof(float) * rows * 16);
        for (int64_t i = 0; i < n * rows; ++i) x[i] = ggml_fp32_to_fp16(frand() * 0.05f);
        for (int64_t i = 0; i < n * 16; ++i) y[i] = ggml_fp32_to_fp16(frand());
        for (int b = 0; b < 4; ++b) {
            const int k = ks[b];
            struct ggml_tensor s0 = {0}, s1 = {0}, d = {0};
            s0.type = GGML_TYPE_F16; s0.ne[0] = n; s0.ne[1] = rows; s0.ne[2] = 1; s0.ne[3] = 1;
            s0.nb[0] = 2; s0.nb[1] = 2 * n; s0.nb[2] = 2 * n * rows; s0.nb[3] = s0.nb[2]; s0.data = x;
            s1.type = GGML_TYPE_F16; s1.ne[0] = n; s1.ne[1] = k; s1.ne[2] = 1; s1.ne[3] = 1;
            s1.nb[0] = 2; s1.nb[1] = 2 * n; s1.nb[2] = 2 * n * k; s1.nb[3] = s1.nb[2]; s1.data = y;
            d.type = GGML_TYPE_F32; d.ne[0] = rows; d.ne[1] = k; d.ne[2] = 1; d.ne[3] = 1;
            d.nb[0] = 4; d.nb[1] = 4 * rows; d.nb[2] = 4 * rows * k; d.nb[3] = d.nb[2]; d.data = out;
            d.src[0] = &s0; d.src[1] = &s1;
            double t[2][REPEATS];
            for (int rep = 0; rep < REPEATS; ++rep) {
                const double t0 = now_ns();
                for (int64_t r = 0; r < rows; r += 64) old_smallbatch_f16_chunk(&d, y, 2 * n, true, r, r + 64, 0, k);
                const double t1 = now_ns();
                for (int64_t r = 0; r < rows; r += 64) ggml_smallbatch_f16_chunk(&d, y, 2 * n, true, r, r + 64, 0, k);
                const double t2 = now_ns();
                const double units = (double) rows * k * n / 256;
                t[0][rep] = (t1 - t0) / units;
                t[1][rep] = (t2 - t1) / units;
            }
            qsort(t[0], REPEATS, sizeof(double), cmp_double);
            qsort(t[1], REPEATS, sizeof(double), cmp_double);
            printf("time F16 n=%d k=%d  old %6.2f new %6.2f (x%.2f)\n", n, k, t[0][0], t[1][0], t[0][0] / t[1][0]);
        }
        free(x); free(y); free(out);
    }
#endif
}

// The repacked-Q4_K kernel in calls of up to ggml_smallbatch_q4_K_call_rows's count (32 with the AMX
// kernel): every row against the gemv, 1-32 rows, and the time of calls of 12-32 rows against the old
// kernel's calls of up to 8.
static int q4_K_wide(int n, int nrows, const bench_q4_Kx8 * w4x8, ggml_smallbatch_gemm_t new4, ggml_smallbatch_gemm_t old4,
                     int check_only) {
    enum { WIDE = GGML_SMALLBATCH_AMX_MAX_COLS };
    const int nb = n / QK_K;
    if (ggml_smallbatch_q4_K_call_rows(WIDE) <= GGML_SMALLBATCH_MAX_COLS) {
        return 0;  // calls of up to 8 rows, checked above
    }
    block_q8_K * act = malloc(sizeof(block_q8_K) * nb * WIDE);
    float * f = malloc(sizeof(float) * n);
    const void * vy[WIDE];
    for (int c = 0; c < WIDE; ++c) {
        for (int i = 0; i < n; ++i) f[i] = frand();
        quantize_row_q8_K_ref(f, act + c * nb, n);
        vy[c] = act + c * nb;
    }
    float * ref = malloc(sizeof(float) * nrows * WIDE);
    float * out = malloc(sizeof(float) * nrows * WIDE);
    for (int c = 0; c < WIDE; ++c) {
        ggml_gemv_q4_K_8x8_q8_K(n, ref + c * nrows, nrows, w4x8, vy[c], 1, nrows);
    }
    int failures = 0;
    for (int nc = 1; nc <= WIDE; ++nc) {
        int bad = 0;
        for (int groups = nrows / 8; groups >= 3; groups = groups == 3 ? 0 : 3) {  // all rows, then three groups
            memset(out, 0xff, sizeof(float) * nrows * WIDE);
            new4(n, out, nrows, w4x8, vy, nc, groups * 8);
            for (int c = 0; c < nc; ++c)
                bad += memcmp(out + c * nrows, ref + c * nrows, sizeof(float) * groups * 8) != 0;
        }
        printf("check n=%d nc=%d (one call): Q4_Kx8 %s\n", n, nc, bad ? "DIFFERS" : "bit-identical");
        failures += bad;
    }
    if (!check_only) {
        static const int ncs[] = {12, 16, 17, 24, 32};
        for (int k = 0; k < 5; ++k) {
            const int nc = ncs[k];
            double t[2][REPEATS];
            for (int rep = 0; rep < REPEATS; ++rep) {
                double t0 = now_ns();
                for (int r0 = 0, m = 0; r0 < nc; r0 += m) {
                    m = ggml_smallbatch_call_rows(nc - r0);
                    old4(n, out + r0 * nrows, nrows, w4x8, vy + r0, m, nrows);
                }
                double t1 = now_ns();
                new4(n, out, nrows, w4x8, vy, nc, nrows);
                double t2 = now_ns();
                const double units = (double) nc * nb * (nrows / 8);
                t[0][rep] = (t1 - t0) / units;
                t[1][rep] = (t2 - t1) / units;
            }
            for (int j = 0; j < 2; ++j) qsort(t[j], REPEATS, sizeof(double), cmp_double);
            printf("time n=%d nc=%d (one call)  Q4_Kx8 old %6.2f new %6.2f (x%.2f)\n", n, nc, t[0][0], t[1][0], t[0][0] / t[1][0]);
        }
    }
    free(act); free(f); free(ref); free(out);
    return failures;
}

int main(int argc, char ** argv) {
    const int check_only = argc > 1 && strcmp(argv[1], "--check-only") == 0;
    int failures = 0;
    for (int i = 0; i < (1 << 16); ++i) {
        ggml_table_f32_f16[i] = ggml_fp16_to_fp32((ggml_fp16_t) i);
    }
    for (int i = 0; i < (1 << 8); ++i) {  // ggml_e8m0_to_fp32_half (ggml-impl.h), as ggml_cpu_init fills it
        const uint32_t bits = i < 2 ? 0x00200000u << i : (uint32_t) (i - 1) << 23;
        memcpy(&ggml_table_f32_e8m0_half[i], &bits, sizeof(float));
    }
    const int nc_max = GGML_SMALLBATCH_MAX_COLS;
    failures += check_quantize_q8_K(!check_only);
    failures += check_legacy(!check_only);
    failures += check_mxfp4(!check_only);

    for (int wi = 0; wi < WIDTHS; ++wi) {
        const int n = widths[wi];
        const int nb = n / QK_K;
        // weight rows: ~1-2 MB per matrix, about what one thread streams of a real layer; SB_NROWS (a
        // multiple of 8, at least 24) for others, e.g. 64 to time the kernels with the weights in L2
        const int nrows = getenv("SB_NROWS") ? atoi(getenv("SB_NROWS")) : (n == 1536 ? 1024 : 256);
        float * f = malloc(sizeof(float) * n);

        block_q8_K * act = malloc(sizeof(block_q8_K) * nb * nc_max);
        const void * vy[GGML_SMALLBATCH_MAX_COLS];
        for (int c = 0; c < nc_max; ++c) {
            for (int i = 0; i < n; ++i) f[i] = frand();
            quantize_row_q8_K_ref(f, act + c * nb, n);
            vy[c] = act + c * nb;
        }

        block_q6_K * w6 = malloc(sizeof(block_q6_K) * nb * nrows);
        block_q4_K * w4 = malloc(sizeof(block_q4_K) * nb * nrows);
        for (int r = 0; r < nrows; ++r) {
            for (int i = 0; i < n; ++i) f[i] = frand() * 0.02f;
            quantize_row_q6_K_ref(f, w6 + r * nb, n);
            for (int i = 0; i < n; ++i) f[i] = frand() * 0.02f;
            quantize_row_q4_K_ref(f, w4 + r * nb, n);
        }
        bench_q4_Kx8 * w4x8 = malloc(sizeof(bench_q4_Kx8) * nb * (nrows / 8));
        for (int g = 0; g < nrows / 8; ++g) {
            const block_q4_K * rows[8];
            for (int r = 0; r < 8; ++r) rows[r] = w4 + (g * 8 + r) * nb;
            pack_q4_Kx8(rows, w4x8 + g * nb, nb);
        }
        const size_t row6 = sizeof(block_q6_K) * nb;

        // reference results
        float * ref6 = malloc(sizeof(float) * nrows * nc_max);
        float * ref4 = malloc(sizeof(float) * nrows * nc_max);
        for (int c = 0; c < nc_max; ++c) {
            for (int r = 0; r < nrows; ++r) {
                ggml_vec_dot_q6_K_q8_K(n, ref6 + r * nc_max + c, 0, (const char *) w6 + r * row6, 0, vy[c], 0, 1);
            }
            ggml_gemv_q4_K_8x8_q8_K(n, ref4 + c * nrows, nrows, w4x8, vy[c], 1, nrows);
        }

        float * out = malloc(sizeof(float) * nrows * nc_max);
        const ggml_smallbatch_dot_t new6 = ggml_smallbatch_q6_K();
        const old_dot_t old6 = old_smallbatch_q6_K();
        const ggml_smallbatch_gemm_t new4 = ggml_smallbatch_q4_Kx8();
        const ggml_smallbatch_gemm_t old4 = old_smallbatch_q4_Kx8();

        for (int nc = 1; nc <= nc_max; ++nc) {
            // Q6_K, new kernel: every (weight row, activation row) against vec_dot
            int bad6 = 0, bad4 = 0;
            memset(out, 0xff, sizeof(float) * nrows * nc_max);
            for (int r = 0; r < nrows; r += GGML_SMALLBATCH_MAX_WROWS) {
                const int nw = nrows - r < GGML_SMALLBATCH_MAX_WROWS ? nrows - r : GGML_SMALLBATCH_MAX_WROWS;
                new6(n, out + r * nc_max, nc_max, (const char *) w6 + r * row6, row6, nw, vy, nc);
            }
            for (int r = 0; r < nrows; ++r)
                for (int c = 0; c < nc; ++c)
                    bad6 += memcmp(out + r * nc_max + c, ref6 + r * nc_max + c, sizeof(float)) != 0;
            // an odd number of weight rows too (the driver's tail)
            for (int nw = 1; nw <= GGML_SMALLBATCH_MAX_WROWS; ++nw) {
                memset(out, 0xff, sizeof(float) * nrows * nc_max);
                new6(n, out, nc_max, (const char *) w6 + 3 * row6, row6, nw, vy, nc);
                for (int w = 0; w < nw; ++w)
                    for (int c = 0; c < nc; ++c)
                        bad6 += memcmp(out + w * nc_max + c, ref6 + (3 + w) * nc_max + c, sizeof(float)) != 0;
            }
            memset(out, 0xff, sizeof(float) * nrows * nc_max);
            new4(n, out, nrows, w4x8, vy, nc, nrows);
            for (int c = 0; c < nc; ++c)
                bad4 += memcmp(out + c * nrows, ref4 + c * nrows, sizeof(float) * nrows) != 0;
            // fewer weight rows than the matrix holds: an odd number of groups of eight (three)
            memset(out, 0xff, sizeof(float) * nrows * nc_max);
            new4(n, out, nrows, w4x8, vy, nc, 24);
            for (int c = 0; c < nc; ++c)
                bad4 += memcmp(out + c * nrows, ref4 + c * nrows, sizeof(float) * 24) != 0;
            printf("check n=%d nc=%d: Q6_K %s, Q4_Kx8 %s\n", n, nc, bad6 ? "DIFFERS" : "bit-identical",
                   bad4 ? "DIFFERS" : "bit-identical");
            failures += bad6 + bad4;
        }

        failures += q6_K_prepared(n, nrows, w6, row6, vy, nc_max, ref6, new6, check_only);
        failures += q4_K_wide(n, nrows, w4x8, new4, old4, check_only);

        if (!check_only) {
            static const int ncs[] = {1, 2, 4, 8};
            const int nwt = getenv("SB_NW") ? atoi(getenv("SB_NW")) : GGML_SMALLBATCH_MAX_WROWS;
            for (int k = 0; k < 4; ++k) {
                const int nc = ncs[k];
                double t[4][REPEATS];
                for (int rep = 0; rep < REPEATS; ++rep) {
                    double t0 = now_ns();
                    for (int r = 0; r < nrows; r += nwt) {
                        OLD6_ROWS(n, out, nc_max, (const char *) w6 + r * row6, row6, nwt, vy, nc);
                    }
                    double t1 = now_ns();
                    for (int r = 0; r < nrows; r += nwt)
                        new6(n, out, nc_max, (const char *) w6 + r * row6, row6, nwt, vy, nc);
                    double t2 = now_ns();
                    old4(n, out, nrows, w4x8, vy, nc, nrows);
                    double t3 = now_ns();
                    new4(n, out, nrows, w4x8, vy, nc, nrows);
                    double t4 = now_ns();
                    const double units = (double) nc * nb;
                    t[0][rep] = (t1 - t0) / (units * nrows);
                    t[1][rep] = (t2 - t1) / (units * nrows);
                    t[2][rep] = (t3 - t2) / (units * (nrows / 8));
                    t[3][rep] = (t4 - t3) / (units * (nrows / 8));
                }
                for (int j = 0; j < 4; ++j) qsort(t[j], REPEATS, sizeof(double), cmp_double);
                // the fastest repeat: on a shared machine the others measure the neighbours as well
                printf("time n=%d nc=%d  Q6_K old %6.2f new %6.2f (x%.2f) | Q4_Kx8 old %6.2f new %6.2f (x%.2f)\n", n, nc,
                       t[0][0], t[1][0], t[0][0] / t[1][0], t[2][0], t[3][0], t[2][0] / t[3][0]);
            }
        }
        free(f); free(act); free(w6); free(w4); free(w4x8); free(ref6); free(ref4); free(out);
    }
    failures += check_f16();
    if (!check_only) {
        time_f16();
        time_peak();
    }
    printf(failures ? "FAILED: %d results differ\n" : "all results bit-identical (the prepared Q6_K kernel: within rounding)\n", failures);
    return failures != 0;
}
