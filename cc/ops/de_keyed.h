// The keyed initial-row recipe of tables/keyed_random.py, in C++: a seeded
// initializer's row of a key is a pure function of (seed, key), and the fused
// kernels draw exactly the rows the TF ops there draw (uniform and normal rows
// bit for bit; see the tests in tests/tables/test_fused_init.py). For key k
// and column j:
//
//   h   = Mix64(int64(k))                      int keys (int32 sign-extended)
//         Mix64(Fingerprint64(k) % (2^63 - 1)) string keys (TF's FarmHash
//                                             fingerprint, as tf.strings.
//                                             to_hash_bucket_fast)
//   u_j = ((splitmix64(h ^ Mix64(seed + kSeedSalt) + (j + 1) * golden) >> 11)
//          + 0.5) / 2^53                       RowRng(...).Uniform(), column j
//   uniform          a + (b - a) * u_j
//   normal           a + b * Ndtri(u_j)
//   truncated normal a + b * Ndtri(kPhiLo + kPhiWidth * u_j)    (within 2 b)
//
// in double, then rounded to the table's dtype. Ndtri is a port of the Cephes
// inverse normal CDF that TF's tf.math.ndtri (Eigen) uses, with the same
// operations in the same order, so it returns the same doubles (checked on
// 4M draws against TF 2.21). That equality needs a*b+c to round twice, as in
// TF: the op library is compiled with -ffp-contract=off.
#ifndef TFRA_DE_CC_OPS_DE_KEYED_H_
#define TFRA_DE_CC_OPS_DE_KEYED_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "de_util.h"

namespace tfra_de {

constexpr uint64_t kSeedSalt = 0x632be59bd9b4e019ULL;  // keyed_random._SEED_SALT
// keyed_random._PHI_LO = Phi(-2) and _PHI_HI - _PHI_LO, as Python computes them.
constexpr double kPhiLo = 0x1.74bcf82c9d863p-6;
constexpr double kPhiWidth = 0x1.e8b4307d3627ap-1;

// --------------------------------------------------------- inverse CDF --

template <int N>
inline double Polevl(double x, const double* c) {
  double r = c[0];
  for (int i = 1; i <= N; ++i) r = r * x + c[i];
  return r;
}

// Tail of Ndtri: b <= exp(-2) (the branch Eigen takes below exp(-2)). The
// rational functions for x = sqrt(-2 ln b) < 8 (p1/q1) and >= 8 (p2/q2).
constexpr double kNdtriP1[] = {4.05544892305962419923e0,   3.15251094599893866154e1,
                               5.71628192246421288162e1,   4.40805073893200834700e1,
                               1.46849561928858024014e1,   2.18663306850790267539e0,
                               -1.40256079171354495875e-1, -3.50424626827848203418e-2,
                               -8.57456785154685413611e-4};
constexpr double kNdtriQ1[] = {1.0,
                               1.57799883256466749731e1,
                               4.53907635128879210584e1,
                               4.13172038254672030440e1,
                               1.50425385692907503408e1,
                               2.50464946208309415979e0,
                               -1.42182922854787788574e-1,
                               -3.80806407691578277194e-2,
                               -9.33259480895457427372e-4};
constexpr double kNdtriP2[] = {3.23774891776946035970e0,  6.91522889068984211695e0,
                               3.93881025292474443415e0,  1.33303460815807542389e0,
                               2.01485389549179081538e-1, 1.23716634817820021358e-2,
                               3.01581553508235416007e-4, 2.65806974686737550832e-6,
                               6.23974539184983293730e-9};
constexpr double kNdtriQ2[] = {1.0,
                               6.02427039364742014255e0,
                               3.67983563856160859403e0,
                               1.37702099489081330271e0,
                               2.16236993594496635890e-1,
                               1.34204006088543189037e-2,
                               3.28014464682127739104e-4,
                               2.89247864745380683936e-6,
                               6.79019408009981274425e-9};

__attribute__((noinline)) inline double NdtriTail(double b, bool flip) {
  const double x = std::sqrt(-2.0 * std::log(b));
  const double x0 = x - std::log(x) / x;
  const double z = 1.0 / x;
  const double x1 = z * (x < 8.0 ? Polevl<8>(z, kNdtriP1) / Polevl<8>(z, kNdtriQ1)
                                 : Polevl<8>(z, kNdtriP2) / Polevl<8>(z, kNdtriQ2));
  const double r = x0 - x1;
  return flip ? -r : r;
}

// Central branch of Ndtri (b > exp(-2)): a rational function of b - 1/2,
// (c + c c^2 P(c^2) / Q(c^2)) sqrt(2 pi). de_draw.cc evaluates it vectorized
// with the same operations.
constexpr double kNdtriP0[] = {-5.99633501014107895267e1, 9.80010754185999661536e1,
                               -5.66762857469070293439e1, 1.39312609387279679503e1,
                               -1.23916583867381258016e0};
constexpr double kNdtriQ0[] = {1.0,
                               1.95448858338141759834e0,
                               4.67627912898881538453e0,
                               8.63602421390890590575e1,
                               -2.25462687854119370527e2,
                               2.00260212380060660359e2,
                               -8.20372256168333339912e1,
                               1.59056225126211695515e1,
                               -1.18331621121330003142e0};
constexpr double kSqrt2Pi = 2.50662827463100050242e0;

inline double NdtriCenter(double b) {
  const double c = b - 0.5, c2 = c * c;
  return (c * (c2 * (Polevl<4>(c2, kNdtriP0) / Polevl<8>(c2, kNdtriQ0))) + c) * kSqrt2Pi;
}

constexpr double kExpNegTwo = 0.13533528323661269189;

// Inverse of the standard normal CDF for u in (0, 1).
inline double Ndtri(double u) {
  const bool flip = u <= 1.0 - kExpNegTwo;
  const double b = flip ? u : 1.0 - u;
  if (kExpNegTwo < b) return NdtriCenter(b);
  return NdtriTail(b, flip);
}

// ------------------------------------------------- FarmHash Fingerprint64 --
// farmhash::Fingerprint64 (= farmhashna::Hash64), what TF's Fingerprint64 and
// tf.strings.to_hash_bucket_fast use; stable by TF's contract. Little-endian.

namespace farm {

constexpr uint64_t k0 = 0xc3a5c85c97cb3127ULL;
constexpr uint64_t k1 = 0xb492b66fbe98f273ULL;
constexpr uint64_t k2 = 0x9ae16a3b2f90404fULL;

inline uint64_t Fetch64(const char* p) {
  uint64_t r;
  std::memcpy(&r, p, 8);
  return r;
}
inline uint32_t Fetch32(const char* p) {
  uint32_t r;
  std::memcpy(&r, p, 4);
  return r;
}
inline uint64_t Rotate(uint64_t v, int s) { return s == 0 ? v : (v >> s) | (v << (64 - s)); }
inline uint64_t ShiftMix(uint64_t v) { return v ^ (v >> 47); }
inline uint64_t HashLen16(uint64_t u, uint64_t v, uint64_t mul) {
  uint64_t a = (u ^ v) * mul;
  a ^= (a >> 47);
  uint64_t b = (v ^ a) * mul;
  b ^= (b >> 47);
  b *= mul;
  return b;
}

inline uint64_t HashLen0to16(const char* s, size_t len) {
  if (len >= 8) {
    const uint64_t mul = k2 + len * 2;
    const uint64_t a = Fetch64(s) + k2;
    const uint64_t b = Fetch64(s + len - 8);
    const uint64_t c = Rotate(b, 37) * mul + a;
    const uint64_t d = (Rotate(a, 25) + b) * mul;
    return HashLen16(c, d, mul);
  }
  if (len >= 4) {
    const uint64_t mul = k2 + len * 2;
    const uint64_t a = Fetch32(s);
    return HashLen16(len + (a << 3), Fetch32(s + len - 4), mul);
  }
  if (len > 0) {
    const uint8_t a = static_cast<uint8_t>(s[0]);
    const uint8_t b = static_cast<uint8_t>(s[len >> 1]);
    const uint8_t c = static_cast<uint8_t>(s[len - 1]);
    const uint32_t y = static_cast<uint32_t>(a) + (static_cast<uint32_t>(b) << 8);
    const uint32_t z = static_cast<uint32_t>(len) + (static_cast<uint32_t>(c) << 2);
    return ShiftMix(y * k2 ^ z * k0) * k2;
  }
  return k2;
}

inline uint64_t HashLen17to32(const char* s, size_t len) {
  const uint64_t mul = k2 + len * 2;
  const uint64_t a = Fetch64(s) * k1;
  const uint64_t b = Fetch64(s + 8);
  const uint64_t c = Fetch64(s + len - 8) * mul;
  const uint64_t d = Fetch64(s + len - 16) * k2;
  return HashLen16(Rotate(a + b, 43) + Rotate(c, 30) + d, a + Rotate(b + k2, 18) + c, mul);
}

inline uint64_t HashLen33to64(const char* s, size_t len) {
  const uint64_t mul = k2 + len * 2;
  const uint64_t a = Fetch64(s) * k2;
  const uint64_t b = Fetch64(s + 8);
  const uint64_t c = Fetch64(s + len - 8) * mul;
  const uint64_t d = Fetch64(s + len - 16) * k2;
  const uint64_t y = Rotate(a + b, 43) + Rotate(c, 30) + d;
  const uint64_t z = HashLen16(y, a + Rotate(b + k2, 18) + c, mul);
  const uint64_t e = Fetch64(s + 16) * mul;
  const uint64_t f = Fetch64(s + 24);
  const uint64_t g = (y + Fetch64(s + len - 32)) * mul;
  const uint64_t h = (z + Fetch64(s + len - 24)) * mul;
  return HashLen16(Rotate(e + f, 43) + Rotate(g, 30) + h, e + Rotate(f + a, 18) + g, mul);
}

struct Pair {
  uint64_t first, second;
};

inline Pair WeakHashLen32WithSeeds(uint64_t w, uint64_t x, uint64_t y, uint64_t z, uint64_t a,
                                   uint64_t b) {
  a += w;
  b = Rotate(b + a + z, 21);
  const uint64_t c = a;
  a += x;
  a += y;
  b += Rotate(a, 44);
  return {a + z, b + c};
}

inline Pair WeakHashLen32WithSeeds(const char* s, uint64_t a, uint64_t b) {
  return WeakHashLen32WithSeeds(Fetch64(s), Fetch64(s + 8), Fetch64(s + 16), Fetch64(s + 24), a,
                                b);
}

inline uint64_t Fingerprint64(const char* s, size_t len) {
  if (len <= 32) return len <= 16 ? HashLen0to16(s, len) : HashLen17to32(s, len);
  if (len <= 64) return HashLen33to64(s, len);
  const uint64_t seed = 81;
  uint64_t x = seed;
  uint64_t y = seed * k1 + 113;
  uint64_t z = ShiftMix(y * k2 + 113) * k2;
  Pair v = {0, 0}, w = {0, 0};
  x = x * k2 + Fetch64(s);
  const char* end = s + ((len - 1) / 64) * 64;
  const char* last64 = end + ((len - 1) & 63) - 63;
  do {
    x = Rotate(x + y + v.first + Fetch64(s + 8), 37) * k1;
    y = Rotate(y + v.second + Fetch64(s + 48), 42) * k1;
    x ^= w.second;
    y += v.first + Fetch64(s + 40);
    z = Rotate(z + w.first, 33) * k1;
    v = WeakHashLen32WithSeeds(s, v.second * k1, x + w.first);
    w = WeakHashLen32WithSeeds(s + 32, z + w.second, y + Fetch64(s + 16));
    const uint64_t t = z;
    z = x;
    x = t;
    s += 64;
  } while (s != end);
  const uint64_t mul = k1 + ((z & 0xff) << 1);
  s = last64;
  w.first += ((len - 1) & 63);
  v.first += w.first;
  w.first += v.first;
  x = Rotate(x + y + v.first + Fetch64(s + 8), 37) * mul;
  y = Rotate(y + v.second + Fetch64(s + 48), 42) * mul;
  x ^= w.second * 9;
  y += v.first * 9 + Fetch64(s + 40);
  z = Rotate(z + w.first, 33) * mul;
  v = WeakHashLen32WithSeeds(s, v.second * mul, x + w.first);
  w = WeakHashLen32WithSeeds(s + 32, z + w.second, y + Fetch64(s + 16));
  const uint64_t t = z;
  z = x;
  x = t;
  return HashLen16(HashLen16(v.first, w.first, mul) + ShiftMix(y) * k0 + z,
                   HashLen16(v.second, w.second, mul) + x, mul);
}

}  // namespace farm

// keyed_random.key_hash of a string key.
inline uint64_t KeyedStringHash(const char* s, size_t n) {
  return Mix64(farm::Fingerprint64(s, n) % 0x7fffffffffffffffULL);
}

// ---------------------------------------------------------------- rows --
// Rows of n columns for the row seed `seed` (the key's hash ^ Mix64(seed + kSeedSalt)), drawn
// on the instruction set DrawIsaLevel() picks (de_keyed.cc); every path gives the same values.

// Normal rows in double: dst[j] = a + b * Ndtri(v_j), v_j = u_j, or kPhiLo + kPhiWidth * u_j
// when `truncated`; the same doubles as that scalar loop (the central branch is vectorized
// with the same operations).
void KeyedNormalRow(uint64_t seed, int64_t n, double a, double b, bool truncated, double* dst);

// Such rows rounded to float, bit for bit float(KeyedNormalRow's doubles), for `rows` row seeds
// at once (row i into dst[i]): what float, float16 and bfloat16 tables store (they round
// through float). Faster than KeyedNormalRow: an evaluation whose error bound is checked
// column by column, and the tail columns of all the rows drawn together (de_keyed.cc).
// Example: float* out[2] = {row0, row1}; KeyedNormalRowsFloat(seeds, 2, 64, 0.0, 0.01, false, out);
void KeyedNormalRowsFloat(const uint64_t* seeds, int64_t rows, int64_t n, double a, double b,
                          bool truncated, float* const* dst);

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_KEYED_H_
