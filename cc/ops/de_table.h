// The table resource seen by the op kernels: a type-erased interface over
// Table<K, V> (de_table_impl.h), so kernels are registered once, not per dtype.
#ifndef TFRA_DE_CC_OPS_DE_TABLE_H_
#define TFRA_DE_CC_OPS_DE_TABLE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace tfra_de {

using tensorflow::DataType;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using Status = absl::Status;

// Largest accepted row width: keeps a row's byte size far from overflow and
// rejects absurd attrs before any allocation is attempted.
constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int kMaxShards = 4096;

struct TableConfig {
  DataType key_dtype;
  DataType value_dtype;
  int64_t dim = 1;
  int64_t init_size = 0;
  int num_shards = 0;  // 0: chosen from init_size
};

// How a fused op fills the rows of missing keys. A random row is a pure
// function of (seed, key): drawn with RowRng's ziggurat normals (the default,
// fastest), or, when `keyed`, by the recipe of tables/keyed_random.py
// (de_keyed.h: inverse-CDF normals, FarmHash string keys), so the kernel's rows
// equal those TF ops' rows.
struct InitSpec {
  enum Kind { kConstant, kUniform, kNormal, kTruncatedNormal };
  Kind kind = kConstant;
  double a = 0.0;  // constant value | minval | mean
  double b = 0.0;  // maxval | stddev
  uint64_t seed = 0;
  bool keyed = false;
  const double* row = nullptr;  // kConstant: a [dim] row (else every column is a)
};

// Destination of a chunked export; implemented by the export kernel.
class ExportSink {
 public:
  virtual ~ExportSink() = default;
  // Allocates outputs for n rows and returns pointers into them.
  virtual Status Allocate(int64_t n, Tensor** keys, Tensor** values, Tensor** stamps,
                          Tensor** freqs) = 0;
};

class TableBase : public tensorflow::ResourceBase {
 public:
  explicit TableBase(const TableConfig& cfg) : cfg_(cfg) {}

  const TableConfig& config() const { return cfg_; }
  DataType key_dtype() const { return cfg_.key_dtype; }
  DataType value_dtype() const { return cfg_.value_dtype; }
  int64_t dim() const { return cfg_.dim; }

  // rows[i] = row of keys[i], or defaults (a [dim] row or row i of [N, dim]).
  virtual Status Find(OpKernelContext* ctx, const Tensor& keys, const Tensor& defaults,
                      Tensor* values, Tensor* exists) = 0;
  // Missing keys get rows drawn by `init`; inserted when `insert` is true.
  virtual Status FindInit(OpKernelContext* ctx, const Tensor& keys, const InitSpec& init,
                          bool insert, Tensor* values, Tensor* exists) = 0;
  // Inserts keys[i] -> values[i] only where absent; stored[i] = the row now
  // in the table (values[i], or the row another writer put there first).
  virtual Status InsertMissing(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                               Tensor* stored) = 0;
  virtual Status Insert(OpKernelContext* ctx, const Tensor& keys, const Tensor& values) = 0;
  virtual Status Accum(OpKernelContext* ctx, const Tensor& keys, const Tensor& deltas) = 0;
  virtual Status Remove(OpKernelContext* ctx, const Tensor& keys, int64_t* removed) = 0;
  virtual void Clear() = 0;
  virtual int64_t Size() const = 0;
  // Rows from `cursor` on, at most `limit` (<0: all, as one consistent
  // snapshot). *next is -1 once the table is exhausted.
  virtual Status Export(int64_t cursor, int64_t limit, ExportSink* sink, int64_t* next) = 0;
  // Replaces (clear_first) or extends the content. stamps/freqs may be empty.
  virtual Status Import(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                        const Tensor& stamps, const Tensor& freqs, bool clear_first) = 0;
  virtual Status Evict(int64_t min_stamp, int64_t min_freq, int64_t* removed) = 0;
  virtual Status SaveToFile(const std::string& path) = 0;
  virtual Status LoadFromFile(const std::string& path, int64_t* loaded) = 0;

  // Metadata clock: a step >= 0 is recorded as the stamp of written rows;
  // a negative step restores the default, wall-clock seconds.
  void SetStep(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  uint32_t CurrentStamp() const;

 protected:
  TableConfig cfg_;
  std::atomic<int64_t> step_{-1};
};

// Builds a Table<K, V> for the config's dtypes (validated).
Status CreateTable(const TableConfig& cfg, TableBase** out);

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_TABLE_H_
