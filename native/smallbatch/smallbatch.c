// The small-batch driver: groups activation rows (columns of dst) that share one weight matrix
// and runs the type's kernel over each weight row once per group (see smallbatch.h).
#include "smallbatch.h"

#include "ggml-impl.h"

#include <math.h>
#include <stdlib.h>

bool ggml_smallbatch_enabled(void) {
    static int enabled = -1;
    if (enabled < 0) {
        const char * env = getenv("GGML_CPU_SMALLBATCH");
        enabled = env == NULL || atoi(env) != 0;
    }
    return enabled != 0;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
// The CPU's family if it is an AMD one (0x19: Zen 3 and Zen 4, 0x1a: Zen 5), else 0
static inline unsigned sb_amd_family(void) {
    static int family = -1;
    if (family < 0) {
        unsigned a, b, c, d;
        family = 0;
        if (__get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163 &&  // "AuthenticAMD"
            __get_cpuid(1, &a, &b, &c, &d)) {
            family = (int) (((a >> 8) & 0xf) == 0xf ? 0xf + ((a >> 20) & 0xff) : (a >> 8) & 0xf);
        }
    }
    return (unsigned) family;
}
#else
static inline unsigned sb_amd_family(void) {
    return 0;
}
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// CPUID leaf 7's EDX (bit 24 AMX-TILE, bit 25 AMX-INT8), 0 where the leaf is missing
static inline unsigned sb_cpuid7_edx(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) ? d : 0;
}
#else
static inline unsigned sb_cpuid7_edx(void) {
    return 0;
}
#endif
// Whether the CPU reports AMX-INT8: Intel's Sapphire Rapids and later Xeons, whose cores have two 512-bit
// FMA units
static inline int sb_cpu_amx_int8(void) {
    return (sb_cpuid7_edx() & (1u << 25)) != 0;
}

// The 512-bit forms on AMD family 19h with AVX-512 (Zen 4) and later, and on Intel CPUs with AMX. Zen 5
// runs 512-bit vpdpbusd at full width (twice the multiply-adds per cycle of 256-bit ones); Zen 4 splits
// each in two halves, yet the 512-bit forms are faster there too from 8 rows on, having fewer instructions
// of other kinds (no regrouping shuffles, a sub-block's scale by one dpwssd): the real 1.5B's passes over
// 16 rows 0.90-0.93x, 2-4 rows alike (docs/kernels.md). On a Sapphire Rapids-class Xeon (AMX) its passes
// over 2-16 rows took 0.90-0.97x the time with them, and single rows 0.97x. Other Intel AVX-512 CPUs
// (Skylake-SP to Ice Lake, some with one 512-bit FMA unit a core) are unmeasured and keep the 256-bit
// forms. A family 19h CPU without AVX-512 (Zen 3) runs a module without them.
bool ggml_smallbatch_512(void) {
#ifdef GGML_SMALLBATCH_HAS_512
    static int wide = -1;
    if (wide < 0) {
        const char * env = getenv("GGML_SMALLBATCH_512");
        wide = env != NULL && *env != '\0' ? atoi(env) != 0 : sb_amd_family() >= 0x19 || sb_cpu_amx_int8();
    }
    return wide != 0;
#else
    return false;  // this build has only the 256-bit forms
#endif
}

// Intel AMX (tile registers, TDPBSSD): where the build has the 512-bit forms (the AMX kernels use them
// beside the tiles), the CPU has AMX-TILE and AMX-INT8, the OS keeps the tile state (XCR0 bits 17-18) and
// grants this process the tile data (Linux's ARCH_REQ_XCOMP_PERM, needed once per process before the first
// tile instruction). GGML_SMALLBATCH_AMX=0 turns the AMX kernels off (for comparisons). Read once.
#if defined(GGML_SMALLBATCH_HAS_512) && defined(__linux__) && defined(__x86_64__) && defined(__GNUC__)
#include <sys/syscall.h>
#include <unistd.h>
static int sb_amx_usable(void) {
    if (!(sb_cpuid7_edx() & (1u << 24)) || !sb_cpu_amx_int8()) {
        return 0;  // no AMX-TILE or no AMX-INT8
    }
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) {
        return 0;  // no OSXSAVE: xgetbv would fault
    }
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) {
        return 0;  // the OS does not save the tile state
    }
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}
#else
static int sb_amx_usable(void) {
    return 0;
}
#endif

bool ggml_smallbatch_amx(void) {
    static int amx = -1;
    if (amx < 0) {
        const char * env = getenv("GGML_SMALLBATCH_AMX");
        amx = (env == NULL || *env == '\0' || atoi(env) != 0) && sb_amx_usable();
    }
    return amx != 0;
}

// Prefetching the weight stream into L2 only: on AMD Zen 4 (family 19h with AVX-512) the kernels' passes
// over 2-8 rows of the real 1.5B took 0.75-0.89x the time with prefetcht1 that they took with prefetcht0
// (docs/kernels.md); there a prefetcht0 seems to hold one of the core's few L1 miss buffers until its line
// arrives, where the L2's queue is deeper. Elsewhere (Zen 3, Zen 5, Intel) the prefetcht0 measured before
// stays until measured. GGML_SMALLBATCH_PREFETCH_L2=0 or 1 decides instead, for comparisons.
int ggml_smallbatch_prefetch_l2 = 0;

__attribute__((constructor)) static void sb_prefetch_level(void) {
    const char * env = getenv("GGML_SMALLBATCH_PREFETCH_L2");
#ifdef GGML_SMALLBATCH_HAS_512
    const int zen4 = sb_amd_family() == 0x19;  // family 19h with this build's AVX-512: Zen 4, not Zen 3
#else
    const int zen4 = 0;
#endif
    ggml_smallbatch_prefetch_l2 = env != NULL && *env != '\0' ? atoi(env) != 0 : zen4;
}

// rows of the first of the fewest calls of up to `max` rows that take `left` rows, as even as can be
static int sb_even_call_rows(int64_t left, int64_t max) {
    const int64_t calls = (left + max - 1) / max;
    return (int) ((left + calls - 1) / calls);
}

int ggml_smallbatch_call_rows(int64_t left) {
    return sb_even_call_rows(left, GGML_SMALLBATCH_MAX_COLS);
}

int ggml_smallbatch_q4_K_call_rows(int64_t left) {
    return sb_even_call_rows(left, ggml_smallbatch_amx() ? GGML_SMALLBATCH_AMX_MAX_COLS : GGML_SMALLBATCH_MAX_COLS);
}

ggml_smallbatch_dot_t ggml_smallbatch_kernel(enum ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q6_K: return ggml_smallbatch_q6_K();
        case GGML_TYPE_Q8_0: return ggml_smallbatch_q8_0();
        case GGML_TYPE_Q4_0: return ggml_smallbatch_q4_0();
        case GGML_TYPE_Q5_0: return ggml_smallbatch_q5_0();
        case GGML_TYPE_Q4_1: return ggml_smallbatch_q4_1();
        default:             return NULL;
    }
}

// Whether the kernel for `type` takes a single activation row too (plain decoding, and every step that
// drafts nothing). A single-row pass streams the weights once and is bound by memory where ggml's own
// kernel keeps up with it:
// * The legacy quants' kernels do the per-row arithmetic with the weights loaded once for several rows;
//   for one row they save nothing and measured 3-7% slower than vec_dot in cache (native/smallbatch/bench).
// * Repacked Q4_K: the kernel took one row on AMD Zen 3 (AVX2 without VNNI: T(1) 0.85x of ggml's gemv,
//   docs/kernels.md) but was slower than the gemv on Zen 4 (AVX-512 VNNI, 256-bit forms: T(1) 1.03-1.08x,
//   though faster in cache, in either width). It takes one row where the build has no VNNI and on
//   Zen 5 (as measured there before this rule), and leaves it to ggml's gemv otherwise.
// * Q6_K: through the kernel everywhere (Zen 4 0.94-1.03x of vec_dot, within noise).
// * Repacked MXFP4: through the kernel (1.4x the gemv in cache; T(1) of an MXFP4 1.5B about 0.92x the
//   gemv's on Zen 4, two runs with the roles swapped).
bool ggml_smallbatch_takes_one_row(enum ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q5_0:
        case GGML_TYPE_Q4_1:
        case GGML_TYPE_F16:  // one row: vec_dot_f16 itself (the kernel's results, and no faster)
            return false;
        case GGML_TYPE_Q4_K:
#ifdef GGML_SMALLBATCH_HAS_VNNI
            return sb_amd_family() >= 0x1a;
#else
            return true;
#endif
        default:
            return true;
    }
}

bool ggml_smallbatch_claims(const struct ggml_tensor * dst) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];
    if (src0->extra != NULL || src1->ne[1] > GGML_SMALLBATCH_MAX_BATCH || !ggml_smallbatch_enabled()) {
        return false;
    }
    if (src0->type == GGML_TYPE_F16) {  // broadcast over dims 2-3 too: grouped-query attention
        return src1->ne[1] > 1 && ggml_smallbatch_has_f16();
    }
    return (src1->ne[1] > 1 || ggml_smallbatch_takes_one_row(src0->type)) &&
           src1->ne[2] == 1 && src1->ne[3] == 1 && ggml_smallbatch_kernel(src0->type) != NULL;
}

static __thread const struct ggml_tensor * sb_kq_dst = NULL;  // the mat-mul this thread's count is for
static __thread int64_t                     sb_kq_visible = 0;

void ggml_smallbatch_node_begin(const struct ggml_tensor * node, const struct ggml_tensor * next) {
    sb_kq_dst = NULL;
    if (node->op != GGML_OP_MUL_MAT || node->src[0]->type != GGML_TYPE_F16 || next == NULL ||
        next->op != GGML_OP_SOFT_MAX || next->src[0] != node || next->src[1] == NULL || !ggml_smallbatch_claims(node)) {
        return;
    }
    // the mask must be a graph input (its data set before the graph runs): a mask computed by a node of the
    // graph could come after this one in the graph's order, and its data would not be there yet
    const struct ggml_tensor * mask = next->src[1];
    if (mask->op != GGML_OP_NONE || (mask->type != GGML_TYPE_F32 && mask->type != GGML_TYPE_F16) ||
        mask->ne[0] < node->ne[0]) {
        return;
    }
    // softmax row (i1, i2, i3) of node adds mask row (i1, i2 % ne[2], i3 % ne[3]): every mask row that any
    // of node's rows uses is among these, and a cell is visible where any of them is not -inf
    const int64_t ncells = node->ne[0];
    const int64_t nrows  = node->ne[1] < mask->ne[1] ? node->ne[1] : mask->ne[1];
    int64_t visible = 0;
    for (int64_t i3 = 0; i3 < mask->ne[3] && visible < ncells; ++i3) {
        for (int64_t i2 = 0; i2 < mask->ne[2] && visible < ncells; ++i2) {
            for (int64_t i1 = 0; i1 < nrows && visible < ncells; ++i1) {
                const char * row = (const char *) mask->data + i1 * mask->nb[1] + i2 * mask->nb[2] + i3 * mask->nb[3];
                for (int64_t j = ncells; j > visible; --j) {
                    const float m = mask->type == GGML_TYPE_F32 ? ((const float *) row)[j - 1]
                                                                : GGML_FP16_TO_FP32(((const ggml_fp16_t *) row)[j - 1]);
                    if (!(isinf(m) && m < 0)) {
                        visible = j;
                        break;
                    }
                }
            }
        }
    }
    sb_kq_dst     = node;
    sb_kq_visible = visible;
}

int64_t ggml_smallbatch_kq_cells(const struct ggml_tensor * dst) {
    return dst == sb_kq_dst ? sb_kq_visible : dst->ne[0];
}

int64_t ggml_smallbatch_columns(const struct ggml_tensor * dst, const void * wdata, size_t row_size, bool src1_packed,
                                int64_t c0, int64_t c_end, int max, const void ** y, float ** d, const char ** src0_mat) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];

    GGML_TENSOR_BINARY_OP_LOCALS

    // broadcast factors
    const int64_t r2 = ne12 / ne02;
    const int64_t r3 = ne13 / ne03;

    int     nc  = 0;
    int64_t i02 = 0;
    int64_t i03 = 0;
    int64_t c   = c0;
    for (; c < c_end && nc < max; ++c) {
        const int64_t i13 = c / (ne12 * ne1);
        const int64_t i12 = (c - i13 * ne12 * ne1) / ne1;
        const int64_t i11 = c - i13 * ne12 * ne1 - i12 * ne1;
        if (nc > 0 && (i12 / r2 != i02 || i13 / r3 != i03)) {
            break;
        }
        i02 = i12 / r2;
        i03 = i13 / r3;
        y[nc] = (const char *) wdata + (src1_packed ? (size_t) (i11 + i12 * ne11 + i13 * ne12 * ne11) * row_size
                                                    : (size_t) (i11 * nb11 + i12 * nb12 + i13 * nb13));
        d[nc] = (float *) ((char *) dst->data + i11 * nb1 + i12 * nb2 + i13 * nb3);
        nc++;
    }
    *src0_mat = (const char *) src0->data + i02 * nb02 + i03 * nb03;
    return c;
}

// Activation rows from which a Q8_0, Q4_0 or Q5_0 call takes prepared rows: in cache 1.13-1.22x at 4-8 rows,
// but a Q8_0 1.5B's passes over 4 rows (4-row calls, bound by reading the weights) took 1.05-1.11x the time
// with them on Zen 4; from 5 rows 0.93-1.03x (docs/kernels.md)
#define SB_PREPARED_MIN 5

bool ggml_smallbatch_mul_mat_chunk(const struct ggml_tensor * dst, const void * wdata, size_t row_size,
                                   bool src1_packed, int64_t ir0_start, int64_t ir0_end,
                                   int64_t ir1_start, int64_t ir1_end) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];

    if (ir1_end <= ir1_start || !ggml_smallbatch_enabled() || (src1->ne[1] == 1 && !ggml_smallbatch_takes_one_row(src0->type))) {
        return false;
    }
    if (src0->type == GGML_TYPE_F16) {
        return ggml_smallbatch_f16_chunk(dst, wdata, row_size, src1_packed, ir0_start, ir0_end, ir1_start, ir1_end);
    }
    const ggml_smallbatch_dot_t dot = ggml_smallbatch_kernel(src0->type);
    if (dot == NULL) {
        return false;
    }

    const int64_t ne00 = src0->ne[0];
    const size_t  nb01 = src0->nb[1];

    const void * y[GGML_SMALLBATCH_MAX_COLS];
    float *      d[GGML_SMALLBATCH_MAX_COLS];
    float        s[GGML_SMALLBATCH_MAX_WROWS * GGML_SMALLBATCH_MAX_COLS];

    // The activation rows prepared once per call for the chunk's weight rows, in a buffer per thread (grown
    // as needed, kept for the next call): Q8_0, Q4_0 and Q5_0 from SB_PREPARED_MIN rows, Q6_K from one row
    // (every row, so that a batch's rows equal the rows decoded alone)
    const bool q6_K = src0->type == GGML_TYPE_Q6_K;
    const ggml_smallbatch_dot_t prepared = q6_K ? ggml_smallbatch_q6_K_prepared() : ggml_smallbatch_prepared_kernel(src0->type);
    const int prepared_min = q6_K ? 1 : SB_PREPARED_MIN;
    static __thread char * pbuf = NULL;
    static __thread size_t pcap = 0;
    const size_t prow = prepared == NULL ? 0 : q6_K ? ggml_smallbatch_q8_K_prepared_size((int) ne00)
                                                    : ggml_smallbatch_q8_0_prepared_size((int) ne00);
    const void * yp[GGML_SMALLBATCH_MAX_COLS];

    for (int64_t c0 = ir1_start; c0 < ir1_end;) {
        const char *  src0_mat;
        const int64_t c  = ggml_smallbatch_columns(dst, wdata, row_size, src1_packed, c0, ir1_end,
                                                   ggml_smallbatch_call_rows(ir1_end - c0), y, d, &src0_mat);
        const int     nc = (int) (c - c0);
        ggml_smallbatch_dot_t call = dot;
        const void ** rows = y;
        if (prepared != NULL && nc >= prepared_min) {
            if (pcap < GGML_SMALLBATCH_MAX_COLS * prow) {
                char * grown = NULL;
                if (posix_memalign((void **) &grown, 64, GGML_SMALLBATCH_MAX_COLS * prow) != 0) {
                    GGML_ABORT("small-batch kernels: out of memory for %zu bytes", GGML_SMALLBATCH_MAX_COLS * prow);
                }
                free(pbuf);
                pbuf = grown;
                pcap = GGML_SMALLBATCH_MAX_COLS * prow;
            }
            for (int j = 0; j < nc; ++j) {
                (q6_K ? ggml_smallbatch_q8_K_prepare : ggml_smallbatch_q8_0_prepare)((int) ne00, y[j], pbuf + j * prow);
                yp[j] = pbuf + j * prow;
            }
            call = prepared;
            rows = yp;
        }
        // up to MAX_WROWS weight rows a call: a kernel may share activation loads between them (the
        // Q6_K one runs them one after another: sharing spilled registers and was slower on Zen 4)
        for (int64_t ir0 = ir0_start; ir0 < ir0_end; ir0 += GGML_SMALLBATCH_MAX_WROWS) {
            const int nw = (int) MIN(GGML_SMALLBATCH_MAX_WROWS, ir0_end - ir0);
            call((int) ne00, s, GGML_SMALLBATCH_MAX_COLS, src0_mat + ir0 * nb01, nb01, nw, rows, nc);
            for (int w = 0; w < nw; ++w) {
                for (int j = 0; j < nc; ++j) {
                    d[j][ir0 + w] = s[w * GGML_SMALLBATCH_MAX_COLS + j];
                }
            }
        }
        c0 = c;
    }
    return true;
}
