// Table factory: dispatches a TableConfig's dtypes to a Table<K, V>.
// The instantiations live in de_table_<key>.cc so they compile in parallel.
#include "de_table.h"

#include <ctime>

#include "absl/strings/str_cat.h"

namespace tfra_de {

Status NewTableInt32(const TableConfig& cfg, TableBase** out);
Status NewTableInt64(const TableConfig& cfg, TableBase** out);
Status NewTableString(const TableConfig& cfg, TableBase** out);

uint32_t TableBase::CurrentStamp() const {
  const int64_t step = step_.load(std::memory_order_relaxed);
  if (step >= 0) return step > int64_t{UINT32_MAX} ? UINT32_MAX : static_cast<uint32_t>(step);
  return static_cast<uint32_t>(std::time(nullptr));
}

Status CreateTable(const TableConfig& cfg, TableBase** out) {
  if (cfg.dim < 1 || cfg.dim > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat("dim must be in [1, ", kMaxDim, "], got ", cfg.dim));
  }
  if (cfg.num_shards < 0 || cfg.num_shards > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_shards must be in [0, ", kMaxShards, "], got ", cfg.num_shards));
  }
  // init_size pre-sizes the index eagerly; the cap keeps a typo from claiming all memory.
  if (cfg.init_size < 0 || cfg.init_size > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat("init_size must be in [0, 2^31], got ", cfg.init_size));
  }
  switch (cfg.key_dtype) {
    case tensorflow::DT_INT32: return NewTableInt32(cfg, out);
    case tensorflow::DT_INT64: return NewTableInt64(cfg, out);
    case tensorflow::DT_STRING: return NewTableString(cfg, out);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "key_dtype must be int32, int64 or string, got ", tensorflow::DataTypeString(cfg.key_dtype)));
  }
}

}  // namespace tfra_de
