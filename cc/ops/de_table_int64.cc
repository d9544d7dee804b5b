// Table<int64_t, V> instantiations for every value dtype.
#include "de_table_impl.h"

namespace tfra_de {

Status NewTableInt64(const TableConfig& cfg, TableBase** out) {
  return NewTableFor<int64_t>(cfg, out);
}

}  // namespace tfra_de
