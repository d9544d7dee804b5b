// Keyed (seeded) normal rows in C++, outside TensorFlow: how far the fast evaluation of the
// float rows is from Ndtri (the error bound cc/ops/de_keyed.cc checks against), whether the float
// rows equal the exact double rows rounded, and what a row costs on each path.
//
//   g++ -std=c++17 -O3 -ffp-contract=off -o /tmp/keyed_rows benchmarks/keyed_rows.cc && /tmp/keyed_rows
//   TFRA_DE_DRAW_ISA=avx2 /tmp/keyed_rows        (or scalar: the path the draws take)
//
// It includes the two sources, for the draw functions they keep to themselves.
#include "../cc/ops/de_keyed.cc"
#include "../cc/ops/de_draw.cc"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using namespace tfra_de;  // NOLINT

#ifdef TFRA_DE_X86_SIMD
// The fast z of one u, lane 0 of the vector helpers (as the row functions evaluate it).
TFRA_AVX512 double FastZAvx512(double u) {
  const double q = u - 0.5;
  if (std::fabs(q) <= kAs241Q) {
    __m512d qv = _mm512_set1_pd(q), num, den;
    __m512d r = _mm512_fnmadd_pd(qv, qv, _mm512_set1_pd(kAs241Q * kAs241Q));
    PolevlFmaAvx512<7, 1>(&r, kAs241A, &num);
    PolevlFmaAvx512<7, 1>(&r, kAs241B, &den);
    return _mm512_cvtsd_f64(_mm512_mul_pd(_mm512_mul_pd(qv, num), RecipAvx512(den)));
  }
  const double z = _mm512_cvtsd_f64(TailAvx512(_mm512_set1_pd(std::min(u, 1.0 - u))));
  return q < 0 ? -z : z;
}

TFRA_AVX2 double FastZAvx2(double u) {
  const double q = u - 0.5;
  if (std::fabs(q) <= kAs241Q) {
    __m256d qv = _mm256_set1_pd(q), num, den;
    __m256d r = _mm256_fnmadd_pd(qv, qv, _mm256_set1_pd(kAs241Q * kAs241Q));
    PolevlFmaAvx2<7, 1>(&r, kAs241A, &num);
    PolevlFmaAvx2<7, 1>(&r, kAs241B, &den);
    return _mm256_cvtsd_f64(_mm256_mul_pd(_mm256_mul_pd(qv, num), RecipAvx2(den)));
  }
  const double z = _mm256_cvtsd_f64(TailAvx2(_mm256_set1_pd(std::min(u, 1.0 - u))));
  return q < 0 ? -z : z;
}
#endif

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  const long draws = argc > 1 ? std::atol(argv[1]) : 10000000;
  std::printf("path: %s\n", DrawIsa());
#ifdef TFRA_DE_X86_SIMD
  // u from the keyed stream, a third of them pushed into the tails (down to 2^-53).
  double worst512 = 0.0, worst2 = 0.0;
  const bool avx512 = DrawIsaLevel() == Isa::kAvx512;
  for (long i = 0; i < draws; ++i) {
    double u = (static_cast<double>(WordAt(12345, static_cast<uint64_t>(i)) >> 11) + 0.5) * 0x1.0p-53;
    if (i % 3 == 1) u *= 1e-6;
    if (i % 3 == 2) u = std::ldexp(u, -static_cast<int>(i % 53));
    for (int truncated = 0; truncated < 2; ++truncated) {
      const double v = truncated ? kPhiLo + kPhiWidth * u : u;
      const double z = Ndtri(v);
      if (avx512) worst512 = std::max(worst512, std::fabs(FastZAvx512(v) - z) / std::fabs(z));
      if (DrawIsaLevel() != Isa::kScalar) worst2 = std::max(worst2, std::fabs(FastZAvx2(v) - z) / std::fabs(z));
    }
  }
  std::printf("max |z' - z| / |z| over %ld draws (bound 2^-36):", 2 * draws);
  if (avx512) std::printf(" AVX-512 2^%.1f", std::log2(worst512));
  if (DrawIsaLevel() != Isa::kScalar) std::printf(" AVX2 2^%.1f", std::log2(worst2));
  std::printf("\n");
#endif
  // Rows: float rows against the exact double rows rounded, many a, b and dims.
  const double as[] = {0.0, 0.25, -3.0, 1e-3, 100.0}, bs[] = {0.01, 1.0, 1e-6, 37.5, 0.0};
  std::vector<float> buf(16 * 300);
  std::vector<double> ref(300);
  long bad = 0, values = 0;
  for (long r0 = 0; r0 < 160000; r0 += 16) {
    const int dim = 1 + static_cast<int>(WordAt(9, static_cast<uint64_t>(r0)) % 300);
    const double a = as[(r0 / 16) % 5], b = bs[(r0 / 80) % 5];
    const bool truncated = (r0 / 400) % 2;
    uint64_t seeds[16];
    float* rows[16];
    for (int k = 0; k < 16; ++k) {
      seeds[k] = WordAt(static_cast<uint64_t>(r0), static_cast<uint64_t>(k));
      rows[k] = buf.data() + 300 * k;
    }
    KeyedNormalRowsFloat(seeds, 16, dim, a, b, truncated, rows);
    for (int k = 0; k < 16; ++k) {
      KeyedNormalRow(seeds[k], dim, a, b, truncated, ref.data());
      for (int j = 0; j < dim; ++j, ++values) {
        const float want = static_cast<float>(ref[j]);
        bad += std::memcmp(&want, &rows[k][j], sizeof(float)) != 0;
      }
    }
  }
  std::printf("float rows unequal to the exact rows rounded: %ld of %ld values\n", bad, values);
  // Cost of a 64-column row (normal(0, 0.01)), 16 rows a call; the best of 40 rounds.
  const int dim = 64, count = 8192;
  std::vector<float> out(16 * dim);
  std::vector<double> exact(dim);
  double best[3] = {1e9, 1e9, 1e9};
  for (int round = 0; round < 40; ++round) {
    float* rows[16];
    uint64_t seeds[16];
    for (int k = 0; k < 16; ++k) rows[k] = out.data() + dim * k;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < count; r += 16) {
      for (int k = 0; k < 16; ++k) seeds[k] = WordAt(1, static_cast<uint64_t>(r + k));
      KeyedNormalRowsFloat(seeds, 16, dim, 0.0, 0.01, false, rows);
    }
    const auto t1 = std::chrono::steady_clock::now();
    for (int r = 0; r < count; ++r) KeyedNormalRow(WordAt(1, static_cast<uint64_t>(r)), dim, 0.0, 0.01, false, exact.data());
    const auto t2 = std::chrono::steady_clock::now();
    for (int r = 0; r < count; ++r) NormalRow(WordAt(1, static_cast<uint64_t>(r)), dim, 0.0f, 0.01f, out.data());
    const auto t3 = std::chrono::steady_clock::now();
    best[0] = std::min(best[0], Seconds(t0, t1));
    best[1] = std::min(best[1], Seconds(t1, t2));
    best[2] = std::min(best[2], Seconds(t2, t3));
  }
  std::printf("ns per %d-column row: keyed float %.1f, keyed double (exact) %.1f, unseeded %.1f\n",
              dim, best[0] * 1e9 / count, best[1] * 1e9 / count, best[2] * 1e9 / count);
  return bad == 0 ? 0 : 1;
}
