// Table<int64_t, V> instantiations for every value dtype.
#include "de_table_impl.h"

namespace tfra_de {

template <class K, class V>
static Status Make(const TableConfig& cfg, TableBase** out) {
  std::unique_ptr<Table<K, V>> t(new Table<K, V>(cfg));
  TF_RETURN_IF_ERROR(t->Init());
  *out = t.release();
  return absl::OkStatus();
}

Status NewTableInt64(const TableConfig& cfg, TableBase** out) {
  switch (cfg.value_dtype) {
    case tensorflow::DT_HALF: return Make<int64_t, Eigen::half>(cfg, out);
    case tensorflow::DT_BFLOAT16: return Make<int64_t, Eigen::bfloat16>(cfg, out);
    case tensorflow::DT_FLOAT: return Make<int64_t, float>(cfg, out);
    case tensorflow::DT_DOUBLE: return Make<int64_t, double>(cfg, out);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "value_dtype must be float16, bfloat16, float32 or float64, got ",
          tensorflow::DataTypeString(cfg.value_dtype)));
  }
}

}  // namespace tfra_de
