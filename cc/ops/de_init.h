// What a new row starts as: the rows of missing keys drawn by an InitSpec
// (FillInitRow, for the fused lookup-or-init ops) and the conversion of fill
// values to the table's dtype (FromDouble, also for slot groups' fills). A
// drawn row is a pure function of (seed, key), so it is a free function of
// the spec, the key's hash and the row width, independent of any table.
#ifndef TFRA_DE_CC_OPS_DE_INIT_H_
#define TFRA_DE_CC_OPS_DE_INIT_H_

#include <cstdint>
#include <type_traits>
#include <vector>

#include "de_draw.h"
#include "de_keyed.h"
#include "de_table.h"
#include "de_util.h"
#include "tensorflow/core/platform/tstring.h"

namespace tfra_de {

template <class V>
inline V FromDouble(double x) {
  if constexpr (std::is_same<V, double>::value) {
    return x;
  } else {
    return static_cast<V>(static_cast<float>(x));
  }
}

// The hash a key's initial row is drawn from: the table's key hash `h`, except
// for string keys drawn by the keyed recipe (TF's FarmHash fingerprint).
template <class KIn>
inline uint64_t InitHash(const InitSpec& init, const KIn& key, uint64_t h) {
  if constexpr (std::is_same<KIn, tensorflow::tstring>::value) {
    if (init.keyed && init.kind != InitSpec::kConstant) return KeyedStringHash(key.data(), key.size());
  }
  return h;
}

// The keyed recipe's (truncated) normal row (de_keyed.h), computed in double.
template <class V>
inline void KeyedNormal(uint64_t row_seed, int64_t dim, double a, double b, bool truncated, V* dst) {
  if constexpr (std::is_same<V, double>::value) {
    KeyedNormalRow(row_seed, dim, a, b, truncated, dst);
  } else {
    thread_local std::vector<double> row;
    row.resize(static_cast<size_t>(dim));
    KeyedNormalRow(row_seed, dim, a, b, truncated, row.data());
    for (int64_t j = 0; j < dim; ++j) dst[j] = FromDouble<V>(row[j]);
  }
}

// Writes the `dim` initial values of the key whose InitHash is `key_hash`.
template <class V>
inline void FillInitRow(const InitSpec& init, uint64_t key_hash, int64_t dim, V* dst) {
  const double a = init.a, b = init.b;
  if (init.kind == InitSpec::kConstant) {
    if (init.row != nullptr) {
      for (int64_t j = 0; j < dim; ++j) dst[j] = FromDouble<V>(init.row[j]);
      return;
    }
    const V c = FromDouble<V>(a);
    for (int64_t j = 0; j < dim; ++j) dst[j] = c;
    return;
  }
  // Column j uses the (j+1)-th output of this generator (keyed_random.py).
  const uint64_t row_seed = key_hash ^ Mix64(init.seed + kSeedSalt);
  RowRng rng(row_seed);
  switch (init.kind) {
    case InitSpec::kUniform: {
      const double width = b - a;
      if constexpr (std::is_same<V, float>::value) {
        UniformRow(row_seed, dim, a, width, dst);  // the same floats as the loop below
      } else {
        for (int64_t j = 0; j < dim; ++j) dst[j] = FromDouble<V>(a + width * rng.Uniform());
      }
      break;
    }
    case InitSpec::kNormal:
      if (init.keyed) {
        KeyedNormal(row_seed, dim, a, b, /*truncated=*/false, dst);
      } else if (dim < kBoxMullerMinDim) {
        rng.Normals(dim, [&](int64_t j, double z) { dst[j] = FromDouble<V>(a + b * z); });
      } else if constexpr (std::is_same<V, float>::value) {
        NormalRow(row_seed, dim, static_cast<float>(a), static_cast<float>(b), dst);
      } else {
        thread_local std::vector<float> z;
        z.resize(static_cast<size_t>(dim));
        NormalRow(row_seed, dim, 0.0f, 1.0f, z.data());
        for (int64_t j = 0; j < dim; ++j) dst[j] = FromDouble<V>(a + b * static_cast<double>(z[j]));
      }
      break;
    default:  // truncated normal: within two standard deviations
      if (init.keyed) {
        KeyedNormal(row_seed, dim, a, b, /*truncated=*/true, dst);
      } else if (dim >= kBoxMullerMinDim) {
        thread_local std::vector<float> z;
        z.resize(static_cast<size_t>(dim));
        TruncatedNormalRow(row_seed, dim, z.data());
        for (int64_t j = 0; j < dim; ++j) dst[j] = FromDouble<V>(a + b * static_cast<double>(z[j]));
      } else {  // redraw beyond two standard deviations
        for (int64_t j = 0; j < dim; ++j) {
          double z;
          do z = rng.Normal(); while (z < -2.0 || z > 2.0);
          dst[j] = FromDouble<V>(a + b * z);
        }
      }
  }
}

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_INIT_H_
