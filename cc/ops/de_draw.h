// Standard-normal initial rows for unseeded normal initializers, drawn with the
// Box-Muller transform on a row's counter-based splitmix64 words, vectorized
// (AVX-512 or AVX2, picked when the library loads) beside a scalar path that
// computes the same floats bit for bit. A key's row is thus one function of
// (seed, key) whichever path draws it.
//
// Layout: the row's word i is splitmix64 output i of the row seed (as RowRng's
// Next()). Block b holds columns [16b, 16b + 16) and uses words 8b..8b+7: column
// 16b + k is r * cos(theta) of word 8b + k for k < 8 and r * sin(theta) of word
// 8b + k - 8 for k >= 8, where a word's low 32 bits give r = sqrt(-2 ln u1),
// u1 in [2^-24, 1] (so |z| <= 5.77), and its high 32 bits the angle theta.
// Logarithm, sine and cosine are float polynomials (relative error ~1e-7).
//
// Example: float row[64]; NormalRow(seed, 64, 0.0f, 0.01f, row);
#ifndef TFRA_DE_CC_OPS_DE_NORMAL_H_
#define TFRA_DE_CC_OPS_DE_NORMAL_H_

#include <cstdint>

namespace tfra_de {

// Narrower rows keep RowRng's scalar ziggurat: a 16-column block's vector work
// would be mostly wasted on them.
constexpr int64_t kBoxMullerMinDim = 16;

// dst[j] = mean + stddev * z_j (float arithmetic) for the row's n normals.
void NormalRow(uint64_t seed, int64_t n, float mean, float stddev, float* dst);

// "avx512", "avx2" or "scalar": the path NormalRow takes for wide rows. The
// environment variable TFRA_DE_NORMAL_ISA (read once, at load) may lower it.
const char* NormalRowIsa();

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_NORMAL_H_
