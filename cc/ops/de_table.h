// The table resource seen by the op kernels: a type-erased interface over
// Table<K, V> (de_table_impl.h), so kernels are registered once, not per dtype.
#ifndef TFRA_DE_CC_OPS_DE_TABLE_H_
#define TFRA_DE_CC_OPS_DE_TABLE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

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
// function of (seed, key): by default the fastest draw (de_draw.h's vectorized
// Box-Muller rows from 16 columns, RowRng's ziggurat below), or, when `keyed`, by the recipe of tables/keyed_random.py
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

// An optimizer update applied in the table (de_apply.h): the rule, its
// hyper-parameters (hyper[0]: decoupled weight decay, w -= w * hyper[0]
// first; then the kind's own, see ApplyRow), the column group of each of the
// kind's slots (-1: not kept), and how a missing key's row starts: `init`,
// or row i of `init_rows` when given.
struct ApplySpec {
  enum Kind { kSgd, kMomentum, kKerasMomentum, kAdagrad, kAdam, kFtrl, kRmsProp };
  static constexpr int kMaxHyper = 10;
  static constexpr int kMaxSlots = 3;
  Kind kind = kSgd;
  double hyper[kMaxHyper] = {};
  std::vector<int> slot_groups;
  InitSpec init;
  const Tensor* init_rows = nullptr;
};

// Destination of a chunked export; implemented by the export kernel.
class ExportSink {
 public:
  virtual ~ExportSink() = default;
  // Allocates outputs for n rows and returns pointers into them.
  virtual Status Allocate(int64_t n, Tensor** keys, Tensor** values, Tensor** stamps,
                          Tensor** freqs) = 0;
  // false: the sink's values tensor has no columns and the rows are not copied.
  virtual bool WantsValues() const { return true; }
};

// A record holds its key's row (column group 0) and, once an optimizer's slots
// are kept with it, further groups of dim columns (group g: slot g). A
// GroupView (below) shows one group as a table of its own, so every op works on
// slot columns too; FindGroups / UpsertGroups move several groups of a key with
// one probe. Group g >= 1 of a new key starts at the group's fill value.
//
// A record also notes which of its slot groups were written (any write of
// group g: UpsertGroups, or an insert, accum or import of the group; a write of
// the row alone sets none). The keys of group g are those with it written, as
// in TFRA, whose slots are tables of their own holding the keys the optimizer
// trained: a group's size, exports and files count only them, and its lookups
// and contains say that the others are missing.
constexpr int kMaxGroups = 16;
static_assert(kMaxGroups <= 16, "a record's written mask has 16 bits (de_slab.h)");

// An ExportSink into tensors of its own (host memory), `groups` blocks of dim
// columns per row.
class HostSink : public ExportSink {
 public:
  HostSink(const TableConfig& cfg, int groups) : cfg_(cfg), width_(cfg.dim * groups) {}
  Status Allocate(int64_t n, Tensor** k, Tensor** v, Tensor** s, Tensor** f) override {
    keys = Tensor(cfg_.key_dtype, tensorflow::TensorShape({n}));
    values = Tensor(cfg_.value_dtype, tensorflow::TensorShape({n, width_}));
    stamps = Tensor(tensorflow::DT_INT64, tensorflow::TensorShape({n}));
    freqs = Tensor(tensorflow::DT_INT64, tensorflow::TensorShape({n}));
    *k = &keys;
    *v = &values;
    *s = &stamps;
    *f = &freqs;
    return absl::OkStatus();
  }
  Tensor keys, values, stamps, freqs;

 private:
  TableConfig cfg_;
  int64_t width_;
};

class TableBase : public tensorflow::ResourceBase {
 public:
  explicit TableBase(const TableConfig& cfg) : cfg_(cfg) {}

  const TableConfig& config() const { return cfg_; }
  DataType key_dtype() const { return cfg_.key_dtype; }
  DataType value_dtype() const { return cfg_.value_dtype; }
  int64_t dim() const { return cfg_.dim; }

  // `group` selects the record's columns the op reads or writes (0: the row).
  // rows[i] = row of keys[i], or defaults (a [dim] row or row i of [N, dim]);
  // a key is present in group g >= 1 once the group was written for it.
  virtual Status Find(OpKernelContext* ctx, const Tensor& keys, const Tensor& defaults,
                      Tensor* values, Tensor* exists, int group) = 0;
  // exists[i] = whether keys[i] is present (in group `group`; no row is read).
  virtual Status Contains(OpKernelContext* ctx, const Tensor& keys, Tensor* exists,
                          int group) = 0;
  // Missing keys get rows drawn by `init`; inserted when `insert` is true.
  // values: room for [N, dim] rows of the value dtype; exists: room for N flags
  // (plain buffers: a grouped lookup writes every table's rows into one output).
  virtual Status FindInit(OpKernelContext* ctx, const Tensor& keys, const InitSpec& init,
                          bool insert, void* values, bool* exists) = 0;
  // Inserts keys[i] -> values[i] only where absent; stored[i] = the row now
  // in the table (values[i], or the row another writer put there first).
  virtual Status InsertMissing(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                               Tensor* stored) = 0;
  virtual Status Insert(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                        int group) = 0;
  virtual Status Accum(OpKernelContext* ctx, const Tensor& keys, const Tensor& deltas,
                       int group) = 0;
  virtual Status Remove(OpKernelContext* ctx, const Tensor& keys, int64_t* removed) = 0;
  // Group 0: removes every key. Group g >= 1: resets the group to its fill.
  virtual void Clear(int group) = 0;
  virtual int64_t Size() const = 0;
  // Keys with group `group` written (Size() for group 0).
  virtual int64_t GroupSize(int group) const = 0;
  // Where the table's bytes go: record slabs as far as rows were handed out or
  // prefaulted (`rows` of them), hash indexes, and the rest (free lists, long
  // string keys).
  struct MemoryUse {
    int64_t records = 0;
    int64_t rows = 0;
    int64_t index = 0;
    int64_t other = 0;
    int64_t Bytes() const { return records + index + other; }
  };
  virtual MemoryUse Memory() const = 0;
  int64_t MemoryBytes() const { return Memory().Bytes(); }
  // Rows from `cursor` on, at most `limit` (<0: all, as one consistent
  // snapshot). *next is -1 once the table is exhausted.
  virtual Status Export(int64_t cursor, int64_t limit, ExportSink* sink, int64_t* next,
                        int group) = 0;
  // Writes rows; clear_first replaces the content: for group 0 the set of keys
  // (other groups of the keys that stay are kept, written or not), for a group
  // g >= 1 its columns (keys not imported get the fill and are no longer
  // written; no key is removed).
  // stamps/freqs may be empty.
  virtual Status Import(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                        const Tensor& stamps, const Tensor& freqs, bool clear_first,
                        int group) = 0;
  virtual Status Evict(int64_t min_stamp, int64_t min_freq, int64_t* removed) = 0;
  virtual Status SaveToFile(const std::string& path, int group) = 0;
  virtual Status LoadFromFile(const std::string& path, int group, int64_t* loaded) = 0;

  // Column groups (see kMaxGroups). EnsureGroups makes groups 1..fills.size()
  // exist, group g filled with fills[g - 1] (existing groups must have the
  // same fills); FindGroups reads and UpsertGroups writes the listed groups,
  // values[j] holding the [N, dim] rows of groups[j].
  virtual Status EnsureGroups(const std::vector<double>& fills) = 0;
  virtual int NumGroups() const = 0;
  virtual Status FindGroups(OpKernelContext* ctx, const Tensor& keys,
                            const std::vector<int>& groups, const std::vector<Tensor*>& values,
                            Tensor* exists) = 0;
  virtual Status UpsertGroups(OpKernelContext* ctx, const Tensor& keys,
                              const std::vector<int>& groups,
                              const std::vector<const Tensor*>& values) = 0;
  // Applies `spec`'s optimizer update with grads[i] ([N, dim]) to the row and
  // slot groups of keys[i] (unique), creating missing keys.
  virtual Status ApplyGradients(OpKernelContext* ctx, const Tensor& keys, const Tensor& grads,
                                const ApplySpec& spec) = 0;

  // Metadata clock: a step >= 0 is recorded as the stamp of written rows;
  // a negative step restores the default, wall-clock seconds.
  virtual void SetStep(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  uint32_t CurrentStamp() const;
  // Capacity bound of training writes (Insert, Accum, UpsertGroups): a new
  // key that would take the table over `max_rows` (> 0; 0: no bound) first
  // evicts the lowest-scoring rows of its shard not written at the current
  // stamp (LRU: oldest stamp; LFU: fewest writes, then oldest), `extra_rows`
  // more over all shards, so concurrent writers never exceed it together.
  virtual void SetBound(int64_t max_rows, int64_t extra_rows, bool lfu) {
    bound_extra_.store(extra_rows, std::memory_order_relaxed);
    bound_lfu_.store(lfu, std::memory_order_relaxed);
    bound_.store(max_rows, std::memory_order_relaxed);
  }

 protected:
  TableConfig cfg_;
  std::atomic<int64_t> step_{-1};
  std::atomic<int64_t> bound_{0};
  std::atomic<int64_t> bound_extra_{0};
  std::atomic<bool> bound_lfu_{false};
};

// One column group of a table, seen as a table of its own (an optimizer slot
// kept in its variable's records): its keys are the table's keys with the
// group written (its size, exports, files, lookups), removals and metadata are
// the table's; rows are the group's columns. Holds a reference to the table.
class GroupView : public TableBase {
 public:
  GroupView(TableBase* table, int group) : TableBase(table->config()), table_(table), group_(group) {
    table_->Ref();
  }
  ~GroupView() override { table_->Unref(); }
  std::string DebugString() const override {
    return absl::StrCat("column group ", group_, " of ", table_->DebugString());
  }
  int group() const { return group_; }
  TableBase* table() const { return table_; }

  Status Find(OpKernelContext* ctx, const Tensor& keys, const Tensor& defaults, Tensor* values,
              Tensor* exists, int group) override {
    TF_RETURN_IF_ERROR(Top(group));
    return table_->Find(ctx, keys, defaults, values, exists, group_);
  }
  // A group's columns live in its table's records: counted there, not here.
  MemoryUse Memory() const override { return {}; }
  Status Contains(OpKernelContext* ctx, const Tensor& keys, Tensor* exists, int group) override {
    TF_RETURN_IF_ERROR(Top(group));
    return table_->Contains(ctx, keys, exists, group_);
  }
  Status FindInit(OpKernelContext*, const Tensor&, const InitSpec&, bool, void*,
                  bool*) override {
    return Unsupported("find with initial rows");
  }
  Status InsertMissing(OpKernelContext*, const Tensor&, const Tensor&, Tensor*) override {
    return Unsupported("insert_missing");
  }
  Status Insert(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                int group) override {
    TF_RETURN_IF_ERROR(Top(group));
    return table_->Insert(ctx, keys, values, group_);
  }
  Status Accum(OpKernelContext* ctx, const Tensor& keys, const Tensor& deltas,
               int group) override {
    TF_RETURN_IF_ERROR(Top(group));
    return table_->Accum(ctx, keys, deltas, group_);
  }
  Status Remove(OpKernelContext* ctx, const Tensor& keys, int64_t* removed) override {
    return table_->Remove(ctx, keys, removed);
  }
  void Clear(int group) override {
    if (group == 0) table_->Clear(group_);
  }
  int64_t Size() const override { return table_->GroupSize(group_); }
  int64_t GroupSize(int group) const override { return group == 0 ? Size() : 0; }
  Status Export(int64_t cursor, int64_t limit, ExportSink* sink, int64_t* next,
                int group) override {
    TF_RETURN_IF_ERROR(Top(group));
    return table_->Export(cursor, limit, sink, next, group_);
  }
  Status Import(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                const Tensor& stamps, const Tensor& freqs, bool clear_first, int group) override {
    TF_RETURN_IF_ERROR(Top(group));
    return table_->Import(ctx, keys, values, stamps, freqs, clear_first, group_);
  }
  Status Evict(int64_t min_stamp, int64_t min_freq, int64_t* removed) override {
    return table_->Evict(min_stamp, min_freq, removed);
  }
  Status SaveToFile(const std::string& path, int group) override {
    TF_RETURN_IF_ERROR(Top(group));
    return table_->SaveToFile(path, group_);
  }
  Status LoadFromFile(const std::string& path, int group, int64_t* loaded) override {
    TF_RETURN_IF_ERROR(Top(group));
    return table_->LoadFromFile(path, group_, loaded);
  }
  Status EnsureGroups(const std::vector<double>&) override { return Unsupported("add groups"); }
  int NumGroups() const override { return 1; }
  Status FindGroups(OpKernelContext*, const Tensor&, const std::vector<int>&,
                    const std::vector<Tensor*>&, Tensor*) override {
    return Unsupported("find_groups");
  }
  Status UpsertGroups(OpKernelContext*, const Tensor&, const std::vector<int>&,
                      const std::vector<const Tensor*>&) override {
    return Unsupported("upsert_groups");
  }
  Status ApplyGradients(OpKernelContext*, const Tensor&, const Tensor&,
                        const ApplySpec&) override {
    return Unsupported("apply_gradients");
  }
  void SetStep(int64_t step) override { table_->SetStep(step); }
  void SetBound(int64_t max_rows, int64_t extra_rows, bool lfu) override {
    table_->SetBound(max_rows, extra_rows, lfu);
  }

 private:
  // A view has one group of its own, group 0 (its table's group group_).
  Status Top(int group) const {
    if (group == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("a column group view has only group 0, got ", group));
  }
  Status Unsupported(const char* what) const {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not available on column group ", group_,
                                                   " of a table (an optimizer slot view)"));
  }
  TableBase* table_;
  int group_;
};

// Builds a Table<K, V> for the config's dtypes (validated).
Status CreateTable(const TableConfig& cfg, TableBase** out);

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_TABLE_H_
