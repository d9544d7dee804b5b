// The keyed recipe's normal rows (de_keyed.h) on every instruction set: in double, the same
// doubles as the scalar Ndtri loop (double tables); rounded to float, the floats of those doubles,
// from a faster evaluation checked against its error bound (float, float16, bfloat16 tables).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "de_keyed.h"
#include "de_simd.h"

namespace tfra_de {
namespace {

void KeyedNormalScalar(uint64_t seed, int64_t n, double a, double b, bool truncated, double* dst) {
  for (int64_t j = 0; j < n; ++j) {
    const double u = (static_cast<double>(WordAt(seed, static_cast<uint64_t>(j)) >> 11) + 0.5) * 0x1.0p-53;
    dst[j] = a + b * Ndtri(truncated ? kPhiLo + kPhiWidth * u : u);
  }
}

// One column of KeyedNormalScalar, rounded to float: what the checked paths below fall back to.
float KeyedNormalExactFloat(uint64_t seed, int64_t j, double a, double b, bool truncated) {
  const double u = (static_cast<double>(WordAt(seed, static_cast<uint64_t>(j)) >> 11) + 0.5) * 0x1.0p-53;
  return static_cast<float>(a + b * Ndtri(truncated ? kPhiLo + kPhiWidth * u : u));
}

void KeyedNormalRowsFloatScalar(const uint64_t* seeds, int64_t rows, int64_t n, double a, double b,
                                bool truncated, float* const* dst) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < n; ++j) dst[i][j] = KeyedNormalExactFloat(seeds[i], j, a, b, truncated);
  }
}

// The tail list of the vector paths: (row << 32) | (column << 1) | (u < 1/2) per tail column.
constexpr int kTailList = 1024;  // entries; drawn when a row's next chunk could overflow it
constexpr int kRowChunk = 256;   // columns of a row per central pass
inline int64_t TailEntry(int64_t row, int64_t col) { return (row << 32) | (col << 1); }
inline float* TailDst(float* const* dst, int64_t entry) {
  return dst[entry >> 32] + ((entry & 0xFFFFFFFF) >> 1);
}
inline float TailExact(const uint64_t* seeds, int64_t entry, double a, double b, bool truncated) {
  return KeyedNormalExactFloat(seeds[entry >> 32], (entry & 0xFFFFFFFF) >> 1, a, b, truncated);
}

// ---------------------------------------------------- checked float rows --
// A float row needs float(y) of the exact double y = a + b * Ndtri(v) only. The vector paths
// evaluate y' = a + b z' with z' from another approximation of the same inverse CDF (AS 241,
// below: fewer operations, and one logarithm in a tail where Ndtri takes two), fused
// multiply-adds, a vectorized logarithm, and reciprocals by Newton steps, so z' differs from
// Ndtri's z by a few units in the last place (docs/native_backend.md has the measured difference,
// 13 bits below the bound). With a bound E far above that, |y - y'| <= E, where
//   E = (|y'| + |a|) 2^-36     (b (z' - z), as |b z'| <= |y'| + |a|)
//     + |y'| 2^-50             (the roundings of a + b z on either side, and of y' +- E)
//     + |b| 2^-1000            (absolute slack where z is near 0).
// Float rounding is monotone, so float(y' - E) == float(y' + E) proves float(y) == that float
// (compared as bits: -0 and +0 differ). Columns where they differ -- about one in 2^11, more
// where |a| >> |b| -- are recomputed by KeyedNormalExactFloat. The rows are therefore the floats
// of the exact doubles on every path, whatever error below the bound the fast evaluation has.
constexpr double kFastRel = 0x1.0p-36;
constexpr double kRoundRel = 0x1.0p-50;
constexpr double kTinyAbs = 0x1.0p-1000;

// The part of E that does not depend on y'.
inline double BoundBase(double a, double b) { return std::fabs(a) * kFastRel + std::fabs(b) * kTinyAbs; }

// ln m = 2 atanh(s), s = (m - 1) / (m + 1): 2 s (1 + s^2 / 3 + ... + s^18 / 19), for m in
// [0.75, 1.5) (|s| <= 0.2: the first term left out is below 2^-51 of the sum). Highest first.
constexpr double kAtanhSeries[10] = {1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13, 1.0 / 11,
                                     1.0 / 9,  1.0 / 7,  1.0 / 5,  1.0 / 3,  1.0};
constexpr double kLn2 = 0x1.62e42fefa39efp-1;

// The fast evaluation's inverse normal CDF: Wichura's AS 241 (PPND16, as CPython's
// statistics.NormalDist.inv_cdf), relative error ~1e-16, rational functions of degree 7 in
// r = 0.180625 - q^2 where |q| = |u - 1/2| <= 0.425 (85% of draws, against 73% for Ndtri's
// central branch), else in r = sqrt(-ln min(u, 1 - u)) - 1.6 (r <= 5) or - 5: one logarithm
// in a tail where Ndtri takes two. Highest degree first; the denominators end in 1.
constexpr double kAs241Q = 0.425;
constexpr double kAs241A[8] = {2.5090809287301226727e+3, 3.3430575583588128105e+4, 6.7265770927008700853e+4,
                               4.5921953931549871457e+4, 1.3731693765509461125e+4, 1.9715909503065514427e+3,
                               1.3314166789178437745e+2, 3.3871328727963666080e+0};
constexpr double kAs241B[8] = {5.2264952788528545610e+3, 2.8729085735721942674e+4, 3.9307895800092710610e+4,
                               2.1213794301586595867e+4, 5.3941960214247511077e+3, 6.8718700749205790830e+2,
                               4.2313330701600911252e+1, 1.0};
constexpr double kAs241C[8] = {7.74545014278341407640e-4, 2.27238449892691845833e-2, 2.41780725177450611770e-1,
                               1.27045825245236838258e+0, 3.64784832476320460504e+0, 5.76949722146069140550e+0,
                               4.63033784615654529590e+0, 1.42343711074968357734e+0};
constexpr double kAs241D[8] = {1.05075007164441684324e-9, 5.47593808499534494600e-4, 1.51986665636164571966e-2,
                               1.48103976427480074590e-1, 6.89767334985100004550e-1, 1.67638483018380384940e+0,
                               2.05319162663775882187e+0, 1.0};
constexpr double kAs241E[8] = {2.01033439929228813265e-7, 2.71155556874348757815e-5, 1.24266094738807843860e-3,
                               2.65321895265761230930e-2, 2.96560571828504891230e-1, 1.78482653991729133580e+0,
                               5.46378491116411436990e+0, 6.65790464350110377720e+0};
constexpr double kAs241F[8] = {2.04426310338993978564e-15, 1.42151175831644588870e-7, 1.84631831751005468180e-5,
                               7.86869131145613259100e-4, 1.48753612908506148525e-2, 1.36929880922735805310e-1,
                               5.99832206555887937690e-1, 1.0};

#ifdef TFRA_DE_X86_SIMD
// -------------------------------------------------------------------- AVX2 --
// NdtriTail (de_keyed.h) of n values, with the same operations: the two logarithms by the
// same libm call, the rest four lanes at a time. b and r may be the same array; both are
// padded to a multiple of 8.
TFRA_AVX2 void NdtriTailsAvx2(int n, const double* b, double* x, double* lx, double* r) {
  const int padded = (n + 7) & ~7;
  for (int t = 0; t < n; ++t) lx[t] = std::log(b[t]);
  for (int t = n; t < padded; ++t) lx[t] = -1.0;  // padding: any valid input
  for (int t = 0; t < padded; t += 4) {
    _mm256_store_pd(x + t, _mm256_sqrt_pd(_mm256_mul_pd(_mm256_set1_pd(-2.0), _mm256_load_pd(lx + t))));
  }
  for (int t = 0; t < n; ++t) lx[t] = std::log(x[t]);
  for (int t = 0; t < padded; t += 8) {
    __m256d xs[2], zs[2], p[2], q[2];
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v) {
      xs[v] = _mm256_load_pd(x + t + 4 * v);
      zs[v] = _mm256_div_pd(_mm256_set1_pd(1.0), xs[v]);
    }
    PolevlAvx2<8, 2>(zs, kNdtriP1, p);
    PolevlAvx2<8, 2>(zs, kNdtriQ1, q);
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v) {
      __m256d ratio = _mm256_div_pd(p[v], q[v]);
      const __m256d far = _mm256_cmp_pd(xs[v], _mm256_set1_pd(8.0), _CMP_GE_OQ);
      if (_mm256_movemask_pd(far) != 0) {  // b < exp(-32): all but never
        __m256d p2, q2;
        PolevlAvx2<8, 1>(&zs[v], kNdtriP2, &p2);
        PolevlAvx2<8, 1>(&zs[v], kNdtriQ2, &q2);
        ratio = _mm256_blendv_pd(ratio, _mm256_div_pd(p2, q2), far);
      }
      const __m256d x0 = _mm256_sub_pd(xs[v], _mm256_div_pd(_mm256_load_pd(lx + t + 4 * v), xs[v]));
      _mm256_store_pd(r + t + 4 * v, _mm256_sub_pd(x0, _mm256_mul_pd(zs[v], ratio)));
    }
  }
}

// Sixteen columns (four vectors) per iteration. Every column first gets Ndtri's central
// branch (73% of draws take it); the columns in a tail are listed without a branch and
// redone together after the pass. (A branch per vector on "any lane in a tail", taken 72%
// of the time at random, and one dependent chain at a time left the core mostly waiting.)
TFRA_AVX2 void KeyedNormalAvx2(uint64_t seed, int64_t n, double a, double b, bool truncated,
                               double* dst) {
  constexpr int kVec = 4, kBlock = 4 * kVec;
  constexpr int kChunk = 256;  // columns per pass, so the tails' buffers stay on the stack
  const __m256i step = _mm256_set1_epi64x(static_cast<int64_t>(4 * kGamma));
  __m256i state = _mm256_add_epi64(
      _mm256_set1_epi64x(static_cast<int64_t>(seed)),
      _mm256_set_epi64x(static_cast<int64_t>(4 * kGamma), static_cast<int64_t>(3 * kGamma),
                        static_cast<int64_t>(2 * kGamma), static_cast<int64_t>(kGamma)));
  const __m256d one = _mm256_set1_pd(1.0), half = _mm256_set1_pd(0.5);
  const __m256d va = _mm256_set1_pd(a), vb = _mm256_set1_pd(b);
  alignas(32) double lane_b[kChunk], tail_b[kChunk + 8], tail_x[kChunk + 8], tail_l[kChunk + 8];
  alignas(32) double out[4];
  int32_t tail_at[kChunk + 4];  // 2 * column + flip
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int m = static_cast<int>(std::min<int64_t>(kChunk, n - c0));
    int tails = 0;
    for (int j = 0; j < m; j += kBlock) {
      __m256d bb[kVec], c2[kVec], p[kVec], q[kVec], cs[kVec];
      int center[kVec], flips[kVec];
#pragma GCC unroll 4
      for (int v = 0; v < kVec; ++v) {
        __m256d u = _mm256_mul_pd(
            _mm256_add_pd(U53ToDoubleAvx2(_mm256_srli_epi64(MixAvx2(state), 11)), half),
            _mm256_set1_pd(0x1.0p-53));
        state = _mm256_add_epi64(state, step);
        if (truncated) u = _mm256_add_pd(_mm256_set1_pd(kPhiLo), _mm256_mul_pd(_mm256_set1_pd(kPhiWidth), u));
        // As Ndtri: flip = u <= 1 - exp(-2); bb = flip ? u : 1 - u; central where exp(-2) < bb.
        const __m256d flip = _mm256_cmp_pd(u, _mm256_set1_pd(1.0 - kExpNegTwo), _CMP_LE_OQ);
        bb[v] = _mm256_blendv_pd(_mm256_sub_pd(one, u), u, flip);
        center[v] = _mm256_movemask_pd(_mm256_cmp_pd(_mm256_set1_pd(kExpNegTwo), bb[v], _CMP_LT_OQ));
        flips[v] = _mm256_movemask_pd(flip);
        _mm256_store_pd(lane_b + j + 4 * v, bb[v]);
        cs[v] = _mm256_sub_pd(bb[v], half);
        c2[v] = _mm256_mul_pd(cs[v], cs[v]);
      }
      PolevlAvx2<4, kVec>(c2, kNdtriP0, p);
      PolevlAvx2<8, kVec>(c2, kNdtriQ0, q);
#pragma GCC unroll 4
      for (int v = 0; v < kVec; ++v) {
        const __m256d ratio = _mm256_div_pd(p[v], q[v]);
        const __m256d z = _mm256_mul_pd(
            _mm256_add_pd(_mm256_mul_pd(cs[v], _mm256_mul_pd(c2[v], ratio)), cs[v]), _mm256_set1_pd(kSqrt2Pi));
        const __m256d row = _mm256_add_pd(va, _mm256_mul_pd(vb, z));
        const int lanes = std::max(0, std::min(4, m - j - 4 * v));
        if (lanes == 4) {
          _mm256_storeu_pd(dst + c0 + j + 4 * v, row);
        } else if (lanes > 0) {
          _mm256_store_pd(out, row);
          std::memcpy(dst + c0 + j + 4 * v, out, static_cast<size_t>(lanes) * sizeof(double));
        }
        const int in_tail = ~center[v] & ((1 << lanes) - 1);
        for (int k = 0; k < 4; ++k) {
          tail_at[tails] = 2 * (j + 4 * v + k) + ((flips[v] >> k) & 1);
          tails += (in_tail >> k) & 1;
        }
      }
    }
    for (int t = 0; t < tails; ++t) tail_b[t] = lane_b[tail_at[t] >> 1];
    NdtriTailsAvx2(tails, tail_b, tail_x, tail_l, tail_b);
    for (int t = 0; t < tails; ++t) {
      const double r = tail_b[t];
      dst[c0 + (tail_at[t] >> 1)] = a + b * ((tail_at[t] & 1) ? -r : r);
    }
  }
}

// Polevl<N> with fused multiply-adds, on K vectors at once (the checked float rows only).
template <int N, int K>
TFRA_AVX2 inline void PolevlFmaAvx2(const __m256d* x, const double* c, __m256d* r) {
#pragma GCC unroll 4
  for (int v = 0; v < K; ++v) r[v] = _mm256_set1_pd(c[0]);
#pragma GCC unroll 16
  for (int i = 1; i <= N; ++i) {
    const __m256d ci = _mm256_set1_pd(c[i]);
#pragma GCC unroll 4
    for (int v = 0; v < K; ++v) r[v] = _mm256_fmadd_pd(r[v], x[v], ci);
  }
}

// 1 / d (d within float's range) from float's reciprocal estimate (2^-12) and three Newton
// steps.
TFRA_AVX2 inline __m256d RecipAvx2(__m256d d) {
  const __m256d one = _mm256_set1_pd(1.0);
  __m256d r = _mm256_cvtps_pd(_mm_rcp_ps(_mm256_cvtpd_ps(d)));
  for (int i = 0; i < 3; ++i) r = _mm256_fmadd_pd(r, _mm256_fnmadd_pd(d, r, one), r);
  return r;
}

// 1 / sqrt(t) (t within float's range): float's estimate and three Newton steps y (3 - t y^2) / 2.
TFRA_AVX2 inline __m256d RsqrtAvx2(__m256d t) {
  const __m256d half_t = _mm256_mul_pd(_mm256_set1_pd(0.5), t), three_halves = _mm256_set1_pd(1.5);
  __m256d y = _mm256_cvtps_pd(_mm_rsqrt_ps(_mm256_cvtpd_ps(t)));
  for (int i = 0; i < 3; ++i) y = _mm256_mul_pd(y, _mm256_fnmadd_pd(half_t, _mm256_mul_pd(y, y), three_halves));
  return y;
}

// ln x of positive normal doubles (see kAtanhSeries): x = m 2^e from the bits.
TFRA_AVX2 inline __m256d LogAvx2(__m256d x) {
  const __m256i bits = _mm256_castpd_si256(x);
  const __m256i magic = _mm256_set1_epi64x(0x4330000000000000LL);  // 2^52 as a double's bits
  __m256d e = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(_mm256_srli_epi64(bits, 52), magic)),
                            _mm256_set1_pd(0x1.0p52 + 1023.0));
  __m256d m = _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x(0x000FFFFFFFFFFFFFLL)),
                                                  _mm256_set1_epi64x(0x3FF0000000000000LL)));  // [1, 2)
  const __m256d big = _mm256_cmp_pd(m, _mm256_set1_pd(1.5), _CMP_GE_OQ);
  m = _mm256_blendv_pd(m, _mm256_mul_pd(m, _mm256_set1_pd(0.5)), big);
  e = _mm256_add_pd(e, _mm256_and_pd(big, _mm256_set1_pd(1.0)));
  const __m256d one = _mm256_set1_pd(1.0);
  const __m256d s = _mm256_mul_pd(_mm256_sub_pd(m, one), RecipAvx2(_mm256_add_pd(m, one)));
  const __m256d s2 = _mm256_mul_pd(s, s);
  __m256d p = _mm256_set1_pd(kAtanhSeries[0]);
  for (int i = 1; i < 10; ++i) p = _mm256_fmadd_pd(p, s2, _mm256_set1_pd(kAtanhSeries[i]));
  return _mm256_fmadd_pd(e, _mm256_set1_pd(kLn2), _mm256_mul_pd(_mm256_add_pd(s, s), p));
}

// |z| of four tail values p = min(u, 1 - u) < 0.075 (AS 241's tail).
TFRA_AVX2 inline __m256d TailAvx2(__m256d p) {
  const __m256d s = _mm256_sub_pd(_mm256_setzero_pd(), LogAvx2(p));  // in (2.59, 37.5]
  const __m256d r = _mm256_mul_pd(s, RsqrtAvx2(s));                  // sqrt(s)
  __m256d r1 = _mm256_sub_pd(r, _mm256_set1_pd(1.6)), num, den;
  PolevlFmaAvx2<7, 1>(&r1, kAs241C, &num);
  PolevlFmaAvx2<7, 1>(&r1, kAs241D, &den);
  __m256d z = _mm256_mul_pd(num, RecipAvx2(den));
  const __m256d far = _mm256_cmp_pd(r, _mm256_set1_pd(5.0), _CMP_GT_OQ);
  if (_mm256_movemask_pd(far) != 0) {  // p < exp(-25): all but never
    __m256d r2 = _mm256_sub_pd(r, _mm256_set1_pd(5.0));
    PolevlFmaAvx2<7, 1>(&r2, kAs241E, &num);
    PolevlFmaAvx2<7, 1>(&r2, kAs241F, &den);
    z = _mm256_blendv_pd(z, _mm256_div_pd(num, den), far);
  }
  return z;
}

// float(y) of four lanes into *f; returns the lanes (bits) where float(y) may differ from the
// float of the exact y (see kFastRel).
TFRA_AVX2 inline int RoundAvx2(__m256d y, __m256d base, __m128* f) {
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFLL));
  const __m256d e = _mm256_fmadd_pd(_mm256_and_pd(y, abs_mask), _mm256_set1_pd(kFastRel + kRoundRel), base);
  const __m128 lo = _mm256_cvtpd_ps(_mm256_sub_pd(y, e)), hi = _mm256_cvtpd_ps(_mm256_add_pd(y, e));
  *f = lo;
  return ~_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(_mm_castps_si128(lo), _mm_castps_si128(hi)))) & 0xF;
}

// The listed tail columns' rows (see KeyedNormalRowsFloatAvx2); p holds their min(u, 1 - u),
// padded to a multiple of 16.
TFRA_AVX2 void TailPassAvx2(int tails, double* p, const int64_t* at, const uint64_t* seeds, double a,
                            double b, bool truncated, float* const* dst) {
  const __m256d va = _mm256_set1_pd(a), vb = _mm256_set1_pd(b), base = _mm256_set1_pd(BoundBase(a, b));
  for (int t = tails; t < ((tails + 15) & ~15); ++t) p[t] = 0.01;  // padding: any tail value
  alignas(32) double z[16];
  alignas(16) float out[4];
  for (int t = 0; t < tails; t += 16) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {  // four independent chains, which the core overlaps
      _mm256_store_pd(z + 4 * v, TailAvx2(_mm256_load_pd(p + t + 4 * v)));
    }
    const int count = std::min(16, tails - t);
    for (int k = 0; k < count; ++k) {
      if (at[t + k] & 1) z[k] = -z[k];
    }
    for (int v = 0; 4 * v < count; ++v) {
      __m128 f;
      const int unsure = RoundAvx2(_mm256_fmadd_pd(vb, _mm256_load_pd(z + 4 * v), va), base, &f);
      _mm_store_ps(out, f);
      const int lanes = std::min(4, count - 4 * v);
      for (int k = 0; k < lanes; ++k) *TailDst(dst, at[t + 4 * v + k]) = out[k];
      for (int bits = unsure & ((1 << lanes) - 1); bits != 0; bits &= bits - 1) {  // rare
        const int64_t entry = at[t + 4 * v + __builtin_ctz(bits)];
        *TailDst(dst, entry) = TailExact(seeds, entry, a, b, truncated);
      }
    }
  }
}

// KeyedNormalAvx2's rows rounded to float, checked (see kFastRel): AS 241's central branch for
// every column; the tail columns of many rows listed and drawn together (a row of 64 columns
// has ~10, too few to keep the vector units busy on the tail's long chain of dependent steps);
// the unsure columns exactly.
TFRA_AVX2 void KeyedNormalRowsFloatAvx2(const uint64_t* seeds, int64_t rows, int64_t n, double a,
                                        double b, bool truncated, float* const* dst) {
  constexpr int kVec = 4, kBlock = 4 * kVec;
  const __m256i step = _mm256_set1_epi64x(static_cast<int64_t>(4 * kGamma));
  const __m256d one = _mm256_set1_pd(1.0), half = _mm256_set1_pd(0.5);
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFLL));
  const __m256d va = _mm256_set1_pd(a), vb = _mm256_set1_pd(b);
  const __m256d base = _mm256_set1_pd(BoundBase(a, b));
  alignas(32) double lane_p[kRowChunk], tail_p[kTailList + 16];
  alignas(16) float out[4];
  int64_t tail_at[kTailList + 4];
  int tails = 0;
  for (int64_t row = 0; row < rows; ++row) {
    float* row_dst = dst[row];
    __m256i state = _mm256_add_epi64(
        _mm256_set1_epi64x(static_cast<int64_t>(seeds[row])),
        _mm256_set_epi64x(static_cast<int64_t>(4 * kGamma), static_cast<int64_t>(3 * kGamma),
                          static_cast<int64_t>(2 * kGamma), static_cast<int64_t>(kGamma)));
    for (int64_t c0 = 0; c0 < n; c0 += kRowChunk) {
      const int m = static_cast<int>(std::min<int64_t>(kRowChunk, n - c0));
      if (tails + m > kTailList) {
        TailPassAvx2(tails, tail_p, tail_at, seeds, a, b, truncated, dst);
        tails = 0;
      }
      const int first = tails;
      for (int j = 0; j < m; j += kBlock) {
        __m256d qs[kVec], rs[kVec], num[kVec], den[kVec];
        int center[kVec], low[kVec];
#pragma GCC unroll 4
        for (int v = 0; v < kVec; ++v) {
          __m256d u = _mm256_mul_pd(
              _mm256_add_pd(U53ToDoubleAvx2(_mm256_srli_epi64(MixAvx2(state), 11)), half),
              _mm256_set1_pd(0x1.0p-53));
          state = _mm256_add_epi64(state, step);
          if (truncated) u = _mm256_add_pd(_mm256_set1_pd(kPhiLo), _mm256_mul_pd(_mm256_set1_pd(kPhiWidth), u));
          qs[v] = _mm256_sub_pd(u, half);
          rs[v] = _mm256_fnmadd_pd(qs[v], qs[v], _mm256_set1_pd(kAs241Q * kAs241Q));
          center[v] = _mm256_movemask_pd(
              _mm256_cmp_pd(_mm256_and_pd(qs[v], abs_mask), _mm256_set1_pd(kAs241Q), _CMP_LE_OQ));
          low[v] = _mm256_movemask_pd(qs[v]);  // the sign bits
          _mm256_store_pd(lane_p + j + 4 * v, _mm256_min_pd(u, _mm256_sub_pd(one, u)));
        }
        PolevlFmaAvx2<7, kVec>(rs, kAs241A, num);
        PolevlFmaAvx2<7, kVec>(rs, kAs241B, den);
#pragma GCC unroll 4
        for (int v = 0; v < kVec; ++v) {
          const __m256d z = _mm256_mul_pd(_mm256_mul_pd(qs[v], num[v]), RecipAvx2(den[v]));
          __m128 f;
          const int unsure = RoundAvx2(_mm256_fmadd_pd(vb, z, va), base, &f);
          const int col = j + 4 * v;
          const int lanes = std::max(0, std::min(4, m - col));
          if (lanes == 4) {
            _mm_storeu_ps(row_dst + c0 + col, f);
          } else if (lanes > 0) {
            _mm_store_ps(out, f);
            std::memcpy(row_dst + c0 + col, out, static_cast<size_t>(lanes) * sizeof(float));
          }
          const int live = (1 << lanes) - 1;
          const int in_tail = ~center[v] & live;
          for (int k = 0; k < 4; ++k) {  // no branch: a lane is in a tail at random
            tail_at[tails] = TailEntry(row, c0 + col + k) + ((low[v] >> k) & 1);
            tails += (in_tail >> k) & 1;
          }
          for (int bits = unsure & center[v] & live; bits != 0; bits &= bits - 1) {  // rare
            const int64_t c = c0 + col + __builtin_ctz(bits);
            row_dst[c] = KeyedNormalExactFloat(seeds[row], c, a, b, truncated);
          }
        }
      }
      for (int t = first; t < tails; ++t) tail_p[t] = lane_p[((tail_at[t] & 0xFFFFFFFF) >> 1) - c0];
    }
  }
  TailPassAvx2(tails, tail_p, tail_at, seeds, a, b, truncated, dst);
}

// ----------------------------------------------------------------- AVX-512 --
// As KeyedNormalAvx2, eight lanes a vector: 32 columns (four vectors) per iteration, the
// columns in a tail compressed into a list and redone together after the pass.
TFRA_AVX512 void KeyedNormalAvx512(uint64_t seed, int64_t n, double a, double b, bool truncated,
                                   double* dst) {
  constexpr int kVec = 4, kBlock = 8 * kVec;
  constexpr int kChunk = 256;  // columns per pass, so the tails' buffers stay on the stack
  const __m512i step = _mm512_set1_epi64(static_cast<int64_t>(8 * kGamma));
  __m512i state = _mm512_add_epi64(_mm512_set1_epi64(static_cast<int64_t>(seed)),
                                   _mm512_mullo_epi64(_mm512_set_epi64(8, 7, 6, 5, 4, 3, 2, 1),
                                                      _mm512_set1_epi64(static_cast<int64_t>(kGamma))));
  const __m512d one = _mm512_set1_pd(1.0), half = _mm512_set1_pd(0.5);
  const __m512d va = _mm512_set1_pd(a), vb = _mm512_set1_pd(b);
  const __m512i lane2 = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0);  // 2 * lane
  alignas(64) double tail_b[kChunk + 8], tail_x[kChunk + 8], tail_l[kChunk + 8];
  alignas(64) int64_t tail_at[kChunk + 8];  // 2 * column + flip
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int m = static_cast<int>(std::min<int64_t>(kChunk, n - c0));
    int tails = 0;
    for (int j = 0; j < m; j += kBlock) {
      __m512d bb[kVec], c2[kVec], p[kVec], q[kVec], cs[kVec];
      __mmask8 center[kVec], flips[kVec];
#pragma GCC unroll 4
      for (int v = 0; v < kVec; ++v) {
        __m512d u = _mm512_mul_pd(
            _mm512_add_pd(_mm512_cvtepu64_pd(_mm512_srli_epi64(MixAvx512(state), 11)), half),
            _mm512_set1_pd(0x1.0p-53));
        state = _mm512_add_epi64(state, step);
        if (truncated) u = _mm512_add_pd(_mm512_set1_pd(kPhiLo), _mm512_mul_pd(_mm512_set1_pd(kPhiWidth), u));
        // As Ndtri: flip = u <= 1 - exp(-2); bb = flip ? u : 1 - u; central where exp(-2) < bb.
        flips[v] = _mm512_cmp_pd_mask(u, _mm512_set1_pd(1.0 - kExpNegTwo), _CMP_LE_OQ);
        bb[v] = _mm512_mask_blend_pd(flips[v], _mm512_sub_pd(one, u), u);
        center[v] = _mm512_cmp_pd_mask(_mm512_set1_pd(kExpNegTwo), bb[v], _CMP_LT_OQ);
        cs[v] = _mm512_sub_pd(bb[v], half);
        c2[v] = _mm512_mul_pd(cs[v], cs[v]);
      }
      PolevlAvx512<4, kVec>(c2, kNdtriP0, p);
      PolevlAvx512<8, kVec>(c2, kNdtriQ0, q);
#pragma GCC unroll 4
      for (int v = 0; v < kVec; ++v) {
        const __m512d ratio = _mm512_div_pd(p[v], q[v]);
        const __m512d z = _mm512_mul_pd(
            _mm512_add_pd(_mm512_mul_pd(cs[v], _mm512_mul_pd(c2[v], ratio)), cs[v]), _mm512_set1_pd(kSqrt2Pi));
        const int col = j + 8 * v;
        const int lanes = std::max(0, std::min(8, m - col));
        const __mmask8 live = static_cast<__mmask8>((1u << lanes) - 1);
        _mm512_mask_storeu_pd(dst + c0 + col, live, _mm512_add_pd(va, _mm512_mul_pd(vb, z)));
        const __mmask8 in_tail = static_cast<__mmask8>(~center[v] & live);
        const __m512i twice = _mm512_add_epi64(_mm512_set1_epi64(2 * col), lane2);
        const __m512i at = _mm512_mask_add_epi64(twice, flips[v], twice, _mm512_set1_epi64(1));
        _mm512_storeu_si512(tail_at + tails, _mm512_maskz_compress_epi64(in_tail, at));
        _mm512_storeu_pd(tail_b + tails, _mm512_maskz_compress_pd(in_tail, bb[v]));
        tails += __builtin_popcount(in_tail);
      }
    }
    NdtriTailsAvx2(tails, tail_b, tail_x, tail_l, tail_b);
    for (int t = 0; t < tails; ++t) {
      const double r = tail_b[t];
      dst[c0 + (tail_at[t] >> 1)] = a + b * ((tail_at[t] & 1) ? -r : r);
    }
  }
}

// Polevl<N> with fused multiply-adds, on K vectors at once (the checked float rows only).
template <int N, int K>
TFRA_AVX512 inline void PolevlFmaAvx512(const __m512d* x, const double* c, __m512d* r) {
#pragma GCC unroll 4
  for (int v = 0; v < K; ++v) r[v] = _mm512_set1_pd(c[0]);
#pragma GCC unroll 16
  for (int i = 1; i <= N; ++i) {
    const __m512d ci = _mm512_set1_pd(c[i]);
#pragma GCC unroll 4
    for (int v = 0; v < K; ++v) r[v] = _mm512_fmadd_pd(r[v], x[v], ci);
  }
}

// As RecipAvx2, from the 2^-14 estimate: two steps.
TFRA_AVX512 inline __m512d RecipAvx512(__m512d d) {
  const __m512d one = _mm512_set1_pd(1.0);
  __m512d r = _mm512_rcp14_pd(d);
  for (int i = 0; i < 2; ++i) r = _mm512_fmadd_pd(r, _mm512_fnmadd_pd(d, r, one), r);
  return r;
}

TFRA_AVX512 inline __m512d RsqrtAvx512(__m512d t) {  // as RsqrtAvx2, from the 2^-14 estimate
  const __m512d half_t = _mm512_mul_pd(_mm512_set1_pd(0.5), t), three_halves = _mm512_set1_pd(1.5);
  __m512d y = _mm512_rsqrt14_pd(t);
  for (int i = 0; i < 2; ++i) y = _mm512_mul_pd(y, _mm512_fnmadd_pd(half_t, _mm512_mul_pd(y, y), three_halves));
  return y;
}

// As LogAvx2: m in [0.75, 1.5) and e by getexp / scalef.
TFRA_AVX512 inline __m512d LogAvx512(__m512d x) {
  const __m512d e = _mm512_getexp_pd(_mm512_mul_pd(x, _mm512_set1_pd(4.0 / 3.0)));
  const __m512d m = _mm512_scalef_pd(x, _mm512_sub_pd(_mm512_setzero_pd(), e));
  const __m512d one = _mm512_set1_pd(1.0);
  const __m512d s = _mm512_mul_pd(_mm512_sub_pd(m, one), RecipAvx512(_mm512_add_pd(m, one)));
  const __m512d s2 = _mm512_mul_pd(s, s);
  __m512d p = _mm512_set1_pd(kAtanhSeries[0]);
  for (int i = 1; i < 10; ++i) p = _mm512_fmadd_pd(p, s2, _mm512_set1_pd(kAtanhSeries[i]));
  return _mm512_fmadd_pd(e, _mm512_set1_pd(kLn2), _mm512_mul_pd(_mm512_add_pd(s, s), p));
}

TFRA_AVX512 inline __m512d TailAvx512(__m512d p) {  // as TailAvx2
  const __m512d s = _mm512_sub_pd(_mm512_setzero_pd(), LogAvx512(p));
  const __m512d r = _mm512_mul_pd(s, RsqrtAvx512(s));
  __m512d r1 = _mm512_sub_pd(r, _mm512_set1_pd(1.6)), num, den;
  PolevlFmaAvx512<7, 1>(&r1, kAs241C, &num);
  PolevlFmaAvx512<7, 1>(&r1, kAs241D, &den);
  __m512d z = _mm512_mul_pd(num, RecipAvx512(den));
  const __mmask8 far = _mm512_cmp_pd_mask(r, _mm512_set1_pd(5.0), _CMP_GT_OQ);
  if (far != 0) {  // p < exp(-25): all but never
    __m512d r2 = _mm512_sub_pd(r, _mm512_set1_pd(5.0));
    PolevlFmaAvx512<7, 1>(&r2, kAs241E, &num);
    PolevlFmaAvx512<7, 1>(&r2, kAs241F, &den);
    z = _mm512_mask_div_pd(z, far, num, den);
  }
  return z;
}

TFRA_AVX512 inline __mmask8 RoundAvx512(__m512d y, __m512d base, __m256* f) {  // as RoundAvx2
  const __m512d e = _mm512_fmadd_pd(_mm512_abs_pd(y), _mm512_set1_pd(kFastRel + kRoundRel), base);
  const __m256 lo = _mm512_cvtpd_ps(_mm512_sub_pd(y, e)), hi = _mm512_cvtpd_ps(_mm512_add_pd(y, e));
  *f = lo;
  return _mm256_cmpneq_epi32_mask(_mm256_castps_si256(lo), _mm256_castps_si256(hi));
}

TFRA_AVX512 void TailPassAvx512(int tails, double* p, const int64_t* at, const uint64_t* seeds, double a,
                                double b, bool truncated, float* const* dst) {  // as TailPassAvx2
  const __m512d va = _mm512_set1_pd(a), vb = _mm512_set1_pd(b), base = _mm512_set1_pd(BoundBase(a, b));
  for (int t = tails; t < ((tails + 31) & ~31); ++t) p[t] = 0.01;  // padding: any tail value
  __m512d z[4];
  alignas(32) float out[8];
  for (int t = 0; t < tails; t += 32) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) z[v] = TailAvx512(_mm512_load_pd(p + t + 8 * v));
    for (int v = 0; v < 4 && t + 8 * v < tails; ++v) {
      const int64_t* entries = at + t + 8 * v;
      const __mmask8 low = _mm512_test_epi64_mask(_mm512_loadu_si512(entries), _mm512_set1_epi64(1));
      __m256 f;
      const __mmask8 unsure =
          RoundAvx512(_mm512_fmadd_pd(vb, _mm512_mask_sub_pd(z[v], low, _mm512_setzero_pd(), z[v]), va), base, &f);
      _mm256_store_ps(out, f);
      const int lanes = std::min(8, tails - t - 8 * v);
      for (int k = 0; k < lanes; ++k) *TailDst(dst, entries[k]) = out[k];
      for (unsigned bits = unsure & ((1u << lanes) - 1); bits != 0; bits &= bits - 1) {  // rare
        const int64_t entry = entries[__builtin_ctz(bits)];
        *TailDst(dst, entry) = TailExact(seeds, entry, a, b, truncated);
      }
    }
  }
}

// As KeyedNormalRowsFloatAvx2, eight lanes a vector, the tail columns compressed into the list.
TFRA_AVX512 void KeyedNormalRowsFloatAvx512(const uint64_t* seeds, int64_t rows, int64_t n, double a,
                                            double b, bool truncated, float* const* dst) {
  constexpr int kVec = 4, kBlock = 8 * kVec;
  const __m512i step = _mm512_set1_epi64(static_cast<int64_t>(8 * kGamma));
  const __m512d one = _mm512_set1_pd(1.0), half = _mm512_set1_pd(0.5);
  const __m512d va = _mm512_set1_pd(a), vb = _mm512_set1_pd(b);
  const __m512d base = _mm512_set1_pd(BoundBase(a, b));
  const __m512i lane2 = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0);  // 2 * lane
  alignas(64) double tail_p[kTailList + 32];
  alignas(64) int64_t tail_at[kTailList + 8];
  int tails = 0;
  for (int64_t row = 0; row < rows; ++row) {
    float* row_dst = dst[row];
    __m512i state = _mm512_add_epi64(_mm512_set1_epi64(static_cast<int64_t>(seeds[row])),
                                     _mm512_mullo_epi64(_mm512_set_epi64(8, 7, 6, 5, 4, 3, 2, 1),
                                                        _mm512_set1_epi64(static_cast<int64_t>(kGamma))));
    for (int64_t c0 = 0; c0 < n; c0 += kRowChunk) {
      const int m = static_cast<int>(std::min<int64_t>(kRowChunk, n - c0));
      if (tails + m > kTailList) {
        TailPassAvx512(tails, tail_p, tail_at, seeds, a, b, truncated, dst);
        tails = 0;
      }
      for (int j = 0; j < m; j += kBlock) {
        __m512d us[kVec], qs[kVec], rs[kVec], num[kVec], den[kVec];
        __mmask8 center[kVec];
#pragma GCC unroll 4
        for (int v = 0; v < kVec; ++v) {
          __m512d u = _mm512_mul_pd(
              _mm512_add_pd(_mm512_cvtepu64_pd(_mm512_srli_epi64(MixAvx512(state), 11)), half),
              _mm512_set1_pd(0x1.0p-53));
          state = _mm512_add_epi64(state, step);
          if (truncated) u = _mm512_add_pd(_mm512_set1_pd(kPhiLo), _mm512_mul_pd(_mm512_set1_pd(kPhiWidth), u));
          us[v] = u;
          qs[v] = _mm512_sub_pd(u, half);
          rs[v] = _mm512_fnmadd_pd(qs[v], qs[v], _mm512_set1_pd(kAs241Q * kAs241Q));
          center[v] = _mm512_cmp_pd_mask(_mm512_abs_pd(qs[v]), _mm512_set1_pd(kAs241Q), _CMP_LE_OQ);
        }
        PolevlFmaAvx512<7, kVec>(rs, kAs241A, num);
        PolevlFmaAvx512<7, kVec>(rs, kAs241B, den);
#pragma GCC unroll 4
        for (int v = 0; v < kVec; ++v) {
          const __m512d z = _mm512_mul_pd(_mm512_mul_pd(qs[v], num[v]), RecipAvx512(den[v]));
          __m256 f;
          const __mmask8 unsure = RoundAvx512(_mm512_fmadd_pd(vb, z, va), base, &f);
          const int col = j + 8 * v;
          const int lanes = std::max(0, std::min(8, m - col));
          const __mmask8 live = static_cast<__mmask8>((1u << lanes) - 1);
          _mm256_mask_storeu_ps(row_dst + c0 + col, live, f);
          // No branch: three vectors in four have a lane in a tail, at random.
          const __mmask8 in_tail = static_cast<__mmask8>(~center[v] & live);
          const __mmask8 low = _mm512_movepi64_mask(_mm512_castpd_si512(qs[v]));  // the sign bits
          const __m512i entry = _mm512_add_epi64(_mm512_set1_epi64(TailEntry(row, c0 + col)), lane2);
          const __m512i at = _mm512_mask_add_epi64(entry, low, entry, _mm512_set1_epi64(1));
          const __m512d p = _mm512_min_pd(us[v], _mm512_sub_pd(one, us[v]));
          _mm512_storeu_si512(tail_at + tails, _mm512_maskz_compress_epi64(in_tail, at));
          _mm512_storeu_pd(tail_p + tails, _mm512_maskz_compress_pd(in_tail, p));
          tails += __builtin_popcount(in_tail);
          for (unsigned bits = unsure & center[v] & live; bits != 0; bits &= bits - 1) {  // rare
            const int64_t c = c0 + col + __builtin_ctz(bits);
            row_dst[c] = KeyedNormalExactFloat(seeds[row], c, a, b, truncated);
          }
        }
      }
    }
  }
  TailPassAvx512(tails, tail_p, tail_at, seeds, a, b, truncated, dst);
}
#endif  // TFRA_DE_X86_SIMD

}  // namespace

void KeyedNormalRow(uint64_t seed, int64_t n, double a, double b, bool truncated, double* dst) {
  using Fn = void (*)(uint64_t, int64_t, double, double, bool, double*);
  static const Fn fn = [] {
#ifdef TFRA_DE_X86_SIMD
    if (DrawIsaLevel() == Isa::kAvx512) return static_cast<Fn>(KeyedNormalAvx512);
    if (DrawIsaLevel() == Isa::kAvx2) return static_cast<Fn>(KeyedNormalAvx2);
#endif
    return static_cast<Fn>(KeyedNormalScalar);
  }();
  fn(seed, n, a, b, truncated, dst);
}

void KeyedNormalRowsFloat(const uint64_t* seeds, int64_t rows, int64_t n, double a, double b,
                          bool truncated, float* const* dst) {
  using Fn = void (*)(const uint64_t*, int64_t, int64_t, double, double, bool, float* const*);
  static const Fn fn = [] {
#ifdef TFRA_DE_X86_SIMD
    if (DrawIsaLevel() == Isa::kAvx512) return static_cast<Fn>(KeyedNormalRowsFloatAvx512);
    if (DrawIsaLevel() == Isa::kAvx2) return static_cast<Fn>(KeyedNormalRowsFloatAvx2);
#endif
    return static_cast<Fn>(KeyedNormalRowsFloatScalar);
  }();
  // The vector paths' tail list holds a row and a column in 31 bits each (tables' dim is at
  // most 2^24; anything larger takes the scalar path, whose rows are the same).
  if (rows >= (int64_t{1} << 31) || n >= (int64_t{1} << 30)) {
    return KeyedNormalRowsFloatScalar(seeds, rows, n, a, b, truncated, dst);
  }
  fn(seeds, rows, n, a, b, truncated, dst);
}

}  // namespace tfra_de
