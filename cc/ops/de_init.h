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

// The row seed of a key's initial row: column j uses the (j+1)-th output of
// RowRng(row seed) (keyed_random.py).
inline uint64_t RowSeed(const InitSpec& init, uint64_t key_hash) {
  return key_hash ^ Mix64(init.seed + kSeedSalt);
}

// Whether rows of `init` are keyed (truncated) normal rows that round through
// float: drawn many rows at a time (KeyedNormalRowsFloat, checked against the
// exact doubles): the rows' tails, a few columns each, then fill the vectors together.
template <class V>
inline bool KeyedFloatRows(const InitSpec& init) {
  return init.keyed && !std::is_same<V, double>::value &&
         (init.kind == InitSpec::kNormal || init.kind == InitSpec::kTruncatedNormal);
}

// Keyed float rows drawn together (InitRows, KeyedRows), of rows up to kInitBatchMaxDim.
constexpr int kInitBatch = 16;
constexpr int64_t kInitBatchMaxDim = 4096;

// Keyed (truncated) normal rows of float, float16 and bfloat16 tables for `count`
// (<= kInitBatch) row seeds: float rows, rounded to V (as FromDouble<V>: through float).
template <class V>
inline void KeyedRows(const InitSpec& init, const uint64_t* seeds, int count, int64_t dim,
                      V* const* dst) {
  const bool truncated = init.kind == InitSpec::kTruncatedNormal;
  if constexpr (std::is_same<V, float>::value) {
    KeyedNormalRowsFloat(seeds, count, dim, init.a, init.b, truncated, dst);
  } else {
    const size_t width = static_cast<size_t>(dim);
    thread_local std::vector<float> buf;
    buf.resize(width * static_cast<size_t>(count));
    float* rows[kInitBatch];
    for (int k = 0; k < count; ++k) rows[k] = buf.data() + k * width;
    KeyedNormalRowsFloat(seeds, count, dim, init.a, init.b, truncated, rows);
    for (int k = 0; k < count; ++k) {
      for (size_t j = 0; j < width; ++j) dst[k][j] = static_cast<V>(rows[k][j]);
    }
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
  const uint64_t row_seed = RowSeed(init, key_hash);
  if (init.keyed && init.kind != InitSpec::kUniform) {  // (truncated) normal rows
    if constexpr (std::is_same<V, double>::value) {
      KeyedNormalRow(row_seed, dim, a, b, init.kind == InitSpec::kTruncatedNormal, dst);
    } else {
      KeyedRows(init, &row_seed, 1, dim, &dst);
    }
    return;
  }
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
      if (dim < kBoxMullerMinDim) {
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
      if (dim >= kBoxMullerMinDim) {
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

// Collects the missing keys' rows of one pass and draws them (Add, then
// Flush): keyed float rows kInitBatch at a time, others at once.
template <class V>
class InitRows {
 public:
  InitRows(const InitSpec& init, int64_t dim)
      : init_(init), dim_(dim),
        // Rows of thousands of columns fill the draws' vectors alone (and a batch of
        // them would take a large buffer in float16 / bfloat16 tables).
        batched_(KeyedFloatRows<V>(init) && dim <= kInitBatchMaxDim) {}
  ~InitRows() { Flush(); }
  void Add(uint64_t key_hash, V* dst) {
    if (!batched_) {
      FillInitRow(init_, key_hash, dim_, dst);
      return;
    }
    seeds_[count_] = RowSeed(init_, key_hash);
    dst_[count_++] = dst;
    if (count_ == kInitBatch) Flush();
  }
  void Flush() {
    if (count_ == 0) return;
    KeyedRows(init_, seeds_, count_, dim_, dst_);
    count_ = 0;
  }

 private:
  const InitSpec& init_;
  const int64_t dim_;
  const bool batched_;
  int count_ = 0;
  uint64_t seeds_[kInitBatch];
  V* dst_[kInitBatch];
};

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_INIT_H_
