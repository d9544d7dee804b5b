// Vectorized normal and uniform rows (de_draw.h). All three paths evaluate the same float
// operations in the same order, which is what makes them agree bit for bit. The
// library is built with -ffp-contract=off, so the compiler fuses nothing; the
// normal rows' fused multiply-adds are written out (std::fma in the scalar path),
// and the vector paths need FMA3 (every AVX2 machine but a few early ones has it).
#include "de_draw.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "de_simd.h"
#include "de_util.h"

namespace tfra_de {
namespace {

// -2 ln 2 = hi + lo, hi exact in float (ln 2's split, doubled: exact).
constexpr float kM2Ln2Hi = -2.0f * 0.693145751953125f;
constexpr float kM2Ln2Lo = -2.0f * 1.42860682030941723212e-6f;
constexpr float kSqrt2 = 1.41421356f;
constexpr float kQuarterTurn = 0x1.0p-24f * 1.57079632679489661923f;  // angle per 2^-24 quarter turn
constexpr float kHalfStep = 0.5f * kQuarterTurn;                      // angle of the step's middle
// -2 ln f = -4 atanh(t), t = (f - 1) / (f + 1): t * (L0 + t^2 (L1 + t^2 (L2 + ...)))
constexpr float kL[5] = {-4.0f, -4.0f / 3, -4.0f / 5, -4.0f / 7, -4.0f / 9};
// Taylor coefficients of sin(x) / x and cos(x) in x^2, on [0, pi/2].
constexpr float kS[6] = {1.0f, -1.66666667e-1f, 8.33333333e-3f, -1.98412698e-4f, 2.75573192e-6f,
                         -2.50521084e-8f};
constexpr float kC[7] = {1.0f, -0.5f, 4.16666667e-2f, -1.38888889e-3f, 2.48015873e-5f,
                         -2.75573192e-7f, 2.08767570e-9f};

inline float FloatOf(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint32_t BitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// ------------------------------------------------------------------ scalar --

// Horner's rule with fused steps: k[0] + x (k[1] + x (...)), as the vector paths.
inline float PolyScalar(float x, const float* k, int len) {
  float p = k[len - 1];
  for (int i = len - 2; i >= 0; --i) p = std::fma(x, p, k[i]);
  return p;
}

// The reference: block `b` of the row (columns 16b..16b+15) into out[0..15],
// written as lane loops so that compilers may vectorize it for the machine.
void BlockScalar(uint64_t seed, int64_t b, float mean, float stddev, float* out) {
  uint32_t lo[8], hi[8];
  for (int k = 0; k < 8; ++k) {
    const uint64_t w = WordAt(seed, static_cast<uint64_t>(8 * b + k));
    lo[k] = static_cast<uint32_t>(w);
    hi[k] = static_cast<uint32_t>(w >> 32);
  }
  float r[8];
  for (int k = 0; k < 8; ++k) {
    // u1 = (m + 1) 2^-24 = 2^e f with f in [sqrt(1/2), sqrt(2)]: f from the bits of the
    // float m + 1 (exact), e from its exponent less 24.
    const uint32_t bits = BitsOf(static_cast<float>(static_cast<int32_t>((lo[k] >> 8) + 1)));
    int32_t e = static_cast<int32_t>(bits >> 23) - (127 + 24);
    float f = FloatOf((bits & 0x7FFFFF) | 0x3F800000);
    const bool big = f > kSqrt2;
    f = big ? f * 0.5f : f;
    e = big ? e + 1 : e;
    const float t = (f - 1.0f) / (f + 1.0f);
    const float m2lnf = t * PolyScalar(t * t, kL, 5);
    const float ef = static_cast<float>(e);
    r[k] = std::sqrt(std::fma(ef, kM2Ln2Hi, std::fma(ef, kM2Ln2Lo, m2lnf))) * stddev;
  }
  for (int k = 0; k < 8; ++k) {  // theta: quadrant q from the top two bits, the angle from the next 24
    const uint32_t q = hi[k] >> 30;
    const float x = std::fma(static_cast<float>(static_cast<int32_t>((hi[k] >> 6) & 0xFFFFFF)),
                             kQuarterTurn, kHalfStep);
    const float x2 = x * x;
    const float sn = x * PolyScalar(x2, kS, 6);
    const float cs = PolyScalar(x2, kC, 7);
    // Rotate (cs, sn) by q quarter turns: swap when q is odd, then flip signs.
    const float cq = FloatOf(BitsOf((q & 1) ? sn : cs) ^ (((q ^ (q >> 1)) & 1) << 31));
    const float sq = FloatOf(BitsOf((q & 1) ? cs : sn) ^ ((q >> 1) << 31));
    out[k] = std::fma(r[k], cq, mean);
    out[k + 8] = std::fma(r[k], sq, mean);
  }
}

void RowScalar(uint64_t seed, int64_t n, float mean, float stddev, float* dst) {
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    if (j0 + 16 <= n) {
      BlockScalar(seed, j0 / 16, mean, stddev, dst + j0);
    } else {
      float tail[16];
      BlockScalar(seed, j0 / 16, mean, stddev, tail);
      std::memcpy(dst + j0, tail, static_cast<size_t>(n - j0) * sizeof(float));
    }
  }
}

void UniformScalar(uint64_t seed, int64_t n, double a, double width, float* dst) {
  for (int64_t j = 0; j < n; ++j) {
    const double u = (static_cast<double>(WordAt(seed, static_cast<uint64_t>(j)) >> 11) + 0.5) * 0x1.0p-53;
    dst[j] = static_cast<float>(a + width * u);
  }
}

// Lists the columns j < m with |x[j]| > 2 into at[], returns how many.
int ListBeyondTwoScalar(const float* x, int m, int32_t* at) {
  int count = 0;
  for (int j = 0; j < m; ++j) {
    at[count] = j;
    count += std::fabs(x[j]) > 2.0f;
  }
  return count;
}

#ifdef TFRA_DE_X86_SIMD
// -------------------------------------------------------------------- AVX2 --
TFRA_AVX2 inline __m256 PolyAvx2(__m256 x, const float* k, int len) {  // as PolyScalar
  __m256 p = _mm256_set1_ps(k[len - 1]);
  for (int i = len - 2; i >= 0; --i) p = _mm256_fmadd_ps(x, p, _mm256_set1_ps(k[i]));
  return p;
}

// K blocks from column j0 (K x 16 columns; those past n are not stored), each stage done
// for all K before the next: a block is a chain of dependent steps too long for the core
// to overlap with the next block's on its own.
template <int K>
TFRA_AVX2 __attribute__((always_inline)) inline void BlocksAvx2(__m256i& state, int64_t j0, int64_t n, float mean, float stddev,
                                 float* dst) {
  const __m256i step = _mm256_set1_epi64x(static_cast<int64_t>(4 * kGamma));
  const __m256 one = _mm256_set1_ps(1.0f), vmean = _mm256_set1_ps(mean), vstd = _mm256_set1_ps(stddev);
  const __m256i split = _mm256_set_epi32(7, 5, 3, 1, 6, 4, 2, 0);
  __m256i lo[K], hi[K];
  for (int k = 0; k < K; ++k) {
    const __m256i w0 = MixAvx2(state);
    state = _mm256_add_epi64(state, step);
    const __m256i w1 = MixAvx2(state);
    state = _mm256_add_epi64(state, step);
    const __m256i p0 = _mm256_permutevar8x32_epi32(w0, split), p1 = _mm256_permutevar8x32_epi32(w1, split);
    lo[k] = _mm256_permute2x128_si256(p0, p1, 0x20);  // words' low halves, in order
    hi[k] = _mm256_permute2x128_si256(p0, p1, 0x31);
  }
  __m256 r[K];
  for (int k = 0; k < K; ++k) {
    const __m256 v = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_srli_epi32(lo[k], 8), _mm256_set1_epi32(1)));
    const __m256i bits = _mm256_castps_si256(v);
    __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(127 + 24));
    __m256 f = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFF)),
                                                   _mm256_set1_epi32(0x3F800000)));
    const __m256 big = _mm256_cmp_ps(f, _mm256_set1_ps(kSqrt2), _CMP_GT_OQ);
    f = _mm256_blendv_ps(f, _mm256_mul_ps(f, _mm256_set1_ps(0.5f)), big);
    e = _mm256_sub_epi32(e, _mm256_castps_si256(big));  // big lanes are all ones: -1
    const __m256 t = _mm256_div_ps(_mm256_sub_ps(f, one), _mm256_add_ps(f, one));
    const __m256 m2lnf = _mm256_mul_ps(t, PolyAvx2(_mm256_mul_ps(t, t), kL, 5));
    const __m256 ef = _mm256_cvtepi32_ps(e);
    const __m256 m2ln = _mm256_fmadd_ps(ef, _mm256_set1_ps(kM2Ln2Hi),
                                        _mm256_fmadd_ps(ef, _mm256_set1_ps(kM2Ln2Lo), m2lnf));
    r[k] = _mm256_mul_ps(_mm256_sqrt_ps(m2ln), vstd);
  }
  for (int k = 0; k < K; ++k) {
    const __m256 x = _mm256_fmadd_ps(
        _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(hi[k], 6), _mm256_set1_epi32(0xFFFFFF))),
        _mm256_set1_ps(kQuarterTurn), _mm256_set1_ps(kHalfStep));
    const __m256 x2 = _mm256_mul_ps(x, x);
    const __m256 sn = _mm256_mul_ps(x, PolyAvx2(x2, kS, 6));
    const __m256 cs = PolyAvx2(x2, kC, 7);
    const __m256i q = _mm256_srli_epi32(hi[k], 30);
    const __m256 odd = _mm256_castsi256_ps(_mm256_slli_epi32(q, 31));  // blendv reads the sign bit
    __m256 cq = _mm256_blendv_ps(cs, sn, odd), sq = _mm256_blendv_ps(sn, cs, odd);
    cq = _mm256_xor_ps(cq, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_xor_si256(q, _mm256_srli_epi32(q, 1)), 31)));
    sq = _mm256_xor_ps(sq, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(q, 1), 31)));
    const __m256 oc = _mm256_fmadd_ps(r[k], cq, vmean);
    const __m256 os = _mm256_fmadd_ps(r[k], sq, vmean);
    const int64_t b0 = j0 + 16 * k;
    if (b0 + 16 <= n) {
      _mm256_storeu_ps(dst + b0, oc);
      _mm256_storeu_ps(dst + b0 + 8, os);
    } else if (b0 < n) {
      alignas(32) float tail[16];
      _mm256_store_ps(tail, oc);
      _mm256_store_ps(tail + 8, os);
      std::memcpy(dst + b0, tail, static_cast<size_t>(n - b0) * sizeof(float));
    }
  }
}

template <int K>
TFRA_AVX2 void RowBlocksAvx2(uint64_t seed, int64_t n, float mean, float stddev, float* dst) {
  __m256i state = _mm256_add_epi64(
      _mm256_set1_epi64x(static_cast<int64_t>(seed)),
      _mm256_set_epi64x(static_cast<int64_t>(4 * kGamma), static_cast<int64_t>(3 * kGamma),
                        static_cast<int64_t>(2 * kGamma), static_cast<int64_t>(kGamma)));
  for (int64_t j0 = 0; j0 < n; j0 += 16 * K) BlocksAvx2<K>(state, j0, n, mean, stddev, dst);
}

// Up to four blocks a step: as many as the row has, four for rows of more.
TFRA_AVX2 void RowAvx2(uint64_t seed, int64_t n, float mean, float stddev, float* dst) {
  switch (std::min<int64_t>(4, (n + 15) / 16)) {
    case 1: return RowBlocksAvx2<1>(seed, n, mean, stddev, dst);
    case 2: return RowBlocksAvx2<2>(seed, n, mean, stddev, dst);
    case 3: return RowBlocksAvx2<3>(seed, n, mean, stddev, dst);
    default: return RowBlocksAvx2<4>(seed, n, mean, stddev, dst);
  }
}

TFRA_AVX2 void UniformAvx2(uint64_t seed, int64_t n, double a, double width, float* dst) {
  const __m256i step = _mm256_set1_epi64x(static_cast<int64_t>(4 * kGamma));
  __m256i state = _mm256_add_epi64(
      _mm256_set1_epi64x(static_cast<int64_t>(seed)),
      _mm256_set_epi64x(static_cast<int64_t>(4 * kGamma), static_cast<int64_t>(3 * kGamma),
                        static_cast<int64_t>(2 * kGamma), static_cast<int64_t>(kGamma)));
  const __m256d va = _mm256_set1_pd(a), vw = _mm256_set1_pd(width);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const __m256d u = _mm256_mul_pd(
        _mm256_add_pd(U53ToDoubleAvx2(_mm256_srli_epi64(MixAvx2(state), 11)), _mm256_set1_pd(0.5)),
        _mm256_set1_pd(0x1.0p-53));
    state = _mm256_add_epi64(state, step);
    _mm_storeu_ps(dst + j, _mm256_cvtpd_ps(_mm256_add_pd(va, _mm256_mul_pd(vw, u))));
  }
  for (; j < n; ++j) {
    const double u = (static_cast<double>(WordAt(seed, static_cast<uint64_t>(j)) >> 11) + 0.5) * 0x1.0p-53;
    dst[j] = static_cast<float>(a + width * u);
  }
}

// As ListBeyondTwoScalar: eight columns a compare into one bit mask per 64 columns, then its
// set bits (a branch per column, or per eight, was mispredicted at each of the ~5% beyond two,
// and cost more than the row's draws).
TFRA_AVX2 int ListBeyondTwoAvx2(const float* x, int m, int32_t* at) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 two = _mm256_set1_ps(2.0f);
  int count = 0;
  for (int j0 = 0; j0 < m; j0 += 64) {
    const int end = std::min(m, j0 + 64);
    uint64_t bits = 0;
    int j = j0;
    for (; j + 8 <= end; j += 8) {
      bits |= static_cast<uint64_t>(static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(
                  _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask), two, _CMP_GT_OQ))))
              << (j - j0);
    }
    for (; j < end; ++j) bits |= static_cast<uint64_t>(std::fabs(x[j]) > 2.0f) << (j - j0);
    for (; bits != 0; bits &= bits - 1) at[count++] = j0 + __builtin_ctzll(bits);
  }
  return count;
}

// ----------------------------------------------------------------- AVX-512 --
TFRA_AVX512 inline __m512 PolyAvx512(__m512 x, const float* k, int len) {  // as PolyScalar
  __m512 p = _mm512_set1_ps(k[len - 1]);
  for (int i = len - 2; i >= 0; --i) p = _mm512_fmadd_ps(x, p, _mm512_set1_ps(k[i]));
  return p;
}

// K pairs of blocks (K x 32 columns) from column j0, stage by stage as BlocksAvx2.
template <int K>
TFRA_AVX512 __attribute__((always_inline)) inline void BlocksAvx512(__m512i& state, int64_t j0, int64_t n,
                                                                    float mean, float stddev, float* dst) {
  const __m512i step = _mm512_set1_epi64(static_cast<int64_t>(8 * kGamma));
  const __m512 one = _mm512_set1_ps(1.0f), vmean = _mm512_set1_ps(mean), vstd = _mm512_set1_ps(stddev);
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  __m512i lo[K], hi[K];
  for (int k = 0; k < K; ++k) {
    const __m512i w0 = MixAvx512(state);
    state = _mm512_add_epi64(state, step);
    const __m512i w1 = MixAvx512(state);
    state = _mm512_add_epi64(state, step);
    lo[k] = _mm512_permutex2var_epi32(w0, even, w1);  // 16 words' low halves, in order
    hi[k] = _mm512_permutex2var_epi32(w0, odd, w1);
  }
  __m512 r[K];
  for (int k = 0; k < K; ++k) {
    const __m512 v = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_srli_epi32(lo[k], 8), _mm512_set1_epi32(1)));
    const __m512i bits = _mm512_castps_si512(v);
    __m512i e = _mm512_sub_epi32(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(127 + 24));
    __m512 f = _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFF)),
                                                   _mm512_set1_epi32(0x3F800000)));
    const __mmask16 big = _mm512_cmp_ps_mask(f, _mm512_set1_ps(kSqrt2), _CMP_GT_OQ);
    f = _mm512_mask_mul_ps(f, big, f, _mm512_set1_ps(0.5f));
    e = _mm512_mask_add_epi32(e, big, e, _mm512_set1_epi32(1));
    const __m512 t = _mm512_div_ps(_mm512_sub_ps(f, one), _mm512_add_ps(f, one));
    const __m512 m2lnf = _mm512_mul_ps(t, PolyAvx512(_mm512_mul_ps(t, t), kL, 5));
    const __m512 ef = _mm512_cvtepi32_ps(e);
    const __m512 m2ln = _mm512_fmadd_ps(ef, _mm512_set1_ps(kM2Ln2Hi),
                                        _mm512_fmadd_ps(ef, _mm512_set1_ps(kM2Ln2Lo), m2lnf));
    r[k] = _mm512_mul_ps(_mm512_sqrt_ps(m2ln), vstd);
  }
  for (int k = 0; k < K; ++k) {
    const __m512 x = _mm512_fmadd_ps(
        _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(hi[k], 6), _mm512_set1_epi32(0xFFFFFF))),
        _mm512_set1_ps(kQuarterTurn), _mm512_set1_ps(kHalfStep));
    const __m512 x2 = _mm512_mul_ps(x, x);
    const __m512 sn = _mm512_mul_ps(x, PolyAvx512(x2, kS, 6));
    const __m512 cs = PolyAvx512(x2, kC, 7);
    const __m512i q = _mm512_srli_epi32(hi[k], 30);
    const __mmask16 odd_q = _mm512_test_epi32_mask(q, _mm512_set1_epi32(1));
    __m512 cq = _mm512_mask_blend_ps(odd_q, cs, sn), sq = _mm512_mask_blend_ps(odd_q, sn, cs);
    cq = _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(cq), _mm512_slli_epi32(_mm512_xor_si512(q, _mm512_srli_epi32(q, 1)), 31)));
    sq = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(sq),
                                              _mm512_slli_epi32(_mm512_srli_epi32(q, 1), 31)));
    const __m512 oc = _mm512_fmadd_ps(r[k], cq, vmean);
    const __m512 os = _mm512_fmadd_ps(r[k], sq, vmean);
    // Block 2b: cos of words 0-7, sin of words 0-7; block 2b+1: the same of words 8-15.
    const __m512 first = _mm512_shuffle_f32x4(oc, os, 0x44), second = _mm512_shuffle_f32x4(oc, os, 0xEE);
    const int64_t b0 = j0 + 32 * k, left = n - b0;
    if (left >= 32) {
      _mm512_storeu_ps(dst + b0, first);
      _mm512_storeu_ps(dst + b0 + 16, second);
    } else if (left > 0) {
      _mm512_mask_storeu_ps(dst + b0, left >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << left) - 1), first);
      if (left > 16) _mm512_mask_storeu_ps(dst + b0 + 16, static_cast<__mmask16>((1u << (left - 16)) - 1), second);
    }
  }
}

template <int K>
TFRA_AVX512 void RowBlocksAvx512(uint64_t seed, int64_t n, float mean, float stddev, float* dst) {
  __m512i state = _mm512_add_epi64(_mm512_set1_epi64(static_cast<int64_t>(seed)),
                                   _mm512_mullo_epi64(_mm512_set_epi64(8, 7, 6, 5, 4, 3, 2, 1),
                                                      _mm512_set1_epi64(static_cast<int64_t>(kGamma))));
  for (int64_t j0 = 0; j0 < n; j0 += 32 * K) BlocksAvx512<K>(state, j0, n, mean, stddev, dst);
}

// Up to four pairs of blocks a step (two for rows of up to three pairs, one for rows of one).
TFRA_AVX512 void RowAvx512(uint64_t seed, int64_t n, float mean, float stddev, float* dst) {
  if (n > 96) return RowBlocksAvx512<4>(seed, n, mean, stddev, dst);
  if (n > 32) return RowBlocksAvx512<2>(seed, n, mean, stddev, dst);
  RowBlocksAvx512<1>(seed, n, mean, stddev, dst);
}
TFRA_AVX512 void UniformAvx512(uint64_t seed, int64_t n, double a, double width, float* dst) {
  const __m512i step = _mm512_set1_epi64(static_cast<int64_t>(8 * kGamma));
  __m512i state = _mm512_add_epi64(_mm512_set1_epi64(static_cast<int64_t>(seed)),
                                   _mm512_mullo_epi64(_mm512_set_epi64(8, 7, 6, 5, 4, 3, 2, 1),
                                                      _mm512_set1_epi64(static_cast<int64_t>(kGamma))));
  const __m512d va = _mm512_set1_pd(a), vw = _mm512_set1_pd(width);
  for (int64_t j = 0; j < n; j += 8) {
    const __m512d u = _mm512_mul_pd(
        _mm512_add_pd(_mm512_cvtepu64_pd(_mm512_srli_epi64(MixAvx512(state), 11)), _mm512_set1_pd(0.5)),
        _mm512_set1_pd(0x1.0p-53));
    state = _mm512_add_epi64(state, step);
    const __m256 out = _mm512_cvtpd_ps(_mm512_add_pd(va, _mm512_mul_pd(vw, u)));
    if (j + 8 <= n) {
      _mm256_storeu_ps(dst + j, out);
    } else {
      _mm256_mask_storeu_ps(dst + j, static_cast<__mmask8>((1u << (n - j)) - 1), out);
    }
  }
}

#endif  // TFRA_DE_X86_SIMD

using RowFn = void (*)(uint64_t, int64_t, float, float, float*);
using UniformFn = void (*)(uint64_t, int64_t, double, double, float*);
using ListFn = int (*)(const float*, int, int32_t*);

struct Paths {
  const char* isa;
  RowFn narrow;  // normal rows of < 32 columns: an AVX-512 iteration would waste half its lanes
  RowFn wide;
  UniformFn uniform;
  ListFn list_beyond_two;
};

Isa PickIsa() {
  const char* env = std::getenv("TFRA_DE_DRAW_ISA");
  const std::string cap = env == nullptr ? "avx512" : env;
#ifdef TFRA_DE_X86_SIMD
  __builtin_cpu_init();
  const bool avx2 = cap != "scalar" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && cap == "avx512" && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (avx512) return Isa::kAvx512;
  if (avx2) return Isa::kAvx2;
#endif
  return Isa::kScalar;
}

Paths Pick() {
#ifdef TFRA_DE_X86_SIMD
  if (DrawIsaLevel() == Isa::kAvx512) return {"avx512", RowAvx2, RowAvx512, UniformAvx512, ListBeyondTwoAvx2};
  if (DrawIsaLevel() == Isa::kAvx2) return {"avx2", RowAvx2, RowAvx2, UniformAvx2, ListBeyondTwoAvx2};
#endif
  return {"scalar", RowScalar, RowScalar, UniformScalar, ListBeyondTwoScalar};
}

const Paths kPaths = Pick();

}  // namespace

Isa DrawIsaLevel() {
  static const Isa isa = PickIsa();  // a function's static: safe from other files' static init
  return isa;
}

void NormalRow(uint64_t seed, int64_t n, float mean, float stddev, float* dst) {
  (n < 32 ? kPaths.narrow : kPaths.wide)(seed, n, mean, stddev, dst);
}

void TruncatedNormalRow(uint64_t seed, int64_t n, float* dst) {
  NormalRow(seed, n, 0.0f, 1.0f, dst);
  // The redraws continue the row's word stream, past the words its blocks used.
  RowRng more(seed + static_cast<uint64_t>(8 * ((n + 15) / 16)) * kGamma);
  constexpr int kChunk = 256;
  int32_t beyond[kChunk];  // the chunk's columns beyond two (~5%, at random)
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int m = static_cast<int>(std::min<int64_t>(kChunk, n - c0));
    const int count = kPaths.list_beyond_two(dst + c0, m, beyond);
    for (int t = 0; t < count; ++t) {
      float z;
      do z = static_cast<float>(more.Normal()); while (std::fabs(z) > 2.0f);
      dst[c0 + beyond[t]] = z;
    }
  }
}

void UniformRow(uint64_t seed, int64_t n, double a, double width, float* dst) {
  kPaths.uniform(seed, n, a, width, dst);
}

const char* DrawIsa() { return kPaths.isa; }

}  // namespace tfra_de
