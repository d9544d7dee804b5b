// Vectorized initial rows for the fused lookup-or-init kernels: AVX-512 or AVX2
// (picked when the library loads) beside a scalar path that computes the same
// floats bit for bit, so a key's row is one function of (seed, key) whichever
// path draws it. A row's word i is splitmix64 output i of the row seed (as
// RowRng's Next()).
//
// Normal rows (unseeded normal initializers) use the Box-Muller transform.
// Block b holds columns [16b, 16b + 16) and uses words 8b..8b+7: column 16b + k
// is r * cos(theta) of word 8b + k for k < 8 and r * sin(theta) of word
// 8b + k - 8 for k >= 8, where a word's low 32 bits give r = sqrt(-2 ln u1),
// u1 in [2^-24, 1] (so |z| <= 5.77), and its high 32 bits the angle theta.
// Logarithm, sine and cosine are float polynomials (relative error ~1e-7),
// evaluated with fused multiply-adds (std::fma in the scalar path).
//
// Uniform rows are RowRng's: column j = float(a + width * u_j) in double, u_j =
// ((word j >> 11) + 0.5) 2^-53, the recipe keyed_random.py's TF ops follow.
//
// Example: float row[64]; NormalRow(seed, 64, 0.0f, 0.01f, row);
#ifndef TFRA_DE_CC_OPS_DE_DRAW_H_
#define TFRA_DE_CC_OPS_DE_DRAW_H_

#include <cstdint>

namespace tfra_de {

// Narrower rows keep RowRng's scalar ziggurat: a 16-column block's vector work
// would be mostly wasted on them.
constexpr int64_t kBoxMullerMinDim = 16;

// dst[j] = mean + stddev * z_j (float arithmetic) for the row's n normals.
void NormalRow(uint64_t seed, int64_t n, float mean, float stddev, float* dst);

// Standard normals within [-2, 2] (truncated-normal rows, scaled by the caller): the row's
// NormalRow(seed, n, 0, 1), each value beyond two replaced, in column order, by the next
// normal within two of RowRng's ziggurat on the words that follow the row's blocks (word
// 8 ceil(n / 16) on). Every path gives the same floats, as NormalRow.
void TruncatedNormalRow(uint64_t seed, int64_t n, float* dst);

// dst[j] = float(a + width * u_j) for the row's n uniform draws.
void UniformRow(uint64_t seed, int64_t n, double a, double width, float* dst);

// "avx512", "avx2" or "scalar": the path the draws take (normal rows: wide ones). The
// environment variable TFRA_DE_DRAW_ISA (read once, at load) may lower it.
const char* DrawIsa();

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_DRAW_H_
