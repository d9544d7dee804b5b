// Table<K, V>, the concurrent, compact hash table behind every native op,
// composed from one header per concern; include this one to use the table.
//
//   de_table_core.h   the class: shards, record layout, locks, and the
//                     per-shard primitives (look up, insert, erase a key)
//   de_index.h        SlotIndex: a shard's hash -> row index
//   de_slab.h         RecordLayout, RowSlab: a shard's records and row allocator
//   de_compaction.h   giving rows back after removals; open chunked exports
//   de_batch.h        bucketing a batch by shard, the prefetching lookup loops
//   de_table_ops.h    the row ops: find, insert, accumulate, remove, clear
//   de_groups.h       column groups (optimizer slots in the records)
//   de_eviction.h     the capacity bound (LRU / LFU) and TTL sweeps
//   de_table_io.h     export / import and per-shard files
//   de_init.h         the initial rows of missing keys
//   de_apply.h        optimizer updates applied in the table
//
// The key types' .cc files (de_table_<key>.cc) instantiate it through
// NewTableFor, so they compile in parallel.
#ifndef TFRA_DE_CC_OPS_DE_TABLE_IMPL_H_
#define TFRA_DE_CC_OPS_DE_TABLE_IMPL_H_

#include <type_traits>

#include "absl/strings/str_cat.h"
#include "de_apply.h"
#include "de_batch.h"
#include "de_eviction.h"
#include "de_groups.h"
#include "de_table.h"
#include "de_table_core.h"
#include "de_table_io.h"
#include "de_table_ops.h"
#include "tensorflow/core/framework/types.h"

namespace tfra_de {

// A new Table<K, V> for `cfg.value_dtype`; each key type's .cc file instantiates it, so the
// key types compile in parallel.
template <class K>
Status NewTableFor(const TableConfig& cfg, TableBase** out) {
  auto make = [&](auto* value_tag) -> Status {
    using V = std::remove_pointer_t<decltype(value_tag)>;
    tensorflow::core::RefCountPtr<Table<K, V>> t(new Table<K, V>(cfg));
    TF_RETURN_IF_ERROR(t->Init());
    *out = t.release();
    return absl::OkStatus();
  };
  switch (cfg.value_dtype) {
    case tensorflow::DT_HALF: return make(static_cast<Eigen::half*>(nullptr));
    case tensorflow::DT_BFLOAT16: return make(static_cast<Eigen::bfloat16*>(nullptr));
    case tensorflow::DT_FLOAT: return make(static_cast<float*>(nullptr));
    case tensorflow::DT_DOUBLE: return make(static_cast<double*>(nullptr));
    // Integer rows: what TFRA's restrict policies keep (step / count status per key).
    case tensorflow::DT_INT32: return make(static_cast<int32_t*>(nullptr));
    case tensorflow::DT_INT64: return make(static_cast<int64_t*>(nullptr));
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "value_dtype must be float16, bfloat16, float32, float64, int32 or int64, got ",
          tensorflow::DataTypeString(cfg.value_dtype)));
  }
}

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_TABLE_IMPL_H_
