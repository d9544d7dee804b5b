// SIMD helpers shared by the row draws (de_draw.cc: the unseeded generator's rows; de_keyed.cc:
// the keyed recipe's rows): the words of a row's splitmix64 stream, their vector forms, Horner
// steps on several vectors at once, and the instruction set the draws take.
#ifndef TFRA_DE_CC_OPS_DE_SIMD_H_
#define TFRA_DE_CC_OPS_DE_SIMD_H_

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TFRA_DE_X86_SIMD 1
#endif

namespace tfra_de {

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;  // splitmix64's increment
constexpr uint64_t kMul1 = 0xbf58476d1ce4e5b9ULL, kMul2 = 0x94d049bb133111ebULL;

// Word i (from 0) of the row seed's splitmix64 stream: RowRng(seed)'s (i + 1)-th Next().
inline uint64_t WordAt(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * kGamma;
  z = (z ^ (z >> 30)) * kMul1;
  z = (z ^ (z >> 27)) * kMul2;
  return z ^ (z >> 31);
}

enum class Isa { kScalar, kAvx2, kAvx512 };

// The instruction set every draw takes: the best of AVX-512, AVX2 (with FMA) and plain code
// this CPU runs, lowered by the environment variable TFRA_DE_DRAW_ISA ("avx2", "scalar"), read
// once (de_draw.cc). All three give the same rows bit for bit.
Isa DrawIsaLevel();

#ifdef TFRA_DE_X86_SIMD
#define TFRA_AVX2 __attribute__((target("avx2,fma")))

TFRA_AVX2 inline __m256i Mul64Avx2(__m256i x, __m256i c) {  // low 64 bits of x * c (no vpmullq)
  const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(x, 32), c),
                                         _mm256_mul_epu32(x, _mm256_srli_epi64(c, 32)));
  return _mm256_add_epi64(_mm256_mul_epu32(x, c), _mm256_slli_epi64(cross, 32));
}

TFRA_AVX2 inline __m256i MixAvx2(__m256i z) {
  z = Mul64Avx2(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), _mm256_set1_epi64x(kMul1));
  z = Mul64Avx2(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), _mm256_set1_epi64x(kMul2));
  return _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
}

TFRA_AVX2 inline __m256d U53ToDoubleAvx2(__m256i x) {  // exact for x < 2^53 (no vcvtuqq2pd)
  const __m256i magic = _mm256_set1_epi64x(0x4330000000000000LL);  // 2^52 as a double's bits
  const __m256d two52 = _mm256_set1_pd(0x1.0p52);
  const __m256d lo = _mm256_sub_pd(
      _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi64x(0xFFFFFFFFLL)), magic)), two52);
  const __m256d hi = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(_mm256_srli_epi64(x, 32), magic)), two52);
  return _mm256_add_pd(_mm256_mul_pd(hi, _mm256_set1_pd(0x1.0p32)), lo);
}

// Polevl<N> on K vectors at once, their steps interleaved: one polynomial is a chain of
// dependent multiply-adds, and a single chain leaves the core waiting on each step.
template <int N, int K>
TFRA_AVX2 inline void PolevlAvx2(const __m256d* x, const double* c, __m256d* r) {
#pragma GCC unroll 4
  for (int v = 0; v < K; ++v) r[v] = _mm256_set1_pd(c[0]);
#pragma GCC unroll 16
  for (int i = 1; i <= N; ++i) {
    const __m256d ci = _mm256_set1_pd(c[i]);
#pragma GCC unroll 4
    for (int v = 0; v < K; ++v) r[v] = _mm256_add_pd(_mm256_mul_pd(r[v], x[v]), ci);
  }
}

#define TFRA_AVX512 __attribute__((target("avx2,fma,avx512f,avx512dq,avx512vl")))

TFRA_AVX512 inline __m512i MixAvx512(__m512i z) {
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), _mm512_set1_epi64(kMul1));
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), _mm512_set1_epi64(kMul2));
  return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}

// Polevl<N> on K vectors at once, their steps interleaved (as PolevlAvx2).
template <int N, int K>
TFRA_AVX512 inline void PolevlAvx512(const __m512d* x, const double* c, __m512d* r) {
#pragma GCC unroll 4
  for (int v = 0; v < K; ++v) r[v] = _mm512_set1_pd(c[0]);
#pragma GCC unroll 16
  for (int i = 1; i <= N; ++i) {
    const __m512d ci = _mm512_set1_pd(c[i]);
#pragma GCC unroll 4
    for (int v = 0; v < K; ++v) r[v] = _mm512_add_pd(_mm512_mul_pd(r[v], x[v]), ci);
  }
}
#endif  // TFRA_DE_X86_SIMD

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_SIMD_H_
